"""Model states per rank: which tensors each pipeline rank holds, and their bytes after TP, EP and ZeRO.

Sharding rules:
- TP/EP split each tensor as recorded in the inventory (``shardlab.specs.tensors``).
- Pipeline: rank r holds the layers of its chunk(s); chunk c of p·v lives on rank c mod p (interleaved
  schedule, Narayanan et al. 2021 §2.2). The embedding sits with the first chunk, the final norm and head
  with the last; tied embeddings with pp > 1 keep a copy of the embedding on the last stage as the head
  (Megatron-LM: gradients of the two copies are all-reduced).
- ZeRO over the data-parallel shard group (dp·cp for dense tensors, dp·cp/ep for experts):
  stage 1 shards optimizer state, 2 also gradients, 3 also weights (ZeRO §5.1-5.3). Stages 1-2 use a flat
  buffer split evenly (DeepSpeed: ceil(N / D) elements per rank); stage 3 shards each tensor on dim 0 with
  padding, ceil(d0 / D) rows per rank (PyTorch FSDP2 ``fully_shard``), so a rank holds exactly what FSDP2
  allocates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shardlab.layout import Layout, split_layers
from shardlab.memory.precision import StateBytes
from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import PRE, TensorSpec, model_tensors


@dataclass(frozen=True)
class StageTensors:
    """What one pipeline rank holds (identical on every TP/CP/DP rank of that stage)."""

    stage: int
    """Pipeline rank."""
    layers: tuple[int, ...]
    """Block indices held (all virtual chunks)."""
    tensors: tuple[TensorSpec, ...]
    """Parameters held, full shapes (split with ``local_shape``)."""
    holds_embedding: bool
    """Holds the token embedding (first chunk)."""
    holds_head: bool
    """Holds the final norm, output head and loss (last chunk)."""


def chunk_layers(spec: ModelSpec, layout: Layout) -> list[range]:
    """Layer ranges of the p·v model chunks in order (chunk c runs on pipeline rank c mod p)."""
    if layout.stage_layers:
        sizes = tuple(layout.stage_layers)
    else:
        sizes = split_layers(spec.num_layers, layout.pp * layout.vpp)
    out, start = [], 0
    for n in sizes:
        out.append(range(start, start + n))
        start += n
    return out


def stage_tensors(spec: ModelSpec, layout: Layout) -> list[StageTensors]:
    """The tensors of each pipeline rank."""
    p = layout.pp
    chunks = chunk_layers(spec, layout)
    layer_stage = {}
    for c, rng in enumerate(chunks):
        for layer in rng:
            layer_stage[layer] = c % p
    by_stage: list[list[TensorSpec]] = [[] for _ in range(p)]
    L = spec.num_layers
    for t in model_tensors(spec):
        if t.layer == PRE:
            by_stage[0].append(t)
        elif t.layer == L:
            by_stage[(len(chunks) - 1) % p].append(t)
        else:
            by_stage[layer_stage[t.layer]].append(t)
    last = (len(chunks) - 1) % p
    if spec.tied_embeddings and p > 1:
        by_stage[last].append(TensorSpec("output.weight", (spec.vocab_size, spec.embedding_dim), L, "head", tp_dim=0))
    out = []
    for s in range(p):
        layers = tuple(sorted(layer for layer, st in layer_stage.items() if st == s))
        out.append(StageTensors(s, layers, tuple(by_stage[s]), s == 0, s == last))
    return out


def fsdp_shard_numel(shape: tuple[int, ...], n: int, rank: int | None = None, dim: int = 0) -> int:
    """Elements of a tensor sharded on dimension ``dim`` (default 0) over ``n`` ranks (FSDP2).

    rank None: the padded shard, ceil(d/n) slices, which FSDP2 allocates on every rank for weights and
    gradients. rank r: the slices rank r really owns, min(ceil, d − r·ceil) (the last shard may be short,
    or empty), which is what optimizer state is created for.
    """
    if n == 1 or not shape:
        return math.prod(shape) if shape else 1
    d = shape[dim]
    rows = -(-d // n)
    if rank is not None:
        rows = max(0, min(rows, d - rank * rows))
    return rows * math.prod(shape) // d


def expert_shard_dim(local_shape: tuple[int, ...], group: int) -> int:
    """FSDP2 shard dimension of a stacked expert tensor (E/ep, ...): dim 0 while each rank of the expert
    data-parallel group can get at least one expert, else dim 1 (torchtitan's ``shard_placement_fn`` for
    MoE experts), so that a few experts are still split across many ranks."""
    return 0 if local_shape[0] >= group else 1


@dataclass(frozen=True)
class StateReport:
    """Model-state bytes of one rank."""

    params_local: int
    """Parameters after TP/EP splitting (before ZeRO), i.e. what one model replica's shard holds."""
    params_stored: int
    """Parameters whose weights this rank stores (= params_local unless ZeRO-3)."""
    expert_params_local: int
    """Of params_local, routed-expert parameters (sharded over dp·cp/ep by ZeRO, not dp·cp)."""
    weights: int
    """Bytes of weights in the compute dtype."""
    gradients: int
    """Bytes of gradients."""
    master: int
    """Bytes of fp32 master weights (mixed precision)."""
    moments: int
    """Bytes of optimizer moments (Adam m and v, or SGD momentum)."""

    @property
    def optimizer(self) -> int:
        return self.master + self.moments

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer


