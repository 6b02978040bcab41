"""Tensor-parallel sharding of one transformer block: per-rank shapes and bytes, collectives, limits on T.

Split rules come from the tensor inventory (``specs.tensors``, Megatron-LM: Shoeybi et al. 2019, arXiv
1909.08053 §3): Q, K, V and the MLP gate/up are column-parallel (output features split), the attention
output and MLP down projections row-parallel (input features split), embedding and output head
vocabulary-parallel. A column-parallel layer followed by a row-parallel one needs no communication in
between, so a block costs one all-reduce after attention and one after the MLP in forward (operator g) and
two in backward (operator f, before QKV and before the MLP). With sequence parallelism (Korthikanti et al.
2022 §4.2.2) each all-reduce becomes a reduce-scatter + all-gather pair of the same total volume.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab.errors import ShardlabError, field_name
from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import PRE, TensorSpec, is_matmul_weight, model_tensors


@dataclass(frozen=True)
class ShardRow:
    """One weight of the block, whole and per rank."""

    name: str
    """Tensor name (layer index of the representative block)."""
    component: str
    """attention, mlp, experts, norm, embedding, head, ..."""
    split: str
    """column, row, vocabulary, replicated, or 'column, KV heads replicated'."""
    full_shape: tuple[int, ...]
    """Unsharded shape, nn.Linear convention (out, in); experts stacked (E, out, in)."""
    local_shape: tuple[int, ...]
    """Shape on one TP rank (``TensorSpec.local_shape``)."""
    full_bytes: int
    """Bytes of the whole tensor."""
    rank_bytes: int
    """Bytes on one TP rank."""


@dataclass(frozen=True)
class Constraint:
    """A divisibility rule that caps T."""

    what: str
    """heads, KV heads, FFN width, expert FFN width, vocabulary."""
    value: int
    """The model's number."""
    rule: str
    """The condition, e.g. 'T divides 32'."""
    ok: bool
    """Holds for the requested T."""
    hard: bool
    """False when a violation is handled by padding (vocabulary)."""
    note: str = ""
    """What happens (padding, replication)."""


def split_kind(t: TensorSpec, spec: ModelSpec, tp: int) -> str:
    """How TP splits ``t``: by the split dimension relative to the (out, in) axes."""
    if t.tp_dim is None:
        return "replicated"
    if t.component in ("embedding", "head"):
        return "vocabulary"
    nd = len(t.shape)
    # a matmul split on its input features is row-parallel; a bias (the experts' (E, f) ones too) goes with the output
    kind = "row" if is_matmul_weight(t) and t.tp_dim == nd - 1 else "column"
    if t.kv and spec.mla is None and tp > spec.num_kv_heads:
        kind += ", KV heads replicated"
    return kind


