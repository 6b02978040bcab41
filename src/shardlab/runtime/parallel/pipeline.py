"""Pipeline parallelism with ``torch.distributed.pipelining``: stages cut from the GPT, GPipe / 1F1B / interleaved.

The model is cut into p·v chunks with the memory model's own split (``shardlab.memory.states.chunk_layers``),
chunk c running on pipeline rank c mod p (Narayanan et al. 2021, arXiv 2104.04473 §2.2: interleaved
1F1B with v virtual stages per rank). A chunk is a GPT with the other blocks deleted (names kept:
``layers.5.attention.wq.weight`` stays that name); the first chunk keeps the embeddings, the last the
final norm and head. With tied embeddings the last chunk holds a copy of the embedding as its head and
the two copies' gradients are summed between the first and last stage after backward (Megatron-LM,
Shoeybi et al. 2019; the memory model counts this copy).

Schedules (Huang et al. 2019 GPipe; Narayanan et al. 2021 PipeDream-Flush 1F1B): all forwards then all
backwards, or one-forward-one-backward after a warm-up; gradients are averaged over micro-batches
(``scale_grads``), so a step equals one step on the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn

from shardlab.errors import ShardlabError
from shardlab.layout import Layout
from shardlab.memory.states import chunk_layers
from shardlab.runtime.gpt import build_model

SCHEDULES = ("gpipe", "1f1b", "interleaved")
_FORWARD = ("forward_one_chunk",)
_BACKWARD = ("backward_one_chunk", "backward_weight_one_chunk")
_P2P_OPS = {"get_fwd_send_ops": "forward", "get_fwd_recv_ops": "forward", "get_bwd_send_ops": "backward",
            "get_bwd_recv_ops": "backward"}
_SETUP = ("_prepare_forward_infra", "_prepare_backward_infra", "_warmup_forward_vote", "_warmup_backward_result",
          "_send_meta", "_recv_meta")
"""Stage methods that run once, on the first step: the P2P warm-up vote and the shape (metadata) exchange."""


@dataclass
class PipelineParts:
    """What one pipeline rank runs."""

    modules: list[nn.Module]
    """Its model chunks, in schedule order (one, or v for the interleaved schedule)."""
    chunk_ids: list[int]
    """Global index of each chunk (0 .. p·v-1)."""
    schedule: object
    """The torch pipelining schedule; call ``step``."""
    has_first: bool
    """Holds chunk 0 (feeds the token ids)."""
    has_last: bool
    """Holds the last chunk (computes the loss)."""
    tied_group: object = None
    """Process group {first stage, last stage} summing the tied embedding/head gradients, or None."""


def make_chunk(spec, layers: range, first: bool, last: bool, seed: int, device, numerics=None) -> nn.Module:
    """A GPT holding only ``layers`` (and embeddings if ``first``, norm and head if ``last``)."""
    m = build_model(spec, device=device, seed=seed, **({"numerics": numerics} if numerics is not None else {}))
    for key in list(m.layers.keys()):
        if int(key) not in layers:
            del m.layers[key]
    if last and spec.tied_embeddings and not first:
        head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False, device=device)
        with torch.no_grad():
            head.weight.copy_(m.tok_embeddings.weight)  # the head copy starts equal to the embedding
        m.output = head
    if not first:
        for name in ("tok_embeddings", "pos_embeddings", "emb_norm"):
            if hasattr(m, name):
                delattr(m, name)
    if not last:
        for name in ("norm", "output"):
            if hasattr(m, name):
                delattr(m, name)
    return m


def tag_phases(stage, recorder) -> None:
    """Make a stage file its sends and receives under forward/backward, and its first step's one-time
    messages (warm-up vote, shape exchange) under "setup".

    Each send/recv is tagged when the schedule builds it (``get_*_ops``), not when it fires: 1F1B fires the
    last warm-up forward send together with the first backward receive (torch/distributed/pipelining/
    schedules.py, "fwd_send_bwd_recv"), so the phase current at dispatch would mislabel one of them."""
    if recorder is None:
        return

    def wrap(name, before, after=None):
        fn = getattr(stage, name, None)
        if fn is None:
            return

        def wrapped(*a, **kw):
            prev = before()
            try:
                out = fn(*a, **kw)
            finally:
                if after:
                    after(prev)
            return out
        setattr(stage, name, wrapped)

    def set_phase(ph):
        prev, recorder.phase = recorder.phase, ph
        return prev

    for names, phase in ((_FORWARD, "forward"), (_BACKWARD, "backward")):
        for name in names:
            wrap(name, lambda ph=phase: set_phase(ph))
    for name in _SETUP:
        wrap(name, lambda: set_phase("setup"), lambda prev: setattr(recorder, "phase", prev))
    for name, phase in _P2P_OPS.items():
        fn = getattr(stage, name, None)
        if fn is None:
            continue

        def tagged(*a, _fn=fn, _phase=phase, **kw):
            ops = _fn(*a, **kw)
            for op in ops:
                recorder.p2p_phase[op.tensor.data_ptr()] = _phase
            return ops
        setattr(stage, name, tagged)


def build_pipeline(spec, layout: Layout, pp_rank: int, pp_group, microbatches: int, loss_fn, *, seed: int = 0,
                   device=torch.device("cpu"), wrap=None, recorder=None, tied_group=None, numerics=None) -> PipelineParts:
    """Cut the model, wrap each chunk (``wrap``: e.g. DDP or FSDP over the data-parallel group) and build the schedule."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    p, v = layout.pp, layout.vpp
    if layout.schedule not in SCHEDULES:
        raise ShardlabError(f"--schedule {layout.schedule} is not run by the runtime; use one of {', '.join(SCHEDULES)}")
    if (layout.schedule == "interleaved") != (v > 1):
        raise ShardlabError("the interleaved schedule needs --vpp 2 or more, and --vpp > 1 needs --schedule interleaved")
    if microbatches < p and layout.schedule != "gpipe":
        raise ShardlabError(f"{layout.schedule} needs at least --pp {p} micro-batches per step, got {microbatches}; "
                            f"raise --global-batch or lower --micro-batch")
    if layout.schedule == "interleaved" and microbatches % p:
        raise ShardlabError(f"the interleaved schedule needs micro-batches ({microbatches}) to be a multiple of --pp {p}")
    chunks = chunk_layers(spec, layout)
    n = len(chunks)
    ids = [c for c in range(n) if c % p == pp_rank]
    modules, stages = [], []
    for c in ids:
        m = make_chunk(spec, chunks[c], c == 0, c == n - 1, seed, device, numerics)
        m = wrap(m) if wrap else m
        modules.append(m)
        st = PipelineStage(m, c, n, device, group=pp_group)
        tag_phases(st, recorder)
        stages.append(st)
    if v > 1:
        sched = ScheduleInterleaved1F1B(stages, microbatches, loss_fn=loss_fn)
    else:
        cls = ScheduleGPipe if layout.schedule == "gpipe" else Schedule1F1B
        sched = cls(stages[0], microbatches, loss_fn=loss_fn)
    return PipelineParts(modules, ids, sched, 0 in ids, n - 1 in ids, tied_group)


def pipeline_step(parts: PipelineParts, x, y) -> torch.Tensor | None:
    """One training step's forward and backward through the schedule; the mean loss on the last stage, else None."""
    losses: list = []
    kw = {"target": y, "losses": losses} if parts.has_last else {}
    if parts.has_first:
        parts.schedule.step(x, **kw)
    else:
        parts.schedule.step(**kw)
    if parts.tied_group is not None:
        sync_tied_grads(parts)
    return torch.stack([loss.detach() for loss in losses]).mean() if losses else None


def sync_tied_grads(parts: PipelineParts) -> None:
    """Sum the gradients of the embedding (first stage) and its head copy (last stage)."""
    from torch.distributed.tensor import DTensor

    for m in parts.modules:
        for name, p in m.named_parameters():
            if name.endswith(("tok_embeddings.weight", "output.weight")) and p.grad is not None:
                g = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
                dist.all_reduce(g, group=parts.tied_group)
