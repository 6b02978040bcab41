"""shardlab models | gpus | links: list the catalogs (and show one model's exact parameter count)."""

from __future__ import annotations

from shardlab.cli.common import add_output_args


def register(sub) -> None:
    p = sub.add_parser("models", help="list models, or show one model's exact parameter count by component",
                       description="List catalog models; with MODEL, show its exact parameters per component and per layer.")
    p.add_argument("model", nargs="?", help="catalog id, hf:ORG/NAME (from the Hugging Face Hub or its local cache; "
                   "HF_TOKEN for gated models, HF_HUB_OFFLINE=1 for the cache only), Hugging Face config.json or YAML model file")
    add_output_args(p)
    p.set_defaults(func=cmd_models)
    p = sub.add_parser("gpus", help="list accelerators (peak FLOP/s, memory, bandwidth, source)")
    add_output_args(p)
    p.set_defaults(func=cmd_gpus)
    p = sub.add_parser("links", help="list interconnects (bandwidth, latency, efficiency, source)")
    add_output_args(p)
    p.set_defaults(func=cmd_links)


def cmd_models(args):
    from dataclasses import asdict

    from shardlab.catalog import get_catalog
    from shardlab.render.table import table
    from shardlab.specs.tensors import param_counts
    from shardlab.units import fmt_count

    cat = get_catalog(args.catalog)
    if args.model:
        return _model_detail(cat.model(args.model))
    rows, docs = [], []
    for mid, m in cat.models.items():
        pc = param_counts(m)
        attn = "MLA" if m.mla else f"{m.num_heads}/{m.num_kv_heads}"
        moe = f"{m.moe.num_experts}e top-{m.moe.top_k}" if m.moe else "dense"
        rows.append([mid, m.family, fmt_count(pc.total), fmt_count(pc.active), m.num_layers, m.hidden_size, attn,
                     m.ffn_hidden_size, moe, m.vocab_size, m.max_seq_len])
        d = asdict(m)
        d.update(id=mid, params=pc.total, active_params=pc.active)
        docs.append(d)
    text = table(["id", "family", "params", "active", "layers", "hidden", "heads/kv", "ffn", "experts", "vocab", "max seq"], rows,
                 title=f"{len(rows)} models (exact counts; `shardlab models ID` shows components and sources)")
    return {"models": docs}, text


def _model_detail(m):
    from dataclasses import asdict

    from shardlab.render.table import kv_lines, table
    from shardlab.specs.tensors import model_tensors, param_counts
    from shardlab.units import fmt_count

    pc = param_counts(m)
    rows = [[k, f"{v:,}", f"{100 * v / pc.total:.2f}%"] for k, v in sorted(pc.by_component.items(), key=lambda kv: -kv[1])]
    rows.append(["total", f"{pc.total:,}", "100.00%"])
    lines = [f"{m.name}: {pc.total:,} parameters ({fmt_count(pc.total)})"]
    if m.moe:
        lines.append(f"active per token: {pc.active:,} ({fmt_count(pc.active)}): routed experts count {m.moe.top_k}/{m.moe.num_experts}")
    if m.params_reference:
        ok = "matches" if m.params_reference == pc.total else f"DIFFERS from ({m.params_reference:,})"
        lines.append(f"published checkpoint count {m.params_reference:,}: {ok}")
    lines.append("")
    lines.append(table(["component", "parameters", "share"], rows))
    lines.append("")
    first = [t for t in model_tensors(m) if t.layer in (0,)]
    lines.append(table(["tensor (layer 0)", "shape", "numel", "TP split"],
                       [[t.name, "×".join(map(str, t.shape)), f"{t.numel:,}",
                         _split_label(t) + (" + EP dim 0" if t.ep_dim is not None else "")] for t in first]))
    lines.append("")
    if m.mlp == "gelu" and m.position == "learned" and m.norm == "layernorm" and m.moe is None:
        L, h, V, s = m.num_layers, m.hidden_size, m.vocab_size, m.max_seq_len
        eq2 = 12 * L * h * h + 13 * L * h + (V + s) * h
        lines.append(f"check: Narayanan 2021 Eq. 2, 12Lh² + 13Lh + (V+s)h = {eq2:,}; plus the final LayerNorm 2h = {2 * h:,} "
                     f"-> {eq2 + 2 * h:,}")
    lines.append(kv_lines([("source", m.source)]))
    doc = {"model": asdict(m), "params": pc.total, "active_params": pc.active, "by_component": pc.by_component,
           "per_layer": pc.per_layer, "embedding": pc.embedding, "head": pc.head}
    return doc, "\n".join(lines)


def cmd_gpus(args):
    from dataclasses import asdict

    from shardlab.catalog import get_catalog
    from shardlab.render.table import table

    cat = get_catalog(args.catalog)
    f = lambda v: "-" if v is None else f"{v:g}"
    rows = [[a.id, a.name, f(a.peak_tflops["bf16"] or a.peak_tflops["fp16"]), f(a.peak_tflops["fp8"]), f(a.peak_tflops["fp32"]),
             f"{a.memory_gib:g}", f"{a.memory_bandwidth_gbps:g}", a.scale_up_link, f"{a.tdp_w:g}"] for a in cat.accelerators.values()]
    text = table(["id", "name", "bf16/fp16 TF/s", "fp8 TF/s", "fp32 TF/s", "mem GiB", "HBM GB/s", "scale-up", "W"], rows,
                 title="accelerators (dense peaks, TFLOP/s; bf16, or fp16 where the part has no bf16 (V100); sources: `--json`)")
    return {"gpus": [{**asdict(a), "memory_bytes": a.memory_bytes} for a in cat.accelerators.values()]}, text


def cmd_links(args):
    from dataclasses import asdict

    from shardlab.catalog import get_catalog
    from shardlab.render.table import table

    cat = get_catalog(args.catalog)
    rows = [[l.id, l.name, f"{l.bandwidth_gbps:g}", f"{l.efficiency:.2f}", f"{l.bandwidth_gbps * l.efficiency:.1f}",
             f"{l.latency_us:g}", l.scope] for l in cat.links.values()]
    text = table(["id", "name", "GB/s/dir", "eff", "busbw GB/s", "alpha µs", "scope"], rows,
                 title="links (per GPU, per direction; busbw = line rate × efficiency; sources: `--json`)")
    return {"links": [asdict(l) for l in cat.links.values()]}, text


def _split_label(t) -> str:
    """How TP splits a weight (out, in) or stacked experts (E, out, in): the output dim is column-parallel (the
    vocabulary for an embedding), the input dim row-parallel (Shoeybi et al. 2019, §3)."""
    if t.tp_dim is None:
        return "replicated"
    from shardlab.specs.tensors import is_matmul_weight

    if not is_matmul_weight(t) or t.tp_dim == len(t.shape) - 2:   # a bias split on TP goes with the output: column
        return f"dim {t.tp_dim} ({'vocab' if 'embed' in t.name or t.name.startswith('output') else 'column'})"
    return f"dim {t.tp_dim} (row)"
