"""How a training job moves a MoE block's tokens to their experts and back (``MoeDispatch``), and what that costs
per rank: Megatron-core's all-to-all dispatcher, DeepEP's node-deduplicated one, the busiest rank's share under
uneven routing, and the all-to-all overlap of one micro-batch's dispatch with another's compute.

Sources:
- Megatron-core 0.16.1 ``MoEAlltoAllTokenDispatcher`` (token_dispatcher.py): an all-gather of the per-expert token
  counts over the TP × EP group, then an all-to-all of every token copy to the rank of its expert, and back.
- DeepEP (deepseek-ai/DeepEP README, 'normal kernels'; DeepSeek-V3 report §3.2.2, arXiv 2412.19437): a token goes
  over the network once to every remote node that holds one of its experts, and that node's GPU forwards it over
  NVLink to the experts' GPUs; the counts travel inside the dispatch (no separate all-gather). Megatron-core runs it
  as ``--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep``.
- Megatron-core ``--overlap-moe-expert-parallel-comm`` (transformer_config.py: needs EP > 1, the alltoall or flex
  dispatcher, no full recomputation, virtual stages when PP > 1): the 1F1B schedule runs one micro-batch's forward
  beside another's backward, and each one's dispatch and combine under the other's compute, as DeepSeek's DualPipe
  does (DeepSeek-V3 report §3.2.1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shardlab.errors import ShardlabError, field_name

DISPATCHERS = ("alltoall", "deepep")
"""Token dispatchers priced: Megatron-core's all-to-all (one copy per routed expert) and DeepEP (one copy per
remote node)."""

MAX_EXPERT_IMBALANCE = 64.0
"""Largest --expert-imbalance taken, serving and training (one rank can carry at most every routed token: E/k × the
mean)."""


@dataclass(frozen=True)
class MoeDispatch:
    """A training job's MoE token movement (workload settings; a dense model ignores them)."""

    dispatcher: str = "alltoall"
    """'alltoall' (Megatron-core's MoEAlltoAllTokenDispatcher) or 'deepep' (flex dispatcher, DeepEP backend)."""
    ep_comm_overlap: bool = False
    """The dispatch and combine all-to-alls of one micro-batch run under another's compute (Megatron-core
    --overlap-moe-expert-parallel-comm)."""
    expert_imbalance: float = 1.0
    """The busiest expert-parallel rank's routed tokens over the mean (1 = balanced, as forced-balance benchmarks
    route); its expert GEMMs and received copies set the pace of every all-to-all."""

    def __post_init__(self):
        if self.dispatcher not in DISPATCHERS:
            raise ShardlabError(f"{field_name('moe.dispatcher')} is one of {', '.join(DISPATCHERS)}, got "
                                f"{str(self.dispatcher)[:40]!r}")
        f = self.expert_imbalance
        if not (isinstance(f, (int, float)) and math.isfinite(f) and 1.0 <= f <= MAX_EXPERT_IMBALANCE):
            raise ShardlabError(f"{field_name('moe.expert_imbalance')} is the busiest expert-parallel rank's tokens "
                                f"over the mean, in "
                                f"[1, {MAX_EXPERT_IMBALANCE:g}]; got {f!r}")

    @property
    def is_default(self) -> bool:
        return self == MoeDispatch()


def distinct_per_token(n, top_k: int):
    """Expected distinct places (nodes, or GPUs) among ``n`` that a token's ``top_k`` experts fall on under uniform
    routing: n·(1 − (1 − 1/n)^k), each place being missed by all k with probability (1 − 1/n)^k. Array-safe."""
    n = np.maximum(np.asarray(n, dtype=float), 1.0)
    return n * (1.0 - (1.0 - 1.0 / n) ** top_k)


def remote_nodes_per_token(nodes, top_k: int):
    """Expected remote nodes a token's ``top_k`` experts fall on when the EP group spans ``nodes`` nodes:
    (nodes − 1)/nodes of the distinct ones (``distinct_per_token``) by symmetry. Array-safe."""
    nodes = np.maximum(np.asarray(nodes, dtype=float), 1.0)
    return distinct_per_token(nodes, top_k) * (nodes - 1.0) / nodes


