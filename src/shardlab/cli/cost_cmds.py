"""shardlab cost: dollars before launch, from a plan (its time to train) or from GPUs × hours × price. The budget
ceiling and the ledger of every run (`guard`, `ledger`) are in ``cli.ledger_cmds``."""

from __future__ import annotations

import argparse

from shardlab.cli.common import BOUNDED, add_estimate_args, add_output_args
from shardlab.errors import ShardlabError


def price_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--price", type=BOUNDED["price"], default=None, metavar="USD",
                   help="USD per GPU-hour (replaces the price catalog)")
    p.add_argument("--provider", default=None, help="catalog provider, e.g. aws, gcp, runpod-secure (default: 'default')")
    p.add_argument("--spot", action="store_true", help="the provider's spot price")


def register(sub) -> None:
    p = sub.add_parser("cost", help="what a run will cost, from a plan or from GPUs × hours × price",
                       description="Cost from a plan (MODEL and layout flags as for `shardlab estimate`, with --tokens): "
                                   "time to train × GPUs × price + set-up; or directly from --gpus N --hours H.")
    add_estimate_args(p)
    from shardlab.cli.common import add_grad_reduce_args

    add_grad_reduce_args(p.add_argument_group("gradient reduction"))
    p.set_defaults(gpu=None, func=cmd_cost)       # --gpu is a label in direct mode; h100-sxm for a plan
    g = p.add_argument_group("cost")
    g.add_argument("--hours", type=BOUNDED["hours"], default=None, help="hours of work (direct mode, with --gpus)")
    price_args(g)
    g.add_argument("--setup-hours", type=BOUNDED["setup_hours"], default=0.0, metavar="S",
                   help="paid hours before the work starts (provisioning, data staging, warm-up; default 0)")
    g.add_argument("--budget", type=BOUNDED["usd"], default=None, metavar="USD", help="compare with a budget")
    add_output_args(p)


def _gpu_label(acc, fallback: str | None) -> str:
    if acc is None:
        return fallback or "GPU"
    name = acc.name
    for prefix in ("NVIDIA ", "AMD ", "GeForce "):
        name = name[len(prefix):] if name.startswith(prefix) else name
    return name


def lookup_gpu(cat, gpu: str | None, given_price: float | None):
    """The catalog accelerator for ``gpu``; with --price an unknown name is only a label (None)."""
    if gpu is None or (given_price is not None and gpu.lower() not in cat.accelerators):
        return None
    return cat.accelerator(gpu)


def _plan_hours(args, cat):
    try:
        from shardlab.cli.plan_cmds import training_estimate_from_args
    except ImportError:
        raise ShardlabError("plan-based cost needs `shardlab estimate`, which this build lacks; "
                            "give --gpus N --hours H instead") from None
    if args.hours is not None:
        raise ShardlabError("give MODEL (the plan's time to train) or --hours, not both")
    from shardlab.cli.common import resolve_gpu

    args.gpu = resolve_gpu(args, cat)       # --gpu, else the --profile's, else h100-sxm (as `shardlab estimate`)
    est = training_estimate_from_args(args, cat)
    if not getattr(est, "train_time_s", None):
        raise ShardlabError("plan-based cost needs the amount of training: add --tokens D (e.g. 300e9 or 15T)")
    return est, est.train_time_s / 3600, est.gpus, est.accelerator


def _refuse_job_file(model) -> None:
    """A shardlab job file given as MODEL: cost takes a model, so say where a job file goes (it read as a broken
    model file: 'not valid YAML/JSON')."""
    from shardlab.cli.from_file import is_job_file

    if is_job_file(model):
        raise ShardlabError(f"{model} is a shardlab job file; cost takes a model: `shardlab estimate {model}` prints "
                            f"its time and GPU-hours, or give `shardlab cost MODEL --tokens N`")


DIRECT_MODE_FLAGS = ("model", "params", "gpus", "gpu", "tokens")
"""Destinations of the plan flags a direct cost uses or answers itself: MODEL and --params choose the plan, --gpus and
--gpu (a label, or the catalog price) are the direct cost's, --tokens has its own refusal."""


def _plan_flags_given(args) -> list[str]:
    """The layout, cluster, workload, framework and recipe flags (`shardlab estimate`'s) given on the command line:
    a value other than the flag's default, or a layout flag written at its default (``common.given_flags``)."""
    from shardlab.cli.common import add_grad_reduce_args

    ref = argparse.ArgumentParser(add_help=False)       # the flags as `register` adds them, with their defaults
    add_estimate_args(ref)
    add_grad_reduce_args(ref)
    written = getattr(args, "given_flags", None) or set()
    out = []
    for a in ref._actions:
        if not a.option_strings or a.dest in DIRECT_MODE_FLAGS or a.dest == argparse.SUPPRESS:
            continue
        if a.dest in written or getattr(args, a.dest, a.default) != a.default:
            flag = max(a.option_strings, key=len)
            out += [] if flag in out else [flag]
    return out


