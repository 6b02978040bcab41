"""Mermaid diagram of one tensor-parallel block: per-rank weight shapes and the f/g operators between them."""

from __future__ import annotations

from shardlab.shard.rules import representative_layers, split_kind
from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import TensorSpec, is_matmul_weight, model_tensors


def block_mermaid(spec: ModelSpec, tp: int, *, seq_len: int, micro_batch: int = 1, sequence_parallel: bool = False,
                  elem_bytes: int = 2, ep: int = 1, etp: int = 0) -> str:
    """A Mermaid flowchart of one sharded block (the MoE block for MoE models): per-rank weight shapes and
    the f/g communication operators between them; with expert parallelism ``ep`` each rank holds E/ep experts, split
    over ``etp`` ranks (``Layout.etp``; 0: tp)."""
    from shardlab.render.mermaid import edge, flowchart, node
    from shardlab.units import fmt_bytes

    layer = representative_layers(spec)[-1]
    h, b, s = spec.hidden_size, micro_batch, seq_len
    act = fmt_bytes(b * s * h * elem_bytes)
    sp = sequence_parallel and tp > 1
    seq = f"s/{tp}" if sp else "s"
    if tp == 1:
        f_lbl, g_lbl = "no communication (T = 1)", "no communication (T = 1)"
    elif sp:
        f_lbl = f"all-gather along the sequence: (b, s/{tp}, h) → (b, s, h), {act}; reduce-scatter in backward"
        g_lbl = f"reduce-scatter along the sequence: (b, s, h) → (b, s/{tp}, h), {act}; all-gather in backward"
    else:
        f_lbl = f"f: identity forward, all-reduce of the input gradient in backward ({act})"
        g_lbl = f"g: all-reduce forward ({act} = b·s·h·{elem_bytes} B), identity backward"
    lines = [node("x", f"x: (b, {seq}, h) = ({b}, {s // tp if sp else s}, {h}) on every rank", "stadium")]
    tensors = [t for t in model_tensors(spec) if t.layer == layer and is_matmul_weight(t)]

    e_tp = etp or tp

    def shape_label(t: TensorSpec) -> str:
        loc = t.local_shape(spec, tp, 1, None, etp)
        kind = split_kind(t, spec, tp)
        if t.ep_dim is not None and e_tp != tp:        # the experts' own TP (Layout.etp)
            kind = "whole (expert TP 1)" if e_tp == 1 else f"{kind} over {e_tp} of the {tp} TP ranks"
        short = t.name.split(f"layers.{layer}.", 1)[1]
        experts = (f", {loc[0] // ep} of {loc[0]} experts (EP {ep})" if ep > 1 else f", {loc[0]} experts")
        dims = f"{loc[-1]} → {loc[-2]}" + (experts if len(loc) == 3 else "")
        return f"{short}: {kind}\n{dims} per rank"

    def section(tag: str, norm: str, comps: tuple[str, ...], core: str, src: str, f_lbl=f_lbl, g_lbl=g_lbl) -> str:
        nid = f"{tag}_norm"
        lines.extend([node(nid, f"{norm} on (b, {seq}, h), replicated"), edge(src, nid),
                      node(f"{tag}_f", f_lbl, "hex"), edge(nid, f"{tag}_f")])
        group = [t for t in tensors if t.component in comps]
        cols = [t for t in group if not split_kind(t, spec, tp).startswith("row")]
        rows_ = [t for t in group if split_kind(t, spec, tp).startswith("row")]
        where = f"on each of {tp} TP ranks" if tp > 1 else "on every GPU, whole (no TP)"
        # The box's caption is its first node, not the subgraph title: arrows entering a subgraph cross its
        # title, and the f operator (a collective between ranks) stays outside the per-rank box.
        lines.append(f'subgraph {tag}_rank[" "]')
        lines.append(node(f"{tag}_in", f"{where}: input (b, s, h)", "stadium"))
        lines.append(node(f"{tag}_core", core, "round"))
        prev = None
        for i, t in enumerate(cols):
            tid = f"{tag}_c{i}"
            lines.append(node(tid, shape_label(t)))
            start = f"{tag}_in" if t.shape[-1] == h or prev is None or t.component == "router" else prev
            lines.append(edge(start, tid))
            lines.append(edge(tid, f"{tag}_core", "routing" if t.component == "router" else None))
            prev = tid
        for i, t in enumerate(rows_):
            lines.extend([node(f"{tag}_r{i}", shape_label(t)), edge(f"{tag}_core", f"{tag}_r{i}")])
        lines.append("end")
        lines.append(edge(f"{tag}_f", f"{tag}_in"))
        lines.append(node(f"{tag}_g", g_lbl, "hex"))
        lines.extend(edge(f"{tag}_r{i}", f"{tag}_g") for i in range(len(rows_)))
        lines.extend([node(f"{tag}_add", "+ residual", "circle"), edge(f"{tag}_g", f"{tag}_add"),
                      edge(src, f"{tag}_add", dotted=True)])
        return f"{tag}_add"

    a_loc = spec.num_heads // tp
    src = section("attn", "attention_norm", ("attention",), f"attention over {a_loc} of {spec.num_heads} heads", "x")
    if spec.is_moe_layer(layer):
        m = spec.moe
        core = (f"route each token to {m.top_k} of {m.num_experts} experts"
                + (f" (all-to-all to the EP rank holding it: {m.num_experts // ep} "
                   f"expert{'s' if m.num_experts // ep != 1 else ''} on each of {ep})"
                   if ep > 1 else "") + f"; {'SiLU(gate)·up' if spec.mlp == 'swiglu' else 'GELU'}")
        labels = {}
        if e_tp < tp and sp:     # whole or narrower experts: each rank dispatches its own sequence shard's copies
            labels = {"f_lbl": (f"no gather of the sequence: each rank routes its own (b, s/{tp}, h)"
                                + (f"; the copies gathered over {e_tp} expert-TP ranks" if e_tp > 1 else "")),
                      "g_lbl": "the combine returns each rank's own tokens: no reduce-scatter"
                               + (f" beyond the {e_tp} expert-TP ranks'" if e_tp > 1 else "")}
        src = section("mlp", "ffn_norm", ("router", "experts", "shared_experts"), core, src, **labels)
    else:
        core = f"{'SiLU(gate) · up' if spec.mlp == 'swiglu' else 'GELU'} on (b, s, {spec.ffn_hidden_size // tp}) per rank"
        src = section("mlp", "ffn_norm", ("mlp",), core, src)
    lines.extend([node("out", f"block output: (b, {seq}, h)", "stadium"), edge(src, "out")])
    title = (f"{spec.name} block {layer} with TP = {tp}{' + sequence parallel' if sp else ''}: per-rank weight shapes "
             f"(in → out), {elem_bytes}-byte elements, b = {b}, s = {s}")
    return flowchart(lines, "TD", title, {"comm": "fill:#fde2c8,stroke:#d9822b"}) + "".join(
        f"    class {t}_f,{t}_g comm\n" for t in ("attn", "mlp"))
