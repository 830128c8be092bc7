"""Hidden checks of kata 22 — a radix-tree prefix cache.

Programs of match, insert, lock, unlock and evict (the tree) and of begin, extend and finish (the pool)
replay on the learner's classes and the reference's side by side (``k22_programs``); after every step
the results, the slots (exactly: they are fixed by the README's rules) and the sizes must agree.
Pinned programs carry numbers worked by hand; the reference must agree with them too.
"""
from __future__ import annotations

import random

from hypothesis import strategies as st

from grader.checks.k22_programs import pool_programs, replay_pool, replay_tree, tree_programs
from grader.checks.support.common import expect_value_error
from grader.engine import Checks

CHECKS = Checks("22")


def _ins(tokens, first):
    return ("insert", tokens, list(range(first, first + len(tokens))))


# -- pinned tree programs (worked by hand) -----------------------------------------------------------
SPLIT = {"ops": [
    _ins([1, 2, 3, 4], 10),  # 0 cached: one leaf
    _ins([1, 2, 5], 20),  # leaves the run after 2 tokens: split into [1 2] + [3 4], leaf [5]; 2 cached
    ("match", [1, 2, 3, 9], None),  # ends inside [3 4]: split into [3] + [4]
    ("match", [1, 2], None), ("match", [7], None),  # a boundary; nothing cached
    ("match", [1, 2, 3, 4], 0), ("match", [0, 0], None), _ins([0, 0, 0], 30), ("match", [0, 0], None)],
    "want": {0: 0, 1: 2, 2: [10, 11, 12], 3: [10, 11], 4: [], 5: [], 6: [], 7: 0, 8: [30, 31]}}
INSERT_AGAIN = {"ops": [
    _ins([5, 6, 7], 10), _ins([5, 6, 7], 20),  # all 3 cached: 3, nothing added
    _ins([5, 6], 30),  # a prefix of a run: 2, the run is split, nothing added
    _ins([5, 6, 7, 8], 40), ("match", [5, 6, 7, 8, 9], None)],  # 3 cached, leaf [8] with slot 43
    "want": {0: 0, 1: 3, 2: 2, 3: 3, 4: [10, 11, 12, 43]}}
# Recency: a later match refreshes a node; equal ticks go by creation (the older node first).
RECENCY = {"ops": [
    _ins([1, 2, 3], 10), _ins([4, 5], 20), ("match", [1, 2], None),  # [1 2]+[3] both get tick 3
    ("evict", 1), ("evict", 1), ("evict", 1), ("evict", 5)],  # [4 5]; then [3]; then [1 2], childless
    "want": {3: [20, 21], 4: [12], 5: [10, 11], 6: []}}
TIES = {"ops": [
    _ins([1, 2, 3], 10), _ins([1, 2, 4], 20),  # [3] and [4] share tick 2; [3] was created first
    ("evict", 1), ("evict", 1), ("evict", 1)],
    "want": {1: 2, 2: [12], 3: [22], 4: [10, 11]}}
REFRESH = {"ops": [
    _ins([1, 1], 10), _ins([2, 2], 20), ("match", [1, 1], None),  # the older run is used again
    ("evict", 1), ("evict", 1)],
    "want": {3: [20, 21], 4: [10, 11]}}
LOCKS = {"ops": [
    _ins([1, 2, 3], 10), _ins([1, 2, 4], 20),  # [1 2] with leaves [3] and [4]
    ("match", [1, 2, 3], None), ("lock", 0),  # locks [3] and [1 2]: 3 protected
    ("evict", 10),  # only [4] can go
    ("match", [1, 2], None), ("lock", 1), ("unlock", 0),  # [1 2] still locked once
    ("evict", 10), ("unlock", 1), ("unlock", 1), ("evict", 10)],  # [3]; a second unlock is a ValueError
    "want": {4: [22], 5: [10, 11], 8: [12], 11: [10, 11]}}
SPLIT_LOCKED = {"ops": [
    _ins([1, 2, 3, 4], 10), ("match", [1, 2, 3, 4], None), ("lock", 0),  # 4 protected
    ("match", [1, 2], None),  # splits a locked node: both parts keep its lock
    ("evict", 4), ("unlock", 0), ("evict", 1)],  # nothing can go; then the leaf [3 4] first
    "want": {1: [10, 11, 12, 13], 3: [10, 11], 4: [], 6: [12, 13]}}
INSERT_REFRESH = {"ops": [
    _ins([1, 1], 10), _ins([2, 2], 20), _ins([1, 1], 30),  # inserting the older run again uses it: 2 cached
    ("evict", 1), ("evict", 1)],
    "want": {2: 2, 3: [20, 21], 4: [10, 11]}}
