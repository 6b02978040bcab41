"""The SQLite ledger: budgets and every guarded run, written before the run starts.

Rules: a run is inserted (status 'running', its reservation held) in the same ``BEGIN IMMEDIATE``
transaction that checks the budget, so two guards can never both spend the last dollars; a run left
'running' by a guard that died is found on the next call and charged as its reservation (status
'unfinished'); a file that is not a readable shardlab ledger is reported and never written to.
"""

from __future__ import annotations

import datetime
import os
import socket
import sqlite3
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path

from shardlab.errors import ShardlabError
from shardlab.ledger.model import (RUN_COLUMNS, BudgetSummary, LedgerError, Refusal, RunRecord, RunRequest, RunTerms,
                                   process_start_ticks)

SCHEMA_VERSION = 1
SQLITE_HEADER = b"SQLite format 3\x00"
STALE_SLACK_S = 60.0
"""A 'running' row older than its time limit + grace + this slack cannot still be running."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS budgets (
    name TEXT PRIMARY KEY,
    ceiling_usd REAL NOT NULL CHECK (ceiling_usd >= 0),
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
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
    cwd TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_budget_status ON runs (budget, status);
"""


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _corrupt(path: Path, why: str) -> LedgerError:
    return LedgerError(f"ledger {path} is unreadable or corrupt ({why}); it was left untouched: move it aside "
                       f"(keep it, it holds your records) or pass --ledger NEW_PATH")


