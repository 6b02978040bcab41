"""`shardlab validate --inference`: serving engines against published measurements."""

from __future__ import annotations


def _pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def validate_inference(args):
    import numpy as np

    from shardlab.catalog import get_catalog
    from shardlab.render.table import table
    from shardlab.serving.engines import FITTED, get_engine
    from shardlab.serving.rates import RATE_FIELDS, rates_for
    from shardlab.validation.inference import load_inference_runs
    from shardlab.validation.inference_loso import GOALS, validate

    from shardlab.cli.inference_cmds import finite

    runs = load_inference_runs()
    from shardlab.cli.progress import bar

    from shardlab.validation.inference_folds import load

    n = len({r.source for r in runs}) if runs else 0
    catalog = get_catalog(list(args.catalog))
    committed = load(catalog)               # benchmarks/fit_engines.py's folds, where they were fitted to today's data
    from contextlib import nullcontext

    with (nullcontext(None) if committed else bar(n + 1, "serving fit: the refit, then each source held out",
                                                   unit="fold")) as cb:
        d = validate(catalog, runs, progress=cb, committed=committed)
    refit, v = d["refit"], d["verdict"]
    names = {"tpot": "per-token latency", "ttft": "first-token latency", "throughput": "throughput"}
    rows = []
    for fam in sorted(d["in_sample"]["by_family"]):
        for g in ("tpot", "ttft", "throughput"):
            ins = d["in_sample"]["by_family"][fam].get(g)
            lo = d["loso"]["by_family"][fam].get(g)
            if ins:
                mark = "" if lo["n"] < v["family_min"] else ("meets" if lo["mean_abs_error"] <= GOALS[g] else "MISSES")
                rows.append([fam, names[g], ins["n"], _pct(ins["mean_abs_error"]), _pct(ins["max_abs_error"]),
                             _pct(lo["mean_abs_error"]), _pct(lo["max_abs_error"]), _pct(GOALS[g]), mark])
    by_src: dict = {}
    for r in d["rows"]:
        if r["target"] in ("latency", "throughput") and r["error"] is not None:
            by_src.setdefault((r["source"], r["group"]), []).append((abs(r["error"]), abs(r["loso_error"] or 0)))
    src_rows = [[s, names[g], len(x), _pct(float(np.mean([a for a, _ in x]))), _pct(float(np.mean([b for _, b in x])))]
                for (s, g), x in sorted(by_src.items())]
    outside = [r for r in d["rows"] if r["target"] in ("load", "info") and r["error"] is not None]
    unscored = sum(1 for r in d["rows"] if r["target"] in ("load", "info") and r["error"] is None)
    totals = []
    for g in ("tpot", "ttft", "throughput"):
        ins, lo = d["in_sample"]["by_group"].get(g), d["loso"]["by_group"].get(g)
        if ins:
            totals.append(f"{names[g]} ({ins['n']} measurements): mean |error| {_pct(ins['mean_abs_error'])} in sample, "
                          f"{_pct(lo['mean_abs_error'])} leave-one-source-out")
    for g in ("tpot", "ttft", "throughput"):
        ins, lo = d["in_sample"]["moe"].get(g), d["loso"]["moe"].get(g)
        if ins:
            totals.append(f"mixture of experts, {names[g]} ({ins['n']} measurements, predicted, never fitted: "
                          f"their rates are the dense rows'): mean |error| {_pct(ins['mean_abs_error'])} in sample, "
                          f"{_pct(lo['mean_abs_error'])} leave-one-source-out")
    misses = ", ".join(f"{m['family']} {names[m['group']]} {_pct(m['mean_abs_error'])} (goal {_pct(m['goal'])})"
                       for m in v["family_misses"])
    drift = [f"{g}'s {k}" for g, vals in refit["rates"].items() for k, x in vals.items()
             if abs(x / getattr(rates_for(g), k) - 1) > 0.02]
    drift += [f"{e}'s {k}" for e, vals in refit["engines"].items() for k, x in vals.items()
              if abs(x / getattr(get_engine(e), k) - 1) > 0.02]
    counts = ", ".join(f"{g} {n}" for g, n in sorted(d["rows_per_generation"].items()))
    per_engine = ", ".join(f"{e} {n}" for e, n in sorted(d["rows_per_engine"].items()))
    text = "\n".join([
        table(["family (engine × GPU generation)", "target", "n", "mean |err|", "max", "LOSO mean", "LOSO max", "goal", "target met"],
              rows, title=f"serving model vs {len(runs)} published measurements ({len(d['sources'])} sources; "
                          f"docs/inference.md has every source and assumption)"),
        "", table(["source", "target", "n", "in sample", "leave-one-source-out"], src_rows, title="per source"),
        "", *totals,
        f"targets (leave-one-source-out, every family with at least {v['family_min']} measurements of a target: per-token "
        f"latency and throughput ≤ {_pct(GOALS['tpot'])}, first-token latency ≤ {_pct(GOALS['ttft'])}; no measurement beyond "
        f"{_pct(v['max_error'])}): " + ("met" if v["met"] else "NOT met — " + "; ".join(
            x for x in (f"families over their goal: {misses}" if misses else "",
                        f"worst measurement {_pct(v['worst_abs_error'])}" if v["worst_abs_error"] > v["max_error"] else "") if x)),
        f"outside the targets (moderate load, variable-length offline runs, informational rows): {len(outside)} "
        f"measurements, mean |error| "
        f"{_pct(float(np.mean([abs(r['error']) for r in outside])) if outside else None)}"
        + (f", and {unscored} predicted overloaded (no prediction to score)" if unscored else "") + " (in the --json rows)",
        f"fitted: each GPU generation's {', '.join(RATE_FIELDS)} (shared by every engine; measured values behind them: "
        f"{counts}) and each engine version's {', '.join(FITTED)} (measured values: {per_engine}); leave-one-source-out "
        f"refits all of them without the source, then predicts it ("
        + (f"the committed folds of src/shardlab/validation/inference_crossval.json, written by "
           f"`python benchmarks/fit_engines.py` on {committed['date']} from today's data files"
           if d["folds"] == "committed" else "refitted now") + ")",
        (f"a refit moves {', '.join(drift)} by more than 2% (python benchmarks/fit_engines.py writes them into "
         f"catalog/data/serving_rates.yaml and engines.yaml)" if drift
         else "serving_rates.yaml and engines.yaml hold the values a refit on all rows gives"),
    ])
    doc = {"summary": {"in_sample": d["in_sample"], "leave_one_source_out": d["loso"], "goals": GOALS, "verdict": v},
           "rates": d["values"]["rates"], "engines": d["values"]["engines"], "rows_per_generation": d["rows_per_generation"],
           "rows_per_engine": d["rows_per_engine"],
           "refit": refit, "folds": d["folds"], "rows": d["rows"]}
    return finite(doc), text


