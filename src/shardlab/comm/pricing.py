"""Exposed communication time of a training step, per axis (array-safe over candidate layouts): the step model's
pricing, which `comm plan`'s inventory shares (``comm.inventory``, ``comm.exposure``).

Each collective is priced with the α–β model of ``shardlab.comm.collectives`` on the link its group
crosses (``hardware.group_link``); what is exposed depends on what it can overlap with:
- TP/SP (Megatron, Shoeybi et al. 2019 §3; Korthikanti 2022 §4.2.2): per block 2 all-reduces of
  b·s·h in forward, 2 in backward, 2 more when the forward is recomputed; sequence parallelism turns each
  into a reduce-scatter + all-gather of the same volume. On the critical path (no overlap).
- CP (ring attention, Liu et al. 2023): cp − 1 exchanges of the K/V block in forward and of K/V and
  their gradients in backward, overlapped with the attention core; exposed only beyond it.
- EP (Lepikhin et al. 2020, GShard): dispatch + combine all-to-alls per MoE block in forward, 2 in backward
  (+2 recomputed); on the critical path. With TP the experts are split by TP too (Megatron-core's
  expert-tensor-parallel size defaults to tp): each TP rank dispatches only its 1/tp share of the group's
  b·s·top_k·h token copies, then the TP group all-gathers what its members received and reduce-scatters the
  experts' output (``ep_per_moe_block_s``); those two replace the MLP's own TP pair in a MoE block.
- PP (Narayanan 2021 §4.1): one send of the stage's output activations per micro-batch in forward and
  one of its gradient in backward, split across the TP ranks (scatter/gather optimisation); blocking.
- DP (ZeRO, Rajbhandari 2019 §7): ZeRO-0 all-reduces the gradients once per step; ZeRO-1 reduce-scatters
  them and all-gathers the updated weights; ZeRO-2 reduce-scatters every micro-batch (DeepSpeed);
  ZeRO-3/FSDP all-gathers the weights in forward and backward and reduce-scatters the gradients every
  micro-batch. Gradient reductions overlap with the last backward when overlap is on (bucketed, as
  PyTorch DDP/FSDP and Megatron --overlap-grad-reduce do); ZeRO-3 gathers overlap with the previous
  block's compute (prefetch). What does not fit under the compute is exposed.
"""

from __future__ import annotations

import numpy as np

from shardlab.layout import expert_grid, expert_tp_of
from shardlab.comm.collectives import alpha_beta_time
from shardlab.comm.moe_dispatch import remote_nodes_per_token
from shardlab.rates.hardware import group_link, ranks_per_node
from shardlab.specs.hardware import Cluster


def exposed_s(comm_s, window_s, overlap=1.0):
    """What C seconds of communication overlapped with a W-second compute window add to it: max(0, C − η·W). Only a
    share η of the window hides communication: concurrent collectives take SMs and memory bandwidth from the compute
    (Rashidi et al. 2021, ISCA, 'Enabling Compute-Communication Overlap in Distributed Deep Learning Training
    Platforms' §3; Pati et al. 2024, T3, arXiv 2401.16677 §2.3) and streams serialise part of the work."""
    return np.maximum(np.asarray(comm_s) - overlap * np.asarray(window_s), 0.0)


def _time(op, size, n, link):
    n = np.asarray(n)
    return np.where(n > 1, alpha_beta_time(op, size, np.maximum(n, 1), link.alpha_s, link.beta_bytes_per_s, "ring"), 0.0)


def tp_per_block_s(cluster: Cluster, *, tp, tokens, hidden: int, elem_bytes: int, recompute_code, mlp=True,
                   rerun_mlp=False):
    """TP/SP communication of one block per micro-batch (critical path): two all-reduces (or SP pairs) per pass,
    one for attention and one for the MLP; ``mlp`` False (array-safe) counts attention's alone (a MoE block whose
    expert dispatch does the MLP's TP collectives, ``ep_per_moe_block_s``). ``rerun_mlp``: selective recomputation
    re-runs the MLP (Megatron-core's 'mlp' module), and its collective with it."""
    link = group_link(cluster, tp, 1)
    one = _time("all-reduce", tokens * hidden * elem_bytes, tp, link)
    mlp = np.asarray(mlp, dtype=float)
    code = np.asarray(recompute_code)
    count = (1 + mlp) * (2 + (code == 2)) + mlp * ((code == 1) & bool(rerun_mlp))
    return count * one


