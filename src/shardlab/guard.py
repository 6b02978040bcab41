"""The budget guard: reserve the estimate or refuse, run the command, stop it when its paid time runs out.

Order of events (each step survives a crash of the one after it):
1. in one ``BEGIN IMMEDIATE`` transaction: settle runs whose guard died ('unfinished'), check
   spent + reserved + this reservation <= ceiling, insert this run as 'running' (or refuse: exit 3);
2. start the command in its own process group, without a shell unless asked; on Linux the kernel kills
   it if the guard itself dies (PR_SET_PDEATHSIG), so nothing runs unmetered;
3. at the time limit (the paid hours) send SIGTERM to the group, SIGKILL ``grace_s`` later; SIGINT,
   SIGTERM and SIGHUP received by the guard are passed on the same way;
4. record the end: status, exit code, measured wall time and actual cost.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from shardlab.cost.estimate import fmt_usd
from shardlab.ledger import BudgetSummary, Ledger, RunRecord, RunRequest

EXIT_TIME_LIMIT = 124
"""Exit code of the guard when it stopped the command at its time limit (as coreutils `timeout`)."""
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class GuardOutcome:
    """What happened to one guarded run."""

    run: RunRecord
    """The ledger row after the run."""
    exit_code: int
    """The guard's exit code: the command's, 124 at the time limit, 128+N when interrupted by signal N."""
    ceiling_change: tuple[float, float] | None
    """(old, new) ceiling when this call changed it."""
    budget: BudgetSummary
    """The budget after the run."""


@dataclass
class _State:
    child: subprocess.Popen | None = None
    received: int | None = None
    received_at: float | None = None


def _signal_group(child: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(child.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec_fn asking Linux to SIGKILL the child when the guard dies (None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, int(signal.SIGKILL))       # PR_SET_PDEATHSIG
        if os.getppid() != parent:          # the guard died before prctl took effect
            os._exit(137)
    return preexec


def _exit_code(rc: int) -> int:
    return rc if rc >= 0 else 128 - rc


def _supervise(child: subprocess.Popen, state: _State, t0: float, limit_s: float, grace_s: float) -> tuple[str | None, bool, int]:
    """Wait for the child; SIGTERM at the limit, SIGKILL after the grace. Returns (reason, sigkilled, rc)."""
    reason, term_at, killed = None, None, False
    while True:
        now = time.monotonic()
        if reason is None and state.received is not None:
            reason, term_at = "interrupted", state.received_at
        if reason is None and now - t0 >= limit_s:
            reason, term_at = "time-limit", now
            _signal_group(child, signal.SIGTERM)
        if term_at is not None and not killed and now - term_at >= grace_s:
            _signal_group(child, signal.SIGKILL)
            killed = True
        wait_s = 0.2 if reason else min(0.2, max(0.005, t0 + limit_s - now))
        try:
            rc = child.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        if reason is None and state.received is not None:     # the signal came while we waited
            reason = "interrupted"
        return reason, killed, rc


def run_guarded(req: RunRequest, command: list[str], ledger_path, *, stdout: int | None = None,
                log: Callable[[str], None] = lambda s: None) -> GuardOutcome:
    """Reserve (or raise Refusal), run ``command`` under the time limit ``req.hours``, record the outcome."""
    state = _State()

    def on_signal(signum, frame) -> None:
        if state.received is None:
            state.received, state.received_at = signum, time.monotonic()
        if state.child is not None:
            _signal_group(state.child, signum)

    old = {s: signal.signal(s, on_signal) for s in FORWARDED}
    try:
        with Ledger(ledger_path) as ledger:
            run, change = ledger.reserve(req)
            if state.received is not None:          # interrupted before the command started: do not start it
                name = signal.Signals(state.received).name
                rec = ledger.finish(run.id, status="interrupted", exit_code=None, wall_s=0.0, actual_usd=0.0,
                                    note=f"the guard received {name} before the command started; not started")
                return GuardOutcome(rec, 128 + state.received, change, ledger.budgets(req.budget)[0])
            if change:
                log(f"ceiling of budget '{req.budget}' changed from {fmt_usd(change[0])} to {fmt_usd(change[1])}")
            b = ledger.budgets(req.budget)[0]
            log(f"run #{run.id}, budget '{req.budget}': reserved {fmt_usd(req.reserved_usd)} (estimate "
                f"{fmt_usd(req.estimate_usd)} for {req.hours:g} h + {req.grace_s:g} s grace); spent {fmt_usd(b.spent_usd)}, "
                f"reserved in all {fmt_usd(b.reserved_usd)}, ceiling {fmt_usd(b.ceiling_usd)}: {fmt_usd(b.remaining_usd)} "
                f"left. Starting: {req.command}")
            t0 = time.monotonic()
            try:
                argv = " ".join(command) if req.shell else command
                state.child = subprocess.Popen(argv, shell=req.shell, stdout=stdout, process_group=0,
                                               preexec_fn=_die_with_parent())
            except OSError as e:
                code = 127 if isinstance(e, FileNotFoundError) else 126
                rec = ledger.finish(run.id, status="failed", exit_code=code, wall_s=0.0, actual_usd=0.0,
                                    note=f"could not start: {e.strerror or e}")
                log(f"cannot run {command[0]!r}: {e.strerror or e}")
                return GuardOutcome(rec, code, change, ledger.budgets(req.budget)[0])
            if state.received is not None:          # a signal between the two checks
                _signal_group(state.child, state.received)
            reason, killed, rc = _supervise(state.child, state, t0, req.hours * 3600, req.grace_s)
            wall_s = time.monotonic() - t0
            if reason:
                _signal_group(state.child, signal.SIGKILL)    # leftovers in the group must not run unpaid
            code = _exit_code(rc)
            if reason == "time-limit":
                status, guard_code = "killed-time-limit", EXIT_TIME_LIMIT
                note = f"paid time {req.hours:g} h ran out: SIGTERM" + (f", then SIGKILL after {req.grace_s:g} s" if killed else "")
            elif reason == "interrupted":
                name = signal.Signals(state.received).name
                status, guard_code = "interrupted", 128 + state.received
                note = f"the guard received {name} and passed it on" + (f"; SIGKILL after {req.grace_s:g} s" if killed else "")
            else:
                status, guard_code, note = ("finished" if rc == 0 else "failed"), code, ""
                if rc < 0:
                    note = f"killed by {signal.Signals(-rc).name}"
            actual = req.gpus * req.price_per_gpu_hour * wall_s / 3600
            rec = ledger.finish(run.id, status=status, exit_code=code, wall_s=wall_s, actual_usd=actual, note=note)
            return GuardOutcome(rec, guard_code, change, ledger.budgets(req.budget)[0])
    finally:
        for s, h in old.items():
            signal.signal(s, h)
