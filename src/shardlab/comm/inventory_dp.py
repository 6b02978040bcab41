"""The data-parallel rows of the communication inventory (``comm.inventory.layout_collectives``): DDP's bucketed
all-reduce, ZeRO-1/2's reduce-scatter and all-gather, ZeRO-3/FSDP's per-unit gathers and reduce-scatters (with the root
unit and DeepSpeed's module-wise release), and hybrid sharding's replica all-reduce. Sources: ``comm.inventory``'s
module doc (Li et al. 2020; Rajbhandari et al. 2019 §7; Zhao et al. 2023 §3.3)."""

from __future__ import annotations

import math

from shardlab.comm.inventory_items import DDP_BUCKET_BYTES, CommItem, dp_stream_s, item
from shardlab.layout import Layout
from shardlab.specs.hardware import Cluster
from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import PRE


def dp_items(spec: ModelSpec, layout: Layout, cluster: Cluster, *, stages: list, busiest: int, L: int, m: int, sb,
             gb: int, span_dp: int, framework, recompute_fwd: bool) -> list[CommItem]:
    """The data-parallel, ZeRO/FSDP and hybrid-sharding calls of one step, per rank: ``stages`` the pipeline stages'
    tensors (``memory.states.stage_tensors``), ``busiest`` the pace-setting stage and ``L`` its blocks, ``m``
    micro-batches, ``sb`` the precision's state bytes, ``gb`` bytes per reduced gradient element, ``span_dp`` the nodes
    the sharding group spans, ``framework`` the profile (or Workload) whose mechanisms apply."""
    t = layout.tp
    out: list[CommItem] = []
    # ---- data parallel / ZeRO / FSDP ----------------------------------------------------------------
    # the stage whose data-parallel calls take longest (ZeRO-0/1/2, as the step model reports them; a dense first stage
    # can outweigh MoE stages whose experts need no reduction); ZeRO-3's per-micro-batch calls: the busiest stage's
    def dp_weight(i, d, ex):
        if layout.zero == 3:          # per micro-batch, on the critical path of the busiest stage (the pace setter)
            return float(i == busiest)
        ops = ("all-reduce",) if layout.zero == 0 else ("reduce-scatter", "all-gather", "replica-all-reduce")
        return sum(dp_stream_s(cluster, layout, op, grp, n * (sb.weights if op == "all-gather" else gb)) for op in ops
                   for grp, n in (("dense", d), ("expert", ex)))
    dense_n = expert_n = root_n = 0
    best = -1.0
    for i, st in enumerate(stages):
        d = sum(x.local_numel(spec, t, layout.ep) for x in st.tensors if x.component != "experts")
        ex = sum(x.local_numel(spec, t, layout.ep, None, layout.etp) for x in st.tensors if x.component == "experts")
        w = dp_weight(i, d, ex)
        if w > best:
            best, dense_n, expert_n = w, d, ex
            # the root unit: what no block holds (embedding, final norm, head)
            root_n = sum(x.local_numel(spec, t, layout.ep) for x in st.tensors if x.layer in (PRE, spec.num_layers))
    wrap = layout.wrap                              # FSDP wraps every `wrap` blocks (0: the model is one unit)
    units = 1 if wrap == 0 else -(-L // wrap) + 1   # plus the root unit (embedding, final norm, head)
    for label, numel, n, grp in (("", dense_n, layout.dp_shard, "dense"), (" (experts)", expert_n, layout.expert_dp, "expert")):
        if numel == 0 or n == 1:
            continue
        dspan = min(span_dp, n)
        gbytes, wbytes = numel * gb, numel * sb.weights
        buckets = max(1, math.ceil(gbytes / DDP_BUCKET_BYTES))
        stream = lambda op, nbytes: dp_stream_s(cluster, layout, op, grp, nbytes)   # noqa: E731
        if layout.zero == 0:
            out.append(item("DP", "all-reduce", "backward", gbytes / buckets, buckets, n, dspan, cluster, "overlappable",
                             f"gradients{label} in {DDP_BUCKET_BYTES // 2**20} MiB buckets during backward (DDP); the "
                             "last bucket is exposed", total_s=stream("all-reduce", gbytes)))
        elif layout.zero in (1, 2):
            per_step = m if layout.zero == 2 else 1  # ZeRO-2 (DeepSpeed) reduces every micro-batch; ZeRO-1 at the end
            out.append(item("ZeRO", "reduce-scatter", "backward", gbytes / buckets, buckets * per_step, n, dspan, cluster,
                             "overlappable", f"ZeRO-{layout.zero}: reduce-scatter gradients{label} in buckets during backward"
                             + (" of every micro-batch (DeepSpeed)" if layout.zero == 2 else " of the last micro-batch"),
                             total_s=per_step * stream("reduce-scatter", gbytes)))
            out.append(item("ZeRO", "all-gather", "step", wbytes / buckets, buckets, n, dspan, cluster, "critical",
                             f"ZeRO-{layout.zero}: all-gather updated parameters{label} after the optimizer step "
                             "(Megatron's --overlap-param-gather hides it behind the next forward)",
                             total_s=stream("all-gather", wbytes)))
        else:
            # DeepSpeed ZeRO-3's traffic leaves through each rank's own NIC (Framework.zero3_comm_per_gpu_nic)
            z3nic = bool(getattr(framework, "zero3_comm_per_gpu_nic", False))

            def fsdp(*a):
                return item(*a, per_gpu_nic=z3nic)
            modulewise = bool(getattr(framework, "zero3_live_params", 0))
            regather = framework is not None and framework.zero3_regather_for_recompute and recompute_fwd
            # the blocks are `units - 1` units of equal size; the root unit (embedding, final norm, head) has its own
            bunits = units - 1 if units > 1 else 1
            root = root_n if label == "" and units > 1 else 0
            bw, bg = (numel - root) * sb.weights / bunits, (numel - root) * gb / bunits
            ov = "overlappable" if units > 1 else "critical"
            what = "block unit's" if units > 1 else "unit's"
            out.append(fsdp("FSDP", "all-gather", "forward", bw, bunits * m, n, dspan, cluster, ov,
                             f"ZeRO-3/FSDP: gather each {what} parameters{label} before its forward"
                             + (" (prefetched)" if units > 1 else " (one unit: nothing to hide it under)")))
            if units > 1:
                # FSDP1 and FSDP2 (reshard_after_forward left at its default) keep the root gathered from forward
                # through backward (torch/distributed/fsdp/_runtime_utils.py, _fully_shard/_fsdp_state.py);
                # torchtitan and shardlab's runtime reshard the root and keep the last block instead: as many calls,
                # one root's bytes in place of one block's. DeepSpeed's module-wise ZeRO-3 releases every module
                out.append(fsdp("FSDP", "all-gather", "backward", bw, bunits * m, n, dspan, cluster, ov,
                                 f"ZeRO-3/FSDP: gather each block unit's parameters{label} again for backward (resharded "
                                 "after forward)" + ("" if modulewise or not root else "; the root unit stays gathered")))
            if regather:   # blocks only: recomputation re-runs the blocks' forward, not the embedding or the head
                out.append(fsdp("FSDP", "all-gather", "backward", bw, bunits * m, n, dspan, cluster, ov,
                                 f"{getattr(framework, 'id', None) or framework.framework} ZeRO-3: gather once more for the "
                                 f"recomputed forward (weights released after each module's forward){label}"))
            out.append(fsdp("FSDP", "reduce-scatter", "backward", bg, bunits * m, n, dspan, cluster, ov,
                             f"ZeRO-3/FSDP: reduce-scatter each {what} gradients{label} in every micro-batch's backward "
                             "(FSDP2's default; set_requires_gradient_sync(False) trades it for unsharded gradients)"))
            if root:
                rw, rg = root * sb.weights, root * gb
                out.append(fsdp("FSDP", "all-gather", "forward", rw, m, n, dspan, cluster, "critical",
                                 "ZeRO-3/FSDP: gather the root unit (embedding, final norm, head) before the first block: "
                                 "nothing runs before it"))
                if modulewise:
                    out.append(fsdp("FSDP", "all-gather", "backward", rw, m, n, dspan, cluster, "critical",
                                     "DeepSpeed ZeRO-3: gather the embedding and head again for backward (module-wise release)"))
                out.append(fsdp("FSDP", "reduce-scatter", "backward", rg, m, n, dspan, cluster, "critical",
                                 "ZeRO-3/FSDP: reduce-scatter the root unit's gradients after the last backward: nothing "
                                 "runs after it"))

    # ---- hybrid sharding: replicas all-reduce their gradient shards ----------------------------------------
    rep = layout.dp_replicate
    if rep > 1 and layout.zero >= 1:
        per_unit = layout.zero == 3
        for label, numel, shard, grp in (("", dense_n, layout.dp_shard, "dense"),
                                         (" (experts)", expert_n, layout.expert_dp, "expert")):
            if not numel:
                continue
            shard_bytes = numel / max(shard, 1) * gb
            calls = units * m if per_unit else max(1, math.ceil(shard_bytes / DDP_BUCKET_BYTES)) * (m if layout.zero == 2 else 1)
            stream = None if per_unit else (m if layout.zero == 2 else 1) * dp_stream_s(
                cluster, layout, "replica-all-reduce", grp, numel * gb)
            out.append(item("HSDP", "all-reduce", "backward", shard_bytes / (units if per_unit else calls), calls, rep,
                             min(rep, cluster.num_nodes), cluster, "overlappable",
                             f"hybrid sharding: {rep} replicas all-reduce each gradient shard{label} after its "
                             "reduce-scatter (FSDP HYBRID_SHARD, torchtitan data_parallel_replicate_degree)", total_s=stream))
    return out
