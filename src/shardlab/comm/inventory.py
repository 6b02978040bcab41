"""The communication inventory of a training layout: every collective one step issues, per rank.

Sources (``formulas.md`` "Communication"):
- TP, Megatron (Shoeybi et al. 2019, arXiv 1909.08053 §3): per layer one all-reduce after the attention
  output projection and one after the MLP down projection in forward ("g"), two in backward ("f"), each
  of b·s·h elements; vocabulary-parallel embedding (one all-reduce forward), output head (one backward) and
  cross-entropy (three all-reduces of b·s fp32 values: max, target logit, sum of exponentials).
- SP (Korthikanti et al. 2022, arXiv 2205.05198 §4.2.2): each all-reduce becomes an all-gather +
  reduce-scatter pair of the same total volume.
- PP (Narayanan et al. 2021, arXiv 2104.04473 §2.2): one send/recv of b·s·h elements per micro-batch per
  stage boundary each way (÷ t with sequence parallelism, Megatron sends the scattered tensor), v times
  per rank with v virtual chunks.
- DP (PyTorch DDP, Li et al. 2020, arXiv 2006.15704): one all-reduce of all gradients per step, in 25 MiB
  buckets overlapped with backward.
- ZeRO-1/2 (Rajbhandari et al. 2019 §7): reduce-scatter of gradients + all-gather of updated parameters
  (2Ψ); ZeRO-3 / FSDP: all-gather of each unit's parameters in forward and again in backward,
  reduce-scatter of gradients (3Ψ). Expert tensors reduce over the expert-data-parallel group dp·cp/ep.
- EP (Lepikhin et al. 2020, GShard; DeepSpeed-MoE): two all-to-alls (dispatch, combine) per MoE layer
  forward, two backward, each rank sending its b·s·k token copies; with TP (experts split by TP, Megatron-core's
  alltoall dispatcher) each TP rank sends its 1/t share, the TP group all-gathers what its members received
  and reduce-scatters the experts' output, in place of the MLP's own TP pair; before each forward dispatch
  the TP × EP group all-gathers its per-expert token counts (E int64 per rank).
- CP, ring attention (Liu et al. 2023, arXiv 2310.01889; Megatron-core context parallel): per layer cp−1
  send/recv steps of the local K/V block forward, K/V plus dK/dV backward, overlapped with attention.
"""

from __future__ import annotations

from shardlab.comm.inventory_dp import dp_items
from shardlab.comm.inventory_items import DDP_BUCKET_BYTES, CommItem, grad_wire_bytes, item as _item
from shardlab.comm.moe_dispatch import MoeDispatch
from shardlab.comm.pricing import ep_all_to_all_s
from shardlab.layout import Layout
from shardlab.layout_checks import validate
from shardlab.rank_grid import axis_stride, group_span_nodes
from shardlab.memory.precision import state_bytes
from shardlab.memory.states import stage_tensors
from shardlab.specs.hardware import Cluster
from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import TensorSpec, kv_width_local

__all__ = ["DDP_BUCKET_BYTES", "CommItem", "grad_wire_bytes", "layout_collectives", "summarize"]
"""The rows' type, the DDP bucket size and the gradient wire bytes live in ``comm.inventory_items``; the data-parallel
rows in ``comm.inventory_dp``."""


