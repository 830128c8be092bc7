"""Programs for kata 22's checks: operation sequences replayed on the learner's classes and the
reference's side by side.

Tree programs: ("insert", tokens, slots), ("match", tokens, max_len) (the node it returns is kept as a
handle, numbered in order), ("lock", h), ("unlock", h), ("evict", n). Pool programs: ("begin", req,
tokens), ("extend", req, token), ("finish", req). After every step the replay compares what the README
makes observable: results (slots exactly), errors, and the sizes. Programs lock only nodes no evict
can have taken, and unlock only what they locked. Failures carry plain ``observed`` values.
"""
from __future__ import annotations

from hypothesis import strategies as st

from grader.engine import Failure, GraderBug

REQ_IDS = range(4)
SIZES = ("evictable_size", "protected_size", "total_size", "num_nodes")


def say(op) -> str:
    kind = op[0]
    if kind == "insert":
        return f"insert({op[1]}, slots={op[2]})"
    if kind == "match":
        cap = "" if op[2] is None else f", max_len={op[2]}"
        return f"match({op[1]}{cap})"
    if kind in ("lock", "unlock"):
        return f"{kind}(node of match #{op[1]})"
    if kind == "evict":
        return f"evict({op[1]})"
    if kind == "begin":
        return f"begin({op[1]}, {op[2]})"
    if kind == "extend":
        return f"extend({op[1]}, {op[2]})"
    return f"finish({op[1]})"


# -- drawing programs -----------------------------------------------------------------------------
@st.composite
def tree_programs(draw, kinds=("insert", "match", "lock", "unlock", "evict"), max_ops=16, vocab=3):
    """Sequences from a tiny vocabulary (token 0 included) that share starts, so runs are split often."""
    token = st.integers(0, vocab - 1)
    seen = [draw(st.lists(token, min_size=1, max_size=5))]
    ops, matches, locks, valid, slot = [], 0, [], [], 100  # valid: handles no evict can have taken
    for _ in range(draw(st.integers(1, max_ops))):
        kind = draw(st.sampled_from([k for k in kinds if (k != "lock" or valid) and (k != "unlock" or locks)]))
        if kind in ("insert", "match"):
            start = draw(st.sampled_from(seen))
            tokens = start[:draw(st.integers(0, len(start)))] + draw(st.lists(token, max_size=4))
            tokens = tokens or [draw(token)]
            seen.append(tokens)
            if kind == "insert":
                ops.append(("insert", tokens, list(range(slot, slot + len(tokens)))))
                slot += len(tokens)
            else:
                cap = draw(st.one_of(st.none(), st.integers(0, len(tokens))))
                ops.append(("match", tokens, cap))
                valid.append(matches)
                matches += 1
        elif kind == "lock":
            h = draw(st.sampled_from(valid))
            ops.append(("lock", h))
            locks.append(h)
        elif kind == "unlock":
            h = draw(st.sampled_from(locks))
            ops.append(("unlock", h))
            locks.remove(h)
        else:
            ops.append(("evict", draw(st.integers(0, 6))))
            valid = sorted(set(locks))  # a locked node is never evicted; any other may have been
    return {"ops": ops}


@st.composite
def pool_programs(draw, slots=(2, 24), max_ops=14, vocab=3, kinds=("begin", "begin", "extend", "finish")):
    """Requests on one or two shared system prompts (or an earlier request's tokens), then own tokens."""
    token = st.integers(0, vocab - 1)
    systems = [draw(st.lists(token, min_size=0, max_size=6)) for _ in range(2)]
    ops, live, seen = [], {}, []
    for _ in range(draw(st.integers(1, max_ops))):
        free_ids = [r for r in REQ_IDS if r not in live]
        kind = draw(st.sampled_from([k for k in kinds if (k == "begin" and free_ids) or (k != "begin" and live)]))
        if kind == "begin":
            start = draw(st.sampled_from(systems + seen))
            prompt = list(start[:draw(st.integers(0, len(start)))] if draw(st.booleans()) else start)
            prompt += draw(st.lists(token, min_size=0 if prompt else 1, max_size=5))
            req = draw(st.sampled_from(free_ids))
            ops.append(("begin", req, prompt))
            live[req] = list(prompt)
            seen.append(list(prompt))
        elif kind == "extend":
            req, tok = draw(st.sampled_from(sorted(live))), draw(token)
            ops.append(("extend", req, tok))
            live[req].append(tok)
            seen.append(list(live[req]))
        else:
            req = draw(st.sampled_from(sorted(live)))
            ops.append(("finish", req))
            del live[req]
    ops += [("finish", r) for r in sorted(live)]
    return {"num_slots": draw(st.integers(*slots)), "ops": ops}


