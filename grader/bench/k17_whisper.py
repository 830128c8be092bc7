"""``python -m grader.bench.k17 --real-model``: Whisper tiny.en (``grader.whisper``) with kata 17's cache in its
decoder, against transformers' ``WhisperForConditionalGeneration`` holding the same weights and its own
``EncoderDecoderCache``.

It transcribes ``the_cat.wav`` greedily through kata 17's cache, then feeds transformers the same tokens one
step at a time and compares the raw logits of every step (not ``generate``, whose processors suppress
tokens). Then the cache: its cross part's 1,500 frames per layer against its self part's few tokens, in
length and bytes; and one decoder step timed with the cross K and V read from the cache against projected
again from the encoder output, next to the FLOP ratio of the two from the formula.

``the_cat.wav`` was made once with espeak-ng 1.51: ``espeak-ng -v en-us -s 150 -w out.wav "The cat sat on
the mat."``, trimmed to 50 ms before the first and after the last sample louder than 200, resampled from
22,050 to 16,000 Hz with scipy's ``resample_poly(x, 320, 441)`` and written as 16-bit mono (1.5 s, 50 KB).
"""
from __future__ import annotations

import inspect
import wave
from pathlib import Path

import torch

from grader import models, whisper
from grader.bench import noise as bench_noise

SAMPLE = Path(__file__).with_name("the_cat.wav")
SAMPLE_TEXT = "The cat sat on the mat."
RATE = 16_000


def read_wav(path: Path) -> torch.Tensor:
    """A 16 kHz mono 16-bit WAV file as float32 samples in [-1, 1), shape (N,)."""
    with wave.open(str(path), "rb") as f:
        if (f.getframerate(), f.getnchannels(), f.getsampwidth()) != (RATE, 1, 2):
            raise ValueError(f"{path}: expected 16 kHz mono 16-bit audio, got {f.getframerate()} Hz, "
                             f"{f.getnchannels()} channels, {8 * f.getsampwidth()} bits")
        raw = bytearray(f.readframes(f.getnframes()))
    return torch.frombuffer(raw, dtype=torch.int16).float() / 32768


def log_mel(audio: torch.Tensor, n_mels: int) -> torch.Tensor:
    """(1, n_mels, 3000) log-mel features of 30 s (the audio padded with silence), by transformers' extractor."""
    import transformers  # optional: the comparison needs it anyway

    extract = transformers.WhisperFeatureExtractor(feature_size=n_mels, sampling_rate=RATE)
    return extract(audio.numpy(), sampling_rate=RATE, return_tensors="pt").input_features


def transformers_whisper(model: whisper.Whisper):
    """transformers' ``WhisperForConditionalGeneration`` holding ``model``'s weights (float32, eval)."""
    import transformers

    c = model.config
    config = transformers.WhisperConfig(
        vocab_size=c.vocab_size, num_mel_bins=c.n_mels, d_model=c.d_model, encoder_layers=c.encoder_layers,
        decoder_layers=c.decoder_layers, encoder_attention_heads=c.n_heads, decoder_attention_heads=c.n_heads,
        encoder_ffn_dim=c.ffn, decoder_ffn_dim=c.ffn, max_source_positions=c.frames, max_target_positions=c.max_tokens)
    with torch.device("meta"):  # no random initialisation: every weight is loaded next
        theirs = transformers.WhisperForConditionalGeneration(config)
    theirs = theirs.to_empty(device="cpu")
    theirs.model.load_state_dict(model.state_dict(), strict=True)  # the same names: nothing missing or left over
    theirs.tie_weights()  # its output head shares the token embeddings again (to_empty gave it storage of its own)
    if theirs.proj_out.weight.data_ptr() != theirs.model.decoder.embed_tokens.weight.data_ptr():
        raise ValueError("transformers' Whisper did not tie its output head to the token embeddings")
    return theirs.float().eval()


@torch.inference_mode()
def greedy(model: whisper.Whisper, encoder_out, prompt: list[int], eot: int, cache,
           max_new_tokens: int) -> tuple[list[int], torch.Tensor]:
    """Greedy tokens after ``prompt`` (the prompt as one call, then one token per call, all through ``cache``),
    up to ``eot`` included; and each call's last logits (steps, V), the step after ``eot`` not taken."""
    logits = model.decode(torch.tensor([prompt]), torch.arange(len(prompt))[None], encoder_out, cache)[0, -1]
    tokens, rows = [], [logits]
    while len(tokens) < max_new_tokens:
        tokens.append(int(rows[-1].argmax()))
        if tokens[-1] == eot:
            break
        position = torch.tensor([[len(prompt) + len(tokens) - 1]])
        rows.append(model.decode(torch.tensor([[tokens[-1]]]), position, encoder_out, cache)[0, -1])
    return tokens, torch.stack(rows)  # (steps, V)


