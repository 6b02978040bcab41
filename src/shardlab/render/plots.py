"""Pictures (PNG or SVG by file suffix). matplotlib is imported inside each function, with the Agg
backend, so importing this module costs nothing and no display is needed."""

from __future__ import annotations

from pathlib import Path

from shardlab.errors import ShardlabError
from shardlab.safeout import save_with

PASS_COLORS = {"F": "#4C72B0", "B": "#DD8452", "W": "#55A868"}
"""Forward blue, backward orange, weight-gradient green (colour-blind safe 'deep' palette)."""

CHUNK_HATCHES = ("", "//", "..", "xx", "\\\\", "++")
"""Hatching per model chunk of an interleaved schedule (chunk 0 plain); it repeats after six chunks."""


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def check_picture_path(path: str, suffixes: tuple[str, ...] = (".png", ".svg")) -> Path:
    """The path to save to; a ShardlabError when the suffix is not one of ``suffixes`` or the folder is missing.
    Checked before a long measurement or search, not after it."""
    from shardlab.safeout import check_output_path

    p = Path(path)
    if p.suffix.lower() not in suffixes:
        names = ", ".join(suffixes[:-1]) + f" or {suffixes[-1]}" if len(suffixes) > 1 else suffixes[0]
        raise ShardlabError(f"cannot save a picture as '{path}': use a {names} file name")
    return check_output_path(p, "--plot")


MEASURED_PLOT_SUFFIXES = (".png", ".svg", ".pdf")
"""What `bench` and `run infer --sweep` save their plots as (matplotlib by suffix)."""