DEEP = {"ops": [
    _ins([1, 2], 10), _ins([1, 2, 3], 20), _ins([1, 2, 3, 4], 30), _ins([9], 40),  # a chain, and [9]
    ("evict", 3)],  # the leaf [4] (tick 3), then [3] and [1 2] as each is left childless: 4 slots
    "want": {4: [33, 22, 10, 11]}}


@CHECKS.add("match returns the slots of the longest cached prefix, splitting a run where it ends",
            uses="RadixCache.match")
def match_splits(ctx):
    ctx.case(SPLIT, replay_tree)
    ctx.forall(tree_programs(kinds=("insert", "insert", "match")), replay_tree, max_examples=25)


@CHECKS.add("insert returns the tokens cached already and keeps the tree's slots for them",
            uses="RadixCache.insert")
def insert_counts(ctx):
    ctx.case(INSERT_AGAIN, replay_tree)
    ctx.forall(tree_programs(kinds=("insert", "insert", "match"), vocab=2), replay_tree, max_examples=20)


@CHECKS.add("lock protects a node's path to the root; unlock undoes one lock; a split keeps the lock",
            uses="RadixCache.lock")
def locks_protect_the_path(ctx):
    ctx.case(LOCKS, replay_tree)
    ctx.case(SPLIT_LOCKED, replay_tree)
    ctx.forall(tree_programs(kinds=("insert", "match", "match", "lock", "unlock", "evict")), replay_tree,
               max_examples=25)


@CHECKS.add("evict takes unlocked leaves least recently used first (ties: the older node); a parent left "
            "childless joins", uses="RadixCache.evict")
def eviction_order(ctx):
    for program in (RECENCY, TIES, REFRESH, INSERT_REFRESH, DEEP):
        ctx.case(program, replay_tree)
    ctx.forall(tree_programs(kinds=("insert", "insert", "match", "evict"), vocab=2), replay_tree, max_examples=25)


@CHECKS.add("random programs of the tree match the reference", uses="RadixCache.match")
def random_tree_programs(ctx):
    ctx.forall(tree_programs(max_ops=20), replay_tree, max_examples=20)


# -- pinned pool programs ---------------------------------------------------------------------------
CAPPED = {"num_slots": 8, "ops": [
    ("begin", 0, [1, 2, 3]), ("finish", 0),  # slots 0 1 2 join the tree
    ("begin", 1, [1, 2, 3]),  # cached in full, but the last token is computed: 2 reused, slots [0 1 3]
    ("finish", 1),  # insert finds all 3 cached: its own slot 3 is a duplicate, freed
    ("begin", 2, [5]), ("finish", 2)],
    "want": {0: 0, 2: 2, 4: 0}}
DUPLICATES = {"num_slots": 8, "ops": [
    ("begin", 0, [1, 2, 3]), ("begin", 1, [1, 2, 3]),  # nothing cached yet: [0 1 2] and [3 4 5]
    ("finish", 0), ("finish", 1),  # 1's tokens were cached by 0 meanwhile: 3 4 5 are freed
    ("begin", 2, [1, 2, 3, 4]), ("extend", 2, 7), ("finish", 2)],  # 3 reused: [0 1 2 3], then 4
    "want": {0: 0, 1: 0, 4: 3}}
PRESSURE = {"num_slots": 4, "ops": [
    ("begin", 0, [1, 2, 3]), ("begin", 1, [4, 4]),  # 1 free, nothing evictable: OutOfSlotsError
    ("extend", 0, 9), ("extend", 0, 9),  # takes slot 3; then none left
    ("finish", 0),  # [1 2 3 9] cached, evictable
    ("begin", 1, [1, 2, 3, 9, 9, 9]),  # 4 reused and locked, 2 needed, 0 can be had
    ("begin", 1, [1, 2, 7]),  # 2 reused; [3 9] evicted for 1 slot: slots 2 and 3 freed, 2 taken
    ("finish", 1)],
    "want": {0: 0, 1: "OutOfSlotsError", 3: "OutOfSlotsError", 5: "OutOfSlotsError", 6: 2}}




def _large() -> dict:
    """Past the drawn sizes: six requests on one 256-token system prompt (ids up to 31999), two decoding
    20 tokens, all finished, then the first prompt again."""
    rng = random.Random(22)
    system = [rng.randrange(32000) for _ in range(256)]
    prompts = [system + [rng.randrange(32000) for _ in range(rng.randint(20, 60))] for _ in range(6)]
    ops = [("begin", i, p) for i, p in enumerate(prompts[:4])] + [("finish", 1), ("finish", 2)]
    ops += [("extend", r, 31999 - t) for t in range(20) for r in (0, 3)]
    ops += [("begin", 1, prompts[4]), ("begin", 2, prompts[5])]
    return {"num_slots": 400, "ops": ops + [("finish", r) for r in range(4)] + [("begin", 0, prompts[0])]}


