"""Read a Llama-architecture GGUF file (llama.cpp's format) into what ``grader.models`` builds from it:
a Hugging Face ``config.json`` dict, float32 tensors under ``LlamaForCausalLM``'s names, and the
tokenizer's metadata (tokens, merges, special ids, chat template).

The ``gguf`` package (llama.cpp's own reader) parses the file; the blocks of the quantized types
are dequantized here with numpy. llama.cpp stores the rows of the q and k projections permuted for
its interleaved rotary layout; they are put back in the rotate-half order ``grader.nn`` uses.
"""
from __future__ import annotations

from pathlib import Path

try:
    import numpy as np
except ImportError:  # gguf needs numpy too: both come with the extra
    raise ImportError("reading GGUF files needs numpy and gguf: pip install 'kv-cache-katas[models]'") from None

# GGUF tensor names -> LlamaForCausalLM's; "{}" is the layer index.
_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{}.attn_norm.weight": "model.layers.{}.input_layernorm.weight",
    "blk.{}.ffn_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
    "blk.{}.attn_q.weight": "model.layers.{}.self_attn.q_proj.weight",
    "blk.{}.attn_k.weight": "model.layers.{}.self_attn.k_proj.weight",
    "blk.{}.attn_v.weight": "model.layers.{}.self_attn.v_proj.weight",
    "blk.{}.attn_output.weight": "model.layers.{}.self_attn.o_proj.weight",
    "blk.{}.ffn_gate.weight": "model.layers.{}.mlp.gate_proj.weight",
    "blk.{}.ffn_up.weight": "model.layers.{}.mlp.up_proj.weight",
    "blk.{}.ffn_down.weight": "model.layers.{}.mlp.down_proj.weight",
}
_IGNORED = ("rope_freqs.weight",)  # llama3-style rope factors: the config's rope_scaling says the same


class GGUFError(ValueError):
    """The file is not a complete Llama GGUF file; the message is one line for the user."""


def _gguf():
    try:
        import gguf
    except ImportError:
        raise ImportError("reading GGUF files needs the gguf package: pip install 'kv-cache-katas[models]'") from None
    return gguf


def open_reader(path: Path):
    """A ``gguf.GGUFReader`` over ``path``; an incomplete or foreign file raises GGUFError (one line)."""
    gguf = _gguf()
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as exc:  # the reader fails in many ways on a cut file: reshape, index, magic
        raise GGUFError(f"{path}: not a complete GGUF file ({type(exc).__name__}: {str(exc)[:80]}); "
                        "download or reinstall it") from None
    size = Path(path).stat().st_size
    end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    if not reader.tensors or end > size:
        raise GGUFError(f"{path}: the file ends at byte {size:,} but its tensors need {end:,}: it is truncated; "
                        "download or reinstall it")
    return reader


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def config(reader) -> dict:
    """The ``config.json`` of the Hugging Face Llama this file holds."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise GGUFError(f"general.architecture is {arch!r}: only 'llama' files can be read")
    scaling = _field(reader, "llama.rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise GGUFError(f"llama.rope.scaling.type is {scaling!r}: only unscaled RoPE is supported")
    heads = _field(reader, "llama.attention.head_count")
    hidden = _field(reader, "llama.embedding_length")
    tokens = _field(reader, "tokenizer.ggml.tokens") or []
    names = {t.name for t in reader.tensors}
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "vocab_size": _field(reader, "llama.vocab_size", len(tokens)),
        "hidden_size": hidden,
        "intermediate_size": _field(reader, "llama.feed_forward_length"),
        "num_hidden_layers": _field(reader, "llama.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": _field(reader, "llama.attention.head_count_kv", heads),
        "head_dim": _field(reader, "llama.rope.dimension_count", hidden // heads),
        "rope_theta": float(_field(reader, "llama.rope.freq_base", 10000.0)),
        "rms_norm_eps": float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-6)),
        "max_position_embeddings": _field(reader, "llama.context_length", 2048),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
    }


# -- dequantization ---------------------------------------------------------------------------
def _q8_0(raw: np.ndarray) -> np.ndarray:
    blocks = raw.reshape(-1, 34)  # fp16 scale, 32 int8 codes
    scale = blocks[:, :2].copy().view(np.float16).astype(np.float32)  # (n, 1)
    return scale * blocks[:, 2:].copy().view(np.int8).astype(np.float32)  # (n, 32)


def _q4_0(raw: np.ndarray) -> np.ndarray:
    blocks = raw.reshape(-1, 18)  # fp16 scale, 16 bytes of 4-bit codes (low nibbles first, then high)
    scale = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    codes = np.concatenate([blocks[:, 2:] & 0x0F, blocks[:, 2:] >> 4], axis=1).astype(np.float32)  # (n, 32)
    return scale * (codes - 8)


def _q4_1(raw: np.ndarray) -> np.ndarray:
    blocks = raw.reshape(-1, 20)  # fp16 scale, fp16 minimum, 16 bytes of 4-bit codes
    scale = blocks[:, :2].copy().view(np.float16).astype(np.float32)
    low = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    codes = np.concatenate([blocks[:, 4:] & 0x0F, blocks[:, 4:] >> 4], axis=1).astype(np.float32)  # (n, 32)
    return scale * codes + low


_BLOCKS = {"Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1}


def dequantize(tensor) -> np.ndarray:
    """A reader tensor as float32 of shape (rows, columns), numpy's order (GGUF lists it reversed)."""
    shape = tuple(int(n) for n in reversed(tensor.shape))
    kind = tensor.tensor_type.name
    data = np.asarray(tensor.data)
    if kind in ("F32", "F16"):
        out = data.astype(np.float32)
    elif kind == "BF16":
        out = (data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif kind in _BLOCKS:
        out = _BLOCKS[kind](data)
    else:  # the other k-quants: the gguf package's own numpy code
        out = _gguf().quants.dequantize(data, tensor.tensor_type).astype(np.float32)
    return out.reshape(shape)


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order: within each head it interleaves the two rotary halves
    (rows 0, D/2, 1, D/2+1, …); rotate-half wants them as two contiguous halves."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def tensors(reader, cfg: dict) -> dict[str, np.ndarray]:
    """Every weight, float32, under ``LlamaForCausalLM``'s names, q and k rows in rotate-half order."""
    patterns = {}
    for gguf_name, hf_name in _NAMES.items():
        for layer in range(cfg["num_hidden_layers"]) if "{}" in gguf_name else [None]:
            patterns[gguf_name.format(layer)] = hf_name.format(layer)
    out = {}
    for t in reader.tensors:
        if t.name in _IGNORED:
            continue
        if t.name not in patterns:
            raise GGUFError(f"tensor {t.name!r} is not part of a Llama model")
        w = dequantize(t)
        if ".attn_q." in t.name:
            w = _unpermute(w, cfg["num_attention_heads"])
        elif ".attn_k." in t.name:
            w = _unpermute(w, cfg["num_key_value_heads"])
        out[patterns[t.name]] = w
    return out


def tokenizer_metadata(reader) -> dict:
    """tokens, token_type, merges, special ids and the chat template, as the file states them."""
    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFError(f"tokenizer.ggml.model is {kind!r}: only byte-level BPE ('gpt2') tokenizers are supported")
    return {key: _field(reader, f"tokenizer.ggml.{key}") for key in
            ("tokens", "token_type", "merges", "bos_token_id", "eos_token_id", "padding_token_id", "pre")} | {
        "chat_template": _field(reader, "tokenizer.chat_template")}