def tp_overlapped_s(comm_s, gemm_s, tp):
    """Exposed part of a block's TP/SP communication when each collective is split into ``tp`` chunks pipelined with
    the GEMM that consumes (all-gather) or produces (reduce-scatter) it: Wang et al. 2023, "Overlap Communication with
    Dependent Computation via Decomposition in Large Deep Learning Models" (ASPLOS '23), as Transformer Engine's
    userbuffers (Megatron-Core ``--tp-comm-overlap``) and torchtitan's async TP implement it. Chunk i's transfer runs
    under chunk i − 1's GEMM, so what shows is the first (or last) chunk, min(C, G)/tp, plus whatever communication
    the GEMMs cannot cover, max(0, C − G). ``comm_s``: the block's TP/SP collectives; ``gemm_s``: its GEMMs in the
    same passes (array-safe). Not priced: the SMs the overlapped reduce-scatters take from the GEMM (TE's ``num_sm``)."""
    comm_s, gemm_s, tp = (np.asarray(x, dtype=float) for x in (comm_s, gemm_s, tp))
    return np.where(tp > 1, np.maximum(comm_s - gemm_s, 0.0) + np.minimum(comm_s, gemm_s) / np.maximum(tp, 1.0), comm_s)


def tp_exposed_per_block_s(comm_s, gemm_fwd_s, recompute_code, tp, sequence_parallel):
    """A block's TP/SP communication per micro-batch on the critical path with ``--tp-comm-overlap``: where sequence
    parallelism splits it into all-gathers and reduce-scatters (the collectives the overlap decomposes; Megatron-Core
    asserts --sequence-parallel with it), what its GEMMs do not hide (``tp_overlapped_s``) — the forward GEMMs
    ``gemm_fwd_s``, the backward's two per forward one, and the re-run forward under full recomputation, the passes
    whose collectives ``tp_per_block_s`` counts; all of it elsewhere (array-safe)."""
    passes = 3.0 + (np.asarray(recompute_code) == 2)
    return np.where(np.asarray(sequence_parallel, dtype=bool), tp_overlapped_s(comm_s, passes * gemm_fwd_s, tp), comm_s)


def tp_embedding_head_s(cluster: Cluster, *, tp, tokens, hidden: int, elem_bytes: int):
    """Vocabulary-parallel embedding (forward all-reduce of its output) or head (backward all-reduce of its input gradient)."""
    link = group_link(cluster, tp, 1)
    return _time("all-reduce", tokens * hidden * elem_bytes, tp, link)


def tp_cross_entropy_s(cluster: Cluster, *, tp, tokens):
    """Vocabulary-parallel cross-entropy on the last stage (Megatron, Shoeybi et al. 2019 §3): all-reduces of the
    logits' max, the target logit and the sum of exponentials, 3 fp32 values per token, priced as one call."""
    return _time("all-reduce", 3 * 4 * tokens, tp, group_link(cluster, tp, 1))


def tied_embedding_s(cluster: Cluster, *, tp, cp, dp, pp, elements, grad_bytes: int):
    """Tied input/output embedding split over pipeline stages (Megatron): the first and the last stage all-reduce the
    shared matrix's gradient (``elements`` per TP rank) once per step, on the critical path."""
    stride = np.asarray(tp) * np.asarray(cp) * np.asarray(dp) * (np.asarray(pp) - 1)
    return np.where(np.asarray(pp) > 1, _time("all-reduce", elements * grad_bytes, 2, group_link(cluster, 2, stride)), 0.0)


