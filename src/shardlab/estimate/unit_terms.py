"""Per-unit terms of the training step model (``estimate.step``), over candidate layouts as arrays: which blocks each
pipeline rank holds, the parameters of an FSDP unit (whole and as a rank's shard), the FP8 block-scaling state, the
frozen base and adapters under LoRA/QLoRA, the dequantized bytes of a QLoRA block, and the tensors per unit (the
optimizer's per-tensor work)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from shardlab.memory.fp8 import is_fp8_gemm
from shardlab.memory.lora import is_block_linear
from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import PRE, TensorSpec, model_tensors


def stage_compositions(spec: ModelSpec, pp: int, vpp: int, stage_layers: tuple[int, ...] | None = None) -> list[list[int]]:
    """Block indices held by each pipeline rank: the memory model's split (``memory.states.chunk_layers``)."""
    from shardlab.layout import Layout
    from shardlab.memory.states import chunk_layers

    stages: list[list[int]] = [[] for _ in range(pp)]
    for c, rng in enumerate(chunk_layers(spec, Layout(pp=pp, vpp=vpp, stage_layers=stage_layers))):
        stages[c % pp].extend(rng)
    return stages


def unit_params(spec: ModelSpec, tp, ep, etp=None) -> dict:
    """Parameters per rank after TP/EP of one block of each kind, the embedding (PRE) and the head
    (key num_layers): {key: (dense, expert)} as arrays over candidates (``etp``: the experts' TP degree, ``Layout.etp``)."""
    reps = {}
    for i in range(spec.num_layers):
        reps.setdefault(spec.is_moe_layer(i), i)
    wanted = {PRE: PRE, spec.num_layers: spec.num_layers, **{rep: kind for kind, rep in reps.items()}}
    out = {key: (0, 0) for key in wanted.values()}
    for t in model_tensors(spec):
        if t.layer not in wanted:
            continue
        n = np.prod(np.broadcast_arrays(*t.local_shape(spec, tp, ep, None, etp)), axis=0) \
            if (t.tp_dim is not None or t.ep_dim is not None) else t.numel
        d, e = out[wanted[t.layer]]
        out[wanted[t.layer]] = (d + (0 if t.ep_dim is not None else n), e + (n if t.ep_dim is not None else 0))
    return out