def overlapped_ep_s(ep_s, compute_s, microbatches, eta):
    """Exposed all-to-all time per micro-batch under the 1F1B all-to-all overlap: each of the m micro-batches but one
    runs beside another, hiding up to η of its block compute (``comm.pricing.exposed_s``); the first has no partner.
    Array-safe."""
    m = np.maximum(np.asarray(microbatches, dtype=float), 1.0)
    hidden = np.maximum(np.asarray(ep_s) - eta * np.asarray(compute_s), 0.0)
    return np.asarray(ep_s) / m + (m - 1.0) / m * hidden


def overlap_runs(ep, recompute_code, pp, vpp, precision: str):
    """Where Megatron-core runs the all-to-all overlap (array-safe over candidates): EP > 1, no full recomputation
    (code 2), virtual stages with a pipeline, a bf16/fp16 model (``overlap_refusal`` says which fails)."""
    ep, rc, pp, vpp = (np.asarray(x) for x in (ep, recompute_code, pp, vpp))
    return (ep > 1) & (rc != 2) & ((pp == 1) | (vpp > 1)) & (precision != "fp32")


def overlap_refusal(layout, precision: str = "bf16-mixed") -> str:
    """Why Megatron-core would not run the all-to-all overlap on ``layout`` ('' when it would)."""
    if precision == "fp32":
        return "Megatron-core runs it only with bf16 or fp16 models"
    if layout.ep <= 1:
        return f"it needs expert parallelism ({field_name('layout.ep')} > 1)"
    if str(layout.recompute) == "full":
        return "Megatron-core refuses it with full recomputation"
    if layout.pp > 1 and layout.vpp < 2:
        return (f"Megatron-core needs virtual pipeline stages with a pipeline ({field_name('layout.vpp')} 2 or more, "
                "interleaved)")
    return ""


def overlap_applies(workload, layout) -> bool:
    """The all-to-all overlap is asked for and Megatron-core would run it on ``layout``."""
    moe = getattr(workload, "moe", None)
    return bool(moe is not None and moe.ep_comm_overlap
                and overlap_runs(layout.ep, 2 if str(layout.recompute) == "full" else 0, layout.pp, layout.vpp,
                                 workload.precision))


def check_overlap_modules(moe: MoeDispatch, modules) -> None:
    """Under the all-to-all overlap Megatron-core runs a MoE layer through its fine-grained callables (route,
    dispatch, experts, combine), which bypass the layer's 'moe' recomputation: refuse the pair, as it would do
    nothing there."""
    if moe.ep_comm_overlap and "moe" in (modules or ()):
        raise ShardlabError(f"{field_name('moe.ep_comm_overlap')} runs MoE layers through Megatron-core's fine-grained "
                            f"callables, which do not recompute the 'moe' module: drop moe from "
                            f"{field_name('layout.recompute_modules')} (moe_act still applies), or drop the overlap")


def moe_notes(moe: MoeDispatch, layout, spec, precision: str = "bf16-mixed") -> list[str]:
    """What the estimate says about settings that do not apply to this model or layout."""
    if moe.is_default:
        return []
    if spec.moe is None:
        return [f"{spec.name} is dense: {field_name('moe.dispatcher')}, {field_name('moe.ep_comm_overlap')} and "
                f"{field_name('moe.expert_imbalance')} have no effect"]
    out = []
    why = overlap_refusal(layout, precision) if moe.ep_comm_overlap else ""
    if why:
        out.append(f"{field_name('moe.ep_comm_overlap')} not applied: {why}")
    if layout.ep <= 1 and (moe.dispatcher != "alltoall" or moe.expert_imbalance != 1.0):
        out.append(f"{field_name('moe.dispatcher')} and {field_name('moe.expert_imbalance')} act on expert "
                   f"parallelism: no effect without {field_name('layout.ep')} > 1")
    return out
