"""Sections about one training layout, shared by the plan and the estimate pages: the rank map, per-stage
memory, the step-time waterfall, the pipeline timeline and the TP block diagram. Each takes the ``detail``
block (``planner.detail.layout_detail``) or the breakdown of the document."""

from __future__ import annotations

from shardlab.report.html import svg
from shardlab.report.html.page import Page, esc, gib, table
from shardlab.units import fmt_bytes, fmt_time

MEMORY_CATS = (("weights", "#4e79a7"), ("gradients", "#a0cbe8"), ("optimizer", "#59a14f"),
               ("activations", "#f28e2b"), ("other", "#bab0ac"))
STEP_COLORS = {"compute_s": "#4e79a7", "recompute_s": "#a0cbe8", "pp_bubble_s": "#bab0ac", "optimizer_s": "#59a14f",
               "tp_comm_s": "#f28e2b", "cp_comm_s": "#76b7b2", "ep_comm_s": "#e15759", "pp_p2p_s": "#9c755f",
               "zero3_comm_s": "#b07aa1", "dp_comm_s": "#edc948", "host_overhead_s": "#8cd17d", "offload_s": "#ff9da7"}
"""One colour per part of the step, the same in every chart of every page."""
STEP_LABELS = {"compute_s": "compute", "recompute_s": "recomputation", "tp_comm_s": "TP/SP communication",
               "cp_comm_s": "CP communication", "ep_comm_s": "expert dispatch", "pp_p2p_s": "pipeline sends",
               "zero3_comm_s": "ZeRO-3 gathers", "pp_bubble_s": "pipeline bubble", "dp_comm_s": "DP communication",
               "optimizer_s": "optimizer step"}
COMM_COLORS = ("#d37295", "#fabfd2", "#499894", "#86bcb6", "#d4a6c8", "#f1ce63")
"""For parts no page knows yet (after STEP_COLORS)."""
PASS_COLORS = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868"}
"""Same colours as the PNG timeline (render.plots.PASS_COLORS)."""
GROUP_AXES = (("tp", "TP group", ("TP", "SP")), ("cp", "CP group", ("CP",)), ("dp", "DP group", ("DP", "ZeRO", "FSDP")),
              ("pp", "pipeline peers", ("PP",)), ("ep", "EP group", ("EP",)))


def gib_short(b: float) -> str:
    """'79 GiB' / '7.5 GiB' for chart labels."""
    return f"{b / 2**30:.0f} GiB" if b >= 10 * 2**30 else f"{b / 2**30:.3g} GiB"


def step_time(v: float) -> str:
    """A part of the step: '0' when it is zero, else ``fmt_time``."""
    return "0" if v == 0 else fmt_time(v)


def step_label(key: str) -> str:
    """A breakdown key's name; keys the page does not know yet show as their own words."""
    return STEP_LABELS.get(key, key.removesuffix("_s").replace("_", " "))


def waterfall_section(page: Page, breakdown: dict, step_time_s: float, note: str = "", comm_table: bool = True) -> None:
    """Every non-zero part of the step (whatever keys the breakdown has), adding up to the step time."""
    parts, k_comm = [], 0
    for key, v in breakdown.items():
        if not isinstance(v, (int, float)) or v <= 1e-9:
            continue
        color = STEP_COLORS.get(key)
        if color is None:
            color, k_comm = COMM_COLORS[k_comm % len(COMM_COLORS)], k_comm + 1   # a part no page knows yet
        parts.append((step_label(key), float(v), color))
    chart = svg.waterfall(parts, ("step time", step_time_s), fmt_time)
    rows = [[label, fmt_time(v), f"{100 * v / step_time_s:.1f}%"] for label, v, _ in parts]
    page.add("step", "Step time: where it goes", chart + table(["part", "time per step", "share"], rows)
             + (f"<p class='note'>{esc(note or 'Exposed communication only: overlapped traffic is in the communication table.')}</p>"
                if note or comm_table else ""))


def memory_section(page: Page, mem: dict, title_note: str = "") -> None:
    """Stacked bars per pipeline stage (weights, gradients, optimizer, activations, other) against capacity."""
    stages = mem["stages"]
    rows = [(f"stage {s['stage']}" if len(stages) > 1 else "every rank", [s[c] for c, _ in MEMORY_CATS]) for s in stages]
    chart = svg.stacked_bars(rows, MEMORY_CATS, gib_short, capacity=mem.get("capacity_bytes"), cap_label="GPU memory",
                             cap_fmt=lambda b: f"{b / 2**30:.2f} GiB",
                             scale=2**30)
    trows = [[s["stage"], s["rank"], *(gib(s[c]) for c, _ in MEMORY_CATS), gib(s["total"]),
              ", ".join(f"{k} {fmt_bytes(v)}" for k, v in s.get("other_breakdown", {}).items() if v)] for s in stages]
    page.add("memory", "Memory per rank", chart
             + f"<p class='note'>Every TP, CP and DP rank of a pipeline stage holds the same; worst: stage "
               f"{mem['worst_stage']} ({esc(mem['worst_reason'])}). {esc(title_note)}</p>"
             + "<details><summary>numbers</summary>"
             + table(["stage", "first rank", *(c for c, _ in MEMORY_CATS), "total", "other, itemised"], trows) + "</details>")


