"""No process outlives its job: the guard with a real process tree (a child, a grandchild in its process
group, and a double-forked daemon in a session of its own that ignores SIGTERM), stopped by its time
limit, by Ctrl-C (SIGINT to the guard's process group), by SIGTERM, by a SIGKILL of the guard itself, and
when the main process exits leaving the others running. Every pid the tree wrote down must be gone."""

import os
import signal
import subprocess
import sys

import pytest

from shardlab.proctree import is_running as _alive
from test_guard import guard_cmd, ledger_doc, wait_for

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl: Linux")

SPAWNER = r'''
import os, subprocess, sys, time
pids, mode = sys.argv[1], sys.argv[2]
def note():
    with open(pids, "a") as f:
        f.write(f"{os.getpid()}\n")
note()
loop = f"import os, time\nopen({pids!r}, 'a').write(str(os.getpid()) + chr(10))\nwhile True: time.sleep(0.05)"
subprocess.Popen([sys.executable, "-c", loop])                                  # grandchild, same group
daemon = ("import os, signal, sys\n"
          "if os.fork(): os._exit(0)\n"                                          # double fork: orphaned at once
          "os.setsid(); signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + loop)
subprocess.Popen([sys.executable, "-c", daemon], start_new_session=True)       # escapes the group and session
while len(open(pids).read().split()) < 3:
    time.sleep(0.02)
if mode == "stay":
    while True:
        time.sleep(0.05)
'''


def _tree(tmp_path, mode):
    script, pids = tmp_path / "spawner.py", tmp_path / "pids"
    script.write_text(SPAWNER)
    pids.write_text("")
    return [sys.executable, str(script), str(pids), mode], pids


def _pids(pids) -> list[int]:
    return [int(x) for x in pids.read_text().split()]


