"""grader.kernels: a model's projections in the layout and kernel the CPU reads fastest, the model otherwise
unchanged. Held here, on a small grader.nn Llama (SmolLM2's own run is in tests/test_models.py): every kernel
gives the plain product's outputs within float32 rounding and the same greedy tokens; parameters, names,
state_dict and the tied head stay as they were; a copy is never used for a weight that changed after it was
made (an in-place write, a new dtype), nor where autograd needs the weight; the choice never takes a kernel
that disagrees, is remembered per machine and shape, and ``KVKATA_KERNELS`` turns it off."""
from __future__ import annotations

import json

import pytest
import torch

from grader import kernels
from grader.nn import Llama, LlamaConfig

CONFIG = dict(vocab_size=300, hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, max_position_embeddings=64, tie_word_embeddings=True)
KINDS = kernels.supported([torch.zeros(1, 1)])


@pytest.fixture(autouse=True)
def no_env(monkeypatch):
    monkeypatch.delenv(kernels.ENV, raising=False)


def model(seed: int = 0) -> Llama:
    torch.manual_seed(seed)
    return Llama(LlamaConfig(**CONFIG)).eval()


def greedy(m: Llama, ids: torch.Tensor, n: int = 6) -> list[list[int]]:
    with torch.no_grad():
        for _ in range(n):
            ids = torch.cat([ids, m(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids.tolist()


def weights(m) -> list[torch.Tensor]:
    return [w for w, _ in kernels.projections(m)]


@pytest.mark.parametrize("kernel", KINDS)
def test_every_kernel_gives_the_plain_products_outputs_and_tokens(kernel):
    """q/k/v and gate/up run apart while their groups watch the first forward, then as one stacked product
    (but on the plain product, which reads every weight alone); one copy of the weights in all."""
    m = model()
    ids = torch.randint(0, CONFIG["vocab_size"], (3, 9))
    with torch.no_grad():
        plain, tokens = m(ids), greedy(m, ids)
    kernels.install(m, {rows: kernel for rows in kernels.ROWS}, weights(m))
    assert all(kernels.chosen(w) == {rows: kernel for rows in kernels.ROWS} for w in weights(m))
    groups = 0 if kernel == "stored" else 2 * CONFIG["num_hidden_layers"]  # (q, k, v) and (gate, up) a layer
    assert kernels.fused(m) == (0, groups)
    assert greedy(m, ids) == tokens and kernels.fused(m) == (groups, groups)
    with torch.no_grad():
        tuned = m(ids)
    # float32 rounding of a sum over the widest input (160 terms), on logits of size about 1
    assert (tuned - plain).abs().max() <= 160 * torch.finfo(torch.float32).eps * plain.abs().max()
    plans = [kernels._PLANS[w] for w in weights(m)]
    stacked = {id(p.group): p.group for p in plans if p.group is not None}
    copies = [c for p in plans for c in p.copies.values()] + [c for g in stacked.values() for c in g.copies.values()]
    sizes = [c.numel() if c.layout == torch.strided else c.to_dense().numel() for c in copies if c is not None]
    assert sum(sizes) == (0 if kernel == "stored" else sum(w.numel() for w in weights(m)))  # stacked or not


def test_the_model_is_unchanged_but_for_how_its_products_run():
    m = model()
    before = {k: v.clone() for k, v in m.state_dict().items()}
    params = dict(m.named_parameters())
    kernels.tune(m, rows_list=(1, 8), repeats=1)
    assert m.lm_head.weight is m.model.embed_tokens.weight  # still one tied parameter
    assert dict(m.named_parameters()) == params
    after = m.state_dict()
    assert list(after) == list(before) and all(torch.equal(before[k], after[k]) for k in before)
    assert all(isinstance(mod, torch.nn.Linear) for mod in m.modules() if isinstance(mod, kernels.TunedLinear))


@pytest.mark.parametrize("kernel", [k for k in KINDS if k != "stored"])
def test_a_weight_written_after_the_copy_was_made_is_read_as_it_is_now(kernel):
    m, other = model(0), model(1)
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 5))
    kernels.install(m, {rows: kernel for rows in kernels.ROWS}, weights(m))
    m.load_state_dict(other.state_dict())  # an in-place copy into every parameter
    with torch.no_grad():
        assert torch.allclose(m(ids), other(ids), atol=1e-5)
        m.model.layers[0].mlp.down_proj.weight.mul_(2)  # one more in-place write
        other.model.layers[0].mlp.down_proj.weight.mul_(2)
        assert torch.allclose(m(ids), other(ids), atol=1e-5)
    m.double()  # a new dtype (and storage): the float32 copies no longer apply
    with torch.no_grad():
        assert torch.allclose(m(ids), other.double()(ids), atol=1e-9)


def test_autograd_sees_the_weights_themselves():
    m = model()
    kernels.install(m, {rows: KINDS[-1] for rows in kernels.ROWS}, weights(m))
    m(torch.randint(0, CONFIG["vocab_size"], (1, 4))).sum().backward()
    assert all(w.grad is not None and w.grad.abs().sum() > 0 for w in weights(m))


def test_a_kernel_that_disagrees_is_never_chosen():
    measured = {"seconds": {1: {"stored": 3.0, "transposed": 2.0, "onednn": 1.0}},
                "agrees": {1: {"stored": True, "transposed": True, "onednn": False}}}
    assert kernels.choose(measured) == {1: "transposed"}


def test_the_fastest_kernel_is_chosen_per_row_count_and_the_nearest_row_count_is_used():
    measured = {"seconds": {1: {"stored": 3.0, "transposed": 1.0}, 8: {"stored": 1.0, "transposed": 2.0}},
                "agrees": {1: {"stored": True, "transposed": True}, 8: {"stored": True, "transposed": True}}}
    assert kernels.choose(measured) == {1: "transposed", 8: "stored"}
    assert [kernels.nearest(rows, (1, 8, 64)) for rows in (1, 2, 3, 8, 22, 23, 64, 500)] == [1, 1, 8, 8, 8, 64, 64, 64]  # nearest by ratio


def test_at_most_one_copy_of_the_weights_is_made():
    """transposed is fastest at one row, oneDNN at 8 and 64: the plan with oneDNN throughout loses less at one
    row (2.1 against 2.0) than transposed would at 8 and 64, and needs one copy, not two."""
    measured = {"seconds": {1: {"stored": 3.0, "transposed": 2.0, "onednn": 2.1},
                            8: {"stored": 3.0, "transposed": 3.5, "onednn": 1.5},
                            64: {"stored": 3.0, "transposed": 3.2, "onednn": 2.0}},
                "agrees": {r: {"stored": True, "transposed": True, "onednn": True} for r in (1, 8, 64)}}
    assert kernels.choose(measured) == {1: "onednn", 8: "onednn", 64: "onednn"}
    assert kernels.choose(measured, copies=2) == {1: "transposed", 8: "onednn", 64: "onednn"}
    measured["seconds"][1]["onednn"] = 3.5  # now oneDNN at one row is worse than the plain product
    assert kernels.choose(measured) == {1: "stored", 8: "onednn", 64: "onednn"}


def test_the_choice_is_remembered_per_machine_and_shape(tmp_path, monkeypatch):
    remember = tmp_path / "kernels.json"
    first = kernels.tune(model(), remember=remember, rows_list=(1, 8), repeats=1)
    assert not first["remembered"] and set(first["choice"]) == {1, 8}
    kept = json.loads(remember.read_text())
    assert len(kept) == 1 and "torch" in next(iter(kept))

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured again although the choice is remembered")
    monkeypatch.setattr(kernels, "measure", no_measuring)
    again = kernels.tune(model(), remember=remember, rows_list=(1, 8))
    assert again["remembered"] and again["choice"] == first["choice"]
    m = model()
    monkeypatch.setenv(kernels.ENV, "measure")
    with pytest.raises(AssertionError, match="measured again"):
        kernels.tune(m, remember=remember)
    remember.write_text("{not json")  # a damaged file costs a measurement, never an error
    monkeypatch.undo()
    assert not kernels.tune(model(), remember=remember, rows_list=(1,), repeats=1)["remembered"]


def test_kvkata_kernels_plain_tunes_nothing_and_a_bad_value_is_named(monkeypatch):
    m = model()
    monkeypatch.setenv(kernels.ENV, "plain")
    assert kernels.tune(m)["choice"] == {} and all(kernels.chosen(w) is None for w in weights(m))
    monkeypatch.setenv(kernels.ENV, "fast")
    with pytest.raises(ValueError, match="KVKATA_KERNELS='fast'"):
        kernels.tune(m)


def test_weights_the_kernels_cannot_read_keep_the_plain_product():
    m = model().double()
    assert kernels.tune(m)["choice"] == {} and all(kernels.chosen(w) is None for w in weights(m))


def test_plain_sets_the_choice_aside_and_puts_it_back():
    m = model()
    kernels.install(m, {rows: KINDS[-1] for rows in kernels.ROWS}, weights(m))
    with kernels.plain(m):
        assert all(kernels.chosen(w) is None for w in weights(m))
    assert all(kernels.chosen(w) is not None for w in weights(m))


def test_the_timed_sample_holds_every_shape():
    m = model()
    pairs = kernels.projections(m)
    shapes = {tuple(w.shape) for w, _ in pairs}
    assert {tuple(w.shape) for w, _ in kernels._sample(pairs)} == shapes
    assert len({id(w) for w, _ in pairs}) == len(pairs)  # the tied head counted once


class Trio(torch.nn.Module):
    """An attention's three projections, q and v with a bias and k without (as Whisper's)."""

    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(24, n, bias=b) for n, b in
                                                 ((24, True), (8, False), (8, True)))


