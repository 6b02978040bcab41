"""Step time of a training layout from its parts, vectorized over candidate layouts.

For every pipeline stage s the time of one micro-batch is
    t_s = Σ_blocks (forward + backward + recomputation + exposed TP/CP/EP communication)
          + head (last stage) + embedding all-reduce (first stage) + p2p sends + exposed ZeRO-3 gathers.
The pipeline runs at the pace of its slowest stage (a straggler sets the pace):
    GPipe, 1F1B:  T = (m − 1)·max_s t_s + Σ_s t_s         (= (m + p − 1)·t for equal stages)
    interleaved:  T = m·max_s t_s + (p − 1)/v · max_s t_s  (Narayanan 2021 §2.2)
    ZB-H1:        T = m·max_s t_s + (p − 1)·(t − W) − (min(m, p) − 1)·W, t = max_s t_s, W = weight-gradient time
                  (Qi et al. 2024; = (p − 1)(t − 2W) when m ≥ p; pipeline/closed_form.py derives it)
then step = T + exposed data-parallel communication + optimizer step. The breakdown reports the
slowest stage's parts, m times, plus the bubble (T − m·t_slowest), so the parts add up to the step.

Speed: per-block quantities do not depend on the pipeline split, so they are computed once for all
candidates; candidates are then grouped by (pp, vpp, schedule), and stages of a group with the same
composition (dense/MoE block counts, embedding, head) are evaluated once. The per-block first pass is
``estimate.block_terms``; the per-unit parameter, shard, FP8, LoRA and tensor-count terms it reads are in
``estimate.unit_terms``.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from shardlab.comm import pricing as ct
from shardlab.layout import ARRAY_KEYS, ArrayLayout, Schedule, expert_grid
from shardlab.rates.hardware import memory_time_s, overlap_efficiency
from shardlab.estimate import unit_terms as ut
from shardlab.estimate.block_terms import LORA_KEYS, global_terms
from shardlab.estimate.unit_terms import stage_compositions
from shardlab.estimate.workload import Workload, workload_overheads
from shardlab.estimate.recipe_terms import fp8_weight_cast_s, offload_exposed_s, recipe_factors, stage_state_bytes
from shardlab.flops import training_flops_per_token
from shardlab.comm.moe_dispatch import overlap_runs, overlapped_ep_s
from shardlab.memory.activations import ActivationContext, in_flight, overlap_extra_in_flight
from shardlab.memory.overheads import Overheads
from shardlab.memory.precision import state_bytes
from shardlab.memory.buffers import stage_overheads
from shardlab.memory.fp8 import FP8_COPIES_BYTES, fsdp_unit_weight_bytes, primary_weight_saving, scaling_state_bytes
from shardlab.memory.lora import nf4_bits_per_weight
from shardlab.memory.training import stage_activation_bytes
from shardlab.specs.hardware import Cluster
from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import PRE

SCHEDULE_CODES = {s.value: s.code for s in Schedule}
"""'1f1b' 0, 'gpipe' 1, 'interleaved' 2, 'zb-h1' 3 (``layout.Schedule.code``)."""
OPTIMIZER_OPS_PER_TENSOR = 10
"""Operators eager AdamW (torch.optim, for-loop implementation) runs per parameter tensor: an estimate; only
matters where the accelerator has a dispatch overhead (CPUs)."""
CANDIDATE_KEYS = tuple(ARRAY_KEYS.values())
"""The array form of a Layout (``layout.ARRAY_KEYS``, generated from its fields)."""
CANDIDATE_DEFAULTS = {"rf": 1.0, "rep": 1, "wrap": 1, "etp": 0}
"""Keys a caller may leave out: recompute fraction (all blocks), HSDP replicas (none), FSDP wrap (one block), the
experts' own TP degree (0: split like the attention, over tp)."""
OUTPUT_KEYS = ("step_time_s", "compute_s", "recompute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_p2p_s",
               "pp_bubble_s", "zero3_comm_s", "dp_comm_s", "dp_comm_total_s", "cp_comm_total_s", "zero3_comm_total_s",
               "dp_window_s", "tp_comm_total_s", "ep_comm_total_s", "optimizer_s", "host_overhead_s", "offload_s", "memory_bytes", "host_bytes", "slowest_stage", "worst_memory_stage")


