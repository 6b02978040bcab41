"""--help shows each large command's common flags (at most 30); --help-all shows every flag. The rest are still
accepted, and a job file carries them (docs/job-file.md): the help is the part of the surface a person holds.

tests/test_cli_surface.py checks that every command's --help lists at most 30 options and that every flag named
here exists."""

from __future__ import annotations

import argparse
import sys

_SHARED = ("--help", "--help-all", "--json", "--wide")
_JOB = ("--from", "--set")
_CLUSTER = ("--gpus", "--gpu", "--gpus-per-node")
_LAYOUT = ("--dp", "--tp", "--pp", "--cp", "--ep", "--zero", "--micro-batch", "--recompute")
_WORKLOAD = ("--seq-len", "--global-batch", "--precision", "--framework")
_SERVE = ("--inference", "--serve", "--prompt-len", "--output-len", "--concurrency")
_LAUNCH = ("--nodes", "--node-rank", "--rdzv-endpoint", "--timeout", "--device")

COMMON = {
    "plan": _SHARED + _JOB + _CLUSTER + ("--seq-len", "--global-batch", "--precision", "--framework", "--objective",
                                         "--top", "--explain", "--html", "--save", "--export", "--out")
    + _SERVE + ("--ttft-slo", "--tpot-slo", "--target-rate", "--engine", "--batch"),
    "estimate": _SHARED + _JOB + _CLUSTER + _LAYOUT + _WORKLOAD + _SERVE + ("--engine",),
    "memory": _SHARED + _JOB + _CLUSTER + _LAYOUT + ("--seq-len", "--precision", "--optimizer", "--offload",
                                                     "--lora-rank", "--quantize-base", "--finetune-ladder", "--html"),
    "export": _SHARED + _JOB + ("--to", "--plan", "--rank", "--out", "--force", "--launch") + _CLUSTER + _LAYOUT
    + ("--seq-len", "--global-batch", "--precision", "--inference"),
    "report": _SHARED + _CLUSTER + _LAYOUT + _WORKLOAD + _SERVE[:4] + ("--objective", "--explain"),
    "cost": _SHARED + _CLUSTER + ("--hours", "--setup-hours", "--price", "--provider", "--spot", "--budget", "--tokens")
    + _LAYOUT + _WORKLOAD,
    "comm plan": _SHARED + _CLUSTER + _LAYOUT + ("--seq-len", "--precision", "--framework", "--inter-link",
                                                 "--intra-link"),
    "run train": _SHARED + ("--strategy", "--nproc-per-node", "--model", "--steps", "--global-batch", "--micro-batch", "--seq-len",
                            "--tp", "--pp", "--ep", "--schedule", "--check-parity", "--sweep-nproc", "--profile",
                            "--html", "--slow-rank", "--make-vocab-size-divisible-by") + _LAUNCH,
    "calibrate": _SHARED + ("--out", "--gpu", "--name", "--device", "--nproc-per-node", "--link", "--sizes", "--dtype",
                            "--skip-collectives", "--from-matmul", "--from-collectives", "--from-run", "--profile",
                            "--framework", "--timeout", "--html"),
    "run infer": _SHARED + ("--model", "--tp", "--pp", "--strategy", "--prompt", "--prompt-ids", "--max-new-tokens",
                            "--check-parity", "--sweep", "--max-tp", "--plot", "--kv-block-size",
                            "--make-vocab-size-divisible-by", "--html", "--slow-rank") + _LAUNCH,
}
"""Command -> the flags its --help shows (commands not listed show all of theirs)."""


class HelpAll(argparse._HelpAction):
    """--help-all: the help with every flag (a help action, as --help is)."""

    def __call__(self, parser, namespace, values, option_string=None):
        parser.print_help(all_flags=True)
        parser.exit()


def shown_options(parser: argparse.ArgumentParser, all_flags: bool = False) -> list[argparse.Action]:
    """The optional arguments the help lists."""
    common = getattr(parser, "common", None)
    opts = [a for a in parser._actions if a.option_strings and a.help is not argparse.SUPPRESS]
    if all_flags or common is None:
        return opts
    return [a for a in opts if set(a.option_strings) & common]


def format_help(parser: argparse.ArgumentParser, all_flags: bool = False) -> str:
    """The help text: the common flags only, unless ``all_flags``; a line says how many more there are."""
    common = getattr(parser, "common", None)
    if all_flags or common is None:
        return argparse.ArgumentParser.format_help(parser)
    hidden = [a for a in parser._actions if a.option_strings and not set(a.option_strings) & common
              and a.help is not argparse.SUPPRESS]
    saved, usage = [(a, a.help) for a in hidden], parser.usage
    positionals = " ".join(f"[{a.metavar or a.dest.upper()}]" for a in parser._actions
                           if not a.option_strings and a.help is not argparse.SUPPRESS)
    try:
        for a in hidden:
            a.help = argparse.SUPPRESS
        # a short usage line: argparse's own cannot be built with hidden members of mutually exclusive groups
        parser.usage = usage or f"%(prog)s {positionals + ' ' if positionals else ''}[options]"
        text = argparse.ArgumentParser.format_help(parser)
    finally:
        parser.usage = usage
        for a, h in saved:
            a.help = h
    job = any(parser.prog.endswith(f" {c}") for c in ("plan", "estimate", "memory", "export"))
    return (text.rstrip("\n") + f"\n\n{len(hidden)} more options: `{parser.prog} --help-all` lists them all"
            + ("; a job file carries them (docs/job-file.md)" if job else "") + ".\n")


def install(parser: argparse.ArgumentParser, path: str = "") -> None:
    """Give every command --help-all, and the large ones their common set (walks nested subcommands)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                install(sub, f"{path} {name}".strip())
    if not path:
        return
    if "--help-all" not in parser._option_string_actions:
        parser.add_argument("--help-all", action=HelpAll, help="show every option, not only the common ones")
    if path in COMMON:
        parser.common = set(COMMON[path])


def print_help(parser, file=None, all_flags: bool = False) -> None:
    (file or sys.stdout).write(format_help(parser, all_flags))