# calls in order: "q x" runs q_proj on input x; "write x" / "write k" adds to input x / to k_proj's weight in place
FUSING = ["q x", "k x", "v x"]  # the first round watches; the group fuses from the next
CALLS = {
    "in order on one input": (FUSING * 3, "fused", 2),
    "cross-attention: k and v on the encoder, q on the decoder": (["k e", "v e", "q x"] * 2, "apart", 0),
    "another input midway": (FUSING + ["q x", "k y", "v y"] + FUSING, "apart", 1),
    "the input written between two members": (FUSING + ["q x", "write x", "k x", "v x"], "apart", 1),
    "columns left unasked for": (FUSING + ["q x", "k x", "q x", "k x", "v x"], "apart", 1),
    "a member's weight written after fusing": (FUSING + ["write k"] + FUSING, "apart", 0),
    "the first member alone, again and again": (["q x"] * 3, "apart", 0),
    "a member out of order while watching": (["q x", "v x", "k x"], "apart", 0),
}


@pytest.mark.parametrize("kernel", [k for k in KINDS if k != "stored"])
@pytest.mark.parametrize("case", CALLS)
def test_siblings_read_one_stacked_product_only_while_called_in_order_on_one_input(case, kernel):
    calls, state, products = CALLS[case]
    torch.manual_seed(0)
    trio = Trio()
    inputs = {name: torch.randn(3, 24) for name in "xye"}
    kernels.install(trio, {rows: kernel for rows in kernels.ROWS}, weights(trio))
    group = kernels._PLANS[trio.q_proj.weight].group
    with torch.no_grad():
        for call in calls:
            name, arg = call.split()
            if name == "write":
                (inputs[arg] if arg in inputs else getattr(trio, f"{arg}_proj").weight).add_(0.5)
                continue
            module = getattr(trio, f"{name}_proj")
            got, want = module(inputs[arg]), torch.nn.functional.linear(inputs[arg], module.weight, module.bias)
            assert got.is_contiguous() and got.shape == want.shape, call
            assert (got - want).abs().max() <= 24 * 8 * torch.finfo(torch.float32).eps * want.abs().max(), call
    assert (group.state, group.fused) == (state, products)
    assert kernels.fused(trio) == (state == "fused", 1)
    assert (group.copies == {}) == (state == "apart")  # a group apart lets its stacked copy go


def test_stacked_holds_each_group_as_one_weight_and_every_other_projection_once():
    m = model()
    pairs, out = kernels.projections(m), kernels.stacked(m)
    assert len(out) == len(pairs) - 3 * CONFIG["num_hidden_layers"]  # q, k, v -> 1 and gate, up -> 1 a layer
    attn = m.model.layers[0].self_attn
    assert torch.equal(out[0][0], torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
    assert sum(w.numel() for w, _ in out) == sum(w.numel() for w, _ in pairs)
