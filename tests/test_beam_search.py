"""Kata 11's building blocks and its outside reference: the shared paged cache behaves as kata 06
asks, and the reference beam search agrees with Hugging Face transformers when there is no EOS."""
from __future__ import annotations

import math

import pytest
import torch

from grader import grade, manifest
from grader.engine import targets
from grader.checks.support.models import tiny_model
from grader.paged import PagedKVCache

PROMPT = [5, 17, 3, 40, 22, 9, 11]


def test_shared_paged_cache_passes_every_check_of_kata_06():
    shared = targets.from_path(manifest.PACKAGE_DIR / "paged.py", label="grader/paged.py")
    results = grade.grade("06", shared, diagnose=False)
    failed = [f"{r.check.id}: {r.status}: {r.message}" for r in results if not r.passed]
    assert not failed, "\n".join(failed)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    model = tiny_model(4, "cpu")
    folder = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(folder)
    try:
        hf = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float64)
    except TypeError:  # transformers before 4.56 names it torch_dtype
        hf = transformers.LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float64)
    hf.generation_config.eos_token_id = None  # the config's default EOS would end hypotheses
    hf.generation_config.bos_token_id = None
    return model, hf.eval()


@pytest.mark.parametrize("num_beams,max_new_tokens,length_penalty",
                         [(1, 6, 1.0), (2, 8, 1.0), (3, 10, 2.0), (4, 12, 0.0), (4, 5, -0.5)])
def test_reference_matches_hugging_face_without_eos(models, num_beams, max_new_tokens, length_penalty):
    model, hf = models
    beam_search = targets.reference(manifest.get("11")).namespace["beam_search"]
    cache = PagedKVCache(64, 4, 2, 2, 8, dtype=torch.float64)
    ours = beam_search(model, PROMPT, num_beams, max_new_tokens, cache=cache, length_penalty=length_penalty)
    out = hf.generate(input_ids=torch.tensor([PROMPT]), attention_mask=torch.ones(1, len(PROMPT), dtype=torch.long),
                      max_new_tokens=max_new_tokens, num_beams=num_beams, num_return_sequences=num_beams,
                      do_sample=False, length_penalty=length_penalty, pad_token_id=0,
                      output_scores=True, return_dict_in_generate=True)
    assert [tokens for tokens, _ in ours] == [row[len(PROMPT):].tolist() for row in out.sequences]
    if num_beams > 1:  # with one beam transformers runs greedy decoding and reports no sequence scores
        for (_, score), theirs in zip(ours, out.sequences_scores.tolist()):
            assert math.isclose(score, theirs, rel_tol=1e-6)  # transformers scores in float32
    assert cache.allocator.num_free == 64