# -- the replays --------------------------------------------------------------------------------------
class _Replay:
    def __init__(self, c, ex):
        self.c, self.ex, self.step = c, ex, 0
        self.skipped: set[int] = set()

    def fail(self, what: str, observed) -> None:
        ops = self.ex["ops"]
        listing = "\n".join(f"    {'→' if i == self.step else ' '} {i:2d}  {say(op)}"
                            + ("   (skipped)" if i in self.skipped else "")
                            for i, op in enumerate(ops) if i <= self.step)
        if len(ops) > self.step + 1:
            listing += f"\n          … {len(ops) - self.step - 1} more step(s), not run"
        raise Failure(f"on the program (→ marks the failing step):\n{listing}\n  after step {self.step}: {what}",
                      observed=("step", self.step) + tuple(observed))

    def same(self, name: str, got, want, why: str = "") -> None:
        if got != want:
            self.fail(f"{name} is {got!r}, expected {want!r}{why}", (name, got))

    def sizes(self, mine, ref, prefix: str = "") -> None:
        for name in SIZES:
            self.same(prefix + name, getattr(mine, name), getattr(ref, name))

    def pinned(self, got) -> None:
        want = self.ex.get("want", {}).get(self.step)
        if want is not None and want != got:
            raise GraderBug(f"step {self.step}: the reference gives {got!r}, the worked case says {want!r}")

    def call_both(self, name: str, ref_obj, mine_obj, args, mine_args=None):
        """The reference's result (or its ValueError); the learner must do the same."""
        mine_args = args if mine_args is None else mine_args
        try:
            want = getattr(ref_obj, name)(*args)
        except ValueError:
            try:
                getattr(mine_obj, name)(*mine_args)
            except ValueError:
                return ValueError
            self.fail(f"{say(self.ex['ops'][self.step])} returned, but it must raise ValueError", ("no ValueError",))
        except Exception as exc:
            if type(exc).__name__ == "OutOfSlotsError":
                return self.out_of_slots(name, mine_obj, args)
            raise GraderBug(f"the reference failed on step {self.step}: {exc!r}") from exc
        return want, getattr(mine_obj, name)(*mine_args)


def _tree_step(tree, nodes: list, op):
    """One step of a tree program; match keeps its node in ``nodes``. A ValueError is a result too."""
    kind = op[0]
    try:
        if kind == "match":
            got = tree.match(op[1], op[2])
            if not isinstance(got, tuple) or len(got) != 2:
                nodes.append(None)
                return ("not a pair", repr(got))
            nodes.append(got[1])
            return got[0]
        if kind in ("lock", "unlock"):
            return getattr(tree, kind)(nodes[op[1]])
        return tree.insert(op[1], op[2]) if kind == "insert" else tree.evict(op[1])
    except ValueError:
        return "ValueError"


def trace_tree(api, ex) -> list:
    """The whole program on ``api``'s RadixCache, as plain data: each step's result and sizes."""
    tree, nodes = api.RadixCache(), []
    return [{"result": _tree_step(tree, nodes, op), "sizes": [getattr(tree, n) for n in SIZES]} for op in ex["ops"]]


class TreeReplay(_Replay):
    WHY = {"match": " (the slots of the longest cached prefix)",
           "insert": " (how many leading tokens were cached already)",
           "evict": " (the slots of the leaves evicted, least recently used first)", "lock": "", "unlock": ""}

    def run(self) -> None:
        want = self.c.expected(self.ex, trace_tree, "the program")
        mine, nodes = self.c.t.RadixCache(), []
        for self.step, op in enumerate(self.ex["ops"]):
            expected = want[self.step]
            self.pinned(expected["result"])
            got = _tree_step(mine, nodes, op)
            if isinstance(got, tuple) and got[:1] == ("not a pair",):
                self.fail(f"{say(op)} returned {got[1]}; expected a pair (slots, node)", ("not a pair",))
            if got != expected["result"]:
                if "ValueError" in (got, expected["result"]):
                    self.fail(f"{say(op)} {'raised' if got == 'ValueError' else 'returned ' + repr(got) + ','} "
                              f"{'but it is valid' if got == 'ValueError' else 'but it must raise ValueError'}",
                              ("ValueError", got == "ValueError"))
                self.fail(f"{say(op)} returned {got!r}, expected {expected['result']!r}{self.WHY[op[0]]}",
                          (op[0], got))
            for name, value in zip(SIZES, expected["sizes"]):
                self.same(name, getattr(mine, name), value)


class PoolReplay(_Replay):
    def run(self) -> None:
        n = self.ex["num_slots"]
        ref, mine = self.c.ref.PrefixPool(n), self.c.t.PrefixPool(n)
        live: list = []
        for self.step, op in enumerate(self.ex["ops"]):
            kind, req = op[0], op[1]
            if kind != "begin" and req not in live:
                self.skipped.add(self.step)
                continue
            out = self.call_both(kind, ref, mine, op[1:])
            if out is not ValueError and out is not None:
                want, got = out
                self.pinned(want)
                if kind == "begin":
                    self.same(f"what {say(op)} returned (tokens reused)", got, want)
                    live.append(req)
                elif kind == "finish":
                    live.remove(req)
            for r in live:
                self.same(f"slots({r})", mine.slots(r), ref.slots(r))
            self.same("num_free", mine.num_free, ref.num_free)
            self.sizes(mine.cache, ref.cache, "cache.")

    def out_of_slots(self, name, mine, args):
        try:
            getattr(mine, name)(*args)
        except Exception as exc:
            if type(exc).__name__ == "OutOfSlotsError" and isinstance(exc, RuntimeError):
                self.pinned("OutOfSlotsError")
                return None
            raise
        self.fail(f"{say(self.ex['ops'][self.step])} returned, but too few slots can be had (free plus evictable "
                  "after locking its prefix): it must raise OutOfSlotsError", ("no OutOfSlotsError",))


def replay_tree(c, ex) -> None:
    TreeReplay(c, ex).run()


def replay_pool(c, ex) -> None:
    PoolReplay(c, ex).run()
