"""shardlab report OUT.html, and the --html FILE flag of plan, estimate, memory, run, bench and calibrate:
one self-contained HTML page drawn from the command's JSON document (shardlab.report.html)."""

from __future__ import annotations

import argparse
import sys

EXAMPLES = """examples:
  shardlab report plan.html                                   # the main job: Llama-3.1-70B on 8 nodes x 8 H100
  shardlab report plan405.html llama-3.1-405b --gpus 1024 --seq-len 8192 --global-batch 2048 --tokens 15e12
  shardlab report est.html llama-3.1-70b --gpus 64 --tp 8 --pp 2 --zero 1   # a given layout: the estimate's page
  shardlab report serve.html llama-3.1-8b --inference --tp 2 --batch 16
  shardlab plan --html plan.html; shardlab run train --strategy fsdp+tp --nproc-per-node 4 --html run.html
"""
LAYOUT_FLAGS = {"tp": 1, "pp": 1, "cp": 1, "ep": 1, "dp": None, "zero": 0, "vpp": 1, "stage_layers": None}
"""Layout flags and their defaults: any of them given makes `report` draw that layout's estimate instead of a plan."""


def _html_path(text: str) -> str:
    from shardlab.errors import ShardlabError
    from shardlab.report.html import check_html_path

    try:
        return check_html_path(text)
    except ShardlabError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix(f"--html {text}: ")) from None


def add_html_arg(p: argparse.ArgumentParser, kind: str) -> None:
    """--html FILE on a command whose document has a page of ``kind`` (shardlab.report.html.KINDS)."""
    p.add_argument("--html", type=_html_path, default=None, metavar="FILE",
                   help="also write a self-contained HTML report (offline; charts, rank map, diagram) to FILE")
    p.set_defaults(html_kind=kind)


def write_html(args, doc: dict, argv: list[str]) -> None:
    """Write the page for ``doc`` to ``args.html`` and say so on stderr (stdout stays the JSON document)."""
    from shardlab.report.html import write_report

    kind = getattr(args, "html_kind", None) or args.command
    n = write_report(args.html, kind, doc, "shardlab " + " ".join(argv))
    sys.stderr.write(f"wrote {args.html} ({n / 1e6:.2f} MB): open it in a browser\n")


def register(sub) -> None:
    from shardlab.cli.plan_args import add_plan_args

    p = sub.add_parser("report", help="one self-contained HTML page: plan (or a given layout's estimate), offline",
                       description="Plan (default) or, when a layout is given (--tp/--pp/--cp/--ep/--dp/--zero/--vpp/"
                                   "--stage-layers), estimate that layout, and write one HTML page: inputs, worksheet "
                                   "with risks, rank map, memory per rank, step waterfall, pipeline timeline, top plans, "
                                   "TP block diagram. The page is drawn from the document --json prints.",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=_html_path, metavar="OUT.html", help="the page to write")
    add_plan_args(p)
    p.set_defaults(func=cmd_report)


def layout_given(args) -> bool:
    """Did the user give a layout (then the page is that layout's estimate)? A flag written on the command line
    counts even at its default value (``--tp 1 --zero 0``); args built in code count the values that differ."""
    from shardlab.cli.common import given_flags

    given = given_flags(args)
    if given is not None and given & set(LAYOUT_FLAGS):
        return True
    return any(getattr(args, k) != v for k, v in LAYOUT_FLAGS.items())


def cmd_report(args):
    from shardlab.cli.plan_cmds import cmd_estimate, cmd_plan

    if layout_given(args):
        kind, (doc, text) = "estimate", cmd_estimate(args)
    else:
        kind, (doc, text) = "plan", cmd_plan(args)
    args.html, args.html_kind = args.out, kind
    return doc, text
