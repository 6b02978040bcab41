"""The ledger: reserve or refuse in one transaction, ceilings, recovery of runs whose guard died,
corrupt files left untouched, reports. In-process (fast); the guard's subprocess tests are in test_guard.py."""

import hashlib
import json
import os
import subprocess
import sys
import threading

import pytest

from conftest import cli_main, hand_edit
from shardlab.errors import ShardlabError
from shardlab.ledger import Ledger, LedgerError, Refusal, RunRequest, default_ledger_path
from shardlab.ledger.report import markdown_report


def req(budget="exp", ceiling=10.0, gpus=1, price=1.0, hours=1.0, grace_s=0.0, command="python train.py"):
    return RunRequest(budget=budget, ceiling_usd=ceiling, command=command, shell=False, gpus=gpus, gpu="rtx-4090",
                      price_per_gpu_hour=price, price_source="given with --price", hours=hours, grace_s=grace_s)


def digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait(timeout=30)
    return p.pid


def test_default_path_order(monkeypatch, tmp_path):
    monkeypatch.setenv("SHARDLAB_LEDGER", str(tmp_path / "a.sqlite"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_ledger_path() == tmp_path / "a.sqlite"
    monkeypatch.delenv("SHARDLAB_LEDGER")
    assert default_ledger_path() == tmp_path / "xdg" / "shardlab" / "ledger.sqlite"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_ledger_path() == tmp_path / ".local" / "share" / "shardlab" / "ledger.sqlite"


def test_reserve_refuse_finish_and_totals(tmp_path):
    with Ledger(tmp_path / "l.sqlite") as led:
        run, change = led.reserve(req(ceiling=10, gpus=2, price=2.0, hours=1.5, grace_s=36))   # 6.00 + 0.04 grace
        assert change is None and run.status == "running" and run.estimate_usd == pytest.approx(6.0)
        assert run.reserved_usd == pytest.approx(6.04)
        b, = led.budgets()
        assert (b.spent_usd, b.reserved_usd, b.remaining_usd) == pytest.approx((0, 6.04, 3.96))
        with pytest.raises(Refusal) as e:
            led.reserve(req(ceiling=None, price=4.0))                       # 4.00 > 3.96 left
        msg = str(e.value)
        assert e.value.exit_code == 3
        assert "estimate $4.00" in msg and "spent so far $0.00" in msg and "reserved by running jobs $6.04" in msg
        assert "ceiling $10.00" in msg
        done = led.finish(run.id, status="finished", exit_code=0, wall_s=1800, actual_usd=2.0)
        assert done.status == "finished" and done.ended_at
        b, = led.budgets()
        assert (b.spent_usd, b.reserved_usd, b.remaining_usd) == pytest.approx((2.0, 0, 8.0))
        run2, _ = led.reserve(req(ceiling=None, price=4.0))                 # fits now
        assert led.finish(run.id, status="failed", exit_code=1, wall_s=1, actual_usd=9).status == "finished"
        assert [r.id for r in led.runs()] == [run.id, run2.id]


def test_ceiling_required_first_then_explicit_change(tmp_path):
    with Ledger(tmp_path / "l.sqlite") as led:
        with pytest.raises(ShardlabError, match="is new: set its ceiling with --ceiling"):
            led.reserve(req(ceiling=None))
        assert led.budgets() == [] and led.runs() == []
        led.reserve(req(ceiling=5))
        run, change = led.reserve(req(ceiling=None))
        assert change is None and led.budgets()[0].ceiling_usd == 5
        run, change = led.reserve(req(ceiling=8))
        assert change == (5, 8) and "ceiling changed from $5.00 to $8.00" in run.note
        with pytest.raises(Refusal) as e:                                   # lowering it persists, then refuses
            led.reserve(req(ceiling=2))
        assert e.value.ceiling_change == (8, 2) and led.budgets()[0].ceiling_usd == 2


def test_concurrent_reservations_never_exceed_the_ceiling(tmp_path):
    path = tmp_path / "l.sqlite"
    Ledger(path).close()
    outcomes = []

    def worker():
        with Ledger(path) as led:
            try:
                led.reserve(req(ceiling=5.5, price=1.0))
                outcomes.append("ok")
            except Refusal:
                outcomes.append("refused")

    threads = [threading.Thread(target=worker) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(outcomes) == ["ok"] * 5 + ["refused"] * 7
    with Ledger(path) as led:
        b, = led.budgets()
        assert b.reserved_usd == pytest.approx(5.0) and b.reserved_usd <= b.ceiling_usd


def test_dead_guard_and_overdue_runs_become_unfinished_charged_as_reserved(tmp_path):
    path = tmp_path / "l.sqlite"
    with Ledger(path) as led:
        a, _ = led.reserve(req(hours=1, grace_s=36))          # guard died: charged its reservation
        b, _ = led.reserve(req(ceiling=None, hours=0.001))    # our own pid, but long overdue
        c, _ = led.reserve(req(ceiling=None, hours=1))        # our own pid, in time: still running
    hand_edit(path, ("UPDATE runs SET guard_pid = ? WHERE id = ?", (dead_pid(), a.id)),
              ("UPDATE runs SET started_at = '2020-01-01T00:00:00+00:00' WHERE id = ?", (b.id,)))
    with Ledger(path) as led:
        assert led.recover_unfinished() == [a.id, b.id]
        runs = {r.id: r for r in led.runs()}
        assert runs[a.id].status == "unfinished" and runs[a.id].actual_usd == pytest.approx(1.01)
        assert "charged as its full reservation" in runs[a.id].note and runs[a.id].to_dict()["flagged"]
        assert runs[c.id].status == "running"
        bud, = led.budgets()
        assert bud.unfinished == 2 and bud.spent_usd == pytest.approx(1.01 + 0.001)
        # an unfinished run is settled: a late finish() does not rewrite it
        assert led.finish(a.id, status="finished", exit_code=0, wall_s=1, actual_usd=0).status == "unfinished"
        assert led.recover_unfinished() == []


def _corrupt_pages(path):
    with Ledger(path) as led:
        for _ in range(3):
            led.reserve(req(ceiling=100, command="x" * 3000))
    with open(path, "r+b") as f:
        f.seek(4096)
        f.write(b"\xff" * 8192)


@pytest.mark.parametrize("make", [
    lambda p: p.write_bytes(b"this is not a database\n" * 50),
    lambda p: p.write_bytes(b"SQLit"),
    _corrupt_pages,
])
def test_corrupt_ledger_is_reported_and_left_untouched(tmp_path, make):
    path = tmp_path / "l.sqlite"
    make(path)
    before, listing = digest(path), {f: digest(tmp_path / f) for f in os.listdir(tmp_path)}
    with pytest.raises(LedgerError, match="unreadable or corrupt.*left untouched"):
        Ledger(path)
    code, out, err = cli_main("ledger", "--ledger", str(path))
    assert code == 2 and "corrupt" in err and err.count("\n") == 1
    code, out, err = cli_main("guard", "--ledger", str(path), "--budget-name", "b", "--ceiling", "9", "--gpus", "1",
                              "--price", "1", "--hours", "1", "--", sys.executable, "-c", f"open({str(tmp_path / 'ran')!r}, 'w')")
    assert code == 2 and "corrupt" in err
    assert not (tmp_path / "ran").exists()
    assert digest(path) == before and {f: digest(tmp_path / f) for f in os.listdir(tmp_path)} == listing


def test_other_sqlite_database_is_not_taken_over(tmp_path):
    path = tmp_path / "other.db"
    hand_edit(path, "CREATE TABLE notes (x)")
    before = digest(path)
    with pytest.raises(LedgerError, match="not a shardlab ledger"):
        Ledger(path)
    assert digest(path) == before


def test_empty_file_becomes_a_ledger_and_directories_are_refused(tmp_path):
    (tmp_path / "empty.sqlite").write_bytes(b"")
    Ledger(tmp_path / "empty.sqlite").close()
    with pytest.raises(LedgerError, match="is a directory"):
        Ledger(tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_ledger(tmp_path):
    path = tmp_path / "l.sqlite"
    Ledger(path).close()
    path.chmod(0)
    try:
        with pytest.raises(LedgerError, match="permission denied"):
            Ledger(path)
    finally:
        path.chmod(0o600)


def test_ledger_cli_json_markdown_and_missing(tmp_path):
    path = tmp_path / "l.sqlite"
    code, out, _ = cli_main("ledger", "--ledger", str(path))
    assert code == 2 and not path.exists()                    # an explicit path that does not exist: say so
    with Ledger(path) as led:
        r1, _ = led.reserve(req(budget="exp-a", ceiling=10, price=2, command="python a.py | tee"))
        led.finish(r1.id, status="finished", exit_code=0, wall_s=900, actual_usd=0.5)
        r2, _ = led.reserve(req(budget="exp-b", ceiling=3, price=1))
    hand_edit(path, ("UPDATE runs SET guard_pid = ? WHERE id = ?", (dead_pid(), r2.id)))
    code, out, err = cli_main("ledger", "--ledger", str(path), "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["recovered_unfinished"] == [r2.id]
    bud = {b["name"]: b for b in d["budgets"]}
    assert set(bud["exp-a"]) >= {"name", "ceiling_usd", "spent_usd", "reserved_usd", "remaining_usd"}
    assert bud["exp-a"]["remaining_usd"] == pytest.approx(9.5) and bud["exp-b"]["spent_usd"] == pytest.approx(1.0)
    for r in d["runs"]:
        assert set(r) >= {"budget", "command", "estimate_usd", "actual_usd", "status", "started_at", "ended_at", "exit_code"}
    assert [r["status"] for r in d["runs"]] == ["finished", "unfinished"]
    code, out, _ = cli_main("ledger", "--ledger", str(path), "--budget-name", "exp-b")
    assert code == 0 and "! unfinished" in out and "exp-a" not in out
    code, _, err = cli_main("ledger", "--ledger", str(path), "--budget-name", "exp-c")
    assert code == 2 and "did you mean" in err
    md = tmp_path / "ledger.md"
    code, out, _ = cli_main("ledger", "--ledger", str(path), "--markdown", str(md))
    assert code == 0 and f"wrote {md}" in out
    text = md.read_text()
    assert text.startswith("# GPU spend ledger") and "| exp-a | - | $10.00 | $0.50 | $0.00 | $9.50 | 1 | 0 |" in text
    assert "`python a.py \\| tee`" in text and "**unfinished**" in text and "25%" in text
    assert "## Price sources" in text and "given with --price" in text
    code, _, err = cli_main("ledger", "--ledger", str(path), "--markdown", str(md), "--json")
    assert code == 2


def test_markdown_report_without_runs():
    text = markdown_report("x.sqlite", [], [], "2026-01-01T00:00:00+00:00")
    assert "No budgets yet." in text and "No runs yet." in text


def test_reports_never_overwrite_the_ledger_or_its_backup(tmp_path):
    """`ledger --markdown` (or any output flag) pointed at an SQLite file: one line, exit 2, the database intact."""
    led = tmp_path / "l.sqlite"
    code, _, err = cli_main("ledger", "--ledger", str(led), "--budget-name", "a", "--set-ceiling", "5")
    assert code == 0, err
    before = hashlib.sha256(led.read_bytes()).hexdigest()
    for target in (led, tmp_path / "l.sqlite.bak"):
        if not target.exists():
            continue
        code, out, err = cli_main("ledger", "--ledger", str(led), "--markdown", str(target))
        assert code == 2 and err.count("\n") == 1 and ("SQLite database" in err or "file this command reads" in err)
    assert hashlib.sha256(led.read_bytes()).hexdigest() == before
    code, out, _ = cli_main("ledger", "--ledger", str(led), "--json")
    assert code == 0 and json.loads(out)["budgets"][0]["name"] == "a"


def test_invalid_utf8_written_by_hand_is_shown_escaped_not_a_crash(tmp_path):
    path = tmp_path / "l.sqlite"
    with Ledger(path) as led:
        run, _ = led.reserve(req(budget="lab"))
        led.finish(run.id, status="finished", exit_code=0, wall_s=1, actual_usd=0.1)
    hand_edit(path, "UPDATE runs SET note = CAST(x'ff41' AS TEXT), command = CAST(x'fe42' AS TEXT)")
    code, out, err = cli_main("ledger", "--ledger", str(path), "--json")
    assert code == 0, err
    r, = json.loads(out)["runs"]
    assert r["command"] == "\\xfeB" and r["budget"] == "lab"          # the bytes escaped, the record kept
    code, out, err = cli_main("ledger", "--ledger", str(path))
    assert code == 0 and "\\xfeB" in out and "Traceback" not in err


def test_a_guard_cannot_move_a_budget_out_of_its_total(tmp_path):
    import dataclasses

    with Ledger(tmp_path / "l.sqlite") as led:
        led.set_budget("course", 5.0)
        led.set_budget("other", 100.0)
        led.set_budget("lab", 5.0, parent="course")
        run, _ = led.reserve(dataclasses.replace(req(budget="lab", ceiling=None, price=3.6), parent="course"))
        led.finish(run.id, status="finished", exit_code=0, wall_s=3600, actual_usd=3.6)
        # one guard call naming another parent would take the lab's $3.60 out of the $5 course total
        with pytest.raises(ShardlabError, match="is part of 'course'; the guard does not move"):
            led.reserve(dataclasses.replace(req(budget="lab", ceiling=None), parent="other"))
        assert {b.name: b.parent for b in led.budgets()}["lab"] == "course"
        assert led.set_budget("lab", None, parent="other") is None        # the ledger moves it, on purpose
        assert {b.name: b.parent for b in led.budgets()}["lab"] == "other"
        with pytest.raises(ShardlabError, match="set its ceiling with --set-ceiling USD"):
            led.set_budget("new", None, parent="course")


def test_a_refusal_says_the_ceiling_it_changed_is_kept(tmp_path):
    with Ledger(tmp_path / "l.sqlite") as led:
        led.set_budget("exp", 50.0)
        with pytest.raises(Refusal) as e:
            led.reserve(req(ceiling=0.5))
        assert "--ceiling changed it from $50.00, and the change is kept" in str(e.value)
        assert e.value.ceiling_change == (50.0, 0.5) and led.budgets()[0].ceiling_usd == 0.5


def test_a_run_filed_under_no_budget_is_refused(tmp_path):
    path = tmp_path / "l.sqlite"
    with Ledger(path) as led:
        run, _ = led.reserve(req())
        led.finish(run.id, status="finished", exit_code=0, wall_s=3600, actual_usd=1.0)
    hand_edit(path, "UPDATE runs SET budget = 'ghost'")
    code, _, err = cli_main("ledger", "--ledger", str(path))
    assert code == 2 and "filed under budget 'ghost', which the ledger does not hold" in err, err


def test_ledger_json_without_a_ledger_has_every_key(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDLAB_LEDGER", str(tmp_path / "none.sqlite"))
    code, out, err = cli_main("ledger", "--json")
    d = json.loads(out)
    assert code == 0 and d["exists"] is False and not (tmp_path / "none.sqlite").exists()
    assert d["read_only"] is False and d["recovered_unfinished"] == [] and d["over_ceiling"] == []


@pytest.mark.parametrize("args, words", [
    (["ledger", "--budget-name", "x", "--parent", "y"], "set its ceiling with --set-ceiling"),
    (["guard", "--budget-name", "x", "--gpus", "1", "--price", "1", "--hours", "0.01", "--", "true"],
     "set its ceiling with --ceiling"),
    (["guard", "--budget-name", "x", "--ceiling", "1", "--parent", "zz", "--gpus", "1", "--price", "1", "--hours",
      "0.01", "--", "true"], "parent budget 'zz' does not exist"),
])
def test_a_refused_first_call_leaves_no_empty_ledger(tmp_path, monkeypatch, args, words):
    monkeypatch.setenv("SHARDLAB_LEDGER", str(tmp_path / "l.sqlite"))
    code, _, err = cli_main(*args)
    assert code == 2 and words in err, err
    assert os.listdir(tmp_path) == []
