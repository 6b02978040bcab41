"""shardlab validate (training): predicted vs published throughput, in sample and leave-one-source-out, by family."""

from __future__ import annotations


def add_validate_args(p) -> None:
    g = p.add_argument_group("validate (training)")
    g.add_argument("--framework", default=None, metavar="NAME", help="only the runs of this framework (e.g. deepspeed)")
    g.add_argument("--refit", action="store_true",
                   help="refit the efficiencies and every leave-one-source-out fold now (a few minutes) instead of "
                        "using the committed fit (catalog/data/fitted.yaml) and folds (validation/crossval.yaml)")
    g.add_argument("--plot", metavar="FILE.png", default=None,
                   help="predicted vs measured, log-log, one colour per family (needs matplotlib)")
    g.add_argument("--run", metavar="ID", default=None,
                   help="one run in detail: its source and settings, the `shardlab estimate` command that states them, "
                        "and that estimate's breakdown (ids: `shardlab validate --json`); with --inference, one serving "
                        "measurement: measured vs predicted per metric, in sample and out of sample (ids: rows[].run of "
                        "`shardlab validate --inference --json`)")
    g.add_argument("--model-out", metavar="FILE.yaml", default=None,
                   help="with --run: write the run's model (a shape from its source, not a catalog id) to this file, "
                        "for the printed command")


def cmd_validate_training(args, catalog):
    from shardlab.errors import ShardlabError
    from shardlab.render.table import table
    from shardlab.validation import compare, load_runs
    from shardlab.validation.report import TARGET_MAX, TARGET_MEAN, TARGET_MIN_RUNS, family_accuracy, family_table, \
        load_folds, loso_comparisons

    runs = load_runs()
    if args.run:
        given = [f for f, on in (("--plot", args.plot), ("--refit", args.refit), ("--framework", args.framework)) if on]
        if given:            # they shape the whole table; one run is shown with the committed fit and its own framework
            raise ShardlabError(f"{', '.join(given)} {'goes' if len(given) == 1 else 'go'} with the whole set, not "
                                f"--run {args.run}; drop {'it' if len(given) == 1 else 'them'} (the run states its "
                                f"framework and is shown with the committed fit)")
        return _one_run(args, catalog, runs)
    if args.model_out:
        raise ShardlabError("--model-out goes with --run ID (it writes that run's model)")
    folds, full = None, None
    if args.refit:
        from shardlab.cli.progress import bar
        from shardlab.validation.fit import cross_validate

        n = len({r.source for r in runs if not r.informational})
        # the full fit and the n leave-one-source-out folds are solved together, once per value of the fit's switch
        # and the folds twice (validation.fit._solve_switched): one bar over all their iterations
        with bar(160, f"refit + {n} leave-one-source-out folds", unit="iteration") as cb:
            full, folds = cross_validate(runs, catalog, progress=cb)
    if args.framework:
        catalog.framework(args.framework)   # unknown names: one line with the choices
        runs = [r for r in runs if r.framework == args.framework.lower()]
        if not runs:
            raise ShardlabError(f"no published run in the validation set used framework '{args.framework}'; "
                                f"see `shardlab validate` for the frameworks present")
    ins = compare(runs, catalog, params=full)
    loso = loso_comparisons(runs, catalog, folds if folds is not None else load_folds())
    lo = {c.run.id: c for c in loso}
    rows, docs = [], []
    for c in ins:
        cfg, r = c.run.config, c.run
        unit = "tok/s/GPU" if r.metric == "tokens_per_s_per_gpu" else f"TFLOP/s ({r.convention})"
        rows.append([r.id, c.family, f"{cfg['gpus']}×{r.gpu}", unit, f"{r.measured:,.4g}", f"{c.predicted:,.4g}",
                     f"{100 * c.error:+.1f}%", f"{100 * lo[r.id].error:+.1f}%" if not r.informational else "-",
                     "info" if r.informational else ""])
        docs.append({"id": r.id, "family": c.family, "framework": r.framework, "gpu": r.gpu, "gpus": cfg["gpus"],
                     "source": r.source, "citation": r.citation, "metric": r.metric, "convention": r.convention,
                     "measured": r.measured, "predicted": c.predicted, "error": c.error,
                     "loso_predicted": None if r.informational else lo[r.id].predicted,
                     "loso_error": None if r.informational else lo[r.id].error,
                     "predicted_step_time_s": c.predicted_step_time_s, "measured_step_time_s": r.measured_step_time_s,
                     "in_target": not r.informational, "assumed": cfg.get("assumed", "")})
    fams = family_accuracy(ins, loso)
    doc = {"runs": docs, "families": [f.to_dict() for f in fams],
           "targets": {"loso_mean_abs_error": TARGET_MEAN, "loso_max_abs_error": TARGET_MAX,
                       "min_runs_per_family": TARGET_MIN_RUNS},
           "summary": {"runs": len(docs), "runs_in_target": sum(d["in_target"] for d in docs),
                       "families": len(fams), "sources": len({r.source for r in runs}),
                       "fit": "refitted now" if args.refit else "committed (catalog/data/fitted.yaml, validation/crossval.yaml)"}}
    text = "\n".join([
        table(["run", "family", "hardware", "metric", "measured", "predicted", "error", "out of sample", ""], rows,
              title="predicted vs published throughput (docs/validation.md has every source and assumption)"),
        "", family_table(ins, loso), "",
        "out of sample = leave-one-source-out: predicted with the efficiencies refitted without that run's source",
        "info = reported, outside the target (the run's `assumed` says why: settings not published, or an outlier by its table's own numbers)",
    ])
    if args.plot:
        from shardlab.render.plots import predicted_vs_measured

        predicted_vs_measured(docs, args.plot)
        doc["plot"] = args.plot
        text += f"\nplot: {args.plot}"
    return doc, text