def state_report(tensors: tuple[TensorSpec, ...], spec: ModelSpec, layout: Layout, sb: StateBytes,
                 tp_rank: int | None = None, shard_rank: int | None = None,
                 expert_shard_rank: int | None = None) -> StateReport:
    """Bytes of weights, gradients and optimizer state on one rank holding ``tensors``.

    With the defaults (None) this is the worst rank. ``tp_rank`` selects that TP rank's chunk of unevenly
    split tensors (a vocabulary not divisible by tp); ``shard_rank`` / ``expert_shard_rank`` (the rank's
    position in the dp·cp and dp·cp/ep groups) select, under ZeRO-3, the rows whose optimizer state it owns
    (FSDP2 creates optimizer state for the unpadded local shard). ``rank_state_report`` derives all three
    from a global rank."""
    D, De = layout.dp_shard, layout.expert_dp
    dense = expert = dense_fsdp = expert_fsdp = dense_own = expert_own = 0
    for t in tensors:
        shape = t.local_shape(spec, layout.tp, layout.ep, tp_rank, layout.etp)
        n = math.prod(shape)
        if t.ep_dim is not None:
            dim = expert_shard_dim(shape, De)
            expert += n
            expert_fsdp += fsdp_shard_numel(shape, De, dim=dim)
            expert_own += fsdp_shard_numel(shape, De, expert_shard_rank, dim=dim)
        else:
            dense += n
            dense_fsdp += fsdp_shard_numel(shape, D)
            dense_own += fsdp_shard_numel(shape, D, shard_rank)
    local = dense + expert
    flat = -(-dense // D) + -(-expert // De)
    z = layout.zero
    stored = dense_fsdp + expert_fsdp if z >= 3 else local
    grads = dense_fsdp + expert_fsdp if z >= 3 else flat if z == 2 else local
    opt = dense_own + expert_own if z >= 3 else flat if z >= 1 else local
    return StateReport(
        params_local=local, params_stored=stored, expert_params_local=expert,
        weights=stored * sb.weights, gradients=grads * sb.gradients,
        master=opt * sb.master, moments=int(round(opt * sb.moments)))


def rank_state_report(spec: ModelSpec, layout: Layout, sb: StateBytes, rank: int) -> StateReport:
    """Model states of global ``rank``: its pipeline stage, TP chunk and ZeRO shard from the rank grid."""
    from shardlab.rank_grid import rank_coords

    c = rank_coords(rank, layout)
    st = stage_tensors(spec, layout)[c["pp"]]
    shard = c["dp"] * layout.cp + c["cp"]                       # position in the dp·cp group (cp varies fastest)
    expert_shard = (c["dp"] // layout.ep) * layout.cp + c["cp"]  # position among the replicas of its expert shard
    if layout.expert_tp < layout.tp:       # the expert grid etp, ep, edp over the stage's ranks (layout.expert_grid)
        expert_shard = (c["tp"] + layout.tp * (c["cp"] + layout.cp * c["dp"])) // (layout.expert_tp * layout.ep)
    return state_report(st.tensors, spec, layout, sb, tp_rank=c["tp"], shard_rank=shard, expert_shard_rank=expert_shard)


def state_report_from_count(params: int, layout: Layout, sb: StateBytes) -> StateReport:
    """Model states when only a parameter count Ψ is known: Ψ/(tp·pp) per model-parallel rank, ZeRO over dp·cp.

    Reproduces the ZeRO paper's worked example (Ψ = 7.5e9, N_d = 64: 120, 31.4, 16.6, 1.875 GB).
    """
    local = -(-params // (layout.tp * layout.pp))
    D = layout.dp_shard
    shard = -(-local // D)
    z = layout.zero
    stored = shard if z >= 3 else local
    grads = shard if z >= 2 else local
    opt = shard if z >= 1 else local
    return StateReport(local, stored, 0, stored * sb.weights, grads * sb.gradients, opt * sb.master, int(round(opt * sb.moments)))
