"""No rank outlives `shardlab run`: real torchrun jobs whose driver gets Ctrl-C (SIGINT to its process
group), SIGTERM, or SIGKILL. The ranks run in sessions of their own (torchrun starts them so), which is
why signalling torchrun's group alone left them running.

The ranks of the first two cases are a sleep loop (the point is process handling, not torch); the last
case is a real `shardlab run train`. Every process below the driver is recorded while it runs, and each
must be gone shortly after the driver is."""

import os
import signal
import subprocess
import sys
import time

import pytest

from shardlab.proctree import is_running as _alive
from test_guard import wait_for

pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc: Linux")]

SLEEPER = "import os, time\nopen(os.environ['SHARDLAB_RUN_DIR'] + f\"/up{os.environ['RANK']}\", 'w')\n" \
          "while True: time.sleep(0.05)\n"
DRIVER = ("import faulthandler, signal, sys\nfaulthandler.register(signal.SIGUSR1, all_threads=True)\n"
          "from shardlab.runtime.launch import launch\ntry:\n"
          "    launch('sleeper', 2, [], timeout_s=120, run_dir=sys.argv[1])\n"
          "except KeyboardInterrupt as e:\n    raise SystemExit(128 + getattr(e, 'signum', 2))\n")


def _descendants(pid: int) -> set[int]:
    from shardlab.proctree import ProcessTree

    return ProcessTree(root=pid).scan()


def _as_from_a_terminal() -> None:
    """A driver typed at a terminal has Python's Ctrl-C handler; one started with SIGINT ignored (pytest run as a
    background job of a non-interactive shell, as some CI runners do) keeps ignoring it by design
    (interrupts.signals_raise), so the driver is given the default disposition a terminal's foreground job has."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(cmd, env, ready):
    """Start ``cmd`` in a session of its own; return (driver, every process below it once ``ready()``)."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
                         preexec_fn=_as_from_a_terminal)
    seen: set[int] = set()

    def up():
        seen.update(_descendants(p.pid))
        return ready() and p.poll() is None
    wait_for(up, 120, "the job to start")
    seen.update(_descendants(p.pid))
    return p, seen


def _interrupt(p, how, seen=()):
    if how == "ctrl-c":
        os.killpg(p.pid, signal.SIGINT)
    elif how == "sigterm":
        p.send_signal(signal.SIGTERM)
    else:
        p.kill()
    try:
        return p.wait(timeout=60)
    except subprocess.TimeoutExpired:     # say where the driver is stuck (its stacks, via faulthandler), then fail
        p.send_signal(signal.SIGUSR1)
        time.sleep(2)
        for q in {*seen, *_descendants(p.pid), p.pid}:     # leave nothing running behind the failure
            if _alive(q):
                try:
                    os.kill(q, signal.SIGKILL)
                except OSError:
                    pass
        try:
            stacks = p.communicate(timeout=10)[1].decode()[-4000:]
        except subprocess.TimeoutExpired:
            stacks = "(stderr still held open)"
        pytest.fail(f"the driver did not exit within 60 s of {how}; its stacks:\n{stacks}")


@pytest.mark.parametrize("how, code", [("ctrl-c", 130), ("sigterm", 143)])
def test_driver_signals_stop_every_rank(tmp_path, how, code):
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    run_dir = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    driver = [sys.executable, "-c", DRIVER, str(run_dir)]
    p, seen = _start(driver, env, lambda: (run_dir / "up0").exists() and (run_dir / "up1").exists())
    assert len(seen) >= 3                          # torchrun and two ranks
    assert _interrupt(p, how, seen) == code
    wait_for(lambda: not any(_alive(q) for q in seen), 20, f"torchrun and the ranks to stop after {how}")


def test_shardlab_run_killed_with_sigkill_leaves_no_rank(tmp_path):
    tmp = tmp_path / "tmp"                          # the run's temporary folder goes here, so we can see it go
    tmp.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp)}
    cmd = [sys.executable, "-m", "shardlab", "run", "train", "--strategy", "ddp", "--nproc-per-node", "2", "--steps", "100000",
           "--timeout", "600"]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    seen: set[int] = set()

    def training():
        seen.update(_descendants(p.pid))
        ranks = [q for q in _descendants(p.pid) if b"train_worker" in _cmdline(q) and not _is_launcher(q)]
        return len(ranks) >= 2 and all(b"step" in _heartbeat(q) for q in ranks)
    try:
        wait_for(training, 180, "both ranks to train")
    finally:
        p.kill()
        p.wait(timeout=60)
    wait_for(lambda: not any(_alive(q) for q in seen), 20, "torchrun and the ranks to stop after SIGKILL of the driver")
    # a SIGKILLed driver runs no exit handler: its watchdog removes the temporary run folder
    wait_for(lambda: not list(tmp.glob("shardlab-run-*")), 20, "the temporary run folder to be removed")


