"""Known mistakes of kata 22 — each the reference with one bug (the bugs users of radix caches hit)."""
from grader.mistakes import Mistake

MISTAKES = [
    Mistake(
        name="no split where a match ends inside a run",
        why="the match returns the node whose run it only partly matched, so a lock of it protects the unmatched "
            "tail too, and the next match cannot end on that node's boundary.",
        hint="What does the node match returns stand for? If the tokens stop inside a run, where must the node end?",
        edits=(("            if k < len(child.tokens):\n                child = self._split(child, k)\n",
                "            if k < len(child.tokens) and i + k < len(tokens):\n"
                "                child = self._split(child, k)\n"),),
    ),
    Mistake(
        name="the full prompt reused",
        why="a prompt cached in full is reused in full, leaving no token to compute: the model has no logits to "
            "pick the next token from (nano-vllm issue 144: an empty query crashed the kernel).",
        hint="How many tokens must go through the model so that it can pick the next one?",
        edits=(("self.cache.match(tokens, max_len=len(tokens) - 1)", "self.cache.match(tokens)"),),
    ),
    Mistake(
        name="insert hides the cached prefix",
        why="insert reports 0 tokens cached already, so the caller never frees its own slots for tokens the tree "
            "had: they leak, and the pool runs out of slots.",
        hint="insert's answer tells the caller which of its slots are duplicates. What must it count?",
        edits=(("            self._evictable += len(leaf.tokens)  # a new leaf is unlocked, whatever its parent\n"
                "        return i\n",
                "            self._evictable += len(leaf.tokens)  # a new leaf is unlocked, whatever its parent\n"
                "        return 0\n"),),
    ),
    Mistake(
        name="the tree's slots freed at finish",
        why="finish frees the reused slots as well as the duplicates, slots the tree still holds: they are handed "
            "out again while cached (a double free; another request's keys get overwritten).",
        hint="Of the request's slots, which are its own and which were lent by the tree at begin?",
        edits=(("for slot in slots[reused:cached]:", "for slot in slots[:cached]:"),),
    ),
    Mistake(
        name="only the last node locked",
        why="lock protects the node match returned but not the nodes above it, so eviction can take a running "
            "request's prefix once the node's siblings are gone.",
        hint="A request reads every token from the root down to its node. Which nodes must a lock protect?",
        edits=(("            node.lock_ref += 1\n            node = node.parent\n",
                "            node.lock_ref += 1\n            break\n"),
               ("                self._evictable += len(node.tokens)\n            node = node.parent\n",
                "                self._evictable += len(node.tokens)\n            break\n")),
    ),
    Mistake(
        name="locked leaves evicted",
        why="eviction takes any leaf, locked or not, so a running request's slots are freed under it and handed "
            "to another request (CUDA error 700 in a real engine).",
        hint="Which leaves may evict take while a request that locked them still runs?",
        edits=(("if node is not self.root and not node.children and node.lock_ref == 0:",
                "if node is not self.root and not node.children:"),
               ("            self._evictable -= len(leaf.tokens)\n            self._nodes -= 1\n",
                "            if leaf.lock_ref:\n                self._protected -= len(leaf.tokens)\n"
                "            else:\n                self._evictable -= len(leaf.tokens)\n            self._nodes -= 1\n")),
    ),
    Mistake(
        name="first in, first out instead of least recently used",
        why="leaves are evicted by when they were created, so a system prompt every request hits is evicted "
            "before a tail nobody has used since.",
        hint="When a match walks through a node, what should happen to its place in the eviction order?",
        edits=(("        return self.stamp, self.born  # equal stamps: the node created first goes first",
                "        return self.born, self.stamp"),),
    ),
    Mistake(
        name="equal ticks evicted newest first",
        why="among nodes one call touched, the one created last is evicted first: the reverse of SGLang's order "
            "the README fixes, so other slots are freed.",
        hint="Two leaves with the same tick: which one does the README evict first?",
        edits=(("        return self.stamp, self.born  # equal stamps: the node created first goes first",
                "        return self.stamp, -self.born"),),
    ),
    Mistake(
        name="eviction stops after one layer of leaves",
        why="a parent left childless is not considered until the next call, so evict frees fewer slots than it "
            "could and the pool raises OutOfSlotsError with memory to spare.",
        hint="After a leaf goes, its parent may have become a leaf. When does it become a candidate?",
        edits=(("                heapq.heappush(heap, (*parent.order(), id(parent), parent))\n",
                "                pass\n"),),
    ),
    Mistake(
        name="lock count not copied to a split's upper part",
        why="splitting a locked node gives the new upper part no lock, so it is evictable while in use and "
            "evictable_size and protected_size drift (mllm's negative evictable size).",
        hint="After a split, the old run is two nodes. Which of them did the requests that locked it lock?",
        edits=(("        upper.lock_ref = node.lock_ref  # the lock of the whole run holds both parts\n", ""),),
    ),
    Mistake(
        name="a match does not refresh recency",
        why="only insert stamps the nodes it walks, so a prefix many requests hit, but nobody inserts again, "
            "looks old and is evicted first.",
        hint="Which calls count as a use of a node?",
        edits=(("        node, _ = self._walk(tokens, self._tick())\n",
                "        node, _ = self._walk(tokens, -1)\n"),
               ("            child.stamp = stamp\n", "            child.stamp = max(child.stamp, stamp)\n")),
    ),
    Mistake(
        name="evicting while free slots remain",
        why="the pool evicts for every new slot even when free slots are left, throwing away cached prefixes "
            "that cost nothing to keep.",
        hint="Which slots cost nothing to hand out, and which hold something a later prompt could reuse?",
        edits=(("        if n > len(self._free):\n            for slot in self.cache.evict(n - len(self._free)):",
                "        if n:\n            for slot in self.cache.evict(n):"),),
    ),
]
