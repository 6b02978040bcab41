"""Nested budgets (a $3 lab inside a $5 total), set-up hours, a schema-1 ledger migrated, tampered rows
named in one line, and a lost ledger that is not silently started again."""

import json
import os
import sqlite3

import pytest

from conftest import cli_main, hand_edit
from shardlab.errors import ShardlabError
from shardlab.ledger import Ledger, LedgerError, Refusal, RunRequest


def req(budget="lab", ceiling=None, price=1.0, hours=1.0, gpus=1, setup_hours=0.0, parent=None):
    return RunRequest(budget=budget, ceiling_usd=ceiling, command="python lab.py", shell=False, gpus=gpus, gpu="rtx-4090",
                      price_per_gpu_hour=price, price_source="given", hours=hours, grace_s=0.0, setup_hours=setup_hours,
                      parent=parent)


def test_a_lab_inside_a_total_both_ceilings_bind(tmp_path):
    with Ledger(tmp_path / "l.sqlite") as led:
        led.set_budget("total", 5.0)
        led.set_budget("lab", 3.0, parent="total")
        a, _ = led.reserve(req(hours=2.0))                        # $2 of the lab's $3
        with pytest.raises(Refusal) as e:                         # $1.50 more: over the lab's $3
            led.reserve(req(hours=1.5))
        assert e.value.binding == "lab"
        led.reserve(req(budget="other", ceiling=10.0, parent="total", hours=2.5))   # total: 2 + 2.5 = 4.5 of 5
        with pytest.raises(Refusal) as e:                         # the lab has $1 left, the total only $0.50
            led.reserve(req(hours=0.9))
        assert e.value.binding == "total" and "part of 'total'" in str(e.value)
        assert "--budget-name total --set-ceiling" in str(e.value)
        led.finish(a.id, status="finished", exit_code=0, wall_s=1800, actual_usd=0.5)
        b = {x.name: x for x in led.budgets()}
        assert b["total"].spent_usd == pytest.approx(0.5) and b["total"].reserved_usd == pytest.approx(2.5)
        assert b["lab"].parent == "total" and b["lab"].remaining_usd == pytest.approx(2.5)
        assert [x.name for x in led.budgets("total")] == ["total", "lab", "other"]
        assert len(led.runs("total")) == 2 and len(led.runs("lab")) == 1


def test_budget_parents_must_exist_and_never_loop(tmp_path):
    with Ledger(tmp_path / "l.sqlite") as led:
        with pytest.raises(ShardlabError, match="does not exist"):
            led.set_budget("lab", 3.0, parent="total")
        led.set_budget("total", 5.0)
        led.set_budget("lab", 3.0, parent="total")
        with pytest.raises(ShardlabError, match="own ancestor"):
            led.set_budget("total", None, parent="lab")
        for i in range(6):
            led.set_budget(f"b{i}", 1.0, parent="lab" if i == 0 else f"b{i - 1}")
        with pytest.raises(ShardlabError, match="nest at most 8"):
            led.set_budget("deep", 1.0, parent="b5")


def test_setup_hours_count_in_estimate_and_reservation(tmp_path):
    with Ledger(tmp_path / "l.sqlite") as led:
        run, _ = led.reserve(req(ceiling=10.0, gpus=2, price=0.35, hours=2.5, setup_hours=0.5))
        assert run.setup_hours == 0.5 and run.estimate_usd == pytest.approx(2.10)       # the course's sentence
        assert run.reserved_usd == pytest.approx(2.10)


def test_cli_sets_budgets_and_shows_parent_and_setup(tmp_path):
    path = str(tmp_path / "l.sqlite")
    code, out, err = cli_main("ledger", "--ledger", path, "--budget-name", "total", "--set-ceiling", "5")
    assert code == 0, err
    code, out, err = cli_main("ledger", "--ledger", path, "--budget-name", "lab", "--set-ceiling", "3", "--parent", "total",
                              "--json")
    assert code == 0, err
    d = json.loads(out)
    assert [b["name"] for b in d["budgets"]] == ["lab"] and d["budgets"][0]["parent"] == "total"
    with Ledger(path) as led:
        led.reserve(req(gpus=2, price=0.35, hours=2.5, setup_hours=0.5))
    code, out, _ = cli_main("ledger", "--ledger", path)
    assert code == 0 and "part of" in out and "0.5 h" in out
    md = tmp_path / "r.md"
    code, _, _ = cli_main("ledger", "--ledger", path, "--markdown", str(md))
    assert code == 0 and "| set-up h |" in md.read_text() and "| lab | total |" in md.read_text()
    code, _, err = cli_main("ledger", "--ledger", path, "--set-ceiling", "3")
    assert code == 2 and "--budget-name" in err


