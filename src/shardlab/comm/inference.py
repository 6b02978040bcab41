"""Tensor-parallel inference: one decode step and one prefill, compute vs memory vs communication.

Per step on one TP rank (formulas.md "Communication" and "Inference memory"):
- compute:  2 · N_active · tokens / t  FLOPs at  peak · compute_efficiency  (Kaplan et al. 2020: a forward
  pass costs 2 FLOPs per active parameter per token; attention-score FLOPs are left out);
- memory:   (weight bytes per rank read + KV-cache bytes read or written) / (HBM bandwidth · memory_efficiency);
  for a MoE decode only the experts some token is routed to are read: a share 1 − (1 − k/E)^tokens of them
  (uniform routing);
- communication: 2 all-reduces per layer (after attention and after the MLP; Megatron, Shoeybi et al. 2019)
  of tokens · h elements (b·h for decode: 8 KB for h = 4096, bf16, b = 1; b·s·h for prefill), plus with expert
  parallelism 2 all-to-alls per MoE layer of tokens · k · h elements. The embedding all-reduce and the final
  logits gather (one each per step) are not counted.
- step = max(compute, memory) + communication: a TP all-reduce sits between two matmuls, so nothing
  overlaps it (the next GEMM needs its result).
Decode all-reduces are tiny and latency-bound; prefill's are large and bandwidth-bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.comm.collectives import collective_time
from shardlab.memory.inference import cached_tokens, kv_cache_bytes_per_token, weight_bytes_per_rank
from shardlab.specs.hardware import Accelerator, Link
from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import model_tensors, param_counts

DEFAULT_COMPUTE_EFFICIENCY = 0.6
"""Share of the dense peak large inference GEMMs reach (an estimate; accelerators with an ``efficiency``
model use it instead, see ``compute_efficiency_for``)."""
DEFAULT_MEMORY_EFFICIENCY = 0.7
"""Share of HBM bandwidth a decode step achieves ("model bandwidth utilization"; Databricks, "LLM Inference
Performance Engineering: Best Practices", 2023, reports 60-70% on A100/H100)."""


@dataclass(frozen=True)
class InferenceStep:
    """Time of one inference step on one TP rank and how much of it is communication."""

    phase: str
    """decode or prefill."""
    tokens: int
    """Tokens processed by the step: b (decode) or b·s (prefill)."""
    compute_time_s: float
    """2 · N_active · tokens / t / (peak · compute_efficiency)."""
    memory_time_s: float
    """(weights read + KV cache read/written) / (HBM bandwidth · memory_efficiency)."""
    comm_time_s: float
    """All TP all-reduces (and EP all-to-alls) of the step."""
    step_time_s: float
    """max(compute_time_s, memory_time_s) + comm_time_s."""
    comm_fraction: float
    """comm_time_s / step_time_s: the share of the step spent communicating."""
    bound: str
    """What limits the non-communication part: compute or memory."""
    flops: float
    """FLOPs per rank."""
    bytes_moved: float
    """HBM bytes per rank (weights + KV cache)."""
    comm_calls: int
    """TP all-reduces per step (2 · layers)."""
    comm_bytes_per_call: int
    """Bytes of one TP all-reduce (tokens · h · element bytes)."""
    comm_call_s: float
    """Time of one TP all-reduce."""
    comm_regime: str
    """latency or bandwidth (of one TP all-reduce); none when tp = 1."""
    ep_comm_time_s: float
    """Part of comm_time_s spent in EP all-to-alls (0 without expert parallelism)."""
    link_id: str
    """Link the collectives run on."""
    formula: str
    """The terms with the numbers in them."""


def compute_efficiency_for(acc: Accelerator, hidden_size: int, tp: int) -> float:
    """Achieved matmul share: the accelerator's efficiency curve at the TP-split GEMM width h/t when the
    catalog has one (max_fraction · n / (n + half_size)), else DEFAULT_COMPUTE_EFFICIENCY."""
    if acc.efficiency is None:
        return DEFAULT_COMPUTE_EFFICIENCY
    n = hidden_size / tp
    return acc.efficiency.max_fraction * n / (n + acc.efficiency.half_size)


def _weight_read_bytes(spec: ModelSpec, tp: int, ep: int, tokens: int, elem_bytes: int) -> float:
    """Weight bytes one rank reads in a step; routed experts count only the share some token touches."""
    if spec.moe is None and ep == 1:
        return float(weight_bytes_per_rank(spec, tp, 1, elem_bytes)[0])
    dense = expert = 0
    for t in model_tensors(spec):
        n = t.local_numel(spec, tp, ep) * elem_bytes
        if t.component == "experts":
            expert += n
        else:
            dense += n
    touched = 1.0
    if spec.moe is not None:
        touched = 1.0 - (1.0 - spec.moe.top_k / spec.moe.num_experts) ** tokens
    return dense + expert * touched


def _step(phase: str, spec: ModelSpec, tp: int, batch: int, seq: int, context_len: int, acc: Accelerator,
          link: Link, *, elem_bytes: int, compute_efficiency: float | None, memory_efficiency: float,
          ep: int, nodes: int, intra_link: Link | None, dtype: str) -> InferenceStep:
    from shardlab.units import fmt_bytes, fmt_time

    tokens = batch * seq
    eff = compute_efficiency if compute_efficiency is not None else compute_efficiency_for(acc, spec.hidden_size, tp)
    active = param_counts(spec).active
    flops = 2.0 * active * tokens / tp
    compute_time_s = flops / (acc.peak_flops(dtype) * eff)
    kv_tok = kv_cache_bytes_per_token(spec, tp, 1, elem_bytes)[0]
    # decode reads every cached token of every sequence; prefill writes the new tokens' K/V once
    kv_bytes = batch * cached_tokens(spec, context_len) * kv_tok if phase == "decode" else tokens * kv_tok
    w_bytes = _weight_read_bytes(spec, tp, ep, tokens, elem_bytes)
    moved = w_bytes + kv_bytes
    memory_time_s = moved / (acc.memory_bandwidth_bytes_per_s * memory_efficiency)
    L, h = spec.num_layers, spec.hidden_size
    msg = tokens * h * elem_bytes                        # (b, s, h) activation, bytes
    ar = collective_time("all-reduce", msg, tp, link, nodes=nodes, intra_link=intra_link)
    calls = 2 * L if tp > 1 else 0
    comm_time_s = calls * ar.time_s
    ep_time_s = 0.0
    if ep > 1 and spec.moe is not None:
        a2a = collective_time("all-to-all", tokens * spec.moe.top_k * h * elem_bytes, ep, link)
        ep_time_s = 2 * spec.num_moe_layers * a2a.time_s
    comm_time_s += ep_time_s
    base = max(compute_time_s, memory_time_s)
    step = base + comm_time_s
    bound = "compute" if compute_time_s >= memory_time_s else "memory"
    formula = "\n".join([
        f"compute = 2 × {active:.4g} active params × {tokens} tokens / tp {tp} / ({acc.peak_flops(dtype) / 1e12:g} TFLOP/s × {eff:.2f})"
        f" = {fmt_time(compute_time_s)}",
        f"memory  = ({fmt_bytes(w_bytes)} weights + {fmt_bytes(kv_bytes)} KV cache) / ({acc.memory_bandwidth_gbps:g} GB/s × {memory_efficiency:.2f})"
        f" = {fmt_time(memory_time_s)}",
        f"comm    = 2 × {L} layers × all-reduce({fmt_bytes(msg)} = {tokens}·{h}·{elem_bytes} B, n={tp}, {link.id}) = {calls} × {fmt_time(ar.time_s)}"
        + (f" + EP all-to-alls {fmt_time(ep_time_s)}" if ep_time_s else "") + f" = {fmt_time(comm_time_s)}",
        f"step    = max(compute, memory) + comm = {fmt_time(base)} + {fmt_time(comm_time_s)} = {fmt_time(step)}; "
        f"communication is {100 * comm_time_s / step:.1f}% of the step",
    ])
    return InferenceStep(phase, tokens, compute_time_s, memory_time_s, comm_time_s, step, comm_time_s / step if step > 0 else 0.0, bound,
                         flops, moved, calls, msg, ar.time_s, ar.regime if tp > 1 else "none", ep_time_s, link.id, formula)


def decode_step(spec: ModelSpec, *, tp: int, batch: int, context_len: int, accelerator: Accelerator, link: Link,
                elem_bytes: int = 2, compute_efficiency: float | None = None,
                memory_efficiency: float = DEFAULT_MEMORY_EFFICIENCY, ep: int = 1, nodes: int = 1,
                intra_link: Link | None = None, dtype: str = "bf16") -> InferenceStep:
    """One decode step: ``batch`` sequences each add one token with ``context_len`` tokens cached.

    Terms (module doc): compute 2·N_active·b/t; memory = weights + b·context·KV bytes per token;
    communication 2·L all-reduces of b·h·elem_bytes on ``tp`` ranks over ``link``.
    """
    return _step("decode", spec, tp, batch, 1, context_len, accelerator, link, elem_bytes=elem_bytes,
                 compute_efficiency=compute_efficiency, memory_efficiency=memory_efficiency, ep=ep, nodes=nodes,
                 intra_link=intra_link, dtype=dtype)


def prefill_step(spec: ModelSpec, *, tp: int, batch: int, prompt_len: int, accelerator: Accelerator, link: Link,
                 elem_bytes: int = 2, compute_efficiency: float | None = None,
                 memory_efficiency: float = DEFAULT_MEMORY_EFFICIENCY, ep: int = 1, nodes: int = 1,
                 intra_link: Link | None = None, dtype: str = "bf16") -> InferenceStep:
    """The prefill of ``batch`` prompts of ``prompt_len`` tokens.

    Terms (module doc): compute 2·N_active·b·s/t; memory = weights + b·s·KV bytes per token written;
    communication 2·L all-reduces of b·s·h·elem_bytes on ``tp`` ranks over ``link``.
    """
    return _step("prefill", spec, tp, batch, prompt_len, prompt_len, accelerator, link, elem_bytes=elem_bytes,
                 compute_efficiency=compute_efficiency, memory_efficiency=memory_efficiency, ep=ep, nodes=nodes,
                 intra_link=intra_link, dtype=dtype)
