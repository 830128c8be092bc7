"""Shared building blocks the katas import: rotary position embeddings and a Llama model.

Shapes use fixed letters: B batch, H heads (Hq query, Hkv key/value), T new tokens,
S cached tokens, D head width, V vocabulary.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


def rope_inv_freq(head_dim: int, base: float = 10000.0, device=None, dtype=torch.float32) -> torch.Tensor:
    """Inverse frequencies ``base ** (-arange(0, D, 2) / D)``, shape (D/2,)."""
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim: expected a positive even number, got {head_dim}")
    if not base > 0:  # a base of 0 or below gives infinite or complex angles
        raise ValueError(f"base: expected a positive RoPE base (rope_base), got {base!r}")
    exponents = torch.arange(0, head_dim, 2, device=device, dtype=torch.float64) / head_dim
    return (base ** -exponents).to(dtype)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and *signed* sin of the angles ``positions * inv_freq``, each (..., T, D), in ``inv_freq``'s dtype.

    The angles use the frequencies (-f, f) rather than (f, f): cos(-a) = cos(a) and sin(-a) = -sin(a),
    so the sin comes with its first half negated, ready for ``rotate``.
    """
    half = positions.to(inv_freq.dtype)[..., None] * inv_freq  # (..., T, D/2)
    angles = torch.cat((-half, half), dim=-1)  # (..., T, D)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE, ``x * cos + rotate_half(x) * sin``, in three dispatches.

    With ``sin`` signed as ``rope_cos_sin`` gives it, rotate_half(x) * sin equals x with its halves
    swapped (a roll) times the signed sin. Computed in ``cos``'s dtype, returned in ``x``'s.
    """
    work = x if x.dtype == cos.dtype else x.to(cos.dtype)
    out = torch.addcmul(work * cos, work.roll(work.shape[-1] // 2, -1), sin)
    return out if out.dtype == x.dtype else out.to(x.dtype)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotate ``x`` (..., T, D) by the angles of ``positions``; rotate-half convention (Llama).

    ``positions`` is (T,) — the same positions for every row — or (B, T) for ``x`` of shape
    (B, H, T, D), one row of positions per batch row. Returns a new tensor of ``x``'s dtype.
    """
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise ValueError(f"x: expected a tensor (..., T, D), got {_describe(x)}")
    positions = torch.as_tensor(positions, device=x.device)
    if positions.dim() not in (1, 2) or positions.shape[-1] != x.shape[-2]:
        raise ValueError(
            f"positions: expected shape (T,) or (B, T) with T = {x.shape[-2]}, got {tuple(positions.shape)}"
        )
    if positions.dim() == 2 and (x.dim() != 4 or positions.shape[0] != x.shape[0]):
        raise ValueError(
            f"positions: a (B, T) tensor needs x of shape (B, H, T, D) with B = {positions.shape[0]}, "
            f"got x {tuple(x.shape)}"
        )
    work = torch.float64 if x.dtype == torch.float64 else torch.float32
    cos, sin = rope_cos_sin(positions, rope_inv_freq(x.shape[-1], base, device=x.device, dtype=work))
    if positions.dim() == 2:
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, D)
    return rotate(x, cos, sin)


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)}"
    return f"{type(x).__name__}"


# -- A Llama-architecture decoder ------------------------------------------------------------
# RMSNorm, RoPE, grouped-query attention and a SwiGLU MLP, with the parameter names of Hugging
# Face's LlamaForCausalLM, so a Llama-family checkpoint in safetensors loads as it is.
# Read top to bottom: config -> rope frequencies -> attention -> block -> model -> files.

_SDPA_GQA = tuple(int(p) for p in torch.__version__.split(".")[:2] if p.isdigit()) >= (2, 5)  # enable_gqa
_RMS_NORM = hasattr(F, "rms_norm")  # torch >= 2.4: the whole norm in one call


