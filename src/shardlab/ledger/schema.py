"""The ledger file: its checks before SQLite opens it, its schema and migrations, and its backup copy.

- A ledger path must be a regular file or not exist yet (a FIFO, device or directory is refused).
- A 0-byte or missing ledger is new only when nothing says otherwise: if its backup (``PATH.bak``, written
  after every change) or an SQLite journal (``PATH-journal``, ``PATH-wal``) holds data, the ledger was
  lost or truncated, and shardlab refuses to start a fresh one over it (exit code 2, files untouched).
- Schema 2 (this version) adds ``runs.setup_hours`` and ``budgets.parent`` (nested budgets); a schema-1
  ledger is migrated in place, in one transaction.
"""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

from shardlab.ledger.model import LedgerError

SCHEMA_VERSION = 2
SQLITE_HEADER = b"SQLite format 3\x00"

SCHEMA = """
CREATE TABLE IF NOT EXISTS budgets (
    name TEXT PRIMARY KEY,
    ceiling_usd REAL NOT NULL CHECK (ceiling_usd >= 0),
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    parent TEXT REFERENCES budgets(name)
);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    budget TEXT NOT NULL REFERENCES budgets(name),
    command TEXT NOT NULL,
    shell INTEGER NOT NULL,
    gpus INTEGER NOT NULL,
    gpu TEXT NOT NULL,
    price_per_gpu_hour REAL NOT NULL,
    price_source TEXT NOT NULL,
    hours REAL NOT NULL,
    grace_s REAL NOT NULL,
    estimate_usd REAL NOT NULL,
    reserved_usd REAL NOT NULL,
    actual_usd REAL,
    status TEXT NOT NULL,
    started_at TEXT NOT NULL,
    ended_at TEXT,
    wall_s REAL,
    exit_code INTEGER,
    note TEXT NOT NULL DEFAULT '',
    host TEXT NOT NULL,
    guard_pid INTEGER NOT NULL,
    guard_start TEXT,
    cwd TEXT NOT NULL,
    setup_hours REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS runs_budget_status ON runs (budget, status);
"""

MIGRATIONS = {
    1: (("runs", "setup_hours", "ALTER TABLE runs ADD COLUMN setup_hours REAL NOT NULL DEFAULT 0"),
        ("budgets", "parent", "ALTER TABLE budgets ADD COLUMN parent TEXT REFERENCES budgets(name)")),
}
"""(table, column, statement adding it): what takes schema N to N + 1."""

V1_COLUMNS = {
    "budgets": {"name", "ceiling_usd", "created_at", "updated_at"},
    "runs": {"id", "budget", "command", "shell", "gpus", "gpu", "price_per_gpu_hour", "price_source", "hours", "grace_s",
             "estimate_usd", "reserved_usd", "actual_usd", "status", "started_at", "ended_at", "wall_s", "exit_code",
             "note", "host", "guard_pid", "guard_start", "cwd"},
}
"""Columns a schema-1 ledger has: a file claiming schema 1 without them is not migrated (nor written)."""

CURRENT_COLUMNS = {t: cols | {c for step in MIGRATIONS.values() for tt, c, _ in step if tt == t}
                   for t, cols in V1_COLUMNS.items()}
"""Columns a ledger of the current schema has (schema 1's plus every migration's): one that lacks any, a hand edit, is
refused rather than read into sqlite3's errors."""


def corrupt(path: Path, why: str) -> LedgerError:
    return LedgerError(f"ledger {path} is unreadable or corrupt ({why}); it was left untouched: move it aside "
                       f"(keep it, it holds your records) or pass --ledger NEW_PATH")


def backup_path(path: Path) -> Path:
    return path.with_name(path.name + ".bak")


JOURNAL_WITNESS_BYTES = 4096
"""A rollback journal this large holds at least one page of an older database (the journal of a brand-new
ledger being created holds only its header, and must not make a concurrent first use fail)."""


