"""Time of one serving-engine step: a batch of decode tokens and prefill tokens on one TP rank.

A continuous-batching step (Yu et al. 2022, "Orca", OSDI, iteration-level scheduling) runs D decoding
sequences (one token each, with K_d tokens cached between them) and P prefill tokens (whole prompts or
chunks, Agrawal et al. 2024, "Sarathi-Serve", OSDI, arXiv 2403.02310) through the same weights. Per kernel
class, a roofline (Williams et al. 2009, CACM 52(4)): the time is the larger of its HBM traffic over the
achieved bandwidth and its FLOPs over the achieved tensor-core rate.

    linear    max( W / (B·η_w),  2·N·(D+P) / (peak_gemm·η_g) · (M + m½)/M )   per GEMM class (dense matrices;
                                    routed experts), N = its active params on the rank, η_g the generation's 16-, 8- or
                                    4-bit GEMM share at large shapes, M its token rows (D+P; T·k/E for an expert) and
                                    m½ the half size of the generation's matmul curve (``rates.hardware``: a GEMM of M
                                    rows runs at M/(M + m½) of the large-shape rate, the curve training uses)
    head      max( W_head / (B·η_w),     2·V/t·h·n_sampled / (peak_16·η_g) )  logits only for sampled rows
    attention max( g·K_d·kv / (B·η_kv),   pairs_d·f_a / (peak_attn·η_a) ) + pairs_p·f_a / (peak_attn·η_a)
              g = 1 when the decode kernel reads a KV head once for its query group (GQA, Ainslie et al. 2023,
              arXiv 2305.13245), else the group size (a kernel per query head reads it again)
    elementwise  (D+P) × the block's norm/activation/RoPE traffic (``estimate.compute.layer_times``)
    comm      2 TP all-reduces per layer of (D+P)·h·2 bytes (α–β, ``comm.collectives``)
    a2a       with data-parallel attention: per MoE layer, the dispatch (k·h values per token) and combine
              (k·h·2 bytes) all-to-alls across the ep GPUs, α–β; the busiest rank's share scales it; with
              two-batch overlap only its excess over linear + attention + elementwise shows
    overhead  engine step overhead (scheduling, sampling) + per-sequence overhead × sequences
              + per-layer overhead × layers (small kernels' floor and the gaps between them) + the eager
              per-layer launch cost × layers, paid only by steps the engine does not replay as a captured CUDA
              graph (pure decode batches up to its capture size)

W_touched counts a MoE layer's routed experts by the share some token reaches, 1 − (1 − k/E)^(D+P)
(uniform routing); the experts have a roofline of their own: each sees T·k/E of the step's T tokens, so they
stay weight-bound at batches where the dense matrices are compute-bound. f_a = 2·(d_qk + d_v)·heads/t FLOPs per (query, key) pair per layer (QKᵀ and PV).
Expert parallelism and data-parallel attention (``serving.moe``): every term is the busiest GPU's, which
holds ceil(D/dp) of the D decoding sequences and 1/dp of the prompt tokens; the routed experts (E/ep whole ones
per GPU) see the tokens of all dp ranks, the busiest carrying ``expert_imbalance`` × the mean.
η_* belong to the GPU generation (``shardlab.serving.rates``), shared by every engine; the overheads, the CUDA
graph sizes and the kernel's GQA grouping belong to the engine (``shardlab.serving.engines``). Every function here is plain
arithmetic on floats or numpy arrays, so validation evaluates hundreds of rows at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np

from shardlab.rates.compute import layer_times
from shardlab.serving.step_comm import a2a_terms, allreduce_terms
from shardlab.rates.hardware import matmul_curve, overlap_efficiency
from shardlab.flops import attention_dims, layer_matmuls, linear_params_per_layer
from shardlab.layout import Layout
from shardlab.memory.inference import kv_cache_bytes_per_token
from shardlab.memory.states import stage_tensors
from shardlab.serving.precision import InferencePrecision
from shardlab.specs.hardware import Cluster
from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import is_matmul_weight


@dataclass(frozen=True)
class StepModel:
    """Per-step cost terms of a pipeline stage on one TP rank (floats, or arrays over cases)."""

    dense_weight_bytes: object
    """Weight bytes streamed every step: block matrices, norms, routers (quantized where the precision says)."""
    expert_weight_bytes: object
    """Routed-expert bytes on the rank (0 for dense models)."""
    expert_share: object
    """top_k / num_experts (0 for dense models)."""
    head_weight_bytes: object
    """Output-head bytes on the rank (last stage; 16-bit)."""
    gemm_flops_per_token: object
    """2 × active linear parameters of the stage's blocks on the rank."""
    expert_flops_per_token: object
    """The part of gemm_flops_per_token in routed experts (0 for dense models)."""
    head_flops_per_token: object
    """2 × V/t × h for each sampled token (last stage)."""
    kv_bytes_per_token: object
    """KV-cache bytes per cached token on the rank (the stage's layers)."""
    attn_flops_per_pair: object
    """Attention FLOPs per (query, key) pair on the rank, all the stage's layers."""
    elem_s_per_token: object
    """Elementwise kernels per token (norms, activation, RoPE, residuals), seconds."""
    comm_s_fixed: object
    """TP all-reduces of one step: latency part, seconds."""
    comm_s_per_token: object
    """TP all-reduces of one step: seconds per token in the step."""
    bandwidth_bytes_per_s: object
    """HBM bandwidth (datasheet)."""
    gemm_peak_flops: object
    """Dense peak of the GEMM dtype (the activations' type)."""
    attn_peak_flops: object
    """Dense peak attention runs at (fp8 with an fp8 KV cache and fp8 activations, else 16-bit)."""
    layers: object
    """Blocks on the stage (each pays the engine's per-layer launch overhead once per step)."""
    gemm_bits: object
    """Bits of the linear layers' GEMM inputs: 16, 8 (fp8/int8 activations) or 4 (fp4)."""
    kv_group: object
    """Query heads per KV head (GQA group; 1 for multi-head attention)."""
    head_peak_flops: object
    """Dense 16-bit peak (the head stays 16-bit)."""
    gemm_half_tokens: object
    """Rows (tokens) at which a GEMM reaches half its large-shape rate: the half_size of the generation's matmul
    curve (``rates.hardware.matmul_curve``, fitted to training runs), applied to the token dimension."""
    attention_dp: object = 1.0
    """Data-parallel attention ranks sharing the experts (``--dp-attention``): a step's tokens and sequences are
    split evenly across them; the routed experts see all of them (1 without DP attention)."""
    expert_imbalance: object = 1.0
    """The busiest expert-parallel rank's routed tokens over the mean (1: no EP, or perfect balance)."""
    a2a_s_fixed: object = 0.0
    """Expert-parallel dispatch + combine all-to-alls of one step (all the stage's MoE layers): latency part, s."""
    a2a_s_per_token: object = 0.0
    """... seconds per token of the step on one attention rank."""
    a2a_decode_s_fixed: object = 0.0
    """As ``a2a_s_fixed`` for a step without prompt tokens, dispatched by DeepEP's low-latency kernels (``step_comm.a2a_terms``)."""
    a2a_decode_s_per_token: object = 0.0
    """As ``a2a_s_per_token`` for a step without prompt tokens (low-latency kernels)."""
    decode_attn_flops_per_pair: object = None
    """Attention FLOPs per (query, key) pair of a decoding token on the rank, all the stage's layers: as prefill's,
    except with Multi-head Latent Attention, whose decode kernels absorb W_UK and W_UV into the query and output
    (DeepSeek-V2 §2.1.3, arXiv 2405.04434; FlashMLA) and attend in the latent space: 2·heads·((d_c + d_rope) + d_c)
    per pair, 576 + 512 wide for DeepSeek-V3 against prefill's 192 + 128. None: the prefill value."""
    a2a_overlap: object = 0.0
    """With two-batch overlap (SGLang ``--enable-two-batch-overlap``, vLLM ``--enable-dbo``) the share of the compute
    window the all-to-alls hide under (the generation's overlap efficiency, ``rates.hardware.overlap_efficiency``: the
    training fit's, communication beside compute slows it); 0 without. The step runs as two halves, one's all-to-alls
    under the other's compute: each half reads the weights its GEMMs touch, and each pays the all-to-alls' fixed
    latency."""


