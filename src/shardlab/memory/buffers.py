"""A rank's named overheads beyond model states and activations (CUDA context, NCCL and bucket buffers, FSDP's
gathered units, logits, pipeline/TP/CP/EP working buffers, fragmentation; each default and its source in
``memory/overheads.py``), and the unit sizes the data-parallel buffers scale with. Array-safe: the planner
evaluates them over many layouts at once."""

from __future__ import annotations

from shardlab import xp
from shardlab.layout import Layout, expert_tp_of
from shardlab.memory.activations import ActivationContext, _tsh
from shardlab.memory.overheads import Overheads
from shardlab.memory.precision import StateBytes
from shardlab.memory.states import StageTensors
from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import PRE, kv_width_local, model_tensors


def stage_overheads(spec: ModelSpec, layout, ctx: ActivationContext, ov: Overheads, *, n_in_flight, acts,
                    gradient_bytes, unit_weight_bytes, unit_grad_bytes, holds_head: bool, has_moe: bool,
                    unit_params=None, bucket_grad_bytes=None) -> dict:
    """Named overheads of a stage's rank (see Overheads for each default and its source). Array-safe.

    Returns {name: bytes}; fragmentation applies to the dynamic part (activations, logits, buffers). ``unit_params``
    (parameters of the largest unit) lets a module-wise ZeRO-3 (``ov.zero3_live_params``) cap its gathered buffers;
    ``bucket_grad_bytes`` (the largest block, embedding or head's gradients; default ``unit_grad_bytes``) sizes the
    ZeRO-1/2 reduction buckets.
    """
    e, t = ctx.elem_bytes, layout.tp
    tsh = _tsh(layout)
    s_l = ctx.seq_len / layout.cp
    sbh = s_l * layout.micro_batch * spec.hidden_size
    D = layout.dp * layout.cp
    z = layout.zero
    other: dict = {"cuda_context": ov.cuda_context_bytes, "library_workspace": ov.library_workspace_bytes}
    if holds_head:
        vocab_local = -(-spec.vocab_size // t)
        n_last = n_in_flight if not _scalar_eq(layout.pp, 1) else 1.0
        # fp32 log-softmax kept per micro-batch in flight, plus the logits and their fp32 gradient; a fused loss
        # writes the gradient into the logits' own buffer
        per_logit = e if ctx.fused_loss else 4 * n_last + e + 4
        other["logits_and_loss"] = s_l * layout.micro_batch * vocab_local * per_logit
    groups = [t, layout.cp, D, layout.pp, layout.ep]
    other["nccl_buffers"] = sum((g > 1) * 1 for g in groups) * ov.nccl_bytes_per_group
    other["ddp_buckets"] = xp.where((z == 0) & (D > 1) & ov.ddp_bucket_copy, gradient_bytes, 0)
    bucket = unit_grad_bytes if bucket_grad_bytes is None else bucket_grad_bytes
    other["zero_buckets"] = xp.where(((z == 1) | (z == 2)) & (D > 1), ov.zero_bucket_layers * bucket, 0)
    prefetch = 1 if getattr(layout, "wrap", 1) == 0 else ov.fsdp_prefetch_units   # one unit: nothing to prefetch
    gathered, reducing = prefetch * unit_weight_bytes, ov.fsdp_reduce_scatter_units * unit_grad_bytes
    if ov.zero3_live_params > 0 and unit_params is not None:
        # DeepSpeed gathers module by module and releases past max_live_parameters (partitioned_param_coordinator.py);
        # a module is gathered whole, so the largest one sets a floor
        big = largest_module_params(spec, layout.tp, layout.ep, getattr(layout, "etp", None))
        per_w, per_g = unit_weight_bytes / xp.maximum(unit_params, 1), unit_grad_bytes / xp.maximum(unit_params, 1)
        gathered = xp.minimum(gathered, xp.maximum(ov.zero3_live_params, big) * per_w)
        reducing = xp.minimum(reducing, xp.maximum(ov.zero3_reduce_bucket_params, big) * per_g)
    other["fsdp_buffers"] = xp.where((z == 3) & (D > 1), gathered + reducing, 0)
    other["pp_p2p"] = xp.where(layout.pp > 1, 2 * e * sbh / tsh, 0)
    other["tp_sp_gather"] = xp.where((t > 1) & (layout.sequence_parallel == True), e * sbh, 0)  # noqa: E712 (arrays)
    kv_w = kv_width_local(spec, t)  # K and V together
    other["cp_kv_blocks"] = xp.where(layout.cp > 1, 2 * e * s_l * layout.micro_batch * kv_w, 0)  # double-buffered
    if has_moe:
        # with the experts over etp < tp ranks a rank dispatches the copies of etp/tp of the TP group's tokens
        other["ep_all_to_all"] = xp.where(layout.ep > 1, 2 * e * spec.moe.top_k * sbh
                                          * expert_tp_of(t, getattr(layout, "etp", None)) / t, 0)
    if not ov.working_buffers:
        for k in ("logits_and_loss", "pp_p2p", "tp_sp_gather", "cp_kv_blocks", "ep_all_to_all"):
            other.pop(k, None)
    dynamic = sum(v for k, v in other.items() if k not in ("cuda_context", "library_workspace", "nccl_buffers"))
    other["fragmentation"] = ov.fragmentation * (acts + dynamic)
    return other


def _scalar_eq(x, v) -> bool:
    return not xp.is_array(x) and x == v


def largest_module_params(spec: ModelSpec, tp=1, ep=1, etp=None):
    """Parameters per rank of the largest single weight tensor (≈ module) of the model: what a module-wise ZeRO-3
    must gather at once (``etp``: the experts' TP, ``Layout.etp``). Array-safe in tp and ep."""
    kinds: dict[bool, int] = {}
    for i in range(spec.num_layers):
        kinds.setdefault(spec.is_moe_layer(i), i)
    wanted = {PRE, spec.num_layers, *kinds.values()}
    big = 0
    for t in model_tensors(spec):
        if t.layer in wanted:
            big = xp.maximum(big, t.local_numel(spec, tp, ep, None, etp))
    return big


def largest_unit_bytes(spec: ModelSpec, layout: Layout, st: StageTensors, sb: StateBytes,
                       root: bool = True) -> tuple[float, float]:
    """Unsharded weight and gradient bytes of the largest FSDP/bucket unit: a block, ``layout.wrap`` consecutive
    blocks, or (wrap 0) the whole stage. The embedding, final norm and head the stage holds form one more unit, the
    root: what FSDP's root wrapper owns once the blocks are wrapped (FSDP1's transformer auto-wrap policy; FSDP2's
    ``fully_shard(model)`` after the blocks, as torchtitan's apply_fsdp did), gathered together in the root's
    pre-forward. Setups that wrap the embedding and the head on their own hold smaller units than this. ``root=False``: the
    embedding and the head count separately (the largest single module: a ZeRO-1/2 gradient bucket's unit)."""
    per_layer: dict[int, int] = {}
    for t in st.tensors:
        per_layer[t.layer] = per_layer.get(t.layer, 0) + t.local_numel(spec, layout.tp, layout.ep, None, layout.etp)
    blocks = [per_layer[i] for i in sorted(per_layer) if 0 <= i < spec.num_layers]
    edges = [v for i, v in per_layer.items() if not 0 <= i < spec.num_layers]
    n = getattr(layout, "wrap", 1)
    if n == 0:
        units = [sum(per_layer.values())]
    else:
        units = [sum(blocks[i:i + n]) for i in range(0, len(blocks), n)] + ([sum(edges)] if root else edges)
    biggest = max(units, default=0)
    return biggest * sb.weights, biggest * sb.gradients