def find_run(runs, wanted: str, what: str, listing: str):
    """The run whose id is ``wanted``, or one line naming up to 8 ids that contain it (or where the ids are listed)."""
    from shardlab.errors import ShardlabError

    byid = {r.id: r for r in runs}
    if wanted in byid:
        return byid[wanted]
    close = sorted(i for i in byid if wanted.lower() in i.lower())[:8]
    raise ShardlabError(f"no {what} '{wanted}' in the validation set; "
                        + (f"did you mean {', '.join(close)}?" if close else listing))


def _one_run(args, catalog, runs):
    """`validate --run ID`: the run, the estimate command that states its settings, its breakdown, measured vs predicted."""
    import shlex

    from shardlab.estimate.report import render_estimate
    from shardlab.render.table import kv_lines
    from shardlab.validation import compare
    from shardlab.validation.replay import estimate_argv, run_model_yaml
    from shardlab.validation.report import load_folds, loso_comparisons

    run = find_run(runs, args.run, "published run", "`shardlab validate --json` lists the ids")
    c = compare([run], catalog)[0]
    lo = None if run.informational else loso_comparisons([run], catalog, load_folds())[0]
    yml = run_model_yaml(run, catalog)
    if yml and args.model_out:
        from shardlab.safeout import write_text

        write_text(args.model_out, yml, "--model-out")
    argv = estimate_argv(run, catalog, args.model_out)
    command = "shardlab estimate " + " ".join(shlex.quote(a) for a in argv)
    unit = "tokens/s per GPU" if run.metric == "tokens_per_s_per_gpu" else f"TFLOP/s per GPU ({run.convention} FLOPs)"
    doc = {"id": run.id, "source": run.source, "citation": run.citation, "framework": run.framework,
           "family": c.family, "settings": {k: v for k, v in run.config.items() if k not in ("assumed", "id")},
           "assumed": run.config.get("assumed", ""), "metric": run.metric, "measured": run.measured,
           "predicted": c.predicted, "error": c.error, "in_target": not run.informational,
           "loso_predicted": lo.predicted if lo else None, "loso_error": lo.error if lo else None,
           "command": command, "model_yaml": yml, "model_file": args.model_out, "estimate": c.estimate.to_dict()}
    lines = [f"published run {run.id} ({c.family}{'' if not run.informational else ', informational'})",
             kv_lines([("source", run.citation), ("assumed", run.config.get("assumed", "") or "nothing beyond the source")],
                      indent="  "), "",
             "the same estimate from the command line:", f"  {command}"]
    if yml:
        lines += ["", f"its model ({'written to ' + args.model_out if args.model_out else 'save as ' + run.id + '.yaml, or pass --model-out FILE'}):",
                  *("  " + ln for ln in yml.rstrip().splitlines())]
    lines += ["", render_estimate(c.estimate), "",
              kv_lines([("measured", f"{run.measured:,.4g} {unit}"),
                        ("predicted", f"{c.predicted:,.4g} ({100 * c.error:+.1f}%), with the committed fit"),
                        ("out of sample", f"{lo.predicted:,.4g} ({100 * lo.error:+.1f}%), fit without source {run.source}"
                         if lo else "- (informational run: outside the target and the fit)")])]
    return doc, "\n".join(lines)


def cmd_validate(args):
    if getattr(args, "run", None) is not None and not args.run.strip():
        from shardlab.errors import ShardlabError

        listing = "validate --inference --json" if getattr(args, "inference", False) else "validate --json"
        raise ShardlabError(f"--run needs a run id (`shardlab {listing}` lists them); drop --run for all runs")
    if getattr(args, "plot", None):                 # fail before a refit of a minute, not after it
        from shardlab.render.plots import check_picture_path

        check_picture_path(args.plot)
    if getattr(args, "model_out", None):
        from shardlab.safeout import check_output_path

        check_output_path(args.model_out, "--model-out")
    if args.inference:
        from shardlab.cli.inference_cmds import validate_inference_cmd

        return validate_inference_cmd(args)
    from shardlab.cli.plan_cmds import _catalog

    return cmd_validate_training(args, _catalog(args))
