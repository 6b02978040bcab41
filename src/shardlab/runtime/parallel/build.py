"""Build one rank's share of a strategy (mesh, sharded model, optimizer) and run a training step on it.

Used by the torchrun rank program (``shardlab.runtime.train_worker``) and by the threaded parity tests,
so both exercise exactly the same code. Every rank builds the full model from the same seed and then
shards it, so a run starts from the weights of the single-process reference.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from shardlab.runtime.gpt import build_model
from shardlab.runtime.parallel.expert import DispatchCounter, ExpertGroups
from shardlab.runtime.parallel.megatron import CollectiveCounter, apply_megatron_tp
from shardlab.runtime.parallel.strategy import Strategy


@dataclass
class RankSetup:
    """One rank's part of a run."""

    strategy: Strategy
    """What is run."""
    rank: int
    """Global rank."""
    coords: dict
    """Mesh coordinates {'pp', 'dp', 'tp'}."""
    modules: list[nn.Module]
    """Model chunks held (one unless interleaved pipeline)."""
    optimizer: torch.optim.Optimizer
    """Optimizer over this rank's parameters."""
    mesh: object
    """The (pp, dp, tp) DeviceMesh."""
    pipeline: object = None
    """PipelineParts when pp > 1."""
    counter: CollectiveCounter = field(default_factory=CollectiveCounter)
    """Collectives issued by the Megatron f/g operators."""
    device: torch.device = torch.device("cpu")
    """Where the model lives."""
    experts: ExpertGroups | None = None
    """Expert-parallel and expert-data-parallel groups (ep > 1)."""
    expert_params: list = field(default_factory=list)
    """This rank's routed-expert parameters (their gradients are reduced by ``expert.sync_expert_grads``)."""
    dispatch: DispatchCounter = field(default_factory=DispatchCounter)
    """Collectives issued by the expert dispatcher."""

    @property
    def params(self) -> list[nn.Parameter]:
        return [p for m in self.modules for p in m.parameters()]

    @property
    def computes_loss(self) -> bool:
        """True on ranks that see the loss (the last pipeline stage)."""
        return self.pipeline is None or self.pipeline.has_last


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy: logits (b, s, V), targets (b, s)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def make_optimizer(params, name: str, lr: float) -> torch.optim.Optimizer:
    """AdamW (moments exp_avg, exp_avg_sq: 8 B/param in fp32) or SGD with momentum (4 B/param)."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.0, foreach=False)


def _tied_group(strategy: Strategy, mesh, coords: dict):
    """{first stage, last stage} group per (dp, tp) coordinate; every rank takes part in creating all of them."""
    mine = None
    grid = mesh.mesh  # (pp, dp, tp) tensor of global ranks
    for d in range(strategy.dp):
        for t in range(strategy.tp):
            ranks = [int(grid[0, d, t]), int(grid[strategy.pp - 1, d, t])]
            g = dist.new_group(ranks)
            if d == coords["dp"] and t == coords["tp"]:
                mine = g
    return mine


def setup_rank(spec, strategy: Strategy, *, microbatches: int = 1, optimizer: str = "adamw", lr: float = 1e-3,
               seed: int = 0, device_type: str = "cpu", recorder=None, numerics=None, load=None) -> RankSetup:
    """Mesh, model (sharded per ``strategy``), optimizer for the calling rank (process group already initialised).

    ``numerics``: a checkpoint's (``runtime.numerics``); ``load(modules)``: fills the sharded modules from a checkpoint
    before the optimizer is built (``runtime.checkpoint.load.load_into``)."""
    from torch.distributed.device_mesh import init_device_mesh

    rank = dist.get_rank()
    device = torch.device(device_type, torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")
    mesh = init_device_mesh(device_type, (strategy.pp, strategy.dp, strategy.tp), mesh_dim_names=("pp", "dp", "tp"))
    coords = {k: mesh.get_local_rank(k) for k in ("pp", "dp", "tp")}
    counter, dispatch = CollectiveCounter(), DispatchCounter()
    experts, expert_params = None, []
    if strategy.ep > 1:
        from shardlab.runtime.parallel.expert import expert_groups

        experts = expert_groups(mesh, strategy.dp, strategy.ep, coords)

    def shard(m: nn.Module) -> nn.Module:
        if experts is not None:
            from shardlab.runtime.parallel.expert import apply_expert_parallel

            names = set(apply_expert_parallel(m, experts, dispatch))
            expert_params.extend(p for n, p in m.named_parameters() if n in names)
            if strategy.data == "ddp":   # the experts' gradients are reduced over their own group
                from torch.nn.parallel import DistributedDataParallel as DDP

                DDP._set_params_and_buffers_to_ignore_for_model(m, sorted(names))
        if strategy.tp_kind == "dtensor":
            from shardlab.runtime.parallel.tensor import apply_tp

            apply_tp(m, mesh["tp"], sequence_parallel=strategy.sequence_parallel)
        elif strategy.tp_kind == "megatron":
            apply_megatron_tp(m, mesh["tp"].get_group(), counter)
        if strategy.data == "fsdp":
            from shardlab.runtime.parallel.fsdp import apply_fsdp

            apply_fsdp(m, mesh["dp"])
        elif strategy.data == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            m = DDP(m, process_group=mesh["dp"].get_group(), device_ids=[device] if device_type == "cuda" else None)
        return m

    pipe = None
    if strategy.pp > 1:
        from shardlab.runtime.parallel.pipeline import build_pipeline

        tied = _tied_group(strategy, mesh, coords) if spec.tied_embeddings else None
        pipe = build_pipeline(spec, strategy.layout(), coords["pp"], mesh["pp"].get_group(), microbatches, loss_fn,
                              seed=seed, device=device, wrap=shard, recorder=recorder, tied_group=tied, numerics=numerics)
        modules = pipe.modules
    else:
        kw = {"numerics": numerics} if numerics is not None else {}
        modules = [shard(build_model(spec, device=device, seed=seed, **kw))]
    if load is not None:
        load(modules)
    params = [p for m in modules for p in m.parameters()]
    return RankSetup(strategy, rank, coords, modules, make_optimizer(params, optimizer, lr), mesh, pipe, counter, device,
                     experts, expert_params, dispatch)


def forward_backward(setup: RankSetup, x: torch.Tensor, y: torch.Tensor, microbatches: int, recorder=None):
    """Forward and backward of this rank's slice of a step (gradients averaged over micro-batches).

    Returns the mean loss of the slice on ranks that compute it, else None.
    """
    x, y = x.to(setup.device), y.to(setup.device)
    if setup.pipeline is not None:
        from shardlab.runtime.parallel.pipeline import pipeline_step

        if recorder is not None:
            recorder.phase = "forward"
        return pipeline_step(setup.pipeline, x, y)
    import contextlib

    model, total = setup.modules[0], 0.0
    for i, (xm, ym) in enumerate(zip(x.chunk(microbatches), y.chunk(microbatches))):
        # DDP: accumulate locally and all-reduce once, in the last micro-batch's backward
        quiet = model.no_sync() if hasattr(model, "no_sync") and i < microbatches - 1 else contextlib.nullcontext()
        with quiet:
            if recorder is not None:
                recorder.phase = "forward"
            loss = loss_fn(model(xm), ym) / microbatches
            if recorder is not None:
                recorder.phase = "backward"
            loss.backward()
        total += loss.detach()
    if setup.experts is not None:
        from shardlab.runtime.parallel.expert import sync_expert_grads

        sync_expert_grads(setup.expert_params, setup.experts)
    return total


def optimizer_step(setup: RankSetup, recorder=None) -> None:
    if recorder is not None:
        recorder.phase = "optimizer"
    setup.optimizer.step()


def full_grads(setup: RankSetup, spec) -> dict[str, torch.Tensor]:
    """Every gradient this rank's parameters contribute, gathered to its full shape (collective: all ranks call)."""
    from torch.distributed.tensor import DTensor

    from shardlab.specs.tensors import model_tensors

    inv = {t.name: t for t in model_tensors(spec)}
    tp_group = setup.mesh["tp"].get_group() if setup.strategy.tp > 1 else None
    experts = {id(p) for p in setup.expert_params}
    out = {}
    for m in setup.modules:
        for name, p in m.named_parameters():
            name = name.removeprefix("module.")
            g = p.grad
            if id(p) in experts:
                from shardlab.runtime.parallel.expert import gather_experts

                g = gather_experts(g, setup.experts.ep)
            elif isinstance(g, DTensor):
                g = g.full_tensor()
            elif setup.strategy.tp_kind == "megatron" and tp_group is not None:
                t = inv.get(name) or inv.get("tok_embeddings.weight")
                if t.tp_dim is not None:
                    parts = [torch.empty_like(g) for _ in range(setup.strategy.tp)]
                    dist.all_gather(parts, g.contiguous(), group=tp_group)
                    g = torch.cat(parts, t.tp_dim)
            if spec.tied_embeddings and name == "output.weight":
                name = "tok_embeddings.weight" if "tok_embeddings.weight" not in out else "output.weight(copy)"
            out[name] = g.detach().cpu().clone()
    return out
