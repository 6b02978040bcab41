"""The ``shardlab`` command. Each command group lives in its own module with a ``register(subparsers)``
function; modules keep heavy imports inside their handlers so that every call starts fast.

Handlers return ``(document, text)``: the JSON document printed with ``--json`` and the human text.
Bad input raises ShardlabError: one line on stderr, exit code 2 (the guard uses 3 for a refusal).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

# Command modules in help order; a module that does not exist (yet) is skipped.
COMMAND_MODULES = (
    "shardlab.cli.plan_cmds",      # plan, estimate
    "shardlab.cli.memory_cmd",     # memory
    "shardlab.cli.comm_cmds",      # comm
    "shardlab.cli.shard_pipeline_cmds",  # shard, pipeline
    "shardlab.cli.cost_cmds",      # cost
    "shardlab.cli.ledger_cmds",    # guard, ledger
    "shardlab.cli.runtime_cmds",   # run (train, infer)
    "shardlab.cli.bench_cmds",     # bench, calibrate
    "shardlab.cli.shard_check_cmd",  # shard-check
    "shardlab.cli.catalog_cmds",   # models, gpus, links
    "shardlab.cli.report_cmd",     # report
    "shardlab.cli.teach_cmds",     # explain, quiz
    "shardlab.cli.logs_cmd",       # logs
    "shardlab.cli.export_cmds",    # export
)


# Which module registers which command: lets `shardlab CMD` import only the module it needs.
# tests/test_cli_foundation.py checks this map against what the modules register.
COMMAND_OWNERS = {
    "plan": "shardlab.cli.plan_cmds", "estimate": "shardlab.cli.plan_cmds", "validate": "shardlab.cli.plan_cmds",
    "memory": "shardlab.cli.memory_cmd",
    "comm": "shardlab.cli.comm_cmds", "shard": "shardlab.cli.shard_pipeline_cmds",
    "pipeline": "shardlab.cli.shard_pipeline_cmds",
    "cost": "shardlab.cli.cost_cmds", "guard": "shardlab.cli.ledger_cmds", "ledger": "shardlab.cli.ledger_cmds",
    "run": "shardlab.cli.runtime_cmds",
    "bench": "shardlab.cli.bench_cmds", "calibrate": "shardlab.cli.bench_cmds", "shard-check": "shardlab.cli.shard_check_cmd",
    "models": "shardlab.cli.catalog_cmds", "gpus": "shardlab.cli.catalog_cmds", "links": "shardlab.cli.catalog_cmds",
    "report": "shardlab.cli.report_cmd",
    "explain": "shardlab.cli.teach_cmds", "quiz": "shardlab.cli.teach_cmds",
    "logs": "shardlab.cli.logs_cmd",
    "export": "shardlab.cli.export_cmds",
}


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: 'error: ... (see shardlab CMD --help)', exit code 2."""

    argv: list[str] = []
    """The command line being parsed (set by ``main``): an unrecognized flag, which argparse reports from the top
    parser, points to the help of the subcommand it was given to."""

    def _deepest_prog(self) -> str:
        parser, words = self, list(self.argv)
        while words:
            subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
            word = words.pop(0)
            if word.startswith("-") or not subs or word not in subs[0].choices:
                if word.startswith("-") and subs:
                    continue
                break
            parser = subs[0].choices[word]
        return parser.prog

    def format_help(self) -> str:
        from shardlab.cli.help import format_help

        return format_help(self)

    def print_help(self, file=None, all_flags: bool = False) -> None:
        from shardlab.cli.help import format_help

        self._print_message(format_help(self, all_flags), file or sys.stdout)

    def error(self, message: str):  # noqa: D401
        prog = self._deepest_prog() if message.startswith("unrecognized arguments") else self.prog
        line = f"{one_line(message)} (see `{prog} --help`)"
        sys.stderr.write(f"error: {line}\n")
        raise UsageError(line)

    def _get_value(self, action, arg_string):
        """An empty value ('--gpu ""', 'MODEL ""') is refused: handlers read an empty text as 'not given' and would
        silently fall back to a default. The guarded command after '--' keeps its own arguments, and the flags in
        ``_OWN_EMPTY_CHECK`` name the problem in their own words."""
        if (isinstance(arg_string, str) and not arg_string.strip() and action.type in (None, str)
                and action.nargs not in (argparse.REMAINDER, argparse.PARSER) and action.dest not in _OWN_EMPTY_CHECK):
            name = "/".join(action.option_strings) or action.metavar or action.dest
            self.error(f"argument {name}: the value is empty; give {action.metavar or action.dest.upper()} "
                       f"or leave the {'flag' if action.option_strings else 'argument'} out")
        return super()._get_value(action, arg_string)


