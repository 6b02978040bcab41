"""What FP8, offload and LoRA/QLoRA change in the vectorised step model (``estimate/step.py``).

The step model screens thousands of layouts with per-parameter byte counts; these helpers give it the recipe's
factors (computed once per model) and adjust its model-state bytes and time terms. The exact per-tensor numbers are
``memory/recipe.py``'s; the planner re-checks its best plans with them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from shardlab.errors import ShardlabError
from shardlab.rates.fp8 import CAST_BYTES_PER_ELEMENT, all_gather_bytes_per_param, fp8_fraction
from shardlab.rates.hardware import memory_time_s
from shardlab.estimate.offload import offload_time
from shardlab.memory.lora import adapter_param_count, base_weight_bytes
from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import model_tensors, param_counts


@dataclass(frozen=True)
class RecipeFactors:
    """Per-parameter factors of a recipe for one model."""

    trainable: float
    """Share of parameters with gradients and optimizer state (adapters / total under LoRA, else 1)."""
    weight_bytes: float
    """Average stored bytes per parameter of the weights (NF4 base under QLoRA, else the precision's)."""
    gather_bytes: float
    """Bytes per parameter a ZeRO-3 all-gather moves (FP8 all-gather, NF4 base, else the weight bytes)."""
    fp8_fraction: float
    """Share of parameters that are FP8 GEMM weights (0 unless fp8-mixed)."""


@lru_cache(maxsize=64)
def _lora_factors(spec: ModelSpec, lora) -> tuple[float, float]:
    from shardlab.layout import Layout

    total = param_counts(spec).total
    bw = base_weight_bytes(model_tensors(spec), spec, Layout(), lora)
    return adapter_param_count(spec, lora) / total, (bw["quantized"] + bw["bf16"]) / total


def recipe_factors(spec: ModelSpec, recipe, sb) -> RecipeFactors:
    if recipe.lora is not None:
        frac, wb = _lora_factors(spec, recipe.lora)
        return RecipeFactors(frac, wb, wb, 0.0)
    if sb.gemm_dtype == "fp8":
        return RecipeFactors(1.0, sb.weights, all_gather_bytes_per_param(spec, recipe.fp8.all_gather, sb.weights),
                             fp8_fraction(spec))
    return RecipeFactors(1.0, sb.weights, sb.weights, 0.0)


def stage_state_bytes(w_b, g_b, o_b, stored_params, zero, f: RecipeFactors, recipe, sb):
    """(weights, gradients, optimizer, host) bytes of a stage after the recipe (arrays over candidates)."""
    w = w_b / sb.weights * f.weight_bytes
    g, o = g_b * f.trainable, o_b * f.trainable
    host = 0.0
    off = recipe.offload
    if off.params:
        host, w = host + w, w * 0
    if off.optimizer:
        host, o = host + o, o * 0
        moved = np.where(zero >= 2, g, 0.0)
        host, g = host + moved, g - moved
    return w, g, o, host


def fp8_weight_cast_s(params_local, f: RecipeFactors, acc):
    """Per-step cast of the FP8 weights and their transposes (once per step with TE's weight cache)."""
    return memory_time_s(CAST_BYTES_PER_ELEMENT * f.fp8_fraction * params_local, acc)


def offload_exposed_s(recipe, *, partition_params, microbatches, compute_per_microbatch_s, backward_last_s,
                      gpus_per_node: int, f: RecipeFactors):
    """Exposed offload seconds per step (arrays over candidates), from ``estimate.offload.offload_time``."""
    off = recipe.offload
    if off.what == "none":
        return 0.0
    if not recipe.host_link_bytes_per_s:
        raise ShardlabError("offload time needs the host link's bandwidth (the accelerator's host_link in the catalog)")
    vec = np.vectorize(lambda p, m, c, b: offload_time(
        off, partition_params=p * f.trainable if off.what == "optimizer" else p, microbatches=int(m),
        compute_per_microbatch_s=c, backward_last_s=b, link_bytes_per_s=recipe.host_link_bytes_per_s,
        gpus_per_node=gpus_per_node, optimizer_bytes=12).exposed_s, otypes=[float])
    return vec(*np.broadcast_arrays(partition_params, microbatches, compute_per_microbatch_s, backward_last_s))


def offload_detail(est) -> dict | None:
    """Traffic, bandwidth to hide it and CPU time of the estimate's worst stage (scalars, for the report), or None."""
    wl, lay = est.workload, est.layout
    off = wl.recipe.offload
    if off.what == "none":
        return None
    from dataclasses import asdict

    from shardlab.memory.precision import state_bytes

    f = recipe_factors(est.model, wl.recipe, state_bytes(wl.precision, wl.optimizer, wl.main_grad_bytes))
    params = est.memory.worst.params
    partition = -(-params // lay.dp_shard) if lay.zero >= 1 else params
    m, b = est.microbatches, est.breakdown
    r = offload_time(off, partition_params=partition * (f.trainable if off.what == "optimizer" else 1), microbatches=m,
                     compute_per_microbatch_s=(b["compute_s"] + b["recompute_s"]) / m, backward_last_s=b["compute_s"] / m * 2 / 3,
                     link_bytes_per_s=wl.recipe.host_link_bytes_per_s,
                     gpus_per_node=min(est.cluster.gpus_per_node, est.cluster.num_gpus))   # ranks sharing the host's CPU
    return {**asdict(r), "what": off.what, "device": off.device, "partition_params": partition,
            "host_link": est.cluster.accelerator.host_link}
