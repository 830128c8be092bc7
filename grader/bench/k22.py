"""``python -m grader.bench.k22``: kata 22's radix tree against kata 10's hashed blocks on the same chats.

Twelve one-question chats rendered with SmolLM2-135M-Instruct's chat template (``grader.bench.smollm2``'s
questions; every chat opens with the same system turn) are served one after another, each finished
before the next begins. The radix tree (kata 22's ``PrefixPool``, slots for every token) reuses any
cached prefix; kata 10's ``PrefixCache`` reuses whole blocks only. No forward pass: seconds.

    python -m grader.bench.k22
"""
from __future__ import annotations

import argparse
import json
import sys

from grader import manifest, models
from grader.bench.k07 import PrintProgress
from grader.bench.smollm2 import QUESTIONS
from grader.engine import targets


def _reference(kata_id: str) -> dict:
    return targets.reference(manifest.get(kata_id)).namespace


def radix_reuse(prompts: list[list[int]]) -> dict:
    """Tokens the reference pool reuses when the prompts come one after another (each finished first)."""
    pool = _reference("22")["PrefixPool"](sum(map(len, prompts)))
    reused = 0
    for i, prompt in enumerate(prompts):
        reused += pool.begin(i, prompt)
        pool.finish(i)
    return {"reused_tokens": reused, "nodes": pool.cache.num_nodes, "cached_tokens": pool.cache.total_size,
            "root_runs": [len(r) for r in _root_runs(pool.cache)]}


def _root_runs(cache) -> list[list[int]]:
    return [child.tokens for child in cache.root.children.values()]


def block_reuse(prompts: list[list[int]], block: int) -> int:
    cache = _reference("10")["PrefixCache"](sum(-(-len(p) // block) for p in prompts), block)
    total = 0
    for i, prompt in enumerate(prompts):
        total += cache.allocate(i, prompt)
        cache.free(i)
    return total


def compare(prompts: list[list[int]], progress, block_sizes: tuple[int, ...] = (4, 16)) -> dict:
    total = sum(map(len, prompts))
    tree = radix_reuse(prompts)
    progress.step("SmolLM2 chats, radix tree", f"{tree['reused_tokens']} of {total} prompt tokens reused "
                  f"({tree['reused_tokens'] / total:.0%}); {tree['nodes']} nodes, root runs {tree['root_runs']}")
    rows = {"prompt_tokens": total, "requests": len(prompts), "radix": tree, "blocks": []}
    for block in block_sizes:
        reused = block_reuse(prompts, block)
        rows["blocks"].append({"block_size": block, "reused_tokens": reused})
        progress.step(f"SmolLM2 chats, kata 10's blocks of {block}",
                      f"{reused} of {total} prompt tokens reused ({reused / total:.0%})")
    return rows


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(prog="python -m grader.bench.k22", description=__doc__.splitlines()[0]).parse_args(argv)
    try:
        loaded = models.load(models.SMOLLM2)
    except (OSError, ValueError, ImportError) as exc:
        print(f"bench_k22: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(compare([loaded.chat(q) for q in QUESTIONS], PrintProgress()), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
