"""Human output of an estimate: each component of the step with where its number comes from."""

from __future__ import annotations

from shardlab.errors import field_name
from shardlab.layout import recompute_words
from shardlab.rates.hardware import (attention_efficiency, attention_kernel_speed, matmul_curve, memory_efficiency,
                                       overlap_efficiency)
from shardlab.estimate.training import TrainingEstimate
from shardlab.memory.precision import state_bytes
from shardlab.render.table import table
from shardlab.units import fmt_count, fmt_time


def _pp_link(est: TrainingEstimate) -> str:
    """The link the pipeline group crosses (the rank grid decides)."""
    from shardlab.rank_grid import group_span_nodes

    cl = est.cluster
    return cl.inter_link.id if group_span_nodes(est.layout, "pp", cl.gpus_per_node) > 1 else cl.intra_link.id


def component_rows(est: TrainingEstimate) -> list[list[str]]:
    """[component, seconds, share, explanation] for every non-zero part of the step."""
    b, lay, wl, cl = est.breakdown, est.layout, est.workload, est.cluster
    acc = cl.accelerator
    sb = state_bytes(wl.precision, wl.optimizer, wl.main_grad_bytes)
    peak = acc.peak_flops(sb.compute_dtype)
    curve, default = matmul_curve(acc)
    stage_flops = est.model_tflops_per_gpu * 1e12 * est.step_time_s  # model FLOPs of the average GPU per step
    achieved = stage_flops / (b["compute_s"] * peak) if b["compute_s"] else 0.0
    m = est.microbatches
    text = {
        "compute_s": (f"forward + backward of the slowest stage ({est.slowest_stage}) for {m} micro-batches; "
                      f"the average GPU's {stage_flops:.3g} model FLOP over this time is {100 * achieved:.0f}% of "
                      f"{peak / 1e12:g} TFLOP/s while computing (MFU, which counts the whole step, is lower) "
                      f"[GEMMs: {curve.max_fraction:.3g}·n/(n+{curve.half_size:.3g}) of peak, n = min(M, N, "
                      f"K){' (default curve, estimate)' if default else ''}; "
                      + (f"attention kernel ({wl.attention_kernel}) at "
                         f"{attention_efficiency(acc) * attention_kernel_speed(acc, wl.attention_kernel):.0%}; "
                       if wl.flash_attention else "unfused attention: QKᵀ and PV as batched GEMMs on the GEMM curve, "
                                                  "softmax streamed through HBM; ")
                      + f"{wl.kernels} memory-bound kernels at {memory_efficiency(acc):.0%} of "
                        f"{acc.memory_bandwidth_gbps:g} GB/s; "
                      f"{acc.generation} efficiencies: {acc.efficiency_source or 'defaults (estimate)'}]"
                      + (f"; fp8-mixed: linear-layer GEMMs at the FP8 peak {acc.peak_flops('fp8') / 1e12:g} TFLOP/s "
                         "with "
                         f"their casts as memory traffic (MFU and HFU against that FP8 peak)" if sb.gemm_dtype == "fp8" else "")
                      + ("; LoRA: the frozen base computes no weight gradients" if wl.recipe.lora is not None else "")),
        "recompute_s": f"{lay.recompute} recomputation re-runs the forward in backward (Korthikanti 2022)",
        "tp_comm_s": (f"{4 + 2 * (lay.recompute == 'full')} all-reduces per block per micro-batch of b·s·h = "
                      f"{lay.micro_batch}·{wl.seq_len // lay.cp}·{est.model.hidden_size} elements over {lay.tp} ranks "
                      f"({cl.intra_link.id if lay.tp <= cl.gpus_per_node else cl.inter_link.id}), "
                      + (f"split into tp chunks pipelined with their GEMMs ({field_name('workload.tp_comm_overlap')}; Wang et al. "
                         "2023): the "
                         f"part they do not hide, of {est.comm_total_s.get('tp_comm_s', 0.0):.3g} s in all"
                         if wl.tp_comm_overlap else "not overlapped")
                      + ("; half that in MoE blocks, whose expert dispatch gathers for the MLP"
                         if est.model.moe is not None and not est.model.moe.shared_width else "")),
        "cp_comm_s": f"ring-attention K/V exchange over {lay.cp} ranks beyond what the attention core hides",
        "ep_comm_s": _ep_words(est, lay, wl, acc),
        "pp_p2p_s": ("blocking send of activations / gradients between stages per micro-batch, 1/tp of them per TP "
                     "rank "
                     f"({_pp_link(est)})"),
        "zero3_comm_s": ("ZeRO-3 weight gathers and gradient reduce-scatters per block beyond the compute they "
                         "overlap "
                         f"(they hide under {100 * overlap_efficiency(acc):.0f}% of it), plus the first gather "
                         f"and last reduce-scatter of each micro-batch"
                         + (", one more gather per block for the recomputed forward" if wl.zero3_regather_for_recompute
                            and lay.recompute == "full" else "")
                         + (f"; HSDP: {lay.dp_replicate} replicas all-reduce gradient shards" if lay.dp_replicate > 1 else "")),
        "host_overhead_s": (f"host time the GPUs wait for: {1e3 * wl.layer_host_s:.2g} ms per block and pass "
                            + (f"(FSDP's per-unit hooks: ZeRO stage {wl.layer_host_min_zero} or above only) "
                               if wl.layer_host_min_zero else "")
                            + (f"+ {1e3 * wl.pipeline_host_s:.2g} ms per micro-batch and pass of the pipeline engine "
                               if lay.pp > 1 and wl.pipeline_host_s else "")
                            + f"+ {wl.step_overhead_s:.2g} s per step ({wl.framework}, fitted: docs/validation.md)"),
        "pp_bubble_s": ({"interleaved": "interleaved: (p−1)/v × the slowest stage's time",
                         "zb-h1": "ZB-H1: (p−1)(t−W) − (min(m,p)−1)·W, W = weight-gradient time",
                         }.get(lay.schedule, f"{lay.schedule}: fill and drain, Σ stage times − the slowest "
                                             f"(= (p−1) stage times when stages are equal)")
                        + f", p={lay.pp}, m={m}{f', v={lay.vpp}' if lay.vpp > 1 else ''}; "
                        f"{100 * b['pp_bubble_s'] / est.step_time_s:.1f}% of the step"),
        "dp_comm_s": (f"exposed part of {fmt_time(est.dp_comm_total_s)} of gradient reduction (ZeRO-{lay.zero}) over "
                      f"dp·cp = {lay.dp * lay.cp} ranks; overlap with the last backward "
                      f"{'on' if wl.dp_overlap else 'off'}" + (f" (hiding under {100 * overlap_efficiency(acc):.0f}% "
                                                               "of it)"
                                                                if wl.dp_overlap else "")),
        "optimizer_s": f"{wl.optimizer} step streams gradients, master weights and moments through HBM"
                       + (" (adapters only; base frozen)" if wl.recipe.lora is not None else "")
                       + (", plus the per-step FP8 weight casts" if wl.precision == "fp8-mixed" else ""),
        "offload_s": (f"{wl.recipe.offload.what} offloaded to {wl.recipe.offload.device}: host-link transfers not "
                      "hidden "
                      f"under compute and the CPU Adam step (ZeRO-Offload Table 3 rate), docs/modern.md"),
    }
    names = {"compute_s": "compute", "recompute_s": "recomputation", "tp_comm_s": "TP/SP communication",
             "cp_comm_s": "CP communication", "ep_comm_s": "expert dispatch", "pp_p2p_s": "pipeline sends",
             "zero3_comm_s": "ZeRO-3 communication", "pp_bubble_s": "pipeline bubble", "dp_comm_s": "DP communication",
             "optimizer_s": "optimizer step", "host_overhead_s": "host overhead", "offload_s": "offload (host link, "
                                                                                               "CPU)"}
    return [[names[k], f"{v:.3f}", f"{100 * v / est.step_time_s:.1f}%", text[k]] for k, v in b.items() if v > 1e-9]