@torch.inference_mode()
def transformers_logits(theirs, mel: torch.Tensor, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """transformers' last logits per call (steps, V): its encoder once, the prompt as one call, then the tokens
    one at a time, with its own ``EncoderDecoderCache``; the same calls as ``greedy`` made."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache
    from transformers.modeling_outputs import BaseModelOutput

    dtype = next(theirs.parameters()).dtype
    encoded = BaseModelOutput(last_hidden_state=theirs.model.encoder(mel.to(dtype)).last_hidden_state)
    name = "cache" if "cache" in inspect.signature(theirs.forward).parameters else "past_key_values"  # 5.x: cache
    held = EncoderDecoderCache(DynamicCache(), DynamicCache())
    rows, fed = [], [prompt] + [[t] for t in tokens[:-1]]
    for ids in fed:
        out = theirs(encoder_outputs=encoded, decoder_input_ids=torch.tensor([ids]), use_cache=True, **{name: held})
        rows.append(out.logits[0, -1])
    return torch.stack(rows)  # (steps, V)


class Recomputing:
    """A cache that hands the self part to ``cache`` but never keeps a cross part, so every call projects the
    cross K and V again (kata 17's first known mistake, on purpose, for the timing)."""

    def __init__(self, cache):
        self.cache = cache

    def update(self, layer, k, v):
        return self.cache.update(layer, k, v)

    def cross(self, layer):
        return None

    def set_cross(self, layer, k, v):
        return k, v

    def crop(self, n):
        self.cache.crop(n)


def step_flops(c: whisper.WhisperConfig, held_tokens: int) -> dict:
    """FLOPs of one decoder step of one token (2 per multiply-add; biases, norms and softmax left out): the
    step with the cross K/V cached, and what projecting them again adds (k and v over every frame, each layer)."""
    per_layer = (4 * c.d_model ** 2 + 2 * (held_tokens + 1) * c.d_model  # self: q, k, v, out; scores and sum
                 + 2 * c.d_model ** 2 + 2 * c.frames * c.d_model  # cross: q, out; scores and sum over the frames
                 + 2 * c.d_model * c.ffn)  # the MLP
    cached = 2 * (c.decoder_layers * per_layer + c.d_model * c.vocab_size)  # the layers, the output head
    return {"cached": cached, "recompute_extra": 2 * c.decoder_layers * 2 * c.frames * c.d_model ** 2}


def time_step(model: whisper.Whisper, encoder_out, cache, token: int, position: int, repeats: int) -> dict:
    """One decoder step at ``position`` through ``cache``, timed; the cache cropped back after each repeat."""
    ids, at = torch.tensor([[token]]), torch.tensor([[position]])

    def step():
        with torch.inference_mode():
            logits = model.decode(ids, at, encoder_out, cache)
        cache.crop(position)
        return logits

    step()  # warm-up
    timing, logits = bench_noise.repeat(step, repeats)
    return {**timing, "logits": logits}


def _special(tokenizer) -> tuple[list[int], int]:
    """The prompt of an English-only model without timestamps, and the end-of-text id."""
    ids = [tokenizer.token_to_id(t) for t in ("<|startoftranscript|>", "<|notimestamps|>", "<|endoftext|>")]
    if None in ids:
        raise ValueError("tokenizer.json lacks Whisper's special tokens")
    return ids[:2], ids[2]


def compare(model: whisper.Whisper, mel, prompt: list[int], tokens: list[int], logits: torch.Tensor) -> dict:
    """The port's logits (steps, V) against transformers' float32 run; judged by twice transformers' own float32
    error against its float64 run on the same input (two float32 runs of one computation may each err so)."""
    theirs = transformers_whisper(model)
    float32 = transformers_logits(theirs, mel, prompt, tokens)
    float64 = transformers_logits(theirs.double(), mel.double(), prompt, tokens)
    own_error = (float32.double() - float64).abs().max().item()
    return {"max_abs_diff": (logits - float32).abs().max().item(), "tolerance": 2 * own_error,
            "transformers_float32_error": own_error, "steps": logits.shape[0],
            "same_argmax": bool((float32.argmax(-1) == logits.argmax(-1)).all())}


def _parts(model: whisper.Whisper, cache) -> dict:
    """Lengths and bytes of the cache's self and cross parts, every layer."""
    c, layers = model.config, range(model.config.decoder_layers)
    per_position = 2 * c.d_model * next(model.parameters()).element_size()  # K and V of all heads, batch 1
    self_bytes = per_position * sum(cache.seq_len(i) for i in layers)
    return {"self_tokens": [cache.seq_len(i) for i in layers], "cross_frames": [cache.cross_len(i) for i in layers],
            "self_bytes": self_bytes, "cross_bytes": cache.nbytes() - self_bytes,
            "cross_bytes_formula": per_position * sum(cache.cross_len(i) for i in layers)}


def transcribe(model: whisper.Whisper, cache, audio: Path = SAMPLE, max_new_tokens: int = 24) -> dict:
    """``audio`` through the encoder once, then greedy decoding with ``cache`` in the decoder: the features,
    the prompt, the tokens and their text, and each call's last logits (steps, V)."""
    from tokenizers import Tokenizer  # optional: the dev and models extras

    tokenizer = Tokenizer.from_file(str(whisper.model_dir() / "tokenizer.json"))
    prompt, eot = _special(tokenizer)
    mel = log_mel(read_wav(audio), model.config.n_mels)  # (1, M, 3000)
    with torch.inference_mode():
        encoder_out = model.encode(mel)  # (1, 1500, d), once
    tokens, logits = greedy(model, encoder_out, prompt, eot, cache, max_new_tokens)
    return {"mel": mel, "encoder_out": encoder_out, "prompt": prompt, "tokens": tokens, "logits": logits,
            "text": tokenizer.decode(tokens).strip()}


def bench_real(cache_cls, progress, max_new_tokens: int = 24, audio: Path = SAMPLE, repeats: int = 5) -> dict:
    """Transcribe ``audio`` with kata 17's ``cache_cls`` in the port's decoder; compare with transformers; time."""
    model, cache = whisper.load(remember=models.kernels_file()), cache_cls()
    run = transcribe(model, cache, audio, max_new_tokens)
    tokens = run["tokens"]
    row = {"tokens": tokens, "text": run["text"], "head_bytes": model.decoder.embed_tokens.weight.nbytes,
           **_parts(model, cache)}
    progress.step("Whisper tiny.en greedy", f"{row['text']!r}; cache self {row['self_tokens'][0]} tokens, "
                  f"cross {row['cross_frames'][0]} frames per layer")
    row["logits"] = compare(model, run["mel"], run["prompt"], tokens, run["logits"])
    progress.step("Whisper tiny.en vs transformers", f"max |logit difference| {row['logits']['max_abs_diff']:.3g}")
    position, encoder_out = cache.seq_len(), run["encoder_out"]
    cached = time_step(model, encoder_out, cache, tokens[-1], position, 4 * repeats)
    recomputed = time_step(model, encoder_out, Recomputing(cache), tokens[-1], position, repeats)
    row["same_step_logits"] = bool(torch.equal(cached.pop("logits"), recomputed.pop("logits")))
    weights = sum(p.nbytes for n, p in model.decoder.named_parameters() if "embed_positions" not in n)
    row["step"] = {"cached": cached, "recomputed": recomputed, "position": position,
                   "flops": step_flops(model.config, position), "bytes_read": weights + cache.nbytes()}
    progress.step("Whisper tiny.en step", f"cached {1e3 * cached['median']:.1f} ms{bench_noise.mark(cached)}, "
                  f"recomputed {1e3 * recomputed['median']:.1f} ms{bench_noise.mark(recomputed)}")
    return row


def lines(r: dict) -> list[str]:
    """What the real-model run shows, one finding a line."""
    lg, st = r["logits"], r["step"]
    verdict = "equal" if lg["max_abs_diff"] <= lg["tolerance"] else "DIFFERENT"
    flops = st["flops"]
    extra = flops["recompute_extra"] / max(st["recomputed"]["median"] - st["cached"]["median"], 1e-9) / 1e9
    noisy = st["cached"]["noisy"] or st["recomputed"]["noisy"]
    ratio = "NOISY, not a result" if noisy else f"{st['recomputed']['median'] / st['cached']['median']:.1f}x"
    out = [
        f"Whisper tiny.en, greedy through kata 17's cache: {r['text']!r} ({len(r['tokens'])} tokens: {r['tokens']})",
        f"logits vs transformers' EncoderDecoderCache run, {lg['steps']} steps: max |difference| "
        f"{lg['max_abs_diff']:.3g}, {verdict} within {lg['tolerance']:.3g} (twice transformers' own float32 error "
        f"against its float64 run, {lg['transformers_float32_error']:.3g}); same argmax: {lg['same_argmax']}",
        f"cache: self part {r['self_tokens'][0]} tokens per layer, {r['self_bytes']:,} B; cross part "
        f"{r['cross_frames'][0]} frames per layer, {r['cross_bytes']:,} B (formula {r['cross_bytes_formula']:,} B), "
        f"{r['cross_bytes'] / max(r['self_bytes'], 1):.0f}x the self part",
        f"one decoder step at position {st['position']}: cross K/V cached {1e3 * st['cached']['median']:.2f} ms"
        f"{bench_noise.mark(st['cached'])}, projected again {1e3 * st['recomputed']['median']:.2f} ms"
        f"{bench_noise.mark(st['recomputed'])}: {ratio}; same logits: {r['same_step_logits']}",
        f"FLOPs per step (formula): cached {flops['cached'] / 1e6:.0f} M, projecting again adds "
        f"{flops['recompute_extra'] / 1e9:.2f} G: "
        f"{(flops['cached'] + flops['recompute_extra']) / flops['cached']:.0f}x",
        f"the cached step reads {st['bytes_read'] / 1e6:.0f} MB (the decoder's weights, the output head's "
        f"{r['head_bytes'] / 1e6:.0f} MB among them, and the cache) and runs its {flops['cached'] / 1e6:.0f} MFLOP at "
        f"{flops['cached'] / st['cached']['median'] / 1e9:.1f} GFLOP/s, the extra projection at {extra:.1f} GFLOP/s: "
        "it waits on memory and per-call overhead, not on arithmetic, so the time ratio stays below the FLOP ratio",
    ]
    return out[:-1] if noisy else out  # the last line reads the times: only trustworthy ones
