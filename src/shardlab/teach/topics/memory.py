"""Memory topics: the two pressures, bytes per parameter, ZeRO stages, FSDP wrap units (topics/fsdp.py), activation
checkpointing."""

from __future__ import annotations

from shardlab.teach.explanation import Explanation
from shardlab.teach.params import Param
from shardlab.teach.registry import Topic
from shardlab.teach.topics.fsdp import fsdp_wrap
from shardlab.teach.topics._common import (OPTIMIZERS, PRECISIONS, catalog, cluster, gb, gib, gpu, model, num,
                                           optimizer, pct, precision)
from shardlab.units import fmt_count


def two_pressures(v: dict) -> Explanation:
    """Memory pressure: does one GPU hold the training state? Time pressure: how long on one GPU vs the deadline?"""
    from shardlab.estimate import estimate_training
    from shardlab.flops import six_psi_d, training_flops_per_token
    from shardlab.layout import Layout
    from shardlab.memory.precision import state_bytes
    from shardlab.specs.tensors import param_counts

    spec, cl = catalog().model(v["model"]), cluster(v["gpu"], 1)
    acc = cl.accelerator
    seq = min(spec.max_seq_len, 4096)
    est = estimate_training(spec, Layout(), cl, seq_len=seq, global_batch=1, precision=v["precision"])
    mem = est.memory                  # the default framework's (megatron-lm: fp32 gradients under bf16), as `memory` says
    w = mem.worst
    sb = state_bytes(v["precision"], "adamw", est.workload.main_grad_bytes)
    active = param_counts(spec).active
    one_gpu_days = v["tokens"] / est.tokens_per_s / 86400
    gpus_needed = -(-one_gpu_days // v["days"])
    memory_p, time_p = w.model_states > acc.memory_bytes, one_gpu_days > v["days"]
    verdict = {(True, True): "both pressures: shard the state (ZeRO-3/FSDP, TP, PP) AND add replicas (DP)",
               (True, False): "memory pressure: shard the state (ZeRO/FSDP, TP or PP); speed is not the problem",
               (False, True): "time pressure: the state fits, add data-parallel replicas (DDP) to finish in time",
               (False, False): "neither: one GPU holds it and finishes in time; do not distribute"}[(memory_p, time_p)]
    flops = six_psi_d(active, v["tokens"])
    per_token, _ = training_flops_per_token(spec, seq)            # the FLOPs the step model counts (Korthikanti Eq. 7)
    sustained = est.tokens_per_s * per_token                        # model FLOP/s of the one GPU
    return Explanation(
        "two-pressures", "The two reasons to distribute: memory and time",
        f"Does training {spec.name} on {fmt_count(v['tokens'])} tokens face memory pressure, time pressure, or both, "
        f"on {acc.id} GPUs with a {v['days']:g}-day deadline?",
        dict(v),
        [f"model states on one GPU: {fmt_count(w.params)} params × {sb.total:g} B "
         f"(AdamW, {v['precision']}, {est.workload.framework}) = {gib(w.model_states)} (weights {gib(w.weights)} + gradients {gib(w.gradients)} "
         f"+ optimizer {gib(w.optimizer)})",
         f"plus activations of one {seq}-token sequence {gib(w.activations)} and overheads {gib(w.other_total)} = "
         f"{gib(w.total)} against {gib(acc.memory_bytes)} on the {acc.id}: "
         + ("the states alone do not fit (memory pressure)" if memory_p else
            "the states fit" + ("" if mem.fits else ", though activations and overheads push it over: shard or recompute")),
         f"compute: C ≈ 6ΨD = 6 × {fmt_count(active)} × {fmt_count(v['tokens'])} = {flops:.3g} FLOPs (Kaplan's rule "
         f"of thumb); counted per token as the step model does (3 × forward: every matmul, attention over the "
         f"{seq}-token context and the logits, Korthikanti Eq. 7) it is {per_token:.4g} FLOPs × {fmt_count(v['tokens'])} "
         f"= {per_token * v['tokens']:.3g} FLOPs",
         f"one {acc.id} sustains {sustained / 1e12:.1f} TFLOP/s of model FLOPs (the estimated MFU {pct(est.mfu)} of its "
         f"peak) → {sustained:.3g} / {per_token:.4g} = {est.tokens_per_s:,.0f} tokens/s → {fmt_count(v['tokens'])} "
         f"tokens take {one_gpu_days:,.1f} days",
         f"against a {v['days']:g}-day deadline: at least {gpus_needed:,.0f} GPUs at perfect scaling "
         + ("(time pressure)" if time_p else "(no time pressure)"),
         f"verdict: {verdict}"],
        f"There are two reasons to spread training over GPUs. Memory: {spec.name} needs {gib(w.model_states)} just for "
        f"its weights, gradients and optimizer state, and the {acc.id} has {gib(acc.memory_bytes)}"
        + (", so the state must be split (ZeRO-3/FSDP, tensor or pipeline parallelism)." if memory_p else ", so one GPU holds it.")
        + f" Time: one GPU would need {one_gpu_days:,.0f} days for {fmt_count(v['tokens'])} tokens; the deadline is "
        f"{v['days']:g} days, so " + (f"at least {gpus_needed:,.0f} GPUs must share the work (data parallelism)."
                                      if time_p else "speed alone does not call for more GPUs.")
        + " Naming the pressure first is what picks the strategy.",
        {"model_states_bytes": w.model_states, "total_bytes": w.total, "capacity_bytes": acc.memory_bytes,
         "memory_pressure": memory_p, "one_gpu_days": one_gpu_days, "gpus_for_deadline": int(gpus_needed),
         "time_pressure": time_p, "flops": flops, "model_flops_per_token": per_token,
         "model_flops": per_token * v["tokens"], "tokens_per_s": est.tokens_per_s, "model_flops_per_s": sustained},
        sources=["zero", "kaplan", "korthikanti"], code=[],
        commands=[f"memory {spec.name} --gpus 1 --gpu {acc.id} --precision {v['precision']}",
                  f"estimate {spec.name} --gpus 1 --gpu {acc.id} --tokens {num(v['tokens'])}"],
        notes=[f"MFU from shardlab's step-time model (one GPU, micro-batch 1, seq {seq}); scaling is never perfect"])


def bytes_per_param(v: dict) -> Explanation:
    """Bytes per parameter for every precision and optimizer, and what they cost for the learner's Ψ."""
    from shardlab.layout import Layout
    from shardlab.memory.precision import state_bytes
    from shardlab.memory.states import state_report_from_count

    n = v["params"]
    acc = catalog().accelerator(v["gpu"])
    rows, totals = [], {}
    for p in PRECISIONS:
        for o in OPTIMIZERS:
            sb = state_bytes(p, o)
            st = state_report_from_count(n, Layout(), sb)
            totals[(p, o)] = st.total
            rows.append([p, "sgd (momentum)" if o == "sgd" else o, sb.weights, sb.gradients, sb.master, f"{sb.moments:g}",
                         f"{sb.total:g}", gb(st.total),
                         "yes" if st.total <= acc.memory_bytes else "no"])
    sb = state_bytes(v["precision"], v["optimizer"])
    st = state_report_from_count(n, Layout(), sb)
    fp32 = totals[("fp32", v["optimizer"])]
    mixed = totals[("bf16-mixed", v["optimizer"])]
    weights_fp16 = n * state_bytes("bf16-mixed", "adamw").weights
    small = st.total < 1e9
    unit = (lambda b: f"{b / 1e6:,.2f} MB") if small else gb
    return Explanation(
        "bytes-per-param", "Bytes per parameter: precision × optimizer",
        f"How much memory do the weights, gradients and optimizer state of {fmt_count(n)} parameters take in "
        f"{v['precision']} with {v['optimizer']}, and does it fit one {acc.id}?",
        dict(v),
        [f"{v['precision']} + {v['optimizer']}: weights {sb.weights} B + gradients {sb.gradients} B + fp32 master "
         f"{sb.master} B + moments {sb.moments:g} B = {sb.total:g} B per parameter",
         f"{fmt_count(n)} × {sb.total:g} B = {unit(st.total)} (weights {unit(st.weights)}, gradients {unit(st.gradients)}, "
         f"optimizer {unit(st.optimizer)})",
         f"against {gib(acc.memory_bytes)} on the {acc.id}: {'fits' if st.total <= acc.memory_bytes else 'does NOT fit'} "
         "before activations",
         f"fp32 + {v['optimizer']}: {unit(fp32)}; bf16-mixed: {unit(mixed)}: mixed precision keeps an fp32 master copy "
         f"(4 B) beside the 2-B weights, so model states are {'the same' if fp32 == mixed else f'{100 * mixed / fp32:.0f}% of fp32'}, "
         "not half; the saving is in activations (2 B instead of 4) and in speed",
         f"inference needs only the weights: {fmt_count(n)} × 2 B (fp16/bf16) = {unit(weights_fp16)}",
         f"training holds {sb.weights}-B weights; against them its model states are {sb.total:g}/{sb.weights} = "
         f"{sb.total / sb.weights:g}× "
         f"with {v['precision']} + {v['optimizer']}, the optimizer state alone (master + moments) "
         f"{(sb.master + sb.moments) / sb.weights:g}×; the '4×' rule of thumb is fp32 + Adam's 16/4 bytes "
         f"({state_bytes('fp32', 'adamw').total:g} B against 4-B weights)"],
        f"Every parameter costs bytes in four places: the weight, its gradient, and the optimizer's state. With "
        f"{v['precision']} and {v['optimizer']} that is {sb.total:g} bytes, so {fmt_count(n)} parameters need "
        f"{unit(st.total)} before a single activation. Mixed precision does not halve this: it keeps an fp32 master copy "
        f"and fp32 moments, which is why 16 bytes per parameter is the number to remember for Adam. For inference only the "
        f"2-byte weights remain: {unit(weights_fp16)}.",
        {"bytes_per_param": sb.total, "model_states_bytes": st.total, "weights_bytes": st.weights,
         "fp32_bytes": fp32, "bf16_mixed_bytes": mixed, "inference_weights_bytes": weights_fp16,
         "fits": st.total <= acc.memory_bytes},
        table=(["precision", "optimizer", "weights B", "grads B", "master B", "moments B", "B/param", "total", f"fits {acc.id}"],
               rows),
        sources=["zero", "mixed-precision", "eleuther-math"], code=["meg-master", "meg-distopt"],
        commands=[f"memory --params {num(n)} --precision {v['precision']} --optimizer {v['optimizer']} --gpu {acc.id} "
                  "--framework deepspeed"],
        notes=["8-bit Adam (bitsandbytes) keeps its moments in 1 byte each plus ~0.2% block scales (not counted)",
               "Megatron-LM (shardlab's default framework) holds bf16-mixed gradients in fp32: 18 bytes per parameter "
               "(its distributed-optimizer guide); the ZeRO paper's 16 are DeepSpeed's, hence --framework deepspeed"])


def zero_stages(v: dict) -> Explanation:
    """The ZeRO paper's table for the learner's Ψ and N_d, and the communication each stage adds."""
    from shardlab.comm.collectives import ab_terms
    from shardlab.layout import Layout
    from shardlab.memory.precision import state_bytes
    from shardlab.memory.states import state_report_from_count

    n, d, z = v["params"], v["gpus"], v["stage"]
    sb = state_bytes(v["precision"], v["optimizer"])
    shards = ["nothing (plain data parallelism)", "optimizer state", "optimizer state + gradients",
              "optimizer state + gradients + weights (= FSDP)"]
    g = n * sb.gradients
    ar, rs, ag = (float(ab_terms(op, d)[1]) for op in ("all-reduce", "reduce-scatter", "all-gather"))
    traffic = [ar * g, ar * g, ar * g, (rs + 2 * ag) * g]  # bytes through each rank's link per step
    rows, reps = [], []
    for s in range(4):
        st = state_report_from_count(n, Layout(dp=d, zero=s), sb)
        reps.append(st)
        rows.append([s, shards[s], gb(st.weights), gb(st.gradients), gb(st.optimizer), gb(st.total), gb(traffic[s])])
    st, base = reps[z], reps[0]
    K = sb.optimizer
    formula = [f"{sb.weights + sb.gradients + K:g}Ψ", f"{sb.weights + sb.gradients:g}Ψ + {K:g}Ψ/N_d",
               f"{sb.weights:g}Ψ + {sb.gradients + K:g}Ψ/N_d", f"{sb.weights + sb.gradients + K:g}Ψ/N_d"][z]
    return Explanation(
        "zero", f"ZeRO stage {z}: what it shards and what it costs",
        f"ZeRO-{z} on {d} GPUs for {fmt_count(n)} parameters in {v['precision']} with {v['optimizer']}: model-state bytes "
        f"per GPU, and the gradient/parameter traffic per step?",
        dict(v),
        [f"bytes per parameter: weights {sb.weights} + gradients {sb.gradients} + optimizer K = {K:g} "
         f"(fp32 master {sb.master} + moments {sb.moments:g}) [ZeRO §3.1]",
         f"ZeRO-{z} shards {shards[z]}: per GPU {formula} = {gb(st.total)} with Ψ = {fmt_count(n)}, N_d = {d} "
         f"(weights {gb(st.weights)}, gradients {gb(st.gradients)}, optimizer {gb(st.optimizer)})",
         f"versus no sharding: {gb(base.total)} per GPU, {base.total / st.total:.2f}× more",
         f"traffic: DDP all-reduces the gradients; ZeRO-1 and ZeRO-2 reduce-scatter them and all-gather the updated "
         f"weights, the same volume: "
         f"2(n−1)/n × {gb(g)} = {gb(traffic[0])} through each GPU's link per step",
         f"ZeRO-3 re-gathers the weights in forward and in backward and reduce-scatters gradients: "
         f"3 × (n−1)/n × {gb(g)} = {gb(traffic[3])} (1.5×) [ZeRO §7]"],
        f"ZeRO removes the copies data parallelism keeps on every GPU. Stage 1 splits the optimizer state ({K:g} of the "
        f"{sb.total:g} bytes per parameter), stage 2 also the gradients, stage 3 also the weights. For {fmt_count(n)} "
        f"parameters on {d} GPUs, stage {z} leaves {gb(st.total)} per GPU instead of {gb(base.total)}. Stages 1 and 2 "
        f"move the same bytes as plain data parallelism; stage 3 moves half as much again, because the weights must be "
        f"gathered before each use.",
        {"model_states_bytes": st.total, "unsharded_bytes": base.total, "traffic_bytes": traffic[z],
         "per_stage_bytes": [r.total for r in reps]},
        table=(["stage", "shards", "weights", "grads", "optimizer", "total/GPU", "traffic/GPU/step"], rows),
        sources=["zero", "fsdp"], code=["meg-distopt", "ds-zero12", "ds-zero3", "pt-fsdp2"],
        commands=[f"memory --params {num(n)} --dp {d} --zero {z} --precision {v['precision']} --optimizer {v['optimizer']} "
                  "--framework deepspeed"],
        notes=["GB = 1e9 bytes (the paper's unit); traffic counts the bytes each rank sends, ring algorithms"])


def checkpointing(v: dict) -> Explanation:
    """Activation checkpointing: activation bytes saved and recompute time paid, none vs selective vs full."""
    from shardlab.estimate import estimate_training
    from shardlab.layout import Layout

    spec, cl = catalog().model(v["model"]), cluster(v["gpu"], v["gpus"])
    seq = v["seq"]
    rows, res = [], {}
    for rc in ("none", "selective", "full"):
        lay = Layout(dp=v["gpus"], zero=3, micro_batch=v["batch"], recompute=rc)
        est = estimate_training(spec, lay, cl, seq_len=seq, global_batch=v["gpus"] * v["batch"])
        w = est.memory.worst
        res[rc] = (w.activations, est.breakdown["recompute_s"], est.step_time_s, w.total, est.fits)
        rows.append([rc, gib(w.activations), gib(w.total), "yes" if est.fits else "no", f"{est.breakdown['recompute_s'] * 1e3:.0f}",
                     f"{est.step_time_s:.3f}"])
    a0, _, t0, _, f0 = res["none"]
    af, rf, tf, _, _ = res["full"]
    asel, rsel, tsel, _, fsel = res["selective"]
    pick = next(rc for rc in ("none", "selective", "full") if res[rc][4]) if any(r[4] for r in res.values()) else None
    return Explanation(
        "activation-checkpointing", "Activation checkpointing: memory saved vs time paid",
        f"Training {spec.name} with {v['batch']} × {seq}-token sequences per GPU on {v['gpus']} × {cl.accelerator.id} "
        f"(FSDP): what do selective and full recomputation save, and what do they cost?",
        dict(v),
        [f"no recomputation: every block keeps its activations for backward: {gib(a0)} per GPU",
         f"selective (Korthikanti §5): drop only the attention core's activations (the s×s scores and softmax; with "
         f"flash attention only its softmax statistics) and recompute them: {gib(asel)} "
         f"for +{rsel * 1e3:.0f} ms per step",
         f"full: keep only each block's input (2·s·b·h bytes with bf16) and re-run the whole forward in backward: "
         f"{gib(af)} for +{rf * 1e3:.0f} ms per step ({100 * (tf / t0 - 1):+.0f}% step time)",
         "use it when activations are what does not fit: " + (
             f"here '{pick}' is the cheapest setting that fits" if pick else "here nothing fits: shard more first")],
        f"Backward needs what forward computed. Checkpointing stores less and recomputes the rest: selective "
        f"recomputation throws away only the cheap-to-recompute attention internals, full recomputation keeps just each "
        f"block's input and runs the forward twice. For {spec.name} that is {gib(a0)} → {gib(asel)} → {gib(af)} of "
        f"activations per GPU, paid with {100 * (tsel / t0 - 1):+.0f}% and {100 * (tf / t0 - 1):+.0f}% step time. Use the "
        f"lightest setting that makes the job fit, because every recomputed FLOP is time you pay for.",
        {k: {"activations_bytes": r[0], "recompute_s": r[1], "step_time_s": r[2], "total_bytes": r[3], "fits": r[4]}
         for k, r in res.items()} | {"cheapest_that_fits": pick},
        table=(["recompute", "activations/GPU", "total/GPU", "fits", "recompute ms", "step s"], rows),
        sources=["korthikanti", "chen-checkpoint"], code=["pt-checkpoint", "pt-ckpt-wrapper", "meg-recompute", "meg-ckpt-fn"],
        commands=[f"estimate {spec.name} --gpus {v['gpus']} --zero 3 --micro-batch {v['batch']} --seq-len {seq} "
                  f"--recompute full --gpu {cl.accelerator.id}"],
        notes=["with flash attention no s×s score matrix is stored, so selective recomputation saves little: it pays "
               "off without flash attention (add `--no-flash-attention` to `shardlab memory`)"])


_STAGE = Param("stage", "int", 3, "ZeRO stage 0-3", (0, 1, 2, 3), 0)
_ZERO_PARAMS = (Param("params", "count", 7_500_000_000, "parameters Ψ (7.5e9, 70B)"),
                Param("gpus", "int", 64, "data-parallel GPUs N_d"), _STAGE, precision(), optimizer())
TOPICS = [
    Topic("two-pressures", "The two reasons to distribute", "memory pressure vs time pressure: which one a job faces",
          (19, 12), (model("llama-2-7b"), gpu("a100-80gb"), Param("tokens", "count", 2_000_000_000_000, "training tokens"),
                     Param("days", "float", 30.0, "deadline in days"), precision()), two_pressures),
    Topic("bytes-per-param", "Bytes per parameter", "weights + gradients + optimizer by precision and optimizer",
          (12, 13, 18, 20), (Param("params", "count", 7_000_000_000, "parameters (7B, 500K)"), gpu("a100-80gb"),
                             precision("fp32"), optimizer()), bytes_per_param),
    Topic("zero", "ZeRO stages", "what ZeRO-1/2/3 shard, bytes per GPU and traffic (the ZeRO paper's table)", (25,),
          _ZERO_PARAMS, zero_stages),
    *[Topic(f"zero-{s}", f"ZeRO stage {s}", f"alias: zero stage={s}", (25,), tuple(p for p in _ZERO_PARAMS if p.name != "stage"),
            zero_stages, {"stage": s}) for s in (1, 2, 3)],
    Topic("fsdp-wrap", "FSDP wrap policies", "block / N-blocks / model units: gathered-memory peak, calls, exposed time",
          (26,), (model("llama-3.1-8b"), Param("gpus", "int", 8, "GPUs sharding the model", minimum=2), gpu("h100-sxm"),
                  Param("blocks", "int", 4, "blocks per unit of the N-blocks policy", minimum=2),
                  Param("seq", "int", 4096, "tokens per sequence"),
                  Param("recompute", "str", "none", "activation recomputation", ("none", "selective", "full")),
                  Param("framework", "str", "pytorch-fsdp", "framework profile (catalog/data/frameworks.yaml)")), fsdp_wrap),
    Topic("activation-checkpointing", "Activation checkpointing", "memory saved vs recompute time, none/selective/full", (29,),
          (model("llama-3.1-8b"), Param("gpus", "int", 8, "GPUs (FSDP)"), gpu("h100-sxm"),
           Param("seq", "int", 8192, "tokens per sequence"), Param("batch", "int", 2, "sequences per GPU")), checkpointing),
]
