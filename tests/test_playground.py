"""``kvkata generate DIR``: a loop run on a checkpoint the test writes itself."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from conftest import slow
from grader import manifest
from grader.nn import Llama, LlamaConfig

pytestmark = slow  # kvkata generate in subprocesses

ROOT = manifest.REPO_ROOT


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    pytest.importorskip("safetensors")
    folder = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    model = Llama(LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2))
    model.save_pretrained(folder)
    return folder, model


def _kvkata(*args):
    return subprocess.run([sys.executable, "-m", "grader.cli", "generate", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_reference_loop_runs_on_a_checkpoint_and_matches_the_model(checkpoint):
    folder, model = checkpoint
    done = _kvkata(str(folder), "--prompt-ids", "[[1, 2, 3], [7]]", "--max-new-tokens", "4", "--loop", "solution")
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["prompt"] for r in rows] == [[1, 2, 3], [7]]
    for row in rows:  # greedy, checked against uncached forwards of the same weights
        ids = list(row["prompt"])
        for token in row["new"]:
            with torch.no_grad():
                assert token == int(model(torch.tensor([ids]))[0, -1].argmax())
            ids.append(token)
    assert "tokens/s" in done.stderr


def test_bad_input_and_an_unfinished_loop_give_clear_errors(checkpoint):
    folder, _ = checkpoint
    done = _kvkata(str(folder), "--prompt-ids", "[1, 2", "--loop", "solution")
    assert done.returncode == 2 and "--prompt-ids: expected JSON" in done.stderr
    done = _kvkata(str(folder), "--prompt-ids", "[[1]]")
    assert done.returncode == 2 and "not implemented yet" in done.stderr
    done = _kvkata(str(folder / "missing"), "--prompt-ids", "[[1]]", "--loop", "solution")
    assert done.returncode == 2 and "config.json" in done.stderr


def test_text_prompts_with_a_tokenizer_in_the_folder(checkpoint, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    folder, _ = checkpoint
    words = ["<unk>", "once", "upon", "a", "time"] + [f"w{i}" for i in range(35)]
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    try:
        done = _kvkata(str(folder), "--prompt", "once upon a time", "--max-new-tokens", "3", "--loop", "solution")
    finally:
        (folder / "tokenizer.json").unlink()
    assert done.returncode == 0, done.stderr
    text = done.stdout.strip().split()
    assert text[:4] == ["once", "upon", "a", "time"] and len(text) == 7
