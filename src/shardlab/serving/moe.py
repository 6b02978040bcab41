"""MoE serving layouts: expert parallelism (EP) and data-parallel attention.

Two ways to spread a MoE model's routed experts over a replica's GPUs, as the engines run them:

- **TP experts** (the default): every GPU holds a 1/tp slice of every expert; a MoE layer ends in the TP
  all-reduce, as a dense MLP does.
- **Expert parallelism**, ``ep`` > 1: each GPU holds E/ep whole experts (vLLM ``--enable-expert-parallel``,
  whose EP size is TP × DP; SGLang ``--ep-size``; TensorRT-LLM ``moe_expert_parallel_size``).
  Without DP attention the experts are split over the TP group (ep = tp) and the layer still ends in the TP
  all-reduce. With **data-parallel attention** (``--dp-attention``; SGLang ``--enable-dp-attention``, vLLM
  ``--data-parallel-size`` with EP, DeepSeek-V3 report §3.4, arXiv 2412.19437) the replica is
  ep = tp × dp GPUs: dp attention groups of tp GPUs each keep their own sequences and KV cache (MLA's latent
  cache is not split by TP, so dp replaces tp for it), and every MoE layer sends each token to its top-k
  experts and back by all-to-all (DeepEP's dispatch and combine). Two-batch overlap (SGLang
  ``--enable-two-batch-overlap``, vLLM ``--enable-dbo``) splits each step in two so that one half's
  all-to-alls run under the other's compute.

Per GPU and step (``serving.step.step_parts``): the dense and attention work of its 1/dp share of the
step's sequences; the routed experts of all dp × its tokens, k/E each, E/ep experts on the GPU; the busiest
GPU carries ``expert_imbalance`` times the mean routed tokens (routing is not uniform). Default imbalance:
1.18, the ratio of SGLang's prefill throughput under simulated perfect expert balance to that with its
default EPLB on 32 H100 (59,337 / 50,302 input tokens/s per node, DeepSeek-V3, LMSYS blog 2025-05-05,
'Overall Throughput' table; ../shared/reference/published-serving-2025.md §2), the smallest measured gap
between real and balanced routing, taken as the busiest rank's excess.
"""

from __future__ import annotations

import math

from shardlab.comm.moe_dispatch import MAX_EXPERT_IMBALANCE   # one bound for serving and training
from shardlab.errors import ShardlabError, field_name
from shardlab.specs.model import ModelSpec

DEFAULT_EXPERT_IMBALANCE = 59_337 / 50_302
"""Busiest EP rank over the mean (module doc: SGLang, DeepSeek-V3 on 32 H100, perfect vs default EPLB)."""



