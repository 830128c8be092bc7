"""The device check proven on a CPU-only machine: each kata's ``keeps_the_device`` passes the
reference and correct-but-unusual variants, and fails variants that leave a tensor on the CPU.

Variants are text edits of the reference (as the mistake catalogue writes them), kept here:
they are not learners' typical mistakes, only proof that the stand-in device sees the bug.
"""
from __future__ import annotations

import importlib

import pytest
import torch
import torch.nn.functional as F

from grader import checks, manifest
from grader.engine import targets
from grader.checks.support import devices
from grader.engine import Ctx, run_check

KATAS = ["01", "02", "03", "05", "06", "07", "08", "09", "11", "12", "13", "14"]

# Variants that a GPU would reject: (kata, what, edits, text the failure message must hold).
WRONG = [
    ("01", "causal rows built on the CPU",
     [("rows = torch.arange(T, device=x.device)", "rows = torch.arange(T)")], "torch op `gt`"),
    ("01", "append_kv returns CPU copies",
     [("        return k_new, v_new\n", "        return k_new.cpu(), v_new.cpu()\n")],
     "append_kv(None, k_new, v_new) returned a tensor on the CPU"),
    ("02", "position_ids ignores device=",
     [("return torch.arange(past_len, past_len + new_len, device=device)",
       "return torch.arange(past_len, past_len + new_len)")],
     "position_ids(3, 2, device=<the test device>) returned a tensor on the CPU"),
    ("02", "causal_mask columns on the CPU",
     [("cols = torch.arange(past_len + new_len, device=device)[None, :]",
       "cols = torch.arange(past_len + new_len)[None, :]")], "line 46"),
    ("02", "the mixing error swallowed",
     [("    return cols <= rows  # (T, S)",
       "    try:\n        return cols <= rows\n"
       "    except RuntimeError:\n        return (cols <= rows.cpu()).to(device)"),
      ("cols = torch.arange(past_len + new_len, device=device)[None, :]",
       "cols = torch.arange(past_len + new_len)[None, :]")],
     "causal_mask(3, 2, device=<the test device>): your code mixed"),
    ("03", "mask columns on the CPU",
     [("cols = torch.arange(past + T, device=x.device)[None, :]", "cols = torch.arange(past + T)[None, :]")],
     "GQAttention.forward(x), a prefill"),
    ("03", "a CPU tensor kept as a plain attribute, which .to() does not move",
     [("self.n_rep, self.rope_base = n_q_heads // n_kv_heads, rope_base",
       "self.n_rep, self.rope_base = n_q_heads // n_kv_heads, rope_base\n"
       "        self.scale = torch.tensor([head_dim ** -0.5])"),
      ("scores = q @ K.transpose(-2, -1) / math.sqrt(self.head_dim)", "scores = q @ K.transpose(-2, -1) * self.scale")],
     "torch op `mul`"),
    ("05", "buffers allocated on the CPU",
     [("self.keys = [torch.zeros(shape, dtype=dtype, device=device)", "self.keys = [torch.zeros(shape, dtype=dtype)")],
     "holds a tensor on the CPU"),
    ("05", "mask rows on the CPU",
     [("rows = torch.arange(new_len, device=device)[:, None]", "rows = torch.arange(new_len)[:, None]")],
     "attention_mask(3)"),
    ("06", "the block table indexed from the CPU",
     [("table = torch.tensor(self._tables[seq_id], dtype=torch.long, device=self.k_pages[layer].device)",
       "table = torch.tensor(self._tables[seq_id], dtype=torch.long)")], "torch op `index_select`"),
    ("07", "attention columns on the CPU",
     [("cols = torch.arange(n, device=x.device)[None, :]", "cols = torch.arange(n)[None, :]")],
     "SinkAttention.forward(x, cache)"),
    ("07", "eviction indices on the CPU",
     [("K = torch.cat([K[:, :, :self.n_sink], K[:, :, -self.window:]], dim=2)",
       "K = K.index_select(2, torch.tensor(kept_positions(K.shape[2], self.n_sink, self.window)))")],
     "torch op `index_select`"),
    ("08", "token ids left on the CPU",
     [("ids, lengths = ids.to(device), lengths.to(device)", "lengths = lengths.to(device)")], "torch op `embedding`"),
    ("08", "the cache allocated on the CPU", [("model.dtype, device)", "model.dtype, None)")], "mixed a CPU tensor"),
    ("09", "pack's shifts on the CPU", [("    shifts = torch.arange(per, dtype=torch.int32, device=codes.device) * n_bits",
                                         "    shifts = torch.arange(per, dtype=torch.int32) * n_bits")], "mixed a CPU tensor"),
    ("11", "beam totals on the CPU", [("dtype=logp.dtype, device=logp.device)", "dtype=logp.dtype)")],
     "mixed a CPU tensor"),
    ("12", "positions on the CPU", [("positions = torch.arange(start, start + len(tokens), device=model.device)[None]",
                                     "positions = torch.arange(start, start + len(tokens))[None]")], "mixed a CPU tensor"),
    ("13", "positions left on the CPU", [("position_ids=positions.to(device)", "position_ids=positions")],
     "mixed a CPU tensor"),
    ("14", "swap_in writing host blocks into the device pages without moving them",
     [("cache.k_pages[layer][dst] = pool.k_blocks[layer][src].to(device)  # (n, Hkv, P, D)",
       "cache.k_pages[layer][dst] = pool.k_blocks[layer][src]  # (n, Hkv, P, D)")], "mixed a CPU tensor"),
    ("14", "the fetched layer left on the host",
     [("            return K.to(self.device), V.to(self.device)", "            return K, V")], "torch op `cat`"),
    ("08", "slot indices on the CPU",
     [("slots = torch.arange(S, device=device)", "slots = torch.arange(S)")], "mixed a CPU tensor"),
]

