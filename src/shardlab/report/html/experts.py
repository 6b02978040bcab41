"""The experts per GPU of a MoE serving layout (``estimate --inference --serve --ep N``): one box per GPU of the
replica, grouped by node, with its attention rank and a square per expert slot it holds (the model's routed experts
in order, EPLB's redundant slots apart), the busiest rank marked, and the all-to-all that moves each token to its
top-k experts and back. Drawn from the JSON document's ``moe`` part; it computes no number but the slot ranges."""

from __future__ import annotations

from shardlab.report.html import svg
from shardlab.report.html.page import PALETTE, esc

EXPERT, SPARE, BUSY = PALETTE[0], PALETTE[2], "#c0392b"
PER_ROW = 8
"""GPU boxes per row (a node of 8 GPUs per row on the usual systems)."""
MAX_SQUARES = 64
"""Expert squares drawn in a box; more slots are drawn as one bar with their count."""


def _slots(box_x: float, y: float, w: float, first: int, count: int, spare: int) -> str:
    """The expert slots of one GPU: ``count`` routed experts from ``first``, then ``spare`` redundant slots."""
    n = count + spare
    if n > MAX_SQUARES:
        frac = count / n
        return (svg._rect(box_x, y, w * frac, 14, EXPERT, f"routed experts {first}-{first + count - 1}")
                + svg._rect(box_x + w * frac, y, w * (1 - frac), 14, SPARE, f"{spare} redundant slots")
                + svg._text(box_x + w / 2, y + 28, f"{count} experts" + (f" + {spare}" if spare else ""),
                            anchor="middle", size=10))
    cols = max(1, min(n, 8))
    s = min(12.0, (w - 2 * (cols - 1)) / cols)
    out = []
    for i in range(n):
        cx, cy = box_x + (i % cols) * (s + 2), y + (i // cols) * (s + 2)
        if i < count:
            out.append(svg._rect(cx, cy, s, s, EXPERT, f"routed expert {first + i}", 'rx="1"'))
        else:
            out.append(svg._rect(cx, cy, s, s, SPARE, "redundant slot (EPLB: a copy of a busy expert)", 'rx="1"'))
    return "".join(out)


def experts_svg(moe: dict, tp: int, gpus_per_node: int = 8) -> str:
    """The replica's GPUs with their expert slots (``moe``: ep, dp_attention, experts, top_k, redundant_experts,
    expert_imbalance)."""
    n, E, R = int(moe["ep"]), int(moe["experts"]), int(moe.get("redundant_experts") or 0)
    per, dpa = (E + R) // n, int(moe.get("dp_attention") or 1)
    # EPLB spreads the redundant slots: each GPU holds E/n routed experts (the first E mod n one more) and the rest
    routed = [E // n + (1 if g < E % n else 0) for g in range(n)]
    box_w, gap = (svg.W - 20 - (PER_ROW - 1) * 8) / PER_ROW, 8
    rows_sq = 1 if per > MAX_SQUARES else -(-per // 8)
    box_h = 40 + rows_sq * 14 + 10
    out, first = [], 0
    for g in range(n):
        x = 10 + (g % PER_ROW) * (box_w + gap)
        y = 30 + (g // PER_ROW) * (box_h + 14)
        busiest = g == 0 and moe.get("expert_imbalance", 1.0) > 1.0
        rank = (f"attention rank {g // tp}" + (f", TP {tp}" if tp > 1 else "") if dpa > 1 else f"TP rank {g % tp}")
        title = (f"GPU {g} (node {g // gpus_per_node}): {rank}; routed experts {first}-{first + routed[g] - 1}"
                 + (f" and {per - routed[g]} redundant slots" if per > routed[g] else ""))
        out.append(svg._rect(x, y, box_w, box_h, "none", title,
                             f'stroke="{BUSY if busiest else "#888"}" stroke-width="{2 if busiest else 1}" rx="4"'))
        out.append(svg._text(x + 5, y + 14, f"GPU {g} · node {g // gpus_per_node}", size=11))
        out.append(svg._text(x + 5, y + 28, rank, size=10))
        out.append(_slots(x + 5, y + 36, box_w - 10, first, routed[g], per - routed[g]))
        first += routed[g]
    rows = -(-n // PER_ROW)
    y_end = 30 + rows * (box_h + 14)
    imb = moe.get("expert_imbalance", 1.0)
    caption = [f"{n} GPUs × {per} expert slots = {E} routed experts" + (f" + {R} redundant" if R else "")
               + (f"; each token goes to {moe['top_k']} of them and back by all-to-all (dispatch, combine)"
                  if dpa > 1 else f"; each token's {moe['top_k']} experts run where they are held, and the layer "
                                  f"ends in the TP all-reduce")]
    if moe.get("two_batch_overlap"):
        caption.append("two-batch overlap: one half-batch's all-to-alls run under the other half's compute")
    if imb > 1:
        caption.append(f"the framed GPU stands for the busiest rank, whose experts see {imb:.2f}× the mean routed "
                       f"tokens: every step waits for it")
    head = svg.legend([("routed expert", EXPERT), ("redundant slot (EPLB)", SPARE), ("busiest rank", BUSY)])
    text = "".join(svg._text(10, y_end + 12 + 16 * i, c, size=11) for i, c in enumerate(caption))
    return svg._svg(y_end + 16 * len(caption) + 12, head + "".join(out) + text,
                    f"experts per GPU: {esc(' '.join(caption))}")