def pipeline_section(page: Page, pipe: dict | None) -> None:
    if not pipe:
        page.add("pipeline", "Pipeline timeline", "<p>No pipeline parallelism (pp = 1): every rank runs all layers, no bubble.</p>")
        return
    p = pipe["stages"]
    if pipe.get("simulated") is False:      # too many passes to simulate: the closed form, no timeline
        page.add("pipeline", "Pipeline timeline",
                 f"<p>{esc(pipe['schedule'])}: {p} stages, {pipe['microbatches']} micro-batches; bubble "
                 f"<b>{100 * pipe['bubble_fraction_closed_form']:.2f}%</b> of the step by the closed form.</p>"
                 + "".join(f"<p class='note'>{esc(n)}</p>" for n in [pipe["closed_form"], *pipe["notes"]]))
        return
    if pipe.get("events"):
        boxes = [(e["stage"], e["start_s"], e["end_s"], PASS_COLORS[e["kind"]],
                  f"stage {e['stage']} {e['kind']} micro-batch {e['microbatch']} chunk {e['chunk']}: "
                  f"{fmt_time(e['start_s'])}–{fmt_time(e['end_s'])}", e["microbatch"]) for e in pipe["events"]]
        items = [("forward", PASS_COLORS["F"]), ("backward", PASS_COLORS["B"])]
        if pipe["schedule"] == "zb-h1":
            items.append(("weight gradient", PASS_COLORS["W"]))
    else:
        boxes = [(s, a, b, "#4e79a7", f"stage {s} busy {fmt_time(a)}–{fmt_time(b)}")
                 for s, iv in enumerate(pipe["busy_intervals_s"]) for a, b in iv]
        items = [("busy (passes merged)", "#4e79a7")]
    chart = svg.gantt(p, boxes, pipe["step_time_s"], fmt_time, items + [("idle = bubble", "#ffffff")])
    if not pipe.get("events"):   # thousands of passes: also draw the pipeline filling up, where the bubble is
        half = pipe["step_time_s"] / 2      # window: until every stage has started and left its warm-up gaps
        starts = [b[0] for iv in pipe["busy_intervals_s"] for b in iv if b[0] < half]
        t_fill = min(pipe["step_time_s"], 1.25 * max(starts, default=0.0))
        if t_fill > 0:
            zoom = [(s, a, min(b, t_fill), c, tip) for s, a, b, c, tip in boxes if a < t_fill]
            chart += (f"<h3>The first {fmt_time(t_fill)}: the pipeline filling up</h3>"
                      + svg.gantt(p, zoom, t_fill, fmt_time, items + [("idle = bubble", "#ffffff")]))
    head = (f"<p>{esc(pipe['schedule'])}: {p} stages, {pipe['microbatches']} micro-batches"
            + (f", v = {pipe['vpp']}" if pipe["vpp"] > 1 else "")
            + f"; simulated bubble <b>{100 * pipe['bubble_fraction']:.2f}%</b> of the timeline "
              f"(closed form {100 * pipe['bubble_fraction_closed_form']:.2f}%). The timeline holds the forward and "
              f"backward passes ({fmt_time(pipe['step_time_s'])}); the step-time table's bubble is a share of the whole "
              f"step, with communication and the optimizer step added.</p>")
    notes = "".join(f"<p class='note'>{esc(n)}</p>" for n in [pipe.get("closed_form", ""), pipe.get("timing", ""), *pipe["notes"]] if n)
    page.add("pipeline", "Pipeline timeline", head + chart + notes)


def diagram_section(page: Page, source: str | None, what: str) -> None:
    from shardlab.report.html.mermaid_js import mermaid_block, mermaid_info

    if not source:
        return
    info = mermaid_info()
    page.mermaid = True
    page.add("diagram", "Tensor-parallel block", mermaid_block(source)
             + f"<p class='note'>{esc(what)} Rendered in the page by Mermaid {info['version']} (npm package, "
               f"{info['bytes'] / 1e6:.1f} MB, inlined gzipped as {info['inlined_bytes'] / 1e6:.2f} MB); without "
               f"JavaScript the source text shows.</p>")


RANK_PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
                "#bab0ac", "#a0cbe8", "#ffbe7d", "#8cd17d", "#b6992d", "#499894", "#ff9d9a", "#79706e", "#d37295",
                "#d4a6c8", "#d7b5a6")
"""Tableau 20, dark colours first: the rank map's 20 distinguishable categories (stages, TP/EP ranks, DP replicas)."""


def colour_css() -> str:
    """Classes p0..p19, t.., d.., e..: the cell colour by stage, TP rank, DP replica or EP rank (the map's class picks one)."""
    return "".join(f".by-pp .p{i},.by-tp .t{i},.by-dp .d{i},.by-ep .e{i}{{background:{c}}}" for i, c in enumerate(RANK_PALETTE))


