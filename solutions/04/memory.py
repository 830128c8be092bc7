"""Kata 04 — the memory formula (reference solution).

Every answer is an exact int: a size in bytes, or a count of tokens, sequences or score entries.
Use integer arithmetic only — ``//`` to round down, ``-(-a // b)`` to round up — because a float
loses exactness past 2**53 and a byte count must not be off by one.
"""
from __future__ import annotations

import numbers

import torch


def _count(name: str, value, minimum: int = 0) -> int:
    """``value`` as an int >= ``minimum``, or a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name}: expected an int, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {value}")
    return int(value)


def kv_bytes_per_token(n_layers: int, n_kv_heads: int, head_dim: int, bytes_per_elem: int) -> int:
    """Bytes one token adds to the cache of one sequence, over every layer."""
    n_layers = _count("n_layers", n_layers, 1)
    n_kv_heads = _count("n_kv_heads", n_kv_heads, 1)
    head_dim = _count("head_dim", head_dim, 1)
    bytes_per_elem = _count("bytes_per_elem", bytes_per_elem, 1)
    # Why 2: each layer stores a key AND a value vector of head_dim numbers per KV head.
    return 2 * n_layers * n_kv_heads * head_dim * bytes_per_elem


def kv_cache_bytes(n_layers: int, batch: int, seq_len: int, n_kv_heads: int, head_dim: int,
                   bytes_per_elem: int) -> int:
    """Bytes of the whole cache: ``batch`` sequences of ``seq_len`` tokens each."""
    per_token = kv_bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_elem)
    return _count("batch", batch) * _count("seq_len", seq_len) * per_token


def _field(config: dict, name: str, default=None) -> int:
    """A positive int field; a missing or null one falls back to ``default`` or is an error."""
    value = config.get(name)
    if value is None:
        if default is None:
            raise ValueError(f"config: the field {name!r} is missing; the cache size needs it")
        return default
    return _count(f"config[{name!r}]", value, 1)


def _dtype_bytes(name) -> int:
    """Bytes per number of a dtype named as in config.json: "bfloat16", "float32", "int8", ..."""
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"torch_dtype: expected a dtype name such as 'bfloat16' or 'float16', got {name!r}")
    return dtype.itemsize


def _config_dtype_bytes(text: dict, config: dict) -> int:
    """Bytes per number of the dtype in the config: the text model's own, else the top level's."""
    for source in (text, config):
        name = source.get("dtype") or source.get("torch_dtype")  # newer files say "dtype"
        if name:
            return _dtype_bytes(name)
    raise ValueError("config: neither 'torch_dtype' nor 'dtype' is given; pass bytes_per_elem")


def kv_cache_bytes_from_config(config: dict, batch: int, seq_len: int, bytes_per_elem: int | None = None) -> int:
    """Cache bytes of a Hugging Face model, read from its config.json (parsed into a dict)."""
    if not isinstance(config, dict):
        raise ValueError(f"config: expected a dict (a parsed config.json), got {type(config).__name__}")
    # Multimodal checkpoints nest the language model's fields; the top level may describe another tower.
    text = config.get("text_config") or config
    if not isinstance(text, dict):
        raise ValueError(f"config: expected 'text_config' to be a dict, got {type(text).__name__}")
    n_layers = _field(text, "num_hidden_layers")
    n_heads = _field(text, "num_attention_heads")
    # No GQA field means plain multi-head attention: one KV head per query head.
    n_kv = _field(text, "num_key_value_heads", default=n_heads)
    head_dim = text.get("head_dim")
    if head_dim is None:  # absent or an explicit null: the query heads split hidden_size
        head_dim = _field(text, "hidden_size") // n_heads
    if bytes_per_elem is None:  # an explicit bytes_per_elem (say, an fp8 cache) beats the weights' dtype
        bytes_per_elem = _config_dtype_bytes(text, config)
    return kv_cache_bytes(n_layers, batch, seq_len, n_kv, head_dim, bytes_per_elem)


def crossover_tokens(weight_bytes: int, n_layers: int, n_kv_heads: int, head_dim: int, bytes_per_elem: int) -> int:
    """The fewest cached tokens (batch x sequence, summed) whose cache is at least the weights."""
    per_token = kv_bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_elem)
    weight_bytes = _count("weight_bytes", weight_bytes)
    # Round up: the smallest t with t * per_token >= weight_bytes. No floats, so no rounding surprise.
    return -(-weight_bytes // per_token)


def max_batch_size(memory_bytes: int, weight_bytes: int, seq_len: int, n_layers: int, n_kv_heads: int,
                   head_dim: int, bytes_per_elem: int) -> int:
    """How many sequences of ``seq_len`` tokens fit their caches next to the weights; 0 if none."""
    per_sequence = kv_bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_elem) * _count("seq_len", seq_len, 1)
    free = _count("memory_bytes", memory_bytes) - _count("weight_bytes", weight_bytes)
    if free < 0:  # not even the weights fit
        return 0
    # Round down: a sequence whose cache does not fit whole cannot run.
    return free // per_sequence


def projection_counts(n_steps: int, prompt_len: int = 1) -> tuple[int, int]:
    """Token projections (uncached, cached) over ``n_steps`` passes, the first over the prompt."""
    n, p = _count("n_steps", n_steps, 1), _count("prompt_len", prompt_len, 1)
    # Uncached, pass i runs over all p + i tokens again: p + (p + 1) + ... + (p + n - 1).
    uncached = n * p + n * (n - 1) // 2
    # Cached, the prompt pass projects p tokens and every later pass only its new one.
    cached = p + (n - 1)
    return uncached, cached


def _sum_of_squares(m: int) -> int:
    """1*1 + 2*2 + ... + m*m."""
    return m * (m + 1) * (2 * m + 1) // 6


def score_counts(n_steps: int, prompt_len: int = 1) -> tuple[int, int]:
    """Attention-score entries per head (uncached, cached) over ``n_steps`` passes."""
    n, p = _count("n_steps", n_steps, 1), _count("prompt_len", prompt_len, 1)
    # Uncached, pass i scores L = p + i queries against L keys: p*p + ... + (p+n-1)*(p+n-1).
    uncached = _sum_of_squares(p + n - 1) - _sum_of_squares(p - 1)
    # Cached: the prompt pass is still p x p; later step i scores one query against p + i keys.
    cached = p * p + (n - 1) * p + n * (n - 1) // 2
    return uncached, cached
