"""Hand-written SVG charts (no library): stacked bars, a waterfall, a Gantt timeline, plain bars and a
line chart. Static SVG needs no script to show, scales with the page, and the whole set is a few KB.
Inputs are the document's numbers; only geometry (pixels) is computed here."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from shardlab.report.html.page import esc

W = 960
"""Drawing width in SVG units (the element scales to the page)."""


def _nice_ticks(vmax: float, n: int = 5) -> list[float]:
    if vmax <= 0:
        return [0.0]
    step = 10 ** math.floor(math.log10(vmax / n))
    for m in (1, 2, 2.5, 5, 10):
        if vmax / (step * m) <= n:
            step *= m
            break
    return [i * step for i in range(int(vmax / step) + 1)]


def _svg(h: float, body: str, label: str) -> str:
    # in a scrolling box: on a narrow screen the chart keeps a readable size and scrolls, as tables do
    return (f'<div class="chart"><svg viewBox="0 0 {W} {h:.0f}" width="{W}" height="{h:.0f}" role="img" '
            f'aria-label="{esc(label)}" xmlns="http://www.w3.org/2000/svg">{body}</svg></div>')


def _rect(x, y, w, h, fill, title: str = "", extra: str = "") -> str:
    t = f"<title>{esc(title)}</title>" if title else ""
    return f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" height="{h:.1f}" fill="{fill}" {extra}>{t}</rect>'


def _text(x, y, s, anchor="start", cls="", size=None) -> str:
    st = f' style="font-size:{size}px"' if size else ""
    c = f' class="{cls}"' if cls else ""
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{c}{st}>{esc(s)}</text>'


def legend(items: Sequence[tuple[str, str]], y: float = 12, x0: float = 0) -> str:
    """Swatches and labels in a row, wrapping to a new row 18 units lower when the width runs out."""
    out, x = [], x0
    for label, color in items:
        w = 26 + 7 * len(label)
        if x + w > W and x > x0:
            x, y = x0, y + 18
        out.append(_rect(x, y - 9, 11, 11, color, extra='stroke="#999" stroke-width="0.5"') + _text(x + 15, y, label))
        x += w
    return "".join(out)


def legend_rows(items: Sequence[tuple[str, str]], x0: float = 0) -> int:
    """Rows ``legend`` takes."""
    rows, x = 1, x0
    for label, _ in items:
        w = 26 + 7 * len(label)
        if x + w > W and x > x0:
            rows, x = rows + 1, x0
        x += w
    return rows


def _axis(x0: float, x1: float, y: float, vmax: float, fmt: Callable[[float], str], h: float, scale: float = 1.0) -> str:
    """Vertical grid lines and labels at round values of ``vmax / scale`` (scale: the unit, e.g. 2**30 for GiB)."""
    out = []
    for t in _nice_ticks(vmax / scale):
        x = x0 + (x1 - x0) * t * scale / vmax
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y - h:.1f}" y2="{y:.1f}" stroke="#e5e7eb"/>')
        out.append(_text(x, y + 14, "0" if t == 0 else fmt(t * scale), "middle", size=11))
    return "".join(out)


def stacked_bars(rows: Sequence[tuple[str, Sequence[float]]], cats: Sequence[tuple[str, str]],
                 fmt: Callable[[float], str], capacity: float | None = None, cap_label: str = "capacity",
                 label_w: int = 150, scale: float = 1.0, cap_fmt: Callable[[float], str] | None = None) -> str:
    """Horizontal stacked bars: ``rows`` = (label, one value per category), ``cats`` = (name, colour); ticks at round
    multiples of ``scale``; ``cap_fmt`` formats the capacity line's label (default ``fmt``)."""
    bh, gap, top = 20, 7, 28 + 18 * (legend_rows(cats) - 1)
    vmax = max([sum(v) for _, v in rows] + [capacity or 0]) * 1.08 or 1.0
    x0, x1 = label_w, W - 110
    h = top + len(rows) * (bh + gap) + 24
    out, totals = [legend(cats)], []
    out.append(_axis(x0, x1, h - 20, vmax, fmt, h - top - 16, scale))
    for i, (label, vals) in enumerate(rows):
        y, x = top + i * (bh + gap), x0
        out.append(_text(x0 - 6, y + bh - 5, label, "end"))
        for (name, color), v in zip(cats, vals):
            w = (x1 - x0) * v / vmax
            out.append(_rect(x, y, w, bh, color, f"{label}: {name} {fmt(v)}"))
            x += w
        totals.append(_text(x + 5, y + bh - 5, fmt(sum(vals)), cls="halo"))   # drawn over the capacity line
    if capacity:
        cx = x0 + (x1 - x0) * capacity / vmax
        out.append(f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{top - 6}" y2="{h - 20}" stroke="#cf222e" stroke-dasharray="5 3" stroke-width="1.5"/>')
        out.append(_text(cx + 4, top - 8 + 0, f"{cap_label} {cap_fmt(capacity) if cap_fmt else fmt(capacity)}", size=11))
    out += totals
    return _svg(h, "".join(out), "stacked bars")


def waterfall(parts: Sequence[tuple[str, float, str]], total: tuple[str, float], fmt: Callable[[float], str],
              label_w: int = 190) -> str:
    """Each part a bar starting where the previous ended; the last bar is the total. parts = (label, value, colour)."""
    bh, gap, top = 18, 6, 8
    vmax = max(total[1], sum(v for _, v, _ in parts)) * 1.02 or 1.0
    x0, x1 = label_w, W - 150
    n = len(parts) + 1
    h = top + n * (bh + gap) + 26
    out = [_axis(x0, x1, h - 22, vmax, fmt, h - top - 18)]
    acc = 0.0
    for i, (label, v, color) in enumerate(parts):
        y = top + i * (bh + gap)
        xa = x0 + (x1 - x0) * acc / vmax
        w = (x1 - x0) * v / vmax
        out.append(_text(x0 - 6, y + bh - 4, label, "end"))
        out.append(_rect(xa, y, max(w, 1.0), bh, color, f"{label}: {fmt(v)}"))
        out.append(_text(xa + max(w, 1.0) + 5, y + bh - 4, f"{fmt(v)} ({100 * v / total[1]:.1f}%)" if total[1] else fmt(v)))
        acc += v
    y = top + len(parts) * (bh + gap)
    out.append(_text(x0 - 6, y + bh - 4, total[0], "end", cls="b"))
    out.append(_rect(x0, y, (x1 - x0) * total[1] / vmax, bh, "#24292f", f"{total[0]}: {fmt(total[1])}"))
    out.append(_text(x0 + (x1 - x0) * total[1] / vmax + 5, y + bh - 4, fmt(total[1])))
    return _svg(h, "".join(out), "step-time waterfall")


def gantt(rows: int, boxes: Sequence[tuple[int, float, float, str, str]], t_end: float, fmt: Callable[[float], str],
          legend_items: Sequence[tuple[str, str]] = (), row_label: Callable[[int], str] = lambda r: f"stage {r}") -> str:
    """A timeline: ``boxes`` = (row, start, end, colour, tooltip[, label]); one row per pipeline stage, stage 0 on top."""
    rh = 18 if rows <= 16 else max(6, 300 // rows)
    top, x0, x1 = 22, 70, W - 10
    h = top + rows * rh + 26
    out = [legend(legend_items)] if legend_items else []
    out.append(_axis(x0, x1, h - 22, t_end, fmt, h - top - 18))
    step = 1 if rows <= 16 else max(1, rows // 16)
    for r in range(0, rows, step):
        out.append(_text(x0 - 6, top + r * rh + rh - 4 if rh >= 12 else top + r * rh + rh, row_label(r), "end", size=11))
    labelled = len(boxes) <= 600
    for box in boxes:
        r, a, b, color, tip = box[:5]
        xa, w = x0 + (x1 - x0) * a / t_end, max((x1 - x0) * (b - a) / t_end, 0.4)
        out.append(_rect(xa, top + r * rh + 1, w, rh - 2, color, tip, 'stroke="#fff" stroke-width="0.6"'))
        if labelled and len(box) > 5 and rh >= 14 and w >= 7 * len(str(box[5])) + 4:
            out.append(f'<text x="{xa + w / 2:.1f}" y="{top + r * rh + rh - 5:.1f}" text-anchor="middle" '
                       f'style="font-size:10px;fill:#fff">{esc(box[5])}</text>')
    return _svg(h, "".join(out), "pipeline timeline")


def bars(rows: Sequence[tuple[str, float]], fmt: Callable[[float], str], color: str = "#4e79a7",
         ref: tuple[str, float] | None = None, label_w: int = 150) -> str:
    """Plain horizontal bars with an optional dashed reference line (e.g. the prediction)."""
    bh, gap, top = 16, 5, 8 if ref is None else 22
    vmax = max([v for _, v in rows] + [ref[1] if ref else 0]) * 1.1 or 1.0
    x0, x1 = label_w, W - 110
    h = top + len(rows) * (bh + gap) + 24
    out = [_axis(x0, x1, h - 20, vmax, fmt, h - top - 16)]
    for i, (label, v) in enumerate(rows):
        y = top + i * (bh + gap)
        w = (x1 - x0) * v / vmax
        out.append(_text(x0 - 6, y + bh - 3, label, "end") + _rect(x0, y, w, bh, color, f"{label}: {fmt(v)}")
                   + _text(x0 + w + 5, y + bh - 3, fmt(v)))
    if ref:
        rx = x0 + (x1 - x0) * ref[1] / vmax
        out.append(f'<line x1="{rx:.1f}" x2="{rx:.1f}" y1="{top - 4}" y2="{h - 20}" stroke="#cf222e" stroke-dasharray="5 3" stroke-width="1.5"/>')
        out.append(_text(rx + 4, 14, f"{ref[0]} {fmt(ref[1])}", size=11))
    return _svg(h, "".join(out), "bars")


def line_chart(series: Sequence[tuple[str, Sequence[float], Sequence[float], str]], xfmt: Callable[[float], str],
               yfmt: Callable[[float], str], xlabel: str, ylabel: str, tick_base: int = 10) -> str:
    """Lines over a log-scaled x axis (message sizes): series = (label, xs, ys, colour[, "markers"]): measurements
    drawn as points when marked so, fits and models as lines; x ticks at the powers of ``tick_base`` (8 for bytes:
    4 KiB, 32 KiB, 256 KiB, ...)."""
    xs = [x for s in series for x in s[1] if x > 0]
    ys = [y for s in series for y in s[2]]
    if not xs:
        return ""
    lo, hi = math.log10(min(xs)), math.log10(max(xs))
    hi = hi if hi > lo else lo + 1
    ymax = (max(ys) if ys else 1) * 1.1 or 1.0
    items = [(s[0], s[3]) for s in series]
    extra = 18 * (legend_rows(items) - 1)          # a legend of several rows pushes the plot down
    x0, x1, top, h = 70, W - 20, 24 + extra, 340 + extra
    yb = h - 40
    px = lambda x: x0 + (x1 - x0) * (math.log10(x) - lo) / (hi - lo)
    py = lambda y: yb - (yb - top) * y / ymax
    out = [legend(items)]
    for t in _nice_ticks(ymax):
        out.append(f'<line x1="{x0}" x2="{x1}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#e5e7eb"/>'
                   + _text(x0 - 6, py(t) + 4, yfmt(t), "end", size=11))
    lb = math.log10(tick_base)
    for e in range(math.ceil(lo / lb - 1e-9), math.floor(hi / lb + 1e-9) + 1):
        t = float(tick_base) ** e
        out.append(f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{top}" y2="{yb}" stroke="#e5e7eb"/>'
                   + _text(px(t), yb + 14, xfmt(t), "middle", size=11))
    for item in series:
        label, sx, sy, color = item[:4]
        if len(item) > 4 and item[4] == "markers":      # measurements: points, not a line (fits are lines)
            out += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3.5" fill="{color}"><title>{esc(label)}</title></circle>'
                    for x, y in zip(sx, sy) if x > 0]
            continue
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(sx, sy) if x > 0)
        out.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2"><title>{esc(label)}</title></polyline>')
    out.append(_text((x0 + x1) / 2, h - 8, xlabel, "middle") + _text(x0, top - 8 + 0, "", size=1))
    out.append(f'<text x="14" y="{(top + yb) / 2:.0f}" transform="rotate(-90 14 {(top + yb) / 2:.0f})" text-anchor="middle">{esc(ylabel)}</text>')
    return _svg(h, "".join(out), "line chart")
