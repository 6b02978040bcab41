"""Precision topic: why bf16 over fp16 (range vs precision) and what loss scaling does, from the format definitions."""

from __future__ import annotations

import math

from shardlab.teach.explanation import Explanation
from shardlab.teach.params import Param
from shardlab.teach.registry import Topic


def bf16_vs_fp16(v: dict) -> Explanation:
    """Range vs precision of fp16 and bf16; where a gradient lands; the loss scale fp16 needs."""
    from shardlab.numerics import FORMATS, classify, largest_safe_scale, loss_scale_for

    g_small, g_large = v["grad"], v["max_grad"]
    fp16, bf16 = FORMATS["fp16"], FORMATS["bf16"]
    rows = [[f.name, f.exponent_bits, f.mantissa_bits, f"{f.max_value:.4g}", f"{f.min_normal:.3g}", f"{f.min_subnormal:.3g}",
             f"{f.epsilon:.3g}", f"{f.decimal_digits:.1f}", classify(g_small, f)] for f in (FORMATS["fp32"], fp16, bf16)]
    need = loss_scale_for(g_small, fp16)
    keep = loss_scale_for(g_small, fp16, target="subnormal")    # non-zero, with fewer significant bits
    safe = largest_safe_scale(g_large, fp16)
    ok = need <= safe
    # significant bits the small gradient keeps at the largest safe scale: a subnormal m·2^-24 holds bit_length(m)
    bits = min(fp16.mantissa_bits + 1, max(0, math.floor(math.log2(g_small * safe / fp16.min_subnormal)) + 1))
    if ok:
        verdict = "a scale that keeps both normal exists"
    elif keep <= safe:
        verdict = (f"no single scale keeps both normal: at S = 2^{safe.bit_length() - 1} the small gradient is a "
                   f"subnormal with about {bits} significant bits (a normal fp16 number has "
                   f"{fp16.mantissa_bits + 1}), and S = 2^{need.bit_length() - 1} overflows the largest")
    else:
        verdict = "NO single scale fits both: the small gradients round to 0 or the large ones overflow"
    return Explanation(
        "bf16-vs-fp16", "bf16 vs fp16: range vs precision, and loss scaling",
        f"A gradient of {g_small:g} (the largest is {g_large:g}): what happens to it in fp16 and in bf16, and what loss "
        f"scale would fp16 need?",
        dict(v),
        [f"fp16 (IEEE 754 binary16) = 5 exponent + 10 mantissa bits: largest {fp16.max_value:g}, smallest normal "
         f"2^-14 = {fp16.min_normal:.3g}, smallest subnormal 2^-24 = {fp16.min_subnormal:.3g}; precision 2^-10 = "
         f"{fp16.epsilon:.3g}",
         f"bf16 = 8 exponent + 7 mantissa bits: fp32's range (up to {bf16.max_value:.3g}, down to {bf16.min_normal:.3g}) "
         f"with precision 2^-7 = {bf16.epsilon:.3g}, 8× coarser than fp16 [Kalamkar et al. 2019]",
         f"the gradient {g_small:g} in fp16: {classify(g_small, fp16)}"
         + (" (rounds to 0: the update is lost)" if classify(g_small, fp16) == "zero" else
            " (kept with fewer significant bits)" if classify(g_small, fp16) == "subnormal" else ""),
         f"in bf16: {classify(g_small, bf16)}: bf16's normal numbers reach fp32's smallest normal 2^-126 = "
         f"{bf16.min_normal:.3g}, so a gradient that is a normal fp32 number never rounds to 0 in bf16",
         f"loss scaling for fp16 [Micikevicius et al. 2018 §3.2]: multiply the loss by S before backward, divide the "
         f"gradients by S before the update; lifting {g_small:g} to fp16's smallest normal needs "
         f"S = 2^{need.bit_length() - 1} = {need:,}",
         f"the largest gradient {g_large:g} stays finite up to S = 2^{safe.bit_length() - 1} = {safe:,}: "
         + verdict + "; a dynamic scaler searches for it (halve on inf/NaN and skip the step, double after a run of "
           "clean steps: PyTorch's GradScaler, Megatron's DynamicGradScaler, in the code map below)",
         "bf16 needs no scaler at all [Kalamkar et al. 2019]; its cost is precision (about 2-3 significant digits), "
         "which the fp32 master copy of the weights and fp32 accumulation absorb [Micikevicius et al. 2018 §3.1, "
         "§3.3]"],
        f"fp16 spends its bits on precision and has a narrow range: anything below about {fp16.min_subnormal / 2:.0e} "
        f"(half the smallest subnormal) rounds to zero, and small gradients are exactly that. Loss scaling rescues fp16 "
        f"by multiplying the loss (and so every gradient) by a large factor during backward and dividing it out afterwards, but the factor must be tuned on the "
        f"fly so the largest gradients do not overflow. bf16 keeps fp32's exponent, so the same gradients simply fit: "
        f"coarser numbers, but nothing vanishes and no scaler can go wrong. That is why bf16 is the stable default.",
        {"grad_fp16": classify(g_small, fp16), "grad_bf16": classify(g_small, bf16), "loss_scale_needed": need,
         "loss_scale_nonzero": keep, "largest_safe_scale": safe, "significant_bits_at_safe_scale": bits,
         "formats": {f.name: {"max": f.max_value, "min_normal": f.min_normal, "min_subnormal": f.min_subnormal,
                              "epsilon": f.epsilon} for f in FORMATS.values()}},
        table=(["format", "exp bits", "mantissa bits", "max", "min normal", "min subnormal", "epsilon", "digits",
                f"{g_small:g} is"], rows),
        sources=["mixed-precision", "bf16", "ieee754"], code=["pt-autocast", "pt-scaler", "meg-scaler", "ds-scaler"],
        commands=["run precision --steps 20"],
        notes=["`shardlab run precision` trains the same small GPT in fp32, fp16 without scaling, fp16 with dynamic loss "
               "scaling and bf16, and measures the underflow"])


TOPICS = [
    Topic("bf16-vs-fp16", "bf16 vs fp16 and loss scaling", "range vs precision; where gradients underflow; the scale fp16 needs",
          (28,), (Param("grad", "float", 1e-8, "a small gradient magnitude", minimum=1e-45),
                  Param("max_grad", "float", 10.0, "the largest gradient magnitude", minimum=1e-45)), bf16_vs_fp16),
]
