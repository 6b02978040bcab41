"""One serving configuration, prepared: model on a TP×PP group, precision, engine, lengths -> the KV blocks
each GPU allocates, how many sequences fit, and the step models the scheduler models run on.

Capacity (sequences in flight): the fewest of
- KV blocks / blocks per sequence, on the stage with the least room. A sequence holds its prompt and, with
  on-demand allocation (vLLM, SGLang), half its output on average in steady state; with reservation
  (TensorRT-LLM GUARANTEED_NO_EVICT) its whole output. A sliding window caps the tokens held.
- the engine's max_num_seqs per pipeline micro-batch (pp micro-batches are in flight).
Activation peak: a forward over the step's token budget (``memory.inference.activation_peak_bytes``);
other memory: CUDA context, library workspaces and NCCL buffers (``memory.overheads`` defaults).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from shardlab.errors import ShardlabError, field_name
from shardlab.layout import Layout
from shardlab.layout_checks import validate
from shardlab.memory.inference import (KVBlocks, activation_peak_bytes, cached_tokens, held_tokens, kv_blocks,
                                       kv_cache_bytes_per_token, weight_bytes_per_rank)
from shardlab.memory.overheads import Overheads
from shardlab.serving.engines import EngineProfile
from shardlab.serving.moe import moe_layout
from shardlab.serving.precision import InferencePrecision
from shardlab.serving.rates import rates_for
from shardlab.serving.speculative import DRAFT_KINDS, Speculation, draft_extra_params
from shardlab.serving.step import Kernels, StepModel, pipeline_models, stage_models
from shardlab.serving.step_comm import per_token_line
from shardlab.specs.hardware import Cluster
from shardlab.specs.model import ModelSpec


@dataclass(frozen=True)
class ServeCase:
    """A prepared configuration (one TP×PP replica)."""

    spec: ModelSpec
    """The model."""
    cluster: Cluster
    """GPU and links."""
    tp: int
    """Tensor-parallel degree of the replica."""
    pp: int
    """Pipeline stages of the replica."""
    precision: InferencePrecision
    """Weights, KV cache and activation types."""
    engine: EngineProfile
    """Serving engine with its settings."""
    prompt_len: int
    """Prompt tokens per request."""
    output_len: int
    """Output tokens per request."""
    blocks: KVBlocks
    """KV blocks on the worst rank."""
    blocks_per_seq: int
    """Blocks one sequence holds (module doc)."""
    capacity: int
    """Sequences in flight the replica can hold."""
    capacity_bound: str
    """What sets capacity: kv-cache or max-num-seqs."""
    budget_tokens: int
    """Token budget of a step (a whole prompt when prompts are not chunked and exceed the budget); with data-parallel
    attention, every attention rank's budget together."""
    whole: StepModel
    """All stages' terms (a token's trip through the pipeline)."""
    slowest: StepModel
    """The largest stage's terms (sets the pipeline's rate)."""
    kernels: Kernels
    """The GPU generation's rates and the engine's overheads."""
    scheduler_steps: int
    """Decode steps per scheduling decision."""
    p2p_fixed_s: float
    """Pipeline send of one step between two stages: latency part."""
    p2p_s_per_token: float
    """... seconds per token of the step."""
    prefix_hit_rate: float = 0.0
    """Share of each prompt's tokens already in the engine's prefix cache (computed once, shared by the requests)."""
    speculation: Speculation | None = None
    """Speculative decoding settings (``serving.speculative``), or None."""
    draft: StepModel | None = None
    """The draft's step model on a TP rank (its weights, head and KV per token), with speculation."""
    ep: int = 1
    """Expert-parallel degree: routed experts whole, split across ep ranks (1: experts TP-sliced)."""
    attention_dp: int = 1
    """Data-parallel attention ranks (``--dp-attention``): each holds its own sequences and KV cache and runs
    attention on them; the routed experts are shared across the ep = tp × attention_dp GPUs."""
    expert_imbalance: float = 1.0
    """Busiest EP rank's routed tokens over the mean (1 without EP)."""
    redundant_experts: int = 0
    """Replicated expert slots beyond the model's experts (EPLB): each EP rank holds (E + this)/ep."""

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.attention_dp

    @property
    def layout_label(self) -> str:
        """The replica's layout in words (``serving.moe.replica_label``)."""
        from shardlab.serving.moe import replica_label

        return replica_label(self.tp, self.pp, self.ep, self.attention_dp)

    @property
    def step_budget_per_rank(self) -> int:
        """Token budget of one attention rank's step (the activation peak's size)."""
        return self.budget_tokens // self.attention_dp

    @property
    def replica_blocks(self) -> int:
        """KV blocks of the whole replica's scheduler: each data-parallel attention rank has its own (the same)."""
        return self.blocks.num_blocks * self.attention_dp

    @property
    def max_num_seqs(self) -> int:
        """The engine's max_num_seqs for the replica's scheduler (each attention DP rank schedules its own)."""
        return self.engine.max_num_seqs * self.attention_dp

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens a request computes: those past its cached prefix (at least one, the last)."""
        return max(1, self.prompt_len - round(self.prefix_hit_rate * self.prompt_len))

    @property
    def prefill_keys_per_token(self) -> float:
        """Mean keys a computed prompt token attends to: the computed suffix P of an S-token prompt sees the whole
        cached prefix, (S² − (S − P)²) / 2 causal pairs in all (S/2 per token without a hit); at most a sliding
        window's width in the layers that slide where the engine keeps the window (an upper bound: tokens early in
        the prompt see fewer), averaged over the layers."""
        S, P = self.prompt_len, self.prefill_tokens
        keys = (S * S - (S - P) ** 2) / (2 * P)
        # an engine keeping the window: a sliding layer attends to at most its width (the layers' mean)
        return float(held_tokens(self.spec, keys)) if self.engine.sliding_window_cache else keys

    @property
    def kv_held_share(self) -> float:
        """Share of a sequence's tokens (its whole prompt and output) its KV cache keeps at full length:
        held(prompt + O) / (prompt + O), 1 unless the engine evicts outside a sliding window
        (``steady.Arrays.kv_share``)."""
        full = self.prompt_len + self.output_len
        return float(max(1, engine_held_tokens(self.spec, self.engine, full)) / full)

    @property
    def kv_grow_tokens(self) -> float:
        """Own tokens the replica's KV blocks hold as its sequences grow: blocks × block size / ``kv_held_share``
        (``steady.Arrays.kv_tokens``)."""
        return float(self.replica_blocks * self.engine.kv_block_size / self.kv_held_share)

    @property
    def context_tokens(self) -> float:
        """Mean cached tokens of a decoding sequence: the prompt and half the output (or the window)."""
        return float(engine_held_tokens(self.spec, self.engine, self.prompt_len + self.output_len // 2))


def engine_held_tokens(spec: ModelSpec, engine: EngineProfile, tokens: int) -> int:
    """Tokens a sequence keeps cached: all, or the sliding window when the engine evicts outside it."""
    return cached_tokens(spec, tokens) if engine.sliding_window_cache else tokens


def prepare(spec: ModelSpec, cluster: Cluster, engine: EngineProfile, *, tp: int = 1, pp: int = 1,
            precision: InferencePrecision = InferencePrecision(), prompt_len: int = 1024, output_len: int = 256,
            scheduler_steps: int | None = None, overheads: Overheads = Overheads(),
            prefix_hit_rate: float = 0.0, speculation: Speculation | None = None,
            draft_spec: ModelSpec | None = None, ep: int = 1, dp_attention: bool = False,
            expert_imbalance: float | None = None, two_batch_overlap: bool = False,
            redundant_experts: int = 0) -> ServeCase:
    """Build the ServeCase of one replica (KV blocks, capacity, step models); the engine takes its defaults for the
    GPU (``EngineProfile.for_gpu``). With ``speculation``, ``draft_spec`` (``speculative.draft_spec``) is priced on
    the replica's last stage: its weights and KV beside the target's, its steps in every decode cycle. ``ep``,
    ``dp_attention``, ``expert_imbalance`` and ``two_batch_overlap``: MoE serving (``serving.moe``)."""
    validate(Layout(tp=tp, pp=pp), spec)
    dp, imbalance = moe_layout(spec, tp=tp, pp=pp, ep=ep, dp_attention=dp_attention, expert_imbalance=expert_imbalance,
                               two_batch_overlap=two_batch_overlap, redundant_experts=redundant_experts)
    engine = engine.for_gpu(cluster.accelerator)
    if not 0.0 <= prefix_hit_rate < 1.0:
        raise ShardlabError(f"--prefix-hit-rate must be a share in [0, 1), got {prefix_hit_rate:g}")
    if prefix_hit_rate > 0 and not engine.prefix_caching:
        raise ShardlabError(f"{engine.id} ({engine.name}) does not cache prefixes by default: drop --prefix-hit-rate, "
                            "or "
                            f"use an engine that does (vllm, sglang, tensorrt-llm)")
    if prompt_len + output_len > spec.max_seq_len:
        names = (field_name('serve.prompt_len'), field_name('serve.output_len'))   # a file may name both as one
        raise ShardlabError(f"{names[0] if names[0] == names[1] else ' + '.join(names)} = "
                            f"{prompt_len + output_len} exceeds {spec.name}'s "
                            f"{spec.max_seq_len} positions; shorten them")
    budget = engine.max_num_batched_tokens if engine.chunked_prefill else max(engine.max_num_batched_tokens, prompt_len)
    weights = weight_bytes_per_rank(spec, tp, pp, precision=precision, ep=ep, redundant=redundant_experts)
    kv_tok = kv_cache_bytes_per_token(spec, tp, pp, precision.kv_bytes)
    draft = None
    if speculation is not None:
        if draft_spec is None:
            raise ShardlabError("speculative decoding needs its draft (serving.speculative.draft_spec)")
        validate(Layout(tp=tp), draft_spec)
        draft = stage_models(draft_spec, cluster, tp, 1, precision, ep=ep if draft_spec.moe else 1,
                             attention_dp=dp, expert_imbalance=imbalance, two_batch_overlap=two_batch_overlap,
                             redundant_experts=redundant_experts if draft_spec.moe else 0)[0]
        extra = draft_extra_params(spec, speculation.draft)     # EAGLE's feature fc (h·n × h) beside its layer
        draft = replace(draft, dense_weight_bytes=draft.dense_weight_bytes + 2.0 * extra / tp,
                        gemm_flops_per_token=draft.gemm_flops_per_token + 2.0 * extra / tp)
        # memory: an EAGLE head shares the target's embedding (and EAGLE-1 its output head); a draft model holds all
        own = (draft.dense_weight_bytes + draft.expert_weight_bytes
               + (draft.head_weight_bytes if speculation.draft == "eagle3" else 0.0)
               if speculation.draft in DRAFT_KINDS else sum(weight_bytes_per_rank(draft_spec, tp, 1, precision=precision)))
        weights = [*weights[:-1], weights[-1] + int(own)]
        kv_tok = [*kv_tok[:-1], kv_tok[-1] + kv_cache_bytes_per_token(draft_spec, tp, 1, precision.kv_bytes)[0]]
    act = activation_peak_bytes(spec, tp, budget, engine.max_num_seqs)
    other = overheads.cuda_context_bytes + overheads.library_workspace_bytes + (overheads.nccl_bytes_per_group
                                                                                if tp * pp * dp > 1 else 0)
    cap_bytes = cluster.accelerator.memory_bytes
    per_stage = [kv_blocks(cap_bytes, w, act, other, k, block_size=engine.kv_block_size,
                           utilization=engine.gpu_memory_utilization, rule=engine.kv_memory_rule)
                 for w, k in zip(weights, kv_tok)]
    blocks = min(per_stage, key=lambda b: b.num_blocks)
    # a cached prefix's blocks are shared by the requests that hit it: a sequence holds its own suffix and output
    own = max(1, prompt_len - round(prefix_hit_rate * prompt_len))
    held = own + (output_len if engine.kv_admission == "reserve" else math.ceil(output_len / 2))
    per_seq = math.ceil(engine_held_tokens(spec, engine, held) / engine.kv_block_size)
    kv_seqs = blocks.num_blocks // per_seq * dp            # every attention DP rank holds its own sequences
    seq_cap = engine.max_num_seqs * pp * dp
    capacity, bound = (kv_seqs, "kv-cache") if kv_seqs < seq_cap else (seq_cap, "max-num-seqs")
    whole, slowest = pipeline_models(stage_models(spec, cluster, tp, pp, precision, ep=ep, attention_dp=dp,
                                                  expert_imbalance=imbalance, two_batch_overlap=two_batch_overlap,
                                                  redundant_experts=redundant_experts))
    p2p_fixed = p2p_tok = 0.0
    if pp > 1:
        link = cluster.inter_link if tp * pp > cluster.gpus_per_node else cluster.intra_link
        p2p_fixed, p2p_tok = per_token_line("send-recv", 2 * spec.hidden_size, 2, link)
    steps = scheduler_steps or engine.scheduler_steps
    if speculation is not None and steps > 1:
        raise ShardlabError("--speculative-tokens with --scheduler-steps above 1 is not modelled (vLLM 0.6, whose "
                            "multi-step scheduling this is, refuses speculative decoding with it: "
                            "vllm/engine/arg_utils.py); drop one of them")
    acc = cluster.accelerator
    kernels = engine.kernels(rates_for(acc.generation), precision.kv_cache, steps)
    return ServeCase(spec, cluster, tp, pp, precision, engine, prompt_len, output_len, blocks, per_seq, capacity, bound,
                     budget * dp, whole, slowest, kernels, steps, p2p_fixed, p2p_tok, prefix_hit_rate, speculation, draft,
                     ep, dp, imbalance, redundant_experts)
