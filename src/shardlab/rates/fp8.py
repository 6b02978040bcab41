"""Time of FP8 training (``--precision fp8-mixed``): FP8 GEMMs, the casts that feed them, and FP8 all-gathers.

Model (Transformer Engine recipe; Micikevicius et al. 2022, arXiv 2209.05433 §4; ``memory/fp8.py`` for what is FP8):
- The linear layers' GEMMs run at the accelerator's FP8 dense peak times the same size-dependent efficiency curve
  as bf16 GEMMs (``hardware.gemm_efficiency``): forward (E4M3 × E4M3) and both backward GEMMs (E5M2 gradients ×
  E4M3). Attention (flash attention in bf16), the output head and the routers stay at the bf16 peak.
- Casts are memory-bound kernels (``hardware.memory_time_s``). Per linear layer of shape (out, in), T tokens:
    forward    input → FP8 row-wise and transposed (read 2 B, write 1 + 1 B):    4·T·in bytes
    backward   output gradient → FP8 row-wise and transposed (read 2, write 2):  4·T·out bytes
    per step   weight → FP8 and its transpose (read 2, write 1 + 1): 4·out·in bytes once per optimizer step when the
               copies are cached across micro-batches (TE ``is_first_microbatch``), else every micro-batch.
  Transformer Engine fuses some of these casts into the preceding norm or activation kernel; counting them as
  separate passes is an upper bound (docs/modern.md).
- Amax reductions and scale updates: a few small kernels per GEMM per step, below the resolution of this model.
- FSDP with FP8 all-gather (torchtitan ``enable_fsdp_float8_all_gather``): the gathered bytes of FP8 GEMM weights
  are 1 per element instead of 2 (``all_gather_bytes_per_param``); gradients are still reduced in bf16.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from shardlab.rates.hardware import gemm_time_s, memory_time_s
from shardlab.memory.fp8 import is_fp8_gemm
from shardlab.specs.hardware import Accelerator, MatmulEfficiency
from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import model_tensors

CAST_BYTES_PER_ELEMENT = 4
"""Read 2 bytes (bf16) and write a row-wise and a transposed FP8 copy (1 + 1 byte) per element cast."""


def fp8_peak_flops(acc: Accelerator) -> float:
    """The dense FP8 peak; a ShardlabError names the precisions the accelerator has when it has no FP8 units."""
    return acc.peak_flops("fp8")


def fp8_gemm_time_s(m, n, k, acc: Accelerator, curve: MatmulEfficiency):
    """An (m × k)·(k × n) GEMM in FP8: 2mnk / (FP8 peak · eff(min(m, n, k)))."""
    return gemm_time_s(m, n, k, fp8_peak_flops(acc), curve)


def linear_cast_bytes(tokens, n_out, n_in, *, weight_per_microbatch: bool = False) -> dict:
    """Cast traffic of one FP8 linear layer per micro-batch: {'forward', 'backward', 'weight'} bytes (array-safe).

    'weight' is per optimizer step unless ``weight_per_microbatch`` (no weight caching)."""
    tokens, n_out, n_in = (np.asarray(x, dtype=float) for x in (tokens, n_out, n_in))
    return {"forward": CAST_BYTES_PER_ELEMENT * tokens * n_in, "backward": CAST_BYTES_PER_ELEMENT * tokens * n_out,
            "weight": CAST_BYTES_PER_ELEMENT * n_out * n_in, "weight_per_microbatch": weight_per_microbatch}


def fp8_weight_params(spec: ModelSpec, layer: int) -> int:
    """Elements of block ``layer``'s weights that run as FP8 GEMMs (full, unsplit)."""
    return sum(t.numel for t in model_tensors(spec) if t.layer == layer and is_fp8_gemm(t, spec))


@lru_cache(maxsize=64)
def fp8_fraction(spec: ModelSpec) -> float:
    """Share of all parameters that are FP8 GEMM weights (what FP8 all-gather shrinks)."""
    from shardlab.specs.tensors import param_counts

    n = sum(t.numel for t in model_tensors(spec) if is_fp8_gemm(t, spec))
    return n / param_counts(spec).total


def all_gather_bytes_per_param(spec: ModelSpec, fp8_all_gather: bool, weight_bytes: int = 2) -> float:
    """Average bytes per parameter a ZeRO-3 all-gather moves: FP8 GEMM weights at 1 byte with FP8 all-gather."""
    if not fp8_all_gather:
        return float(weight_bytes)
    f = fp8_fraction(spec)
    return f * 1.0 + (1 - f) * weight_bytes


def cast_time_s(cast: dict, acc: Accelerator, microbatches: int = 1):
    """Seconds of the cast kernels of one micro-batch: forward + backward + this micro-batch's share of the weight casts."""
    w = cast["weight"] if cast["weight_per_microbatch"] else cast["weight"] / microbatches
    return memory_time_s(cast["forward"] + cast["backward"] + w, acc)