def render_estimate(est: TrainingEstimate) -> str:
    lay, wl, cl = est.layout, est.workload, est.cluster
    mem = est.memory
    w = mem.worst
    lines = [
        f"shardlab estimate: {est.model.name} on {est.gpus} × {cl.accelerator.id} "
        f"({cl.num_nodes} node{'s' if cl.num_nodes > 1 else ''} × {min(cl.gpus_per_node, est.gpus)}, "
        f"{cl.intra_link.id} + {cl.inter_link.id})",
        f"layout: dp {lay.dp}" + (f" ({lay.dp_replicate} replicas × {lay.dp // lay.dp_replicate} shards)"
                                  if lay.dp_replicate > 1 else "")
        + f" × tp {lay.tp} × pp {lay.pp} × cp {lay.cp}" + (f" × ep {lay.ep}" if lay.ep > 1 else "")
        + (f" (experts over etp {lay.expert_tp})" if lay.expert_tp != lay.tp else "")
        + f", ZeRO-{lay.zero}, micro-batch {lay.micro_batch}, {est.microbatches} micro-batches"
        + (f", {lay.schedule}" + (f" v={lay.vpp}" if lay.vpp > 1 else "") if lay.pp > 1 else "")
        + f", recompute {recompute_words(lay)}" + (", sequence parallel" if lay.sequence_parallel else ""),
        f"workload: seq {wl.seq_len}, global batch {wl.global_batch} sequences "
        f"({fmt_count(wl.global_batch * wl.seq_len)} tokens/step), "
        f"{wl.precision}, {wl.optimizer}",
        f"framework: {wl.framework} ({wl.kernels} kernels, {wl.attention_label} attention, gradient reduction "
        f"{'overlapped' if wl.dp_overlap else 'after the backward'}"
        + (f" in {wl.grad_reduce_bytes * 8}-bit" if wl.grad_reduce_bytes else "")
        + (f", gradients held in a {wl.main_grad_bytes * 8}-bit main_grad buffer" if wl.main_grad_bytes else "")
        + f"{', DeepSpeed-style re-gather under recomputation' if wl.zero3_regather_for_recompute else ''}; "
        f"{field_name('framework.name')} to change, catalog/data/frameworks.yaml for the sources)",
        "",
        f"step time {est.step_time_s:.3f} s = the parts below (the slowest pipeline stage sets the pace)",
        table(["component", "seconds", "share", "where it comes from"], component_rows(est), align="lrrl", wrap=100),
        "",
        f"throughput: {est.tokens_per_s:,.0f} tokens/s; {est.model_tflops_per_gpu:.3g} model TFLOP/s per GPU "
        f"(MFU {100 * est.mfu:.1f}%), {est.hardware_tflops_per_gpu:.3g} hardware TFLOP/s (HFU {100 * est.hfu:.1f}%)",
        ("  FLOP convention: model = 3 × forward (Korthikanti 2022 Eq. 7); hardware adds recomputation (Narayanan "
         "2021 Eq. 3)"
         if wl.recipe.lora is None else "  FLOP convention (LoRA): model = 2 × forward for the frozen base and head "
                                        "(no weight "
                                        "gradients) + 3 × forward for attention and adapters; hardware adds "
                                        "recomputation"),
        f"memory: {w.total / 2**30:.2f} GiB on the worst rank (rank {w.rank}: {mem.worst_reason()}) of "
        f"{mem.capacity_bytes / 2**30:.2f} GiB: {'fits' if est.fits else 'DOES NOT FIT'} "
        f"(`shardlab memory` with the same flags shows the breakdown)",
    ]
    from shardlab.memory.overheads import margin_note

    if (tight := margin_note(w.total, mem.capacity_bytes)):
        lines.append(f"  {tight}")
    from shardlab.estimate.recipe_terms import offload_detail

    od = offload_detail(est)
    if od:
        lines.append(f"offload ({od['what']} to {od['device']}): {od['h2d_bytes'] / 1e9:.1f} GB host→GPU and "
                     f"{od['d2h_bytes'] / 1e9:.1f} GB GPU→host per step per GPU over {od['host_link']} "
                     f"({od['link_gbps']:.1f} GB/s): {od['transfer_s']:.2f} s; hiding the per-micro-batch part needs "
                     f"{od['bandwidth_to_hide_gbps']:.1f} GB/s; CPU Adam {od['cpu_adam_s']:.2f} s"
                     + (f"; NVMe {od['nvme_s']:.2f} s" if od["nvme_s"] else "") + f"; exposed {od['exposed_s']:.2f} s")
    if est.tokens is not None:
        six = est.six_psi_d_time_s()
        lines += [f"time to train {fmt_count(est.tokens)} tokens: {est.steps:,.0f} steps × {est.step_time_s:.2f} s = "
                  f"{est.train_time_s / 86400:.2f} days, {est.gpu_hours:,.0f} GPU-hours",
                  f"  cross-check C ≈ 6ΨD (Kaplan 2020): {six / 86400:.2f} days at the same achieved model FLOP/s "
                  f"({100 * (est.train_time_s / six - 1):+.1f}%: attention and logits FLOPs are not in 6Ψ)"]
    lines += ["", "estimates: step time from a roofline-style model fitted on published runs (docs/validation.md)"]
    lines += [f"note: {n}" for n in est.notes]
    return "\n".join(lines)


