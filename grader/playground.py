"""``kvkata generate DIR``: run a generate loop — yours (kata 08) or the reference — on a Llama-family
checkpoint on your disk, and see it work on real weights.

Prompts are token ids (``--prompt-ids '[[1, 2, 3]]'``), or text when the folder holds a
``tokenizer.json`` and the ``tokenizers`` package is installed (``--prompt 'Once upon a time'``).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from grader import manifest, targets
from grader.errors import UsageError


DESCRIPTION = ("Run a generate loop, yours (kata 08) or the reference, on a Llama-family checkpoint on your "
               "disk, and see it work on real weights.")
EPILOG = ("Prompts are token ids (--prompt-ids '[[1, 2, 3]]'), or text when the folder holds a tokenizer.json "
          "and the tokenizers package is installed (--prompt 'Once upon a time').")


def _prompt_ids(text: str) -> list[list[int]]:
    try:
        prompts = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--prompt-ids: expected JSON like '[[1, 2, 3]]', got {text!r} ({exc.msg})") from None
    if not (isinstance(prompts, list) and all(isinstance(p, list) and all(isinstance(t, int) for t in p)
                                              for p in prompts)):
        raise UsageError(f"--prompt-ids: expected a list of lists of token ids, got {text!r}")
    return prompts


def _tokenizer(folder: Path):
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise UsageError(f"--prompt needs {path}; pass token ids with --prompt-ids instead")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UsageError("--prompt needs the tokenizers package: pip install tokenizers") from None
    return Tokenizer.from_file(str(path))


def _loop(spec: str):
    kata = manifest.get("08")
    try:
        target = targets.resolve(kata, spec)
    except targets.TargetLoadError as exc:
        raise UsageError(str(exc)) from None
    if "generate" not in target.namespace:
        raise UsageError(f"{target.label} defines no generate()")
    return target.label, target.namespace["generate"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kvkata generate", description=DESCRIPTION, epilog=EPILOG)
    p.add_argument("folder", type=Path, help="a checkpoint folder: config.json and *.safetensors")
    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument("--prompt-ids", help="JSON list of prompts, each a list of token ids")
    given.add_argument("--prompt", action="append", help="a text prompt (repeat for a batch); needs tokenizer.json")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate per prompt (default 32)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 picks the likeliest token (default); above 0 samples")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling generator")
    p.add_argument("--eos-token-id", type=int, default=None, help="a token id that ends a prompt's output (default: none)")
    p.add_argument("--loop", default="stub", help="whose loop: stub (your katas/08 file, default), solution, or a PATH")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu",
                   help="where to run it (default: cuda when torch sees a GPU, else cpu)")
    args = p.parse_args(argv)
    try:
        return _run(args)
    except UsageError as exc:
        print(f"kvkata generate: error: {exc}", file=sys.stderr)
        return 2


def _run(args) -> int:
    from grader.nn import Llama

    label, generate = _loop(args.loop)
    tokenizer = _tokenizer(args.folder) if args.prompt else None
    prompts = [tokenizer.encode(t).ids for t in args.prompt] if tokenizer else _prompt_ids(args.prompt_ids)
    try:
        model = Llama.from_pretrained(args.folder, device=args.device).eval()
    except (OSError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    generator = torch.Generator(device=model.device).manual_seed(args.seed)
    started = time.perf_counter()
    try:
        out = generate(model, prompts, args.max_new_tokens, eos_token_id=args.eos_token_id,
                       temperature=args.temperature, generator=generator)
    except NotImplementedError:
        raise UsageError(f"{label} is not implemented yet: finish kata 08, or pass --loop solution") from None
    seconds = time.perf_counter() - started
    for prompt, new in zip(prompts, out):
        print(tokenizer.decode(prompt + new) if tokenizer else json.dumps({"prompt": prompt, "new": new}))
    tokens = sum(map(len, out))
    print(f"{label}: {tokens} new tokens in {seconds:.2f} s ({tokens / max(seconds, 1e-9):.1f} tokens/s) on "
          f"{model.device}", file=sys.stderr)
    return 0
