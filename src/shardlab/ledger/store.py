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
import urllib.parse
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path

from shardlab.errors import ShardlabError
from shardlab.ledger.model import (RUN_COLUMNS, BudgetSummary, LedgerError, Refusal, RunRecord, RunRequest, RunTerms,
                                   process_start_ticks)
from shardlab.ledger.rows import check_budget_row, check_run_row, parse_time
from shardlab.ledger.schema import (CURRENT_COLUMNS, MIGRATIONS, SCHEMA, SCHEMA_VERSION, V1_COLUMNS, check_file, corrupt,
                                    write_backup)

STALE_SLACK_S = 60.0
"""A 'running' row older than its time limit + grace + this slack cannot still be running."""


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


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


def storable_text(text: str) -> str:
    """``text`` as valid UTF-8 for SQLite: bytes that are not UTF-8 (a command argument or a working folder named
    in Latin-1, which Python carries as lone surrogates) are written as ``\\xe9`` escapes instead of failing."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        try:
            raw = text.encode("utf-8", "surrogateescape")
        except UnicodeEncodeError:
            raw = text.encode("utf-8", "surrogatepass")
        return raw.decode("utf-8", "backslashreplace")


def check_before_creating(path, budget: str, ceiling: float | None, parent: str | None, flag: str) -> None:
    """Refuse, before a new ledger file is created, what an empty ledger would refuse anyway (a new budget without a
    ceiling, a parent that cannot exist yet): a failed call leaves no empty ledger behind."""
    from shardlab.ledger.schema import backup_path
    from shardlab.safeio import expand_user

    path = expand_user(path, "the ledger path")
    if os.path.lexists(path) or os.path.lexists(backup_path(path)):
        return
    if ceiling is None:
        raise _new_budget(budget, flag)
    if parent is not None:
        raise _missing_parent(parent)


def _new_budget(budget: str, flag: str) -> ShardlabError:
    return ShardlabError(f"budget '{budget}' is new: set its ceiling with {flag} USD")


def _missing_parent(parent: str) -> ShardlabError:
    return ShardlabError(f"parent budget '{parent}' does not exist; create it first: "
                         f"shardlab ledger --budget-name {parent} --set-ceiling USD")


class Ledger:
    """A ledger file, validated on open. Use as a context manager, or call ``close()``."""

    def __init__(self, path: str | os.PathLike, *, create: bool = True):
        from shardlab.safeio import expand_user

        self.path = expand_user(path, "the ledger path")
        self.readonly = check_file(self.path, create)
        """True when the ledger can be read but not written (a read-only file system or file): shown, not settled."""
        try:
            if self.readonly:
                uri = "file:" + urllib.parse.quote(str(self.path.resolve())) + "?mode=ro"
                self.conn = sqlite3.connect(uri, uri=True, timeout=30.0, isolation_level=None)
            else:
                self.conn = sqlite3.connect(str(self.path), timeout=30.0, isolation_level=None)
        except sqlite3.Error as e:
            raise LedgerError(f"cannot open ledger {self.path} ({e}); check the path or pass --ledger NEW_PATH") from None
        # text a hand edit left as invalid UTF-8 reads back with its bad bytes escaped (\xff): shown, never a crash
        self.conn.text_factory = lambda raw: raw.decode("utf-8", "backslashreplace")
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

    def _check_db(self) -> None:
        try:
            rows = self.conn.execute("PRAGMA quick_check").fetchall()
            if rows != [("ok",)]:
                raise corrupt(self.path, f"integrity check: {rows[0][0] if rows else 'no answer'}")
            tables = {r[0] for r in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.OperationalError as e:
            if "locked" in str(e):
                raise LedgerError(f"ledger {self.path} stayed locked by another process for 30 s; try again") from None
            raise corrupt(self.path, str(e)) from None
        except sqlite3.DatabaseError as e:
            raise corrupt(self.path, str(e)) from None
        tables.discard("sqlite_sequence")
        if not tables and version == 0:
            with self._tx() as c:
                if c.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name != 'sqlite_sequence'"
                             ).fetchone()[0] == 0:              # another process may have created it meanwhile
                    for statement in SCHEMA.split(";"):        # executescript() would commit on its own
                        if statement.strip():
                            c.execute(statement)
                    c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            return
        if version > SCHEMA_VERSION:
            raise LedgerError(f"ledger {self.path} was written by a newer shardlab (schema {version}); upgrade shardlab")
        if not {"budgets", "runs"} <= tables or version not in range(1, SCHEMA_VERSION + 1):
            raise LedgerError(f"{self.path} is an SQLite database but not a shardlab ledger; it was left untouched: "
                              f"pass --ledger NEW_PATH")
        if version < SCHEMA_VERSION and self.readonly:
            raise LedgerError(f"ledger {self.path} is a schema-{version} ledger and read-only: it needs a one-time "
                              f"upgrade to schema {SCHEMA_VERSION}; make it writable (or copy it somewhere writable "
                              f"and pass --ledger COPY)")
        for table, needed in (V1_COLUMNS if version < SCHEMA_VERSION else CURRENT_COLUMNS).items():
            have = {r[1] for r in self.conn.execute(f"PRAGMA table_info({table})")}
            if not needed <= have:               # e.g. a hand edit that dropped a column: one line, not sqlite3's error
                raise LedgerError(f"{self.path} says it is a schema-{version} shardlab ledger but its {table} table "
                                  f"lacks {', '.join(sorted(needed - have)[:4])}; it was left untouched: pass "
                                  f"--ledger NEW_PATH")
        if version < SCHEMA_VERSION:
            self._migrate()

    def _migrate(self) -> None:
        """Bring an older schema up to date in one transaction (re-checked inside it: another process may
        have migrated meanwhile)."""
        with self._tx() as c:
            version = c.execute("PRAGMA user_version").fetchone()[0]
            while version < SCHEMA_VERSION:
                for table, column, statement in MIGRATIONS[version]:
                    # a ledger labelled older than it is (a hand edit, a restored user_version) already has the
                    # column: adding it again would fail with "duplicate column name"
                    if column not in {r[1] for r in c.execute(f"PRAGMA table_info({table})")}:
                        c.execute(statement)
                version += 1
                c.execute(f"PRAGMA user_version = {version}")

    @contextmanager
    def _tx(self, backup: bool = False):
        """BEGIN IMMEDIATE ... COMMIT: one writer at a time, everything or nothing (then the backup copy)."""
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
        if backup:
            write_backup(c, self.path)

    # -- budgets --------------------------------------------------------------------------------------

    def _budget_rows(self, c) -> dict[str, tuple[float, str | None]]:
        """name -> (ceiling, parent) of every budget, each row checked."""
        out = {}
        for name, ceiling, parent in c.execute("SELECT name, ceiling_usd, parent FROM budgets"):
            name, ceiling, parent = check_budget_row(self.path, name, ceiling, parent)
            out[name] = (ceiling, parent)
        orphan = c.execute("SELECT id, budget FROM runs WHERE budget NOT IN (SELECT name FROM budgets) LIMIT 1").fetchone()
        if orphan:      # its money would count in no budget's totals (the file was edited by hand)
            raise LedgerError(f"ledger {self.path}: run {orphan[0]} is filed under budget {str(orphan[1])[:40]!r}, "
                              f"which the ledger does not hold; restore the file from its .bak or fix the row")
        return out

    def _chain(self, budgets: dict, name: str) -> list[str]:
        """``name`` and its ancestors, nearest first; a LedgerError for a loop or a missing parent."""
        from shardlab.limits import MAX_BUDGET_DEPTH

        chain = [name]
        while budgets[chain[-1]][1] is not None:
            parent = budgets[chain[-1]][1]
            if parent not in budgets or parent in chain or len(chain) > MAX_BUDGET_DEPTH:
                raise LedgerError(f"ledger {self.path}: budget '{chain[-1]}' has a broken parent '{parent}' (missing, "
                                  f"a loop, or deeper than {MAX_BUDGET_DEPTH}); fix it with "
                                  f"`shardlab ledger --budget-name {chain[-1]} --parent NAME`")
            chain.append(parent)
        return chain

    def _set_parent(self, c, budgets: dict, name: str, parent: str | None, stamp: str) -> None:
        from shardlab.limits import MAX_BUDGET_DEPTH

        if parent is None or budgets[name][1] == parent:
            return
        if parent not in budgets:
            raise _missing_parent(parent)
        if name in self._chain(budgets, parent):
            raise ShardlabError(f"budget '{parent}' is inside '{name}': a budget cannot be its own ancestor")
        depth = len(self._chain(budgets, parent)) + 1
        if depth > MAX_BUDGET_DEPTH:
            raise ShardlabError(f"budgets nest at most {MAX_BUDGET_DEPTH} levels; '{name}' under '{parent}' would be {depth}")
        c.execute("UPDATE budgets SET parent = ?, updated_at = ? WHERE name = ?", (parent, stamp, name))
        budgets[name] = (budgets[name][0], parent)

    def _upsert(self, c, name: str, ceiling: float | None, parent: str | None, *,
                flag: str = "--ceiling", move: bool = True) -> tuple[dict, tuple | None]:
        """Create or update a budget; returns (all budgets, (old, new) ceiling when it changed). ``move``: an existing
        budget may leave the budget it is part of (``ledger``); a run's reservation (``guard``) may not, or one
        call could escape its course total."""
        budgets, stamp, change = self._budget_rows(c), now_iso(), None
        if name in budgets and not move and parent is not None and budgets[name][1] not in (None, parent):
            old = budgets[name][1]
            raise ShardlabError(f"budget '{name}' is part of '{old}'; the guard does not move a budget out of another: "
                                f"drop --parent {parent}, or move it first with `shardlab ledger --budget-name {name} "
                                f"--parent {parent}`")
        if name not in budgets:
            if ceiling is None:
                raise _new_budget(name, flag)
            c.execute("INSERT INTO budgets (name, ceiling_usd, created_at, updated_at) VALUES (?, ?, ?, ?)",
                      (name, ceiling, stamp, stamp))
            budgets[name] = (ceiling, None)
        elif ceiling is not None and abs(ceiling - budgets[name][0]) > 1e-9:
            change = (budgets[name][0], ceiling)
            c.execute("UPDATE budgets SET ceiling_usd = ?, updated_at = ? WHERE name = ?", (ceiling, stamp, name))
            budgets[name] = (ceiling, budgets[name][1])
        self._set_parent(c, budgets, name, parent, stamp)
        return budgets, change

    def set_budget(self, name: str, ceiling: float | None, parent: str | None = None) -> tuple[float, float] | None:
        """Create a budget or change its ceiling or parent, without a run. Returns (old, new) ceiling if changed."""
        with self._tx(backup=True) as c:
            return self._upsert(c, name, ceiling, parent, flag="--set-ceiling")[1]

    def over_ceiling(self, name: str) -> list[tuple[str, float, float]]:
        """(budget, spent + reserved, ceiling) for ``name`` and each budget it is part of that is over its ceiling
        (a lowered ceiling or a new parent can put one there: no run was refused, but every new run will be)."""
        budgets = self._budget_rows(self.conn)
        out = []
        for b in self._chain(budgets, name):
            spent, reserved = self._totals(self.conn, b)
            if spent + reserved > budgets[b][0] + 1e-9:
                out.append((b, spent + reserved, budgets[b][0]))
        return out

    # -- writes ---------------------------------------------------------------------------------------

    def recover_unfinished(self) -> list[int]:
        """Mark runs whose guard is gone as 'unfinished', charged as their reservation. Returns their ids
        (none on a read-only ledger: it is shown as it is)."""
        if self.readonly:
            return []
        with self._tx() as c:
            stale = self._recover(c)
        if stale:
            write_backup(self.conn, self.path)
        return stale

    def _recover(self, c) -> list[int]:
        host, now = socket.gethostname(), datetime.datetime.now(datetime.timezone.utc)
        stale = []
        for row in c.execute(f"SELECT {', '.join(RUN_COLUMNS)} FROM runs WHERE status = 'running'").fetchall():
            r = check_run_row(self.path, row)
            age_s = (now - parse_time(r.started_at)).total_seconds()
            limit_s = (r.setup_hours + r.hours) * 3600 + r.grace_s + STALE_SLACK_S
            if age_s > limit_s or (r.host == host and not _pid_alive(r.guard_pid, r.guard_start)):
                stale.append(r.id)
        for rid in stale:
            c.execute("UPDATE runs SET status = 'unfinished', actual_usd = reserved_usd, note = trim(note || ' ' || ?) "
                      "WHERE id = ?", ("the guard stopped without recording the end (crash, kill or power loss); "
                                       "charged as its full reservation", rid))
        return stale

    def reserve(self, req: RunRequest) -> tuple[RunRecord, tuple[float, float] | None]:
        """Check the budget and every budget it is part of, and record the run as 'running', in one
        transaction. Returns the run and the (old, new) ceiling when ``req.ceiling_usd`` changed it.
        Raises Refusal (exit 3) when the reservation would take any of them past its ceiling."""
        refusal = None
        with self._tx(backup=True) as c:
            self._recover(c)
            budgets, change = self._upsert(c, req.budget, req.ceiling_usd, req.parent, move=False)
            for name in self._chain(budgets, req.budget):
                spent, reserved = self._totals(c, name)
                ceiling = budgets[name][0]
                if spent + reserved + req.reserved_usd > ceiling + 1e-9:
                    refusal = Refusal(req, spent, reserved, ceiling, binding=name, ceiling_change=change)
                    break
            if refusal is None:
                from shardlab.cost.estimate import fmt_usd

                note = f"ceiling changed from {fmt_usd(change[0])} to {fmt_usd(change[1])}" if change else ""
                row = {f.name: getattr(req, f.name) for f in fields(RunTerms)}
                row.update(shell=int(req.shell), estimate_usd=req.estimate_usd, reserved_usd=req.reserved_usd,
                           status="running", started_at=now_iso(), note=note, host=socket.gethostname(),
                           guard_pid=os.getpid(), guard_start=process_start_ticks(os.getpid()), cwd=os.getcwd())
                row = {k: storable_text(v) if isinstance(v, str) else v for k, v in row.items()}
                cur = c.execute(f"INSERT INTO runs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                                tuple(row.values()))
                run_id = cur.lastrowid
        if refusal:
            raise refusal
        return self.run(run_id), change

    def finish(self, run_id: int, *, status: str, exit_code: int | None, wall_s: float, actual_usd: float,
               note: str = "") -> RunRecord:
        """Record the end of a run (only a run still 'running': a run already settled is left as it is)."""
        with self._tx(backup=True) as c:
            c.execute("UPDATE runs SET status = ?, exit_code = ?, wall_s = ?, actual_usd = ?, ended_at = ?, "
                      "note = trim(note || ' ' || ?) WHERE id = ? AND status = 'running'",
                      (status, exit_code, wall_s, actual_usd, now_iso(), note, run_id))
        return self.run(run_id)

    # -- reads ----------------------------------------------------------------------------------------

    def _subtree(self, c, budget: str) -> list[str]:
        """``budget`` and every budget below it."""
        rows = c.execute("WITH RECURSIVE sub(name) AS (SELECT ? UNION SELECT b.name FROM budgets b JOIN sub "
                         "ON b.parent = sub.name) SELECT name FROM sub", (budget,)).fetchall()
        return [r[0] for r in rows]

    def _totals(self, c, budget: str) -> tuple[float, float]:
        """(spent, reserved) of ``budget`` and the budgets below it; every row is checked on the way."""
        names = self._subtree(c, budget)
        q = (f"SELECT {', '.join(RUN_COLUMNS)} FROM runs WHERE budget IN ({', '.join('?' * len(names))})")
        spent = reserved = 0.0
        for row in c.execute(q, names).fetchall():
            r = check_run_row(self.path, row)
            if r.status == "running":
                reserved += r.reserved_usd
            else:
                spent += r.actual_usd or 0.0
        return spent, reserved

    def run(self, run_id: int) -> RunRecord:
        row = self.conn.execute(f"SELECT {', '.join(RUN_COLUMNS)} FROM runs WHERE id = ?", (run_id,)).fetchone()
        return check_run_row(self.path, row)

    def runs(self, budget: str | None = None) -> list[RunRecord]:
        """Every run, or those of ``budget`` and the budgets below it."""
        if budget:
            names = self._subtree(self.conn, budget)
            q = f"SELECT {', '.join(RUN_COLUMNS)} FROM runs WHERE budget IN ({', '.join('?' * len(names))}) ORDER BY id"
            rows = self.conn.execute(q, names).fetchall()
        else:
            rows = self.conn.execute(f"SELECT {', '.join(RUN_COLUMNS)} FROM runs ORDER BY id").fetchall()
        return [check_run_row(self.path, r) for r in rows]

    def budgets(self, budget: str | None = None) -> list[BudgetSummary]:
        """Summaries (spent and reserved include the budgets below), of ``budget`` and its sub-budgets or of all."""
        every = self._budget_rows(self.conn)
        if budget:
            below = set(self._subtree(self.conn, budget)) - {budget}
            names = ([budget] if budget in every else []) + sorted(n for n in below if n in every)
        else:
            names = sorted(every)
        out = []
        for name in names:
            ceiling, parent = every[name]
            self._chain(every, name)
            spent, reserved = self._totals(self.conn, name)
            sub = self._subtree(self.conn, name)            # like spent and reserved: the budgets part of it count
            n, flagged = self.conn.execute(f"SELECT COUNT(*), COALESCE(SUM(status = 'unfinished'), 0) FROM runs "
                                           f"WHERE budget IN ({', '.join('?' * len(sub))})", sub).fetchone()
            out.append(BudgetSummary(name, ceiling, spent, reserved, ceiling - spent - reserved, n, flagged, parent))
        return out