# Variants a GPU runs happily: CPU scalars, Python-side data, host syncs, CPU bookkeeping, CPU indices.
RIGHT = [
    ("01", "a 0-d CPU tensor as a scalar",
     [("/ math.sqrt(self.head_dim)  # (B, H, T, S)", "/ torch.tensor(math.sqrt(self.head_dim))  # (B, H, T, S)")]),
    ("01", "rows from a Python list on the inputs' device",
     [("rows = torch.arange(T, device=x.device)[:, None] + past",
       "rows = torch.tensor([[past + i] for i in range(T)], device=x.device)")]),
    ("02", "positions from a Python list with device=",
     [("return torch.arange(past_len, past_len + new_len, device=device)",
       "return torch.tensor(list(range(past_len, past_len + new_len)), dtype=torch.long, device=device)")]),
    ("02", "CPU positions handed to apply_rope, which moves them",
     [("pos = position_ids(past, T, device=x.device)", "pos = position_ids(past, T)")]),
    ("03", "CPU indices into a device tensor",
     [("return x[:, :, None].expand(B, H, n_rep, S, D).reshape(B, H * n_rep, S, D)",
       "return x[:, torch.arange(H).repeat_interleave(n_rep)]")]),
    ("03", "a CPU tensor registered as a buffer, which .to() moves",
     [("self.n_rep, self.rope_base = n_q_heads // n_kv_heads, rope_base",
       "self.n_rep, self.rope_base = n_q_heads // n_kv_heads, rope_base\n"
       "        self.register_buffer('scale', torch.tensor([head_dim ** -0.5]), persistent=False)"),
      ("scores = q @ K.transpose(-2, -1) / math.sqrt(self.head_dim)",
       "scores = q @ K.transpose(-2, -1) * self.scale")]),
    ("05", "CPU bookkeeping that never meets the buffers",
     [("start = self._pos[layer]\n", "start = int(torch.tensor(self._pos)[layer])\n")]),
    ("05", ".item() on a device tensor",
     [("filled = self.seq_len(layer)",
       "filled = int(torch.tensor(self.seq_len(layer), device=self.keys[layer].device).item())")]),
    ("06", "slots from tensor arithmetic on the CPU, moved to the pages' device",
     [("        slots = [table[p // P] * P + p % P for p in range(length, length + n_tokens)]  # the README's slot formula\n"
       "        return torch.tensor(slots, dtype=torch.long)  # (T,) on the CPU: indices from there index the pages too\n",
       "        positions = torch.arange(length, length + n_tokens)  # (T,)\n"
       "        blocks = torch.tensor(table, dtype=torch.long)[positions // P]  # (T,)\n"
       "        return (blocks * P + positions % P).to(self.k_pages[0].device)\n")]),
    ("06", "slots made on the pages' device",
     [("return torch.tensor(slots, dtype=torch.long)", "return torch.tensor(slots, dtype=torch.long, device=self.k_pages[0].device)")]),
    ("06", "a decode step's one slot read by .item() and written as a slice",
     [("        blocks, offsets = slots // self.block_size, slots % self.block_size  # (T,), (T,)\n",
       "        if T == 1:\n"
       "            block, offset = divmod(slots.item(), self.block_size)\n"
       "            self.k_pages[layer][block, :, offset:offset + 1] = k\n"
       "            self.v_pages[layer][block, :, offset:offset + 1] = v\n"
       "            return\n"
       "        blocks, offsets = slots // self.block_size, slots % self.block_size  # (T,), (T,)\n")]),
    ("06", ".tolist() of the device slots",
     [("if T and not (0 <= int(slots.min()) and int(slots.max()) < total):",
       "if T and not (0 <= min(slots.tolist()) and max(slots.tolist()) < total):")]),
    ("07", "cache slots as a Python list for apply_rope",
     [("slots = torch.arange(K.shape[2], device=K.device)", "slots = list(range(K.shape[2]))")]),
    ("08", ".item() and int() on device tensors",
     [("if done.all():", "if done.all().item():"),
      ("zip(out.tolist(), produced.tolist())", "zip(out.tolist(), [int(n) for n in produced])")]),
    ("08", "a CPU tally fed by explicit copies",
     [("produced = torch.zeros(B, dtype=torch.long, device=device)", "produced = torch.zeros(B, dtype=torch.long)"),
      ("produced += ~done", "produced += (~done).cpu()")]),
    ("14", "swap_in's block ids made on the CPU, which may index the pages",
     [("dst = torch.tensor(cache.block_table(seq_id), dtype=torch.long, device=device)  # (n,)",
       "dst = torch.tensor(cache.block_table(seq_id), dtype=torch.long)  # (n,)")]),
]


