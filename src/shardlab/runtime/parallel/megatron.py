"""Megatron-style tensor parallelism by hand: the f and g operators and the layers built from them.

Shoeybi et al. 2019, "Megatron-LM", arXiv 1909.08053 §3 (Figure 3): an MLP Y = GeLU(X A), Z = Y B is
split with A by columns and B by rows, so each rank computes its slice without communicating, between
two conjugate operators:
- ``f``: identity in forward, all-reduce of the input gradient in backward (before the column split);
- ``g``: all-reduce in forward (sums the row-parallel partial outputs), identity in backward.
Self-attention is split the same way by heads (q, k, v column-parallel, the output projection
row-parallel). So a block issues exactly one all-reduce per attention and one per MLP in forward (the
``g``s), and one of each in backward (the ``f``s; one ``f`` serves q, k and v). The input embedding is
vocabulary-parallel (rows split; out-of-range tokens give zeros; ``g`` sums), the head is column-parallel
over the vocabulary with its logits all-gathered for the loss.

Every collective is counted in an explicit :class:`CollectiveCounter` (no module globals), by operation and
phase and by the site that issued it (``layers.i.attention``, ``layers.i.mlp``, ``embedding``, ``head``), so a
run can show the one-all-reduce-per-attention-and-per-MLP rule block by block.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from shardlab.errors import ShardlabError
from shardlab.runtime.parallel.region import mark_region, remember


@dataclass
class CollectiveCounter:
    """Collectives issued by the Megatron operators, by (op, phase) and by the site that issued them."""

    counts: Counter = field(default_factory=Counter)
    """(op, phase) -> calls, op in {'all_reduce', 'all_gather'}, phase in {'forward', 'backward'}."""
    sites: Counter = field(default_factory=Counter)
    """(site, op, phase) -> calls; site is 'layers.3.attention', 'layers.3.mlp', 'embedding' or 'head'."""

    def add(self, op: str, phase: str, site: str = "") -> None:
        self.counts[(op, phase)] += 1
        if site:
            self.sites[(site, op, phase)] += 1

    def get(self, op: str, phase: str) -> int:
        return self.counts[(op, phase)]

    def reset(self) -> None:
        self.counts.clear()
        self.sites.clear()

    def at(self, site: str) -> "_SiteCounter":
        """A view that records every call under ``site``."""
        return _SiteCounter(self, site)

    def by_site(self) -> dict[str, dict[str, int]]:
        """{site: {"op/phase": calls}} for the JSON report."""
        out: dict[str, dict[str, int]] = {}
        for (site, op, phase), n in sorted(self.sites.items()):
            out.setdefault(site, {})[f"{op}/{phase}"] = n
        return out


@dataclass
class _SiteCounter:
    """``CollectiveCounter.at(site)``: what the f/g operators of one attention, MLP, embedding or head hold."""

    parent: CollectiveCounter
    site: str

    def add(self, op: str, phase: str) -> None:
        self.parent.add(op, phase, self.site)


class CopyToTensorParallel(torch.autograd.Function):
    """``f`` of Megatron-LM (arXiv 1909.08053 §3): identity forward, all-reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group, counter):  # x: (b, s, h), replicated on the TP ranks
        ctx.group, ctx.counter = group, counter
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # grad: (b, s, h), a partial sum on each rank -> summed
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        ctx.counter.add("all_reduce", "backward")
        return grad, None, None


class ReduceFromTensorParallel(torch.autograd.Function):
    """``g`` of Megatron-LM (arXiv 1909.08053 §3): all-reduce forward (sum of partial outputs), identity backward."""

    @staticmethod
    def forward(ctx, x, group, counter):  # x: (b, s, h) partial sum on each rank
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        counter.add("all_reduce", "forward")
        return x  # (b, s, h) complete

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class GatherFromTensorParallel(torch.autograd.Function):
    """All-gather along the last dimension in forward, keep the local slice of the gradient in backward."""

    @staticmethod
    def forward(ctx, x, group, counter):  # x: (b, s, V/tp)
        n, r = dist.get_world_size(group), dist.get_rank(group)
        parts = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(parts, x.contiguous(), group=group)
        counter.add("all_gather", "forward")
        ctx.width, ctx.rank = x.shape[-1], r
        return torch.cat(parts, -1)  # (b, s, V)

    @staticmethod
    def backward(ctx, grad):
        return grad[..., ctx.rank * ctx.width:(ctx.rank + 1) * ctx.width].contiguous(), None, None


def _split(full, dim: int, rank: int, tp: int) -> nn.Parameter:
    """This rank's equal 1/tp slice of ``full`` along ``dim``, marked with its place in the full tensor."""
    size = full.shape[dim]
    if size % tp:
        raise ShardlabError(f"tp-megatron needs --tp {tp} to divide a weight's {size} rows; the vocabulary is padded "
                            f"for TP, other widths must divide")
    part = size // tp
    offset = [0] * full.dim()
    offset[dim] = rank * part
    return mark_region(nn.Parameter(full.detach().narrow(dim, rank * part, part).clone()), full.shape, offset)