LARGE = _large()


@CHECKS.add("the pool reuses at most len - 1 tokens and hands out the lowest free slots", uses="PrefixPool.begin")
def pool_reuses(ctx):
    ctx.case(CAPPED, replay_pool)
    ctx.forall(pool_programs(kinds=("begin", "begin", "finish")), replay_pool, max_examples=20)


@CHECKS.add("finish frees the request's own duplicate slots, never the tree's", uses="PrefixPool.finish")
def finish_frees_duplicates(ctx):
    ctx.case(DUPLICATES, replay_pool)
    ctx.case(LARGE, replay_pool)
    ctx.forall(pool_programs(), replay_pool, max_examples=25)


@CHECKS.add("under memory pressure the pool evicts unlocked leaves; OutOfSlotsError takes nothing",
            uses="PrefixPool.begin")
def memory_pressure(ctx):
    ctx.case(PRESSURE, replay_pool)
    ctx.forall(pool_programs(slots=(1, 8)), replay_pool, max_examples=30)


@CHECKS.add("bad input raises ValueError naming the argument, and changes nothing", uses="RadixCache.match")
def rejects_bad_input(ctx):
    def body(c, ex):
        api, bad = c.t, ex["bad"]
        if not (isinstance(api.OutOfSlotsError, type) and issubclass(api.OutOfSlotsError, RuntimeError)):
            c.fail("OutOfSlotsError should be a subclass of RuntimeError", ex, ("not a RuntimeError",))
        tree = api.RadixCache()
        tree.insert([1, 2, 3], [7, 8, 9])
        _, node = tree.match([4])  # the root: lock and unlock do nothing
        tree.lock(node)
        tree.unlock(node)
        _, node = tree.match([1, 2])
        pool = api.PrefixPool(6)
        pool.begin(0, [1, 2])
        cases = [("RadixCache().match([])", tree.match, ([],), ("tokens",)),
                 ("insert([], [])", tree.insert, ([], []), ("tokens",)),
                 ("insert([1, 2], [5])", tree.insert, ([1, 2], [5]), ("slots",)),
                 ("insert([1], [5, 6])", tree.insert, ([1], [5, 6]), ("slots",)),
                 (f"match([1, 2], max_len={ex['cap']!r})", tree.match, ([1, 2], ex["cap"]), ("max_len",)),
                 ("unlock of a matched node never locked", tree.unlock, (node,), ("node",)),
                 (f"PrefixPool({bad!r})", api.PrefixPool, (bad,), ("num_slots",)),
                 ("begin(0, [3]) while request 0 runs", pool.begin, (0, [3]), ("req_id",)),
                 ("begin(1, [])", pool.begin, (1, []), ("tokens",)),
                 ("extend(5, 1) of a request never begun", pool.extend, (5, 1), ("req_id",)),
                 ("finish(5)", pool.finish, (5,), ("req_id",)), ("slots(5)", pool.slots, (5,), ("req_id",))]
        for what, fn, args, names in cases:
            expect_value_error(c, fn, *args, what=what, names=names, example=ex)
        state = (tree.evictable_size, tree.protected_size, tree.num_nodes, pool.num_free, pool.slots(0))
        if state != (3, 0, 2, 4, [0, 1]):
            c.fail(f"after the refused calls (evictable_size, protected_size, num_nodes, pool.num_free, "
                   f"pool.slots(0)) = {state}, expected (3, 0, 2, 4, [0, 1]): a refused call changes nothing",
                   ex, ("refused call changed", state))

    for bad, cap in ((0, -1), (2.5, 1.5), ("4", "2"), (None, True)):
        ctx.case({"bad": bad, "cap": cap}, body)
    ctx.forall(st.fixed_dictionaries({"bad": st.integers(-5, 0), "cap": st.integers(-5, -1)}), body, max_examples=3)


@CHECKS.add("returned lists are the caller's: changing them changes nothing in the tree or the pool",
            uses="PrefixPool.slots")
def results_stay_the_callers(ctx):
    def run(api, ex):
        pool = api.PrefixPool(8)
        pool.begin(0, ex["prompt"])
        mine = pool.slots(0)
        mine[:] = [99] * len(mine)
        pool.finish(0)
        got, _ = pool.cache.match(ex["prompt"])
        got.append(98)
        given = list(ex["prompt"])
        tokens = list(given)
        pool.begin(1, tokens)
        tokens.append(5)
        return {"match after the changes": list(pool.cache.match(given)[0]), "slots(1)": pool.slots(1),
                "num_free": pool.num_free}

    def body(c, ex):
        c.differential(ex, run, "slots(0) and match's list changed by the caller, then the prompt list after begin")

    ctx.case({"prompt": [3, 1, 4, 1, 5]}, body)
