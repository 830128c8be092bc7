"""Known mistakes of kata 17 — each the reference with one bug."""
from grader.mistakes import Mistake

_PROJECT = "        held = None if cache is None else cache.cross(layer)\n"
_MASK = "        mask = None if encoder_mask is None else encoder_mask[:, None, None, :]  # (B, 1, 1, S_enc): every query\n"
_DECODE = "        logits = model.decode(ids, positions, encoder_out, mask, cache)  # (B, 1, V)\n"

MISTAKES = [
    Mistake(
        name="cross K/V recomputed at every step",
        why="the tokens are right, but wk and wv run over the whole encoder output at every decoder call: "
            "2·S_enc·d² multiply-adds per layer per token that the cache exists to save.",
        hint="When cache.cross(layer) already holds this request's K and V, what is left to project?",
        edits=((_PROJECT, _PROJECT + "        if held is not None:  # projected again anyway\n"
                "            held = (self._heads(self.wk(encoder_out), self.n_kv), "
                "self._heads(self.wv(encoder_out), self.n_kv))\n"),),
    ),
    Mistake(
        name="set_cross appends to a filled layer",
        why="a second set_cross of one request is taken as more frames: the cross part doubles. Attention outputs do "
            "not change (each key is there twice, so the softmax weights are the same), but cross_len and nbytes do.",
        hint="How many times per request is a layer's cross part set? What should a second attempt do?",
        edits=(("            raise ValueError(f\"layer: the cross part of layer {layer} is already set; it is set once "
                "per request \"\n                             \"(reset() starts the next one)\")\n",
                "            K, V = self._cross[layer]\n"
                "            self._cross[layer] = (torch.cat([K, k], dim=2), torch.cat([V, v], dim=2))\n"
                "            return self._cross[layer]\n"),),
    ),
    Mistake(
        name="causal mask in cross-attention",
        why="decoder token t only sees encoder frames 0 … t, as if the source were generated with it: early tokens "
            "never read the end of the source.",
        hint="Is there an order between a decoder token and the encoder frames? Which frames may every query see?",
        edits=((_MASK, "        mask = torch.ones(T, k.shape[2], dtype=torch.bool, device=x.device).tril()  # causal\n"
                "        if encoder_mask is not None:\n"
                "            mask = mask & encoder_mask[:, None, None, :]\n"),),
    ),
    Mistake(
        name="RoPE on cross-attention queries and keys",
        why="queries and keys are rotated by decoder and encoder indices, so the scores depend on an offset between "
            "two sequences that has no meaning (and that the model never learned).",
        hint="RoPE encodes the distance between two tokens of one sequence. Is a decoder token at any distance from "
             "an encoder frame?",
        edits=(("import torch.nn.functional as F\n", "import torch.nn.functional as F\nfrom grader.nn import apply_rope\n"),
               ("        q = self._heads(self.wq(x), self.n_heads)  # (B, Hq, T, D)\n",
                "        q = apply_rope(self._heads(self.wq(x), self.n_heads), torch.arange(T, device=x.device))\n"),
               ("            k = self._heads(self.wk(encoder_out), self.n_kv)  # (B, Hkv, S_enc, D)\n",
                "            k = apply_rope(self._heads(self.wk(encoder_out), self.n_kv),\n"
                "                           torch.arange(encoder_out.shape[1], device=x.device))\n")),
    ),
    Mistake(
        name="cross K/V projected from the decoder states",
        why="wk and wv are applied to x instead of the encoder output: that is a second self-attention, and the "
            "source is never read.",
        hint="In cross-attention, which input gives the queries and which gives the keys and values?",
        edits=(("            k = self._heads(self.wk(encoder_out), self.n_kv)  # (B, Hkv, S_enc, D)\n"
                "            v = self._heads(self.wv(encoder_out), self.n_kv)  # (B, Hkv, S_enc, D)\n",
                "            k = self._heads(self.wk(x), self.n_kv)  # (B, Hkv, T, D)\n"
                "            v = self._heads(self.wv(x), self.n_kv)  # (B, Hkv, T, D)\n"),),
    ),
    Mistake(
        name="padded encoder frames not hidden",
        why="encoder_mask is never applied, so a short source's queries also read the pad frames after it, and a "
            "batched row no longer equals its source decoded alone.",
        hint="The sources were padded to one length. Which score columns belong to frames that are not in the source?",
        edits=((_MASK, "        mask = None  # every frame visible\n"),),
    ),
    Mistake(
        name="crop cuts the cross part too",
        why="a rollback of the decoder also shortens the encoder frames: the decoder then reads a truncated source "
            "(the class of corruption fixed in Whisper's speculative decoding).",
        hint="crop undoes decoder tokens. Did the source change?",
        edits=(("        for layer, (K, V) in self._self.items():\n"
                "            self._self[layer] = (K[:, :, :n], V[:, :, :n])  # (B, Hkv, n, D)\n",
                "        for part in (self._self, self._cross):\n"
                "            for layer, (K, V) in part.items():\n"
                "                part[layer] = (K[:, :, :n], V[:, :, :n])\n"),),
    ),
    Mistake(
        name="reorder moves only the self part",
        why="after a reorder each row keeps its old source's cross K/V next to another row's history: safe only when "
            "every row has the same source.",
        hint="Row i now continues old row index[i]. Which source does it belong to?",
        edits=(("        for part in (self._self, self._cross):\n            for layer, (K, V) in part.items():\n"
                "                at",
                "        for part in (self._self,):\n            for layer, (K, V) in part.items():\n"
                "                at"),),
    ),
    Mistake(
        name="reset keeps the cross part",
        why="the next request's first call finds the previous request's cross K/V and reads them: it attends to the "
            "old source.",
        hint="After reset(), what should cross(layer) return, and what must the next first call do?",
        edits=(("        self._self.clear()\n        self._cross.clear()\n", "        self._self.clear()\n"),),
    ),
    Mistake(
        name="one cross K/V shared by every layer",
        why="the first layer's cross K/V are handed to every layer, so the later layers attend to keys and values "
            "their own wk and wv never projected.",
        hint="Each layer projects the encoder output with its own wk and wv. Where does layer 1's pair live?",
        edits=(("        return self._cross.get(_layer(layer))\n",
                "        return next(iter(self._cross.values())) if self._cross and _layer(layer) >= 0 else None\n"),),
    ),
    Mistake(
        name="encoder run at every step",
        why="the encoder runs again before every decoder step; its output is the same each time, so the tokens are "
            "right and all that work is wasted.",
        hint="Does the encoder's input change while the decoder generates?",
        edits=((_DECODE, "        logits = model.decode(ids, positions, model.encode(src, mask), mask, cache)\n"),),
    ),
    Mistake(
        name="decoder positions continue after the source",
        why="the decoder's tokens are placed after the encoder frames, as if one sequence: the self-attention scores "
            "do not change (RoPE sees distances), but the positions are wrong for any model that reads them.",
        hint="Encoder and decoder are two sequences. Where does the decoder's first token sit?",
        edits=(("positions = torch.full((B, 1), step, dtype=torch.long, device=device)",
                "positions = torch.full((B, 1), width + step, dtype=torch.long, device=device)"),),
    ),
    Mistake(
        name="decoding goes on after every row is done",
        why="the loop runs to max_new_tokens even when every row has its EOS: the tokens are right, the extra "
            "decoder calls are wasted.",
        hint="When every row is done, is there anything left to compute?",
        edits=(("        if bool(done.all()):\n            break\n", ""),),
    ),
    Mistake(
        name="EOS id 0 never stops a row",
        why="the EOS test is `if eos_token_id:`, so an EOS of id 0 counts as no EOS at all and rows run past it.",
        hint="Which token ids are false in Python? Test `is not None`.",
        edits=(("        if eos_token_id is not None:\n", "        if eos_token_id:\n"),),
    ),
    Mistake(
        name="reset keeps the rows",
        why="reset() empties every part to zero tokens but keeps each layer's tensors of the old batch, as crop(0) "
            "would; the next request, in another batch, is refused as if the old one were still there.",
        hint="After reset(), what does the cache still know about the request before? Should it know anything?",
        edits=(("        self._self.clear()\n        self._cross.clear()\n",
                "        self._self = {layer: (K[:, :, :0], V[:, :, :0]) for layer, (K, V) in self._self.items()}\n"
                "        self._cross.clear()\n"),),
    ),
    Mistake(
        name="the batch read from the self part only",
        why="a cache that holds only cross parts has a batch too (the encoder's rows); a k of another batch is "
            "then taken by update, and the two parts disagree on how many rows there are.",
        hint="The README refuses a k whose batch differs from the batch the cache holds, in either part. Which "
             "parts does your check look at?",
        edits=(("        batch = self._batch()\n        if batch is not None and k.shape[0] != batch:",
                "        batch = next((K.shape[0] for K, _ in self._self.values()), None)\n"
                "        if batch is not None and k.shape[0] != batch:"),),
    ),
]