class ColumnParallelLinear(nn.Module):
    """Y_i = X A_i: this rank's rows of the (out, in) weight, so out/tp output features; input must pass ``f`` first."""

    def __init__(self, full: nn.Linear, rank: int, tp: int):
        super().__init__()
        self.weight = _split(full.weight, 0, rank, tp)                                          # (out/tp, in)
        self.bias = _split(full.bias, 0, rank, tp) if full.bias is not None else None
        remember(self)

    def forward(self, x):  # (b, s, in) -> (b, s, out/tp)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Z = sum_i Y_i B_i: this rank's columns of the weight (in/tp inputs), partial sums reduced by ``g``; bias replicated."""

    def __init__(self, full: nn.Linear, rank: int, tp: int, group, counter):
        super().__init__()
        self.group, self.counter = group, counter  # counter: a CollectiveCounter or its view at one site
        self.weight = _split(full.weight, 1, rank, tp)                                          # (out, in/tp)
        self.bias = nn.Parameter(full.bias.detach().clone()) if full.bias is not None else None
        remember(self)

    def forward(self, x):  # (b, s, in/tp) -> (b, s, out)
        out = ReduceFromTensorParallel.apply(F.linear(x, self.weight), self.group, self.counter)
        return out + self.bias if self.bias is not None else out


class VocabParallelEmbedding(nn.Module):
    """Embedding rows [start, end) on this rank; other tokens look up zeros; ``g`` sums the ranks' partial lookups."""

    def __init__(self, full: nn.Embedding, rank: int, tp: int, group, counter):
        super().__init__()
        self.weight = _split(full.weight, 0, rank, tp)                                          # (V/tp, h)
        self.start = rank * self.weight.shape[0]
        remember(self)
        self.group, self.counter = group, counter

    def forward(self, tokens):  # (b, s) -> (b, s, h)
        local = tokens - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        emb = F.embedding(local.masked_fill(outside, 0), self.weight).masked_fill(outside[..., None], 0.0)
        return ReduceFromTensorParallel.apply(emb, self.group, self.counter)


class VocabParallelHead(nn.Module):
    """Output head split by vocabulary rows: f, local logits (b, s, V/tp), all-gather to (b, s, V).

    With tied embeddings it reads the embedding's local shard (no parameter of its own)."""

    def __init__(self, weight_owner: nn.Module, group, counter, own: bool):
        super().__init__()
        self.group, self.counter = group, counter
        if own:
            self.weight = weight_owner.weight
            remember(self)
        else:
            self._owner = [weight_owner]  # a list hides it from named_parameters (tied: counted once)

    def forward(self, x):  # (b, s, h) -> (b, s, V)
        w = self.weight if hasattr(self, "weight") else self._owner[0].weight
        x = CopyToTensorParallel.apply(x, self.group, self.counter)
        return GatherFromTensorParallel.apply(F.linear(x, w), self.group, self.counter)


def _column_head(full: nn.Linear, rank: int, tp: int) -> nn.Module:
    m = nn.Module()
    m.weight = _split(full.weight, 0, rank, tp)
    remember(m)
    return m


def apply_megatron_tp(model: nn.Module, group, counter: CollectiveCounter) -> nn.Module:
    """Replace the GPT's linears and embeddings in place by Megatron-style TP layers over ``group``."""
    spec = model.spec
    tp, rank = dist.get_world_size(group), dist.get_rank(group)
    if spec.num_heads % tp or spec.num_kv_heads % tp:
        raise ShardlabError(f"tp-megatron needs --tp {tp} to divide {spec.name}'s {spec.num_heads} heads and "
                            f"{spec.num_kv_heads} KV heads")
    if spec.moe is not None:
        raise ShardlabError("tp-megatron does not split mixture-of-experts layers; use a dense model")

    def f_hook(site):  # one f before q, k and v (or the MLP's column linears), counted under its site
        c = counter.at(site)
        return lambda module, args, kwargs: ((CopyToTensorParallel.apply(args[0], group, c), *args[1:]), kwargs)

    for key, block in model.layers.items():
        att = block.attention
        for name in ("wq", "wk", "wv"):
            setattr(att, name, ColumnParallelLinear(getattr(att, name), rank, tp))  # (b, s, h) -> (b, s, heads/tp · hd)
        att.wo = RowParallelLinear(att.wo, rank, tp, group, counter.at(f"layers.{key}.attention"))  # (b, s, a·hd/tp) -> (b, s, h)
        att.register_forward_pre_hook(f_hook(f"layers.{key}.attention"), with_kwargs=True)
        mlp = block.mlp
        for name in ("w1", "w3"):
            if hasattr(mlp, name):
                setattr(mlp, name, ColumnParallelLinear(getattr(mlp, name), rank, tp))  # (b, s, h) -> (b, s, f/tp)
        mlp.w2 = RowParallelLinear(mlp.w2, rank, tp, group, counter.at(f"layers.{key}.mlp"))  # (b, s, f/tp) -> (b, s, h)
        mlp.register_forward_pre_hook(f_hook(f"layers.{key}.mlp"), with_kwargs=True)
    if getattr(model, "tok_embeddings", None) is not None:
        model.tok_embeddings = VocabParallelEmbedding(model.tok_embeddings, rank, tp, group, counter.at("embedding"))
    if getattr(model, "norm", None) is not None:
        if getattr(model, "output", None) is not None:
            model.output = VocabParallelHead(_column_head(model.output, rank, tp), group, counter.at("head"), own=True)
        else:
            model.output = VocabParallelHead(model.tok_embeddings, group, counter.at("head"), own=False)
    return model