def cp_per_block_s(cluster: Cluster, *, tp, cp, tokens, kv_width, elem_bytes: int, attn_fwd_s, recompute_code,
                   eta=1.0, total=False):
    """Ring-attention K/V exchange of one block per micro-batch, beyond what the attention core hides (``total``: all
    of it, hidden or not)."""
    # a ring hop is one send/recv: across nodes it leaves through the GPU's own NIC (no pooling of the node's NICs,
    # which models NCCL's multi-channel collectives); comm plan prices it the same way
    link = group_link(cluster, cp, tp, per_gpu_nic=True)
    cp = np.asarray(cp)
    block = tokens * kv_width * elem_bytes                           # K and V of the local sequence chunk (kv_width: both)
    step = link.alpha_s + block / link.beta_bytes_per_s
    fwd = np.where(cp > 1, (cp - 1) * step, 0.0)
    bwd = 2 * fwd                                                      # K/V in, dK/dV back
    if total:
        return fwd + bwd + (np.asarray(recompute_code) == 2) * fwd
    exposed = exposed_s(fwd, attn_fwd_s, eta) + exposed_s(bwd, 2 * attn_fwd_s, eta)
    return exposed + (np.asarray(recompute_code) == 2) * exposed_s(fwd, attn_fwd_s, eta)


def ep_per_moe_block_s(cluster: Cluster, *, tp, cp, ep, tokens, hidden: int, top_k: int, elem_bytes: int, recompute_code,
                       num_experts: int = 0, rerun_moe: bool = False, dispatcher: str = "alltoall",
                       imbalance: float = 1.0, etp=None):
    """Dispatch and combine of one MoE block per micro-batch (critical path), as Megatron-core's alltoall token
    dispatcher runs them with the experts split by TP (megatron/core/transformer/moe/token_dispatcher.py,
    MoEAlltoAllTokenDispatcher; --expert-tensor-parallel-size defaults to the TP size, the split shardlab's
    memory and compute use). Per pass, with R = tokens·top_k·hidden·elem_bytes the token copies the TP group routes:
    - in a forward pass (the first, and a re-run one), an all-gather of the per-expert token counts (E int64 per
      rank) over the TP × EP group, so each rank knows what it will receive (the dispatcher's preprocess);
    - all-to-all over the EP group of R / tp per rank: each TP rank sends its own share (the sequence-parallel
      shard), so the group's tokens cross the EP links once, not tp times (DeepSpeed-MoE drops the TP duplicates
      before its all-to-all for the same reason: deepspeed/moe/sharded_moe.py, drop_tokens);
    - all-gather over the TP group of what its members received (R in all), the experts' TP GEMMs, and a
      reduce-scatter of their output over TP;
    - the all-to-all back (combine).
    With TP and no EP the dispatcher still gathers the counts and the copies over TP and reduce-scatters them back;
    Megatron-core also all-to-alls the routing probabilities with their tokens (one value per copy: not priced).
    The all-to-all is a pairwise exchange (as ``comm.collectives`` prices it for `comm plan`): a rank sends S/n to
    each of its n − 1 peers, the g − 1 in its node over the intra-node link and the n − g on other nodes through its
    own NIC (every rank's traffic leaves the node, so the node's NICs are not pooled for it); the two run at once,
    the busier sets the pace. Forward, backward (the gradients take the same path back) and a re-run forward under
    full recomputation, or under selective recomputation of the whole MoE layer (``rerun_moe``: Megatron-core's 'moe'
    module).
    ``dispatcher='deepep'`` (``comm.moe_dispatch``): across nodes a token crosses the network once per remote node
    holding one of its experts, (nodes − 1)·(1 − (1 − 1/nodes)^k) of them, and that node's GPU forwards the copies
    over NVLink (the local copies, and (g − 1)/g of those arriving); the NVLink and NIC parts run at once; no
    separate count all-gather. ``imbalance``: the busiest rank receives that many times the mean copies, and every
    rank waits for it.
    ``etp`` (``Layout.etp``; None or 0: tp): with the experts split over etp < tp ranks, Megatron-core's expert grid
    (``layout.expert_grid``) puts EP members etp apart, the all-gather and reduce-scatter of the copies run over the
    etp ranks (etp/tp of R), and the counts go round the etp × ep group: a rank's tokens no longer gather over the
    whole TP group (ETP 1: none)."""
    n = np.maximum(np.asarray(ep), 1)
    tp = np.asarray(tp)
    e_tp = expert_tp_of(tp, None if etp is None else np.asarray(etp))
    routed = tokens * top_k * hidden * elem_bytes
    folded = e_tp < tp
    a2a = ep_all_to_all_s(cluster, tp=tp, cp=cp, ep=n, size=routed / np.maximum(tp, 1) * imbalance, top_k=top_k,
                          dispatcher=dispatcher, stride=np.where(folded, e_tp, tp * np.asarray(cp)))
    link = group_link(cluster, e_tp, 1)
    gathered = routed * e_tp / np.maximum(tp, 1)
    etp_s = _time("all-gather", gathered, e_tp, link) + _time("reduce-scatter", gathered, e_tp, link)   # 0 without
    group = e_tp * n
    # the TP × EP group: tp consecutive ranks, repeated every tp·cp ranks, so gpus_per_node / cp of it share a node
    # (with a narrower expert TP, etp·ep consecutive ranks)
    counts = np.where((group > 1) & ((dispatcher != "deepep") | (n <= 1)),   # DeepEP carries the counts itself
                      _time("all-gather", group * num_experts * 8, group,
                            group_link(cluster, group, np.where(folded, 1, np.asarray(cp)))),
                      0.0)
    code = np.asarray(recompute_code)
    rerun = (code == 2) | ((code == 1) & bool(rerun_moe))
    return (2 + rerun) * (2 * a2a + etp_s) + (1 + rerun) * counts