@dataclass(frozen=True)
class Kernels:
    """The GPU generation's achieved rates and the engine's overheads (floats, or arrays over cases)."""

    weight_bandwidth_efficiency: object
    """Share of HBM bandwidth reading weights."""
    kv_bandwidth_efficiency: object
    """Share of HBM bandwidth reading the KV cache."""
    gemm_efficiency: object
    """Share of the 16-bit dense peak in large GEMMs."""
    gemm8_efficiency: object
    """Share of the 8-bit dense peak in large GEMMs."""
    gemm4_efficiency: object
    """Share of the fp4 dense peak in large GEMMs."""
    attention_efficiency: object
    """Share of the attention dtype's peak in prefill attention."""
    step_overhead_s: object
    """Seconds per step (scheduling, sampling), spread over multi-step scheduling."""
    seq_overhead_s: object
    """Seconds per sampled sequence per step."""
    layer_overhead_s: object
    """Seconds per block per step (small kernels' floor and gaps), inside CUDA graphs too."""
    per_head_kv: object
    """1 when the decode kernel reads a KV head once per query head (no GQA grouping), else 0."""
    graph_max_batch: object
    """Largest pure-decode batch replayed as a CUDA graph (0: none)."""
    first_token_overhead_s: object
    """Fixed seconds before a static batch's first token."""
    eager_layer_overhead_s: object
    """Seconds per block per step outside CUDA graphs (host launches)."""


