"""Per-GPU training memory: model states + activations + named overheads, for every pipeline stage.

Ranks of one pipeline stage are identical (TP, CP, DP and EP shards are symmetric), so the model is
evaluated once per stage and the worst stage decides whether the job fits. The report names that rank
and says why it is the worst.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from shardlab import xp
from shardlab.errors import ShardlabError, field_name
from shardlab.layout import TOKENS_PER_STEP, Layout, Recompute, default_global_batch
from shardlab.layout_checks import validate
from shardlab.memory.activations import (ActivationContext, _tsh, in_flight, layer_activation_bytes, overlap_extra_in_flight,
                                         layer_input_bytes, op_saved_bytes)
from shardlab.memory.overheads import MEMORY_MARGIN, Overheads, margin_note
from shardlab.memory.buffers import largest_unit_bytes, stage_overheads
from shardlab.memory.explain import explain_report, explain_states
from shardlab.memory.fp8 import fsdp_unit_weight_bytes
from shardlab.memory.lora import lora_activation_bytes, nf4_bits_per_weight
from shardlab.memory.precision import StateBytes, state_bytes
from shardlab.memory.recipe import DEFAULT, Recipe, check_recipe, count_states, rank_states
from shardlab.memory.states import StageTensors, stage_tensors, state_report_from_count
from shardlab.specs.hardware import Accelerator
from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import param_counts
from shardlab.units import fmt_count


@dataclass
class StageMemory:
    """Peak memory of one rank of a pipeline stage, bytes."""

    stage: int
    """Pipeline rank."""
    rank: int
    """Global rank of the stage's first GPU (tp = cp = dp = 0)."""
    layers: int
    """Transformer blocks held."""
    params: int
    """Parameters after TP/EP splitting (before ZeRO)."""
    expert_params: int
    """Of params, routed-expert parameters (ZeRO shards them over dp·cp/ep)."""
    weights: int
    """Weight bytes (compute dtype)."""
    gradients: int
    """Gradient bytes."""
    optimizer: int
    """Optimizer bytes: fp32 master weights + moments."""
    master_weights: int
    """fp32 master weights (part of optimizer)."""
    moments: int
    """Adam m and v, or SGD momentum (part of optimizer)."""
    activations: int
    """Saved activations of the micro-batches in flight (plus the recompute working set under full recomputation)."""
    in_flight: float
    """Micro-batches in flight at this stage's peak."""
    other: dict[str, int] = field(default_factory=dict)
    """Named overheads: cuda_context, library_workspace, nccl_buffers, ddp_buckets, zero_buckets, fsdp_buffers,
    logits_and_loss, pp_p2p, tp_sp_gather, cp_kv_blocks, ep_all_to_all, fragmentation."""
    holds_embedding: bool = False
    holds_head: bool = False
    host: dict[str, int] = field(default_factory=dict)
    """Model-state bytes offloaded to host memory (or NVMe) by category: weights, gradients, master_weights, moments."""

    @property
    def host_total(self) -> int:
        return sum(self.host.values())

    @property
    def model_states(self) -> int:
        return self.weights + self.gradients + self.optimizer

    @property
    def other_total(self) -> int:
        return sum(self.other.values())

    @property
    def total(self) -> int:
        return self.model_states + self.activations + self.other_total


