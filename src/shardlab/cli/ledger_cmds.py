"""shardlab guard | ledger: a hard budget ceiling around a command, and the ledger (SQLite, ``shardlab.ledger``) of
every run, estimate against actual. The price of a run is ``cli.cost_cmds``."""

from __future__ import annotations

import argparse
import sys

from shardlab.cli.common import BOUNDED, add_output_args
from shardlab.cli.cost_cmds import lookup_gpu, price_args
from shardlab.errors import ShardlabError


def register(sub) -> None:
    p = sub.add_parser("guard", help="run a command under a budget ceiling and a time limit, recorded in the ledger",
                       description="Refuse (exit 3) when the estimate would take the budget, or a budget it is part of, "
                                   "past its ceiling; otherwise record and run COMMAND, stop it and every process it "
                                   "started when its paid time (--hours) runs out (SIGTERM, then SIGKILL after --grace-s) "
                                   "or when the guard is interrupted or killed, and record its actual cost (never more "
                                   "than the reservation). Exit code: the command's; 124 at the time limit; 128+N when "
                                   "interrupted by signal N.")
    p.add_argument("--budget-name", required=True, metavar="NAME", help="the budget to charge")
    p.add_argument("--ceiling", type=BOUNDED["usd"], default=None, metavar="USD",
                   help="the budget's hard ceiling (required on first use; a different value updates it)")
    p.add_argument("--parent", default=None, metavar="NAME",
                   help="file the budget under an existing budget NAME whose ceiling binds too (e.g. a $3 lab in a $5 total)")
    p.add_argument("--setup-hours", type=BOUNDED["setup_hours"], default=0.0, metavar="S",
                   help="paid hours outside the command (provisioning, image pull, data staging): reserved and charged "
                        "in full, not part of the time limit (default 0)")
    p.add_argument("--gpus", type=BOUNDED["gpus"], required=True, help="GPUs paid for")
    p.add_argument("--gpu", default=None, help="accelerator id for the catalog price (see `shardlab gpus`)")
    price_args(p)
    p.add_argument("--hours", type=BOUNDED["hours"], required=True, help="paid hours: the time limit of the command")
    p.add_argument("--grace-s", type=BOUNDED["seconds0"], default=10.0, metavar="S", help="seconds between SIGTERM and SIGKILL (default 10)")
    p.add_argument("--ledger", default=None, metavar="PATH", help="ledger file (default: $SHARDLAB_LEDGER or the user's data dir)")
    p.add_argument("--shell", action="store_true", help="run COMMAND through /bin/sh (default: no shell)")
    g = p.add_argument_group("a multi-node job (inside a Slurm allocation of several nodes: from SLURM_NNODES, "
                             "SLURM_NODEID and SLURM_JOB_ID)")
    g.add_argument("--nodes", type=BOUNDED["nodes"], default=None, metavar="N",
                   help="nodes of the job, each running this guard: node 0 reserves and charges --gpus (all the "
                        "job's GPUs) once, the others record nothing and stop their command at the same --hours")
    g.add_argument("--node-rank", type=BOUNDED["node_rank"], default=None, metavar="K", help="this node (0 .. N-1)")
    g.add_argument("--job-id", default=None, metavar="ID", help="the job's name in the ledger row's note")
    add_output_args(p)
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]", help="the command to run")
    p.set_defaults(func=cmd_guard)

    p = sub.add_parser("ledger", help="spent, reserved and remaining per budget; every run, estimate vs actual",
                       description="Show the budget ledger; --markdown FILE writes a report to commit beside an experiment.")
    p.add_argument("--ledger", default=None, metavar="PATH", help="ledger file (default: $SHARDLAB_LEDGER or the user's data dir)")
    p.add_argument("--budget-name", default=None, metavar="NAME", help="only this budget (and the budgets part of it)")
    p.add_argument("--set-ceiling", type=BOUNDED["usd"], default=None, metavar="USD",
                   help="with --budget-name: create the budget or change its ceiling, without running anything")
    p.add_argument("--parent", default=None, metavar="NAME",
                   help="with --budget-name: file the budget under budget NAME, whose ceiling binds too")
    p.add_argument("--markdown", default=None, metavar="FILE", help="write a markdown report to FILE")
    add_output_args(p)
    p.set_defaults(func=cmd_ledger)