def layout_collectives(spec: ModelSpec, layout: Layout, cluster: Cluster, *, seq_len: int, microbatches: int,
                       precision: str = "bf16-mixed", framework=None, grad_reduce_bytes: int | None = None,
                       stage: int | None = None) -> list[CommItem]:
    """Every collective of one training step for ``layout`` on ``cluster`` (see the module doc for sources).

    Counts are per rank for the busiest pipeline stage (most layers, ties to the later stage, with its first- or
    last-stage calls; ``stage``: the step model's slowest stage instead, which the MoE all-to-all overlap can make
    another one; the data-parallel terms for the stage with most parameters). Activation
    messages carry b·(s/cp)·h elements of the compute dtype; parameters use the precision's bytes
    (``memory.precision.state_bytes``), gradients the reduction dtype (``grad_wire_bytes``: fp32 for Megatron-LM
    under bf16, ``--grad-reduce-fp32/-bf16``). Links come from the rank grid: a group whose members span
    more than one node (``rank_grid.group_span_nodes``) uses the inter-node link (``_price``). ``framework`` (a
    Framework profile, or an estimate's Workload built from one) adds its mechanisms: DeepSpeed ZeRO-3 gathers the
    weights again for a recomputed forward.
    """
    validate(layout, spec, seq_len=seq_len)
    sb = state_bytes(precision, "adamw")
    e = sb.weights                                 # activation element bytes (compute dtype)
    gb = grad_wire_bytes(framework, precision, grad_reduce_bytes) or sb.gradients   # bytes per reduced gradient element
    b, h, t, m = layout.micro_batch, spec.hidden_size, layout.tp, microbatches
    s = seq_len / layout.cp                        # local sequence length
    gpn = cluster.gpus_per_node
    span = {ax: group_span_nodes(layout, ax, gpn) for ax in ("tp", "cp", "dp_shard", "ep")}
    stages = stage_tensors(spec, layout)
    L = max(len(st.layers) for st in stages)       # layers on the busiest pipeline rank
    busiest = max(range(len(stages)), key=lambda i: (len(stages[i].layers), i))   # ties: the later stage (the head's)
    moe_L = max(sum(spec.is_moe_layer(i) for i in st.layers) for st in stages)
    if stage is not None and 0 <= stage < len(stages):   # the step model's slowest stage (``stage``) instead
        busiest, L = stage, len(stages[stage].layers)
        moe_L = sum(spec.is_moe_layer(i) for i in stages[stage].layers)
    first, last = busiest == 0, busiest == len(stages) - 1   # its embedding (first stage) and head (last stage) calls
    sp = layout.sequence_parallel and t > 1
    act = b * s * h * e                            # (b, s/cp, h) activation tensor, bytes
    recompute_fwd = layout.recompute == "full"
    mods = set(layout.recompute_modules or ("core_attn",)) if layout.recompute == "selective" else set()
    rerun_ep = recompute_fwd or "moe" in mods      # the MoE layer's forward re-run in backward (its all-to-alls too)
    moe = getattr(framework, "moe", None) or MoeDispatch()
    out: list[CommItem] = []

    # ---- tensor parallel (and sequence parallel) ---------------------------------------------------
    if t > 1:
        # per layer and pass one TP pair for attention and one for the MLP; a MoE layer leaves the MLP's to the expert
        # dispatcher (below), unless a shared expert runs beside the routed ones
        moe_busy = sum(spec.is_moe_layer(i) for i in stages[busiest].layers)
        pairs = 2 * L - (moe_busy if spec.moe is not None and not spec.moe.shared_width else 0)
        mlp_note = " (attention alone in a MoE layer: the dispatcher gathers for its experts)" if pairs < 2 * L else ""
        # selective recomputation of an MLP re-runs its TP pair too: a dense block's ('mlp'), a MoE block's shared
        # expert ('moe' or 'shared_experts')
        reruns = sum(1 for i in stages[busiest].layers
                     if ("mlp" in mods if not spec.is_moe_layer(i) else
                         bool(spec.moe.shared_width) and bool({"moe", "shared_experts"} & mods)))
        fwd, bwd = pairs * m, (2 if recompute_fwd else 1) * pairs * m + reruns * m
        rnote = (" (+2 per layer re-run by full recomputation)" if recompute_fwd else
                 f" (+{reruns} per micro-batch: MLPs re-run by selective recomputation)" if reruns else "")
        if sp:
            for phase, calls in (("forward", fwd), ("backward", bwd)):
                out.append(_item("SP", "all-gather", phase, act, calls, t, span["tp"], cluster, "critical",
                                 "all-gather of (b, s, h) before QKV and before the MLP" + mlp_note
                                 + (rnote if phase == "backward" else "")))
                out.append(_item("SP", "reduce-scatter", phase, act, calls, t, span["tp"], cluster, "critical",
                                 "reduce-scatter of (b, s, h) after attention out-proj and MLP down-proj" + mlp_note))
        else:
            out.append(_item("TP", "all-reduce", "forward", act, fwd, t, span["tp"], cluster, "critical",
                             "Megatron g: all-reduce of (b, s, h) after attention out-proj and after MLP down-proj"
                             + mlp_note))
            out.append(_item("TP", "all-reduce", "backward", act, bwd, t, span["tp"], cluster, "critical",
                             "Megatron f: all-reduce of the input gradient before QKV and before the MLP" + mlp_note
                             + rnote))
        if sp and first:
            out.append(_item("SP", "reduce-scatter", "forward", act, m, t, span["tp"], cluster, "critical",
                             "vocabulary-parallel embedding output, scattered along the sequence (first stage)"))
            out.append(_item("SP", "all-gather", "backward", act, m, t, span["tp"], cluster, "critical",
                             "gradient of the embedding's scatter, gathered back to (b, s, h) (first stage; with the "
                             "forward reduce-scatter, the bytes of the estimate's one all-reduce)"))
        if sp and last:
            out.append(_item("SP", "all-gather", "forward", act, m, t, span["tp"], cluster, "critical",
                             "gather the sequence before the column-parallel output head (last stage)"))
            out.append(_item("SP", "reduce-scatter", "backward", act, m, t, span["tp"], cluster, "critical",
                             "input gradient of the output head, scattered back (last stage)"))
        if not sp and first:
            out.append(_item("TP", "all-reduce", "forward", act, m, t, span["tp"], cluster, "critical",
                             "vocabulary-parallel embedding output (first stage)"))
        if not sp and last:
            out.append(_item("TP", "all-reduce", "backward", act, m, t, span["tp"], cluster, "critical",
                             "input gradient of the column-parallel output head (last stage)"))
        if last:
            out.append(_item("TP", "all-reduce", "forward", 3 * 4 * b * s, m, t, span["tp"], cluster, "critical",
                             "vocabulary-parallel cross-entropy: max, target logit, Σexp (3 × b·s fp32, counted as one call)"))

    # ---- context parallel: ring attention ------------------------------------------------------------
    if layout.cp > 1:
        kv_bytes = b * s * kv_width_local(spec, t) * e     # (b, s/cp, K+V width) block; MLA: up-projected K and V
        steps = layout.cp - 1
        out.append(_item("CP", "send-recv", "forward", kv_bytes, L * m * steps, layout.cp, span["cp"], cluster,
                         "overlappable", f"ring attention: pass the local K/V block around the ring ({steps} steps per layer)"))
        out.append(_item("CP", "send-recv", "backward", kv_bytes, 2 * L * m * steps, layout.cp, span["cp"], cluster,
                         "overlappable", "ring attention backward: K/V and their gradients dK/dV travel the ring "
                         "(two messages per step)"))
        if recompute_fwd:                           # the re-run forward passes the K/V ring again (estimate: cp_per_block_s)
            out.append(_item("CP", "send-recv", "backward", kv_bytes, L * m * steps, layout.cp, span["cp"], cluster,
                             "overlappable", "ring attention of the forward re-run by full recomputation"))

    # ---- pipeline parallel ------------------------------------------------------------------------
    if layout.pp > 1:
        pp_span = 2 if axis_stride(layout, "pp") >= gpn or group_span_nodes(layout, "pp", gpn) > 1 else 1
        msg = act / t                          # Megatron's scatter/gather: each TP rank sends 1/t (Narayanan 2021 §4.1)
        ov = "overlappable" if layout.schedule == "interleaved" else "critical"
        pnote = ("Megatron overlaps interleaved p2p with compute (overlap_p2p_comm); the step-time estimate still "
                 "charges it in full (pp_p2p_s), an upper bound" if ov == "overlappable"
                 else "on the critical path while the pipeline fills and drains")
        calls = m * layout.vpp
        out.append(_item("PP", "send-recv", "forward", msg, calls, 2, pp_span, cluster, ov,
                         f"activations (b, s, h/t per TP rank: scatter/gather, re-gathered over the node's link) to the next "
                         f"stage, per micro-batch per chunk; {pnote}"))
        out.append(_item("PP", "send-recv", "backward", msg, calls, 2, pp_span, cluster, ov,
                         "activation gradients to the previous stage, per micro-batch per chunk"))
        if spec.tied_embeddings:
            wb = TensorSpec("output.weight", (spec.vocab_size, spec.embedding_dim), spec.num_layers, "head",
                            tp_dim=0).local_numel(spec, t, layout.ep) * gb    # the last stage's copy (memory.states)
            out.append(_item("PP", "all-reduce", "step", wb, 1, 2, pp_span, cluster, "critical",
                             "tied embedding: first and last stage all-reduce the shared matrix's gradient (Megatron)"))

    out += dp_items(spec, layout, cluster, stages=stages, busiest=busiest, L=L, m=m, sb=sb, gb=gb,
                    span_dp=span["dp_shard"], framework=framework, recompute_fwd=recompute_fwd)

    # ---- expert parallel -------------------------------------------------------------------------
    if moe_L and (layout.ep > 1 or t > 1):
        k = spec.moe.top_k
        routed = b * s * k * h * e                  # the TP group's b·s tokens, k copies each, h wide
        et = layout.expert_tp                       # the experts' TP (layout.expert_grid): etp/t of the copies gather
        f = moe.expert_imbalance                   # the busiest rank receives f × the mean copies
        deepep = moe.dispatcher == "deepep" and layout.ep > 1    # without EP the alltoall dispatcher's TP path runs
        for phase in ("forward", "backward"):
            passes = (2 if phase == "backward" and rerun_ep else 1) * moe_L * m   # estimate: ep_per_moe_block_s
            rnote = (" (+1 per MoE layer re-run by " + ("full" if recompute_fwd else "selective") + " recomputation)"
                     if phase == "backward" and rerun_ep else "")
            if layout.ep > 1:
                one = float(ep_all_to_all_s(cluster, tp=t, cp=layout.cp, ep=layout.ep, size=routed / t * f, top_k=k,
                                            dispatcher=moe.dispatcher, stride=axis_stride(layout, "ep") if et < t
                                            else None)) if deepep else None
                out.append(_item("EP", "all-to-all", phase, routed / t * f, 2 * passes, layout.ep, span["ep"], cluster,
                                 "critical", ("DeepEP dispatch and combine: each token once per remote node holding "
                                              "one of its experts, forwarded over NVLink" if deepep else
                                              f"MoE dispatch and combine: {k} copies of each token to its experts and "
                                              "back")
                                 + (f" (each TP rank sends its 1/{t} share)" if t > 1 else "")
                                 + (f" (the busiest rank: {f:g}× the mean)" if f != 1.0 else "")
                                 + rnote.replace("+1", "+2"), total_s=2 * passes * one if deepep else None))
            counts = moe_L * m if (phase == "forward" or rerun_ep) and not deepep else 0   # forward passes
            if counts:
                E = spec.moe.num_experts
                out.append(_item("EP", "all-gather", phase, et * layout.ep * E * 8, counts, et * layout.ep, span["ep"],
                                 cluster, "critical", f"the dispatcher's token counts: {E} int64 per rank over the "
                                 f"{'TP' if et == t else 'expert-TP'} × EP group, so each rank knows what it receives "
                                 "(Megatron-core's preprocess)"
                                 + (" (the re-run forward's)" if phase == "backward" else "")))
            if et > 1:
                gathered = routed * et / t          # the copies of the etp ranks' shards
                out.append(_item("EP", "all-gather", phase, gathered, passes, et, span["tp"], cluster, "critical",
                                 "expert TP: gather the token copies the TP group received (experts split by TP; "
                                 + ("the flex dispatcher's TP part, priced as the alltoall dispatcher's)" if deepep
                                    else "Megatron-core alltoall dispatcher)") + rnote))
                out.append(_item("EP", "reduce-scatter", phase, gathered, passes, et, span["tp"], cluster, "critical",
                                 "expert TP: reduce-scatter the experts' output before the combine" + rnote))
    return out


def summarize(items: list[CommItem]) -> dict:
    """Totals per step: all, critical (compute waits) and overlappable seconds, and by axis."""
    by_axis: dict[str, float] = {}
    for it in items:
        by_axis[it.axis] = by_axis.get(it.axis, 0.0) + it.time_per_step_s
    return {"total_s": sum(i.time_per_step_s for i in items),
            "critical_s": sum(i.time_per_step_s for i in items if i.overlap == "critical"),
            "overlappable_s": sum(i.time_per_step_s for i in items if i.overlap == "overlappable"),
            "by_axis_s": by_axis}