def evaluate(spec: ModelSpec, cluster: Cluster, wl: Workload, cands: dict, overheads: Overheads = Overheads(),
             stage_layers: tuple[int, ...] | None = None, memory: bool = True,
             recompute_modules: tuple[str, ...] | None = None) -> dict:
    """Score candidate layouts (dict of equal-length arrays, keys CANDIDATE_KEYS). Returns arrays.

    ``stage_layers`` fixes the layers of each pipeline stage (one estimate; the planner splits evenly);
    ``recompute_modules``, what the candidates' selective recomputation re-runs (``Layout.recompute_modules``).
    ``memory=False`` skips activations and overheads (model states only): the fit of efficiencies needs times."""
    n = len(cands["dp"])
    overheads = workload_overheads(wl, overheads)
    c = {k: np.asarray(cands[k]) if k in cands else np.full(n, CANDIDATE_DEFAULTS[k]) for k in CANDIDATE_KEYS}
    g = global_terms(spec, cluster, wl, c, memory, recompute_modules)
    out = {k: np.zeros(n) for k in OUTPUT_KEYS}
    keys = (c["pp"] * 64 + c["vpp"]) * 8 + c["sched"]
    order = np.argsort(keys, kind="stable")
    uniq, starts = np.unique(keys[order], return_index=True)
    bounds = list(starts) + [n]
    for gi, key in enumerate(uniq):
        idx = order[bounds[gi]:bounds[gi + 1]]
        sub = {k: v[idx] for k, v in c.items()}
        gsub = _index(g, idx)
        pp, rest = divmod(int(key), 64 * 8)
        vpp, sched = divmod(rest, 8)
        res = _evaluate_group(spec, cluster, wl, sub, gsub, pp, vpp, sched, overheads, stage_layers, memory,
                              recompute_modules)
        for k, v in res.items():
            out[k][idx] = v
    acc = cluster.accelerator
    sb = state_bytes(wl.precision, wl.optimizer, wl.main_grad_bytes)
    model_tok = float(training_flops_per_token(spec, wl.seq_len, "none")[0])
    per_mode = np.array([float(training_flops_per_token(spec, wl.seq_len, r, modules=recompute_modules)[1])
                         for r in ("none", "selective", "full", "op")])
    hw = model_tok + c["rf"] * (per_mode[c["rc"]] - model_tok)
    tokens = float(wl.global_batch * wl.seq_len)
    world = c["dp"] * c["tp"] * c["pp"] * c["cp"]
    if wl.recipe.lora is not None:  # frozen base: forward + data gradients only (estimate/lora.py)
        from shardlab.estimate.lora import lora_training_flops_per_token

        model_tok = float(lora_training_flops_per_token(spec, wl.seq_len, wl.recipe.lora)[0])
        per_mode = np.array([float(lora_training_flops_per_token(spec, wl.seq_len, wl.recipe.lora, r,
                                                               modules=recompute_modules)[1])
                             for r in ("none", "selective", "full", "op")])
        hw = model_tok + c["rf"] * (per_mode[c["rc"]] - model_tok)       # as the time: the mode and its fraction
    # utilization against the peak of the dtype the linear layers' GEMMs run in (FP8 under fp8-mixed): a ratio to the
    # bf16 peak would pass 1 where the FP8 GEMMs run above it
    peak = acc.peak_flops("fp8" if sb.gemm_dtype == "fp8" else sb.compute_dtype)
    out["tokens_per_s"] = tokens / out["step_time_s"]
    out["model_tflops_per_gpu"] = model_tok * tokens / out["step_time_s"] / world / 1e12
    out["hardware_tflops_per_gpu"] = hw * tokens / out["step_time_s"] / world / 1e12
    out["mfu"] = out["model_tflops_per_gpu"] * 1e12 / peak
    out["hfu"] = out["hardware_tflops_per_gpu"] * 1e12 / peak
    out["fits"] = out["memory_bytes"] <= acc.memory_bytes
    off = wl.recipe.offload  # offload needs a partitioned optimizer (ZeRO >= 1) or parameter shards (ZeRO-3)
    out["fits"] &= (c["zero"] >= (3 if off.params else 1 if off.optimizer else 0))
    return out