@dataclass
class MemoryReport:
    """The answer of ``shardlab memory``."""

    model_name: str
    params: int
    active_params: int
    layout: Layout
    microbatches: int
    precision: str
    optimizer: str
    seq_len: int | None
    accelerator: Accelerator | None
    stages: list[StageMemory]
    explain: dict[str, str]
    notes: list[str]
    by_component: dict[str, int] = field(default_factory=dict)
    recipe: Recipe = DEFAULT
    """Offload, LoRA/QLoRA and FP8 settings the report was computed with."""
    recipe_summary: dict = field(default_factory=dict)
    """What the recipe changed (trainable parameters, base bytes, offload device, FP8 extras)."""

    @property
    def worst(self) -> StageMemory:
        return max(self.stages, key=lambda s: (s.total, -s.stage))

    @property
    def capacity_bytes(self) -> int | None:
        return self.accelerator.memory_bytes if self.accelerator else None

    @property
    def fits(self) -> bool | None:
        return None if self.accelerator is None else self.worst.total <= self.capacity_bytes

    def worst_reason(self) -> str:
        w, lay = self.worst, self.layout
        if lay.pp == 1:
            return "every rank holds the same shard (no pipeline parallelism); rank 0 stands for all"
        why = [f"pipeline stage {w.stage} of {lay.pp}"]
        if w.holds_embedding:
            why.append("holds the token embedding")
        if w.holds_head:
            why.append("holds the output head and the loss (logits)")
        why.append(f"{w.layers} layers")
        why.append(f"{w.in_flight:g} micro-batches in flight under {lay.schedule}")
        return ", ".join(why)

    def to_dict(self) -> dict:
        w = self.worst
        per_gpu = {"weights": w.weights, "gradients": w.gradients, "optimizer": w.optimizer,
                   "model_states": w.model_states, "activations": w.activations, "other": w.other_total,
                   "total": w.total, "master_weights": w.master_weights, "optimizer_moments": w.moments,
                   "other_breakdown": dict(w.other)}
        out = {
            "model": {"name": self.model_name, "params": self.params, "active_params": self.active_params,
                      "by_component": self.by_component},
            "layout": {**self.layout.to_dict(), "microbatches": self.microbatches},
            "precision": self.precision, "optimizer": self.optimizer, "seq_len": self.seq_len,
            "gpu": self.accelerator.id if self.accelerator else None,
            "per_gpu": per_gpu,
            "worst_rank": {"rank": w.rank, "stage": w.stage, "reason": self.worst_reason()},
            "stages": [{**{k: v for k, v in asdict(s).items() if k != "other"}, "model_states": s.model_states,
                        "other": s.other_total, "total": s.total} for s in self.stages],
            "capacity_bytes": self.capacity_bytes,
            "fits": self.fits,
            "headroom_bytes": None if self.accelerator is None else self.capacity_bytes - w.total,
            "margin": None if self.accelerator is None else {
                "fraction": MEMORY_MARGIN, "kept": self.capacity_bytes - w.total >= MEMORY_MARGIN * self.capacity_bytes,
                "note": margin_note(w.total, self.capacity_bytes)},
            "explain": self.explain,
            "recipe": self.recipe_summary,
            "host_per_gpu": {**w.host, "total": w.host_total},
            "notes": self.notes,
            "units": "bytes (integers); GiB = 2**30 in human output",
        }
        return out


def training_memory(
    layout: Layout,
    *,
    model: ModelSpec | None = None,
    params: int | None = None,
    accelerator: Accelerator | None = None,
    seq_len: int | None = None,
    precision: str = "bf16-mixed",
    optimizer: str = "adamw",
    microbatches: int | None = None,
    overheads: Overheads = Overheads(),
    flash_attention: bool = True,
    dropout: bool = False,
    num_gpus: int | None = None,
    fused_loss: bool = False,
    recipe: Recipe = DEFAULT,
    compiled: bool = False,
    grad_bytes: int = 0,
    expert_imbalance: float = 1.0,
    ep_overlap: bool = False,
) -> MemoryReport:
    """Peak memory per GPU for training ``model`` (or a bare ``params`` count) with ``layout``; ``recipe`` adds
    offload, LoRA/QLoRA and FP8 settings (``memory/recipe.py``); ``grad_bytes`` (not 0): the framework holds gradients
    in that many bytes each (``state_bytes``); ``expert_imbalance`` and ``ep_overlap``: a MoE job's busiest rank and
    all-to-all overlap (``ActivationContext``)."""
    if (model is None) == (params is None):
        raise ShardlabError("give a model or --params, not both")
    validate(layout, model, num_gpus, seq_len if model is not None else None)
    sb = state_bytes(precision, optimizer, grad_bytes)
    check_recipe(recipe, precision, layout.zero)
    s_default = seq_len or (min(model.max_seq_len, 4096) if model is not None else 4096)
    m = microbatches or default_global_batch(s_default, layout) // (layout.micro_batch * layout.dp)
    if layout.schedule == "interleaved" and layout.pp > 1 and m % layout.pp:
        raise ShardlabError(f"the interleaved schedule needs {field_name('workload.microbatches')} to be a multiple "
                            f"of {field_name('layout.pp')} {layout.pp} (got {m})")
    notes: list[str] = []
    if microbatches is None and layout.pp > 1:
        notes.append(f"{field_name('workload.microbatches')} not given: assumed m = {m}, about "
                     f"{TOKENS_PER_STEP // 2**20}M tokens per step as plan assumes (1F1B holds at most p micro-batches; "
                     "GPipe holds all m)")
    if model is None:
        return _from_count(params, layout, accelerator, sb, precision, optimizer, m, overheads, notes, recipe)

    s = seq_len or min(model.max_seq_len, 4096)
    if seq_len is None:
        notes.append(f"{field_name('workload.seq_len')} not given: assumed {s}")
    ctx = ActivationContext(seq_len=s, elem_bytes=sb.weights, flash_attention=flash_attention, dropout=dropout,
                            fused_loss=fused_loss, linear_input_bytes=1 if sb.gemm_dtype == "fp8" else 0,
                            compiled=compiled, expert_imbalance=expert_imbalance, ep_overlap=ep_overlap)
    pc = param_counts(model)
    stages = [_stage_memory(model, layout, st, sb, ctx, m, overheads, recipe, precision) for st in stage_tensors(model, layout)]
    rep = MemoryReport(model.name, pc.total, pc.active, layout, m, precision, optimizer, s, accelerator, stages, {}, notes,
                       dict(pc.by_component), recipe)
    rep.explain = _explain(rep, model, sb, ctx)
    from shardlab.memory.recipe_report import recipe_summary

    rep.recipe_summary = recipe_summary(rep, model, sb)
    if layout.sequence_parallel and layout.tp == 1:
        notes.append(f"{field_name('layout.sequence_parallel')} has no effect with {field_name('layout.tp')} 1")
    return rep


