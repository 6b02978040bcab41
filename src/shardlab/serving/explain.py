"""The work behind a step time, in words and numbers (what `shardlab estimate --inference` prints)."""

from __future__ import annotations

from dataclasses import replace

from shardlab.serving.case import ServeCase
from shardlab.serving.step import _linear_s, step_parts
from shardlab.units import fmt_bytes, fmt_time


def step_lines(case: ServeCase, decode_seqs: float, ctx_tokens: float, prefill_tokens: float = 0.0,
               prefill_pairs: float = 0.0, sampled: float | None = None) -> tuple[dict, list[str]]:
    """(parts, lines) of one step of the whole pipeline (one micro-batch through every stage)."""
    m, k = case.whole, case.kernels
    sampled = decode_seqs if sampled is None else sampled
    p = {key: float(v) for key, v in step_parts(m, k, decode_seqs, ctx_tokens, prefill_tokens, prefill_pairs, sampled).items()}
    # the compute side as the roofline prices it: each GEMM class's FLOPs at M/(M + m½) of the large-shape rate
    # (``step._linear_s`` with no weights to read; step_parts' gemm_compute_s is the FLOPs at the large-shape rate)
    no_weights = replace(m, dense_weight_bytes=0.0, expert_weight_bytes=0.0)
    group = decode_seqs + prefill_tokens
    mine = group if float(m.attention_dp) <= 1 else (-(-decode_seqs // float(m.attention_dp)) + prefill_tokens
                                                    / float(m.attention_dp))
    p["gemm_compute_s"] = float(_linear_s(no_weights, k, m.gemm_peak_flops * p["gemm_efficiency"], mine, group, max)[0])
    p["bound"] = "memory" if p["weights_read_s"] >= p["gemm_compute_s"] else "compute"
    tokens = decode_seqs + prefill_tokens
    bw = m.bandwidth_bytes_per_s / 1e9
    kv_bytes = ctx_tokens * m.kv_bytes_per_token
    moe = float(m.expert_flops_per_token) > 0
    graphed = prefill_tokens <= 0 and decode_seqs <= float(k.graph_max_batch)
    layer_us = (k.layer_overhead_s + (0.0 if graphed else k.eager_layer_overhead_s)) * 1e6
    reads = 1.0 + float(k.per_head_kv) * (float(m.kv_group) - 1.0)
    dp = float(m.attention_dp)
    if dp > 1:                            # every number below is the busiest GPU's share (serving.step module doc)
        share = (-(-decode_seqs // dp) / decode_seqs) if decode_seqs else 1.0 / dp
        decode_seqs, ctx_tokens, sampled = decode_seqs * share, ctx_tokens * share, sampled * share
        prefill_tokens, prefill_pairs = prefill_tokens / dp, prefill_pairs / dp
        tokens = decode_seqs + prefill_tokens
        kv_bytes = ctx_tokens * m.kv_bytes_per_token
    lines = [] if dp <= 1 and case.ep <= 1 else [
        f"experts   = {case.ep}-way expert parallel, {(case.spec.moe.num_experts + case.redundant_experts) // case.ep} "
        f"whole experts per GPU" + (f" ({case.redundant_experts} redundant copies)" if case.redundant_experts else "")
        + (f"; attention on {dp:g} data-parallel ranks of TP {case.tp}: the busiest GPU's share of the step below "
           f"(the experts see all ranks' tokens, the busiest × {case.expert_imbalance:.2f} the mean)" if dp > 1
           else f" (the TP group); the busiest × {case.expert_imbalance:.2f} the mean routed tokens")]
    lines += [
        f"linear    = max({fmt_bytes(p['weights_touched_bytes'])} weights / ({bw:g} GB/s × {k.weight_bandwidth_efficiency:.3f}), "
        f"{m.gemm_flops_per_token:.3g} FLOP × {tokens:g} tokens / ({m.gemm_peak_flops / 1e12:g} TFLOP/s × {p['gemm_efficiency']:.3f})"
        f" × (M + {float(m.gemm_half_tokens):.0f})/M)"
        f" = max({fmt_time(p['weights_read_s'])}, {fmt_time(p['gemm_compute_s'])})"
        + (" per GEMM class (dense matrices; routed experts, each seeing tokens·k/E), summed" if moe else "")
        + f" = {fmt_time(p['linear_s'])}",
        f"head      = output projection for {sampled:g} sampled rows = {fmt_time(p['head_s'])}",
        f"attention = max({fmt_bytes(kv_bytes)} KV read"
        + (f" × {reads:g} (a decode kernel per query head reads each KV head {reads:g} times)" if reads > 1 else "")
        + f" / ({bw:g} GB/s × {k.kv_bandwidth_efficiency:.3f}), FLOPs)"
        + (f" + prefill attention over {prefill_pairs:.3g} pairs" if prefill_pairs else "") + f" = {fmt_time(p['attention_s'])}",
        f"elementwise (norms, activation, RoPE) = {fmt_time(p['elementwise_s'])}; TP all-reduces = {fmt_time(p['comm_s'])}"
        + (f"; EP all-to-alls (dispatch + combine, {case.ep} GPUs"
           + (", DeepEP's low-latency kernels across nodes" if prefill_tokens <= 0 and case.ep > case.cluster.gpus_per_node
              else "") + f") = {fmt_time(p['a2a_raw_s'])}"
           + (f", {fmt_time(p['a2a_s'])} of it beyond the {100 * float(m.a2a_overlap):.0f}% of the compute it overlaps "
              f"(two-batch overlap: two halves, each reading the weights)" if float(m.a2a_overlap) else "")
           if p["a2a_raw_s"] else ""),
        f"overhead  = {k.step_overhead_s * 1e6:.0f} µs per step + {k.seq_overhead_s * 1e6:.1f} µs × {sampled:g} sequences + "
        f"{layer_us:.1f} µs × {m.layers:g} layers" + (" (a captured CUDA graph: no eager launches)" if graphed else "")
        + f" = {fmt_time(p['overhead_s'])} ({case.engine.id})",
        f"step      = {fmt_time(p['step_s'])} ({p['bound']}-bound linear layers)",
    ]
    return p, lines
