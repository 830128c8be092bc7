"""A snapshot of kvpress's SnapKV on fixed inputs, for kata 21's reference to be checked against.

kvpress 0.5.5 needs transformers < 5.3, which the project's own environment does not have, so its
outputs are recorded once, in an environment of their own, and committed (``k21_kvpress.json``):

    python -m venv --system-site-packages /tmp/kvpress-env
    /tmp/kvpress-env/bin/pip install kvpress==0.5.5 "transformers==5.2.0"
    /tmp/kvpress-env/bin/python tests/snapshots/k21_kvpress.py          # rewrites k21_kvpress.json

Each case is a tiny random Llama attention layer of transformers: the rotated keys of a prompt, the
rotated queries of its last W tokens (as kvpress computes them), SnapKVPress.score() over the prefix,
and the tokens SnapKVPress.compress() keeps, read back from the keys it returns.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

HERE = Path(__file__).parent
SNAPSHOT = HERE / "k21_kvpress.json"
INSTALL = 'pip install kvpress==0.5.5 "transformers==5.2.0"  (in an environment of its own: transformers < 5.3)'
# (batch, query heads, KV heads, head_dim, prompt length, window, kernel_size, compression_ratio, seed)
CASES = [(1, 4, 2, 16, 40, 8, 5, 0.5, 0), (2, 6, 2, 8, 33, 4, 3, 0.7, 1), (1, 2, 2, 16, 24, 6, 7, 0.25, 2)]


def _case(batch, n_q, n_kv, head_dim, S, W, kernel, ratio, seed) -> dict:
    from kvpress import SnapKVPress
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
    from kvpress.utils import get_prerope_query_states

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=32, hidden_size=n_q * head_dim, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=n_q, num_key_value_heads=n_kv, head_dim=head_dim)
    model = LlamaForCausalLM(config).eval()
    attn = model.model.layers[0].self_attn
    hidden = torch.randn(batch, S, config.hidden_size)
    cos, sin = model.model.rotary_emb(hidden, torch.arange(S)[None].expand(batch, S))
    k = attn.k_proj(hidden).view(batch, S, n_kv, head_dim).transpose(1, 2)
    v = attn.v_proj(hidden).view(batch, S, n_kv, head_dim).transpose(1, 2)
    q = get_prerope_query_states(attn, hidden)
    q, keys = apply_rotary_pos_emb(q, k, cos, sin)
    press = SnapKVPress(compression_ratio=ratio, window_size=W, kernel_size=kernel)
    kwargs = {"position_embeddings": (cos, sin)}
    scores = press.score(attn, hidden, keys, v, None, kwargs)
    kept_keys, _ = press.compress(attn, hidden, keys, v, None, kwargs)
    same = (kept_keys[:, :, :, None, :] == keys[:, :, None, :, :]).all(-1)  # (B, Hkv, m, S)
    kept = same.float().argmax(-1).sort(-1).values  # each kept key's index in the prompt
    return {"q_window": q[:, :, -W:].tolist(), "keys": keys.tolist(), "window": W, "kernel_size": kernel,
            "n_kept": kept_keys.shape[2], "scores": scores[..., :S - W].tolist(), "kept": kept.tolist()}


def make() -> dict:
    import kvpress
    import transformers

    with torch.no_grad():
        cases = [_case(*c) for c in CASES]
    return {"kvpress": kvpress.__version__ if hasattr(kvpress, "__version__") else "0.5.5",
            "transformers": transformers.__version__, "torch": torch.__version__, "cases": cases}


def load() -> dict:
    return json.loads(SNAPSHOT.read_text())


if __name__ == "__main__":
    SNAPSHOT.write_text(json.dumps(make()) + "\n")
    print(f"wrote {SNAPSHOT}")