def cmd_guard(args) -> int:
    import shlex

    from shardlab.cli import dumps

    from shardlab.catalog import get_catalog
    from shardlab.cost.estimate import fmt_usd
    from shardlab.cost.prices import resolve_price
    from shardlab.guard import run_guarded
    from shardlab.ledger import Refusal, RunRequest, default_ledger_path

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command or not any(c.strip() for c in command):
        raise ShardlabError("no command to run: put it after `--`, e.g. shardlab guard ... -- python train.py")
    _check_budget_names(args)
    if not args.shell:
        import shutil

        if shutil.which(command[0]) is None:      # before anything is reserved: a typo is not a run
            where = "is not an executable file" if "/" in command[0] else "is not on PATH"
            raise ShardlabError(f"command not found: '{command[0]}' {where}; check its name (nothing was reserved)")
    if args.gpu is None and args.price is None:
        raise ShardlabError("no price: give --gpu GPU (its catalog price) or --price USD_PER_GPU_HOUR")
    cat = get_catalog(args.catalog)
    acc = lookup_gpu(cat, args.gpu, args.price)
    price = resolve_price(cat, acc.id if acc else None, provider=args.provider, spot=args.spot,
                          given_usd_per_gpu_hour=args.price)
    req = RunRequest(budget=args.budget_name, ceiling_usd=args.ceiling,
                     command=" ".join(command) if args.shell else shlex.join(command), shell=args.shell,
                     gpus=args.gpus, gpu=acc.id if acc else (args.gpu or "gpu"), price_per_gpu_hour=price.usd_per_gpu_hour,
                     price_source=price.source, hours=args.hours, grace_s=args.grace_s, setup_hours=args.setup_hours,
                     parent=args.parent)
    from shardlab.safeio import expand_user

    path = expand_user(args.ledger, "--ledger") if args.ledger else default_ledger_path()
    log = lambda s: print(f"guard: {s}", file=sys.stderr, flush=True)   # noqa: E731
    nodes, rank, job = _job_nodes(args)
    if nodes > 1 and rank > 0:
        from shardlab.guard import run_follower

        note = (f"node {rank} of job {job}'s {nodes}: covered by node 0's reservation of {args.gpus} GPUs, nothing "
                f"recorded here; stopped at the same {args.hours:g} h")
        out = run_follower(req, command, note, stdout=2 if args.json else None, log=log)
        wall = "-" if out.run.wall_s is None else f"{out.run.wall_s:.1f} s"
        log(f"node {rank} {out.run.status} (exit {out.run.exit_code}) after {wall}")
        if args.json:
            print(dumps({"ledger": None, "run": out.run.to_dict(), "budget": None, "exit_code": out.exit_code,
                         "recorded": False, "node_rank": rank, "nodes": nodes, "job_id": job}))
        return out.exit_code
    note = (f"job {job}: one reservation for the {args.gpus} GPUs of its {nodes} nodes (node 0's guard; the others "
            "stop their commands at the same limit)") if nodes > 1 else ""
    try:
        out = run_guarded(req, command, path, stdout=2 if args.json else None, log=log, job_note=note)
    except Refusal as r:
        if args.json:
            print(dumps({"ledger": str(path), **r.to_dict()}))
            r.json_reported = True                 # the refusal's document is the one on stdout
        raise
    run, b = out.run, out.budget
    wall = "-" if run.wall_s is None else f"{run.wall_s:.1f} s"
    log(f"run #{run.id} {run.status} (exit {run.exit_code}) after {wall}: actual {fmt_usd(run.actual_usd or 0)} "
        f"(estimate {fmt_usd(run.estimate_usd)}). Budget '{b.name}': spent {fmt_usd(b.spent_usd)}, reserved "
        f"{fmt_usd(b.reserved_usd)}, remaining {fmt_usd(b.remaining_usd)} of {fmt_usd(b.ceiling_usd)}.")
    if args.json:
        print(dumps({"ledger": str(path), "run": run.to_dict(), "budget": b.to_dict(), "exit_code": out.exit_code,
                     "recorded": out.recorded,
                     "ceiling_changed_from": out.ceiling_change[0] if out.ceiling_change else None}))
    return out.exit_code


def _job_nodes(args) -> tuple[int, int, str]:
    """(nodes, this node's rank, job id) of a guarded job: the flags, else a Slurm allocation of several nodes
    (SLURM_NNODES, SLURM_NODEID, SLURM_JOB_ID), else one node."""
    import os

    env = os.environ
    slurm = env.get("SLURM_NNODES", "").isdigit() and int(env["SLURM_NNODES"]) > 1 and env.get("SLURM_NODEID", "").isdigit()
    nodes = args.nodes or (int(env["SLURM_NNODES"]) if slurm else 1)
    node_id = env.get("SLURM_NODEID", "")
    if args.node_rank is not None:
        rank = args.node_rank
    elif nodes > 1 and node_id.isdigit():
        rank = int(node_id)
    elif nodes > 1:               # every node would take itself for node 0 and charge the whole job again
        raise ShardlabError(f"--nodes {nodes} needs --node-rank K on every node (0 on the one that charges the job)")
    else:
        rank = 0
    job = args.job_id or (f"slurm-{env['SLURM_JOB_ID']}" if slurm and env.get("SLURM_JOB_ID") else "unnamed")
    if rank >= nodes:
        raise ShardlabError(f"--node-rank {rank} is outside 0..{nodes - 1} (--nodes {nodes})")
    if args.job_id is not None and (not args.job_id.strip() or len(args.job_id) > 128 or
                                    any(not (c.isalnum() or c in "._-") for c in args.job_id)):
        raise ShardlabError("--job-id: up to 128 letters, digits, '.', '_' or '-'")
    return nodes, rank, job


