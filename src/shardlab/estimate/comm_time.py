"""Exposed communication time of a training step, per axis (array-safe over candidate layouts).

Each collective is priced with the α–β model of ``shardlab.comm.collectives`` on the link its group
crosses (``hardware.group_link``); what is exposed depends on what it can overlap with:
- TP/SP (Megatron, Shoeybi et al. 2019 §3; Korthikanti 2022 §4.2.2): per block 2 all-reduces of
  b·s·h in forward, 2 in backward, 2 more when the forward is recomputed; sequence parallelism turns each
  into a reduce-scatter + all-gather of the same volume. On the critical path (no overlap).
- CP (ring attention, Liu et al. 2023): cp − 1 exchanges of the K/V block in forward and of K/V and
  their gradients in backward, overlapped with the attention core; exposed only beyond it.
- EP (Lepikhin et al. 2020, GShard): dispatch + combine all-to-alls of b·s·top_k·h per MoE block in
  forward, 2 in backward (+2 recomputed); on the critical path.
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

from shardlab.comm.collectives import alpha_beta_time
from shardlab.estimate.hardware import group_link
from shardlab.specs.hardware import Cluster


def _time(op, size, n, link):
    n = np.asarray(n)
    return np.where(n > 1, alpha_beta_time(op, size, np.maximum(n, 1), link.alpha_s, link.beta_bytes_per_s, "ring"), 0.0)


def tp_per_block_s(cluster: Cluster, *, tp, tokens, hidden: int, elem_bytes: int, recompute_code):
    """TP/SP communication of one block per micro-batch (critical path)."""
    link = group_link(cluster, tp, 1)
    one = _time("all-reduce", tokens * hidden * elem_bytes, tp, link)
    count = 4 + 2 * (np.asarray(recompute_code) == 2)
    return count * one


def tp_embedding_head_s(cluster: Cluster, *, tp, tokens, hidden: int, elem_bytes: int):
    """Vocabulary-parallel embedding (forward all-reduce of its output) or head (backward all-reduce of its input gradient)."""
    link = group_link(cluster, tp, 1)
    return _time("all-reduce", tokens * hidden * elem_bytes, tp, link)


def cp_per_block_s(cluster: Cluster, *, tp, cp, tokens, kv_width, elem_bytes: int, attn_fwd_s, recompute_code):
    """Ring-attention K/V exchange of one block per micro-batch, beyond what the attention core hides."""
    link = group_link(cluster, cp, tp)
    cp = np.asarray(cp)
    block = tokens * kv_width * elem_bytes                           # K and V of the local sequence chunk (kv_width: both)
    step = link.alpha_s + block / link.beta_bytes_per_s
    fwd = np.where(cp > 1, (cp - 1) * step, 0.0)
    bwd = 2 * fwd                                                      # K/V in, dK/dV back
    exposed = np.maximum(fwd - attn_fwd_s, 0) + np.maximum(bwd - 2 * attn_fwd_s, 0)
    return exposed + (np.asarray(recompute_code) == 2) * np.maximum(fwd - attn_fwd_s, 0)


def ep_per_moe_block_s(cluster: Cluster, *, tp, cp, ep, tokens, hidden: int, top_k: int, elem_bytes: int, recompute_code):
    """Dispatch and combine all-to-alls of one MoE block per micro-batch (critical path)."""
    link = group_link(cluster, ep, np.asarray(tp) * np.asarray(cp))
    one = _time("all-to-all", tokens * top_k * hidden * elem_bytes, ep, link)
    count = 4 + 2 * (np.asarray(recompute_code) == 2)
    return count * one


def pp_p2p_per_microbatch_s(cluster: Cluster, *, tp, cp, dp, pp, vpp, tokens, hidden: int, elem_bytes: int):
    """Blocking send of activations (forward) and their gradient (backward) per micro-batch per stage;
    interleaving sends v times as often. Each TP rank sends 1/tp of the tensor over its own NIC."""
    pp = np.asarray(pp)
    link = group_link(cluster, pp, np.asarray(tp) * np.asarray(cp) * np.asarray(dp))
    one = link.alpha_s + tokens * hidden * elem_bytes / np.asarray(tp) / link.beta_bytes_per_s
    return np.where(pp > 1, 2 * np.asarray(vpp) * one, 0.0)


def linear_cost(op: str, n, link) -> tuple:
    """(latency_s, seconds_per_byte) of ``op`` on groups of ``n`` over ``link``: the α–β time is linear in the
    size, so one pair of coefficients prices every message of a candidate."""
    t0 = _time(op, 0.0, n, link)
    return t0, _time(op, 1.0, n, link) - t0


def dp_coefficients(cluster: Cluster, *, tp, cp, dp, ep) -> dict:
    """α–β coefficients of the gradient/weight collectives over the dense (dp·cp) and expert (dp·cp/ep) groups."""
    D = np.asarray(dp) * np.asarray(cp)
    De = D // np.asarray(ep)
    link = group_link(cluster, D, tp)
    elink = group_link(cluster, De, np.asarray(tp) * np.asarray(cp) * np.asarray(ep))
    return {(op, grp): linear_cost(op, n, lk) for op in ("all-reduce", "reduce-scatter", "all-gather")
            for grp, n, lk in (("dense", D, link), ("expert", De, elink))}


def dp_step_s(coeffs: dict, *, zero, params_local, grad_bytes: int, weight_bytes: int, microbatches, bwd_last_s,
              overlap: bool, expert_params_local=0):
    """Exposed data-parallel / ZeRO-1/2 communication per step (ZeRO-3 is priced per micro-batch).

    Returns (exposed_s, total_s): what extends the step, and what the collectives take in all.
    """
    zero = np.asarray(zero)
    dense = np.asarray(params_local) - np.asarray(expert_params_local)
    sizes = {"dense": dense, "expert": np.asarray(expert_params_local)}

    def t(op, bytes_per_param):
        return sum(lat + per_byte * sizes[grp] * bytes_per_param for (o, grp), (lat, per_byte) in coeffs.items() if o == op)

    ar, rs, ag = t("all-reduce", grad_bytes), t("reduce-scatter", grad_bytes), t("all-gather", weight_bytes)
    window = bwd_last_s if overlap else 0.0
    m = np.asarray(microbatches)
    # ZeRO-2 reduce-scatters every micro-batch; all but the last hide under the next backward when overlapped
    rs2_total = m * rs
    rs2_exposed = np.where(overlap, np.maximum(rs - window, 0) + (m - 1) * np.maximum(rs - bwd_last_s, 0), rs2_total)
    exposed = np.select([zero == 0, zero == 1, zero == 2], [np.maximum(ar - window, 0), np.maximum(rs - window, 0) + ag,
                                                              rs2_exposed + ag], 0.0)
    total = np.select([zero == 0, zero == 1, zero == 2], [ar, rs + ag, rs2_total + ag], 0.0)
    return exposed, total


def zero3_first_gather_s(cluster: Cluster, *, tp, cp, dp, unit_params, weight_bytes: int):
    """The first unit's all-gather of a micro-batch (nothing to hide under)."""
    D = np.asarray(dp) * np.asarray(cp)
    return _time("all-gather", unit_params * weight_bytes, D, group_link(cluster, D, tp))


def zero3_per_microbatch_s(cluster: Cluster, *, tp, cp, dp, unit_params, n_units, fwd_unit_s, bwd_unit_s,
                           grad_bytes: int, weight_bytes: int, overlap: bool = True):
    """ZeRO-3/FSDP per micro-batch: all-gather each unit's weights in forward and in backward and
    reduce-scatter its gradients; with one unit of prefetch each gather hides under the previous unit's
    compute. Returns (exposed_s, total_s); the first unit's gather, which nothing hides, is added by the
    caller once per micro-batch."""
    D = np.asarray(dp) * np.asarray(cp)
    link = group_link(cluster, D, tp)
    ag = _time("all-gather", unit_params * weight_bytes, D, link)
    rs = _time("reduce-scatter", unit_params * grad_bytes, D, link)
    if overlap:
        exposed = n_units * (np.maximum(ag - fwd_unit_s, 0) + np.maximum(ag + rs - bwd_unit_s, 0))
    else:
        exposed = n_units * (2 * ag + rs)
    total = n_units * (2 * ag + rs)
    return exposed, total