def _variant(kata_id: str, edits) -> targets.Target:
    source = (manifest.REPO_ROOT / manifest.get(kata_id).solution).read_text(encoding="utf-8")
    for old, new in edits:
        assert source.count(old) == 1, f"{old!r} occurs {source.count(old)} times in the kata {kata_id} reference"
        source = source.replace(old, new)
    return targets.from_source(source, f"<device variant {kata_id}>", "a device variant")


def _check(kata_id: str, target: targets.Target):
    check = next(c for c in checks.for_kata(kata_id).all if c.id == "keeps_the_device")
    return run_check(check, Ctx(target, targets.reference(manifest.get(kata_id)), torch.device("cpu")))


def _on_stand_in(kata_id: str, target: targets.Target) -> devices.StandIn:
    """Run the kata's device scenario on the stand-in proper (no rerun on the CPU); return the mode."""
    scenario = importlib.import_module(f"grader.checks.k{kata_id}")._device_scenario
    with devices.StandIn() as stand_in:
        scenario(devices.Session(Ctx(target, target, torch.device("cpu")), stand_in))
    return stand_in


@pytest.mark.parametrize("kata_id", KATAS)
def test_reference_keeps_the_device_on_the_stand_in_itself(kata_id):
    """The reference passes on the stand-in proper, not through the rerun-on-CPU fallback."""
    reference = targets.reference(manifest.get(kata_id))
    assert not _on_stand_in(kata_id, reference).mixes
    assert _check(kata_id, reference).passed


@pytest.mark.parametrize("kata_id,what,edits,says", WRONG, ids=[f"{k}-{w}" for k, w, _, _ in WRONG])
def test_device_ignoring_variant_fails(kata_id, what, edits, says):
    result = _check(kata_id, _variant(kata_id, edits))
    assert result.status == "fail", (result.status, result.message)
    assert says in result.message, result.message
    assert "not your fault" not in result.message


@pytest.mark.parametrize("kata_id,what,edits", RIGHT, ids=[f"{k}-{w}" for k, w, _ in RIGHT])
def test_correct_unusual_variant_passes(kata_id, what, edits):
    target = _variant(kata_id, edits)
    assert not _on_stand_in(kata_id, target).mixes
    result = _check(kata_id, target)
    assert result.passed, result.message


def test_what_the_stand_in_cannot_run_is_not_blamed():
    edits = [("    B, H, S, D = x.shape\n", "    B, H, S, D = x.shape\n    torch.Generator(device=x.device)\n")]
    target = _variant("03", edits)  # fine on a GPU; the stand-in ("meta") has no generator
    with pytest.raises(RuntimeError):
        _on_stand_in("03", target)
    assert _check("03", target).passed


