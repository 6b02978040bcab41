"""The disaggregated part of the capacity page: the best split's two GPU pools (one square per GPU, grouped by
replica, prefill and decode coloured apart) with the KV transfer between them, and the splits ranked beside the
aggregated winner. Drawn from the JSON document (``disaggregated``, ``comparison``); it computes no number."""

from __future__ import annotations

from shardlab.report.html import svg
from shardlab.serving.moe import pool_label, two_kinds
from shardlab.report.html.page import PALETTE, esc, table
from shardlab.units import fmt_time

PREFILL, DECODE = PALETTE[1], PALETTE[0]


def _pool(x0: float, y0: float, pool: dict, color: str, name: str, kind: bool = False) -> tuple[str, float]:
    """(SVG, width) of one pool: its replicas side by side, each a row of GPU squares with a frame."""
    per = max(1, pool["gpus"] // max(pool["replicas"], 1))
    s, gap, out, x = 22.0, 10.0, [], x0
    for r in range(pool["replicas"]):
        w = per * (s + 3) + 5
        out.append(svg._rect(x, y0, w, s + 10, "none", f"{name} replica {r + 1}: {pool['layout']}",
                             'stroke="#888" stroke-width="1" rx="3"'))
        for g in range(per):
            out.append(svg._rect(x + 4 + g * (s + 3), y0 + 5, s, s, color,
                                 f"{name} replica {r + 1}, GPU {g + 1} of {per} ({pool['layout']})", 'rx="2"'))
        x += w + gap
    gpus = f"{pool['gpus']} × {pool.get('gpu')}" if kind else f"{pool['gpus']} GPUs"
    out.append(svg._text(x0, y0 - 6, f"{name}: {gpus} = {pool['replicas']} × {pool['layout']}", size=12))
    return "".join(out), x - x0


def pools_svg(best: dict) -> str:
    """The best split: the prefill pool, an arrow carrying the KV cache, the decode pool."""
    pre, dec = best["prefill"], best["decode"]
    kind = pre.get("gpu") != dec.get("gpu")                # two GPU kinds: each pool names its own
    a, wa = _pool(10, 30, pre, PREFILL, "prefill", kind)
    x1 = 10 + wa + 20
    arrow = (f'<line x1="{x1:.1f}" y1="46" x2="{x1 + 120:.1f}" y2="46" stroke="#555" stroke-width="2" '
             f'marker-end="url(#kvarrow)"/>'
             + svg._text(x1 + 60, 40, f"KV {fmt_time(best['kv_transfer_s'])}", anchor="middle", size=11)
             + svg._text(x1 + 60, 64, "NVLink" if best.get("kv_link") == "intra" else "NIC", anchor="middle", size=11))
    b, _ = _pool(x1 + 140, 30, dec, DECODE, "decode", kind)
    marker = ('<defs><marker id="kvarrow" markerWidth="8" markerHeight="8" refX="7" refY="4" orient="auto">'
              '<path d="M0,0 L8,4 L0,8 z" fill="#555"/></marker></defs>')
    return svg._svg(80, marker + a + arrow + b, "prefill pool, KV transfer, decode pool")


def disagg_section(doc: dict) -> str | None:
    """HTML of the disaggregated splits, or None when the search did not run."""
    found = doc.get("disaggregated")
    if found is None:
        return None
    if not found:
        return "<p>No split of these GPUs holds the model in both pools.</p>"
    c = doc.get("comparison") or {}
    best = found[0]
    dollars = c.get("basis") == "per dollar"     # two GPU kinds (plan --prefill-gpu): compared per dollar
    key, unit = (("output_tokens_per_usd", "tokens per dollar") if dollars else
                 ("goodput_tokens_per_s_per_gpu", "output tokens/s per GPU"))
    agg = (c.get("aggregated_output_tokens_per_usd") if dollars else c.get("aggregated_goodput_tokens_per_s_per_gpu")) or 0.0
    dis = (c.get("disaggregated_output_tokens_per_usd") if dollars else
           c.get("disaggregated_goodput_tokens_per_s_per_gpu")) or 0.0
    verdict = (f"Best split: {dis:,.0f} {unit} against {agg:,.0f} aggregated" + (f" ({dis / agg:.2f}×)." if agg else ".")
               + (" Two GPU kinds are compared per dollar, at the catalog's prices." if dollars else "")
               + (f" {c['note'][0].upper()}{c['note'][1:]}." if c.get("note") else ""))
    two = two_kinds(found)                                     # plan --prefill-gpu
    kind = (lambda pool: f" {pool['gpu']}") if two else (lambda pool: "")
    name = lambda p, role: f"{p[role]['gpus']}{kind(p[role])} ({pool_label(p[role])})"   # noqa: E731
    chart = svg.bars([("aggregated (the recommended layout)", agg),
                      *[(f"{name(p, 'prefill')} prefill + {name(p, 'decode')} decode", p[key] or 0.0) for p in found]],
                     lambda v: f"{v:,.0f} {'tok/$' if dollars else 'tok/s/GPU'}", label_w=420 if two else 330)
    rows = [[name(p, "prefill"), name(p, "decode"), f"{p['max_request_rate']:,.2f}",
             f"{p['goodput_tokens_per_s_per_gpu']:,.0f}", fmt_time(p["ttft_s"]), fmt_time(p["tpot_s"]),
             fmt_time(p["kv_transfer_s"]), f"{100 * p['prefill_utilization']:.0f}%"]
            + ([f"{p['output_tokens_per_usd']:,.0f}"] if dollars else []) for p in found]
    return (f"<p>{esc(verdict)} Prefill runs on its own GPUs, so decode steps carry no prompt; each request's KV "
            f"cache crosses from one pool to the other (DistServe, arXiv 2401.09670).</p>" + pools_svg(best) + chart
            + table(["prefill GPUs", "decode GPUs", "most requests/s", "tokens/s per GPU", "TTFT", "TPOT", "KV send",
                     "prefill busy"] + (["tokens per dollar"] if dollars else []), rows))


def disagg_estimate_page(doc: dict):
    """The page of `estimate --inference --serve --disaggregated P:D`: the answer, the two pools and the transfer,
    the steady state beside the aggregated alternative, and the simulated percentiles."""
    from shardlab.report.html.page import Page, kv_table, num
    from shardlab.report.html.serve_pages import _load_text, _ms, _percentiles

    d = doc["disaggregated"]
    page = Page(f"shardlab estimate --inference --serve --disaggregated {d['prefill']['gpus']}:{d['decode']['gpus']}: "
                f"{doc['model']} on {d['gpus']} × {doc['gpu']}",
                f"{esc(doc['engine'])}, {doc['prompt_len']} + {doc['output_len']} tokens per request, "
                f"{_load_text(doc.get('load') or {})}; {esc(doc.get('precision', ''))}; estimates")
    ss = doc.get("steady_state") or {}
    page.answer([("time to first token", _ms(ss.get("ttft_s"))), ("time per output token", _ms(ss.get("tpot_s"))),
                 ("output tokens/s", num(ss.get("output_tokens_per_s"))), ("KV transfer", _ms(doc.get("kv_transfer_s")))],
                "the two pools' steady state (serving.disagg); percentiles from the simulation below")
    agg = doc.get("aggregated") or {}
    page.add("pools", "The two pools and the KV transfer", pools_svg(d) + kv_table([
        ("prefill pool busy", f"{100 * (ss.get('prefill_utilization') or 0):.0f}% (one prompt {_ms(ss.get('prefill_s'))},"
                              f" queue {_ms(ss.get('prefill_wait_s'))}, M/D/1)"),
        ("KV link busy", f"{100 * (ss.get('kv_link_utilization') or 0):.1f}%"),
        ("decode sequences per replica", num(ss.get("decode_batch"))),
        ("saturates at", f"{num(doc.get('saturation_rate'))} requests/s"),
        ("aggregated instead", (f"{agg.get('replicas')} × {esc(agg.get('layout', ''))}: "
                                + ("overloaded" if agg.get("overloaded") else
                                   f"TTFT {_ms(agg.get('ttft_s'))}, TPOT {_ms(agg.get('tpot_s'))}")) if agg else "—")]))
    page.add("simulation", "Simulated percentiles", _percentiles(doc.get("simulation")))
    return page