def _legend(by: str, n: int, name: str, hidden: bool) -> str:
    k = len(RANK_PALETTE)
    items = "".join(f"<span><i class='sw' style='background:{RANK_PALETTE[i % k]}'></i>{name} {i}</span>"
                    for i in range(min(n, k)))
    more = f"<span>… {n} in all (colours repeat every {k})</span>" if n > k else ""
    return f"<div class='legend' data-by='{by}'{' hidden' if hidden else ''}>{items}{more}</div>"


def rank_map_section(page: Page, detail: dict, comm: list[dict], layout: dict) -> None:
    """Nodes × GPUs, one cell per rank (``data-rank``) coloured by stage, TP rank or DP replica; hovering or
    clicking a cell shows its stage's memory and its groups' collectives."""
    rm, mem = detail["rank_map"], detail["memory"]
    cols, gpn = rm["columns"], rm["gpus_per_node"]
    compact = rm["world_size"] > 128
    n = len(RANK_PALETTE)
    ep = layout.get("ep", 1) > 1
    cells_by_node: dict[int, list[str]] = {}
    for r, row in enumerate(rm["ranks"]):
        c = dict(zip(cols, row))
        cls = f"rank p{c['pp'] % n} t{c['tp'] % n} d{c['dp'] % n} e{c.get('ep', 0) % n}"
        if compact:  # coordinates come from the document (script); the cell stays small
            cell = f'<div class="{cls}" tabindex="0" data-rank="{r}"></div>'
        else:
            label = (f"r{r}<br>PP{c['pp']} TP{c['tp']}<br>DP{c['dp']}" + (f" CP{c['cp']}" if layout.get("cp", 1) > 1 else "")
                     + (f" EP{c['ep']}" if ep else ""))
            cell = (f'<div class="{cls}" tabindex="0" data-rank="{r}" data-stage="{c["pp"]}" data-tp="{c["tp"]}" '
                    f'data-dp="{c["dp"]}" title="rank {r}: node {c["node"]} GPU {c["gpu"]}, stage {c["pp"]}, TP {c["tp"]}, '
                    f'DP {c["dp"]}">{label}</div>')
        cells_by_node.setdefault(c["node"], []).append(cell)
    # a large job's map stays small: each node a box labelled with its number (hover: 'node N'), as a small one is
    nodes = "".join(f"<div class='node' title='node {n}'><span class='nl'>{n if compact else f'node {n}'}</span>"
                    f"{''.join(cells)}</div>" for n, cells in cells_by_node.items())
    stage_mem = {s["stage"]: s for s in mem["stages"]}
    info = {"stages": {}, "cp": layout.get("cp", 1) > 1, "ep": ep, "axes": []}
    for st in rm["stages"]:
        s = stage_mem[st["stage"]]
        holds = (f"<p><b>holds</b>: layers {esc(st['layers'])}" + (f" + {esc(', '.join(st['extra']))}" if st["extra"] else "")
                 + f"; {esc(rm['tp_shard'])}; {esc(rm['zero_shard'])}</p>")
        memt = table(["memory", "GiB"], [[c, gib(s[c])] for c, _ in MEMORY_CATS] + [["total", gib(s["total"])]]
                     + ([["capacity", gib(mem["capacity_bytes"])]] if mem.get("capacity_bytes") else []))
        info["stages"][str(st["stage"])] = {"holds": holds, "memory": memt}
    for key, label, inv_axes in GROUP_AXES:
        if not rm["groups"].get(key):
            continue
        items = [c for c in comm if c["axis"] in inv_axes]
        text = "; ".join(f"{c['op']} {c['phase']} ×{c['calls_per_step']:,} ({fmt_time(c['time_per_step_s'])}, {c['link_id']})"
                         for c in items) or "none"
        info["axes"].append({"key": key, "label": label, "comm": esc(text)})
    page.data["rank-info"] = info
    mode = "pp" if layout["pp"] > 1 else ("dp" if layout["dp"] > 1 else "tp")
    options = (("pp", "pipeline stage"), ("tp", "TP rank"), ("dp", "DP replica")) + ((("ep", "EP rank"),) if ep else ())
    radios = "".join(f"<label><input type='radio' name='colour' value='{v}'{' checked' if v == mode else ''}> {t}</label> "
                     for v, t in options)
    legends = (_legend("pp", layout["pp"], "stage", mode != "pp") + _legend("tp", layout["tp"], "TP", mode != "tp")
               + _legend("dp", layout["dp"], "DP", mode != "dp") + (_legend("ep", layout["ep"], "EP", True) if ep else ""))
    body = (f"<p>{rm['world_size']} GPU{'s' if rm['world_size'] != 1 else ''} on {rm['nodes']} node"
            f"{'s' if rm['nodes'] != 1 else ''} × {gpn}; rank order {esc(rm['axis_order'])}. "
            f"Colour by: {radios}</p>{legends}"
            f"<div class='rankmap'><div id='nodes' class='nodes by-{mode}{' compact' if compact else ''}'>{nodes}</div>"
            f"<div id='rank-panel'><p>Hover over or click a GPU to see what it holds, its memory and its collectives."
            f"</p></div></div>")
    page.add("rank-map", "Rank map", body)