def ep_all_to_all_s(cluster: Cluster, *, tp, cp, ep, size, top_k: int, dispatcher: str = "alltoall", stride=None):
    """One dispatch (or combine) of ``size`` bytes of token copies per rank over an EP group of ``ep`` ranks ``tp·cp``
    apart (or ``stride``: ``layout.expert_grid``'s ep_stride) (``ep_per_moe_block_s`` says how each dispatcher moves
    them). Array-safe."""
    n = np.maximum(np.asarray(ep), 1)
    stride = np.asarray(tp) * np.asarray(cp) if stride is None else np.asarray(stride)
    g = ranks_per_node(cluster, n, stride)   # the rank and its peers in one node
    intra, inter = cluster.intra_link, cluster.inter_link
    if dispatcher == "deepep":
        nodes = n / np.maximum(g, 1)
        nvlink = size * ((g - 1) / n + (n - g) / n * (g - 1) / np.maximum(g, 1))
        lat = (g - 1) * intra.latency_s + (nodes - 1) * inter.latency_s
        bw = np.maximum(nvlink / intra.bytes_per_s, remote_nodes_per_token(nodes, top_k) * size / top_k / inter.bytes_per_s)
    else:
        lat = (g - 1) * intra.latency_s + (n - g) * inter.latency_s
        bw = np.maximum((g - 1) / n * size / intra.bytes_per_s, (n - g) / n * size / inter.bytes_per_s)
    return np.where(n > 1, lat + bw, 0.0)


def pp_p2p_per_microbatch_s(cluster: Cluster, *, tp, cp, dp, pp, vpp, tokens, hidden: int, elem_bytes: int):
    """Blocking send of activations (forward) and their gradient (backward) per micro-batch per stage;
    interleaving sends v times as often. Each TP rank sends 1/tp of the tensor over its own NIC."""
    pp = np.asarray(pp)
    link = group_link(cluster, pp, np.asarray(tp) * np.asarray(cp) * np.asarray(dp), per_gpu_nic=True)  # one NIC
    one = link.alpha_s + tokens * hidden * elem_bytes / np.asarray(tp) / link.beta_bytes_per_s
    return np.where(pp > 1, 2 * np.asarray(vpp) * one, 0.0)


