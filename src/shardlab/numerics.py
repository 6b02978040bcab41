"""Floating-point formats used in training: range, precision, and what a loss scale does to small gradients.

A binary floating-point format with e exponent bits and m explicit mantissa bits (IEEE 754-2008 §3.3; the
bias is 2^(e−1) − 1) has
    largest finite value   (2 − 2^−m) · 2^bias
    smallest normal        2^(1 − bias)
    smallest subnormal     2^(1 − bias − m)       (below it a value rounds to zero: underflow)
    machine epsilon        2^−m                   (spacing of numbers just above 1: the relative precision)
fp32 is binary32 (e 8, m 23), fp16 binary16 (e 5, m 10). bfloat16 keeps fp32's 8 exponent bits and cuts the
mantissa to 7 (Kalamkar et al. 2019, "A Study of BFLOAT16 for Deep Learning Training", arXiv 1905.12322):
fp32's range at a third of fp16's precision. Loss scaling (Micikevicius et al. 2018, "Mixed Precision
Training", arXiv 1710.03740 §3.2) multiplies the loss by S before backward so that gradients below fp16's
smallest subnormal land inside its range, and divides the gradients by S before the update; a dynamic
scaler halves S when a gradient overflows (inf/NaN, the step is skipped) and doubles it after a run of good
steps (PyTorch ``torch.amp.GradScaler``: init 2^16, backoff 0.5, growth 2 every 2000 steps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shardlab.errors import ShardlabError, did_you_mean


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format."""

    name: str
    """fp32, fp16, bf16, tf32."""
    exponent_bits: int
    """e: exponent field width."""
    mantissa_bits: int
    """m: explicit fraction bits (the leading 1 of a normal number is implicit)."""
    storage_bytes: int
    """Bytes one value takes in memory (tf32 is stored as fp32)."""
    source: str
    """Where the layout is defined."""

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def max_value(self) -> float:
        """Largest finite value, (2 − 2^−m)·2^bias."""
        return (2 - 2.0 ** -self.mantissa_bits) * 2.0 ** self.bias

    @property
    def min_normal(self) -> float:
        """Smallest positive normal value, 2^(1−bias): below it precision is lost bit by bit."""
        return 2.0 ** (1 - self.bias)

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value, 2^(1−bias−m): anything below half of it rounds to zero."""
        return 2.0 ** (1 - self.bias - self.mantissa_bits)

    @property
    def epsilon(self) -> float:
        """Machine epsilon 2^−m: the gap between 1 and the next value (relative precision)."""
        return 2.0 ** -self.mantissa_bits

    @property
    def decimal_digits(self) -> float:
        """Significant decimal digits, (m + 1)·log10(2)."""
        return (self.mantissa_bits + 1) * math.log10(2)

    @property
    def dynamic_range_binades(self) -> int:
        """Powers of two between the smallest subnormal and the largest value."""
        return int(round(math.log2(self.max_value) - math.log2(self.min_subnormal)))


FORMATS = {
    "fp32": FloatFormat("fp32", 8, 23, 4, "IEEE 754-2008 binary32"),
    "tf32": FloatFormat("tf32", 8, 10, 4, "NVIDIA A100 whitepaper (2020): TensorFloat-32, fp32 range with fp16's mantissa"),
    "fp16": FloatFormat("fp16", 5, 10, 2, "IEEE 754-2008 binary16"),
    "bf16": FloatFormat("bf16", 8, 7, 2, "Kalamkar et al. 2019, arXiv 1905.12322 (bfloat16: fp32's exponent, 7 mantissa bits)"),
}
"""The formats mixed-precision training uses."""


def float_format(name: str) -> FloatFormat:
    """The format called ``name``; ShardlabError naming the choices otherwise."""
    if name not in FORMATS:
        raise ShardlabError(f"unknown number format '{name}'{did_you_mean(name, FORMATS)}; use one of {', '.join(FORMATS)}")
    return FORMATS[name]


def classify(value: float, fmt: FloatFormat) -> str:
    """Where |value| lands in ``fmt``: 'zero' (underflows), 'subnormal' (precision lost), 'normal' or 'overflow'.

    Round to nearest: magnitudes below half the smallest subnormal become 0; above the largest finite
    value (plus half an ulp) they become inf.
    """
    a = abs(value)
    if a == 0 or a < fmt.min_subnormal / 2:
        return "zero"
    if a < fmt.min_normal:
        return "subnormal"
    if a > fmt.max_value * (1 + fmt.epsilon / 4):
        return "overflow"
    return "normal"


def loss_scale_for(smallest_gradient: float, fmt: FloatFormat, target: str = "normal") -> int:
    """Smallest power-of-two loss scale S that lifts ``smallest_gradient`` to ``fmt``'s smallest normal value
    (``target`` 'normal') or subnormal value ('subnormal'): S = 2^ceil(log2(limit / g)), at least 1."""
    if not smallest_gradient > 0:
        raise ShardlabError(f"the gradient magnitude must be positive, got {smallest_gradient}")
    limit = fmt.min_normal if target == "normal" else fmt.min_subnormal
    return 2 ** max(0, math.ceil(math.log2(limit / smallest_gradient)))


def largest_safe_scale(largest_gradient: float, fmt: FloatFormat) -> int:
    """Largest power-of-two loss scale that keeps ``largest_gradient`` finite: 2^floor(log2(max / g))."""
    if not largest_gradient > 0:
        raise ShardlabError(f"the gradient magnitude must be positive, got {largest_gradient}")
    return 2 ** max(0, math.floor(math.log2(fmt.max_value / largest_gradient)))