def test_shardlab_run_json_interrupted_by_ctrl_c_prints_one_document(tmp_path):
    """`run train --json` stopped by Ctrl-C while it trains: one JSON document on stdout (interrupted, the steps
    every rank recorded), the stderr line, exit code 130, and no rank left behind."""
    import json

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "shardlab", "run", "train", "--strategy", "ddp", "--nproc-per-node", "2", "--steps", "100000",
           "--timeout", "600", "--no-metrics", "--json"]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                         preexec_fn=_as_from_a_terminal)
    seen: set[int] = set()

    def training():
        seen.update(_descendants(p.pid))
        ranks = [q for q in _descendants(p.pid) if b"train_worker" in _cmdline(q) and not _is_launcher(q)]
        return len(ranks) >= 2 and _steps_past(ranks, 3)
    try:
        wait_for(training, 180, "both ranks to train a few steps")
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130, err[-2000:]
    assert err.decode().strip().splitlines()[-1] == "interrupted (SIGINT): stopped"
    d = json.loads(out)                                            # all of stdout: one document
    assert d["interrupted"] and d["exit_code"] == 130 and d["progress"]["finished"] >= 1, d
    assert d["progress"]["logs"]["run_dir"] and d["progress"]["logs"]["run_dir_removed_at_exit"]
    wait_for(lambda: not any(_alive(q) for q in seen), 20, "torchrun and the ranks to stop after Ctrl-C")


def _steps_past(ranks: list[int], k: int) -> bool:
    """Every rank's heartbeat names a step after step ``k``."""
    import re

    for q in ranks:
        m = re.search(rb'"phase": "step (\d+)', _heartbeat(q))
        if not m or int(m.group(1)) <= k:
            return False
    return True


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _is_launcher(pid: int) -> bool:
    """torchrun (started as shardlab.runtime.bound_run, or torch.distributed.run) names the rank module too."""
    line = _cmdline(pid)
    return b"bound_run" in line or b"distributed.run" in line


def _heartbeat(pid: int) -> bytes:
    """The rank's last heartbeat phase, read through its SHARDLAB_RUN_DIR."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(x.split(b"=", 1) for x in f.read().split(b"\0") if b"=" in x)
        with open(env[b"SHARDLAB_RUN_DIR"] + b"/rank" + env[b"RANK"] + b".heartbeat.json", "rb") as f:
            return f.read()
    except (OSError, KeyError):
        return b""


def test_a_signal_whose_exception_was_dropped_still_ends_the_wait():
    """Python prints and drops an exception raised while a finaliser runs, so a Ctrl-C landing there used to leave
    the driver waiting for the job's time limit; the recorded signal ends the wait within one poll slice."""
    from shardlab.interrupts import Caught, Interrupted
    from shardlab.runtime.launch import POLL_S, wait_job

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        caught = Caught()
        caught.signum = signal.SIGINT             # the handler ran; its KeyboardInterrupt went nowhere
        t0 = time.monotonic()
        with pytest.raises(Interrupted) as e:
            wait_job(p, time.monotonic() + 60, caught)
        assert e.value.signum == signal.SIGINT and time.monotonic() - t0 < POLL_S + 1
        quiet = Caught()
        assert wait_job(p, time.monotonic() + 0.3, quiet) == (None, None, True)   # the deadline: timed out
    finally:
        p.kill()
        p.wait()


def test_ctrl_c_is_left_alone_where_it_was_ignored():
    """A driver started with SIGINT ignored (a background job) keeps ignoring it while it runs a job."""
    from shardlab import interrupts

    code = ("import signal\nfrom shardlab import interrupts\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "with interrupts.signals_raise() as c:\n    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN\n"
            "    term = signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, signal.SIG_IGN)\n"
            "print(ignored, term)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "True"], out.stderr
    before = signal.getsignal(signal.SIGINT)
    with interrupts.signals_raise() as c:           # taken over only from Python's own Ctrl-C handler
        assert (signal.getsignal(signal.SIGINT) is before) == (before is not signal.default_int_handler)
        assert c.signum is None
    assert signal.getsignal(signal.SIGINT) is before
