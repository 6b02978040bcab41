"""The page of `plan --inference --serve` with latency targets and no load (``serve_plan_page`` hands such documents
here): the winner's capacity, the Pareto front of output tokens/s per GPU against output tokens/s per user (an
inline SVG scatter, one series per layout, the recommended layout marked), the layouts ranked by goodput per GPU and
the winner's simulated percentiles. Drawn from the JSON document; it computes no number."""

from __future__ import annotations

from collections.abc import Sequence

from shardlab.report.html import svg
from shardlab.report.html.page import PALETTE, Page, esc, generic, kv_table, num, table
from shardlab.units import fmt_time

SHOWN = {"plans", "pareto", "capacity", "target", "best_simulated", "notes", "disaggregated", "comparison"}
"""Keys drawn by their own sections (the rest go to the generic one)."""


def _ms(v) -> str:
    return "—" if v is None else fmt_time(v)


def _n(v) -> str:
    """A number for the page: whole above 1,000 (num's 4 significant digits would turn 13,510 into 1.351e+04)."""
    return f"{v:,.0f}" if isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) >= 1000 else num(v)


def _replicas(p: dict) -> str:
    """'N replica(s)' of a layout in words: TP × PP, or the MoE layout the serving search picked."""
    from shardlab.serving.moe import plan_label

    reps = p.get("replicas", 1)
    return f"{plan_label(p)} × {reps} replica{'s' if reps != 1 else ''}"


def _layout(p: dict) -> str:
    return f"{_replicas(p)}, max-num-seqs {p['max_num_seqs']:,}"


def _same_layout(p: dict, lay: dict) -> bool:
    return all(p.get(k, 1) == lay.get(k, 1) for k in ("tp", "pp", "ep", "dp_attention", "replicas", "max_num_seqs"))


def pareto_chart(points: Sequence[dict], winner: dict | None) -> str:
    """Tokens/s per GPU (y) against tokens/s per user (x) of the Pareto points, one colour per layout, the front as a
    grey line through them, the ``winner`` layout's point at its capacity ringed and labelled."""
    if not points:
        return "<p>No layout meets the targets at any load: the front is empty.</p>"
    W = svg.W
    series: dict[str, list[dict]] = {}
    for p in points:                                  # one series per TP × PP × replicas (caps in the tooltips)
        series.setdefault(_replicas(p), []).append(p)
    items = [(name, PALETTE[i % len(PALETTE)]) for i, name in enumerate(series)]
    extra = 18 * (svg.legend_rows(items) - 1)
    x0, x1, top, h = 78, W - 24, 34 + extra, 400 + extra
    yb = h - 48
    xmax = max(p["tokens_per_s_per_user"] for p in points) * 1.08 or 1.0
    ymax = max(p["tokens_per_s_per_gpu"] for p in points) * 1.12 or 1.0
    px = lambda v: x0 + (x1 - x0) * v / xmax  # noqa: E731
    py = lambda v: yb - (yb - top) * v / ymax  # noqa: E731
    out = [svg.legend(items)]
    for t in svg._nice_ticks(ymax):
        out.append(f'<line x1="{x0}" x2="{x1}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#e5e7eb"/>'
                   + svg._text(x0 - 6, py(t) + 4, f"{t:,.0f}", "end", size=11))
    for t in svg._nice_ticks(xmax):
        out.append(f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{top}" y2="{yb}" stroke="#e5e7eb"/>'
                   + svg._text(px(t), yb + 15, f"{t:,.0f}", "middle", size=11))
    front = sorted(points, key=lambda p: p["tokens_per_s_per_user"])
    path = " ".join(f"{px(p['tokens_per_s_per_user']):.1f},{py(p['tokens_per_s_per_gpu']):.1f}" for p in front)
    out.append(f'<polyline points="{path}" fill="none" stroke="#8c959f" stroke-width="1.5" stroke-dasharray="4 3">'
               f'<title>Pareto front</title></polyline>')
    mark = None
    for (name, color), pts in zip(items, series.values()):
        for p in pts:
            tip = (f"{_layout(p)}: {_n(p['request_rate'])} requests/s over all replicas, {_n(p['concurrency'])} in flight; "
                   f"TTFT {_ms(p['ttft_s'])}, TPOT {_ms(p['tpot_s'])}; {_n(p['tokens_per_s_per_gpu'])} tokens/s per "
                   f"GPU, {_n(p['tokens_per_s_per_user'])} per user")
            cx, cy = px(p["tokens_per_s_per_user"]), py(p["tokens_per_s_per_gpu"])
            out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="5" fill="{color}" stroke="#fff" stroke-width="1">'
                       f'<title>{esc(tip)}</title></circle>')
            if winner and p.get("at_capacity") and _same_layout(p, winner):
                mark = (cx, cy)
    if mark:
        cx, cy = mark
        out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="10" fill="none" stroke="#cf222e" stroke-width="2.5"/>')
        anchor, dx = ("end", -14) if cx > (x0 + x1) / 2 else ("start", 14)
        out.append(svg._text(cx + dx, cy + 4, "recommended (its capacity)", anchor, cls="halo"))
    out.append(svg._text((x0 + x1) / 2, h - 10, "output tokens/s per user (1 / mean TPOT) →", "middle"))
    out.append(f'<text x="16" y="{(top + yb) / 2:.0f}" transform="rotate(-90 16 {(top + yb) / 2:.0f})" '
               f'text-anchor="middle">output tokens/s per GPU →</text>')
    return svg._svg(h, "".join(out), "Pareto front: tokens/s per GPU against tokens/s per user")


