"""User-facing errors: one line naming the problem and the fix, exit code 2, never a traceback."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from contextvars import ContextVar

FIELD_NAMES: ContextVar[Callable[[str], str] | None] = ContextVar("shardlab_field_names", default=None)
"""How errors and notes name a field: unset (the library), by the field itself (``layout.tp``); the command line
installs its flag names (``--tp``, ``cli.fields.flag_of``) while a command runs."""


def field_name(name: str) -> str:
    """The name an error or note gives the field ``name`` (``layout.tp``, ``workload.global_batch``, ...): the field
    itself, or the flag that sets it when the command line is running (``cli.fields``)."""
    namer = FIELD_NAMES.get()
    return namer(name) if namer is not None else name


class ShardlabError(Exception):
    """Bad input. ``str(err)`` is the one-line message shown to the user; the CLI exits with ``exit_code``."""

    exit_code = 2


def did_you_mean(name: str, choices: Iterable[str], n: int = 3) -> str:
    """Return ' (did you mean a, b?)' for close matches of ``name`` among ``choices``, or ''."""
    choices = list(choices)
    close = difflib.get_close_matches(name.lower(), choices, n=n, cutoff=0.5)
    if not close:
        # substring matches help for prefixes such as 'llama' or 'h100'
        close = [c for c in choices if name.lower() in c][:n]
    return f" (did you mean {', '.join(close)}?)" if close else ""


def require_positive(name: str, value: float | int, *, allow_zero: bool = False) -> None:
    """Raise a ShardlabError naming the flag when ``value`` is not positive."""
    if value is None:
        return
    if value < 0 or (value == 0 and not allow_zero):
        bound = "zero or more" if allow_zero else "a positive number"
        raise ShardlabError(f"{name} must be {bound}, got {value}")