def stage_models(spec: ModelSpec, cluster: Cluster, tp: int, pp: int, precision: InferencePrecision, *, ep: int = 1,
                 attention_dp: int = 1, expert_imbalance: float = 1.0, two_batch_overlap: bool = False,
                 redundant_experts: int = 0) -> list[StepModel]:
    """One StepModel per pipeline stage (index = stage). ``ep`` > 1: routed experts whole, E/ep per rank
    (``memory.inference.serving_local_shape``), their tokens dispatched and combined by all-to-all each MoE layer;
    ``attention_dp``: attention replicas sharing those experts (ep = tp × attention_dp)."""
    from shardlab.memory.inference import serving_local_shape
    acc = cluster.accelerator
    a2a_fixed, a2a_tok = a2a_terms(spec, ep, tp, precision, cluster) if attention_dp > 1 else (0.0, 0.0)
    ll_fixed, ll_tok = a2a_terms(spec, ep, tp, precision, cluster, low_latency=True) if attention_dp > 1 else (0.0, 0.0)
    h, V = spec.hidden_size, spec.vocab_size
    lin = linear_params_per_layer(spec)
    routed = [sum(t.numel * spec.moe.top_k // spec.moe.num_experts for t in layer_matmuls(spec, i) if t.ep_dim is not None)
              if spec.moe else 0 for i in range(spec.num_layers)]
    qk, v = attention_dims(spec)
    dqk, dv = qk, v
    if spec.mla is not None:                  # absorbed decode attends over the latent (module doc, field doc)
        dqk = spec.num_heads * (spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim)
        dv = spec.num_heads * spec.mla.kv_lora_rank
    kv_tok = kv_cache_bytes_per_token(spec, tp, pp, precision.kv_bytes)
    fixed, per_tok = allreduce_terms(2 * h, tp, cluster)
    curve, _ = matmul_curve(acc)
    half = "fp16" if precision.activations == "fp16" else "bf16"     # the 16-bit type the model runs in
    peak16 = acc.peak_flops(half)
    attn_dtype = "fp8" if precision.kv_cache == "fp8" and precision.activations == "fp8" else None
    out = []
    for st in stage_tensors(spec, Layout(tp=tp, pp=pp)):
        dense = expert = head = 0
        for t in st.tensors:
            if t.component in ("embedding", "position") and not (st.holds_head and t.name == "output.weight"):
                continue                                      # embeddings are gathered by row, not streamed
            n = precision.tensor_bytes(t.component, serving_local_shape(t, spec, tp, ep, redundant_experts),
                                       is_matmul_weight(t))
            if t.component == "head" or t.name == "output.weight":
                head += n
            elif t.component == "experts":
                expert += n
            else:
                dense += n
        if st.holds_head and spec.tied_embeddings and pp == 1:
            head += 2 * -(-V // tp) * h                       # the tied embedding doubles as the head
        elem = 0.0
        per_kind: dict[bool, float] = {}                     # dense and MoE blocks each have one cost
        for layer in st.layers:
            kind = spec.is_moe_layer(layer)
            if kind not in per_kind:
                kw = dict(seq_len=1, tp=tp, cp=1, ep=1, sequence_parallel=False, elem_bytes=2)
                one = layer_times(spec, layer, acc, curve, half, micro_batch=1, **kw)["elem_s"]
                two = layer_times(spec, layer, acc, curve, half, micro_batch=2, **kw)["elem_s"]
                per_kind[kind] = float(two - one)
            elem += per_kind[kind]
        nl = len(st.layers)
        n_moe = sum(1 for i in st.layers if spec.is_moe_layer(i)) if spec.moe else 0
        out.append(StepModel(
            dense_weight_bytes=float(dense), expert_weight_bytes=float(expert),
            # a token reaches one copy of each of its k experts: k of the E + redundant slots
            expert_share=spec.moe.top_k / (spec.moe.num_experts + redundant_experts) if spec.moe else 0.0,
            head_weight_bytes=float(head), gemm_flops_per_token=2.0 * sum(lin[i] for i in st.layers) / tp,
            expert_flops_per_token=2.0 * sum(routed[i] for i in st.layers) / tp,
            head_flops_per_token=2.0 * -(-V // tp) * h if st.holds_head else 0.0,
            kv_bytes_per_token=float(kv_tok[st.stage]), attn_flops_per_pair=2.0 * (qk + v) / tp * nl,
            decode_attn_flops_per_pair=2.0 * (dqk + dv) / tp * nl,
            elem_s_per_token=elem, comm_s_fixed=2 * nl * fixed, comm_s_per_token=2 * nl * per_tok,
            bandwidth_bytes_per_s=acc.memory_bandwidth_bytes_per_s, gemm_peak_flops=acc.peak_flops(precision.gemm_dtype),
            attn_peak_flops=acc.peak_flops(attn_dtype) if attn_dtype else peak16, head_peak_flops=peak16, layers=float(nl),
            gemm_bits=float(4 if precision.gemm_dtype == "fp4" else 8 if precision.gemm_dtype in ("fp8", "int8") else 16),
            # query heads per KV head on the rank: TP splits the query heads, and the KV heads until they run out
            # (then each rank keeps a replica of one), so a rank's group is (heads/t) / max(1, kv_heads/t)
            kv_group=float((spec.num_heads / tp) / max(1.0, spec.num_kv_heads / tp)),
            gemm_half_tokens=float(curve.half_size), attention_dp=float(attention_dp),
            expert_imbalance=float(expert_imbalance if ep > 1 else 1.0),
            a2a_s_fixed=n_moe * a2a_fixed, a2a_s_per_token=n_moe * a2a_tok,
            a2a_decode_s_fixed=n_moe * ll_fixed, a2a_decode_s_per_token=n_moe * ll_tok, a2a_overlap=overlap_efficiency(acc) if two_batch_overlap and attention_dp > 1 else 0.0))
    return out


def pipeline_models(stages: list[StepModel]) -> tuple[StepModel, StepModel]:
    """(whole, slowest): the stages' terms summed (a token crosses every stage) and the largest stage."""
    def total(m: StepModel) -> float:
        return m.dense_weight_bytes + m.expert_weight_bytes + m.head_weight_bytes + m.kv_bytes_per_token
    keep = ("expert_share", "bandwidth_bytes_per_s", "gemm_peak_flops", "attn_peak_flops", "head_peak_flops", "gemm_bits",
            "kv_group", "gemm_half_tokens", "attention_dp", "expert_imbalance", "a2a_overlap")
    whole = StepModel(**{f.name: (getattr(stages[0], f.name) if f.name in keep else sum(getattr(s, f.name) for s in stages))
                         for f in fields(StepModel)})
    return whole, max(stages, key=total)


def stack(items: list) -> object:
    """Stack a list of StepModel (or Kernels) into one whose fields are arrays over the items."""
    cls = type(items[0])
    return cls(**{f.name: np.array([getattr(x, f.name) for x in items], dtype=float) for f in fields(cls)})


_ARRAY_OPS = (np.where, np.maximum, np.ceil)
_SCALAR_OPS = (lambda c, a, b: a if c else b, max, math.ceil)


def _has_array(x) -> bool:
    """A StepModel or Kernels with an array field (remembered per object: they are frozen), or an array."""
    if isinstance(x, (StepModel, Kernels)):
        known = x.__dict__.get("_has_array")
        if known is None:
            known = any(isinstance(v, np.ndarray) and v.ndim for v in vars(x).values())
            object.__setattr__(x, "_has_array", known)     # a cache beside the fields, not a field
        return known
    return isinstance(x, np.ndarray) and x.ndim > 0


def _ops(*xs) -> tuple:
    """(where, maximum, ceil): numpy's when any input (or field of a StepModel or Kernels) is an array, plain
    Python's on floats, the simulation's steps: a numpy call on a scalar costs about a microsecond, and a step
    makes dozens. The formulas of ``step_parts`` are the same either way."""
    return _ARRAY_OPS if any(_has_array(x) for x in xs) else _SCALAR_OPS


def _linear_s(m: StepModel, k: Kernels, rate, tokens, group_tokens, maximum) -> tuple:
    """(seconds, routed-expert bytes touched) of a step's linear layers on one rank: a roofline per GEMM class. The
    dense matrices see all the step's ``tokens``, a routed expert only its T·k/E share, so the experts can stay
    weight-bound while the dense layers are compute-bound (max of sums would hide it). The token dimension M of each
    GEMM sets its share of the large-shape rate, M / (M + m_half): the compute side is flops × (M + m_half) / M. The
    busiest rank's experts see T·k/E × imbalance tokens each on average of the ``group_tokens`` T of all attention
    ranks, but an expert that runs runs at least one row: their M is the tokens per *touched* expert (a batch of one
    token runs k experts at M = 1, not all E at M = k/E), the touched share 1 − (1 − k/E)^T as for the bytes."""
    bw = m.bandwidth_bytes_per_s * k.weight_bandwidth_efficiency
    half = m.gemm_half_tokens
    touched_share = maximum(1.0 - (1.0 - m.expert_share) ** group_tokens, 1e-12)
    expert_touched = m.expert_weight_bytes * (1.0 - (1.0 - m.expert_share) ** group_tokens)
    per_expert = maximum(group_tokens * m.expert_share * m.expert_imbalance / touched_share, 1e-9)
    dense_m = maximum(tokens, 1e-9)
    seconds = (maximum(m.dense_weight_bytes / bw,
                       tokens * (m.gemm_flops_per_token - m.expert_flops_per_token) / rate * (dense_m + half) / dense_m)
               + maximum(expert_touched / bw,
                         tokens * m.expert_imbalance * m.expert_flops_per_token / rate * (per_expert + half) / per_expert))
    return seconds, expert_touched


def step_parts(m: StepModel, k: Kernels, decode_seqs, decode_ctx_tokens, prefill_tokens, prefill_pairs, sampled,
               verify_tokens=0.0) -> dict:
    """Seconds per part of one step (module doc), floats or arrays: linear, head, attention, elementwise,
    comm, overhead, and their sum 'step_s' (plus the two sides of the linear roofline). decode_ctx_tokens = K_d; prefill_pairs = causal (query, key)
    pairs of the prefill tokens (and of the verified drafts); sampled = rows whose logits are computed;
    verify_tokens = drafted positions a speculative step verifies beside the decoding tokens (they are decode work:
    a captured CUDA graph covers them)."""
    where, maximum, ceil = _ops(m, k, decode_seqs, decode_ctx_tokens, prefill_tokens, prefill_pairs, sampled, verify_tokens)
    # with data-parallel attention the step's sequences split evenly over the attention ranks: every term below is
    # one rank's (its share of the tokens), except that the routed experts see the tokens of all ranks
    # (a sequence lives on one rank, so the busiest rank decodes ceil(D/dp) of them; prompts spread by token)
    dp = m.attention_dp
    group_tokens = decode_seqs + prefill_tokens + verify_tokens
    moe_split = (isinstance(dp, np.ndarray) and dp.ndim > 0) or dp != 1.0   # the simulation's scalar steps without DP attention skip it
    if moe_split:
        busiest = where(dp > 1, ceil(decode_seqs / dp - 1e-9), decode_seqs)
        share = where(decode_seqs > 0, busiest / maximum(decode_seqs, 1e-9), 1.0 / dp)
        decode_seqs, decode_ctx_tokens, verify_tokens = busiest, decode_ctx_tokens * share, verify_tokens * share
        prefill_tokens, prefill_pairs, sampled = prefill_tokens / dp, prefill_pairs / dp, sampled * share
    tokens = decode_seqs + prefill_tokens + verify_tokens
    bw = m.bandwidth_bytes_per_s
    gemm_eff = where(m.gemm_bits <= 4, k.gemm4_efficiency, where(m.gemm_bits <= 8, k.gemm8_efficiency, k.gemm_efficiency))
    rate = m.gemm_peak_flops * gemm_eff
    compute = tokens * m.gemm_flops_per_token / rate
    linear, expert_touched = _linear_s(m, k, rate, tokens, group_tokens, maximum)
    touched = m.dense_weight_bytes + expert_touched
    read = touched / (bw * k.weight_bandwidth_efficiency)
    tbo = moe_split and bool(np.any(m.a2a_overlap))
    # a rank's step splits in two only when it has two tokens or more (one decoding sequence runs whole)
    split = ((m.a2a_overlap > 0) & (tokens >= 2)) if tbo else False
    if tbo:   # two-batch overlap: two halves of the step, each reading the weights it touches (field doc)
        halves, expert_touched2 = _linear_s(m, k, rate, tokens / 2, group_tokens / 2, maximum)
        linear = where(split, 2 * halves, linear)
        touched = where(split, 2 * (m.dense_weight_bytes + expert_touched2), touched)
        read = where(split, touched / (bw * k.weight_bandwidth_efficiency), read)
    half = m.gemm_half_tokens
    sm = maximum(sampled, 1e-9)
    head = maximum(m.head_weight_bytes / (bw * k.weight_bandwidth_efficiency),
                      sampled * m.head_flops_per_token / (m.head_peak_flops * k.gemm_efficiency) * (sm + half) / sm)
    attn_rate = m.attn_flops_per_pair / (m.attn_peak_flops * k.attention_efficiency)
    dec_pair = m.attn_flops_per_pair if m.decode_attn_flops_per_pair is None else m.decode_attn_flops_per_pair
    dec_rate = dec_pair / (m.attn_peak_flops * k.attention_efficiency)
    kv_reads = 1.0 + k.per_head_kv * (m.kv_group - 1.0)        # a per-head kernel reads each KV head group times
    attention = maximum(decode_ctx_tokens * m.kv_bytes_per_token * kv_reads / (bw * k.kv_bandwidth_efficiency),
                           decode_ctx_tokens * dec_rate) + prefill_pairs * attn_rate
    elementwise = tokens * m.elem_s_per_token
    comm = where(tokens > 0, m.comm_s_fixed + tokens * m.comm_s_per_token, 0.0)
    # arrays (fits, searches): skip the terms when no case has an all-to-all (every dense case prices 0 either way)
    has_a2a = bool(np.any(m.a2a_s_per_token) or np.any(m.a2a_s_fixed)) if np.ndim(m.a2a_s_per_token) > 0 else \
        (moe_split or bool(m.a2a_s_per_token))
    if has_a2a:
        # two-batch overlap: each half pays the fixed latency; one half communicates while the other computes, and
        # what exceeds the overlap share of that compute shows
        # a step without prompt tokens dispatches with DeepEP's low-latency kernels, one with them with its normal ones
        decoding = prefill_tokens <= 0
        a2a_fixed = where(decoding, m.a2a_decode_s_fixed, m.a2a_s_fixed)
        a2a_tok = where(decoding, m.a2a_decode_s_per_token, m.a2a_s_per_token)
        fixed = where(split, 2 * a2a_fixed, a2a_fixed)
        a2a = where(tokens > 0, fixed + tokens * m.expert_imbalance * a2a_tok, 0.0)
        a2a_raw = a2a
        a2a = where(split, maximum(0.0, a2a - m.a2a_overlap * (linear + attention + elementwise)), a2a)
    else:
        a2a = a2a_raw = 0.0 * tokens
    graphed = (prefill_tokens <= 0) & (decode_seqs <= k.graph_max_batch)   # a captured decode graph: no launch gaps
    overhead = (k.step_overhead_s + k.seq_overhead_s * sampled
                + (k.layer_overhead_s + where(graphed, 0.0, k.eager_layer_overhead_s)) * m.layers)
    parts = {"linear_s": linear, "head_s": head, "attention_s": attention, "elementwise_s": elementwise,
             "comm_s": comm, "a2a_s": a2a, "a2a_raw_s": a2a_raw, "overhead_s": overhead, "weights_read_s": read, "gemm_compute_s": compute,
             "weights_touched_bytes": touched, "gemm_efficiency": gemm_eff}
    parts["step_s"] = linear + head + attention + elementwise + comm + a2a + overhead
    return parts


def step_time(m: StepModel, k: Kernels, decode_seqs, decode_ctx_tokens, prefill_tokens=0.0, prefill_pairs=0.0,
              sampled=None, verify_tokens=0.0):
    """Seconds of one step (``step_parts``' sum); sampled defaults to the decoding sequences."""
    return step_parts(m, k, decode_seqs, decode_ctx_tokens, prefill_tokens, prefill_pairs,
                      decode_seqs if sampled is None else sampled, verify_tokens)["step_s"]