@dataclass
class LlamaConfig:
    """The fields of a Hugging Face Llama ``config.json`` this model reads (same names and defaults)."""

    vocab_size: int = 32000
    hidden_size: int = 4096
    intermediate_size: int = 11008
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None  # None: one per query head (multi-head attention)
    head_dim: int | None = None  # None: hidden_size // num_attention_heads
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 2048
    rope_scaling: dict | None = None  # None, or {"rope_type": "linear" | "llama3", ...}

    def __post_init__(self):
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_key_value_heads <= 0 or self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_key_value_heads: expected a positive divisor of num_attention_heads="
                             f"{self.num_attention_heads}, got {self.num_key_value_heads}")

    @classmethod
    def from_dict(cls, config: dict) -> "LlamaConfig":
        """Build from a ``config.json`` dict; fields this model does not read are ignored."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in config.items() if k in known})

    @classmethod
    def from_json(cls, path) -> "LlamaConfig":
        return cls.from_dict(_read_json(Path(path)))


def llama_inv_freq(config: LlamaConfig) -> torch.Tensor:
    """RoPE inverse frequencies (D/2,), float64 on the CPU, with the config's ``rope_scaling``."""
    inv_freq = rope_inv_freq(config.head_dim, config.rope_theta, device="cpu", dtype=torch.float64)
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        # Wavelengths longer than the original context / low_freq_factor are stretched by `factor`,
        # those shorter than context / high_freq_factor kept, and the band between blended linearly.
        context = scaling["original_max_position_embeddings"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        blend = ((context * inv_freq / (2 * math.pi) - low) / (high - low)).clamp(0.0, 1.0)
        return (1 - blend) * inv_freq / scaling["factor"] + blend * inv_freq
    raise ValueError(f"rope_scaling: rope_type {kind!r} is not supported (default, linear and llama3 are)")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.weight
        if _RMS_NORM and x.dtype == weight.dtype and x.dtype in (torch.float32, torch.float64):
            return F.rms_norm(x, weight.shape, weight, self.eps)  # the same formula in one call
        work = x.to(torch.promote_types(x.dtype, torch.float32))  # normalise in at least float32
        work = work * torch.rsqrt(work.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * work.to(x.dtype)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Scaled dot-product attention over grouped KV heads; returns (B, Hq, T, D).

    q (B, Hq, T, D); k, v (B, Hkv, S, D) with Hkv dividing Hq, KV head j serving query heads
    j*rep … j*rep + rep - 1; mask (B, 1, T, S): bool, True = may attend, or float, added to the
    scores (0 or -inf, q's dtype); or None: causal, the T queries being the last T of the S keys.
    """
    T, S = q.shape[2], k.shape[2]
    if mask is not None and tuple(mask.shape[-2:]) != (T, S):
        raise ValueError(f"attention_mask: expected (batch, {T}, {S}) for {T} new tokens against the {S} keys "
                         f"the cache returned, got {(mask.shape[0], *mask.shape[2:])}")
    if mask is None and S != T and T > 1:  # (one query, the last, sees every key: no mask needed)
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)  # query i sees keys <= S-T+i
    rep = q.shape[1] // k.shape[1]
    if _SDPA_GQA:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and T > 1,
                                              enable_gqa=rep > 1)
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)  # (B, Hq, S, D)
        v = v.repeat_interleave(rep, dim=1)  # (B, Hq, S, D)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None and T > 1)


class LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_q, self.n_kv, self.head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        width, inner = config.hidden_size, config.num_attention_heads * config.head_dim
        self.q_proj = nn.Linear(width, inner, bias=False)
        self.k_proj = nn.Linear(width, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(width, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(inner, width, bias=False)

    def forward(self, x, cos, sin, cache=None, mask=None) -> torch.Tensor:
        """x (B, T, hidden); cos, sin (B, 1, T, D), sin signed as rope_cos_sin gives it;
        mask (B, 1, T, S), bool or additive float, or None -> (B, T, hidden)."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_q, self.head_dim).transpose(1, 2)  # (B, Hq, T, D)
        k = self.k_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)  # (B, Hkv, T, D)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)  # keys are cached already rotated
        if cache is not None:
            k, v = cache.update(self.layer_idx, k, v)  # (B, Hkv, S, D)
        out = attend(q, k, v, mask)  # (B, Hq, T, D)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.n_q * self.head_dim))  # (B, T, hidden)


class LlamaMLP(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # SwiGLU


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, layer_idx: int):
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_idx)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, h, cos, sin, cache=None, mask=None) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, cache, mask)  # (B, T, hidden)
        return h + self.mlp(self.post_attention_layernorm(h))  # (B, T, hidden)


