"""Step time of a training layout from its parts, vectorized over candidate layouts.

For every pipeline stage s the time of one micro-batch is
    t_s = Σ_blocks (forward + backward + recomputation + exposed TP/CP/EP communication)
          + head (last stage) + embedding all-reduce (first stage) + p2p sends + exposed ZeRO-3 gathers.
The pipeline runs at the pace of its slowest stage (a straggler sets the pace):
    GPipe, 1F1B:  T = (m − 1)·max_s t_s + Σ_s t_s         (= (m + p − 1)·t for equal stages)
    interleaved:  T = m·max_s t_s + (p − 1)/v · max_s t_s  (Narayanan 2021 §2.2)
    ZB-H1:        T = m·max_s t_s + (p − 1)·(max_s t_s − 2·W), W = weight-gradient time (Qi et al. 2023)
then step = T + exposed data-parallel communication + optimizer step. The breakdown reports the
slowest stage's parts, m times, plus the bubble (T − m·t_slowest), so the parts add up to the step.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from shardlab.estimate import comm_time as ct
from shardlab.estimate.compute import block_step_times, head_times, layer_times
from shardlab.estimate.hardware import matmul_curve, memory_time_s
from shardlab.flops import training_flops_per_token
from shardlab.layout import split_layers
from shardlab.memory.activations import ActivationContext, in_flight
from shardlab.memory.overheads import Overheads
from shardlab.memory.precision import state_bytes
from shardlab.memory.training import layer_kinds, stage_activation_bytes, stage_overheads
from shardlab.specs.hardware import Cluster
from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import PRE, model_tensors

SCHEDULE_CODES = {"1f1b": 0, "gpipe": 1, "interleaved": 2, "zb-h1": 3}
CANDIDATE_KEYS = ("dp", "tp", "pp", "cp", "ep", "zero", "vpp", "mb", "rc", "sp", "sched")


@dataclass(frozen=True)
class Workload:
    """What is being trained, independent of the layout."""

    seq_len: int
    """Tokens per sequence."""
    global_batch: int
    """Sequences per optimizer step."""
    precision: str = "bf16-mixed"
    """fp32, bf16-mixed, fp16-mixed or bf16."""
    optimizer: str = "adamw"
    """adamw, sgd or adam-8bit."""
    flash_attention: bool = True
    """Fused attention kernel: no s×s scores stored, causal blocks skipped."""
    dropout: bool = False
    """Dropout in the blocks (GPT-3-era training)."""
    dp_overlap: bool = True
    """Gradient reduction overlaps the last backward (PyTorch DDP/FSDP, Megatron --overlap-grad-reduce)."""
    grad_reduce_bytes: int = 0
    """Bytes per gradient element on the wire (0: the gradient dtype; Megatron bf16 runs often use 4)."""


def _stage_layers(L: int, pp: int, vpp: int) -> list[list[int]]:
    chunks = split_layers(L, pp * vpp)
    starts = np.cumsum((0,) + chunks)
    stages: list[list[int]] = [[] for _ in range(pp)]
    for c in range(pp * vpp):
        stages[c % pp].extend(range(starts[c], starts[c + 1]))
    return stages


def _local_params(spec: ModelSpec, tp, ep) -> dict:
    """Parameters per rank after TP/EP, by unit: block index -> (dense, expert); PRE and L for embedding/head."""
    out: dict = {}
    for t in model_tensors(spec):
        n = np.prod(np.broadcast_arrays(*t.local_shape(spec, tp, ep)), axis=0) if t.tp_dim is not None or t.ep_dim is not None \
            else t.numel
        d, e = out.get(t.layer, (0, 0))
        out[t.layer] = (d + (n if t.ep_dim is None else 0), e + (n if t.ep_dim is not None else 0))
    return out


def evaluate(spec: ModelSpec, cluster: Cluster, wl: Workload, cands: dict, overheads: Overheads = Overheads()) -> dict:
    """Score candidate layouts (dict of equal-length arrays, keys CANDIDATE_KEYS). Returns arrays."""
    n = len(cands["dp"])
    out = {k: np.zeros(n) for k in ("step_time_s", "compute_s", "recompute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s",
                                    "pp_p2p_s", "pp_bubble_s", "zero3_comm_s", "dp_comm_s", "dp_comm_total_s",
                                    "optimizer_s", "memory_bytes", "slowest_stage", "worst_memory_stage")}
    keys = np.stack([cands["pp"], cands["vpp"], cands["sched"]], axis=1)
    for key in np.unique(keys, axis=0):
        idx = np.nonzero((keys == key).all(axis=1))[0]
        sub = {k: np.asarray(v)[idx] for k, v in cands.items()}
        res = _evaluate_group(spec, cluster, wl, sub, int(key[0]), int(key[1]), int(key[2]), overheads)
        for k, v in res.items():
            out[k][idx] = v
    acc = cluster.accelerator
    sb = state_bytes(wl.precision, wl.optimizer)
    model_tok = float(training_flops_per_token(spec, wl.seq_len, "none")[0])
    hw = np.array([float(training_flops_per_token(spec, wl.seq_len, r)[1]) for r in ("none", "selective", "full")])[np.asarray(cands["rc"])]
    tokens = float(wl.global_batch * wl.seq_len)
    world = np.asarray(cands["dp"]) * cands["tp"] * cands["pp"] * cands["cp"]
    peak = acc.peak_flops(sb.compute_dtype)
    out["tokens_per_s"] = tokens / out["step_time_s"]
    out["model_tflops_per_gpu"] = model_tok * tokens / out["step_time_s"] / world / 1e12
    out["hardware_tflops_per_gpu"] = hw * tokens / out["step_time_s"] / world / 1e12
    out["mfu"] = out["model_tflops_per_gpu"] * 1e12 / peak
    out["hfu"] = out["hardware_tflops_per_gpu"] * 1e12 / peak
    out["fits"] = out["memory_bytes"] <= acc.memory_bytes
    return out


def _evaluate_group(spec, cluster, wl, c, pp, vpp, sched, ov) -> dict:
    acc = cluster.accelerator
    curve, _ = matmul_curve(acc)
    sb = state_bytes(wl.precision, wl.optimizer)
    e, dtype = sb.weights, sb.compute_dtype
    gbytes = wl.grad_reduce_bytes or sb.gradients
    tp, cp, ep, dp, mb, zero, rc = (np.asarray(c[k]) for k in ("tp", "cp", "ep", "dp", "mb", "zero", "rc"))
    sp = np.asarray(c["sp"], dtype=bool)
    m = wl.global_batch // (mb * dp)
    T = mb * wl.seq_len / cp                                  # tokens per micro-batch on a rank
    h = spec.hidden_size
    sched_name = {v: k for k, v in SCHEDULE_CODES.items()}[sched]
    lay = SimpleNamespace(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=zero, vpp=vpp, micro_batch=mb, recompute=rc,
                          sequence_parallel=sp, schedule=sched_name)
    common = dict(seq_len=wl.seq_len, tp=tp, cp=cp, micro_batch=mb, sequence_parallel=sp, elem_bytes=e)

    stages = _stage_layers(spec.num_layers, pp, vpp)
    params = _local_params(spec, tp, ep)
    per_kind = {}   # keyed by "is a MoE block"
    for layer in layer_kinds(spec, range(spec.num_layers)):
        lt = layer_times(spec, layer, acc, curve, dtype, ep=ep, flash_attention=wl.flash_attention, dropout=wl.dropout, **common)
        bt = block_step_times(lt, rc)
        tpc = ct.tp_per_block_s(cluster, tp=tp, tokens=T, hidden=h, elem_bytes=e, recompute_code=rc)
        cpc = ct.cp_per_block_s(cluster, tp=tp, cp=cp, tokens=T, kv_width=_kv_width(spec, tp), elem_bytes=e,
                                attn_fwd_s=lt["attn_s"], recompute_code=rc)
        epc = ct.ep_per_moe_block_s(cluster, tp=tp, cp=cp, ep=ep, tokens=T, hidden=h, top_k=spec.moe.top_k, elem_bytes=e,
                                    recompute_code=rc) if spec.is_moe_layer(layer) else 0.0
        dense, expert = params[layer]
        z3, z3_total = ct.zero3_per_microbatch_s(cluster, tp=tp, cp=cp, dp=dp, unit_params=dense + expert, n_units=1,
                                                 fwd_unit_s=bt["fwd_s"], bwd_unit_s=bt["bwd_s"] + bt["recompute_s"],
                                                 grad_bytes=gbytes, weight_bytes=e)
        per_kind[spec.is_moe_layer(layer)] = dict(compute=bt["fwd_s"] + bt["bwd_s"], rec=bt["recompute_s"], tp=tpc, cp=cpc,
                                                  ep=epc, z3=np.where(zero == 3, z3, 0.0), bwd=bt["bwd_s"] + bt["recompute_s"])
    head = head_times(spec, acc, curve, dtype, **common)
    emb_ar = ct.tp_embedding_head_s(cluster, tp=tp, tokens=T, hidden=h, elem_bytes=e)
    p2p = ct.pp_p2p_per_microbatch_s(cluster, tp=tp, cp=cp, dp=dp, pp=pp, vpp=vpp, tokens=T, hidden=h, elem_bytes=e)

    parts = {k: [] for k in ("compute", "rec", "tp", "cp", "ep", "z3", "p2p")}
    mem, dp_exp, dp_tot, opt = [], [], [], []
    ctx = ActivationContext(seq_len=wl.seq_len, elem_bytes=e, flash_attention=wl.flash_attention, dropout=wl.dropout)
    for s, layers in enumerate(stages):
        first, last = s == 0, s == pp - 1
        counts = {kind: sum(1 for l in layers if spec.is_moe_layer(l) == kind) for kind in per_kind}
        acc_part = lambda key: sum(cnt * per_kind[kind][key] for kind, cnt in counts.items()) + np.zeros_like(T)
        compute = acc_part("compute") + (head["fwd_s"] + head["bwd_s"] if last else 0.0)
        parts["compute"].append(compute)
        parts["rec"].append(acc_part("rec"))
        parts["tp"].append(acc_part("tp") + (emb_ar if first else 0.0) + (emb_ar if last else 0.0))
        parts["cp"].append(acc_part("cp"))
        parts["ep"].append(acc_part("ep"))
        parts["p2p"].append(p2p)
        # ZeRO-3: per-block exposed gathers; one unhidden gather per micro-batch (the first unit)
        if layers:
            u = params[layers[0]][0] + params[layers[0]][1]
            z3_first = np.where(zero == 3, ct.zero3_first_gather_s(cluster, tp=tp, cp=cp, dp=dp, unit_params=u, weight_bytes=e), 0.0)
        else:
            z3_first = 0.0
        parts["z3"].append(acc_part("z3") + z3_first)
        # model states, memory and DP communication of this stage
        dense = sum(params[l][0] for l in layers) + (params[PRE][0] if first else 0) + (params[spec.num_layers][0] if last else 0)
        expert = sum(params[l][1] for l in layers)
        if last and spec.tied_embeddings and pp > 1:
            dense = dense + params[PRE][0]
        total_p = dense + expert
        D, De = dp * cp, dp * cp // ep
        flat = np.ceil(dense / D) + np.ceil(expert / De)
        w_b = np.where(zero >= 3, flat, total_p) * sb.weights
        g_b = np.where(zero >= 2, flat, total_p) * sb.gradients
        o_b = np.where(zero >= 1, flat, total_p) * sb.optimizer
        nif = in_flight(lay, s, m)
        acts = stage_activation_bytes(spec, layers, lay, ctx, nif, holds_embedding=first, holds_head=last)
        units = set(layers) | ({PRE} if first else set()) | ({spec.num_layers} if last else set())
        unit = np.maximum.reduce([np.broadcast_to(params[u][0] + params[u][1], T.shape) for u in units])
        other = stage_overheads(spec, lay, ctx, ov, n_in_flight=nif, acts=acts, gradient_bytes=g_b,
                                unit_weight_bytes=unit * sb.weights, unit_grad_bytes=unit * sb.gradients, holds_head=last,
                                has_moe=any(spec.is_moe_layer(i) for i in layers))
        mem.append(w_b + g_b + o_b + acts + sum(np.asarray(v, dtype=float) for v in other.values()))
        bwd_last = acc_part("bwd")
        exp, tot = ct.dp_step_s(cluster, tp=tp, cp=cp, dp=dp, zero=zero, params_local=total_p, grad_bytes=gbytes,
                                weight_bytes=sb.weights, microbatches=m, bwd_last_s=bwd_last, overlap=wl.dp_overlap,
                                expert_params_local=expert, ep=ep)
        dp_exp.append(exp)
        dp_tot.append(tot)
        # optimizer: read the gradient, read and write master weights and moments, write the weights
        opt_bytes = np.where(zero >= 1, flat, total_p) * (sb.gradients + 2 * sb.optimizer + sb.weights)
        opt.append(memory_time_s(opt_bytes, acc))

    P = {k: np.stack(v) for k, v in parts.items()}             # (stages, candidates)
    t_stage = sum(P.values())
    s_star = np.argmax(t_stage, axis=0)
    pick = lambda a: np.take_along_axis(a, s_star[None, :], axis=0)[0]
    t_max = pick(t_stage)
    if pp == 1:
        pipe = m * t_max
    elif sched == SCHEDULE_CODES["interleaved"]:
        pipe = m * t_max + (pp - 1) / vpp * t_max
    elif sched == SCHEDULE_CODES["zb-h1"]:
        w = pick(P["compute"] - P["rec"]) / 3.0  # weight-gradient pass ≈ one forward's GEMMs
        pipe = m * t_max + (pp - 1) * np.maximum(t_max - 2 * w, 0)
    else:
        pipe = (m - 1) * t_max + t_stage.sum(axis=0)
    dp_e, opt_s = np.max(np.stack(dp_exp), axis=0), np.max(np.stack(opt), axis=0)
    mem_a = np.stack(mem)
    return {
        "step_time_s": pipe + dp_e + opt_s,
        "compute_s": m * (pick(P["compute"])), "recompute_s": m * pick(P["rec"]),
        "tp_comm_s": m * pick(P["tp"]), "cp_comm_s": m * pick(P["cp"]), "ep_comm_s": m * pick(P["ep"]),
        "pp_p2p_s": m * pick(P["p2p"]), "zero3_comm_s": m * pick(P["z3"]),
        "pp_bubble_s": pipe - m * t_max, "dp_comm_s": dp_e, "dp_comm_total_s": np.max(np.stack(dp_tot), axis=0),
        "optimizer_s": opt_s, "memory_bytes": mem_a.max(axis=0), "slowest_stage": s_star,
        "worst_memory_stage": np.argmax(mem_a, axis=0),
    }


def _kv_width(spec: ModelSpec, tp):
    from shardlab.specs.tensors import kv_heads_local

    return kv_heads_local(spec.num_kv_heads, tp) * spec.head_dim_