def _refuse_plan_flags(args) -> None:
    """A direct cost (--gpus N --hours H) is GPUs × hours × price: a layout, cluster or workload flag could change
    only hours predicted from a plan, so it is refused, naming the mode where it counts, rather than ignored."""
    given = _plan_flags_given(args)
    if given:
        them = "it" if len(given) == 1 else "them"
        raise ShardlabError(f"{', '.join(given)} cannot change a cost from --gpus N --hours H (GPUs × hours × price): "
                            f"drop {them}, or give MODEL with --tokens D instead of --hours to price the time this "
                            f"layout takes to train")


def cmd_cost(args):
    from shardlab.catalog import get_catalog
    from shardlab.cost.estimate import cost_estimate, sentence
    from shardlab.cost.prices import resolve_price

    planned = args.model is not None or args.params is not None
    # a plan's hardware profile (--profile) is part of its catalog, as for `shardlab estimate`; a direct cost refuses it
    cat = get_catalog(args.catalog, profile=args.profile if planned else None)
    plan = None
    _refuse_job_file(args.model)
    if planned:
        plan, hours, gpus, acc = _plan_hours(args, cat)
    else:
        if args.gpus is None or args.hours is None:
            raise ShardlabError("nothing to cost: give MODEL with --tokens (plan-based), or --gpus N --hours H "
                                "with --gpu GPU or --price USD")
        if args.tokens is not None:
            raise ShardlabError("--tokens needs MODEL (a plan); for a direct cost give --gpus N --hours H")
        _refuse_plan_flags(args)
        hours, gpus, acc = args.hours, args.gpus, lookup_gpu(cat, args.gpu, args.price)
    price = resolve_price(cat, acc.id if acc else None, provider=args.provider, spot=args.spot,
                          given_usd_per_gpu_hour=args.price)
    est = cost_estimate(gpus, hours, price.usd_per_gpu_hour, args.setup_hours, args.budget)
    label = _gpu_label(acc, args.gpu)
    line = sentence(est, label, price_is_estimate=price.estimate, hours_from_plan=plan is not None)
    alternatives = _alternatives(cat, acc, est) if acc is not None else []
    doc = {**est.to_dict(), "price_source": price.source, "gpu": acc.id if acc else args.gpu, "price": price.to_dict(),
           "hours_from": "plan" if plan else "given", "sentence": line, "alternatives": alternatives}
    text = _cost_text(line, est, price, plan, acc, alternatives)
    if plan is not None:
        doc["plan"] = plan.to_dict()
        fits = getattr(plan, "fits", None)       # an estimate says whether its layout fits in GPU memory
        if fits is not None:
            doc["fits"] = bool(fits)
        if fits is False:
            need, have = plan.memory.worst.total / 2**30, acc.memory_bytes / 2**30
            text = (f"DOES NOT FIT: this layout needs {need:,.1f} GiB per GPU of {have:,.1f} GiB, so this prices a run "
                    f"that cannot start; `shardlab plan` with the same model and GPUs finds a layout that fits, or "
                    f"says why none does\n" + text)
    return doc, text


def _alternatives(cat, acc, est) -> list[dict]:
    """The same GPUs and hours at every catalog price for this accelerator."""
    from shardlab.cost.prices import entries_for, price_table

    out = []
    for e in entries_for(price_table(cat), acc.id):
        for kind, p in (("on-demand", e.on_demand_usd_per_gpu_hour), ("spot", e.spot_usd_per_gpu_hour)):
            if p is not None:
                out.append({"provider": e.provider, "kind": kind, "price_per_gpu_hour": p, "usd": est.gpus * p * est.hours,
                            "date": e.date, "estimate": e.estimate, "source": e.source})
    return out


def _cost_text(line, est, price, plan, acc, alternatives) -> str:
    from shardlab.cost.estimate import fmt_hours, fmt_rate, fmt_usd
    from shardlab.render.table import kv_lines, table

    pairs = [("price", f"{fmt_rate(price.usd_per_gpu_hour)}/GPU-h {price.kind}"
                       + (" (an ESTIMATE: inferred, not quoted)" if price.estimate else "")),
             ("price source", price.source)]
    if plan is not None:
        pairs.append(("hours", f"{fmt_hours(est.run_hours)} to train: the estimate's time to train (an estimate, "
                               f"{getattr(getattr(plan, 'workload', None), 'framework', 'megatron-lm')} framework; --framework to change)"))
    if est.setup_hours:
        pairs.append(("set-up", f"{fmt_hours(est.setup_hours)} paid before the work starts"))
    lines = [line, "", kv_lines(pairs)]
    if alternatives:
        rows = [[a["provider"] + (" (est.)" if a["estimate"] else ""), a["kind"], fmt_rate(a["price_per_gpu_hour"]),
                 fmt_usd(a["usd"]), a["date"]] for a in alternatives]
        lines += ["", table(["provider", "kind", "$/GPU-h", "total", "date"], rows,
                            title=f"the same {est.gpus} GPU(s) × {fmt_hours(est.hours)} elsewhere ({acc.id}; "
                                  f"choose with --provider/--spot; sources: --json)")]
    return "\n".join(lines)
