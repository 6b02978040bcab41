"""A training recipe beyond precision and optimizer: FP8 GEMMs, offload, LoRA/QLoRA; its model states per rank.

One place turns a stage's tensors into the bytes each recipe leaves on the GPU and on the host, so that
``shardlab memory`` (``memory/training.py``) and the step-time model read the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardlab.errors import ShardlabError, field_name
from shardlab.memory.fp8 import Fp8Recipe, fp8_extra_bytes
from shardlab.memory.lora import LoraSpec, check_lora, dequant_buffer_bytes, lora_state_report
from shardlab.memory.offload import Offload, check_offload, split_states
from shardlab.memory.precision import StateBytes
from shardlab.memory.states import StateReport, state_report


@dataclass(frozen=True)
class Recipe:
    """What is trained and where its states live, beyond ``--precision`` and ``--optimizer``."""

    offload: Offload = field(default_factory=Offload)
    """Model states kept in host memory or on NVMe."""
    lora: LoraSpec | None = None
    """LoRA/QLoRA adapters on a frozen base, or None for full training."""
    fp8: Fp8Recipe = field(default_factory=Fp8Recipe)
    """FP8 recipe details (used only with --precision fp8-mixed)."""
    host_link_bytes_per_s: float = 0.0
    """Achieved GPU↔host bandwidth per direction for offload time (the accelerator's host link); 0 = not known."""

    @property
    def is_default(self) -> bool:
        return self.offload.what == "none" and self.lora is None


DEFAULT = Recipe()


def check_recipe(recipe: Recipe, precision: str, zero: int) -> Recipe:
    """Validate combinations; a ShardlabError names the fix."""
    check_offload(recipe.offload, zero)
    if recipe.lora is not None:
        check_lora(recipe.lora)
        if precision == "fp8-mixed":
            raise ShardlabError(f"{field_name('workload.precision')} fp8-mixed with {field_name('recipe.lora_rank')} "
                                "is not modelled; use bf16-mixed for LoRA/QLoRA")
        if precision in ("fp32", "bf16"):
            raise ShardlabError(f"LoRA/QLoRA is modelled with mixed precision (bf16 base, adapters with fp32 master "
                                f"weights); use {field_name('workload.precision')} bf16-mixed instead of {precision}")
    return recipe


@dataclass(frozen=True)
class RankStates:
    """Model-state bytes of one rank under a recipe."""

    gpu: StateReport
    """What stays on the GPU (weights, gradients, master, moments after offload)."""
    host: dict
    """Bytes moved to host memory (or NVMe) by category."""
    other: dict
    """Named extra GPU bytes: fp8_weight_cache, fp8_scaling_state, nf4_dequant_buffer."""
    parts: dict
    """LoRA breakdown (base_quantized_bytes, base_bf16_bytes, adapter_params_local, adapter_weight_bytes)."""


def _primary_fp8(rep: StateReport, tensors, spec, layout, sb: StateBytes) -> StateReport:
    """``rep`` with FP8 primary weights (``Fp8Recipe.primary_weights``): the FP8 GEMMs' bf16 weights gone."""
    from dataclasses import replace

    from shardlab.memory.fp8 import is_fp8_gemm, primary_weight_saving
    from shardlab.memory.states import fsdp_shard_numel

    fp8 = [t for t in tensors if is_fp8_gemm(t, spec)]
    local = sum(t.local_numel(spec, layout.tp, layout.ep, None, layout.etp) for t in fp8)
    shard = sum(fsdp_shard_numel(t.local_shape(spec, layout.tp, layout.ep, None, layout.etp),
                                 layout.expert_dp if t.ep_dim is not None else layout.dp_shard) for t in fp8)
    return replace(rep, weights=int(rep.weights - primary_weight_saving(local, shard, layout.zero, sb.weights)))


def rank_states(tensors, spec, layout, sb: StateBytes, recipe: Recipe, precision: str) -> RankStates:
    """Model states of a rank holding ``tensors`` (TP/EP/ZeRO as in ``state_report``) under ``recipe``."""
    parts: dict = {}
    other: dict = {}
    if recipe.lora is not None:
        rep, parts = lora_state_report(tuple(tensors), spec, layout, sb, recipe.lora)
        other["nf4_dequant_buffer"] = dequant_buffer_bytes(tensors, spec, layout, recipe.lora)
    else:
        rep = state_report(tuple(tensors), spec, layout, sb)
    if precision == "fp8-mixed":
        other.update(fp8_extra_bytes(tensors, spec, layout, recipe.fp8))
        if recipe.fp8.primary_weights and recipe.lora is None:
            rep = _primary_fp8(rep, tensors, spec, layout, sb)
    return _offloaded(rep, layout, sb, recipe, other, parts)


def _offloaded(rep: StateReport, layout, sb: StateBytes, recipe: Recipe, other: dict, parts: dict) -> RankStates:
    opt_elems = rep.moments / sb.moments if sb.moments else (rep.master / sb.master if sb.master else 0)
    sp = split_states(rep.weights, rep.gradients, rep.master, rep.moments, layout.zero, recipe.offload,
                      grad_partition=int(round(opt_elems * sb.gradients)))
    gpu = StateReport(rep.params_local, rep.params_stored, rep.expert_params_local, sp.gpu_weights, sp.gpu_gradients,
                      sp.gpu_master, sp.gpu_moments)
    return RankStates(gpu, sp.host, {k: v for k, v in other.items() if v}, parts)


def count_states(report: StateReport, layout, sb: StateBytes, recipe: Recipe) -> RankStates:
    """Offload applied to a bare-parameter-count report (LoRA and FP8 copies need a model's shapes)."""
    if recipe.lora is not None:
        raise ShardlabError("LoRA/QLoRA memory needs a model's shapes: give MODEL instead of --params")
    return _offloaded(report, layout, sb, recipe, {}, {})
