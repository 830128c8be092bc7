"""Known mistakes of kata 16 — each the reference with one bug."""
from grader.mistakes import Mistake

MISTAKES = [
    Mistake(
        name="non-contiguous message",
        why="K and V are sent as the model stores them, transposed views of its projections; gloo refuses a "
            "non-contiguous tensor (input tensor has to be contiguous), and the layout on the wire is whatever the "
            "strides happened to be.",
        hint="What does gloo read when it sends a tensor: the elements in index order, or the bytes of its storage? "
             "Make each message contiguous in the layout the README names.",
        edits=(('out.append(x.to("cpu").contiguous())', 'out.append(x.to("cpu"))'),),
    ),
    Mistake(
        name="token-major layout on the wire",
        why="the messages are laid out (1, P, Hkv, D) while the receiver reads (1, Hkv, P, D) from the same bytes: "
            "heads and tokens are scrambled and nothing raises (the layout mismatch of TensorRT-LLM #6507).",
        hint="Both sides must agree on one layout. Which order does the README fix for the dimensions of K and V?",
        edits=(('out.append(x.to("cpu").contiguous())', 'out.append(x.to("cpu").transpose(1, 2).contiguous())'),),
    ),
    Mistake(
        name="V sent before K",
        why="each layer's V goes first; K and V have the same shape, so the receiver takes the values for keys and "
            "the keys for values without any error.",
        hint="In which order does the README put the two tensors of a layer, and does your loop follow it?",
        edits=(("        for x in pair:\n", "        for x in pair[::-1]:\n"),),
    ),
    Mistake(
        name="float16 buffer for a bfloat16 cache",
        why="the receive buffer is float16 when the header says bfloat16: both have 2 bytes per element, so gloo "
            "fills it without complaint, but the same bytes mean other numbers and the decode attends to garbage.",
        hint="gloo moves bytes, not values. Which dtype does the header announce, and is that the dtype of your buffer?",
        edits=(('buffer = torch.empty(1, h["n_kv_heads"], h["seq_len"], h["head_dim"], dtype=h["dtype"])',
                'buffer = torch.empty(1, h["n_kv_heads"], h["seq_len"], h["head_dim"], '
                'dtype=torch.float16 if h["dtype"] == torch.bfloat16 else h["dtype"])'),
               ("            kv.append(buffer.to(model.device))", "            kv.append(buffer.to(model.device, model.dtype))")),
    ),
    Mistake(
        name="first token fed one position late",
        why="the first new token is fed at position P + 1 instead of P, as if it were the second: RoPE rotates every "
            "later query and key one step too far, and the tokens drift from single-process generation.",
        hint="The prompt holds positions 0 … P - 1. Which position does the first new token have?",
        edits=(("position = P + len(out) - 1", "position = P + len(out)"),),
    ),
    Mistake(
        name="first token left out of the output",
        why="the token the prefill worker sent is fed but not returned, so the output starts one token late and "
            "holds one token fewer than single-process generation.",
        hint="Single-process generation returns the prefill's own greedy token first. Does your list start with it?",
        edits=(("        out.append(int(logits[0, -1].argmax()))\n    return out\n",
                "        out.append(int(logits[0, -1].argmax()))\n    return out[1:]\n"),),
    ),
    Mistake(
        name="padded buffer sent",
        why="each layer is sent padded to a longer buffer and the header announces the padded length: the bytes "
            "exceed kata 04's formula and the decode worker attends to keys that no token wrote.",
        hint="How many tokens does the prompt have, and how many does each message carry? Send only those.",
        edits=(("head_dim=cfg.head_dim, dtype=model.dtype)\n    if layerwise",
                "head_dim=cfg.head_dim, dtype=model.dtype)\n    header[3] += 8\n    if layerwise"),
               ("messages = kv_messages([cache.layers[i] for i in range(cfg.num_hidden_layers)])",
                "messages = kv_messages([tuple(torch.nn.functional.pad(x, (0, 0, 0, 8)) for x in cache.layers[i]) "
                "for i in range(cfg.num_hidden_layers)])")),
    ),
    Mistake(
        name="repeated KV heads sent",
        why="K and V are expanded to one head per query head before they are sent (as attention uses them): the "
            "bytes grow by n_q / n_kv, and the decode model, whose cache holds KV heads, refuses the header.",
        hint="How many heads does the cache of a grouped-query model hold (kata 03)? Send what the cache holds.",
        edits=(("n_kv_heads=cfg.num_key_value_heads,\n                           head_dim",
                "n_kv_heads=cfg.num_attention_heads,\n                           head_dim"),
               ("messages = kv_messages([cache.layers[i] for i in range(cfg.num_hidden_layers)])",
                "messages = kv_messages([tuple(x.repeat_interleave(cfg.num_attention_heads // cfg.num_key_value_heads, 1) "
                "for x in cache.layers[i]) for i in range(cfg.num_hidden_layers)])")),
    ),
    Mistake(
        name="one staging buffer for every layer-wise send",
        why="every layer is copied into the same staging tensor and isent from it; a later layer overwrites it while "
            "an earlier send is still in flight, so what arrives depends on timing (TensorRT-LLM #15546, sglang #31239).",
        hint="An isend may read its tensor at any moment until wait(). Which tensor does each of your sends own?",
        edits=(("            self.pending.append((dist.isend(message, self.dst, group=self.group), message))",
                "            self.staging = getattr(self, 'staging', None)\n"
                "            if self.staging is None or self.staging.shape != message.shape:\n"
                "                self.staging = torch.empty_like(message)\n"
                "            self.staging.copy_(message)\n"
                "            self.pending.append((dist.isend(self.staging, self.dst, group=self.group), message))"),),
    ),
    Mistake(
        name="wait right after each isend",
        why="each layer-wise send is waited inside the update that started it: the tokens are right, but the "
            "forward stops at every layer until its bytes are gone, so nothing overlaps and layer-wise costs what "
            "whole-cache costs.",
        hint="Where is the one wait() the README asks for, and what runs while a layer's send is in flight?",
        edits=(("            self.pending.append((dist.isend(message, self.dst, group=self.group), message))",
                "            dist.isend(message, self.dst, group=self.group).wait()"),),
    ),
    Mistake(
        name="dtype of the header not checked",
        why="a cache announced in another dtype than the decode model's is accepted; its tensors then meet the "
            "model's in attention, where they either fail deep inside the model or compute in the wrong precision.",
        hint="Which fields of the header must match the decode model before you receive anything else?",
        edits=(('    if h["dtype"] != model.dtype:\n        raise', '    if False:\n        raise'),),
    ),
    Mistake(
        name="greedy pick in float32",
        why="the logits are cast to float32 before argmax; two float64 logits closer than float32's resolution "
            "become one value and the tie goes to the lower id, while the README picks in the model's dtype.",
        hint="What is 1 + 1e-8 in float32? Take the argmax of the logits as the model gave them.",
        edits=(("    first = int(logits[0, -1].argmax())\n", "    first = int(logits[0, -1].float().argmax())\n"),
               ("        out.append(int(logits[0, -1].argmax()))\n",
                "        out.append(int(logits[0, -1].float().argmax()))\n")),
    ),
    Mistake(
        name="EOS id 0 taken for no EOS",
        why="the EOS is tested by truth (`if eos_token_id`), so an EOS whose id is 0 never stops the decode; the "
            "README stops after an EOS of any id, 0 included.",
        hint="What is bool(0)? Test the EOS against None, not by its truth.",
        edits=(("while len(out) < max_new_tokens and out[-1] != eos_token_id:",
                "while len(out) < max_new_tokens and (not eos_token_id or out[-1] != eos_token_id):"),),
    ),
    Mistake(
        name="head width as hidden_size // heads",
        why="the head width is taken as hidden_size // num_attention_heads instead of the config's head_dim; "
            "models whose head_dim is set apart (Gemma, Qwen3) announce and expect the wrong size.",
        hint="Does every model have head_dim == hidden_size // num_attention_heads? Which field does the README "
             "name?",
        edits=(("head_dim=cfg.head_dim, dtype=model.dtype)",
                "head_dim=cfg.hidden_size // cfg.num_attention_heads, dtype=model.dtype)"),
               ('"head_dim": cfg.head_dim}', '"head_dim": cfg.hidden_size // cfg.num_attention_heads}')),
    ),
    Mistake(
        name="header read from its storage",
        why="decode_header reads the header's storage from its start instead of its values, so a header that is "
            "a slice of a longer buffer or a strided view reads other numbers.",
        hint="Where does a view's first element live in its storage? Read the tensor's values (tolist()).",
        edits=(("    values = header.tolist()\n",
                "    values = torch.frombuffer(bytearray(header.untyped_storage()), dtype=torch.int64)[:8].tolist()\n"),),
    ),
]