def linear_cost(op: str, n, link) -> tuple:
    """(latency_s, seconds_per_byte) of ``op`` on groups of ``n`` over ``link``: the α–β time is linear in the
    size, so one pair of coefficients prices every message of a candidate."""
    t0 = _time(op, 0.0, n, link)
    return t0, _time(op, 1.0, n, link) - t0


def dp_coefficients(cluster: Cluster, *, tp, cp, dp, ep, rep=1, etp=None) -> dict:
    """α–β coefficients of the gradient/weight collectives over the dense (dp·cp) and expert (dp·cp/ep; with a
    narrower expert TP ``etp``, ``layout.expert_grid``'s edp) groups.

    With hybrid sharding (``rep`` replicas) ZeRO reduce-scatters and all-gathers over the shard group (dp·cp/rep,
    inside a node) and the replicas all-reduce the gradient shard ('replica-all-reduce', per parameter of the full
    model: its coefficient already divides by the shard group)."""
    rep = np.asarray(rep)
    D = np.asarray(dp) * np.asarray(cp)
    grid = expert_grid(np.asarray(tp), np.asarray(cp), np.asarray(dp), np.asarray(ep), etp, rep)
    S, Se = D // rep, grid["edp"]
    link = group_link(cluster, S, tp)
    elink = group_link(cluster, Se, grid["edp_stride"])
    out = {(op, grp): linear_cost(op, n, lk) for op in ("all-reduce", "reduce-scatter", "all-gather")
           for grp, n, lk in (("dense", S, link), ("expert", Se, elink))}
    for grp, n, stride in (("dense", S, np.asarray(tp) * S), ("expert", Se, grid["edp_stride"] * Se)):
        lat, per_byte = linear_cost("all-reduce", rep, group_link(cluster, rep, stride))
        out[("replica-all-reduce", grp)] = (lat, per_byte / np.maximum(n, 1))
    return out


def dp_step_s(coeffs: dict, *, zero, params_local, grad_bytes: int, weight_bytes: int, microbatches, bwd_last_s,
              overlap: bool, expert_params_local=0, eta=1.0):
    """Exposed data-parallel / ZeRO-1/2 communication per step (ZeRO-3 is priced per micro-batch).

    Returns (exposed_s, total_s): what extends the step, and what the collectives take in all.
    """
    zero = np.asarray(zero)
    dense = np.asarray(params_local) - np.asarray(expert_params_local)
    sizes = {"dense": dense, "expert": np.asarray(expert_params_local)}

    def t(op, bytes_per_param):
        # a group with nothing to reduce (the expert group of a dense model) issues no call
        return sum(np.where(sizes[grp] > 0, lat + per_byte * sizes[grp] * bytes_per_param, 0.0)
                   for (o, grp), (lat, per_byte) in coeffs.items() if o == op)

    ar, ag = t("all-reduce", grad_bytes), t("all-gather", weight_bytes)
    rs = t("reduce-scatter", grad_bytes) + t("replica-all-reduce", grad_bytes)   # HSDP: + the replicas' all-reduce
    m = np.asarray(microbatches)
    hide = (lambda c: exposed_s(c, bwd_last_s, eta)) if overlap else (lambda c: np.asarray(c))
    # ZeRO-2 reduce-scatters every micro-batch; all but the last hide under the next backward when overlapped
    rs2_total = m * rs
    rs2_exposed = m * hide(rs)
    exposed = np.select([zero == 0, zero == 1, zero == 2], [hide(ar), hide(rs) + ag, rs2_exposed + ag], 0.0)
    total = np.select([zero == 0, zero == 1, zero == 2], [ar, rs + ag, rs2_total + ag], 0.0)
    return exposed, total