_TRAINING_ONLY = (("--framework", "framework"), ("--refit", "refit"), ("--plot", "plot"), ("--model-out", "model_out"))
"""validate flags that belong to the training validation (under --inference the serving fit and its folds are
benchmarks/fit_engines.py's, or refitted where the data changed)."""


def check_inference_flags(args) -> None:
    """One line naming the training-only flags given with --inference."""
    from shardlab.errors import ShardlabError

    bad = [flag for flag, attr in _TRAINING_ONLY if getattr(args, attr, None)]
    if bad:
        raise ShardlabError(f"{', '.join(bad)} belong(s) to the training validation; `validate --inference` reuses the "
                            f"serving folds benchmarks/fit_engines.py commits (refitting where the data changed) and "
                            f"takes --run ID for one measurement: drop {', '.join(bad)}")


def inference_estimate_argv(run, case) -> list[str]:
    """The `shardlab estimate` arguments that state a published serving run: its model, GPU, TP×PP, precision, lengths,
    engine and stated settings, and its load (a static batch, a closed loop of clients, or Poisson arrivals) as
    ``validation.inference.run_mode`` prices it; an offline run in waves (``validation.inference.offline_waves``),
    the static batch of one full wave."""
    from shardlab.validation.inference import offline_waves, run_mode

    c = run.config
    argv = [c["model"], "--inference", "--engine", run.engine, "--gpu", c["gpu"], "--tp", str(c["tp"])]
    if c.get("pp", 1) != 1:
        argv += ["--pp", str(c["pp"])]
    if c.get("ep", 1) != 1:
        argv += ["--ep", str(c["ep"]), *(["--dp-attention"] if c.get("dp_attention") else [])]
        argv += ["--redundant-experts", str(c["redundant_experts"])] if c.get("redundant_experts") else []
        argv += ["--two-batch-overlap"] if c.get("two_batch_overlap") else []
    from shardlab.catalog import get_catalog

    # the row's weights (bf16 when it names none, as run_case prices it) unless they are what estimate takes
    # without --weights: the model's checkpoint type (ModelSpec.checkpoint_weights), else bf16
    weights = c.get("weights") or "bf16"
    if weights != (get_catalog().model(c["model"]).checkpoint_weights or "bf16"):
        argv += ["--weights", weights]
    for key, flag, default in (("group_size", "--group-size", None), ("kv_cache", "--kv-cache-dtype", "bf16"),
                               ("activations", "--activations", None)):
        if c.get(key) not in (None, default):
            argv += [flag, str(c[key])]
    argv += ["--prompt-len", str(c["isl"]), "--output-len", str(c["osl"])]
    if c.get("prefix_hit_rate"):
        argv += ["--prefix-hit-rate", f"{c['prefix_hit_rate']:g}"]
    if c.get("speculative_tokens"):
        argv += ["--speculative-tokens", str(c["speculative_tokens"]), "--draft", c.get("draft", "eagle")]
        if c.get("acceptance_length") is not None:
            argv += ["--acceptance-length", f"{c['acceptance_length']:g}"]
    mode, n = run_mode(run, case.capacity)
    if offline_waves(run, case)[0]:              # an offline run in waves: one full wave is a static batch of C
        mode, n = 0, float(case.capacity)
    argv += (["--batch", str(int(n) * c.get("pp", 1))] if mode == 0 else ["--serve", "--concurrency", str(int(n))] if mode == 1
             else ["--serve", "--arrival-rate", f"{n:g}"])
    for key, flag in (("gpu_memory_utilization", "--gpu-memory-utilization"), ("max_num_seqs", "--max-num-seqs"),
                      ("max_num_batched_tokens", "--max-num-batched-tokens"), ("scheduler_steps", "--scheduler-steps"),
                      ("cuda_graph_max_batch", "--cuda-graph-max-batch")):
        if key in run.settings:
            argv += [flag, f"{run.settings[key]:g}"]
    if run.settings.get("chunked_prefill"):
        argv.append("--chunked-prefill")
    if run.settings.get("sliding_window_cache"):
        argv.append("--sliding-window-cache")
    return argv