def _cap_cell(p: dict) -> str:
    if p.get("max_request_rate") is not None:
        return ("≥ " if str(p.get("capacity_statistic", "")).startswith("p99, at least") else "") + _n(p["max_request_rate"])
    b = p.get("max_request_rate_bounds") or [None, None]
    return ("≤ " if p.get("capacity_statistic") == "not simulated" else "< ") + _n(b[1])


def capacity_plan_page(doc: dict) -> Page:
    from shardlab.report.html.serve_pages import _percentiles

    slo = doc.get("slo") or {}
    targets = "; ".join(f"{name} ≤ {_ms(slo[key])}" for key, name in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"))
                        if slo.get(key) is not None) or "no latency targets"
    stat = slo.get("percentile", "p50")
    page = Page(f"shardlab plan --inference --serve: capacity of {doc['model']} on {doc['gpus']:,} × {doc['gpu']}",
                f"{esc(doc['engine'])}, {doc['prompt_len']} + {doc['output_len']} tokens per request, Poisson arrivals; "
                f"targets {esc(targets)} at {esc(stat)}"
                + (" (the steady state's mean stands for the median)" if stat == "p50" else " (simulated)")
                + "; estimates")
    cap, plans = doc.get("capacity") or {}, doc.get("plans") or []
    lay = cap.get("layout")
    cards = "".join(f"<div class='card'><div class='l'>{esc(k)}</div><div class='v'>{v}</div></div>" for k, v in (
        ("most requests/s", _n(cap.get("max_request_rate"))),
        ("goodput, output tokens/s per GPU", _n(cap.get("goodput_tokens_per_s_per_gpu"))),
        ("requests in flight", _n(cap.get("max_concurrency"))),
        ("what binds", esc(cap.get("binds", "—")) + (f" ({esc(cap['binds_statistic'])})" if cap.get("binds_statistic")
                                                     not in (None, cap.get("statistic")) else ""))))
    body = f"<div class='cards'>{cards}</div>"
    if not cap.get("max_request_rate"):
        body += "<p class='bad'>No layout meets the targets at any load tried.</p>"
    rows = [("layout", esc(_layout(lay)) if lay else "—"),
            ("capacity", f"{_n(cap.get('max_request_rate'))} requests/s over all replicas "
                         f"({_n(cap.get('max_request_rate_per_replica'))} per replica; saturation "
                         f"{_n(cap.get('saturation_rate'))})"),
            (f"{stat} TTFT at that rate", _ms(cap.get("ttft_s"))), (f"{stat} TPOT at that rate", _ms(cap.get("tpot_s"))),
            ("sequences running per replica", _n(cap.get("in_flight_per_replica"))),
            ("output tokens/s", _n(cap.get("output_tokens_per_s")))]
    t = doc.get("target")
    if t:
        rows.insert(0, ("target", f"{_n(t.get('rate'))} requests/s needs <b>{_n(t.get('gpus'))} GPUs</b> (headroom "
                                  f"{_n(100 * (t.get('headroom') or 0))}%; counts tried up to {_n(t.get('bound'))}"
                                  + (f"; {_n(t['next_smaller_count'])} GPUs serve less" if t.get("next_smaller_count")
                                     else "") + ")"))
    page.add("capacity", "Capacity under the targets", body + kv_table(rows) + "".join(
        f"<p class='note'>{esc(n)}</p>" for n in doc.get("notes") or []))
    front = doc.get("pareto") or []
    ftable = table(["layout", "requests/s", "in flight", "TTFT", "TPOT", "tokens/s per GPU", "tokens/s per user"],
                   [[_layout(p), _n(p["request_rate"]), _n(p["concurrency"]), _ms(p["ttft_s"]), _ms(p["tpot_s"]),
                     _n(p["tokens_per_s_per_gpu"]), _n(p["tokens_per_s_per_user"])] for p in front])
    page.add("pareto", "Pareto front: tokens/s per GPU against tokens/s per user",
             pareto_chart(front, lay) + "<p class='note'>Each layout swept from 1/64 of its capacity up to it (steady "
             "state); a point stays when no other serves both more tokens/s per GPU and more per user. Hover a point "
             "for its load and latencies.</p>" + ftable)
    prow = [[_layout(p), _cap_cell(p), _n(p.get("goodput_tokens_per_s_per_gpu")), esc(p.get("binds", "")),
             _n(p.get("in_flight_per_replica")), _ms(p.get("ttft_s")), _ms(p.get("tpot_s")),
             f"{p.get('kv_blocks_per_gpu', 0):,}", _n(p.get("capacity_per_replica"))] for p in plans]
    chart = svg.bars([(_layout(p), p["goodput_tokens_per_s_per_gpu"]) for p in plans
                      if p.get("goodput_tokens_per_s_per_gpu")], lambda v: f"{v:,.0f} tok/s/GPU", label_w=330)
    page.add("plans", "Layouts by goodput per GPU", chart + table(
        ["layout", "most requests/s", "tokens/s per GPU", "binds", "in flight", "TTFT", "TPOT", "KV blocks/GPU",
         "sequences a replica holds"], prow))
    from shardlab.report.html.pools import disagg_section

    dis = disagg_section(doc)
    if dis is not None:
        from shardlab.serving.moe import two_kinds

        page.add("disaggregated", "Disaggregated prefill and decode "
                 + ("on two GPU kinds" if two_kinds(doc.get("disaggregated") or []) else "on the same GPUs"), dis)
    page.add("simulation", "The recommended layout at its capacity, simulated",
             _percentiles(doc.get("best_simulated"), (lay or {}).get("replicas", 1)))
    page.add("more", "Everything else in the document", generic({k: v for k, v in doc.items() if k not in SHOWN}))
    return page
