"""Expert parallelism by hand: routed experts split over an EP group, tokens moved by all-to-all.

GShard (Lepikhin et al. 2020, arXiv 2006.16668 §2.2) and Megatron-core's alltoall token dispatcher
(megatron/core/transformer/moe/token_dispatcher.py, ``MoEAlltoAllTokenDispatcher``): the EP group is carved out
of data parallelism (``ep`` consecutive data-parallel ranks; ``shardlab.layout``'s grid), each rank keeps E/ep of
the stacked experts (dim 0 of w1/w3/w2, the inventory's ``ep_dim``), and per MoE layer and forward:

1. the router picks top-k experts for each of the rank's b·s tokens (b·s·k copies, h wide);
2. all-gather of the per-expert copy counts over the EP group (Megatron-core's preprocess), so every rank knows
   how many rows it receives from each peer for each of its experts;
3. all-to-all (dispatch): the copies sorted by expert go to the rank that holds it (uneven splits);
4. the local experts run on what arrived;
5. all-to-all back (combine), weighted by the router's probabilities and summed per token.

Backward runs the two all-to-alls in reverse (the gradient of an all-to-all is the all-to-all with the splits
swapped); the counts are not exchanged again. Gradients: the dense parameters are all-reduced over data
parallelism as usual; an expert's gradient already holds the contributions of its whole EP group's tokens, so it
is summed over the expert-data-parallel group (the dp/ep ranks that hold the same experts) and divided by dp,
the number of slices the global batch's mean loss averages (``sync_expert_grads``).

Every collective is counted, with the bytes this rank sent, in an explicit :class:`DispatchCounter`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn

from shardlab.errors import ShardlabError
from shardlab.runtime.gpt import MLP, Experts, MoE
from shardlab.runtime.parallel.region import mark_region, remember


@dataclass
class DispatchCounter:
    """Collectives of the expert dispatcher: calls and bytes, by (op, phase)."""

    calls: Counter = field(default_factory=Counter)
    """(op, phase) -> calls; op 'all_to_all' (dispatch, combine) or 'all_gather' (copy counts)."""
    sent_bytes: Counter = field(default_factory=Counter)
    """(op, phase) -> bytes in nccl-tests' convention: all-to-all, what this rank sent (its whole input, the share
    it keeps included; uneven, routing decides); all-gather, the gathered output."""

    def add(self, op: str, phase: str, nbytes: int) -> None:
        self.calls[(op, phase)] += 1
        self.sent_bytes[(op, phase)] += int(nbytes)

    def reset(self) -> None:
        self.calls.clear()
        self.sent_bytes.clear()

    def summary(self) -> dict[str, dict[str, int]]:
        """{"op/phase": {"calls": n, "sent_bytes": b}} for the JSON report."""
        return {f"{op}/{ph}": {"calls": n, "sent_bytes": self.sent_bytes[(op, ph)]}
                for (op, ph), n in sorted(self.calls.items())}


class AllToAll(torch.autograd.Function):
    """All-to-all of rows with uneven splits; backward sends the gradients back the same way (splits swapped)."""

    @staticmethod
    def forward(ctx, x, send: list[int], recv: list[int], group, counter):  # x: (sum(send), h) -> (sum(recv), h)
        ctx.send, ctx.recv, ctx.group, ctx.counter = send, recv, group, counter
        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_split_sizes=recv, input_split_sizes=send, group=group)
        counter.add("all_to_all", "forward", x.numel() * x.element_size())
        return out

    @staticmethod
    def backward(ctx, grad):  # (sum(recv), h) -> (sum(send), h)
        out = grad.new_empty((sum(ctx.send), *grad.shape[1:]))
        grad = grad.contiguous()
        dist.all_to_all_single(out, grad, output_split_sizes=ctx.send, input_split_sizes=ctx.recv, group=ctx.group)
        ctx.counter.add("all_to_all", "backward", grad.numel() * grad.element_size())
        return out, None, None, None, None


class LocalExperts(Experts):
    """Experts [first, first + E/ep) of the full stack: the same parameter names, dim 0 cut to this rank's share."""

    def __init__(self, full: Experts, first: int, count: int):
        nn.Module.__init__(self)
        self.act = full.act
        for name in ("w1", "w3", "w2"):
            if hasattr(full, name):
                whole = getattr(full, name)
                p = nn.Parameter(whole.detach()[first:first + count].clone())
                setattr(self, name, mark_region(p, whole.shape, (first, 0, 0)))  # a checkpoint fills only these experts
        remember(self)