def _index(tree, idx):
    if isinstance(tree, dict):
        return {k: _index(v, idx) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_index(v, idx) for v in tree)
    a = np.asarray(tree)
    return a[idx] if a.ndim else a


def _evaluate_group(spec, cluster, wl, c, g, pp, vpp, sched, ov, stage_layers=None, memory: bool = True,
                    modules=None) -> dict:
    acc = cluster.accelerator
    sb = state_bytes(wl.precision, wl.optimizer, wl.main_grad_bytes)
    e = sb.weights
    recipe = recipe_factors(spec, wl.recipe, sb)
    gbytes = wl.grad_reduce_bytes or sb.gradients
    tp, cp, ep, dp, mb, zero, rc = (c[k] for k in ("tp", "cp", "ep", "dp", "mb", "zero", "rc"))
    sp = c["sp"].astype(bool)
    m = g["m"]
    sched_name = {v: k for k, v in SCHEDULE_CODES.items()}[sched]
    lay = ArrayLayout(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, etp=c["etp"], zero=zero, vpp=vpp, micro_batch=mb, recompute=rc,
                      sequence_parallel=sp, schedule=sched_name, recompute_fraction=c["rf"], recompute_modules=modules)
    ctx = ActivationContext(seq_len=wl.seq_len, elem_bytes=e, flash_attention=wl.flash_attention, dropout=wl.dropout,
                            fused_loss=wl.fused_loss, linear_input_bytes=1 if sb.gemm_dtype == "fp8" else 0,
                            compiled=wl.kernels == "compiled",
                            expert_imbalance=wl.moe.expert_imbalance if spec.moe is not None else 1.0)
    K = g["kinds"]
    # the MoE all-to-all overlap where Megatron-core runs it (EP > 1, no full recomputation, virtual stages with a
    # pipeline, a bf16/fp16 model): its all-to-alls hide under another micro-batch, which stays in flight too
    ep_ovl = wl.moe.ep_comm_overlap & overlap_runs(ep, rc, pp, vpp, wl.precision)
    per_kind_act = {k: v["act"] for k, v in K.items()}
    zeros = np.zeros_like(m, dtype=float)

    tensors_per_unit = ut.tensors_per_unit(spec)
    # stages with the same composition behave the same; the lowest index has the most micro-batches in flight
    classes: dict[tuple, list[int]] = {}
    comps = stage_compositions(spec, pp, vpp, stage_layers)
    for s, layers in enumerate(comps):
        counts = tuple(sum(1 for l in layers if spec.is_moe_layer(l) == k) for k in (False, True))
        classes.setdefault((counts, s == 0, s == pp - 1), []).append(s)

    rows = []
    for (counts, first, last), members in classes.items():
        s = members[0]
        layers = comps[s]
        n_tensors = sum(cnt * tensors_per_unit[kind] for kind, cnt in zip((False, True), counts)) \
            + (tensors_per_unit[PRE] if first else 0) + (tensors_per_unit[spec.num_layers] if last else 0)
        part = lambda key: sum(cnt * K[kind][key] for kind, cnt in zip((False, True), counts) if cnt) + zeros
        # the vocabulary-parallel embedding's and head's all-reduces and the loss's: no GEMM of a block to hide under
        vocab_tp = (g["emb_ar"] if first else 0.0) + (g["emb_ar"] + g["ce_ar"] if last else 0.0)
        t = {"compute": part("compute") + (g["head"] if last else 0.0), "rec": part("rec"),
             "tp": part("tp") + vocab_tp,
             "cp": part("cp"), "ep": part("ep"), "p2p": g["p2p"] + zeros,
             "host": part("host") + np.where(pp > 1, 2 * vpp * wl.pipeline_host_s, 0.0) + zeros,
             "z3": part("z3") + (K[spec.is_moe_layer(layers[0])]["z3_first"] if layers else 0.0)}
        if wl.moe.ep_comm_overlap:   # one micro-batch's all-to-alls under another's compute (comm.moe_dispatch)
            t["ep"] = np.where(ep_ovl, overlapped_ep_s(t["ep"], part("compute") + part("rec"), m,
                                                       overlap_efficiency(acc)), t["ep"])
        # model states of this stage (flat ZeRO partition; the exact per-tensor check is memory.training)
        dense = part("dense") + (g["emb_params"] if first else 0.0) + (g["head_params"] if last else 0.0)
        if last and spec.tied_embeddings and pp > 1:
            dense = dense + g["tied_params"]
        # ZeRO-3: the root unit (embedding, final norm, head: what no block holds) is gathered once per micro-batch
        # before the first block's forward and reduce-scattered after the last backward, with nothing to hide under
        # (FSDP keeps it gathered from forward through backward: Zhao et al. 2023, arXiv 2304.11277 §3.3)
        if first or last:
            root_coll = ct.zero3_collectives_s(cluster, tp=tp, cp=cp, dp=dp, ep=ep, etp=c["etp"], rep=c["rep"],
                                               dense_params=dense - part("dense"), expert_params=zeros,
                                               grad_bytes=gbytes * recipe.trainable, weight_bytes=recipe.gather_bytes,
                                               per_gpu_nic=wl.zero3_comm_per_gpu_nic)
            # DeepSpeed's module-wise ZeRO-3 releases the embedding and head after their forward: gathered again for
            # backward (comm.inventory lists the call)
            root_s = ct.zero3_edges_s(root_coll) + (root_coll["ag"] if wl.zero3_live_params else 0.0)
        else:   # a middle stage: with one unit per stage (wrap 0) its dense calls pay their latency once
            root_s = K[spec.is_moe_layer(layers[0])]["z3_d_lat"] if layers else zeros
        # one unit for the whole model: the expert group's calls pay their latency once per stage (first MoE block)
        if counts[1]:
            root_s = root_s + K[True]["z3_x_lat"]
        # what the CP and ZeRO-3 collectives take in all, hidden or not (comm plan's inventory prices the same calls):
        # the first block unit's gather and last reduce-scatter are counted once, as traffic, not again as an edge
        t["z3"] = t["z3"] + np.where(zero == 3, root_s, 0.0)
        all_s = {"cp": part("cp_total"), "tp": part("tp_total") + vocab_tp, "ep": part("ep"),
               "z3": part("z3_total") + np.where(zero == 3, root_s, 0.0)}
        expert = part("expert")
        total_p = dense + expert
        D, De = dp * cp // c["rep"], expert_grid(tp, cp, dp, ep, c["etp"], c["rep"])["edp"]
        flat = np.ceil(dense / D) + np.ceil(expert / De)
        # ZeRO-3 stores every tensor's padded shard (the exact report's worst rank), ZeRO-1/2 a flat partition
        shards = part("fsdp") + (g["emb_fsdp"] if first else 0.0) + (g["head_fsdp"] if last else 0.0) \
            + (g["tied_fsdp"] if last and spec.tied_embeddings and pp > 1 else 0.0)
        z3_p = np.where(zero >= 3, shards, flat)
        w_b = np.where(zero >= 3, z3_p, total_p) * sb.weights
        g_b = np.where(zero >= 2, z3_p, total_p) * sb.gradients
        o_b = np.where(zero >= 1, z3_p, total_p) * sb.optimizer
        f_states = recipe
        if wl.recipe.lora is not None:    # frozen base + adapters, per tensor (memory.lora.lora_state_report)
            roots = ([g["lora_roots"][PRE]] if first else []) + ([g["lora_roots"][spec.num_layers]] if last else []) \
                + ([g["lora_roots"]["tied"]] if last and spec.tied_embeddings and pp > 1 else [])
            lp = {k: part(k) + sum(r[k] for r in roots) for k in LORA_KEYS}
            a_flat = np.ceil(lp["lora_adapter"] / D)
            w_b = np.where(zero >= 3, lp["lora_base_z3"] + lp["lora_adapter_z3"] * sb.weights,
                           lp["lora_base"] + lp["lora_adapter"] * sb.weights)
            g_b = np.select([zero >= 3, zero == 2], [lp["lora_adapter_z3"], a_flat], lp["lora_adapter"]) * sb.gradients
            o_b = np.select([zero >= 3, zero >= 1], [lp["lora_adapter_z3"], a_flat], lp["lora_adapter"]) * sb.optimizer
            f_states = replace(recipe, trainable=1.0, weight_bytes=sb.weights)
        if wl.fp8_params:   # the FP8 GEMM weights' bf16 copies go; routed experts shard over the expert group
            fp8_expert = np.minimum(part("expert"), part("fp8_numel"))
            w_b = w_b - primary_weight_saving(part("fp8_numel"), np.ceil((part("fp8_numel") - fp8_expert) / D)
                                              + np.ceil(fp8_expert / De), zero, sb.weights)
        w_b, g_b, o_b, host = stage_state_bytes(w_b, g_b, o_b, np.where(zero >= 3, z3_p, total_p), zero, f_states,
                                                wl.recipe, sb)
        mem = w_b + g_b + o_b
        if wl.precision == "fp8-mixed":   # memory.fp8.fp8_extra_bytes: the FP8 weight cache (not under ZeRO-3), scaling
            fp8 = wl.recipe.fp8
            mem = mem + np.where((zero < 3) & fp8.weight_cache, FP8_COPIES_BYTES * part("fp8_numel"), 0.0) \
                + scaling_state_bytes(part("fp8_gemms"), fp8)
        if memory:
            nif = in_flight(lay, s, m) + np.where(ep_ovl, overlap_extra_in_flight(lay), 0.0)
            acts = stage_activation_bytes(spec, layers, lay, ctx, nif, holds_embedding=first, holds_head=last,
                                          per_kind=per_kind_act)
            if wl.recipe.lora is not None:   # adapters' r-wide intermediates; the transient bf16 copy of an NF4 weight
                acts = acts + nif * part("lora_act")
                mem = mem + np.maximum.reduce([K[k]["dequant"] for kind, k in zip(counts, (False, True)) if kind]
                                              + [zeros])
            # the embedding, final norm and head are the root unit (memory.buffers.largest_unit_bytes)
            # (tied embeddings over stages: the last stage's head is its copy of the word embedding)
            head_p = g["head_params"] + (g["tied_params"] if spec.tied_embeddings and pp > 1 else 0.0)
            root = (g["emb_params"] if first else 0.0) + (head_p if last else 0.0) + zeros
            blocks = [K[k]["dense"] + K[k]["expert"] for kind, k in zip(counts, (False, True)) if kind]
            unit = np.maximum.reduce(blocks + [root])
            bucket = np.maximum.reduce(blocks + ([g["emb_params"]] if first else []) + ([head_p] if last else [])
                                       + [zeros])     # ZeRO-1/2 buckets: the largest single module
            # a gathered unit's bytes as the exact report counts them (memory.training._stage_memory): FP8 copies
            # beside the gathered weights; a frozen base has no gradient buckets and gathers its NF4 weights
            unit_w, unit_g, bucket_g = unit * sb.weights, unit * sb.gradients, bucket * sb.gradients
            if wl.precision == "fp8-mixed":
                unit_w = unit * fsdp_unit_weight_bytes(wl.recipe.fp8)
            if wl.recipe.lora is not None:
                lora = wl.recipe.lora
                unit_w = unit_w * (nf4_bits_per_weight(lora) / 16 if lora.quantize_base == "nf4" else 1.0)
                unit_g = bucket_g = 0.0
            other = stage_overheads(spec, lay, ctx, ov, n_in_flight=nif, acts=acts, gradient_bytes=g_b,
                                    unit_weight_bytes=unit_w, unit_grad_bytes=unit_g, holds_head=last,
                                    has_moe=counts[1] > 0, unit_params=unit, bucket_grad_bytes=bucket_g)
            mem = mem + acts + sum(np.asarray(v, dtype=float) for v in other.values())
        exp, tot = ct.dp_step_s(g["dp_coeffs"], zero=zero, params_local=total_p * recipe.trainable, grad_bytes=gbytes,
                                weight_bytes=recipe.gather_bytes if wl.fp8_params else sb.weights, microbatches=m,
                                bwd_last_s=part("bwd"), overlap=wl.dp_overlap,
                                expert_params_local=expert * recipe.trainable, eta=overlap_efficiency(acc))
        # optimizer: read the gradient, read and write master weights and moments, write the weights;
        # eager (for-loop) AdamW dispatches about OPTIMIZER_OPS_PER_TENSOR operators per parameter tensor
        opt = memory_time_s(np.where(zero >= 1, flat, total_p) * recipe.trainable * (sb.gradients + 2 * sb.optimizer + sb.weights),
                            acc) + OPTIMIZER_OPS_PER_TENSOR * n_tensors * acc.op_overhead_us * 1e-6
        opt = opt + fp8_weight_cast_s(np.where(zero >= 3, flat, total_p), recipe, acc)
        if wl.recipe.offload.optimizer:  # the optimizer step runs on the CPU (in offload_s), not on the GPU
            opt = opt * 0
        off = offload_exposed_s(wl.recipe, partition_params=np.where(zero >= 1, flat, total_p), microbatches=m,
                                compute_per_microbatch_s=t["compute"] + t["rec"], backward_last_s=part("bwd"),
                                gpus_per_node=min(cluster.gpus_per_node, cluster.num_gpus), f=recipe)
        rows.append(dict(s=s, count=len(members), t=t, all_s=all_s, time=sum(t.values()), mem=mem, dp=exp, dp_total=tot, opt=opt,
                         off=off + zeros, host=host + zeros, bwd=part("bwd")))

    times = np.stack([r["time"] for r in rows])                 # (classes, candidates)
    star = np.argmax(times, axis=0)
    pick = lambda arr: np.take_along_axis(arr, star[None, :], axis=0)[0]
    t_max = pick(times)
    if pp == 1:
        pipe = m * t_max
    elif sched == SCHEDULE_CODES["interleaved"]:
        pipe = m * t_max + (pp - 1) / vpp * t_max
    elif sched == SCHEDULE_CODES["zb-h1"]:
        # weight-gradient pass ≈ one forward: compute = F + B = 3F already leaves recomputation out (it is "rec")
        w = pick(np.stack([r["t"]["compute"] for r in rows])) / 3.0
        pipe = m * t_max + np.maximum((pp - 1) * (t_max - w) - (np.minimum(m, pp) - 1) * w, 0)
    else:
        pipe = (m - 1) * t_max + sum(r["count"] * r["time"] for r in rows)
    parts = {key: pick(np.stack([r["t"][key] for r in rows])) for key in rows[0]["t"]}
    dp_all = np.stack([r["dp"] for r in rows])
    dp_e = dp_all.max(axis=0)
    # the window the exposed DP reduction hid under: the blocks' backward of the last micro-batch on that stage
    dp_window = np.take_along_axis(np.stack([r["bwd"] for r in rows]), np.argmax(dp_all, axis=0)[None], 0)[0]
    opt_s = np.max(np.stack([r["opt"] for r in rows]), axis=0)
    off_s = np.max(np.stack([r["off"] for r in rows]), axis=0)
    mem = np.stack([r["mem"] for r in rows])
    stage_ids = np.array([r["s"] for r in rows])
    return {
        "step_time_s": pipe + g["tied_ar"] + dp_e + opt_s + off_s + wl.step_overhead_s, "offload_s": off_s,
        "host_overhead_s": m * parts["host"] + wl.step_overhead_s,
        "host_bytes": np.max(np.stack([r["host"] for r in rows]), axis=0),
        "compute_s": m * parts["compute"], "recompute_s": m * parts["rec"], "tp_comm_s": m * parts["tp"],
        "cp_comm_s": m * parts["cp"], "ep_comm_s": m * parts["ep"], "pp_p2p_s": m * parts["p2p"] + g["tied_ar"],
        "zero3_comm_s": m * parts["z3"], "pp_bubble_s": pipe - m * t_max, "dp_comm_s": dp_e,
        "cp_comm_total_s": m * pick(np.stack([r["all_s"]["cp"] for r in rows])),
        "tp_comm_total_s": m * pick(np.stack([r["all_s"]["tp"] for r in rows])),
        "ep_comm_total_s": m * pick(np.stack([r["all_s"]["ep"] for r in rows])),
        "zero3_comm_total_s": m * pick(np.stack([r["all_s"]["z3"] for r in rows])),
        "dp_comm_total_s": np.max(np.stack([r["dp_total"] for r in rows]), axis=0), "dp_window_s": dp_window,
        "optimizer_s": opt_s,
        "memory_bytes": mem.max(axis=0), "slowest_stage": stage_ids[star], "worst_memory_stage": stage_ids[np.argmax(mem, axis=0)],
    }