def _ep_words(est, lay, wl, acc) -> str:
    """Where the expert-dispatch seconds come from: the dispatcher, the imbalance and the overlap in effect."""
    from shardlab.comm.moe_dispatch import overlap_refusal

    moe = wl.moe
    deepep = moe.dispatcher == "deepep" and lay.ep > 1
    words = "expert dispatch per MoE block: " + ("" if deepep else "the token counts gathered")
    if lay.ep > 1:
        words += (("DeepEP dispatch + combine over " if deepep else ", dispatch + combine all-to-alls over ")
                  + f"{lay.ep} ranks" + (" (one copy per remote node, forwarded over NVLink)" if deepep else ""))
    if lay.expert_tp > 1:
        words += f", the copies gathered and scattered over the {lay.expert_tp} expert-TP ranks"
    if moe.expert_imbalance != 1.0 and lay.ep > 1:
        words += (f"; the busiest rank receives {moe.expert_imbalance:g}× the mean copies "
                  f"({field_name('moe.expert_imbalance')})")
    if moe.ep_comm_overlap and not overlap_refusal(lay, wl.precision):
        words += (f"; what {100 * overlap_efficiency(acc):.0f}% of another micro-batch's compute does not hide "
                  f"({field_name('moe.ep_comm_overlap')})")
    return words