def _witnesses(path: Path) -> list[tuple[Path, int]]:
    """Files that say a ledger with records existed at ``path``: its backup and SQLite journals."""
    out = []
    for p, least in ((backup_path(path), 1), (path.with_name(path.name + "-journal"), JOURNAL_WITNESS_BYTES),
                     (path.with_name(path.name + "-wal"), JOURNAL_WITNESS_BYTES)):
        try:
            size = os.stat(p).st_size
        except OSError:
            continue
        if size >= least:
            out.append((p, size))
    return out


def check_file(path: Path, create: bool) -> bool:
    """Refuse what SQLite must not open: non-regular files, unreadable files, foreign files, lost ledgers.
    Returns True when the ledger exists and can only be read (allowed only when ``create`` is False)."""
    from shardlab.safeio import check_name

    check_name(path, "--ledger")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise LedgerError(f"cannot use ledger {path} ({e.strerror}); pass --ledger PATH") from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO, device or socket)"
        raise LedgerError(f"ledger path {path} is {kind}; pass --ledger FILE")
    if st is None or st.st_size == 0:
        lost = _witnesses(path)
        if lost:
            what = "does not exist" if st is None else "is empty (0 bytes)"
            found = ", ".join(f"{p.name} ({n:,} bytes)" for p, n in lost)
            raise LedgerError(f"ledger {path} {what} but {found} says it held records: it may have been deleted or "
                              f"truncated. Nothing was changed: restore it (e.g. cp {lost[0][0]} {path}) or move "
                              f"these files aside to start a new ledger")
    if st is None or (st.st_size == 0 and not create):     # a read-only command leaves an empty file empty
        if not create:
            raise LedgerError(f"no ledger at {path}; `shardlab guard` or `shardlab ledger --budget-name NAME --set-ceiling "
                              f"USD` creates it, or pass --ledger PATH")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise LedgerError(f"cannot create the ledger's folder {path.parent} ({e.strerror}); pass --ledger PATH") from None
        return False
    if not os.access(path, os.R_OK):
        raise LedgerError(f"cannot read ledger {path} (permission denied); fix its permissions or pass --ledger PATH")
    # writing needs the file and its folder (SQLite writes its journal beside it)
    writable = os.access(path, os.W_OK) and os.access(path.parent, os.W_OK | os.X_OK)
    if not writable and create:
        raise LedgerError(f"cannot write ledger {path} ({_why_readonly(path)}); `shardlab ledger` can still show it, "
                          f"or pass --ledger PATH")
    try:
        with open(path, "rb") as f:
            head = f.read(len(SQLITE_HEADER))
    except OSError as e:
        raise corrupt(path, e.strerror or str(e)) from None
    if head and head != SQLITE_HEADER:
        raise corrupt(path, "not an SQLite database")
    return not writable


def _why_readonly(path: Path) -> str:
    """Why a ledger cannot be written: its file system, the file, or its folder."""
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return "it is on a read-only file system"
    except OSError:
        pass
    if not os.access(path, os.W_OK):
        return "the file is read-only: fix its permissions"
    return f"its folder {path.parent} is read-only (SQLite writes a journal beside the ledger): fix its permissions"


def write_backup(conn: sqlite3.Connection, path: Path) -> None:
    """Copy the ledger to ``PATH.bak`` (atomically: a temporary file renamed over it). Best effort: a
    failure to back up never fails the run that was recorded."""
    target = backup_path(path)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    _remove_stale_tmp(target)
    try:
        dst = sqlite3.connect(str(tmp))
        try:
            conn.backup(dst)
        finally:
            dst.close()
        os.replace(tmp, target)
    except (sqlite3.Error, OSError):
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _remove_stale_tmp(target: Path) -> None:
    """Delete ``PATH.bak.<pid>.tmp`` files left by a process killed while it wrote the backup (its pid is gone).
    A live writer's file is left alone; the ledger itself is never touched."""
    prefix = target.name + "."
    try:
        names = [n for n in os.listdir(target.parent) if n.startswith(prefix) and n.endswith(".tmp")]
    except OSError:
        return
    for name in names[:64]:                   # bounded: a folder full of them is cleaned over several writes
        pid = name[len(prefix):-len(".tmp")]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        try:
            os.unlink(target.parent / name)
        except OSError:
            pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):      # gone, or a number no process can have
        return False
    except PermissionError:                          # someone else's live process
        return True
    return True