def _check_budget_names(args) -> None:
    """Budget names: non-empty single-line text of reasonable length."""
    for flag, name in (("--budget-name", args.budget_name), ("--parent", getattr(args, "parent", None))):
        if name is None:
            continue
        if not name.strip() or len(name) > 200 or any(ord(ch) < 32 or 0xD800 <= ord(ch) < 0xE000 for ch in name):
            raise ShardlabError(f"{flag} must be a short name on one line (1-200 characters of UTF-8 text), "
                                f"got {name[:40]!r}")
    if args.parent is not None and args.parent == args.budget_name:
        raise ShardlabError("--parent must name another budget: a budget cannot be part of itself")


def cmd_ledger(args):
    import os

    from shardlab.errors import did_you_mean
    from shardlab.ledger import Ledger, default_ledger_path
    from shardlab.ledger.report import markdown_report, text_report
    from shardlab.ledger.store import check_before_creating, now_iso
    from shardlab.safeio import expand_user

    if args.json and args.markdown:
        raise ShardlabError("choose one of --json and --markdown FILE")
    setting = args.set_ceiling is not None or args.parent is not None
    if setting and not args.budget_name:
        raise ShardlabError("--set-ceiling and --parent need --budget-name NAME (the budget to set)")
    _check_budget_names(args)
    if args.markdown:
        from shardlab.safeout import check_output_path

        check_output_path(args.markdown, "--markdown")
    path = expand_user(args.ledger, "--ledger") if args.ledger else default_ledger_path()
    from shardlab.ledger.schema import backup_path

    if not setting and not os.path.lexists(path) and not os.path.lexists(backup_path(path)) and not args.ledger:
        return ({"ledger": str(path), "exists": False, "read_only": False, "budgets": [], "runs": [],
                 "recovered_unfinished": [], "over_ceiling": []},
                f"no ledger at {path} yet: `shardlab guard` creates it on its first run, or `shardlab ledger "
                f"--budget-name NAME --set-ceiling USD`")
    if setting:
        check_before_creating(path, args.budget_name, args.set_ceiling, args.parent, "--set-ceiling")
    with Ledger(path, create=setting) as led:
        change = led.set_budget(args.budget_name, args.set_ceiling, args.parent) if setting else None
        over = led.over_ceiling(args.budget_name) if setting else []
        recovered, readonly = led.recover_unfinished(), led.readonly
        budgets, runs = led.budgets(args.budget_name), led.runs(args.budget_name)
        if args.budget_name and not budgets:
            names = [x.name for x in led.budgets()]
            raise ShardlabError(f"no budget '{args.budget_name}' in {path}{did_you_mean(args.budget_name, names)}; "
                                f"budgets: {', '.join(names) or 'none yet'}")
    from shardlab.cost.estimate import fmt_usd

    doc = {"ledger": str(path), "exists": True, "read_only": readonly, "budgets": [x.to_dict() for x in budgets],
           "runs": [r.to_dict() for r in runs], "recovered_unfinished": recovered,
           "over_ceiling": [{"budget": n, "committed_usd": used, "ceiling_usd": ceil} for n, used, ceil in over]}
    text = text_report(str(path), budgets, runs, recovered)
    for n, used, ceil in over:
        text = (f"warning: budget '{n}' now has {fmt_usd(used)} spent and reserved, over its ceiling {fmt_usd(ceil)}: "
                f"nothing already spent is undone, and every new run under it will be refused until the ceiling is "
                f"raised (shardlab ledger --budget-name {n} --set-ceiling USD)\n") + text
    if change:
        doc["ceiling_changed_from"] = change[0]
        text = f"ceiling of budget '{args.budget_name}' changed from {fmt_usd(change[0])} to {fmt_usd(change[1])}\n" + text
    if readonly:
        text += ("\n(read-only ledger: shown as it is; runs whose guard died are settled as 'unfinished' the next "
                 "time it is opened writable)")
    if args.markdown:
        from shardlab.safeout import write_text

        write_text(args.markdown, markdown_report(str(path), budgets, runs, now_iso()), "--markdown")
        text += f"\nwrote {args.markdown}"
    return doc, text