def pipeline_timeline(res, path: str, title: str | None = None, subtitle: str = "",
                      stage_notes: dict[int, str] | None = None) -> Path:
    """Gantt chart of a simulated pipeline step: one row per rank (rank 0 on top), one box per pass,
    labelled with its micro-batch when there is room; with v model chunks per rank each chunk has its own
    hatching (chunk 0 plain)."""
    import numpy as np
    from matplotlib import patheffects
    from matplotlib.collections import PolyCollection
    from matplotlib.patches import Patch

    p_out = check_picture_path(path)
    plt = _plt()
    t = res.timeline
    width = min(18.0, max(10.0, 0.25 * res.microbatches * res.vpp + 6))
    fig, ax = plt.subplots(figsize=(width, 1.4 + 0.42 * res.stages + 1.2))
    kinds = np.asarray(t["kind"])
    for k, name in enumerate("FBW"):
        sel = kinds == k
        if not sel.any():
            continue
        x0, x1, y = t["start_s"][sel], t["end_s"][sel], t["stage"][sel].astype(float)
        verts = np.stack([np.stack([x0, y - 0.4], 1), np.stack([x1, y - 0.4], 1),
                          np.stack([x1, y + 0.4], 1), np.stack([x0, y + 0.4], 1)], 1)
        chunk = t["chunk"][sel] % len(CHUNK_HATCHES)
        for c, hatch in enumerate(CHUNK_HATCHES):
            mask = chunk == c
            if mask.any():
                ax.add_collection(PolyCollection(verts[mask], facecolors=PASS_COLORS[name], edgecolors="white",
                                                 linewidths=0.5, hatch=hatch or None))
    n_boxes = len(kinds)
    if n_boxes <= 1200:
        fs = 7 if res.microbatches * res.vpp <= 32 else 5
        axes_pts = 0.88 * width * 72          # the axes take ~88% of the figure's width once labelled
        halo = {k: [patheffects.withStroke(linewidth=2, foreground=PASS_COLORS[n])] for k, n in enumerate("FBW")}
        for s, kd, j, a, b in zip(t["stage"], kinds, t["microbatch"], t["start_s"], t["end_s"]):
            # a digit is ~0.6 em wide: write the number where it fits with a little margin; a halo in the
            # box's colour keeps it legible over hatching
            if (b - a) / res.step_time_s * axes_pts > fs * 0.62 * len(str(j)) + 3:
                ax.text((a + b) / 2, s, str(j), ha="center", va="center", fontsize=fs, color="white",
                        path_effects=halo[int(kd)])
    ax.set_xlim(0, res.step_time_s)
    ax.set_ylim(res.stages - 0.5, -0.5)
    ax.set_yticks(range(res.stages))
    notes = stage_notes or {}
    ax.set_yticklabels([f"stage {r}" + (f"\n{notes[r]}" if r in notes else "") for r in range(res.stages)] if res.stages <= 32 else
                       [f"{r}" if r % max(1, res.stages // 16) == 0 else "" for r in range(res.stages)])
    ax.set_xlabel("time (s)")
    handles = [Patch(color=PASS_COLORS["F"], label="forward"),
               Patch(color=PASS_COLORS["B"], label="backward" + (" (input gradient)" if res.schedule == "zb-h1" else "")),
               Patch(facecolor="white", edgecolor="#999999", label="idle (bubble)")]
    if res.schedule == "zb-h1":
        handles.insert(2, Patch(color=PASS_COLORS["W"], label="weight gradient"))
    if res.vpp > 1:
        for c in range(min(res.vpp, len(CHUNK_HATCHES))):
            handles.append(Patch(facecolor="#bbbbbb", hatch=CHUNK_HATCHES[c] or None, edgecolor="white",
                                 label=f"model chunk {c}"))
        if res.vpp > len(CHUNK_HATCHES):
            handles.append(Patch(facecolor="white", edgecolor="white", label=f"(hatching repeats every {len(CHUNK_HATCHES)} chunks)"))
    # the legend sits a fixed distance under the axis (in inches, not a share of a tall figure's height)
    fig_h = fig.get_size_inches()[1]
    fig.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=min(len(handles), 8),
               frameon=False, fontsize=9)
    legend_rows = -(-len(handles) // 8)
    ax.set_title((title or f"{res.schedule}: {res.stages} stages, {res.microbatches} micro-batches"
                  + (f", v = {res.vpp}" if res.vpp > 1 else "") + f" — bubble {100 * res.bubble_fraction:.1f}% of the step")
                 + (f"\n{subtitle}" if subtitle else ""), fontsize=10, loc="left")
    ax.grid(axis="x", color="#eeeeee", zorder=0)
    ax.set_axisbelow(True)
    fig.tight_layout(rect=(0, (0.1 + 0.3 * legend_rows) / fig_h, 1, 1))
    save_with(lambda f: fig.savefig(f, dpi=130), p_out, "--plot")
    plt.close(fig)
    return p_out


def comm_sweep(series: list[dict], path: str, op: str, ranks: int, subtitle: str = "",
               dashed: str = "link β (line rate × efficiency)") -> Path:
    """Time and busbw against message size, one line per link.

    ``series``: [{"label", "sizes_bytes", "time_s", "busbw_gbps", "crossover_bytes", "beta_gbps"}]; the
    crossover (latency = bandwidth term) is marked on each line and the link's achievable bandwidth β drawn
    dashed on the busbw panel.
    """
    import numpy as np

    p_out = check_picture_path(path)
    plt = _plt()
    fig, (ax_t, ax_b) = plt.subplots(1, 2, figsize=(13, 5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, s in enumerate(series):
        c = colors[i % len(colors)]
        x = np.asarray(s["sizes_bytes"], dtype=float)
        ax_t.loglog(x, s["time_s"], "-o", ms=3, color=c, label=s["label"])
        ax_b.semilogx(x, s["busbw_gbps"], "-o", ms=3, color=c, label=s["label"])
        xc = s["crossover_bytes"]
        if x[0] <= xc <= x[-1]:
            tc = float(np.interp(np.log(xc), np.log(x), s["time_s"]))
            bc = float(np.interp(np.log(xc), np.log(x), s["busbw_gbps"]))
            ax_t.plot([xc], [tc], "D", color=c, ms=8, mec="black")
            ax_b.plot([xc], [bc], "D", color=c, ms=8, mec="black")
        if s.get("beta_gbps"):
            ax_b.axhline(s["beta_gbps"], color=c, ls="--", lw=1, alpha=0.6)
    ax_t.set_xlabel("message size S (bytes)")
    ax_t.set_ylabel("time of one call (s)")
    ax_t.set_title(f"{op} time, n = {ranks}", loc="left")
    ax_b.set_xlabel("message size S (bytes)")
    ax_b.set_ylabel("bus bandwidth (GB/s, nccl-tests busbw)")
    ax_b.set_title(f"{op} busbw; dashed: {dashed}", loc="left")
    ax_b.set_ylim(bottom=0)
    for ax in (ax_t, ax_b):
        ax.grid(True, which="major", color="#dddddd")
    ax_t.legend(title="link (◆ = latency/bandwidth crossover)", fontsize=9, title_fontsize=9)
    fig.suptitle(f"α–β model of {op} on {ranks} ranks" + (f" — {subtitle}" if subtitle else ""), fontsize=11)
    fig.tight_layout()
    save_with(lambda f: fig.savefig(f, dpi=130), p_out, "--plot")
    plt.close(fig)
    return p_out


def _diagonal(ax, vals: list, pad: float, bands: tuple[float, float]):
    """Log-log axes with the y = x line and a dashed and a dotted ± band over the values' range; returns the x ends."""
    import numpy as np

    xs = np.array([min(vals) / pad, max(vals) * pad])
    ax.plot(xs, xs, color="black", lw=0.8)
    for band, style in zip(bands, ("--", ":")):
        ax.plot(xs, xs * (1 + band), color="grey", lw=0.7, ls=style, label=f"±{band:.0%}")
        ax.plot(xs, xs * (1 - band), color="grey", lw=0.7, ls=style)
    ax.set_xscale("log")
    ax.set_yscale("log")
    return xs


def predicted_vs_measured(runs: list[dict], path: str, title: str = "shardlab: predicted vs published training throughput") -> Path:
    """Log-log scatter of predicted against measured throughput per GPU, one colour per family, one panel per metric
    (tokens/s; TFLOP/s); leave-one-source-out predictions filled, in-sample hollow, runs outside the target as
    crosses; the ±7% and ±20% bands drawn."""
    p = check_picture_path(path)
    plt = _plt()
    fams = sorted({r["family"] for r in runs})
    colour = {f: plt.get_cmap("tab10")(i % 10) for i, f in enumerate(fams)}
    panels = [("tokens_per_s_per_gpu", "tokens/s per GPU"), ("tflops_per_gpu", "TFLOP/s per GPU")]
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.8), dpi=120)
    for ax, (metric, label) in zip(axes, panels):
        rs = [r for r in runs if r["metric"] == metric]
        if not rs:
            ax.set_visible(False)
            continue
        for fam in fams:
            fr = [r for r in rs if r["family"] == fam]
            if not fr:
                continue
            tgt = [r for r in fr if r["in_target"]]
            info = [r for r in fr if not r["in_target"]]
            if tgt:
                m = [r["measured"] for r in tgt]
                ax.scatter(m, [r["predicted"] for r in tgt], s=30, facecolors="none", edgecolors=colour[fam], lw=1.1)
                ax.scatter(m, [r["loso_predicted"] for r in tgt], s=18, color=colour[fam], label=f"{fam} ({len(tgt)})")
            if info:
                ax.scatter([r["measured"] for r in info], [r["predicted"] for r in info], s=30, marker="x",
                           color=colour[fam], label=f"{fam}: informational ({len(info)})")
        xs = _diagonal(ax, [r["measured"] for r in rs] + [r["predicted"] for r in rs], 1.4, (0.07, 0.20))
        from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

        lo, hi = float(min(xs)), float(max(xs))
        for axis in (ax.xaxis, ax.yaxis):
            if hi / lo < 100:   # under two decades: label 1-2-5 steps, not only the powers of ten
                axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"measured {label}")
        ax.set_ylabel(f"predicted {label}")
        ax.set_title(f"{label}: {sum(r['in_target'] for r in rs)} target runs, "
                     f"{sum(not r['in_target'] for r in rs)} informational", fontsize=9)
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(True, which="major", lw=0.3, alpha=0.5)
    fig.suptitle(title + "\nfilled: leave-one-source-out (refitted without the run's source); hollow: in sample; "
                         "×: informational runs (not in the accuracy targets; in sample)", fontsize=10)
    fig.tight_layout()
    save_with(fig.savefig, p, "--plot")
    plt.close(fig)
    return p


def serving_predicted_vs_measured(rows: list[dict], path: str) -> Path:
    """Log-log scatter of ``validate --inference`` rows (target rows only): leave-one-source-out prediction against
    the measured value, one panel per target group, one colour per family (engine version × GPU generation), with
    the ±10% and ±35% bands."""
    p = check_picture_path(path)
    plt = _plt()
    rows = [r for r in rows if r["target"] in ("latency", "throughput") and r.get("loso_predicted")]
    fams = sorted({r["family"] for r in rows})
    colour = {f: plt.get_cmap("tab20")(i % 20) for i, f in enumerate(fams)}
    panels = [("throughput", "output tokens/s (or requests/s; input tokens/s of prefill-only rows)"), ("tpot", "per-token latency, s (static batch: e2e)"),
              ("ttft", "first-token latency, s")]
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.8), dpi=110)
    for ax, (group, label) in zip(axes, panels):
        rs = [r for r in rows if r["group"] == group]
        if not rs:
            ax.set_visible(False)
            continue
        for fam in fams:
            fr = [r for r in rs if r["family"] == fam]
            if fr:
                ax.scatter([r["measured"] for r in fr], [r["loso_predicted"] for r in fr], s=16, color=colour[fam],
                           label=f"{fam} ({len(fr)})")
        _diagonal(ax, [r["measured"] for r in rs] + [r["loso_predicted"] for r in rs], 1.3, (0.10, 0.35))
        ax.set_xlabel(f"measured {label}")
        ax.set_ylabel("predicted, leave-one-source-out")
        ax.set_title(f"{ {'throughput': 'throughput', 'tpot': 'per-token latency', 'ttft': 'first-token latency'}[group]}: "
                     f"{len(rs)} measurements", fontsize=9)
        ax.legend(fontsize=6, loc="upper left")
        ax.grid(True, which="major", lw=0.3, alpha=0.5)
    fig.suptitle("shardlab: serving predictions (refitted without each measurement's source) vs published measurements",
                 fontsize=10)
    fig.tight_layout()
    save_with(fig.savefig, p, "--plot")
    plt.close(fig)
    return p
