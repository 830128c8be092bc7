"""``python -m grader.bench.k23``: how long a running decode waits while a long prompt is prefilled, with and
without chunked prefill (kata 23's reference ``serve_chunked`` on SmolLM2).

A short chat starts decoding; two steps later a 1,024-token prompt arrives. Without chunking the step budget
covers the whole prompt, so one step prefills all of it and the chat's next token waits for that step. With
chunks of 128 the prompt is spread over eight steps and the chat gets a token after each. Every step is one
forward; the bench times each and reports the longest wait between two of the chat's tokens, the tokens each
step computed, and whether both schedules gave the same greedy tokens. Minutes on a CPU at most.

    python -m grader.bench.k23 [--prompt-tokens 1024] [--chunk 128]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from grader import models
from grader.bench import noise
from grader.bench.k07 import PrintProgress, corpus
from grader.bench.shared import reference
from grader.bench.smollm2 import QUESTIONS

BLOCK = 16


class Timed:
    """The model as ``serve_chunked`` sees it, timing each forward and counting the tokens it computed (a
    query row with at least one visible key is a real token; padding sees none)."""

    def __init__(self, model):
        self.model = model
        self.steps: list[tuple[int, float]] = []

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __call__(self, ids, **kwargs):
        started = time.perf_counter()
        out = self.model(ids, **kwargs)
        seconds = time.perf_counter() - started
        mask = kwargs.get("attention_mask")
        tokens = int(mask.any(-1).sum()) if mask is not None else ids.numel()
        self.steps.append((tokens, seconds))
        return out


def serve(model, chat: list[int], prompt: list[int], budget: int, chat_tokens: int, arrival: int = 2) -> dict:
    """The chat (decoding from step 0) and the long prompt (arriving at ``arrival``) served with a budget of
    ``budget`` tokens a step; the chat's longest wait between two of its tokens."""
    timed = Timed(model)
    requests = [("chat", chat, chat_tokens, 0), ("prompt", prompt, 2, arrival)]
    blocks = sum(-(-(len(p) + n) // BLOCK) for _, p, n, _ in requests)
    with torch.inference_mode():
        out = reference("23")["serve_chunked"](timed, requests, num_blocks=blocks, block_size=BLOCK, max_num_seqs=2,
                                               max_num_batched_tokens=budget)
    decoding = timed.steps[1:chat_tokens]  # each step after the chat's prefill carries one of its tokens
    longest = max(decoding, key=lambda step: step[1])
    return {"budget": budget, "steps": len(timed.steps), "longest_wait_s": round(longest[1], 4),
            "longest_wait_tokens": longest[0], "most_tokens_in_a_step": max(t for t, _ in timed.steps),
            "seconds": round(sum(s for _, s in timed.steps), 3), "tokens": out}


def compare(model, chat: list[int], prompt: list[int], progress, chunk: int = 128, chat_tokens: int = 24) -> dict:
    """The same two requests unchunked (a budget of the whole prompt and the chat's one decode token) and
    chunked (``chunk`` prompt tokens and the decode token a step)."""
    least = -(-len(prompt) // chunk) + 4  # the steps before the prompt arrives, its chunks, and its two tokens
    if chat_tokens < least:
        raise ValueError(f"chat_tokens: the chat must still decode while the prompt is prefilled in chunks of "
                         f"{chunk}: expected at least {least}, got {chat_tokens}")
    rows = {"prompt_tokens": len(prompt), "chat_tokens": len(chat)}
    for name, budget in (("unchunked", len(prompt) + 1), ("chunked", chunk + 1)):
        rows[name] = serve(model, chat, prompt, budget, chat_tokens)
        progress.step(f"chunked prefill (kata 23), {name}",
                      f"a decode waits at most {rows[name]['longest_wait_s']:.2f} s "
                      f"({rows[name]['longest_wait_tokens']} tokens in that step); {rows[name]['seconds']:.2f} s in all")
    rows["same_tokens"] = rows["unchunked"]["tokens"] == rows["chunked"]["tokens"]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grader.bench.k23", description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=1024, help="the long prompt's length (default 1024)")
    parser.add_argument("--chunk", type=int, default=128, help="prompt tokens a chunked step computes (default 128)")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default 2, or 1 when "
                        "other programs already keep the cores busy)")
    args = parser.parse_args(argv)
    if args.prompt_tokens < 2 or args.chunk < 1:
        parser.error(f"expected --prompt-tokens ≥ 2 and --chunk ≥ 1, got {args.prompt_tokens} and {args.chunk}")
    threads, note = noise.threads(args.threads, *noise.busy())
    if note:
        print(note, file=sys.stderr)
    torch.set_num_threads(threads)
    try:
        loaded = models.load(models.SMOLLM2)
        prompt = corpus(loaded.tokenizer, args.prompt_tokens)
    except (OSError, ValueError, ImportError) as exc:
        print(f"bench_k23: error: {exc}", file=sys.stderr)
        return 2
    chat_tokens = max(24, -(-args.prompt_tokens // args.chunk) + 4)
    rows = compare(loaded.model, loaded.chat(QUESTIONS[0]), prompt, PrintProgress(), args.chunk, chat_tokens)
    for name in ("unchunked", "chunked"):  # the tokens themselves are the JSON's; here, how many
        rows[name]["tokens"] = {req: len(tokens) for req, tokens in rows[name]["tokens"].items()}
    print(json.dumps({"torch_threads": threads, **rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