def one_inference_run(args):
    """`validate --inference --run ID`: the measurement's source and assumptions, the estimate command that states
    it, and measured vs predicted per metric (committed engine values, and refitted without its source)."""
    import shlex

    from shardlab.catalog import get_catalog
    from shardlab.render.table import kv_lines, table
    from shardlab.validation.inference import load_inference_runs, offline_waves, run_case, run_mode
    from shardlab.validation.inference_loso import validate

    from shardlab.cli.inference_cmds import finite
    from shardlab.cli.validate_cmd import find_run

    runs = load_inference_runs()
    run = find_run(runs, args.run, "published serving measurement",
                   "`shardlab validate --inference --json` lists the ids (rows[].run)")
    catalog = get_catalog(list(args.catalog))
    case = run_case(run, catalog)
    d = validate(catalog, runs, only_source=run.source)
    rows = [r for r in d["rows"] if r["run"] == run.id]
    command = "shardlab estimate " + " ".join(shlex.quote(a) for a in inference_estimate_argv(run, case))
    mode, n = run_mode(run, case.capacity)
    load = (f"a static batch of {n:g}" if mode == 0 else f"a closed loop of {n:g} clients" if mode == 1
            else f"Poisson arrivals at {n:g} requests/s")
    full, last = offline_waves(run, case)
    waves = None
    if full:
        mode, C = 0, case.capacity
        n = float(C)                              # the command's static batch: one full wave
        waves = {"full": full, "size": C, "last": last}
        load = (f"waves: {run.config['requests']:,} requests of one length on an engine that admits a request only "
                f"with its whole output's KV blocks free run as {full} wave(s) of {C:,} and "
                + (f"one of {last:,}" if last else "no partial one")
                + "; each wave a static batch, throughput = requests × output / the waves' time "
                  "(validation.inference.offline_waves; the command below prices one full wave)")
    if run.config.get("phase"):
        load = (f"its {run.config['phase']} phase alone: {'prefill' if run.config['phase'] == 'prefill' else 'decode'}-"
                f"only steps of {n:g} {'prompts' if run.config['phase'] == 'prefill' else 'sequences'} (the estimate's "
                f"{run.config['phase']} step of --batch {n:g})")
    fmt = lambda m, x: "-" if x is None else (f"{x:,.4g} /s" if m.endswith("_per_s") else f"{1e3 * x:,.4g} ms")  # noqa: E731
    pct = lambda x: "-" if x is None else f"{100 * x:+.1f}%"  # noqa: E731
    tab = [[r["metric"], r["stat"], fmt(r["metric"], r["measured"]), fmt(r["metric"], r["predicted"]), pct(r["error"]),
            fmt(r["metric"], r["loso_predicted"]), pct(r["loso_error"])] for r in rows]
    where = {"latency": "a latency target row (batch-1/small-batch: at most 16 requests in flight)",
             "throughput": "a throughput target row (maximum throughput)",
             "load": "outside the targets (moderate load)", "info": "informational (outside the targets and the fit)"}
    doc = {"id": run.id, "source": run.source, "engine": run.engine, "citation": run.citation, "tag": run.tag,
           "target": run.target, "settings": {k: v for k, v in run.config.items() if k not in ("id", "assumed")},
           "engine_settings": run.settings, "assumed": run.assumed, "load": {"mode": ("batch", "concurrency", "rate")[mode],
                                                                           "value": n},
           "command": command, "waves": waves, "metrics": rows}
    text = "\n".join([
        f"published serving measurement {run.id} ({run.engine}; {where[run.target]})",
        kv_lines([("source", f"{run.citation} [{run.tag}]"), ("assumed", run.assumed or "nothing beyond the source"),
                  ("priced as", f"one replica of {case.layout_label} under {load}; "
                                f"{case.blocks.num_blocks:,} KV blocks, up to {case.capacity:,} sequences")], indent="  "),
        "", ("the same estimate from the command line (its steady-state means are the predictions below):" if mode
              else "the same estimate from the command line (one full wave's static batch; the waves' throughput is the "
                   "prediction below):" if waves else
              "the same estimate from the command line (its prefill, per-token and request times and tokens/s are "
              "the predictions below):"), f"  {command}",
        "", table(["metric", "statistic", "measured", "predicted", "error", "out of sample", "error"], tab,
                  title=f"measured vs predicted: with the committed engine values, and refitted without source {run.source}"),
    ])
    return finite(doc), text
