"""Serving estimates: memory per rank, prefill latency, per-token decode latency, throughput, the
largest batch that fits, and tensor parallelism vs replicas.

Per-step times come from ``shardlab.comm.inference`` (compute vs memory roofline + TP all-reduces);
pipeline stages add a point-to-point send per stage boundary and run one after another for a single
request (a request's latency does not shrink with pp; throughput grows only with more requests in
flight). Memory: exact weights and KV cache per rank (``shardlab.memory.inference``) plus the CUDA
context and workspaces (``memory.overheads``) and a prefill activation workspace (estimate:
the largest intermediate tensors of one block, e·b·s·(2h + 2f/t), and the last tokens' logits).
A serving engine (vLLM) reserves ``gpu_memory_utilization`` (default 0.9) of the GPU and fills what the
weights leave with KV-cache blocks; max_batch is how many full-length sequences that cache holds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardlab.comm.collectives import collective_time
from shardlab.comm.inference import InferenceStep, decode_step, prefill_step
from shardlab.errors import ShardlabError
from shardlab.layout import Layout, validate
from shardlab.memory.inference import cached_tokens, kv_cache_bytes_per_token, weight_bytes_per_rank
from shardlab.memory.overheads import Overheads
from shardlab.specs.hardware import Cluster
from shardlab.specs.model import ModelSpec

GPU_MEMORY_UTILIZATION = 0.9
"""Share of GPU memory a serving engine takes for itself (vLLM's gpu_memory_utilization default)."""


@dataclass
class InferenceEstimate:
    """The answer of ``shardlab estimate --inference``."""

    model: ModelSpec
    cluster: Cluster
    tp: int
    pp: int
    batch: int
    prompt_len: int
    output_len: int
    weights_bytes: int
    """Per rank (worst stage)."""
    kv_cache_bytes: int
    """Per rank for the batch at full length."""
    kv_cache_bytes_per_token: int
    """Per rank, per cached token."""
    workspace_bytes: int
    """CUDA context, library workspaces, prefill activations (estimates)."""
    prefill: InferenceStep
    decode: InferenceStep
    p2p_s: float
    """Per pipeline boundary, decode message."""
    prefill_s: float
    decode_s_per_token: float
    max_batch: int
    notes: list[str] = field(default_factory=list)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.workspace_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.cluster.accelerator.memory_bytes * GPU_MEMORY_UTILIZATION

    @property
    def request_latency_s(self) -> float:
        return self.prefill_s + self.output_len * self.decode_s_per_token

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of this TP×PP group for the batch (prefill included)."""
        return self.batch * self.output_len / self.request_latency_s

    def to_dict(self) -> dict:
        return {
            "model": self.model.name, "gpu": self.cluster.accelerator.id, "tp": self.tp, "pp": self.pp, "gpus": self.gpus,
            "batch": self.batch, "prompt_len": self.prompt_len, "output_len": self.output_len,
            "memory": {"per_gpu": {"weights": self.weights_bytes, "kv_cache": self.kv_cache_bytes,
                                   "other": self.workspace_bytes, "total": self.total_bytes},
                       "capacity_bytes": self.cluster.accelerator.memory_bytes,
                       "usable_bytes": int(self.cluster.accelerator.memory_bytes * GPU_MEMORY_UTILIZATION),
                       "fits": self.fits},
            "kv_cache_bytes_per_token": self.kv_cache_bytes_per_token,
            "prefill_s": self.prefill_s, "decode_s_per_token": self.decode_s_per_token,
            "request_latency_s": self.request_latency_s, "tokens_per_s": self.tokens_per_s, "max_batch": self.max_batch,
            "fits": self.fits,
            "prefill": _step_dict(self.prefill), "decode": _step_dict(self.decode), "notes": self.notes,
        }


def _step_dict(s: InferenceStep) -> dict:
    return {"step_time_s": s.step_time_s, "compute_time_s": s.compute_time_s, "memory_time_s": s.memory_time_s,
            "comm_time_s": s.comm_time_s, "comm_fraction": s.comm_fraction, "bound": s.bound, "formula": s.formula}


def estimate_inference(spec: ModelSpec, cluster: Cluster, *, tp: int = 1, pp: int = 1, batch: int = 1,
                       prompt_len: int = 1024, output_len: int = 256, elem_bytes: int = 2, dtype: str = "bf16",
                       overheads: Overheads = Overheads()) -> InferenceEstimate:
    """Serve ``batch`` requests of ``prompt_len`` + ``output_len`` tokens on a TP×PP group."""
    validate(Layout(tp=tp, pp=pp), spec)
    if prompt_len + output_len > spec.max_seq_len:
        raise ShardlabError(f"--prompt-len + --output-len = {prompt_len + output_len} exceeds {spec.name}'s "
                            f"{spec.max_seq_len} positions; shorten them")
    notes = []
    acc = cluster.accelerator
    link = cluster.intra_link if tp <= cluster.gpus_per_node else cluster.inter_link
    weights = max(weight_bytes_per_rank(spec, tp, pp, elem_bytes))
    kv_tok = max(kv_cache_bytes_per_token(spec, tp, pp, elem_bytes))
    seq = prompt_len + output_len
    kv = kv_tok * batch * cached_tokens(spec, seq)
    f_local = (spec.moe.expert_ffn_hidden_size * spec.moe.top_k if spec.moe else spec.ffn_hidden_size) / tp
    workspace = int(overheads.cuda_context_bytes + overheads.library_workspace_bytes
                    + elem_bytes * batch * prompt_len * (2 * spec.hidden_size + 2 * f_local)
                    + 4 * batch * -(-spec.vocab_size // tp))
    pre = prefill_step(spec, tp=tp, batch=batch, prompt_len=prompt_len, accelerator=acc, link=link,
                       elem_bytes=elem_bytes, dtype=dtype)
    dec = decode_step(spec, tp=tp, batch=batch, context_len=prompt_len + output_len // 2, accelerator=acc, link=link,
                      elem_bytes=elem_bytes, dtype=dtype)
    p2p_dec = p2p_pre = 0.0
    if pp > 1:
        plink = cluster.inter_link if tp * pp > cluster.gpus_per_node else cluster.intra_link
        p2p_dec = collective_time("send-recv", batch * spec.hidden_size * elem_bytes, 2, plink).time_s
        p2p_pre = collective_time("send-recv", batch * prompt_len * spec.hidden_size * elem_bytes, 2, plink).time_s
        notes.append("pipeline stages run one after another for a request: pp adds memory, not speed, per request")
    usable = acc.memory_bytes * GPU_MEMORY_UTILIZATION
    per_seq = kv_tok * cached_tokens(spec, seq)
    ws_per_batch = (workspace - overheads.cuda_context_bytes - overheads.library_workspace_bytes) / batch
    free = usable - weights - overheads.cuda_context_bytes - overheads.library_workspace_bytes
    max_batch = int(max(0, free // (per_seq + ws_per_batch)))
    if weights > usable:
        notes.append(f"the weights alone ({weights / 2**30:.1f} GiB per GPU) exceed {GPU_MEMORY_UTILIZATION:.0%} of "
                     f"{acc.memory_gib:g} GiB: raise --tp or --pp")
    return InferenceEstimate(spec, cluster, tp, pp, batch, prompt_len, output_len, weights, kv, kv_tok, workspace,
                             pre, dec, p2p_dec, pre.step_time_s + (pp - 1) * p2p_pre,
                             dec.step_time_s + (pp - 1) * p2p_dec, max_batch, notes)


@dataclass
class ReplicaServe:
    """``batch`` requests spread over ``replicas`` identical groups: rem groups take base + 1, the rest base."""

    replicas: int
    batch: int
    largest: InferenceEstimate
    """The estimate of a group with the largest share (sets latency and memory)."""
    tokens_per_s: float
    """Generated tokens per second summed over the groups that have requests (idle groups add nothing)."""
    busy_replicas: int
    """Groups with at least one request."""


def serve_over_replicas(spec: ModelSpec, cluster: Cluster, *, tp: int, pp: int, replicas: int, batch: int, **kw) -> ReplicaServe:
    """Split ``batch`` concurrent requests over ``replicas`` TP×PP groups and add up what they really serve."""
    base, rem = divmod(batch, replicas)
    hi = estimate_inference(spec, cluster, tp=tp, pp=pp, batch=base + (1 if rem else 0), **kw)
    tps = (rem if rem else replicas) * hi.tokens_per_s
    if rem and base:
        tps += (replicas - rem) * estimate_inference(spec, cluster, tp=tp, pp=pp, batch=base, **kw).tokens_per_s
    return ReplicaServe(replicas, batch, hi, tps, min(batch, replicas))


def tp_versus_replicas(spec: ModelSpec, cluster: Cluster, *, tp: int, batch: int, prompt_len: int, output_len: int,
                       **kw) -> dict | None:
    """One TP=tp group serving ``batch`` vs tp replicas of TP=tp/2... down to TP=1 serving batch/replicas each.

    Answers when two TP=1 replicas beat one TP=2 group: replicas avoid the all-reduces and double the
    weight-reading bandwidth per token, but each holds the whole model and half the batch.
    """
    if tp < 2:
        return None
    group = estimate_inference(spec, cluster, tp=tp, batch=batch, prompt_len=prompt_len, output_len=output_len, **kw)
    smaller = tp // 2
    reps = tp // smaller
    served = serve_over_replicas(spec, cluster, tp=smaller, pp=1, replicas=reps, batch=batch, prompt_len=prompt_len,
                                 output_len=output_len, **kw)
    rep, per = served.largest, served.largest.batch
    rep_tps = served.tokens_per_s if rep.fits else 0.0
    if not rep.fits:
        verdict = f"{reps} × TP={smaller} replicas do not fit ({rep.total_bytes / 2**30:.1f} GiB per GPU): TP={tp} is needed"
    elif rep_tps > group.tokens_per_s and rep.decode_s_per_token <= group.decode_s_per_token:
        verdict = f"{reps} × TP={smaller} replicas win on both throughput and latency"
    elif rep_tps > group.tokens_per_s:
        verdict = (f"{reps} × TP={smaller} replicas give more throughput ({rep_tps:,.0f} vs {group.tokens_per_s:,.0f} tokens/s); "
                   f"TP={tp} gives lower latency per token ({1e3 * group.decode_s_per_token:.2f} vs {1e3 * rep.decode_s_per_token:.2f} ms)")
    else:
        verdict = f"one TP={tp} group wins on throughput ({group.tokens_per_s:,.0f} vs {rep_tps:,.0f} tokens/s)"
    return {"group": {"tp": tp, "batch": batch, "tokens_per_s": group.tokens_per_s,
                      "decode_s_per_token": group.decode_s_per_token, "fits": group.fits},
            "replicas": {"count": reps, "tp": smaller, "batch_each": per, "busy": served.busy_replicas, "tokens_per_s": rep_tps,
                         "decode_s_per_token": rep.decode_s_per_token, "fits": rep.fits},
            "verdict": verdict}