@pytest.mark.parametrize("how", ["time-limit", "main-exits", "ctrl-c", "sigterm", "sigkill-guard"])
def test_no_process_survives_the_guard(tmp_path, how):
    led = tmp_path / "l.sqlite"
    cmd, pids = _tree(tmp_path, "leave" if how == "main-exits" else "stay")
    hours = "0.0005" if how == "time-limit" else "0.05"
    g = subprocess.Popen(guard_cmd(led, "--budget-name", "b", "--ceiling", "100", "--gpus", "1", "--price", "1",
                                   "--hours", hours, "--grace-s", "1", "--", *cmd),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_for(lambda: len(_pids(pids)) >= 3, timeout_s=20, what="the process tree to start")
        if how != "main-exits":                  # there the guard stops them at once
            assert all(_alive(p) for p in _pids(pids)[1:])
        if how == "ctrl-c":
            os.killpg(g.pid, signal.SIGINT)          # what a terminal does: the guard's whole process group
        elif how == "sigterm":
            g.send_signal(signal.SIGTERM)
        elif how == "sigkill-guard":
            g.kill()
        code = g.wait(timeout=30)
    finally:
        if g.poll() is None:
            g.kill()
    expected = {"time-limit": 124, "main-exits": 0, "ctrl-c": 130, "sigterm": 143, "sigkill-guard": -9}[how]
    assert code == expected, g.stderr.read().decode()
    wait_for(lambda: not any(_alive(p) for p in _pids(pids)), timeout_s=15, what="every process to be stopped")
    run, = ledger_doc(led)["runs"]
    if how == "main-exits":
        assert run["status"] == "finished" and "stopped 2 process(es) the command left running" in run["note"]
    elif how == "sigkill-guard":
        assert run["status"] == "unfinished"


def test_spent_never_exceeds_the_ceiling_when_the_command_ignores_sigterm(tmp_path):
    """The issue's case: $3,600/h, 1.8 s paid + 2 s grace = a $3.80 reservation under a $3.80 ceiling."""
    led = tmp_path / "l.sqlite"
    stubborn = [sys.executable, "-c", "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                      "while True: time.sleep(0.05)"]
    r = subprocess.run(guard_cmd(led, "--budget-name", "b", "--ceiling", "3.80", "--gpus", "1", "--price", "3600",
                                 "--hours", "0.0005", "--grace-s", "2", "--", *stubborn),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 124, r.stderr
    d = ledger_doc(led)
    run, = d["runs"]
    assert run["reserved_usd"] == pytest.approx(3.80) and "SIGKILL" in run["note"]
    assert run["actual_usd"] <= run["reserved_usd"] and d["budgets"][0]["spent_usd"] <= 3.80
    assert run["wall_s"] > 3.5                     # it did run through its grace period


def test_setup_hours_are_reserved_and_charged(tmp_path):
    led = tmp_path / "l.sqlite"
    r = subprocess.run(guard_cmd(led, "--budget-name", "b", "--ceiling", "5", "--gpus", "2", "--price", "1",
                                 "--hours", "1", "--setup-hours", "0.5", "--grace-s", "0", "--", "true"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "0.5 h set-up + 1 h" in r.stderr
    run, = ledger_doc(led)["runs"]
    assert run["setup_hours"] == 0.5 and run["estimate_usd"] == pytest.approx(3.0)
    assert run["actual_usd"] == pytest.approx(2 * (0.5 + run["wall_s"] / 3600))
    r = subprocess.run(guard_cmd(led, "--budget-name", "b", "--gpus", "2", "--price", "1", "--hours", "1.5",
                                 "--setup-hours", "0.6", "--grace-s", "0", "--", "true"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and "estimate $4.20 including 0.6 h set-up" in r.stderr    # $4.20 > $5 - $1.00


LAUNCHER = r'''
import os, signal, subprocess, sys, time
out = sys.argv[1]
if len(sys.argv) > 2:                                   # the worker: checkpoints for 1.5 s on SIGTERM
    def save(signum, frame):
        time.sleep(1.5)
        open(out, "w").write("saved")
        os._exit(0)
    signal.signal(signal.SIGTERM, save)
    open(out + ".ready", "w").write("")
    while True:
        time.sleep(0.05)
subprocess.Popen([sys.executable, __file__, out, "worker"])
signal.signal(signal.SIGTERM, lambda s, f: os._exit(143))   # the launcher exits at once on SIGTERM
while True:
    time.sleep(0.05)
'''


def test_a_launcher_exiting_on_sigterm_leaves_its_workers_the_grace_period(tmp_path):
    script, saved = tmp_path / "launcher.py", tmp_path / "ckpt"
    script.write_text(LAUNCHER)
    r = subprocess.run(guard_cmd(tmp_path / "l.sqlite", "--budget-name", "b", "--ceiling", "10", "--gpus", "1",
                                 "--price", "1", "--hours", "0.0005", "--grace-s", "4", "--", sys.executable,
                                 str(script), str(saved)), capture_output=True, text=True, timeout=60)
    assert r.returncode == 124, r.stderr
    assert saved.read_text() == "saved"           # the worker finished its 1.5 s checkpoint inside the 4 s grace


@pytest.mark.parametrize("stop", ["SIGTSTP", "SIGSTOP"])
def test_a_stopped_guard_still_ends_the_job_at_its_limit(tmp_path, stop):
    """Ctrl-Z (SIGTSTP) is ignored by the guard; SIGSTOP cannot be, and the watchdog ends the job at the
    reservation's end (+1 s) instead. No process outlives the paid time + grace either way."""
    flag = tmp_path / "pid"
    g = subprocess.Popen(guard_cmd(tmp_path / "l.sqlite", "--budget-name", "b", "--ceiling", "10", "--gpus", "1",
                                   "--price", "1", "--hours", "0.0003", "--grace-s", "1", "--", sys.executable, "-c",
                                   f"import os,time; open({str(flag)!r},'w').write(str(os.getpid())); time.sleep(60)"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_for(lambda: flag.exists() and flag.read_text(), timeout_s=20, what="the command to start")
        pid = int(flag.read_text())
        g.send_signal(getattr(signal, stop))
        wait_for(lambda: not _alive(pid), timeout_s=15, what="the command to be stopped at its limit")
        g.send_signal(signal.SIGCONT)
        assert g.wait(timeout=30) == 124, g.stderr.read().decode()
        run, = ledger_doc(tmp_path / "l.sqlite")["runs"]
        assert run["status"] == "killed-time-limit"
        assert ("watchdog" in run["note"]) == (stop == "SIGSTOP")     # who ended it is what the note says
    finally:
        if g.poll() is None:
            g.send_signal(signal.SIGCONT)
            g.kill()