class Llama(nn.Module):
    """A Llama-architecture decoder; ``state_dict`` names are those of ``LlamaForCausalLM``."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.model = nn.ModuleDict({
            "embed_tokens": nn.Embedding(config.vocab_size, config.hidden_size),
            "layers": nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers)),
            "norm": RMSNorm(config.hidden_size, config.rms_norm_eps),
        })
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # Kept in float64 outside the parameters, so model.half() cannot round the frequencies.
        self._inv_freq = llama_inv_freq(config)
        self._inv_freq_on: dict = {}  # (device, dtype) -> a copy, made once

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def forward(self, input_ids, position_ids=None, cache=None, attention_mask=None, logits_to_keep: int = 0):
        """input_ids (B, T) -> logits (B, T, V); only the last ``logits_to_keep`` positions when > 0.

        ``position_ids`` (B, T): each token's position, default 0 … T-1. ``cache``: an object with
        ``update(layer, k, v) -> (K, V)``; each layer hands it the new rotated keys and values
        (B, Hkv, T, D) and attends to the (B, Hkv, S, D) it returns. ``attention_mask`` (B, T, S)
        bool, True = may attend; without it the attention is causal with the T new tokens the last
        T of the S keys (a plain causal forward when there is no cache).
        """
        if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.is_floating_point():
            raise ValueError(f"input_ids: expected integer token ids (batch, seq), got {_describe(input_ids)}")
        B, T = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(T, device=input_ids.device).expand(B, T)
        elif tuple(position_ids.shape) != (B, T):
            raise ValueError(f"position_ids: expected shape {(B, T)} like input_ids, got {tuple(position_ids.shape)}")
        mask = None
        if attention_mask is not None:
            shape = tuple(attention_mask.shape)
            if attention_mask.dtype != torch.bool or len(shape) != 3 or shape[:2] != (B, T):
                raise ValueError(f"attention_mask: expected a bool tensor ({B}, {T}, S), got "
                                 f"{_describe(attention_mask)} of dtype {attention_mask.dtype}")
            # A query that may see nothing (a left-pad token) would give NaN, and NaN keys poison every
            # later step; let it see everything instead, its output is never used.
            blocked = ~attention_mask & attention_mask.any(-1, keepdim=True)  # (B, T, S)
            # As scores to add (0 or -inf), made once here rather than by every layer's attention.
            mask = torch.zeros(B, 1, *shape[1:], dtype=self.dtype, device=blocked.device)
            mask.masked_fill_(blocked[:, None], float("-inf"))  # (B, 1, T, S)
        cos, sin = self._rope(position_ids)  # (B, 1, T, D)
        h = self.model.embed_tokens(input_ids)  # (B, T, hidden)
        for layer in self.model.layers:
            h = layer(h, cos, sin, cache, mask)
        if logits_to_keep:
            h = h[:, -logits_to_keep:]  # (B, logits_to_keep, hidden)
        return self.lm_head(self.model.norm(h))  # (B, T, V)

    def _rope(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin (B, 1, T, D) of ``position_ids`` (B, T), for ``rotate``."""
        work = torch.float64 if self.dtype == torch.float64 else torch.float32
        key = (position_ids.device, work)
        if key not in self._inv_freq_on:
            self._inv_freq_on[key] = self._inv_freq.to(device=position_ids.device, dtype=work)  # (D/2,)
        return rope_cos_sin(position_ids[:, None], self._inv_freq_on[key])

    # -- files -------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, folder, dtype: torch.dtype | None = None, device=None) -> "Llama":
        """Load a Hugging Face Llama folder: ``config.json`` and ``model.safetensors``, or the shards
        named in ``model.safetensors.index.json``. ``dtype`` defaults to the checkpoint's."""
        safe_open = _safetensors().safe_open
        folder = Path(folder)
        raw = _read_json(folder / "config.json")
        _check_llama(raw, folder / "config.json")
        with torch.device("meta"):  # shapes only: nothing is allocated or initialised here
            model = cls(LlamaConfig.from_dict(raw))
        wanted = {name: tuple(t.shape) for name, t in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            del wanted["lm_head.weight"]  # the embedding, stored once
        found = {}  # name -> file
        for path in _weight_files(folder):
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    if name.endswith("rotary_emb.inv_freq"):
                        continue  # older checkpoints store it; it is computed here
                    shape = tuple(f.get_slice(name).get_shape())
                    if name not in wanted:
                        raise ValueError(f"{path}: tensor {name!r} is not a parameter of this Llama model")
                    if shape != wanted[name]:
                        raise ValueError(f"{path}: tensor {name!r} has shape {shape}, the config asks for "
                                         f"{wanted[name]}")
                    found[name] = path
        missing = sorted(set(wanted) - set(found))
        if missing:
            raise ValueError(f"{folder}: tensor {missing[0]!r} is in no weight file ({len(missing)} missing in all)")
        if dtype is None:  # the checkpoint's, read from the embedding's header
            with safe_open(str(found["model.embed_tokens.weight"]), framework="pt") as f:
                stored = f.get_slice("model.embed_tokens.weight").get_dtype()
            dtype = {"BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}.get(stored, torch.float32)
        # In place: safetensors maps each tensor from the file privately (copy-on-write), so in the
        # checkpoint's dtype on the CPU the parameters are the file's pages, read on first use; nothing
        # is allocated and copied up front. Another dtype or device converts, once.
        tensors = {}
        for path in sorted(set(found.values())):
            with safe_open(str(path), framework="pt") as f:
                for name in (n for n in f.keys() if n in wanted):
                    tensors[name] = f.get_tensor(name).to(device=device or "cpu", dtype=dtype)
        if model.config.tie_word_embeddings:
            tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]
        model.load_state_dict(tensors, assign=True)
        if model.config.tie_word_embeddings:
            model.lm_head.weight = model.model.embed_tokens.weight  # one parameter, as the checkpoint stores it
        return model.eval()

    def save_pretrained(self, folder, max_shard_size: int | None = None) -> None:
        """Write ``config.json`` and the weights as safetensors, in shards of at most ``max_shard_size``
        bytes (with ``model.safetensors.index.json``) when given; a tied ``lm_head`` is not stored."""
        save_file = _safetensors().torch.save_file
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
                  "torch_dtype": str(self.dtype).removeprefix("torch."), **asdict(self.config)}
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        tensors = {name: t.detach().cpu().contiguous() for name, t in self.state_dict().items()
                   if not (self.config.tie_word_embeddings and name == "lm_head.weight")}
        shards, size = [{}], 0
        for name, t in tensors.items():
            nbytes = t.numel() * t.element_size()
            if max_shard_size and shards[-1] and size + nbytes > max_shard_size:
                shards, size = shards + [{}], 0
            shards[-1][name], size = t, size + nbytes
        index = folder / "model.safetensors.index.json"
        if len(shards) == 1:
            index.unlink(missing_ok=True)  # a stale index would win over the new file when loading
            save_file(shards[0], str(folder / "model.safetensors"), metadata={"format": "pt"})
            return
        files = [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
        for file, shard in zip(files, shards):
            save_file(shard, str(folder / file), metadata={"format": "pt"})
        weight_map = {name: file for file, shard in zip(files, shards) for name in shard}
        total = sum(t.numel() * t.element_size() for t in tensors.values())
        index.write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n",
                         encoding="utf-8")