def _from_count(params, layout, accelerator, sb, precision, optimizer, m, ov, notes, recipe=DEFAULT) -> MemoryReport:
    rs = count_states(state_report_from_count(params, layout, sb), layout, sb, recipe)
    st = rs.gpu
    if precision == "fp8-mixed":
        notes.append("fp8-mixed with a bare parameter count: FP8 weight copies and scaling state need a model's shapes "
                     "(not counted)")
    other = {"cuda_context": ov.cuda_context_bytes, "library_workspace": ov.library_workspace_bytes}
    groups = sum(1 for g in (layout.tp, layout.cp, layout.dp_shard, layout.pp, layout.ep) if g > 1)
    if groups:
        other["nccl_buffers"] = groups * ov.nccl_bytes_per_group
    if layout.zero == 0 and layout.dp_shard > 1 and ov.ddp_bucket_copy:
        other["ddp_buckets"] = st.gradients
    other = {k: v for k, v in other.items() if v > 0}
    stage = StageMemory(0, 0, 0, st.params_local, 0, st.weights, st.gradients, st.optimizer, st.master, st.moments, 0, 1.0, other,
                        host=rs.host)
    notes.append("parameter count only: model states are exact, activations are not estimated (give a model for them)")
    rep = MemoryReport(f"{fmt_count(params)} params", params, params, layout, m, precision, optimizer, None, accelerator, [stage], {}, notes,
                       recipe=recipe)
    rep.explain = explain_states(rep, sb, st.params_local)
    from shardlab.memory.recipe_report import recipe_summary

    rep.recipe_summary = recipe_summary(rep, None, sb)
    return rep


def stage_activation_bytes(spec: ModelSpec, layers, layout, ctx: ActivationContext, n_in_flight, *,
                           holds_embedding: bool, holds_head: bool, per_kind: dict | None = None):
    """Activation bytes a rank of a stage holds at its peak. Array-safe in the layout's degrees.

    ``layers``: the block indices on the stage. Blocks of the same kind (dense or MoE) save the same
    bytes; ``per_kind`` may pass {is_moe: layer_activation_bytes(...)} computed once for many stages.
    """
    parts = stage_activation_parts(spec, layers, layout, ctx, n_in_flight, holds_embedding=holds_embedding,
                                   holds_head=holds_head, per_kind=per_kind)
    return sum(v for k, v in parts.items() if not k.startswith("per_layer"))


def stage_activation_parts(spec: ModelSpec, layers, layout, ctx: ActivationContext, n_in_flight, *,
                           holds_embedding: bool, holds_head: bool, per_kind: dict | None = None) -> dict:
    """The terms of ``stage_activation_bytes``: 'blocks' (what every block keeps × blocks × micro-batches in flight),
    'working_set' (one block re-materialised under full/op recomputation), 'embedding_mask', 'head_inputs'; plus
    'per_layer:<kind>' (what one block of each kind keeps for one micro-batch) for explanations."""
    e = ctx.elem_bytes
    tsh = _tsh(layout)
    sbh = ctx.seq_len / layout.cp * layout.micro_batch * spec.hidden_size
    code = recompute_code(layout.recompute)
    frac = getattr(layout, "recompute_fraction", 1.0)
    full_in = layer_input_bytes(spec, layout, ctx)
    out = {"blocks": 0.0, "working_set": 0.0}
    for layer, count in layer_kinds(spec, layers).items():
        tot, sc = per_kind[spec.is_moe_layer(layer)] if per_kind else layer_activation_bytes(spec, layer, layout, ctx)
        op = op_saved_bytes(spec, layer, layout, ctx)
        kept = xp.where(code == 2, full_in, xp.where(code == 1, tot - sc, xp.where(code == 3, op, tot)))
        kept = frac * kept + (1 - frac) * tot            # a fraction of the blocks is checkpointed
        out[f"per_layer:{'moe' if spec.is_moe_layer(layer) else 'dense'}"] = kept
        out["blocks"] = out["blocks"] + count * kept * n_in_flight
        out["working_set"] = xp.maximum(out["working_set"], xp.where(code >= 2, tot, 0.0))  # one block re-materialised
    out["embedding_mask"] = sbh / tsh * n_in_flight if holds_embedding and ctx.dropout else 0.0   # 1-byte mask
    out["head_inputs"] = 2 * e * sbh / tsh * n_in_flight if holds_head else 0.0                   # final norm, head
    return out