def constraints(spec: ModelSpec, tp: int) -> list[Constraint]:
    """The rules T must satisfy for ``spec`` (hard ones make a layout invalid, like ``layout_checks.validate``)."""
    out = [Constraint("attention heads", spec.num_heads, f"T divides {spec.num_heads}", spec.num_heads % tp == 0, True,
                      "each rank computes whole heads")]
    if spec.mla is None:
        kv = spec.num_kv_heads
        ok = kv % tp == 0 or tp % kv == 0
        note = (f"{kv // tp} KV head(s) per rank" if kv % tp == 0 else
                f"T > KV heads: each KV head is replicated on {tp // kv} ranks" if ok else "neither divides the other")
        out.append(Constraint("KV heads", kv, f"T divides {kv}, or {kv} divides T", ok, True, note))
    else:
        out.append(Constraint("KV heads", spec.num_heads, "MLA: the compressed latent is replicated", True, True,
                              "no KV-head rule (DeepSeek-V2 §2.1.2)"))
    if spec.moe is None or spec.moe.first_dense_layers:
        f = spec.ffn_hidden_size
        out.append(Constraint("FFN width", f, f"T divides {f}", f % tp == 0, True, "column/row split of the MLP"))
    if spec.moe is not None:
        f = spec.moe.expert_ffn_hidden_size
        out.append(Constraint("expert FFN width", f, f"T divides {f}", f % tp == 0, True, "each expert split like an "
                                                                                          "MLP"))
    V = spec.vocab_size
    padded = -(-V // tp) * tp
    out.append(Constraint("vocabulary", V, f"T divides {V} (else padded)", V % tp == 0, False,
                          "even split" if V % tp == 0 else f"uneven: padded to {padded} rows ({padded - V} padding "
                                                           "rows, "
                          f"{-(-V // tp)} per rank)"))
    return out


def valid_tp(spec: ModelSpec, limit: int | None = None) -> list[int]:
    """Every T from 1 to the head count (or ``limit``) that satisfies the hard constraints."""
    from shardlab.layout_checks import divisors

    top = limit or spec.num_heads
    return [t for t in divisors(spec.num_heads) if t <= top and all(c.ok for c in constraints(spec, t) if c.hard)]


def representative_layers(spec: ModelSpec) -> list[int]:
    """One dense block and, for MoE models, one MoE block."""
    if spec.moe is None:
        return [0]
    first = spec.moe.first_dense_layers
    return ([0] if first else []) + [first]


def shard_rows(spec: ModelSpec, tp: int, elem_bytes: int = 2) -> list[ShardRow]:
    """Embedding, the representative block(s) and the head, whole and per rank."""
    keep = set(representative_layers(spec)) | {PRE, spec.num_layers}
    rows = []
    for t in model_tensors(spec):
        if t.layer not in keep:
            continue
        loc = t.local_shape(spec, tp)
        rows.append(ShardRow(t.name, t.component, split_kind(t, spec, tp), t.shape, loc, t.numel * elem_bytes,
                             t.local_numel(spec, tp) * elem_bytes))
    return rows


def block_collectives(spec: ModelSpec, tp: int, *, seq_len: int, micro_batch: int, sequence_parallel: bool,
                      elem_bytes: int = 2) -> list[dict]:
    """Collectives of one block per micro-batch: (phase, op, where, bytes). Each moves b·s·h elements."""
    if tp == 1:
        return []
    size = micro_batch * seq_len * spec.hidden_size * elem_bytes
    if not sequence_parallel:
        return [{"phase": "forward", "op": "all-reduce", "where": "g after the attention output projection "
                                                                  "(row-parallel)", "bytes": size},
                {"phase": "forward", "op": "all-reduce", "where": "g after the MLP down projection (row-parallel)", "bytes": size},
                {"phase": "backward", "op": "all-reduce", "where": "f before Q/K/V (input gradient of "
                                                                   "column-parallel)", "bytes": size},
                {"phase": "backward", "op": "all-reduce", "where": "f before the MLP gate/up (input gradient)", "bytes": size}]
    out = []
    for where in ("attention", "MLP"):
        out.append({"phase": "forward", "op": "all-gather", "where": f"gather the sequence before the {where} (g̅)", "bytes": size})
        out.append({"phase": "forward", "op": "reduce-scatter", "where": f"scatter the {where} output along the "
                                                                         "sequence (ḡ)", "bytes": size})
    for where in ("attention", "MLP"):
        out.append({"phase": "backward", "op": "reduce-scatter", "where": "gradient of the all-gather before the "
                                                                          f"{where}", "bytes": size})
        out.append({"phase": "backward", "op": "all-gather", "where": "gradient of the reduce-scatter after the "
                                                                      f"{where}", "bytes": size})
    return out


def check_tp(spec: ModelSpec, tp: int) -> None:
    """Raise ShardlabError naming the broken rule and the valid T values."""
    if not isinstance(tp, int) or tp < 1:
        raise ShardlabError(f"{field_name('layout.tp')} must be a positive whole number, got {tp}")
    bad = [c for c in constraints(spec, tp) if c.hard and not c.ok]
    if bad:
        ok = valid_tp(spec)
        raise ShardlabError(f"{field_name('layout.tp')} {tp} breaks {spec.name}'s {bad[0].what} rule ({bad[0].rule}); "
                            f"valid T: {', '.join(map(str, ok))}")


def shard_report(spec: ModelSpec, tp: int, *, seq_len: int, micro_batch: int = 1, sequence_parallel: bool = False,
                 elem_bytes: int = 2) -> dict:
    """Everything ``shardlab shard`` prints: rows, per-block totals, collectives, constraints, valid T."""
    check_tp(spec, tp)
    rows = shard_rows(spec, tp, elem_bytes)
    blocks = {}
    for layer in representative_layers(spec):
        names = [r for r in rows if r.name.startswith(f"layers.{layer}.")]
        blocks[str(layer)] = {"full_bytes": sum(r.full_bytes for r in names), "rank_bytes": sum(r.rank_bytes for r in names),
                              "moe": spec.is_moe_layer(layer)}
    ok = valid_tp(spec)
    return {"model": spec.name, "tp": tp, "elem_bytes": elem_bytes, "seq_len": seq_len, "micro_batch": micro_batch,
            "sequence_parallel": sequence_parallel,
            "rows": [r.__dict__ | {"full_shape": list(r.full_shape), "local_shape": list(r.local_shape)} for r in rows],
            "blocks": blocks,
            "collectives_per_block": block_collectives(spec, tp, seq_len=seq_len, micro_batch=micro_batch,
                                                       sequence_parallel=sequence_parallel, elem_bytes=elem_bytes),
            "constraints": [c.__dict__ for c in constraints(spec, tp)],
            "valid_tp": ok, "max_tp": max(ok)}
