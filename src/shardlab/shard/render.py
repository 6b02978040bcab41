"""Terminal text of ``shardlab shard``."""

from __future__ import annotations

from shardlab.render.table import table
from shardlab.units import fmt_bytes


def _shape(s) -> str:
    return "(" + ", ".join(f"{x:,}" for x in s) + ")"


def render_shard(doc: dict) -> str:
    """Weights table, per-block totals, collectives per block, the rules that cap T."""
    t = doc["tp"]
    lines = [f"shardlab shard: {doc['model']} with tensor parallelism T = {t}"
             + (" and sequence parallelism" if doc["sequence_parallel"] else "")
             + f" ({doc['elem_bytes']}-byte elements; shapes (out, in), experts stacked (E, out, in))", ""]
    rows = [[r["name"], r["split"], _shape(r["full_shape"]), _shape(r["local_shape"]), fmt_bytes(r["full_bytes"]),
             fmt_bytes(r["rank_bytes"])] for r in doc["rows"]]
    lines.append(table(["weight", "split", "full shape", "per rank", "full", "per rank"], rows, align="llrrrr"))
    for layer, b in doc["blocks"].items():
        lines.append(f"block {layer}{' (MoE)' if b['moe'] else ''}: {fmt_bytes(b['full_bytes'])} whole, "
                     f"{fmt_bytes(b['rank_bytes'])} per rank ({b['full_bytes'] / max(b['rank_bytes'], 1):.2f}× smaller)")
    coll = doc["collectives_per_block"]
    lines.append("")
    if coll:
        crow = [[c["phase"], c["op"], fmt_bytes(c["bytes"]), c["where"]] for c in coll]
        lines.append(table(["phase", "collective", "bytes", "where"], crow, align="llrl",
                           title=f"collectives per block per micro-batch (b = {doc['micro_batch']}, s = {doc['seq_len']}: "
                                 f"each moves b·s·h elements; Megatron, Shoeybi et al. 2019 §3"
                                 + ("; SP: Korthikanti et al. 2022 §4.2.2)" if doc["sequence_parallel"] else ")")))
    else:
        lines.append("T = 1: no tensor-parallel communication")
    lines.append("")
    crow = [[c["what"], f"{c['value']:,}", c["rule"], "ok" if c["ok"] else ("PADDED" if not c["hard"] else "BROKEN"), c["note"]]
            for c in doc["constraints"]]
    lines.append(table(["rule", "model", "condition", f"T = {t}", "note"], crow, align="lrlll",
                       title="divisibility rules that cap T"))
    lines.append(f"valid T for this model: {', '.join(map(str, doc['valid_tp']))} (largest {doc['max_tp']}); "
                 "keep T ≤ GPUs per node so the all-reduces stay on NVLink")
    return "\n".join(lines)