def test_a_crash_on_the_cpu_too_is_reported_as_the_learners_crash():
    edits = [("    B, H, S, D = x.shape\n", "    B, H, S, D = x.shape\n    raise KeyError('boom')\n")]
    result = _check("03", _variant("03", edits))
    assert result.status == "fail" and "KeyError" in result.message, result.message


def test_observed_identifies_the_behaviour():
    edits = WRONG[2][2]  # position_ids ignores device=
    check = next(c for c in checks.for_kata("02").all if c.id == "keeps_the_device")
    ctx = Ctx(_variant("02", edits), targets.reference(manifest.get("02")), torch.device("cpu"))
    with pytest.raises(Exception) as caught:
        check.func(ctx)
    assert caught.value.observed == ("device", "on cpu", "position_ids(3, 2, device=<the test device>)", "")


# -- the stand-in device itself ------------------------------------------------------------------
def test_stand_in_runs_what_a_gpu_runs():
    x, probs = devices.put(torch.randn(2, 4, 3, 8)), devices.put(torch.softmax(torch.randn(3, 5), -1))
    with devices.StandIn() as stand_in:
        layer = torch.nn.Linear(8, 8).to(x.device)
        out = F.scaled_dot_product_attention(layer(x), x, x, is_causal=True)
        mask = torch.ones(3, 3, dtype=torch.bool, device=x.device).tril()
        out = F.scaled_dot_product_attention(out, x, x, attn_mask=mask)
        drawn = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(0))
        ids = torch.tensor([1, 0], device=x.device)
        picked = x[ids] + x[torch.tensor([1, 0])] * torch.tensor(2.0)  # CPU indices and a CPU scalar are fine
        buffer = torch.zeros(2, 4, 3, 8, device=x.device)
        buffer[:, :, :1] = torch.ones(2, 4, 1, 8)  # a copy may cross devices
        host = x.sum().item(), x[0, 0, 0].tolist(), bool(x.sum() > -1e9), int(ids[0])
    assert not stand_in.mixes
    for t in (out, drawn, picked, buffer, layer.weight):
        assert t.device == devices.STAND_IN and type(devices.take(t)) is torch.Tensor
    assert host[3] == 1 and len(host[1]) == 8


def test_stand_in_under_inference_mode_sees_moves_and_mixes():
    """inference_mode hands composite ops (``to``, ``type_as``, ``linear``) to the mode whole."""
    x, cpu = devices.put(torch.randn(2, 3)), torch.ones(2, 3)
    with devices.StandIn() as stand_in, torch.inference_mode():
        moved = [cpu.to(x.device), cpu.type_as(x), cpu.to(x), torch.nn.Linear(3, 3).to(x.device)(x)]
        back = x.to("cpu")
        with pytest.raises(RuntimeError):
            F.scaled_dot_product_attention(x[None], cpu[None], cpu[None])
    assert all(t.device == devices.STAND_IN for t in moved) and back.device.type == "cpu"
    assert not stand_in.mixes  # torch's own device check refused the attention, before any op ran


@pytest.mark.parametrize("op", ["add", "cat", "masked_fill", "index_select", "matmul"])
def test_stand_in_refuses_what_a_gpu_refuses(op):
    x, cpu = devices.put(torch.randn(3, 3)), torch.randn(3, 3)
    ops = {"add": lambda: x + cpu, "cat": lambda: torch.cat([x, cpu]), "matmul": lambda: x @ cpu,
           "masked_fill": lambda: x.masked_fill(cpu > 0, 0.0),
           "index_select": lambda: x.index_select(0, torch.arange(2))}
    with devices.StandIn() as stand_in, pytest.raises(devices.DeviceMix):
        ops[op]()
    assert len(stand_in.mixes) == 1


def test_tensors_built_from_python_data_land_on_the_device_asked():
    x = devices.put(torch.ones(3))
    with devices.StandIn():
        on_device = [torch.tensor([1, 2], device=x.device), torch.as_tensor([1, 2], device=x.device),
                     torch.asarray([1.0], device=x.device), x.new_tensor([1, 2]), x.new_zeros(2)]
        on_cpu = [torch.tensor([1, 2]), torch.ones(2).new_tensor([3]), torch.as_tensor([1.0])]
    assert all(t.device == devices.STAND_IN for t in on_device) and on_device[3].dtype == torch.float32
    assert all(t.device.type == "cpu" for t in on_cpu)
    assert [devices.take(t).tolist() for t in on_device[:2]] == [[1, 2], [1, 2]]