class ExpertParallelMoE(nn.Module):
    """A MoE layer whose routed experts are split over ``group`` (module doc); router and shared experts replicated."""

    def __init__(self, full: nn.Module, group, counter: DispatchCounter):
        super().__init__()
        ep, r = dist.get_world_size(group), dist.get_rank(group)
        E = full.experts.w1.shape[0]
        if E % ep:
            raise ShardlabError(f"expert parallelism needs --ep {ep} to divide the model's {E} experts")
        self.top_k, self.num_experts, self.ep, self.local = full.top_k, E, ep, E // ep
        self.group, self.counter = group, counter
        self.router, self.renormalize = full.router, full.renormalize
        self.experts = LocalExperts(full.experts, r * self.local, self.local)
        if hasattr(full, "shared"):
            self.shared: MLP = full.shared
        if hasattr(full, "shared_gate"):
            self.shared_gate = full.shared_gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        flat = x.reshape(-1, h)                                          # (b·s, h)
        w, idx = MoE.route(self, flat)                                   # (b·s, k) each
        expert = idx.flatten()                                           # (b·s·k,) the expert of each copy
        order = torch.argsort(expert, stable=True)                       # copies grouped by expert, hence by rank
        token = order // self.top_k                                      # the token each sorted copy came from
        counts = torch.bincount(expert, minlength=self.num_experts)      # (E,) copies per expert from this rank
        # every peer's counts: row p = what rank p sends to each expert (Megatron-core gathers them the same way)
        table = counts.new_empty(self.ep * self.num_experts)
        getattr(dist, "all_gather_single", dist.all_gather_into_tensor)(table, counts, group=self.group)
        self.counter.add("all_gather", "forward", table.numel() * table.element_size())
        table = table.view(self.ep, self.num_experts)
        me = dist.get_rank(self.group)
        mine = table[:, me * self.local:(me + 1) * self.local]          # (ep, E/ep): rows from peer p for expert j
        send = counts.view(self.ep, self.local).sum(1).tolist()
        recv = mine.sum(1).tolist()
        got = AllToAll.apply(flat[token], send, recv, self.group, self.counter)   # (Σ recv, h), by source then expert
        local_expert = torch.repeat_interleave(torch.arange(self.local, device=x.device).repeat(self.ep), mine.flatten())
        out = torch.zeros_like(got)
        for j in range(self.local):
            rows = (local_expert == j).nonzero(as_tuple=True)[0]
            # an expert that received no rows still runs (on none): its weights get a zero gradient and the combine
            # stays in the graph, so every rank runs the backward all-to-alls its peers wait for (Megatron-core keeps
            # zero-token experts in the graph the same way: moe/experts.py)
            out = out.index_copy(0, rows, self.experts.expert(j, got[rows]))
        back = AllToAll.apply(out, recv, send, self.group, self.counter)           # (b·s·k, h), sorted copies
        y = torch.zeros_like(flat).index_add(0, token, back * w.flatten()[order, None])
        if hasattr(self, "shared"):
            y = y + MoE.shared_out(self, flat)
        return y.view(b, s, h)


@dataclass
class ExpertGroups:
    """This rank's expert-parallel group and expert-data-parallel group."""

    ep: object
    """The ``ep`` consecutive data-parallel ranks that split the experts."""
    edp: object
    """The dp/ep ranks that hold the same experts (None when dp == ep)."""
    dp: int
    """Data-parallel degree (the global loss averages dp slices)."""


def expert_groups(mesh, dp: int, ep: int, coords: dict) -> ExpertGroups:
    """EP groups (consecutive data-parallel ranks, as ``shardlab.layout`` places them) and expert-data-parallel
    groups, for every (pp, tp) coordinate; every rank takes part in creating all of them."""
    if dp % ep:
        raise ShardlabError(f"--ep {ep} must divide the data-parallel degree {dp}")
    grid = mesh.mesh  # (pp, dp, tp) tensor of global ranks
    mine_ep = mine_edp = None
    for p in range(grid.shape[0]):
        for t in range(grid.shape[2]):
            for first in range(0, dp, ep):
                g = dist.new_group([int(grid[p, d, t]) for d in range(first, first + ep)])
                if p == coords["pp"] and t == coords["tp"] and first <= coords["dp"] < first + ep:
                    mine_ep = g
            if dp > ep:
                for k in range(ep):
                    g = dist.new_group([int(grid[p, d, t]) for d in range(k, dp, ep)])
                    if p == coords["pp"] and t == coords["tp"] and coords["dp"] % ep == k:
                        mine_edp = g
    return ExpertGroups(mine_ep, mine_edp, dp)


def apply_expert_parallel(model: nn.Module, groups: ExpertGroups, counter: DispatchCounter) -> list[str]:
    """Replace every MoE layer's experts by this rank's share; returns the names of the expert parameters."""
    if model.spec.moe is None:
        raise ShardlabError(f"expert parallelism needs a mixture-of-experts model; {model.spec.name} is dense "
                            "(try --model tiny-moe)")
    names = []
    for key, block in model.layers.items():
        if hasattr(block, "moe"):
            block.moe = ExpertParallelMoE(block.moe, groups.ep, counter)
            names += [f"layers.{key}.moe.experts.{n}" for n, _ in block.moe.experts.named_parameters()]
    return names


def sync_expert_grads(params: list[nn.Parameter], groups: ExpertGroups) -> None:
    """Sum the expert gradients over the expert-data-parallel group and divide by dp (module doc): one all-reduce
    of them all flattened, as a gradient bucket."""
    for p in params:
        if p.grad is None:     # a layer whose local experts saw no token in any micro-batch: the peers' sizes match
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params]
    if not grads:
        return
    if groups.edp is not None:
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, group=groups.edp)
        for g, part in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(part.view_as(g))
    for g in grads:
        g.div_(groups.dp)


def gather_experts(grad: torch.Tensor, group) -> torch.Tensor:
    """The full (E, ...) stack of an expert tensor from the EP group's shares (collective: the group calls)."""
    parts = [torch.empty_like(grad) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, grad.contiguous(), group=group)
    return torch.cat(parts, 0)
