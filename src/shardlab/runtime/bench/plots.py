"""Pictures of the benchmarks (matplotlib, Agg, imported lazily): busbw vs size with the α–β fits, achieved
FLOP/s vs GEMM size with the fitted efficiency curve."""

from __future__ import annotations

from shardlab.comm.collectives import bus_factor
from shardlab.runtime.bench_matmul import GEMMS
from shardlab.safeout import save_with


def size_ticks(ax, sizes: list[int], most: int = 9) -> None:
    """Ticks at measured sizes (every k-th so at most ``most``), labelled 1 KiB, 64 MiB, ... in the units the
    sizes were given in: binary when they are powers of two, decimal otherwise."""
    from shardlab.units import fmt_bytes

    binary = all(s & (s - 1) == 0 for s in sizes[:-1])
    step = max(1, -(-len(sizes) // most))
    ticks = sizes[::step]
    labels = [fmt_bytes(t, binary=binary).replace(".00 ", " ") for t in ticks]
    ax.set_xticks(ticks, labels, rotation=30 if len(ticks) > 6 else 0)
    ax.minorticks_off()


def plot_collectives(doc: dict, path: str) -> str:
    """busbw vs size per op (log x): measured points and the α–β fit's busbw curve, saved to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from shardlab.calibration import AlphaBetaFit

    n = doc["world_size"]
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, op in enumerate(dict.fromkeys(r["op"] for r in doc["rows"])):
        rows = [r for r in doc["rows"] if r["op"] == op]
        color = f"C{i}"
        ax.plot([r["size_bytes"] for r in rows], [r["busbw_gbps"] for r in rows], "o", color=color,
                label=f"{op} measured")
        fit = doc.get("fits", {}).get(op)
        if fit:
            f = AlphaBetaFit(op, n, fit["alpha_s"], fit["beta_bytes_per_s"], fit["rel_rms"], fit["points"])
            s = np.logspace(np.log10(rows[0]["size_bytes"]), np.log10(rows[-1]["size_bytes"]), 100)
            bus = [bus_factor(op, n) * x / f.predict_s(op, x) / 1e9 for x in s]
            ax.plot(s, bus, "-", color=color, alpha=0.7,
                    label=f"{op} fit: α={f.latency_us:.4g} µs/step, β={f.beta_gbps:.3g} GB/s")
    ax.set_xscale("log")
    size_ticks(ax, sorted({r["size_bytes"] for r in doc["rows"]}))
    ax.set_xlabel("size S (nccl-tests convention: total size of the op)")
    ax.set_ylabel("bus bandwidth (GB/s = 1e9 B/s)")
    ax.set_title(f"{doc.get('backend', '')} collectives on {n} ranks ({doc.get('device', '')}): "
                 f"measured busbw and α–β fit")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    save_with(lambda f: fig.savefig(f, dpi=120), path, "--plot")
    plt.close(fig)
    return path


def plot_matmul(doc: dict, path: str) -> str:
    """Achieved TFLOP/s vs GEMM size n = min(M, N, K) (log x), one colour per GEMM, and the fitted curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from shardlab.calibration import EfficiencyFit

    from shardlab.units import flops_scale

    scale, unit = flops_scale(max(r["tflops"] for r in doc["rows"]))
    fig, ax = plt.subplots(figsize=(8, 5))
    for i, (name, _, _) in enumerate(GEMMS):
        rows = [r for r in doc["rows"] if r["gemm"] == name]
        ax.plot([r["size"] for r in rows], [r["tflops"] * scale for r in rows], "o", color=f"C{i}", alpha=0.8,
                label=f"{name} measured")
    fit = doc.get("fit")
    if fit:
        sizes = [r["size"] for r in doc["rows"]]
        x = np.logspace(np.log10(min(sizes)), np.log10(max(sizes)), 200)
        f = EfficiencyFit(fit["max_fraction"], fit["half_size"], fit["peak_flops"], fit["rel_rms"], fit["points"])
        y = f.predict_flops(x) / 1e12 * scale
        ax.plot(x, y, "k-", label=(f"fit: {fit['max_fraction']:.3g}·n/(n+{fit['half_size']:.3g}) × peak "
                                   f"{fit['peak_tflops'] * scale:.4g} {unit}"))
        ax.axhline(fit["peak_tflops"] * scale, color="grey", ls=":", label=f"peak ({doc.get('accelerator', '')})")
    ax.set_xscale("log")
    ticks = sorted({r["size"] for r in doc["rows"]})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.set_xlabel("GEMM size n = min(M, N, K)")
    ax.set_ylabel(f"achieved {unit}")
    ax.set_title(f"{doc['dtype']} matmul on {doc.get('device_name', doc['device'])}: measured and fitted")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="best", framealpha=0.6)
    fig.tight_layout()
    save_with(lambda f: fig.savefig(f, dpi=120), path, "--plot")
    plt.close(fig)
    return path
