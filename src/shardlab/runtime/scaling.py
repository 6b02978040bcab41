"""``shardlab run train --sweep-nproc 1,2,4``: the same strategy at several process counts, measured step time and
throughput beside the step-time model's prediction at each count (curriculum item 31: watch the scaling).

The global batch stays fixed (strong scaling), so ideal scaling halves the step time each time the processes
double; the table shows how far the run and the prediction are from that, and from each other.
"""

from __future__ import annotations

from dataclasses import replace


def run_scaling(req, nprocs: tuple[int, ...]) -> dict:
    """Run ``req`` (a TrainRequest) once per process count; gather measured vs predicted per count."""
    from shardlab.errors import ShardlabError
    from shardlab.runtime.train import run_train

    if len(set(nprocs)) != len(nprocs) or len(nprocs) < 2:
        raise ShardlabError("--sweep-nproc needs at least two different process counts, e.g. 1,2")
    points = []
    for n in sorted(nprocs):
        try:
            d = run_train(replace(req, nproc=n))
        except KeyboardInterrupt as e:   # what the sweep had done, for the interrupted document
            e.sweep = {"finished": [p["nproc"] for p in points], "stopped": n, "unit": "nproc"}
            raise
        st = d["step_time"]
        points.append({"nproc": n, "layout": d["layout"], "measured_step_s": st["measured_median_s"],
                       "slowest_rank_step_s": st["slowest_s"], "predicted_step_s": st["predicted_s"],
                       "predicted_from": st["predicted_from"], "error": st["error"], "tokens_per_s": d["tokens_per_s"],
                       "memory_states_exact": d["memory_states_exact"], "losses": d["losses"]})
    base = points[0]
    for p in points:
        k = p["nproc"] / base["nproc"]
        p["measured_speedup"] = base["measured_step_s"] / p["measured_step_s"]
        p["predicted_speedup"] = (base["predicted_step_s"] / p["predicted_step_s"]) if p["predicted_step_s"] else None
        p["measured_efficiency"] = p["measured_speedup"] / k
    import os

    return {"strategy": req.strategy, "model": req.model, "global_batch": req.global_batch, "seq_len": req.seq_len,
            "steps": req.steps, "points": points, "cpu_cores": os.cpu_count()}


def render_scaling(doc: dict) -> str:
    from shardlab.render.table import table
    from shardlab.units import fmt_time

    pc = lambda x: "-" if x is None else f"{100 * x:+.0f}%"  # noqa: E731
    rows = [[p["nproc"], fmt_time(p["measured_step_s"]), fmt_time(p["predicted_step_s"]) if p["predicted_step_s"] else "-",
             pc(p["error"]), f"{p['measured_speedup']:.2f}×",
             f"{p['predicted_speedup']:.2f}×" if p["predicted_speedup"] else "-", f"{100 * p['measured_efficiency']:.0f}%",
             f"{p['tokens_per_s']:,.0f}", "yes" if p["memory_states_exact"] else "NO"] for p in doc["points"]]
    out = [table(["processes", "step measured", "step predicted", "error", "speedup measured", "speedup predicted",
                  "efficiency", "tokens/s", "states exact"], rows,
                 title=f"scaling sweep: {doc['strategy']}, model {doc['model']}, global batch {doc['global_batch']} × "
                       f"{doc['seq_len']} tokens fixed (strong scaling), {doc['cpu_cores']} CPU cores"),
           f"predicted from: {doc['points'][0]['predicted_from']}"]
    over = [p["nproc"] for p in doc["points"] if doc["cpu_cores"] and p["nproc"] > doc["cpu_cores"]]
    if over:
        out.append(f"processes {', '.join(map(str, over))} exceed the {doc['cpu_cores']} cores: they time-share the CPU, "
                   "so measured scaling flattens or reverses there")
    return "\n".join(out)