def moe_layout(spec: ModelSpec, *, tp: int, pp: int, ep: int, dp_attention: bool,
               expert_imbalance: float | None, two_batch_overlap: bool = False,
               redundant_experts: int = 0) -> tuple[int, float]:
    """(attention DP ranks, expert imbalance) of a replica, or one line naming what does not go together."""
    ep_f, tp_f, pp_f = (field_name(f"layout.{k}") for k in ("ep", "tp", "pp"))
    if redundant_experts and ep == 1:
        raise ShardlabError(f"--redundant-experts replicates experts across expert-parallel ranks: add {ep_f} N")
    if two_batch_overlap and not dp_attention:
        raise ShardlabError(f"--two-batch-overlap hides the expert all-to-alls of --dp-attention; add {ep_f} N "
                            "--dp-attention, or drop it")
    if expert_imbalance is not None and not (math.isfinite(expert_imbalance)
                                             and 1.0 <= expert_imbalance <= MAX_EXPERT_IMBALANCE):
        raise ShardlabError(f"{field_name('moe.expert_imbalance')} is the busiest expert-parallel rank's tokens over "
                            f"the mean, in "
                            f"[1, {MAX_EXPERT_IMBALANCE:g}]; got {expert_imbalance:g}")
    if ep == 1 and not dp_attention:
        if expert_imbalance is not None:
            raise ShardlabError(f"{field_name('moe.expert_imbalance')} applies to expert parallelism: add {ep_f} N, or "
                                "drop it")
        return 1, 1.0
    if dp_attention and ep == 1:
        raise ShardlabError(f"--dp-attention shares expert-parallel experts between attention replicas: add {ep_f} N "
                            f"(a multiple of {tp_f})")
    if spec.moe is None:
        raise ShardlabError(f"{spec.name} is a dense model: it has no experts to split; drop {ep_f}/--dp-attention")
    E = spec.moe.num_experts
    if ep < 1 or (E + redundant_experts) % ep or redundant_experts > E:
        raise ShardlabError(f"{ep_f} {ep} does not divide {spec.name}'s {E} routed experts"
                            + (f" plus {redundant_experts} redundant" if redundant_experts else "")
                            + f"; pick a divisor of {E}, or add redundant experts (--redundant-experts R with "
                              f"{E} + R a multiple of {ep}, at most {E})")
    if not dp_attention:
        if ep != tp:
            raise ShardlabError(f"{ep_f} {ep} without --dp-attention splits the experts over the TP group, so it must "
                                f"equal {tp_f} {tp}; give {ep_f} {tp}, or add --dp-attention for {ep // max(tp, 1)} "
                                f"attention replicas of TP {tp}")
        return 1, DEFAULT_EXPERT_IMBALANCE if expert_imbalance is None else expert_imbalance
    if pp > 1:
        raise ShardlabError(f"--dp-attention with {pp_f} > 1 is not modelled (the engines run wide EP without a "
                            f"pipeline): drop {pp_f}")
    if ep % tp or ep < tp:
        raise ShardlabError(f"--dp-attention runs ep / tp attention replicas: {ep_f} {ep} must be a multiple of "
                            f"{tp_f} {tp}")
    imbalance = DEFAULT_EXPERT_IMBALANCE if expert_imbalance is None else expert_imbalance
    return ep // tp, imbalance if ep > 1 else 1.0


def replica_label(tp: int, pp: int = 1, ep: int = 1, dp_attention: int = 1) -> str:
    """A replica's layout in words, as every table, page and file header names it: 'TP t × PP p' (', EP e' with
    experts over the TP group), or 'EP e (n data-parallel attention ranks of TP t)'."""
    if dp_attention > 1:
        return f"EP {ep} ({dp_attention} data-parallel attention ranks of TP {tp})"
    return f"TP {tp} × PP {pp}" + (f", EP {ep}" if ep > 1 else "")


def pool_label(pool: dict) -> str:
    """A prefill or decode pool's replicas, short (``disaggregated`` entries): 'TP t' (× 'PP p'), or 'EP e' over
    attention ranks (of TP t when t > 1)."""
    if pool.get("dp_attention", 1) > 1:
        return f"EP {pool['ep']}" + (f", attn TP {pool['tp']}" if pool.get("tp", 1) > 1 else "")
    return f"TP {pool['tp']}" + (f" × PP {pool['pp']}" if pool.get("pp", 1) > 1 else "")


def two_kinds(splits: list[dict]) -> bool:
    """Whether a capacity search's ``disaggregated`` entries put the prefill pool on another GPU kind than the decode
    pool (``plan --prefill-gpu``)."""
    return any(p["prefill"].get("gpu") != p["decode"].get("gpu") for p in splits)


def plan_label(p: dict) -> str:
    """``replica_label`` of a plan entry (its tp, pp, ep, dp_attention keys)."""
    return replica_label(p["tp"], p["pp"], p.get("ep", 1), p.get("dp_attention", 1))


EP_VALIDATION = {"values": 48, "mean_abs_error": 0.329, "loso_mean_abs_error": 0.338}
"""What `validate --inference` says of the expert-parallel families (predicted, never fitted): published throughputs
of MoE models served with EP and data-parallel attention, and the mean |error| in sample and leave-one-source-out
(tests/test_doc_figures.py holds these to the command's output)."""


def ep_caveat() -> str:
    """The note every estimate or plan of a data-parallel-attention EP layout carries (``EP_VALIDATION``)."""
    v = EP_VALIDATION
    return (f"expert parallelism with data-parallel attention is predicted, never fitted: against {v['values']} "
            f"published throughputs (TensorRT-LLM, SGLang) the model runs {100 * v['mean_abs_error']:.1f}% off on "
            f"average ({100 * v['loso_mean_abs_error']:.1f}% leave-one-source-out), nearly always too fast: read these "
            f"capacities as upper bounds (`shardlab validate --inference`)")

