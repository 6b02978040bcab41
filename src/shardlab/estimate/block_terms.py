"""The per-candidate terms of a training step that do not depend on the pipeline split (``estimate.step``'s first
pass): for each block kind (dense, MoE) its forward, backward and recomputation times, its TP/CP/EP/ZeRO-3
communication, host time, parameters and saved activations, and the model's embedding, head and optimizer terms,
all as arrays over candidate layouts."""

from __future__ import annotations

import numpy as np

from shardlab.comm import pricing as ct
from shardlab.layout import ArrayLayout, expert_grid
from shardlab.rates.compute import block_step_times, head_times, layer_times
from shardlab.rates.hardware import matmul_curve, overlap_efficiency
from shardlab.estimate import unit_terms as ut
from shardlab.estimate.workload import Workload
from shardlab.estimate.lora import lora_block_times
from shardlab.estimate.recipe_terms import recipe_factors
from shardlab.memory.activations import ActivationContext, layer_activation_bytes
from shardlab.memory.precision import state_bytes
from shardlab.memory.lora import lora_activation_bytes
from shardlab.specs.hardware import Cluster
from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import PRE, TensorSpec, kv_width_local

LORA_KEYS = ("lora_base", "lora_base_z3", "lora_adapter", "lora_adapter_z3")
"""Per unit under LoRA/QLoRA (``lora_units``): frozen base bytes (without / with ZeRO-3), adapter elements (local /
padded ZeRO-3 shard)."""