def zero3_unit_collectives_s(cluster: Cluster, *, shard, stride, rep, unit_params, grad_bytes: int, weight_bytes: int,
                             per_gpu_nic: bool = False) -> dict:
    """One ZeRO-3/FSDP unit's collectives per micro-batch over a shard group of ``shard`` ranks ``stride`` apart:
    'ag' (all-gather of its weights), 'rs' (reduce-scatter of its gradients) and, with HSDP replicas (rep > 1),
    'ar' (all-reduce of the gradient shard across the replicas: torch FSDP HYBRID_SHARD, Zhao et al. 2023 §3.2.2)."""
    shard, rep, stride = np.asarray(shard), np.asarray(rep), np.asarray(stride)
    link = group_link(cluster, shard, stride, per_gpu_nic)
    rlink = group_link(cluster, rep, stride * shard, per_gpu_nic)
    return {"ag": _time("all-gather", unit_params * weight_bytes, shard, link),
            "rs": _time("reduce-scatter", unit_params * grad_bytes, shard, link),
            "ar": _time("all-reduce", unit_params / np.maximum(shard, 1) * grad_bytes, rep, rlink)}


def zero3_collectives_s(cluster: Cluster, *, tp, cp, dp, ep, rep, dense_params, expert_params, grad_bytes: int,
                        weight_bytes: int, per_gpu_nic: bool = False, etp=None) -> dict:
    """A unit's collectives: dense weights shard over dp·cp/rep ranks (stride tp), routed experts over the expert
    data-parallel group dp·cp/ep/rep (stride tp·cp·ep: ranks holding the same experts; with a narrower expert TP
    ``etp``, ``layout.expert_grid``'s edp and its stride), issued one after the other."""
    tp, cp, dp, ep, rep = (np.asarray(x) for x in (tp, cp, dp, ep, rep))
    grid = expert_grid(tp, cp, dp, ep, etp, rep)
    kw = dict(grad_bytes=grad_bytes, weight_bytes=weight_bytes, per_gpu_nic=per_gpu_nic, rep=rep)
    d = zero3_unit_collectives_s(cluster, shard=dp * cp // rep, stride=tp, unit_params=dense_params, **kw)
    x = zero3_unit_collectives_s(cluster, shard=grid["edp"], stride=grid["edp_stride"], unit_params=expert_params, **kw)
    has_x = np.asarray(expert_params) > 0
    return {k: d[k] + np.where(has_x, x[k], 0.0) for k in d}


def zero3_per_microbatch_s(coll: dict, *, fwd_unit_s, bwd_unit_s, regathers, overlap: bool, prefetch: bool,
                           eta=1.0):
    """ZeRO-3/FSDP per unit and micro-batch (Zhao et al. 2023, arXiv 2304.11277 §3.3-3.4; Rajbhandari 2020 §7.2.2).

    Forward: the unit's all-gather, hidden under the previous unit's forward when prefetched. Backward: the gather
    again (plus ``regathers`` more, e.g. DeepSpeed's re-gather for the recomputed forward), its gradient
    reduce-scatter and the HSDP all-reduce, sharing the links, hidden under the backward (+ recomputation) window
    when prefetch / overlap allow. Returns (exposed_s, total_s) per unit; the first unit's gather and the last
    reduce-scatter, which nothing hides, are added by the caller (``zero3_edges_s``)."""
    ag, rs, ar = coll["ag"], coll["rs"], coll["ar"]
    gathers_b = (1 + np.asarray(regathers)) * ag
    reduce = rs + ar
    hide = lambda c, w: exposed_s(c, w, eta)
    fwd = hide(ag, fwd_unit_s) if prefetch else ag
    if prefetch and overlap:
        bwd = hide(gathers_b + reduce, bwd_unit_s)
    elif overlap:
        bwd = gathers_b + hide(reduce, bwd_unit_s)
    elif prefetch:
        bwd = hide(gathers_b, bwd_unit_s) + reduce
    else:
        bwd = gathers_b + reduce
    return fwd + bwd, ag + gathers_b + reduce


def zero3_edges_s(coll: dict):
    """Per micro-batch: the first unit's all-gather (nothing runs before it) and the last reduce-scatter and
    replica all-reduce (nothing runs after them)."""
    return coll["ag"] + coll["rs"] + coll["ar"]
