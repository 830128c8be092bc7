"""The bench of kata 22 (grader.bench.k22) without a model: the radix tree against kata 10's blocks on
prompts whose shared start is not a whole number of blocks."""
from __future__ import annotations

from grader.bench import k22 as bench


class _Quiet:
    def step(self, *args) -> None:
        pass


SYSTEM = [7, 3, 9, 1, 4, 4]  # 6 tokens: one whole block of 4, and 2 tokens over
PROMPTS = [SYSTEM + [20 + i, 30 + i, 40 + i] for i in range(3)]  # 9 tokens each


def test_the_tree_reuses_any_prefix_and_blocks_only_whole_ones():
    rows = bench.compare(PROMPTS, _Quiet(), block_sizes=(4,))
    assert rows["prompt_tokens"] == 27
    assert rows["radix"]["reused_tokens"] == 2 * 6  # the 6 system tokens, by the second and third request
    assert rows["blocks"] == [{"block_size": 4, "reused_tokens": 2 * 4}]  # only the whole first block
    assert rows["radix"]["nodes"] == 4 and rows["radix"]["root_runs"] == [6]  # the system run, three tails


def test_a_repeated_prompt_reuses_all_but_its_last_token():
    assert bench.radix_reuse([PROMPTS[0], PROMPTS[0]])["reused_tokens"] == 8
    assert bench.block_reuse([PROMPTS[0], PROMPTS[0]], 4) == 8