def layer_kinds(spec: ModelSpec, layers) -> dict[int, int]:
    """Group block indices by kind: {representative index: count} (dense blocks, MoE blocks)."""
    out: dict[int, int] = {}
    rep = {}
    for i in layers:
        kind = spec.is_moe_layer(i)
        if kind not in rep:
            rep[kind] = i
        out[rep[kind]] = out.get(rep[kind], 0) + 1
    return out


RECOMPUTE_CODES = {r.value: r.code for r in Recompute}
"""'none' 0, 'selective' 1, 'full' 2, 'op' 3 (``layout.Recompute.code``)."""


def recompute_code(recompute):
    """'none' 0, 'selective' 1, 'full' 2, 'op' 3 (arrays pass through)."""
    if isinstance(recompute, str):
        return RECOMPUTE_CODES[recompute]
    return recompute


def _stage_memory(spec: ModelSpec, layout: Layout, st: StageTensors, sb: StateBytes, ctx: ActivationContext,
                  m: int, ov: Overheads, recipe: Recipe = DEFAULT, precision: str = "bf16-mixed") -> StageMemory:
    rs = rank_states(st.tensors, spec, layout, sb, recipe, precision)
    states = rs.gpu
    n = in_flight(layout, st.stage, m) + (overlap_extra_in_flight(layout) if ctx.ep_overlap else 0.0)
    acts = stage_activation_bytes(spec, st.layers, layout, ctx, n, holds_embedding=st.holds_embedding,
                                  holds_head=st.holds_head)
    if recipe.lora is not None:  # adapters' r-wide intermediates (base activations as for full training)
        acts = acts + n * sum(lora_activation_bytes(spec, i, layout, ctx, recipe.lora) for i in st.layers)
    unit_w, unit_g = largest_unit_bytes(spec, layout, st, sb)
    bucket_g = largest_unit_bytes(spec, layout, st, sb, root=False)[1]
    unit_p = unit_w / sb.weights
    if precision == "fp8-mixed":  # gathered units hold FP8 copies too (or are gathered in FP8)
        unit_w = unit_w / sb.weights * fsdp_unit_weight_bytes(recipe.fp8)
    if recipe.lora is not None:  # frozen base: gathered NF4/bf16 weights, adapter gradients only
        unit_w = unit_w * (nf4_bits_per_weight(recipe.lora) / 16 if recipe.lora.quantize_base == "nf4" else 1.0)
        unit_g = bucket_g = 0.0
    other = stage_overheads(spec, layout, ctx, ov, n_in_flight=n, acts=acts, gradient_bytes=states.gradients,
                            unit_weight_bytes=unit_w, unit_grad_bytes=unit_g, holds_head=st.holds_head,
                            has_moe=any(spec.is_moe_layer(i) for i in st.layers), unit_params=unit_p,
                            bucket_grad_bytes=bucket_g)
    other = {k: int(v) for k, v in other.items() if v > 0}
    other.update(rs.other)
    return StageMemory(stage=st.stage, rank=st.stage * layout.tp * layout.cp * layout.dp, layers=len(st.layers),
                       params=states.params_local, expert_params=states.expert_params_local, weights=states.weights, gradients=states.gradients,
                       optimizer=states.optimizer, master_weights=states.master, moments=states.moments,
                       activations=int(acts), in_flight=float(n), other=other,
                       holds_embedding=st.holds_embedding, holds_head=st.holds_head, host=rs.host)




def _explain(rep: MemoryReport, spec: ModelSpec, sb: StateBytes, ctx: ActivationContext) -> dict[str, str]:
    w, lay = rep.worst, rep.layout
    st = next(t for t in stage_tensors(spec, lay) if t.stage == w.stage)
    parts = stage_activation_parts(spec, st.layers, lay, ctx, w.in_flight, holds_embedding=st.holds_embedding,
                                   holds_head=st.holds_head)
    if rep.recipe.lora is not None:    # the adapters' r-wide intermediates, as _stage_memory adds them
        parts["adapters"] = w.in_flight * sum(lora_activation_bytes(spec, i, lay, ctx, rep.recipe.lora) for i in st.layers)
    return explain_report(rep, spec, sb, ctx, parts)
