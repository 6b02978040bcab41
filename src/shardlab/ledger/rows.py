"""Rows read back from the ledger, checked before use.

SQLite stores any value in any column (a REAL column accepts 'abc'), so a ledger edited by hand or by
another tool can hold text where a number belongs, a NaN, or a timestamp that does not parse. Every row is
checked here on the way out; a bad one is a LedgerError (exit code 2) naming the row, the column and the
value, and the file is left as it is.
"""

from __future__ import annotations

import datetime
import math

from shardlab.ledger.model import RUN_COLUMNS, STATUSES, LedgerError, RunRecord
from shardlab.limits import MAX_USD

_INT = ("id", "gpus", "guard_pid")
_INT_OR_NULL = ("exit_code",)
_MONEY_TIME = ("price_per_gpu_hour", "hours", "grace_s", "estimate_usd", "reserved_usd", "setup_hours")
_MONEY_TIME_OR_NULL = ("actual_usd", "wall_s")
_TEXT = ("budget", "command", "gpu", "price_source", "status", "started_at", "note", "host", "cwd")
_TEXT_OR_NULL = ("ended_at", "guard_start")
_ISO = ("started_at",)
_ISO_OR_NULL = ("ended_at",)


def _bad(path, what: str, col: str, value: object) -> LedgerError:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return LedgerError(f"ledger {path}: {what} has an invalid {col} ({shown}); the file was edited or damaged and "
                       f"was left untouched: fix or delete that row (sqlite3), or pass --ledger NEW_PATH")


def parse_time(text: str) -> datetime.datetime:
    """A ledger timestamp (UTC ISO 8601 with offset) as an aware datetime; ValueError when it is not one."""
    t = datetime.datetime.fromisoformat(text)
    if t.tzinfo is None:
        raise ValueError("no time zone")
    return t


def _number_ok(v: object, integer: bool) -> bool:
    if isinstance(v, bool):
        return False
    if integer:
        return isinstance(v, int)
    # at most a trillion (dollars, hours or seconds): larger is an edit, and would overflow the totals to inf
    return isinstance(v, (int, float)) and math.isfinite(v) and 0 <= v <= MAX_USD


def check_run_row(path, row: tuple) -> RunRecord:
    """A ``RunRecord`` from a row of ``SELECT RUN_COLUMNS FROM runs``, or a LedgerError naming what is wrong."""
    d = dict(zip(RUN_COLUMNS, row))
    rid = d.get("id")
    what = f"run {rid}" if isinstance(rid, int) else "a run"
    for col in _INT:
        if not _number_ok(d[col], True):
            raise _bad(path, what, col, d[col])
    for col in _INT_OR_NULL:
        if d[col] is not None and not _number_ok(d[col], True):
            raise _bad(path, what, col, d[col])
    for col in _MONEY_TIME:
        if not _number_ok(d[col], False):
            raise _bad(path, what, col, d[col])
    for col in _MONEY_TIME_OR_NULL:
        if d[col] is not None and not _number_ok(d[col], False):
            raise _bad(path, what, col, d[col])
    for col in _TEXT:
        if not isinstance(d[col], str):
            raise _bad(path, what, col, d[col])
    for col in _TEXT_OR_NULL:
        if d[col] is not None and not isinstance(d[col], str):
            raise _bad(path, what, col, d[col])
    if d["shell"] not in (0, 1):
        raise _bad(path, what, "shell", d["shell"])
    if d["status"] not in STATUSES:
        raise _bad(path, what, "status", d["status"])
    for col in _ISO + tuple(c for c in _ISO_OR_NULL if d[c] is not None):
        try:
            parse_time(d[col])
        except ValueError:
            raise _bad(path, what, col, d[col]) from None
    if d["gpus"] < 1:
        raise _bad(path, what, "gpus", d["gpus"])
    if not 0 < d["guard_pid"] < 2**31:     # a process id (pid_t); 0 or below would name a process group to os.kill
        raise _bad(path, what, "guard_pid", d["guard_pid"])
    d["shell"] = bool(d["shell"])
    return RunRecord(**d)


def check_budget_row(path, name: object, ceiling: object, parent: object) -> tuple[str, float, str | None]:
    """(name, ceiling, parent) of a ``budgets`` row, or a LedgerError naming what is wrong."""
    if not isinstance(name, str) or not name:
        raise _bad(path, "a budget", "name", name)
    if not _number_ok(ceiling, False):
        raise _bad(path, f"budget '{name}'", "ceiling_usd", ceiling)
    if parent is not None and (not isinstance(parent, str) or parent == name):
        raise _bad(path, f"budget '{name}'", "parent", parent)
    return name, float(ceiling), parent