def _pid_alive(pid: int, start_ticks: str | None) -> bool:
    """Whether the process ``pid`` (started at ``start_ticks``, from /proc) still runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True            # no /proc: trust kill(0)
    fields = stat.rsplit(")", 1)[-1].split()
    if fields and fields[0] in ("Z", "X"):
        return False           # a zombie has finished
    return start_ticks is None or len(fields) < 20 or fields[19] == start_ticks


class Ledger:
    """A ledger file, validated on open. Use as a context manager, or call ``close()``."""

    def __init__(self, path: str | os.PathLike, *, create: bool = True):
        self.path = Path(path).expanduser()
        self._check_file(create)
        try:
            self.conn = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None)
        except sqlite3.Error as e:
            raise LedgerError(f"cannot open ledger {self.path} ({e}); check the path or pass --ledger NEW_PATH") from None
        try:
            self._check_db()
        except BaseException:
            self.conn.close()
            raise

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.conn.close()

    def _check_file(self, create: bool) -> None:
        p = self.path
        if p.is_dir():
            raise LedgerError(f"ledger path {p} is a directory; pass --ledger FILE")
        if not p.exists():
            if not create:
                raise LedgerError(f"no ledger at {p}; `shardlab guard` creates it on first use, or pass --ledger PATH")
            try:
                p.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise LedgerError(f"cannot create the ledger's folder {p.parent} ({e.strerror}); pass --ledger PATH") from None
            return
        if not os.access(p, os.R_OK | os.W_OK):
            raise LedgerError(f"cannot read and write ledger {p} (permission denied); fix its permissions or pass --ledger PATH")
        try:
            with open(p, "rb") as f:
                head = f.read(len(SQLITE_HEADER))
        except OSError as e:
            raise _corrupt(p, e.strerror or str(e)) from None
        if head and head != SQLITE_HEADER:
            raise _corrupt(p, "not an SQLite database")

    def _check_db(self) -> None:
        try:
            rows = self.conn.execute("PRAGMA quick_check").fetchall()
            if rows != [("ok",)]:
                raise _corrupt(self.path, f"integrity check: {rows[0][0] if rows else 'no answer'}")
            tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.OperationalError as e:
            if "locked" in str(e):
                raise LedgerError(f"ledger {self.path} stayed locked by another process for 30 s; try again") from None
            raise _corrupt(self.path, str(e)) from None
        except sqlite3.DatabaseError as e:
            raise _corrupt(self.path, str(e)) from None
        tables.discard("sqlite_sequence")
        if not tables and version == 0:
            with self._tx() as c:
                for statement in _SCHEMA.split(";"):   # executescript() would commit on its own
                    if statement.strip():
                        c.execute(statement)
                c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            return
        if version > SCHEMA_VERSION:
            raise LedgerError(f"ledger {self.path} was written by a newer shardlab (schema {version}); upgrade shardlab")
        if not {"budgets", "runs"} <= tables or version != SCHEMA_VERSION:
            raise LedgerError(f"{self.path} is an SQLite database but not a shardlab ledger; it was left untouched: "
                              f"pass --ledger NEW_PATH")

    @contextmanager
    def _tx(self):
        """BEGIN IMMEDIATE ... COMMIT: one writer at a time, everything or nothing."""
        c = self.conn
        try:
            c.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:
            raise LedgerError(f"ledger {self.path} stayed locked by another process for 30 s ({e}); try again") from None
        try:
            yield c
            c.execute("COMMIT")
        except BaseException as e:
            if c.in_transaction:
                c.execute("ROLLBACK")
            if isinstance(e, sqlite3.Error):
                raise LedgerError(f"ledger {self.path}: {e}; nothing was written") from None
            raise

    # -- writes ---------------------------------------------------------------------------------------

    def recover_unfinished(self) -> list[int]:
        """Mark runs whose guard is gone as 'unfinished', charged as their reservation. Returns their ids."""
        with self._tx() as c:
            return self._recover(c)

    def _recover(self, c) -> list[int]:
        host, now = socket.gethostname(), datetime.datetime.now(datetime.timezone.utc)
        stale = []
        for rid, started, hours, grace, rhost, pid, pstart in c.execute(
                "SELECT id, started_at, hours, grace_s, host, guard_pid, guard_start FROM runs WHERE status = 'running'"):
            age_s = (now - datetime.datetime.fromisoformat(started)).total_seconds()
            if age_s > hours * 3600 + grace + STALE_SLACK_S or (rhost == host and not _pid_alive(pid, pstart)):
                stale.append(rid)
        for rid in stale:
            c.execute("UPDATE runs SET status = 'unfinished', actual_usd = reserved_usd, note = trim(note || ' ' || ?) "
                      "WHERE id = ?", ("the guard stopped without recording the end (crash, kill or power loss); "
                                       "charged as its full reservation", rid))
        return stale

    def reserve(self, req: RunRequest) -> tuple[RunRecord, tuple[float, float] | None]:
        """Check the budget and record the run as 'running' in one transaction. Returns the run and the
        (old, new) ceiling when ``req.ceiling_usd`` changed it. Raises Refusal (exit 3) past the ceiling."""
        refusal, change = None, None
        with self._tx() as c:
            self._recover(c)
            row = c.execute("SELECT ceiling_usd FROM budgets WHERE name = ?", (req.budget,)).fetchone()
            stamp = now_iso()
            if row is None:
                if req.ceiling_usd is None:
                    raise ShardlabError(f"budget '{req.budget}' is new: set its ceiling with --ceiling USD")
                c.execute("INSERT INTO budgets VALUES (?, ?, ?, ?)", (req.budget, req.ceiling_usd, stamp, stamp))
                ceiling = req.ceiling_usd
            else:
                ceiling = row[0]
                if req.ceiling_usd is not None and abs(req.ceiling_usd - ceiling) > 1e-9:
                    change = (ceiling, req.ceiling_usd)
                    ceiling = req.ceiling_usd
                    c.execute("UPDATE budgets SET ceiling_usd = ?, updated_at = ? WHERE name = ?", (ceiling, stamp, req.budget))
            spent, reserved = self._totals(c, req.budget)
            if spent + reserved + req.reserved_usd > ceiling + 1e-9:
                refusal = Refusal(req, spent, reserved, ceiling)
            else:
                note = f"ceiling changed from ${change[0]:.2f} to ${change[1]:.2f}" if change else ""
                row = {f.name: getattr(req, f.name) for f in fields(RunTerms)}
                row.update(shell=int(req.shell), estimate_usd=req.estimate_usd, reserved_usd=req.reserved_usd,
                           status="running", started_at=stamp, note=note, host=socket.gethostname(),
                           guard_pid=os.getpid(), guard_start=process_start_ticks(os.getpid()), cwd=os.getcwd())
                cur = c.execute(f"INSERT INTO runs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                                tuple(row.values()))
                run_id = cur.lastrowid
        if refusal:
            refusal.ceiling_change = change
            raise refusal
        return self.run(run_id), change

    def finish(self, run_id: int, *, status: str, exit_code: int | None, wall_s: float, actual_usd: float,
               note: str = "") -> RunRecord:
        """Record the end of a run (only a run still 'running': a run already settled is left as it is)."""
        with self._tx() as c:
            c.execute("UPDATE runs SET status = ?, exit_code = ?, wall_s = ?, actual_usd = ?, ended_at = ?, "
                      "note = trim(note || ' ' || ?) WHERE id = ? AND status = 'running'",
                      (status, exit_code, wall_s, actual_usd, now_iso(), note, run_id))
        return self.run(run_id)

    # -- reads ----------------------------------------------------------------------------------------

    @staticmethod
    def _totals(c, budget: str) -> tuple[float, float]:
        spent, reserved = c.execute(
            "SELECT COALESCE(SUM(CASE WHEN status != 'running' THEN actual_usd END), 0), "
            "COALESCE(SUM(CASE WHEN status = 'running' THEN reserved_usd END), 0) FROM runs WHERE budget = ?",
            (budget,)).fetchone()
        return float(spent), float(reserved)

    def run(self, run_id: int) -> RunRecord:
        row = self.conn.execute(f"SELECT {', '.join(RUN_COLUMNS)} FROM runs WHERE id = ?", (run_id,)).fetchone()
        return RunRecord(*row)

    def runs(self, budget: str | None = None) -> list[RunRecord]:
        q = f"SELECT {', '.join(RUN_COLUMNS)} FROM runs" + (" WHERE budget = ?" if budget else "") + " ORDER BY id"
        return [RunRecord(*r) for r in self.conn.execute(q, (budget,) if budget else ())]

    def budgets(self, budget: str | None = None) -> list[BudgetSummary]:
        q = "SELECT name, ceiling_usd FROM budgets" + (" WHERE name = ?" if budget else "") + " ORDER BY name"
        out = []
        for name, ceiling in self.conn.execute(q, (budget,) if budget else ()).fetchall():
            spent, reserved = self._totals(self.conn, name)
            n, flagged = self.conn.execute("SELECT COUNT(*), COALESCE(SUM(status = 'unfinished'), 0) FROM runs "
                                           "WHERE budget = ?", (name,)).fetchone()
            out.append(BudgetSummary(name, ceiling, spent, reserved, ceiling - spent - reserved, n, flagged))
        return out