_OWN_EMPTY_CHECK = frozenset({"prompt", "run", "plot", "model_out", "out", "mermaid", "markdown", "steps_jsonl", "answers",
                              "budget_name", "parent"})
"""Flags whose handlers refuse an empty value with their own message (tests pin those words)."""


class UsageError(SystemExit):
    """A command line argparse refused (exit code 2); ``message`` is the line written to stderr."""

    def __init__(self, message: str):
        super().__init__(2)
        self.message = message


def json_error(message: str, exit_code: int) -> None:
    """Under --json, an error is also one JSON document on stdout (``{"error": ..., "exit_code": ...}``), so that a
    program reading stdout always gets one document; the line on stderr is the same."""
    import json

    try:
        sys.stdout.write(json.dumps({"error": message, "exit_code": exit_code}) + "\n")
        sys.stdout.flush()
    except (OSError, ValueError, AttributeError):   # stdout full, closed or None: stderr has the line already
        pass


def one_line(message: str) -> str:
    """A message on one line and inert on a terminal: line breaks and control or format characters (from the
    user's own text quoted back: newlines, ESC sequences, U+2028, bidirectional overrides) shown as escapes."""
    if message.isprintable():
        return message
    import unicodedata

    def shown(ch: str) -> str:
        if ch in "\n\r\t" or unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp"):
            return ch.encode("unicode_escape").decode("ascii")
        return ch
    return "".join(shown(ch) for ch in message)


def engine_spelling(args, argv: list[str]) -> None:
    """--engine is the serving engine's flag; --framework, its older spelling under --inference, still works with a
    note. Both given and different is a one-line error (exit 2)."""
    if not hasattr(args, "engine"):
        return
    engine = args.engine
    if engine is None:
        if getattr(args, "inference", False) and any(a == "--framework" or a.startswith("--framework=") for a in argv):
            args.spelling_notes = (getattr(args, "spelling_notes", None) or []) + [
                "note: under --inference, --framework is an old spelling; use --engine"]
        return
    fw = getattr(args, "framework", None)
    if fw is not None and fw != engine:
        from shardlab.errors import ShardlabError

        raise ShardlabError(f"--engine {engine} and --framework {fw} name two engines; give one (--engine)")
    args.framework = engine


def inert(text: str) -> str:
    """Human output made safe for a terminal: names and paths that came from the user's files or folders (a model
    named after a folder holding ESC sequences) print their control and format characters as escapes; line breaks
    stay. JSON output escapes them already."""
    return "\n".join(one_line(line) for line in text.split("\n"))


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser, or (``only`` = a command name) one holding just the module that owns it."""
    from shardlab import __version__

    parser = _Parser(prog="shardlab", description=(
        "Will this model fit, how should it be split across the GPUs, how fast will it train or serve, "
        "what will it cost - and proof by running the same layouts with torch.distributed."),
        epilog="Every command accepts --json. Start with: shardlab plan")
    parser.add_argument("--version", action="version", version=f"shardlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    modules = [COMMAND_OWNERS[only]] if only in COMMAND_OWNERS else COMMAND_MODULES
    for name in modules:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue
            raise
        mod.register(sub)
    _add_wide(parser)
    from shardlab.cli.help import install

    install(parser)
    return parser


def _add_wide(parser: argparse.ArgumentParser) -> None:
    """--wide on every command that prints tables (those with --json), nested ones included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for p in action.choices.values():
                _add_wide(p)
    if "--json" in parser._option_string_actions and "--wide" not in parser._option_string_actions:
        parser.add_argument("--wide", action="store_true",
                            help="one line per table row however wide (default: fit the terminal; 100 columns "
                                 "when not a terminal)")


def emit(args, doc: dict, text: str) -> None:
    """Write the result whole: Ctrl-C is held off while it is written (a JSON document is never cut in two by it;
    the interrupt is taken after it), and a failed write (a full disk, a closed descriptor) is one line, exit 2."""
    import signal

    if getattr(args, "json", False):
        out = dumps(doc) + "\n"
    else:
        from shardlab.render.table import fit_text

        out = fit_text(inert(text)) + "\n"     # tables fit already; prose lines wrap at spaces
    held = {signal.SIGINT}              # SIGTERM stays deliverable: a supervisor can always stop a blocked write
    block = hasattr(signal, "pthread_sigmask") and _on_main_thread()
    if block:
        signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        if sys.stdout is None:
            raise OSError("standard output is closed")
        sys.stdout.write(out)
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as e:
        from shardlab.errors import ShardlabError

        try:                                       # drop what could not be written, so exit does not retry it
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        raise ShardlabError(f"could not write the output to standard output ({e.strerror or e}); write it elsewhere "
                            f"(> FILE) or free space") from None
    finally:
        if block:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, held)


