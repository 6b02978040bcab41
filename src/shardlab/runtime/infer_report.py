"""What `shardlab run infer` prints and plots: one run's tokens, parity and bytes against the memory model, and a TP
sweep's table and speedup plot (``runtime.infer`` runs them)."""

from __future__ import annotations


def plot_speedup(points: list[dict], path: str, model: str, cores: int | None) -> str:
    import matplotlib

    from shardlab.safeout import save_with

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tps = [p["tp"] for p in points]
    sp = [p["speedup"] for p in points]
    fig, ax = plt.subplots(figsize=(6.8, 4.4), dpi=120)
    lo = min(min(sp), 1.0) / 2
    ax.axhspan(lo, 1.0, color="tab:red", alpha=0.07, lw=0)
    ax.text(min(tps) / 1.3, lo * 1.08, "slower than T = 1", ha="left", va="bottom", fontsize=8, color="tab:red")
    ax.plot(tps, tps, "--", color="grey", label="ideal (speedup = T)")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.plot(tps, sp, "o-", color="tab:blue", lw=2, label="measured (latency at T = 1 / latency at T)")
    for t, s_, p in zip(tps, sp, points):
        # to the right of the point: off the 1× line, the ideal diagonal and the measured line's other segments
        ax.annotate(f"{s_:.2f}×\n{p['latency_per_token_s'] * 1e3:.1f} ms/token", (t, s_), textcoords="offset points",
                    xytext=(8, 0), ha="left", va="center", fontsize=8, linespacing=1.1,
                    bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85})
    ax.set_yscale("log", base=2)
    ax.set_ylim(lo, max(max(tps), max(sp)) * 1.6)
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}×"))
    ax.set_xscale("log", base=2)
    ax.set_xticks(tps, [str(t) for t in tps])
    ax.set_xlim(min(tps) / 1.35, max(tps) * 2.0)      # room for the last point's label
    ax.set_xlabel("tensor-parallel ranks T")
    ax.set_ylabel("decode speedup over T = 1 (log scale)")
    slow = [p["tp"] for p in points if p["speedup"] < 1]
    note = f"T = {', '.join(map(str, slow))} slower than one rank" if slow else "every T faster than one rank"
    ax.set_title(f"Greedy decoding with a KV cache, model {model}, {cores} CPU cores, gloo\n{note}", fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    save_with(fig.savefig, path, "--plot")
    plt.close(fig)
    return path


def render_infer(doc: dict) -> str:
    from shardlab.render.table import table
    from shardlab.runtime.observe.report import slowest_line
    from shardlab.units import fmt_bytes, fmt_time

    from shardlab.runtime.train_report import checkpoint_lines

    p = doc["predicted"]
    split = all(r.get("time_split") for r in doc["ranks"])
    pp = doc.get("pp", 1) > 1
    rows = [[r["rank"], *([r["stage"]] if pp else []), f"{r['weight_bytes']:,}",
             f"{p['weight_bytes_per_stage'][r['stage']]:,}", f"{r['kv_cache_bytes']:,}",
             f"{p['kv_blocks']['blocks'] * p['kv_blocks']['bytes_per_block_per_stage'][r['stage']]:,}",
             fmt_time(r["prefill_s"]),
             *([fmt_time(r["time_split"][k]) for k in ("compute_s", "collectives_s", "wait_s")] if split else []),
             fmt_time(r["latency_per_token_s"])] for r in doc["ranks"]]
    times = (f"; per token, mean of the {min(r['time_split']['steps'] for r in doc['ranks'])} decoded token(s) after "
             f"the first: compute + in collectives + waiting (the ranks' per-token records)" if split else
             "; per token: mean of the decoded tokens after the first")
    if doc.get("matches_transformers") is not None:
        parity = f"identical to transformers' generate on the same checkpoint: {doc['matches_transformers']}"
    elif doc.get("matches_tp1") is not None:
        parity = f"identical to tp 1 (same model in one process): {doc['matches_tp1']}"
    else:
        parity = "not compared (add --check-parity to compare with transformers' generate)"
    kb = p["kv_blocks"]
    out = [f"shardlab run infer: {doc['model']} on tp {doc['tp']}{' x pp ' + str(doc['pp']) if pp else ''} "
           f"({doc['strategy']}), {len(doc['tokens'])} new tokens, {doc['cached_tokens']} cached",
           *checkpoint_lines(doc), f"tokens: {doc['tokens']}", f"{parity}; all ranks agree: {doc['ranks_agree']}", "",
           table(["rank", *(["stage"] if pp else []), "weights B meas", "pred", "KV cache B meas", "pred", "prefill",
                  *(["compute", "in collectives", "waiting"] if split else []), "per token"], rows,
                 title=f"per rank: memory measured (tensor storages) vs predicted (shardlab.memory.inference, fp32){times}")]
    if split:
        out.append("  compute: the rank's own work on a token minus time blocked in collectives; in collectives: the "
                   "time the least-waiting rank spent in them (the transfer); waiting: for other ranks, inside the "
                   "collectives")
    out.append(f"paged KV cache: {kb['blocks']} block(s) of {kb['block_size']} tokens per rank for {doc['cached_tokens']} "
               f"tokens, {kb['bytes_per_block']:,} B per block on a rank (measured "
               f"{doc['ranks'][0]['kv_blocks']['bytes_per_block']:,} B; predicted: memory.inference.kv_blocks' block_size "
               f"x KV bytes per token)")
    out.append(f"memory {'matches the model exactly' if doc['memory_exact'] else 'DIFFERS from the model'}; "
               f"per-token latency (the longest over ranks): {fmt_time(doc['latency_per_token_s'])}; "
               f"weights {fmt_bytes(p['weight_bytes'])}/rank")
    line = slowest_line(doc.get("slowest"), "token") if doc["tp"] > 1 else None
    if line:
        out.append(line)
    if doc.get("observability"):
        from shardlab.runtime.observe.report import render_observability

        out += ["", render_observability(doc["observability"], unit="token")]
    return "\n".join(out)


def render_sweep(doc: dict) -> str:
    from shardlab.render.table import table
    from shardlab.units import fmt_time

    rows = [[p["tp"], fmt_time(p["latency_per_token_s"]), f"{p['speedup']:.2f}×", p["tokens_identical_to_tp1"],
             f"{p['weight_bytes']:,}", f"{p['kv_cache_bytes']:,}", "yes" if p["memory_exact"] else "NO"] for p in doc["points"]]
    out = [table(["T", "per token", "speedup", "same tokens", "weights B/rank", "KV B/rank", "memory = model"], rows,
                 title=f"tensor-parallel decoding sweep, {doc['model']} ({doc['strategy']}), {doc['cpu_cores']} CPU cores"),
           f"swept {doc.get('tp_values_from', '')}"]
    if any(p["speedup"] < 1 for p in doc["points"]):
        out.append(f"speedup below 1 means slower: on {doc['cpu_cores']} cores a small model's decode step is dominated by "
                   f"two all-reduces per block, and more ranks than cores time-share the CPU")
    if doc["plot"]:
        out.append(f"plot: {doc['plot']}")
    return "\n".join(out)