def _safetensors():
    try:
        import safetensors
        import safetensors.torch  # noqa: F401  (save_file lives there)
    except ImportError:
        raise ImportError("loading and saving models needs the safetensors package: "
                          "pip install 'kv-cache-katas[models]'") from None
    return safetensors


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None


def _check_llama(raw: dict, path: Path) -> None:
    kind, architectures = raw.get("model_type"), raw.get("architectures") or []
    if (kind is not None and kind != "llama") or (architectures and "LlamaForCausalLM" not in architectures):
        raise ValueError(f"{path}: model_type {kind!r}, architectures {architectures}: not a Llama checkpoint "
                         "(model_type 'llama', LlamaForCausalLM); this model reads Llama only")
    if raw.get("hidden_act", "silu") != "silu" or raw.get("attention_bias") or raw.get("mlp_bias"):
        raise ValueError(f"{path}: hidden_act {raw.get('hidden_act')!r}, attention_bias {raw.get('attention_bias')}, "
                         f"mlp_bias {raw.get('mlp_bias')}: only silu without biases is supported")


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: no weight_map")
        files = [folder / name for name in sorted(set(weight_map.values()))]
        for path in files:
            if not path.is_file():
                raise FileNotFoundError(f"{path}: no such file (listed in {index.name})")
        return files
    single = folder / "model.safetensors"
    if single.is_file():
        return [single]
    others = sorted(folder.glob("*.safetensors"))
    if len(others) == 1:
        return others
    raise FileNotFoundError(f"{single}: no such file, and no {index.name} to name shards"
                            + (f" (found {len(others)} other .safetensors files)" if others else ""))
