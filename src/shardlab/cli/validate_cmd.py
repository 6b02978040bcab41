"""shardlab validate (training): predicted vs published throughput, in sample and leave-one-source-out, by family."""

from __future__ import annotations


def add_validate_args(p) -> None:
    g = p.add_argument_group("validate (training)")
    g.add_argument("--framework", default=None, metavar="NAME", help="only the runs of this framework (e.g. deepspeed)")
    g.add_argument("--refit", action="store_true",
                   help="refit the efficiencies and every leave-one-source-out fold now (about a minute) instead of "
                        "using the committed fit (catalog/data/fitted.yaml) and folds (validation/crossval.yaml)")
    g.add_argument("--plot", metavar="FILE.png", default=None,
                   help="predicted vs measured, log-log, one colour per family (needs matplotlib)")


def cmd_validate_training(args, catalog):
    from shardlab.errors import ShardlabError
    from shardlab.report.table import table
    from shardlab.validation import compare, load_runs
    from shardlab.validation.report import TARGET_MAX, TARGET_MEAN, TARGET_MIN_RUNS, family_accuracy, family_table, \
        load_folds, loso_comparisons

    runs = load_runs()
    folds, full = None, None
    if args.refit:
        from shardlab.validation.fit import cross_validate

        full, folds = cross_validate(runs, catalog)
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
        "info = reported, outside the target (the run's `assumed` says why: settings not published, or flagged by its source)",
    ])
    if args.plot:
        from shardlab.report.plots import predicted_vs_measured

        predicted_vs_measured(docs, args.plot)
        doc["plot"] = args.plot
        text += f"\nplot: {args.plot}"
    return doc, text
