"""The guard with real subprocesses and short sleeps: refusal, time-limit kill, signal forwarding, a guard
killed with SIGKILL mid-run, and several guards racing for the last dollars of one budget."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import cli_main
from shardlab.ledger.store import _pid_alive

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups and /proc: Linux")

PY = sys.executable


def guard_cmd(ledger, *args):
    return [PY, "-m", "shardlab", "guard", "--ledger", str(ledger), *args]


def guard(ledger, *args, timeout=60):
    return subprocess.run(guard_cmd(ledger, *args), capture_output=True, text=True, timeout=timeout)


def ledger_doc(ledger):
    r = subprocess.run([PY, "-m", "shardlab", "ledger", "--ledger", str(ledger), "--json"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def child(code: str) -> list[str]:
    return [PY, "-c", code]


def wait_for(pred, timeout_s=20.0, what="condition"):
    t = time.monotonic()
    while time.monotonic() - t < timeout_s:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def started_child(flag) -> str:
    """A child that writes its pid to ``flag``, then sleeps 30 s (then writes flag + '.survived')."""
    return f"import os,time; open({str(flag)!r}, 'w').write(str(os.getpid())); time.sleep(30); open({str(flag) + '.survived'!r}, 'w')"


def start_guarded_sleeper(led, flag, *args) -> subprocess.Popen:
    """A guard (budget 'exp', ceiling $1) running ``started_child(flag)``; returns once the child runs."""
    p = subprocess.Popen(guard_cmd(led, "--budget-name", "exp", "--ceiling", "1", *args, "--", *child(started_child(flag))),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: flag.exists() and flag.read_text(), what="the child to start")
    return p


def test_runs_records_and_passes_the_exit_code(tmp_path):
    led = tmp_path / "l.sqlite"
    r = guard(led, "--budget-name", "exp", "--ceiling", "5", "--gpus", "2", "--price", "0.5", "--hours", "1",
              "--", *child("import sys; print('from child'); sys.exit(7)"))
    assert r.returncode == 7 and "from child" in r.stdout
    assert "run #1" in r.stderr and "failed (exit 7)" in r.stderr
    run, = ledger_doc(led)["runs"]
    assert run["status"] == "failed" and run["exit_code"] == 7 and run["estimate_usd"] == pytest.approx(1.0)
    assert 0 <= run["actual_usd"] < 0.05 and run["ended_at"] and run["command"].endswith("sys.exit(7)'")


def test_json_mode_prints_one_document_child_output_on_stderr(tmp_path):
    r = guard(tmp_path / "l.sqlite", "--budget-name", "exp", "--ceiling", "5", "--gpus", "1", "--gpu", "rtx-4090",
              "--hours", "1", "--json", "--shell", "--", "echo hello; echo $((6*7))")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["run"]["status"] == "finished" and d["run"]["shell"] and d["exit_code"] == 0
    assert d["run"]["price_per_gpu_hour"] == 0.40 and "rtx-4090/default" in d["run"]["price_source"]
    assert d["budget"]["remaining_usd"] < 5 and "hello" in r.stderr and "42" in r.stderr


def test_refusal_exit_3_nothing_started(tmp_path):
    led, flag = tmp_path / "l.sqlite", tmp_path / "ran"
    r = guard(led, "--budget-name", "tight", "--ceiling", "1", "--gpus", "2", "--price", "1", "--hours", "1",
              "--", *child(f"open({str(flag)!r}, 'w')"))
    assert r.returncode == 3 and r.stdout == ""
    assert "refused" in r.stderr and "estimate $2.00" in r.stderr and "spent so far $0.00" in r.stderr
    assert "ceiling $1.00" in r.stderr and r.stderr.count("\n") == 1
    assert not flag.exists()
    r = guard(led, "--budget-name", "tight", "--gpus", "2", "--price", "1", "--hours", "1", "--json", "--", "true")
    assert r.returncode == 3 and json.loads(r.stdout)["refused"] is True
    d = ledger_doc(led)
    assert d["runs"] == [] and d["budgets"][0]["ceiling_usd"] == 1.0


def test_time_limit_sigterm_then_sigkill(tmp_path):
    led = tmp_path / "l.sqlite"
    common = ["--budget-name", "exp", "--gpus", "1", "--price", "1", "--hours", "0.0005", "--grace-s", "1"]
    stubborn = child("import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(30)")
    guard(led, "--budget-name", "exp", "--ceiling", "1", "--gpus", "1", "--price", "1", "--hours", "0.001", "--", "true")
    t = time.monotonic()
    procs = [subprocess.Popen(guard_cmd(led, *common, "--", *stubborn), stdout=subprocess.PIPE, stderr=subprocess.PIPE),
             subprocess.Popen(guard_cmd(led, *common, "--", "sleep", "30"), stdout=subprocess.PIPE, stderr=subprocess.PIPE)]
    codes = [p.wait(timeout=40) for p in procs]
    assert codes == [124, 124] and time.monotonic() - t < 25
    runs = {r["id"]: r for r in ledger_doc(led)["runs"]}
    for r in (runs[2], runs[3]):
        assert r["status"] == "killed-time-limit" and 1.7 < r["wall_s"] < 20
        assert r["actual_usd"] == pytest.approx(r["wall_s"] / 3600)
    ignored, polite = sorted((runs[2], runs[3]), key=lambda r: r["command"].startswith("sleep"))
    assert ignored["exit_code"] == 128 + signal.SIGKILL and "SIGKILL after 1 s" in ignored["note"]
    assert polite["exit_code"] == 128 + signal.SIGTERM and "SIGKILL" not in polite["note"]


def test_sigint_to_the_guard_is_passed_on_and_recorded(tmp_path):
    led, flag = tmp_path / "l.sqlite", tmp_path / "started"
    p = start_guarded_sleeper(led, flag, "--gpus", "1", "--price", "1", "--hours", "0.01", "--grace-s", "5")
    p.send_signal(signal.SIGINT)
    assert p.wait(timeout=30) == 130
    run, = ledger_doc(led)["runs"]
    assert run["status"] == "interrupted" and "SIGINT" in run["note"] and run["exit_code"] is not None
    assert not _pid_alive(int(flag.read_text()), None)


def test_guard_killed_mid_run_is_charged_as_reserved_on_the_next_call(tmp_path):
    led, flag = tmp_path / "l.sqlite", tmp_path / "started"
    p = start_guarded_sleeper(led, flag, "--gpus", "2", "--price", "1.8", "--hours", "0.1", "--grace-s", "10")
    p.kill()
    p.wait(timeout=30)
    child_pid = int(flag.read_text())
    wait_for(lambda: not _pid_alive(child_pid, None), timeout_s=10, what="the child to die with its guard")
    d = ledger_doc(led)
    run, = d["runs"]
    assert run["status"] == "unfinished" and run["flagged"] and run["ended_at"] is None
    assert run["actual_usd"] == pytest.approx(run["reserved_usd"]) == pytest.approx(2 * 1.8 * (0.1 + 10 / 3600))
    assert d["budgets"][0]["spent_usd"] == pytest.approx(run["reserved_usd"]) and d["recovered_unfinished"] == [1]
    r = guard(led, "--budget-name", "exp", "--gpus", "1", "--price", "1.8", "--hours", "0.5", "--", "true")
    assert r.returncode == 3 and "spent so far $0.37" in r.stderr     # 0.9 would pass 1.0 - 0.37
    assert not (tmp_path / "started.survived").exists()


def test_guards_racing_for_the_last_dollars(tmp_path):
    """Six guards at once; the ceiling pays for two. Children hold until every guard has decided."""
    led, release = tmp_path / "l.sqlite", tmp_path / "release"
    hold = child(f"import os,time\nt=time.time()\nwhile not os.path.exists({str(release)!r}) and time.time()-t<30: time.sleep(0.05)")
    args = ["--budget-name", "race", "--ceiling", "0.025", "--gpus", "1", "--price", "1", "--hours", "0.01", "--grace-s", "1"]
    procs = [subprocess.Popen(guard_cmd(led, *args, "--", *hold), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(6)]
    try:
        wait_for(lambda: sum(p.poll() is not None for p in procs) >= 4, timeout_s=40, what="four refusals")
        d = ledger_doc(led)
        assert d["budgets"][0]["reserved_usd"] <= 0.025 and len(d["runs"]) == 2
    finally:
        release.write_text("go")
        codes = sorted(p.wait(timeout=40) for p in procs)
    assert codes == [0, 0, 3, 3, 3, 3]
    d = ledger_doc(led)
    assert [r["status"] for r in d["runs"]] == ["finished", "finished"]
    assert sum(r["reserved_usd"] for r in d["runs"]) <= 0.025
    assert d["budgets"][0]["spent_usd"] <= 0.025


@pytest.mark.parametrize("args, fragment", [
    (["--budget-name", "b", "--ceiling", "5", "--gpus", "1", "--price", "1", "--hours", "1", "--"], "no command to run"),
    (["--budget-name", "b", "--ceiling", "5", "--gpus", "1", "--price", "1", "--hours", "1"], "no command to run"),
    (["--budget-name", "b", "--ceiling", "5", "--gpus", "1", "--hours", "1", "--", "true"], "no price"),
    (["--budget-name", "b", "--ceiling", "5", "--gpus", "1", "--gpu", "h100", "--hours", "1", "--", "true"], "did you mean"),
    (["--budget-name", "b", "--ceiling", "5", "--gpus", "1", "--price", "-2", "--hours", "1", "--", "true"], "positive"),
    (["--budget-name", "b", "--ceiling", "-5", "--gpus", "1", "--price", "2", "--hours", "1", "--", "true"], "zero or more"),
    (["--budget-name", "b", "--gpus", "1", "--price", "2", "--hours", "1", "--", "true"], "set its ceiling with --ceiling"),
])
def test_guard_bad_input(tmp_path, args, fragment):
    code, out, err = cli_main("guard", "--ledger", str(tmp_path / "l.sqlite"), *args)
    assert code == 2 and fragment in err and err.count("\n") == 1 and "Traceback" not in err


def test_command_not_found_is_refused_before_anything_is_reserved(tmp_path):
    led = tmp_path / "l.sqlite"
    for prog, where in (("shardlab-no-such-command", "is not on PATH"), ("/nonexistent/prog", "is not an executable file"),
                        (str(tmp_path), "is not an executable file")):
        r = guard(led, "--budget-name", "b", "--ceiling", "5", "--gpus", "1", "--price", "1", "--hours", "1",
                  "--", prog, "--flag")
        assert r.returncode == 2 and f"command not found: '{prog}' {where}" in r.stderr, r.stderr
        assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert not os.path.exists(led)


def test_command_that_cannot_start_is_recorded_as_failed(tmp_path):
    """Found on PATH but not startable (no #! line, not a binary): the run is recorded as failed, exit 126/127."""
    led, prog = tmp_path / "l.sqlite", tmp_path / "prog"
    prog.write_bytes(b"\x7fELF not really")
    prog.chmod(0o755)
    r = guard(led, "--budget-name", "b", "--ceiling", "5", "--gpus", "1", "--price", "1", "--hours", "1", "--", str(prog))
    assert r.returncode in (126, 127), r.stderr
    run, = ledger_doc(led)["runs"]
    assert run["status"] == "failed" and run["exit_code"] == r.returncode and run["actual_usd"] == 0


def test_a_loaded_machine_charges_the_command_time_not_the_guards_clean_up(tmp_path, monkeypatch):
    """The guard's own clean-up (slow on a loaded machine) is not run time: a command that finished in time is
    charged its measured seconds, not its whole reservation, and no note says the guard stopped it."""
    from shardlab import proctree

    slow_stop = proctree.ProcessTree.stop

    def stop(self, *a, **k):
        time.sleep(3.0)                                   # longer than the whole reservation below
        return slow_stop(self, *a, **k)
    monkeypatch.setattr(proctree.ProcessTree, "stop", stop)
    led = tmp_path / "l.sqlite"
    code, out, err = cli_main("guard", "--ledger", str(led), "--budget-name", "b", "--ceiling", "5", "--gpus", "1",
                              "--price", "1", "--hours", "0.0003", "--grace-s", "1", "--", PY, "-c", "pass")
    assert code == 0, err
    run, = ledger_doc(led)["runs"]
    assert run["status"] == "finished" and run["wall_s"] < 1.0
    assert run["actual_usd"] < run["reserved_usd"] and "charged the reservation" not in (run["note"] or "")


def test_a_multi_node_job_is_one_reservation_and_one_limit(tmp_path):
    """Two nodes' guards of one job (flags on node 0; Slurm's environment on node 1): node 0 reserves the job's 2
    GPUs once and charges them once; node 1 records nothing and stops its command at the same limit."""
    led = tmp_path / "ledger.db"
    common = ["--budget-name", "lab", "--ceiling", "10", "--gpus", "2", "--price", "1", "--hours", "0.001",
              "--grace-s", "1", "--json", "--", sys.executable, "-c", "import time; time.sleep(60)"]
    head = subprocess.Popen(guard_cmd(led, "--nodes", "2", "--node-rank", "0", "--job-id", "j7", *common),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    slurm = {**os.environ, "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_JOB_ID": "j7"}
    other = subprocess.run(guard_cmd(tmp_path / "elsewhere.db", *common), capture_output=True, text=True, timeout=60,
                           env=slurm)
    out, err = head.communicate(timeout=60)
    assert head.returncode == other.returncode == 124, err + other.stderr
    mine, theirs = json.loads(out), json.loads(other.stdout)
    assert theirs["recorded"] is False and theirs["node_rank"] == 1 and theirs["job_id"] == "slurm-j7"
    assert theirs["run"]["status"] == "killed-time-limit" and theirs["run"]["wall_s"] < 3.6 + 2
    assert not (tmp_path / "elsewhere.db").exists()                          # the other node wrote no ledger
    runs = ledger_doc(led)["runs"]
    assert len(runs) == 1 and runs[0]["gpus"] == 2 and runs[0]["status"] == "killed-time-limit"
    assert "job j7: one reservation for the 2 GPUs of its 2 nodes" in runs[0]["note"]
    assert mine["run"]["actual_usd"] == pytest.approx(2 * 1 * runs[0]["wall_s"] / 3600, rel=1e-6)
    code, _, err = cli_main("guard", "--budget-name", "lab", "--gpus", "2", "--price", "1", "--hours", "1",
                            "--nodes", "2", "--node-rank", "2", "--", "true")
    assert code == 2 and "--node-rank 2 is outside 0..1" in err
    code, _, err = cli_main("guard", "--budget-name", "lab", "--gpus", "2", "--price", "1", "--hours", "1",
                            "--nodes", "2", "--", "true")          # outside Slurm: every node would charge the job
    assert code == 2 and "--nodes 2 needs --node-rank K" in err