def _on_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def dumps(doc) -> str:
    """The one JSON writer of every command: strict JSON, never NaN or Infinity. A non-finite number is a bug
    (every input is bounded); it is written as null and named in a warning on stderr, never printed as JSON
    that other tools cannot read."""
    bad: list[str] = []
    text = json.dumps(_plain(doc, "$", bad), indent=2, allow_nan=False)
    if bad:
        sys.stderr.write(f"warning: non-finite number(s) written as null at {', '.join(bad[:5])}"
                         f"{' ...' if len(bad) > 5 else ''} (a shardlab bug: please report it with the command)\n")
    return text


def _plain(o, path: str, bad: list[str]):
    """``o`` as plain JSON types (dataclasses, numpy arrays and scalars converted); non-finite floats -> None."""
    import dataclasses
    import math

    if o is None or isinstance(o, (str, bool, int)):
        return o
    if isinstance(o, float):
        if math.isfinite(o):
            return o
        bad.append(path)
        return None
    if isinstance(o, dict):
        return {str(k): _plain(v, f"{path}.{k}", bad) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_plain(v, f"{path}[{i}]", bad) for i, v in enumerate(o)]
    if dataclasses.is_dataclass(o) and not isinstance(o, type):
        return _plain(dataclasses.asdict(o), path, bad)
    if hasattr(o, "tolist"):
        return _plain(o.tolist(), path, bad)
    if hasattr(o, "item"):
        return _plain(o.item(), path, bad)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def _asks_json(tokens: list[str]) -> bool:
    """--json, or an abbreviation of it that argparse accepts (--js, --jso)."""
    return any(len(t) >= 3 and "--json".startswith(t) for t in tokens if isinstance(t, str))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    for stream in (sys.stdout, sys.stderr):      # a path or name that is not UTF-8 (Python's lone surrogates) or
        try:                                     # a character the locale cannot show is escaped, never a crash
            stream.reconfigure(errors="backslashreplace")
        except (AttributeError, ValueError, OSError):
            pass
    try:
        parser = build_parser(argv[0] if argv and argv[0] in COMMAND_OWNERS else None)
        _Parser.argv = list(argv[:argv.index("--")] if "--" in argv else argv)
        args = parser.parse_args(argv)
    except UsageError as e:
        if _asks_json(argv[:argv.index("--")] if "--" in argv else argv):   # not a guarded command's flag
            json_error(e.message, 2)
        raise
    except KeyboardInterrupt:                      # Ctrl-C while the modules load: a line, not a traceback
        sys.stderr.write("interrupted (SIGINT): stopped\n")
        return 130
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    from shardlab.cli.fields import flag_of
    from shardlab.errors import FIELD_NAMES

    names = FIELD_NAMES.set(flag_of)            # while the command runs, the core's errors and notes name flags
    try:
        return _run(args, argv)
    finally:
        FIELD_NAMES.reset(names)


def _run(args, argv) -> int:
    from shardlab.errors import ShardlabError

    try:
        from shardlab.cli.progress import status

        from shardlab.safeout import refuse_output_over_input

        refuse_output_over_input(args)
        engine_spelling(args, argv)
        if getattr(args, "catalog", None):       # checked here too for commands that read no catalog (bench
            from shardlab.catalog import get_catalog   # collectives): a bad --catalog is never silently ignored

            get_catalog(args.catalog)
        from shardlab.render.table import OUTPUT_WIDTH, terminal_width

        # the human output fits the terminal (100 columns when not one) unless --wide; JSON has no width
        OUTPUT_WIDTH.set(None if getattr(args, "wide", False) or getattr(args, "json", False) else terminal_width())
        with status(args, "shardlab " + " ".join(a for a in argv[:2] if not a.startswith("-"))):
            result = args.func(args)
        if isinstance(result, int):
            for note in getattr(args, "spelling_notes", None) or ():
                sys.stderr.write(note + "\n")
            return result
        doc, text = result
        if getattr(args, "html", None):
            from shardlab.cli.report_cmd import write_html

            write_html(args, doc, argv)
        emit(args, doc, text)
        for note in getattr(args, "spelling_notes", None) or ():     # after success: an error stays one line
            sys.stderr.write(note + "\n")
        return 0
    except ShardlabError as e:
        sys.stderr.write(f"error: {one_line(str(e))}\n")
        if getattr(args, "json", False) and not getattr(e, "json_reported", False):
            json_error(one_line(str(e)), e.exit_code)
        return e.exit_code
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", 2)
        sys.stderr.write(f"interrupted ({'SIGINT' if signum == 2 else e}): stopped\n")
        return 128 + signum