def test_schema_1_ledger_is_migrated(tmp_path):
    path = tmp_path / "old.sqlite"
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE budgets (name TEXT PRIMARY KEY, ceiling_usd REAL NOT NULL, created_at TEXT NOT NULL,
                              updated_at TEXT NOT NULL);
        CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, budget TEXT NOT NULL, command TEXT NOT NULL,
            shell INTEGER NOT NULL, gpus INTEGER NOT NULL, gpu TEXT NOT NULL, price_per_gpu_hour REAL NOT NULL,
            price_source TEXT NOT NULL, hours REAL NOT NULL, grace_s REAL NOT NULL, estimate_usd REAL NOT NULL,
            reserved_usd REAL NOT NULL, actual_usd REAL, status TEXT NOT NULL, started_at TEXT NOT NULL, ended_at TEXT,
            wall_s REAL, exit_code INTEGER, note TEXT NOT NULL DEFAULT '', host TEXT NOT NULL, guard_pid INTEGER NOT NULL,
            guard_start TEXT, cwd TEXT NOT NULL);
        INSERT INTO budgets VALUES ('exp', 10, '2026-01-01T00:00:00+00:00', '2026-01-01T00:00:00+00:00');
        INSERT INTO runs (budget, command, shell, gpus, gpu, price_per_gpu_hour, price_source, hours, grace_s,
            estimate_usd, reserved_usd, actual_usd, status, started_at, ended_at, wall_s, exit_code, host, guard_pid, cwd)
        VALUES ('exp', 'x', 0, 1, 'g', 1, 's', 1, 0, 1, 1, 0.5, 'finished', '2026-01-01T00:00:00+00:00',
            '2026-01-01T00:30:00+00:00', 1800, 0, 'h', 1, '/');
        PRAGMA user_version = 1;
    """)
    con.close()
    with Ledger(path) as led:
        run, = led.runs()
        assert run.setup_hours == 0 and led.budgets()[0].parent is None and led.budgets()[0].spent_usd == 0.5
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == 2


@pytest.mark.parametrize("column, value, fragment", [
    ("actual_usd", "'lots'", "run 1 has an invalid actual_usd ('lots')"),
    ("started_at", "'yesterday'", "run 1 has an invalid started_at ('yesterday')"),
    ("gpus", "'two'", "run 1 has an invalid gpus"),
    ("status", "'paused'", "run 1 has an invalid status"),
    ("reserved_usd", "-1", "run 1 has an invalid reserved_usd"),
    ("actual_usd", "1.5e308", "run 1 has an invalid actual_usd (1.5e+308)"),      # totals would overflow to inf
    ("guard_pid", str(2**62), "run 1 has an invalid guard_pid"),                   # os.kill would overflow
    ("guard_pid", "-1", "run 1 has an invalid guard_pid"),                         # -1 names every process
])
def test_tampered_rows_are_named_never_a_traceback(tmp_path, column, value, fragment):
    path = tmp_path / "l.sqlite"
    with Ledger(path) as led:
        run, _ = led.reserve(req(ceiling=10.0))
        led.finish(run.id, status="finished", exit_code=0, wall_s=1, actual_usd=0.1)
    hand_edit(path, f"UPDATE runs SET {column} = {value} WHERE id = 1")
    before = path.read_bytes()
    for args in (["ledger", "--ledger", str(path)], ["ledger", "--ledger", str(path), "--json"],
                 ["guard", "--ledger", str(path), "--budget-name", "lab", "--gpus", "1", "--price", "1", "--hours", "0.001",
                  "--", "true"]):
        code, out, err = cli_main(*args)
        assert code == 2 and fragment in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert path.read_bytes() == before


def test_tampered_budget_row(tmp_path):
    path = tmp_path / "l.sqlite"
    with Ledger(path) as led:
        led.set_budget("total", 5.0)
    hand_edit(path, "PRAGMA ignore_check_constraints = 1", "UPDATE budgets SET ceiling_usd = 'x'")
    code, _, err = cli_main("ledger", "--ledger", str(path))
    assert code == 2 and "budget 'total' has an invalid ceiling_usd" in err


def test_an_emptied_ledger_with_a_backup_is_not_started_again(tmp_path):
    path = tmp_path / "l.sqlite"
    with Ledger(path) as led:
        run, _ = led.reserve(req(ceiling=10.0))
        led.finish(run.id, status="finished", exit_code=0, wall_s=1, actual_usd=0.1)
    backup = tmp_path / "l.sqlite.bak"
    assert backup.stat().st_size > 0
    path.write_bytes(b"")                                        # truncated by accident
    for args in (["ledger", "--ledger", str(path)],
                 ["guard", "--ledger", str(path), "--budget-name", "lab", "--ceiling", "5", "--gpus", "1", "--price", "1",
                  "--hours", "0.001", "--", "true"]):
        code, _, err = cli_main(*args)
        assert code == 2 and "is empty (0 bytes)" in err and "l.sqlite.bak" in err and "restore it" in err, err
    assert path.read_bytes() == b"" and backup.stat().st_size > 0
    os.unlink(path)                                              # deleted: the same
    code, _, err = cli_main("ledger", "--ledger", str(path))
    assert code == 2 and "does not exist" in err and not path.exists()
    os.replace(backup, path)                                     # restored as the message says
    with Ledger(path) as led:
        assert len(led.runs()) == 1
    with pytest.raises(LedgerError, match="is not a regular file|is a directory"):
        Ledger(tmp_path)


# -- from a review of the guard and the ledger ------------------------------------------------------------------

def test_guard_keeps_the_exit_code_when_the_end_cannot_be_recorded(tmp_path, monkeypatch):
    """A full disk at the run's end: the command's exit code is kept, the outcome is reported, and the ledger
    keeps the run 'running' (settled later as 'unfinished' at its full reservation)."""
    import sys

    from shardlab import guard

    path, lines = tmp_path / "l.sqlite", []
    monkeypatch.setattr(guard, "FINISH_RETRY_WAITS_S", (0.0, 0.0))
    tries = []

    def full_disk(self, run_id, **kw):
        tries.append(run_id)
        raise LedgerError(f"ledger {self.path}: database or disk is full; nothing was written")

    monkeypatch.setattr(Ledger, "finish", full_disk)
    out = guard.run_guarded(req(ceiling=5.0), [sys.executable, "-c", "raise SystemExit(3)"], path, log=lines.append)
    assert out.exit_code == 3 and not out.recorded and len(tries) == 3
    assert out.run.status == "failed" and out.run.exit_code == 3 and out.run.actual_usd == pytest.approx(1.0)
    assert any("could not record the end of run #1" in x and "disk is full" in x for x in lines)
    monkeypatch.undo()
    with Ledger(path) as led:
        assert led.run(1).status == "running"


def test_ledger_view_with_only_the_backup_left_says_restore(tmp_path):
    path = tmp_path / "l.sqlite"
    with Ledger(path) as led:
        led.set_budget("lab", 3.0)
    os.unlink(path)
    assert (tmp_path / "l.sqlite.bak").exists()
    for extra in ([], ["--ledger", str(path)]):
        env = {} if extra else {"SHARDLAB_LEDGER": str(path)}
        old = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            code, out, err = cli_main("ledger", *extra)
        finally:
            for k, v in old.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        assert code == 2 and "no ledger" not in out and "cp " in err and "l.sqlite.bak" in err, (extra, out, err)


def test_read_only_ledger_is_shown_not_written(tmp_path, monkeypatch):
    """A ledger on a read-only file system (simulated: the tests may run as root) can be viewed; commands that
    write say why they cannot, in one line."""
    from shardlab.ledger import schema

    path = tmp_path / "l.sqlite"
    with Ledger(path) as led:
        led.reserve(req(ceiling=5.0))
    real_access = os.access
    monkeypatch.setattr(schema.os, "access", lambda p, mode: real_access(p, mode) and not mode & os.W_OK)
    monkeypatch.setattr(schema, "_why_readonly", lambda p: "it is on a read-only file system")
    code, out, err = cli_main("ledger", "--ledger", str(path), "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["read_only"] is True and doc["runs"][0]["status"] == "running" and doc["recovered_unfinished"] == []
    code, out, err = cli_main("ledger", "--ledger", str(path))
    assert code == 0 and "read-only ledger" in out
    code, _, err = cli_main("ledger", "--ledger", str(path), "--budget-name", "lab", "--set-ceiling", "9")
    assert code == 2 and "read-only file system" in err and "permission" not in err and len(err.strip().splitlines()) == 1
    with pytest.raises(LedgerError, match="cannot write ledger"):
        Ledger(path)


def test_lowering_a_ceiling_or_moving_a_budget_under_a_small_parent_warns(tmp_path):
    path = str(tmp_path / "l.sqlite")
    with Ledger(path) as led:
        run, _ = led.reserve(req(ceiling=5.0, hours=2.0))
        led.finish(run.id, status="finished", exit_code=0, wall_s=7200, actual_usd=2.0)
    code, out, err = cli_main("ledger", "--ledger", path, "--budget-name", "lab", "--set-ceiling", "1.5")
    assert code == 0 and "warning: budget 'lab' now has $2.00 spent and reserved, over its ceiling $1.50" in out
    code, out, _ = cli_main("ledger", "--ledger", path, "--budget-name", "small", "--set-ceiling", "1", "--json")
    assert json.loads(out)["over_ceiling"] == []
    code, out, _ = cli_main("ledger", "--ledger", path, "--budget-name", "lab", "--parent", "small", "--json")
    over = json.loads(out)["over_ceiling"]
    assert {x["budget"] for x in over} == {"lab", "small"} and all(x["committed_usd"] == 2.0 for x in over)


def test_a_parent_budget_counts_the_runs_of_the_budgets_part_of_it(tmp_path):
    with Ledger(tmp_path / "l.sqlite") as led:
        led.set_budget("total", 10.0)
        led.reserve(req(ceiling=3.0, parent="total"))
        led.reserve(req(budget="other", ceiling=3.0, parent="total"))
        b = {x.name: x for x in led.budgets()}
    assert (b["total"].runs, b["lab"].runs, b["other"].runs) == (2, 1, 1)


def test_backup_temporaries_of_a_killed_guard_are_removed(tmp_path):
    path = tmp_path / "l.sqlite"
    dead = tmp_path / "l.sqlite.bak.4194305999.tmp"          # no process can have this pid
    live = tmp_path / f"l.sqlite.bak.{os.getppid()}.tmp"     # a live process's file is left alone
    other = tmp_path / "notes.bak.1.tmp"
    for f in (dead, live, other):
        f.write_bytes(b"x")
    with Ledger(path) as led:
        led.set_budget("lab", 3.0)
    assert not dead.exists() and live.exists() and other.exists() and (tmp_path / "l.sqlite.bak").exists()


def test_markdown_report_keeps_commands_with_backticks_and_pipes_intact(tmp_path):
    from markdown_it import MarkdownIt

    path = tmp_path / "l.sqlite"
    cmd = "echo `date` | tee ``x``"
    with Ledger(path) as led:
        r = req(ceiling=5.0)
        r.command, r.shell = cmd, True
        led.reserve(r)
    md = tmp_path / "r.md"
    code, _, err = cli_main("ledger", "--ledger", str(path), "--markdown", str(md))
    assert code == 0, err
    tokens = MarkdownIt("commonmark").enable("table").parse(md.read_text())
    codes = [c.content for t in tokens if t.type == "inline" for c in (t.children or []) if c.type == "code_inline"]
    assert cmd in codes, codes


def test_a_ledger_labelled_older_than_it_is_opens(tmp_path):
    """user_version 1 on a file that already has schema 2's columns (a hand edit, a restored header): the
    migration adds only what is missing instead of failing with 'duplicate column name'."""
    path = tmp_path / "l.sqlite"
    with Ledger(path) as led:
        led.reserve(req(ceiling=5.0, setup_hours=0.5))
    hand_edit(path, "PRAGMA user_version = 1")
    code, out, err = cli_main("ledger", "--ledger", str(path), "--json")
    assert code == 0, err
    assert json.loads(out)["runs"][0]["setup_hours"] == 0.5
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA user_version").fetchone()[0] == 2
    con.close()