def fsdp_shard_params(spec: ModelSpec, tp, ep, shard, expert_shard, etp=None) -> dict:
    """Parameters one rank stores under ZeRO-3/FSDP2, per block of each kind, the embedding (PRE), the head (key
    num_layers) and the tied copy of the word embedding a last pipeline stage holds ('tied'): every tensor's padded
    dim-0 shard, ceil(d/n) rows (``memory.states.fsdp_shard_numel``; stacked experts shard on dim 1 when the expert
    group outnumbers the local experts, ``expert_shard_dim``), arrays over candidates, so the search's memory is the
    exact per-tensor report's."""
    reps = {}
    for i in range(spec.num_layers):
        reps.setdefault(spec.is_moe_layer(i), i)
    wanted = {PRE: PRE, spec.num_layers: spec.num_layers, **{rep: kind for kind, rep in reps.items()}}
    tensors = [t for t in model_tensors(spec) if t.layer in wanted]
    tied = TensorSpec("output.weight", (spec.vocab_size, spec.embedding_dim), spec.num_layers, "head", tp_dim=0)
    out = {key: 0 for key in list(wanted.values()) + ["tied"]}
    shard, expert_shard = np.asarray(shard), np.asarray(expert_shard)
    for t, key in [(t, wanted[t.layer]) for t in tensors] + ([(tied, "tied")] if spec.tied_embeddings else []):
        shape = [np.asarray(d) for d in t.local_shape(spec, tp, ep, None, etp)]
        if not shape:
            out[key] = out[key] + 1
            continue
        numel = np.prod(np.broadcast_arrays(*shape), axis=0)
        if t.ep_dim is not None:
            n = expert_shard
            dim1 = (shape[0] < n) & (len(shape) > 1)          # expert_shard_dim: dim 1 when experts are fewer
            d = np.where(dim1, shape[1] if len(shape) > 1 else 1, shape[0])
        else:
            n, d = shard, shape[0]
        rows = -(-d // np.maximum(n, 1))
        out[key] = out[key] + np.where(n > 1, rows * (numel // np.maximum(d, 1)), numel)
    return out


def fp8_block_terms(spec: ModelSpec, tp, ep, etp=None) -> dict:
    """Per block kind (dense False, MoE True): the local elements of its FP8 GEMM weights and its FP8 GEMMs (E/ep per
    stacked expert tensor), arrays over candidates (``memory.fp8.is_fp8_gemm``, ``fp8_gemms``)."""
    out = {}
    for i in range(spec.num_layers):
        kind = spec.is_moe_layer(i)
        if kind in out:
            continue
        numel, gemms = 0, 0
        for t in model_tensors(spec):
            if t.layer != i or not is_fp8_gemm(t, spec):
                continue
            numel = numel + np.prod(np.broadcast_arrays(*t.local_shape(spec, tp, ep, None, etp)), axis=0)
            gemms = gemms + (-(-t.shape[0] // np.asarray(ep)) if t.ep_dim is not None else 1)
        out[kind] = (numel, gemms)
    return out


def _padded(shape, n, dim=0):
    """``memory.states.fsdp_shard_numel`` (rank None) over arrays: ceil(d/n) slices of dimension ``dim``."""
    numel = np.prod(np.broadcast_arrays(*shape), axis=0)
    d = shape[dim]
    return np.where(n > 1, -(-d // np.maximum(n, 1)) * (numel // np.maximum(d, 1)), numel)


def lora_units(spec: ModelSpec, lora, tp, ep, shard, expert_shard, etp=None) -> dict:
    """``memory.lora.lora_state_report`` per block kind, the embedding (PRE), the head and the tied copy, arrays over
    candidates: {key: (frozen base bytes without ZeRO-3, with ZeRO-3, adapter elements local, adapter padded shard)}.
    The base is NF4 for the block linears under QLoRA (``nf4_bytes`` of the stored elements), bf16 otherwise."""
    from shardlab.memory.lora import adapter_tensors

    reps = {}
    for i in range(spec.num_layers):
        reps.setdefault(spec.is_moe_layer(i), i)
    wanted = {PRE: PRE, spec.num_layers: spec.num_layers, **{rep: kind for kind, rep in reps.items()}}
    tied = TensorSpec("output.weight", (spec.vocab_size, spec.embedding_dim), spec.num_layers, "head", tp_dim=0)
    shard, expert_shard = np.asarray(shard), np.asarray(expert_shard)

    def base(t, stored):          # memory.lora.base_weight_bytes / nf4_bytes over arrays
        if lora.quantize_base == "nf4" and is_block_linear(t, spec):
            blocks = -(-stored // lora.block_size)
            codes = -(-stored // 2)
            q = codes + 4 * blocks if not lora.double_quant else codes + blocks + 4 * -(-blocks // lora.block_size2) + 4
            return np.where(stored > 0, q, 0)
        return 2 * stored
    out = {}
    groups = [(key, [t for t in model_tensors(spec) if t.layer == layer]) for layer, key in wanted.items()]
    if spec.tied_embeddings:
        groups.append(("tied", [tied]))
    for key, tensors in groups:
        b0 = b3 = a_loc = a_pad = 0
        for t in tensors:
            shape = [np.asarray(d) for d in t.local_shape(spec, tp, ep, None, etp)]
            local = np.prod(np.broadcast_arrays(*shape), axis=0)
            if t.ep_dim is not None:
                dim = np.where((shape[0] < expert_shard) & (len(shape) > 1), 1, 0)
                pad = np.where(dim == 1, _padded(shape, expert_shard, 1) if len(shape) > 1 else local,
                               _padded(shape, expert_shard, 0))
            else:
                pad = _padded(shape, shard, 0)
            b0, b3 = b0 + base(t, local), b3 + base(t, pad)
        for a in adapter_tensors(spec, lora, tuple(tensors)):
            shape = [np.asarray(d) for d in a.local_shape(spec, tp, ep, None, etp)]
            a_loc = a_loc + np.prod(np.broadcast_arrays(*shape), axis=0)
            a_pad = a_pad + _padded(shape, shard, 0)
        out[key] = (b0, b3, a_loc, a_pad)
    return out


def dequant_bytes(spec: ModelSpec, layer: int, tp, ep, lora, etp=None):
    """``memory.lora.dequant_buffer_bytes`` of one block (array-safe in tp, ep): the bf16 copy of its largest NF4
    matrix (one expert's, for a stack)."""
    if lora.quantize_base != "nf4":
        return 0.0
    sizes = [np.prod(np.broadcast_arrays(*t.local_shape(spec, tp, ep, None, etp)[-2:]), axis=0)
             for t in model_tensors(spec) if t.layer == layer and is_block_linear(t, spec)]
    return 2 * np.maximum.reduce(np.broadcast_arrays(*sizes)) if sizes else 0.0   # scalars beside arrays over tp


@lru_cache(maxsize=256)
def tensors_per_unit(spec: ModelSpec) -> dict:
    """Parameter tensors of a dense block (False), a MoE block (True), the embedding (PRE) and the head."""
    out = {False: 0, True: 0, PRE: 0, spec.num_layers: 0}
    first_of = {}
    for i in range(spec.num_layers):
        first_of.setdefault(spec.is_moe_layer(i), i)
    for t in model_tensors(spec):
        if t.layer in (PRE, spec.num_layers):
            out[t.layer] += 1
        elif first_of.get(spec.is_moe_layer(t.layer)) == t.layer:
            out[spec.is_moe_layer(t.layer)] += 1
    return out
