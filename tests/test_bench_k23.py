"""The bench of kata 23 (grader.bench.k23) on a tiny model: what each step computed and the tokens, which do
not depend on the machine; the seconds are the bench's to report."""
from __future__ import annotations

import pytest
import torch

from grader.bench import k23 as bench
from grader.checks.support.common import tiny_llama


class _Quiet:
    def step(self, *args) -> None:
        pass


CHAT = [3, 1, 4, 1, 5]
PROMPT = [(7 * i + 2) % 48 for i in range(40)]  # five chunks of 8


def test_chunking_spreads_the_prompt_over_steps_and_keeps_every_token():
    rows = bench.compare(tiny_llama(0, torch.device("cpu")), CHAT, PROMPT, _Quiet(), chunk=8, chat_tokens=12)
    assert rows["unchunked"]["budget"] == 41 and rows["chunked"]["budget"] == 9
    assert rows["unchunked"]["most_tokens_in_a_step"] == 40 + 1  # the whole prompt beside the chat's decode
    assert rows["chunked"]["most_tokens_in_a_step"] == 8 + 1
    for name in ("unchunked", "chunked"):
        assert rows[name]["steps"] == 12  # the chat decodes in every step, to its twelfth token
        assert [len(rows[name]["tokens"][r]) for r in ("chat", "prompt")] == [12, 2]
    assert rows["same_tokens"]


def test_a_chat_too_short_to_outlast_the_chunks_is_refused():
    with pytest.raises(ValueError, match="chat_tokens: .* at least 9, got 8"):
        bench.compare(tiny_llama(0, torch.device("cpu")), CHAT, PROMPT, _Quiet(), chunk=8, chat_tokens=8)