def global_terms(spec: ModelSpec, cluster: Cluster, wl: Workload, c: dict, memory: bool = True, modules=None) -> dict:
    """Per-candidate quantities that do not depend on the pipeline split (``c``: the candidates' arrays,
    ``estimate.step.CANDIDATE_KEYS``; ``modules``: what selective recomputation re-runs)."""
    acc = cluster.accelerator
    curve, _ = matmul_curve(acc)
    overlap = overlap_efficiency(acc)
    sb = state_bytes(wl.precision, wl.optimizer, wl.main_grad_bytes)
    e, dtype = sb.weights, sb.compute_dtype
    gbytes = wl.grad_reduce_bytes or sb.gradients
    tp, cp, ep, dp, mb, zero, rc, sp, rf = (c[k] for k in ("tp", "cp", "ep", "dp", "mb", "zero", "rc", "sp", "rf"))
    etp = c["etp"]
    grid = expert_grid(tp, cp, dp, ep, etp, c["rep"])      # the experts' TP, EP and expert-DP groups
    sp = sp.astype(bool)
    T = mb * wl.seq_len / cp
    h = spec.hidden_size
    lay = ArrayLayout(dp=dp, tp=tp, cp=cp, ep=ep, etp=etp, zero=zero, micro_batch=mb, recompute=rc, sequence_parallel=sp,
                      recompute_fraction=rf, recompute_modules=modules)
    ctx = ActivationContext(seq_len=wl.seq_len, elem_bytes=e, flash_attention=wl.flash_attention, dropout=wl.dropout,
                            fused_loss=wl.fused_loss, linear_input_bytes=1 if sb.gemm_dtype == "fp8" else 0,
                            compiled=wl.kernels == "compiled",
                            expert_imbalance=wl.moe.expert_imbalance if spec.moe is not None else 1.0)
    common = dict(seq_len=wl.seq_len, tp=tp, cp=cp, micro_batch=mb, sequence_parallel=sp, elem_bytes=e)
    recipe = recipe_factors(spec, wl.recipe, sb)
    params = ut.unit_params(spec, tp, ep, etp)
    fsdp = ut.fsdp_shard_params(spec, tp, ep, dp * cp // c["rep"], grid["edp"], etp)
    fp8_terms = ut.fp8_block_terms(spec, tp, ep, etp)
    lora_u = (ut.lora_units(spec, wl.recipe.lora, tp, ep, dp * cp // c["rep"], grid["edp"], etp)
              if wl.recipe.lora is not None else None)
    lora_of = lambda key: dict(zip(LORA_KEYS, (v + np.zeros_like(T) for v in lora_u[key]))) if lora_u else {}   # noqa: E731
    kinds = {}
    for layer in sorted({next(i for i in range(spec.num_layers) if spec.is_moe_layer(i) == k)
                         for k in {spec.is_moe_layer(i) for i in range(spec.num_layers)}}):
        kind = spec.is_moe_layer(layer)
        lt = layer_times(spec, layer, acc, curve, dtype, ep=ep, flash_attention=wl.flash_attention, dropout=wl.dropout,
                         kernels=wl.kernels, attention_kernel=wl.attention_kernel, gemm_dtype=sb.gemm_dtype, etp=etp,
                         **common)
        f = wl.moe.expert_imbalance if kind else 1.0
        if f != 1.0:     # the busiest EP rank's experts see f × the mean tokens; every all-to-all waits for it
            extra = (f - 1.0) * lt["expert_gemm_s"] * (np.asarray(ep) > 1)
            lt = {**lt, "gemm_s": lt["gemm_s"] + extra,
                  "module_recompute_s": {**lt["module_recompute_s"], "moe": lt["module_recompute_s"]["moe"] + extra}}
        bt = block_step_times(lt, rc, c["rf"], modules) if wl.recipe.lora is None else \
            lora_block_times(spec, layer, wl.recipe.lora, lt, T, tp, ep, rc, acc, curve, dtype, etp, c["rf"], modules)
        dense, expert = params[kind]
        # an FSDP unit of `wrap` blocks (wrap 0: the whole model, priced per micro-batch at the stage's edges)
        # a unit holds at most a stage's blocks (memory.buffers.largest_unit_bytes: --wrap 1000-blocks on 32 layers is
        # one unit of 32, not of 1,000)
        nb = np.where(c["wrap"] > 0, np.minimum(c["wrap"], -(-spec.num_layers // np.asarray(c["pp"]))), 1)
        coll = ct.zero3_collectives_s(cluster, tp=tp, cp=cp, dp=dp, ep=ep, etp=etp, rep=c["rep"], dense_params=nb * dense,
                                      expert_params=nb * expert, grad_bytes=gbytes * recipe.trainable,
                                      weight_bytes=recipe.gather_bytes, per_gpu_nic=wl.zero3_comm_per_gpu_nic)
        regathers = np.where((rc == 2) & wl.zero3_regather_for_recompute, 1, 0)
        z3_unit, z3_unit_total = ct.zero3_per_microbatch_s(coll, fwd_unit_s=nb * bt["fwd_s"],
                                               bwd_unit_s=nb * (bt["bwd_s"] + bt["recompute_s"]), regathers=regathers,
                                               overlap=wl.dp_overlap, prefetch=wl.zero3_prefetch, eta=overlap)
        # per block; one unit for the whole model (wrap 0) hides nothing: one gather before the forward and one
        # reduction after the backward, so a block adds its bytes (the α–β time is linear in the size: twice the
        # block's time less once is its bandwidth term) and the stage pays each call's latency once (the root's edge,
        # and the expert group's, ``z3_x_lat``)
        coll2 = ct.zero3_collectives_s(cluster, tp=tp, cp=cp, dp=dp, ep=ep, etp=etp, rep=c["rep"],
                                       dense_params=2 * nb * dense,
                                       expert_params=2 * nb * expert, grad_bytes=gbytes * recipe.trainable,
                                       weight_bytes=recipe.gather_bytes, per_gpu_nic=wl.zero3_comm_per_gpu_nic)
        one_unit = sum(coll2[k] - coll[k] for k in ("ag", "rs", "ar"))
        z3 = np.where(c["wrap"] > 0, z3_unit / nb, one_unit)
        z3_total = np.where(c["wrap"] > 0, z3_unit_total / nb, one_unit)
        x_lat = np.where((c["wrap"] == 0) & (expert > 0), sum(ct.zero3_unit_collectives_s(
            cluster, shard=grid["edp"], stride=grid["edp_stride"], rep=c["rep"], unit_params=0,
            grad_bytes=1, weight_bytes=1, per_gpu_nic=wl.zero3_comm_per_gpu_nic).values()), 0.0)
        d_lat = np.where(c["wrap"] == 0, sum(ct.zero3_unit_collectives_s(
            cluster, shard=dp * cp // c["rep"], stride=tp, rep=c["rep"], unit_params=0, grad_bytes=1, weight_bytes=1,
            per_gpu_nic=wl.zero3_comm_per_gpu_nic).values()), 0.0)
        # a MoE block: the dispatcher's TP gather/scatter replace the MLP's TP pair (a shared expert keeps it)
        tp_all = ct.tp_per_block_s(cluster, tp=tp, tokens=T, hidden=h, elem_bytes=e, recompute_code=rc,
                                   mlp=not (kind and not spec.moe.shared_width),
                                   rerun_mlp=bool(({"moe", "shared_experts"} if kind else {"mlp"}) & set(modules or ())))
        kinds[kind] = dict(
            compute=bt["fwd_s"] + bt["bwd_s"], rec=bt["recompute_s"], bwd=bt["bwd_s"] + bt["recompute_s"],
            tp_total=tp_all, tp=ct.tp_exposed_per_block_s(tp_all, lt["gemm_s"], rc, tp, sp) if wl.tp_comm_overlap
            else tp_all,
            cp=ct.cp_per_block_s(cluster, tp=tp, cp=cp, tokens=T, kv_width=kv_width_local(spec, tp),
                                 elem_bytes=e, attn_fwd_s=lt["attn_s"], recompute_code=rc, eta=overlap),
            cp_total=ct.cp_per_block_s(cluster, tp=tp, cp=cp, tokens=T, kv_width=kv_width_local(spec, tp), elem_bytes=e,
                                       attn_fwd_s=lt["attn_s"], recompute_code=rc, total=True),
            ep=(ct.ep_per_moe_block_s(cluster, tp=tp, cp=cp, ep=ep, tokens=T, hidden=h, top_k=spec.moe.top_k, elem_bytes=e,
                                      recompute_code=rc, num_experts=spec.moe.num_experts,
                                      rerun_moe="moe" in (modules or ()), dispatcher=wl.moe.dispatcher,
                                      imbalance=f, etp=etp) if kind else np.zeros_like(T)),
            z3=np.where(zero == 3, z3, 0.0), z3_total=np.where(zero == 3, z3_total, 0.0),
            z3_x_lat=np.where(zero == 3, x_lat, 0.0), z3_d_lat=np.where(zero == 3, d_lat, 0.0),
            fp8_numel=fp8_terms[kind][0] + np.zeros_like(T), fp8_gemms=fp8_terms[kind][1] + np.zeros_like(T),
            **lora_of(kind),
            lora_act=(lora_activation_bytes(spec, layer, lay, ctx, wl.recipe.lora) if wl.recipe.lora is not None and memory
                      else 0.0) + np.zeros_like(T),
            dequant=(ut.dequant_bytes(spec, layer, tp, ep, wl.recipe.lora, etp) if wl.recipe.lora is not None else 0.0)
            + np.zeros_like(T),
            z3_first=np.where((zero == 3) & (c["wrap"] > 0), ct.zero3_edges_s(coll), 0.0),
            # forward, backward (+ re-run forward); FSDP's per-unit hooks stall only where units are gathered every
            # micro-batch (ZeRO-3: Framework.layer_host_min_zero)
            host=np.where(zero >= wl.layer_host_min_zero, wl.layer_host_s, 0.0) * (2 + np.where(rc >= 2, rf, 0.0)),
            dense=dense + np.zeros_like(T), expert=expert + np.zeros_like(T), fsdp=fsdp[kind] + np.zeros_like(T),
            act=layer_activation_bytes(spec, layer, lay, ctx) if memory else None)
    # tied embeddings split over stages: the last stage's copy of the word embedding (memory.states.stage_tensors)
    tied = np.prod(np.broadcast_arrays(*TensorSpec("output.weight", (spec.vocab_size, spec.embedding_dim), spec.num_layers,
                                                   "head", tp_dim=0).local_shape(spec, tp, ep)), axis=0)
    head = head_times(spec, acc, curve, dtype, kernels=wl.kernels, fused_loss=wl.fused_loss, **common)
    return dict(
        kinds=kinds, head=head["fwd_s"] + (head["fwd_s"] if wl.recipe.lora is not None else head["bwd_s"]),  # frozen: dgrad
        emb_ar=ct.tp_embedding_head_s(cluster, tp=tp, tokens=T, hidden=h, elem_bytes=e),
        ce_ar=ct.tp_cross_entropy_s(cluster, tp=tp, tokens=T),
        tied_params=tied + np.zeros_like(T),
        tied_ar=(ct.tied_embedding_s(cluster, tp=tp, cp=cp, dp=dp, pp=c["pp"], elements=tied,
                                     grad_bytes=gbytes * recipe.trainable) if spec.tied_embeddings else np.zeros_like(T)),
        p2p=ct.pp_p2p_per_microbatch_s(cluster, tp=tp, cp=cp, dp=dp, pp=c["pp"], vpp=c["vpp"], tokens=T, hidden=h, elem_bytes=e),
        emb_params=params[PRE][0] + np.zeros_like(T), head_params=params[spec.num_layers][0] + np.zeros_like(T),
        emb_fsdp=fsdp[PRE] + np.zeros_like(T), head_fsdp=fsdp[spec.num_layers] + np.zeros_like(T),
        tied_fsdp=fsdp["tied"] + np.zeros_like(T),
        lora_roots={key: lora_of(key) for key in (PRE, spec.num_layers, "tied") if key in (lora_u or {})},
        m=wl.global_batch // (mb * dp), dp_coeffs=ct.dp_coefficients(cluster, tp=tp, cp=cp, dp=dp, ep=ep, rep=c["rep"],
                                                                      etp=etp))
