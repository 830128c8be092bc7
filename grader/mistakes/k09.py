"""Known mistakes of kata 09 — each the reference with one bug."""
from grader.mistakes import Mistake

MISTAKES = [
    Mistake(
        name="keys quantized per token",
        why="with statistics over the channels, one outlier channel sets the step of every key vector, so the "
            "normal channels of the keys are rounded to a handful of values.",
        hint="Keys get one scale per (B, Hkv, D): which axis do you take min and max over for them?",
        edits=(("quantize(k, self.n_bits, dim=2)", "quantize(k, self.n_bits, dim=3)"),),
    ),
    Mistake(
        name="values quantized per channel",
        why="values are quantized per token (one scale per token over its D channels); statistics over the "
            "group's tokens give other scales and zeros than the README's.",
        hint="Values get one scale per (B, Hkv, token): which axis do you take min and max over for them?",
        edits=(("quantize(v, self.n_bits, dim=3)", "quantize(v, self.n_bits, dim=2)"),),
    ),
    Mistake(
        name="scale without the - 1",
        why="n bits give 2**n codes, 0 … 2**n - 1, so there are 2**n - 1 steps between min and max; dividing "
            "by 2**n makes the steps too small and the largest values cannot be reached.",
        hint="With 2 bits and values 0 … 3, what should scale be so that 3 gets the top code?",
        edits=(("scale = (x.amax(dim=dim, keepdim=True) - zero) / qmax",
                "scale = (x.amax(dim=dim, keepdim=True) - zero) / (qmax + 1)"),),
    ),
    Mistake(
        name="zero not subtracted",
        why="codes must count steps from the minimum, round((x - zero) / scale); without the shift, values "
            "below zero clamp to code 0 and large ones to the top code.",
        hint="Which value should get code 0, and what do you subtract so that it does?",
        edits=(("torch.round((x.to(work) - zero.to(work)) / safe)", "torch.round(x.to(work) / safe)"),),
    ),
    Mistake(
        name="codes not clamped",
        why="a scale rounded down in a narrow dtype (here a float16 subnormal) makes (max - min) / scale larger "
            "than 2**n_bits - 1, and the top codes overflow their bits.",
        hint="Is round((x - zero) / scale) always at most 2**n_bits - 1 once scale itself has been rounded?",
        edits=(("/ safe).clamp(0, qmax)", "/ safe)"),),
    ),
    Mistake(
        name="float64 codes computed in float32",
        why="float32 keeps about 7 digits: a float64 value a hair below a half step becomes an exact half "
            "and rounds to the wrong code, more than half a step from its input.",
        hint="Which dtype do you divide (x - zero) / scale in when x is float64?",
        edits=(("work = torch.float64 if x.dtype == torch.float64 else torch.float32", "work = torch.float32"),),
    ),
    Mistake(
        name="pack loses the high bits",
        why="each code keeps only n_bits - 1 of its bits in the byte, so codes of 2**(n_bits - 1) and above "
            "come back smaller after unpack.",
        hint="Pack codes that are all 2**n_bits - 1 and unpack them: which bits survive?",
        edits=(("mask = 2 ** n_bits - 1  # each code keeps its n_bits bits", "mask = 2 ** (n_bits - 1) - 1"),),
    ),
    Mistake(
        name="residual never flushed",
        why="the tokens pile up in the full-precision residual, so nothing is ever quantized and the cache "
            "saves no memory.",
        hint="When the residual holds R tokens, what should happen to them?",
        edits=(("while k_new.shape[2] >= R:", "while False:"),),
    ),
    Mistake(
        name="flushed one token late",
        why="a group is full at R tokens; waiting for R + 1 leaves R full-precision tokens in the residual "
            "whenever the length is a multiple of R.",
        hint="After exactly R tokens, how many should be left in full precision?",
        edits=(("while k_new.shape[2] >= R:", "while k_new.shape[2] > R:"),),
    ),
    Mistake(
        name="one flush per update",
        why="an update bringing many tokens can fill several groups; flushing only one leaves more than R "
            "tokens in the residual, so the state depends on the chunking.",
        hint="After a prefill of 3R + 1 tokens, how many groups should exist?",
        edits=(("while k_new.shape[2] >= R:", "if k_new.shape[2] >= R:"),),
    ),
    Mistake(
        name="nbytes counts unpacked codes",
        why="codes kept one per byte take 8 / n_bits times the bytes of packed ones: a 4-bit cache that "
            "stores each code in a uint8 saves only half of what it should.",
        hint="How many bytes should R * D codes of 4 bits take?",
        edits=(('return {"k": pack(k_codes, self.n_bits), "k_scale": k_scale, "k_zero": k_zero,\n'
                '                "v": pack(v_codes, self.n_bits), "v_scale": v_scale, "v_zero": v_zero}',
                'return {"k": k_codes, "k_scale": k_scale, "k_zero": k_zero,\n'
                '                "v": v_codes, "v_scale": v_scale, "v_zero": v_zero}'),
               ('ks = [dequantize(unpack(g["k"], self.n_bits), g["k_scale"]',
                'ks = [dequantize(g["k"], g["k_scale"]'),
               ('vs = [dequantize(unpack(g["v"], self.n_bits), g["v_scale"]',
                'vs = [dequantize(g["v"], g["v_scale"]')),
    ),
    Mistake(
        name="fp8 scale from the signed maximum",
        why="the scale must fit the largest magnitude, amax(|x|); the largest signed value misses a larger "
            "negative one, which then saturates (and an all-negative tensor gets no scale at all).",
        hint="Which number has to land on ±448: the largest x, or the largest |x|?",
        edits=(("x.abs().amax(dim=(0, 2, 3), keepdim=True) if per_head else x.abs().amax()",
                "x.amax(dim=(0, 2, 3), keepdim=True) if per_head else x.amax()"),),
    ),
    Mistake(
        name="fp8 cast without the clamp",
        why="torch's cast to e5m2 turns a value past 57,344 into inf (and casts differ between devices); "
            "values past the format's largest must be clamped to ±max before the cast.",
        hint="Cast 1e9 to torch.float8_e5m2: what comes back, and what should?",
        edits=(("y = (x.to(torch.float32) / scale).clamp(-top, top)", "y = x.to(torch.float32) / scale"),),
    ),
    Mistake(
        name="fp8 scale of zeros is 0",
        why="a tensor of zeros has amax 0, and a scale of 0 makes x / scale 0 / 0 = NaN; the README gives "
            "such a tensor the scale 1.",
        hint="What is fp8_scale of torch.zeros(1, 1, 2, 2), and what does fp8_quantize then divide by?",
        edits=(("return torch.where(amax > 0, scale, torch.ones_like(scale))", "return scale"),),
    ),
    Mistake(
        name="fp8 scale per head and per batch row",
        why="a scale per head is taken over the batch, the tokens and the channels of that head, (1, Hkv, "
            "1, 1): it belongs to the layer, not to one request.",
        hint="Over which axes of (B, Hkv, T, D) do you take the maximum for one scale per KV head?",
        edits=(("amax(dim=(0, 2, 3), keepdim=True)", "amax(dim=(2, 3), keepdim=True)"),),
    ),
    Mistake(
        name="frozen fp8 scale recomputed every update",
        why="with frozen=True the scales come from the layer's first update and stay; recomputing them fits "
            "every later chunk, so nothing saturates where the README's frozen cache does.",
        hint="With frozen=True, which update's keys decide the scale of the tenth update?",
        edits=(("if self.frozen and chunks:", "if False:"),),
    ),
    Mistake(
        name="per-update fp8 scale never refreshed",
        why="with frozen=False each update's tokens get scales of their own; keeping the first update's "
            "saturates a later, larger chunk.",
        hint="With frozen=False, where does the scale of the second update's keys come from?",
        edits=(("if self.frozen and chunks:", "if chunks:"),),
    ),
    Mistake(
        name="fp8 codes divided in the half dtype",
        why="x / scale in bfloat16 is rounded to 8 bits and then again to the format's 3 or 2: a value "
            "near the middle of two FP8 values can go the wrong way; divide in float32.",
        hint="In which dtype do you compute x / scale when x is bfloat16?",
        edits=(("y = (x.to(torch.float32) / scale).clamp(-top, top)",
                "y = (x / scale.to(x.dtype)).clamp(-top, top)"),),
    ),
    Mistake(
        name="fp8 nbytes without the scales",
        why="every scale is held too, 4 bytes each, once per layer when frozen and once per update when "
            "not; a per-update cache of one-token decodes pays 8 bytes a token per tensor scale.",
        hint="Besides the codes, what else does the cache hold, and how many of them?",
        edits=(("return codes + sum(4 * (ks.numel() + vs.numel()) for _, ks, _, vs in scales)", "return codes"),),
    ),
    Mistake(
        name="fp8 dequantize divides by the scale",
        why="quantize divides by the scale, so dequantize multiplies: x̂ = code · scale.",
        hint="If code = x / scale, how do you get x back?",
        edits=(("return (codes.to(torch.float32) * scale).to(dtype)", "return (codes.to(torch.float32) / scale).to(dtype)"),),
    ),
]
