"""Tensor parallelism with PyTorch DTensor: ``parallelize_module`` with a Megatron-LM plan.

Megatron-LM (Shoeybi et al. 2019, arXiv 1909.08053 §3): q, k, v and the MLP gate/up are column-parallel
(output features split: each rank owns a/tp heads and f/tp of the MLP width), the attention output and
MLP down are row-parallel (input features split; partial sums all-reduced), so one block needs one
all-reduce after attention and one after the MLP in forward. The token embedding and output head are
vocabulary-parallel (split by vocabulary rows), as in the inventory's ``tp_dim``.

Sequence parallelism (Korthikanti et al. 2022, arXiv 2205.05198 §4.2.2): norms run on s/tp tokens
(``SequenceParallel``); attention and MLP inputs are all-gathered along the sequence, and the row-parallel
outputs are reduce-scattered back to s/tp tokens (all-reduce = reduce-scatter + all-gather).

KV heads: split when tp divides them; when tp > kv_heads each KV head is duplicated tp/kv times before the
split so that every rank holds one head (Megatron GQA; vLLM does the same). That case is forward-exact
(inference, shape checks); its duplicated weights' gradients are not summed, so training refuses it.
"""

from __future__ import annotations

import torch.nn as nn

from shardlab.errors import ShardlabError


def _block_plan(block: nn.Module, sp: bool) -> dict:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel)

    out = Shard(1) if sp else Replicate()  # row-parallel output: reduce-scatter to (b, s/tp, h) or all-reduce to (b, s, h)
    plan = {
        "attention.wq": ColwiseParallel(),   # (b, s, h) -> (b, s, a·hd/tp)
        "attention.wk": ColwiseParallel(),   # (b, s, h) -> (b, s, kv·hd/tp)
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=out),  # (b, s, a·hd/tp) -> (b, s, h) partial sums, reduced
    }
    ff = "moe.shared" if hasattr(block, "moe") else "mlp"
    if hasattr(block, "mlp") or hasattr(getattr(block, "moe", None), "shared"):
        plan[f"{ff}.w1"] = ColwiseParallel()  # (b, s, h) -> (b, s, f/tp)
        if hasattr(block.get_submodule(ff), "w3"):
            plan[f"{ff}.w3"] = ColwiseParallel()
        plan[f"{ff}.w2"] = RowwiseParallel(output_layouts=out)  # (b, s, f/tp) -> (b, s, h)
    if sp:
        gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        plan.update({"attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(), "attention": gather})
        if hasattr(block, "mlp"):
            plan["mlp"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return plan


def _duplicate_kv_heads(block: nn.Module, tp: int, kv_heads: int, head_dim: int) -> None:
    """Repeat each KV head tp/kv times (rows of wk/wv and their biases) so a column split gives one head per rank."""
    rep = tp // kv_heads
    for name in ("wk", "wv"):
        lin = getattr(block.attention, name)
        for pname in ("weight", "bias"):
            p = getattr(lin, pname, None)
            if p is None:
                continue
            rows = p.view(kv_heads, head_dim, *p.shape[1:]).repeat_interleave(rep, 0).reshape(tp * head_dim, *p.shape[1:])
            setattr(lin, pname, nn.Parameter(rows.detach().clone() if rows.device.type != "meta" else rows,
                                             requires_grad=p.requires_grad))


def _shard_embedding_grad(p) -> None:
    """DTensor's embedding backward leaves a Replicate (full-vocabulary) gradient on every rank; keep only this
    rank's rows (a local slice, no communication), as Megatron's vocabulary-parallel embedding does."""
    from torch.distributed.tensor import DTensor

    if isinstance(p.grad, DTensor) and p.grad.placements != p.placements:
        p.grad = p.grad.redistribute(placements=p.placements)


def apply_tp(model: nn.Module, tp_mesh, sequence_parallel: bool = False) -> nn.Module:
    """Tensor-parallelise ``model`` in place over the 1-D ``tp_mesh``; returns it. Works on the meta device."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

    spec = model.spec
    tp = tp_mesh.size()
    if spec.num_heads % tp or (spec.num_kv_heads % tp and tp % spec.num_kv_heads):
        raise ShardlabError(f"--tp {tp} must divide {spec.name}'s {spec.num_heads} heads, and divide or be a multiple of "
                            f"its {spec.num_kv_heads} KV heads")
    sp = sequence_parallel
    if sp and (spec.tied_embeddings or spec.position == "learned"):
        raise ShardlabError("sequence parallel is implemented for RoPE models with an untied head (e.g. --model tiny); "
                            "use plain tp for GPT-2-style models")
    top: dict = {}
    if getattr(model, "tok_embeddings", None) is not None:
        # vocabulary-parallel embedding: rows split, partial lookups summed (or reduce-scattered under SP)
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1) if sp else Replicate())
    if getattr(model, "norm", None) is not None:
        if sp:
            top["norm"] = SequenceParallel()
        if getattr(model, "output", None) is not None:
            # vocabulary-parallel head, logits gathered for the loss: (b, s, h) -> (b, s, V/tp) -> (b, s, V)
            top["output"] = ColwiseParallel(input_layouts=Shard(1) if sp else Replicate(), output_layouts=Replicate())
    if top:
        parallelize_module(model, tp_mesh, top)
    emb = getattr(model, "tok_embeddings", None)
    if emb is not None and emb.weight.device.type != "meta":
        emb.weight.register_post_accumulate_grad_hook(_shard_embedding_grad)
    for block in model.layers.values():
        if tp > spec.num_kv_heads:
            _duplicate_kv_heads(block, tp, spec.num_kv_heads, spec.head_dim_)
        parallelize_module(block, tp_mesh, _block_plan(block, sp))
        moe = getattr(block, "moe", None)
        if moe is not None:  # stacked experts: intermediate width split (w1/w3 dim 1, w2 dim 2), router replicated;
            moe.tp_group = tp_mesh.get_group()  # the layer sums the partial expert outputs over it (gpt.MoE.forward)
            for pname, dim in (("w1", 1), ("w3", 1), ("w2", 2)):
                p = getattr(moe.experts, pname, None)
                if p is not None:
                    setattr(moe.experts, pname, nn.Parameter(distribute_tensor(p, tp_mesh, [Shard(dim)]),
                                                             requires_grad=p.requires_grad))
    return model


def local_param_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Shape each parameter has on this rank (DTensor local shard, or the plain tensor)."""
    from torch.distributed.tensor import DTensor

    return {n: tuple((p.to_local() if isinstance(p, DTensor) else p).shape) for n, p in model.named_parameters()}

