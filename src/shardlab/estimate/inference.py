"""Static-batch serving estimates: memory and KV blocks per GPU, prefill time, per-token decode time,
throughput, the largest batch that fits, and tensor parallelism vs replicas.

A TP×PP group serves ``batch`` sequences per pipeline micro-batch and keeps pp micro-batches in flight
(pipelined batches: each stage works on a different micro-batch, so pp stages hold pp × batch sequences).
A token still crosses every stage in turn, so the time per output token does not fall with pp while the
throughput grows with it (curriculum: "PP adds throughput, not latency, for inference").
All times come from the serving model (``shardlab.serving``): the engine's step model
(``serving.step``) run as a static batch by ``serving.steady.fluid`` — prefill of every prompt, then
output − 1 decode steps at the mean context. Memory: exact weights per rank at their precision, KV cache
per token, the activation peak of the engine's step budget and the CUDA context/workspaces
(``memory.inference``); the engine's rule (vLLM: gpu_memory_utilization × capacity) sets the KV blocks,
and max_batch is how many full-length sequences per micro-batch they hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from shardlab.errors import field_name
from shardlab.memory.overheads import Overheads
from shardlab.serving.case import ServeCase, engine_held_tokens, prepare
from shardlab.serving.engines import EngineProfile, get_engine
from shardlab.serving.explain import step_lines
from shardlab.serving.precision import BF16, InferencePrecision
from shardlab.serving.steady import arrays, fluid
from shardlab.specs.hardware import Cluster
from shardlab.specs.model import ModelSpec


@dataclass
class InferenceEstimate:
    """The answer of ``shardlab estimate --inference``."""

    case: ServeCase
    """Model, layout, precision, engine, KV blocks."""
    batch: int
    """Sequences per pipeline micro-batch."""
    result: dict
    """The static-batch numbers of ``serving.steady.fluid`` (floats)."""
    prefill: dict
    """Parts of the prefill step (``serving.step.step_parts``) and their explanation under 'lines'."""
    decode: dict
    """Parts of a decode step at the mean context, and 'lines'."""
    notes: list[str] = field(default_factory=list)
    """Caveats shown under the estimate."""

    @property
    def spec(self) -> ModelSpec:
        return self.case.spec

    @property
    def tp(self) -> int:
        return self.case.tp

    @property
    def pp(self) -> int:
        return self.case.pp

    @property
    def gpus(self) -> int:
        return self.case.gpus

    @property
    def in_flight(self) -> int:
        """Sequences in the group: pp micro-batches of ``batch``."""
        return self.batch * self.pp

    @property
    def weights_bytes(self) -> int:
        return self.case.blocks.weights_bytes

    @property
    def kv_cache_bytes_per_token(self) -> int:
        return self.case.blocks.bytes_per_block // self.case.blocks.block_size

    @property
    def full_length_tokens(self) -> int:
        """Tokens one sequence holds at its end (the window when the engine evicts outside it)."""
        return engine_held_tokens(self.spec, self.case.engine, self.case.prompt_len + self.case.output_len)

    @property
    def windowed(self) -> bool:
        """The engine drops tokens that leave a sliding-window model's window."""
        return bool(self.case.engine.sliding_window_cache and self.spec.sliding_window)

    @property
    def own_tokens(self) -> int:
        """Tokens one sequence holds of its own at full length: its prompt past the cached prefix and its output
        (the window caps them)."""
        own = self.case.prefill_tokens + self.case.output_len
        return engine_held_tokens(self.spec, self.case.engine, own)

    @property
    def shared_prefix_tokens(self) -> int:
        """Cached prefix tokens the sequences still hold (once, in shared blocks): the prompt's cached part, less
        what a sliding window has dropped by the end."""
        shared = self.case.prompt_len - self.case.prefill_tokens
        if self.windowed:     # a sliding layer keeps what is left of its window; a full-attention layer keeps all
            share = self.spec.windowed_layer_share
            kept = max(0, min(shared, self.spec.sliding_window - (self.case.prefill_tokens + self.case.output_len)))
            return math.ceil(share * kept + (1.0 - share) * shared - 1e-9)
        return shared

    def _own_blocks(self) -> int:
        return math.ceil(max(1, self.own_tokens) / self.case.blocks.block_size)

    @property
    def kv_cache_bytes(self) -> int:
        """KV cache of the in-flight sequences at full length on the worst rank, in whole blocks (a cached prefix
        once, shared)."""
        shared = math.ceil(self.shared_prefix_tokens / self.case.blocks.block_size)
        return (self.in_flight_per_gpu * self._own_blocks() + shared) * self.case.blocks.bytes_per_block

    @property
    def in_flight_per_gpu(self) -> int:
        """Sequences whose KV cache the busiest GPU holds: all in flight, or ceil(in flight / dp) under data-parallel
        attention (each attention rank keeps its own sequences)."""
        return -(-self.in_flight // self.case.attention_dp)

    @property
    def workspace_bytes(self) -> int:
        return self.case.blocks.activation_bytes + self.case.blocks.other_bytes

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.workspace_bytes

    @property
    def usable_bytes(self) -> int:
        """What the engine may use (its reservation)."""
        return self.case.blocks.reserved_bytes

    @property
    def fits(self) -> bool:
        return self.kv_cache_bytes <= self.case.blocks.kv_bytes and self.case.blocks.num_blocks > 0

    @property
    def outgrown(self) -> bool:
        """The batch fits its prompts but not its full lengths: the engine preempts (``outgrown.outgrown_batch``)."""
        return bool(self.result.get("outgrown", 0.0))

    @property
    def max_batch(self) -> int:
        """Full-length sequences per micro-batch the KV blocks (and max_num_seqs) hold."""
        free = self.case.blocks.num_blocks - math.ceil(self.shared_prefix_tokens / self.case.blocks.block_size)
        dp = self.case.attention_dp
        return min(max(0, free) // self._own_blocks() * dp, self.case.max_num_seqs * self.pp) // self.pp

    @property
    def prefill_s(self) -> float:
        return self.result["prefill_s"]

    @property
    def decode_s_per_token(self) -> float:
        return self.result["tpot_s"]

    @property
    def request_latency_s(self) -> float:
        return self.result["e2e_s"]

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of this TP×PP group (prefill included)."""
        return self.result["output_tokens_per_s"]

    def to_dict(self) -> dict:
        c, b = self.case, self.case.blocks
        return {
            "model": self.spec.name, "gpu": c.cluster.accelerator.id, "tp": self.tp, "pp": self.pp, "gpus": self.gpus,
            "engine": c.engine.id, "engine_version": c.engine.version, "precision": {"weights": c.precision.weights, "group_size": c.precision.group_size,
                                                 "kv_cache": c.precision.kv_cache, "activations": c.precision.activations,
                                                 "weights_from_checkpoint": c.precision.weights_from_checkpoint},
            "ep": c.ep, "dp_attention": c.attention_dp, "expert_imbalance": c.expert_imbalance,
            "two_batch_overlap": bool(float(c.whole.a2a_overlap)), "redundant_experts": c.redundant_experts,
            "batch": self.batch, "micro_batches": self.pp, "in_flight": self.in_flight,
            "prompt_len": c.prompt_len, "output_len": c.output_len,
            "memory": {"per_gpu": {"weights": self.weights_bytes, "kv_cache": self.kv_cache_bytes,
                                   "other": self.workspace_bytes, "total": self.total_bytes},
                       "capacity_bytes": b.capacity_bytes, "usable_bytes": self.usable_bytes, "fits": self.fits},
            "kv_blocks": b.to_dict(), "kv_cache_bytes_per_token": self.kv_cache_bytes_per_token,
            "prefill_s": self.prefill_s, "decode_s_per_token": self.decode_s_per_token,
            "request_latency_s": self.request_latency_s, "tokens_per_s": self.tokens_per_s, "max_batch": self.max_batch,
            "fits": self.fits, "outgrown": self.outgrown, **({"outgrown_phases": self.result["outgrown_phases"]}
                                                              if self.outgrown else {}),
            "prefill": _parts(self.prefill), "decode": _parts(self.decode), "notes": self.notes,
        }


def _parts(p: dict) -> dict:
    return {k: v for k, v in p.items() if k != "lines"}


def static_batch(spec: ModelSpec, cluster: Cluster, *, tp: int, pp: int, in_flight: int, prompt_len: int, output_len: int,
                 precision: InferencePrecision = BF16, engine: EngineProfile | None = None,
                 overheads: Overheads = Overheads(), prefix_hit_rate: float = 0.0, **case_kw) -> tuple[ServeCase, dict]:
    """(case, fluid numbers) of ``in_flight`` sequences served as one static batch on a TP×PP group; ``case_kw``:
    ``prepare``'s speculative decoding (``speculation``, ``draft_spec``) and MoE layout (``ep``, ``dp_attention``,
    ``expert_imbalance``)."""
    case = prepare(spec, cluster, engine or get_engine(None), tp=tp, pp=pp, precision=precision, prompt_len=prompt_len,
                   output_len=output_len, overheads=overheads, prefix_hit_rate=prefix_hit_rate, **case_kw)
    res = fluid(arrays([case]), [0], [in_flight])
    return case, {k: float(v[0]) for k, v in res.items()}


def estimate_inference(spec: ModelSpec, cluster: Cluster, *, tp: int = 1, pp: int = 1, batch: int = 1,
                       prompt_len: int = 1024, output_len: int = 256, precision: InferencePrecision = BF16,
                       engine: EngineProfile | None = None, overheads: Overheads = Overheads(),
                       prefix_hit_rate: float = 0.0, **case_kw) -> InferenceEstimate:
    """Serve pp micro-batches of ``batch`` requests of ``prompt_len`` + ``output_len`` tokens on a TP×PP group
    (``prefix_hit_rate``: the share of each prompt already in the engine's prefix cache)."""
    case, res = static_batch(spec, cluster, tp=tp, pp=pp, in_flight=batch * pp, prompt_len=prompt_len,
                             output_len=output_len, precision=precision, engine=engine, overheads=overheads,
                             prefix_hit_rate=prefix_hit_rate, **case_kw)
    S = case.prefill_tokens
    pre, pre_lines = step_lines(case, 0.0, 0.0, batch * S, batch * S * case.prefill_keys_per_token, batch)
    dec, dec_lines = step_lines(case, batch, batch * case.context_tokens)
    notes = []
    if pp > 1:
        notes.append(f"{pp} pipeline stages keep {pp} micro-batches of {batch} in flight: throughput grows with pp, "
                     f"the time per token does not fall (a token crosses every stage)")
    if res.get("outgrown"):
        from shardlab.serving.outgrown import outgrown_phases
        from shardlab.serving.steady import scalars

        B, S = batch * pp, case.prefill_tokens
        ph = {k: float(v) for k, v in outgrown_phases(scalars(case), float(B), res["prefill_s"]).items()}
        res["outgrown_phases"] = ph
        notes.append(f"the {B} sequences outgrow the KV cache before they finish ({B * (S + output_len):,} tokens at "
                     f"full length, {case.kv_grow_tokens:,.0f} held): all decode to {ph['full_at_tokens']:,.0f} tokens "
                     f"each ({ph['phase1_s']:,.1f} s), then the pool's sequences run while {case.engine.id} preempts the "
                     f"newest ({ph['preempted']:,.0f} in all; {ph['phase2_s']:,.1f} s), and those recompute "
                     f"{ph['recompute_tokens']:,.0f} tokens ({ph['recompute_s']:,.1f} s) and decode out "
                     f"({ph['phase3_s']:,.1f} s): the request latency is the mean completion "
                     f"({ph['mean_completion_s']:,.1f} s), the throughput the batch's over its makespan "
                     f"({ph['makespan_s']:,.1f} s; serving.outgrown.outgrown_phases)")
    if case.blocks.num_blocks == 0:
        notes.append(f"the weights ({case.blocks.weights_bytes / 2**30:.1f} GiB per GPU) leave no room for a KV cache "
                     "in "
                     f"the engine's share of {cluster.accelerator.memory_gib:g} GiB: raise {field_name('layout.tp')} "
                     f"or {field_name('layout.pp')}, or quantize")
    return InferenceEstimate(case, batch, res, {**pre, "lines": pre_lines}, {**dec, "lines": dec_lines}, notes)


@dataclass
class ReplicaServe:
    """``batch`` requests spread over ``replicas`` identical groups: rem groups take base + 1, the rest base."""

    replicas: int
    """TP×PP groups."""
    batch: int
    """Concurrent requests over all groups."""
    largest: InferenceEstimate
    """The estimate of a group with the largest share (sets latency and memory)."""
    tokens_per_s: float
    """Generated tokens per second summed over the groups that have requests (idle groups add nothing)."""
    busy_replicas: int
    """Groups with at least one request."""


def serve_over_replicas(spec: ModelSpec, cluster: Cluster, *, tp: int, pp: int, replicas: int, batch: int, **kw) -> ReplicaServe:
    """Split ``batch`` concurrent requests over ``replicas`` TP×PP groups (each splits its share into pp
    micro-batches) and add up what they serve."""
    base, rem = divmod(batch, replicas)
    share = base + (1 if rem else 0)
    hi = estimate_inference(spec, cluster, tp=tp, pp=pp, batch=max(1, math.ceil(share / pp)), **kw)
    tps = (rem if rem else replicas) * hi.tokens_per_s * share / hi.in_flight
    if rem and base:
        lo = estimate_inference(spec, cluster, tp=tp, pp=pp, batch=max(1, math.ceil(base / pp)), **kw)
        tps += (replicas - rem) * lo.tokens_per_s * base / lo.in_flight
    return ReplicaServe(replicas, batch, hi, tps, min(batch, replicas))


def tp_versus_replicas(spec: ModelSpec, cluster: Cluster, *, tp: int, batch: int, prompt_len: int, output_len: int,
                       **kw) -> dict | None:
    """One TP=tp group serving ``batch`` vs two TP=tp/2 replicas serving batch/2 each.

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
        verdict = (f"{reps} × TP={smaller} replicas give more throughput ({rep_tps:,.0f} vs {group.tokens_per_s:,.0f} "
                   "tokens/s); "
                   f"TP={tp} gives lower latency per token ({1e3 * group.decode_s_per_token:.2f} vs "
                   f"{1e3 * rep.decode_s_per_token:.2f} ms)")
    else:
        verdict = f"one TP={tp} group wins on throughput ({group.tokens_per_s:,.0f} vs {rep_tps:,.0f} tokens/s)"
    return {"group": {"tp": tp, "batch": batch, "tokens_per_s": group.tokens_per_s,
                      "decode_s_per_token": group.decode_s_per_token, "fits": group.fits},
            "replicas": {"count": reps, "tp": smaller, "batch_each": per, "busy": served.busy_replicas, "tokens_per_s": rep_tps,
                         "decode_s_per_token": rep.decode_s_per_token, "fits": rep.fits},
            "verdict": verdict}
