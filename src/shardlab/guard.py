"""The budget guard: reserve the estimate or refuse, run the command, stop it when its paid time runs out.

Order of events (each step survives a crash of the one after it):
1. in one ``BEGIN IMMEDIATE`` transaction: settle runs whose guard died ('unfinished'), check
   spent + reserved + this reservation <= ceiling for the budget and every budget it is part of, insert
   this run as 'running' (or refuse: exit 3). The reservation is set-up + paid hours + the grace period;
2. start the command in its own process group, without a shell unless asked. Every process it starts is
   tracked (``shardlab.proctree``): the guard is a child subreaper, scans its descendants, and a watchdog
   process stops them all if the guard itself dies (even by SIGKILL); the kernel also kills the command's
   main process then (PR_SET_PDEATHSIG);
3. at the time limit (the paid hours) send SIGTERM to the group and every descendant, SIGKILL ``grace_s``
   later, at the end of the reservation; SIGINT, SIGTERM and SIGHUP received by the guard are passed on
   the same way. When the main process exits, whatever it left running is stopped too;
4. record the end: status, exit code, measured wall time and actual cost: set-up plus the measured time,
   never more than the reservation (so spent <= ceiling holds for every budget).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from shardlab import proctree
from shardlab.cost.estimate import fmt_usd
from shardlab.ledger import BudgetSummary, Ledger, LedgerError, RunRecord, RunRequest
from shardlab.ledger.store import check_before_creating

EXIT_TIME_LIMIT = 124
"""Exit code of the guard when it stopped the command at its time limit (as coreutils `timeout`)."""
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
KILL_MARGIN_S = 0.1
"""SIGKILL goes out this long before the reservation ends, so that the kernel has delivered it by then."""
FINISH_RETRY_WAITS_S = (0.5, 2.0)
"""Waits before the second and third try at recording a run's end (a full disk may free up, a lock may pass)."""


@dataclass
class GuardOutcome:
    """What happened to one guarded run."""

    run: RunRecord
    """The ledger row after the run."""
    exit_code: int
    """The guard's exit code: the command's, 124 at the time limit, 128+N when interrupted by signal N."""
    ceiling_change: tuple[float, float] | None
    """(old, new) ceiling when this call changed it."""
    budget: BudgetSummary | None
    """The budget after the run (None on a node other than a multi-node job's first: it holds no reservation)."""
    recorded: bool = True
    """False when the end could not be written to the ledger (the run stays 'running' there, and is settled
    'unfinished', at its full reservation, by the next guard or ledger call)."""


@dataclass
class _State:
    child: subprocess.Popen | None = None
    tree: proctree.ProcessTree | None = None
    received: int | None = None
    received_at: float | None = None
    term_at: float | None = None
    """When the guard sent SIGTERM (the time limit, or a signal it passed on)."""
    by_watchdog: bool = False
    """The watchdog ended the job at the reservation's end while the guard was stopped."""


def _exit_code(rc: int) -> int:
    return rc if rc >= 0 else 128 - rc


def _signal_job(state: _State, sig: int) -> None:
    """``sig`` to the command's process group and to every process it started."""
    if state.child is None:
        return
    if state.tree is not None:
        state.tree.signal(sig, groups=[state.child.pid])
    else:
        proctree.signal_group(state.child.pid, sig)


def _supervise(state: _State, t0: float, limit_s: float, grace_s: float) -> tuple[str | None, bool, int]:
    """Wait for the command; SIGTERM at the limit, SIGKILL after the grace. Returns (reason, sigkilled, rc)."""
    child = state.child
    reason, term_at, killed, scanned = None, None, False, 0.0
    while True:
        now = time.monotonic()
        if now - scanned >= proctree.SCAN_INTERVAL_S:
            state.tree.scan()
            scanned = now
        if reason is None and state.received is not None:
            reason, term_at = "interrupted", state.received_at
        if reason is None and now - t0 >= limit_s:
            reason, term_at = "time-limit", now
            _signal_job(state, signal.SIGTERM)
        kill_after = max(0.0, grace_s - KILL_MARGIN_S)
        if term_at is not None and not killed and now - term_at >= kill_after:
            _signal_job(state, signal.SIGKILL)
            killed = True
        deadline = t0 + limit_s if reason is None else (term_at + kill_after if not killed else now + 0.2)
        wait_s = min(proctree.SCAN_INTERVAL_S, max(0.002, deadline - now))
        try:
            rc = child.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        if reason is None and state.received is not None:     # the signal came while we waited
            reason, term_at = "interrupted", state.received_at
        if reason is None and rc < 0 and time.monotonic() - t0 >= limit_s + grace_s:
            # killed by a signal after the reservation ended, which the guard did not send: its watchdog ended the
            # job while the guard was stopped (SIGSTOP)
            reason, term_at, state.by_watchdog = "time-limit", t0 + limit_s, True
        state.term_at = term_at
        return reason, killed, rc


def _outcome(req: RunRequest, state: _State, reason: str | None, killed: bool, rc: int) -> tuple[str, int, str]:
    """(status, guard exit code, note)."""
    if reason == "time-limit" and state.by_watchdog:
        return ("killed-time-limit", EXIT_TIME_LIMIT, f"paid time {req.hours:g} h and the {req.grace_s:g} s grace ran out "
                "while the guard was stopped: its watchdog stopped the job (SIGTERM, then SIGKILL at once)")
    if reason == "time-limit":
        note = f"paid time {req.hours:g} h ran out: SIGTERM" + (f", then SIGKILL after {req.grace_s:g} s" if killed else "")
        return "killed-time-limit", EXIT_TIME_LIMIT, note
    if reason == "interrupted":
        name = signal.Signals(state.received).name
        note = f"the guard received {name} and passed it on" + (f"; SIGKILL after {req.grace_s:g} s" if killed else "")
        return "interrupted", 128 + state.received, note
    return ("finished" if rc == 0 else "failed"), _exit_code(rc), (f"killed by {signal.Signals(-rc).name}" if rc < 0 else "")


def _charge(req: RunRequest, wall_s: float) -> tuple[float, str]:
    """(actual USD, note): set-up plus the measured time, at most the reservation."""
    paid_s = req.hours * 3600 + req.grace_s
    rate = req.gpus * req.price_per_gpu_hour
    if wall_s <= paid_s:
        return rate * (req.setup_hours + wall_s / 3600), ""
    return req.reserved_usd, (f"measured {wall_s:.3f} s, past the reserved {paid_s:g} s (the guard was stopped, or "
                              f"SIGKILL took longer than its margin to land); charged the reservation")


def _record_end(ledger: Ledger | None, run: RunRecord, log: Callable[[str], None], **end) -> tuple[RunRecord, bool]:
    """``ledger.finish`` retried; (row, recorded). When the ledger cannot be written at the end (a full disk,
    a lock held too long), the command's outcome is still reported and its exit code kept: the row returned
    says what could not be written, and the ledger keeps the run 'running' until it is settled as
    'unfinished' at its full reservation (never less than it cost)."""
    if ledger is None:                       # a follower node: nothing of its own in a ledger (``run_follower``)
        return replace(run, status=end["status"], exit_code=end["exit_code"], wall_s=end["wall_s"], actual_usd=0.0,
                       note=end.get("note") or ""), True
    for wait_s in (*FINISH_RETRY_WAITS_S, None):
        try:
            return ledger.finish(run.id, **end), True
        except LedgerError as e:
            if wait_s is None:
                log(f"could not record the end of run #{run.id} in the ledger ({e}). Its outcome is reported here "
                    f"and its exit code kept; the ledger keeps it 'running' until the next guard or `shardlab "
                    f"ledger` call settles it as 'unfinished', charged its full reservation {fmt_usd(run.reserved_usd)}")
                note = f"not recorded in the ledger ({e}); to be charged its full reservation"
                return replace(run, status=end["status"], exit_code=end["exit_code"], wall_s=end["wall_s"],
                               actual_usd=run.reserved_usd, note="; ".join(x for x in (end.get("note"), note) if x)), False
            time.sleep(wait_s)
    raise AssertionError("unreachable")


def _run(req: RunRequest, command: list[str], ledger: Ledger | None, run: RunRecord, state: _State, stdout,
         log, job_note: str = "") -> tuple[RunRecord, bool, int]:
    """Start, supervise and clean up the command; record the end. Returns (run row, recorded, guard exit code)."""
    with proctree.subreaper():
        before = proctree.children_of(os.getpid())
        state.tree = proctree.ProcessTree(exclude=before)
        watchdog = proctree.Watchdog(state.tree.marker, exclude=before, grace_s=min(req.grace_s, 10.0))
        state.tree.exclude |= {watchdog.pid} if watchdog.pid else set()
        try:
            try:
                argv = " ".join(command) if req.shell else command
                state.child = subprocess.Popen(argv, shell=req.shell, stdout=stdout, process_group=0, env=state.tree.env(),
                                               preexec_fn=proctree.die_with_parent(signal.SIGKILL))
                t0 = time.monotonic()      # the command's time starts when it has started: the guard's start-up is not
            except OSError as e:           # charged (on a loaded machine Popen alone can take seconds)
                code = 127 if isinstance(e, FileNotFoundError) else 126
                log(f"cannot run {command[0]!r}: {e.strerror or e}")
                return (*_record_end(ledger, run, log, status="failed", exit_code=code, wall_s=0.0,
                                     actual_usd=req.setup_hours * req.gpus * req.price_per_gpu_hour,
                                     note=f"could not start: {e.strerror or e}"), code)
            state.tree.track(state.child.pid)
            watchdog.track(state.child.pid)
            # past the reservation (+1 s: the guard's own SIGKILL comes first) the watchdog stops the job even if
            # the guard cannot (stopped with SIGSTOP)
            watchdog.deadline(t0 + req.hours * 3600 + req.grace_s + 1.0)
            if state.received is not None:          # a signal between the reservation and the start
                _signal_job(state, state.received)
            reason, killed, rc = _supervise(state, t0, req.hours * 3600, req.grace_s)
            now = time.monotonic()
            wall_s = now - t0              # the command's own time: until its exit was seen, not the clean-up after
            left_s = max(0.0, t0 + req.hours * 3600 + req.grace_s - now)
            # what the command left running gets the rest of its grace period: from the SIGTERM when there was
            # one (a launcher that exits on SIGTERM must not cut its workers' checkpointing short), else a full one
            grace_left = (0.0 if killed else max(0.0, state.term_at + req.grace_s - KILL_MARGIN_S - now)) if reason \
                else min(req.grace_s, left_s)
            leftovers = state.tree.stop(grace_left, groups=[state.child.pid], skip_reap=[state.child.pid])
            if leftovers and reason is None:   # processes it left running used the GPUs until they were stopped
                wall_s = time.monotonic() - t0
        finally:
            if state.child is not None and state.child.poll() is None:
                state.tree.stop(0.0, groups=[state.child.pid])
                state.child.wait()
            watchdog.close()
    status, guard_code, note = _outcome(req, state, reason, killed, rc)
    if leftovers:
        note = (note + "; " if note else "") + f"stopped {leftovers} process(es) the command left running"
    actual, clipped = _charge(req, wall_s)
    note = "; ".join(x for x in (job_note, note, clipped) if x)
    return (*_record_end(ledger, run, log, status=status, exit_code=_exit_code(rc), wall_s=wall_s, actual_usd=actual,
                         note=note), guard_code)


def _forward_signals(state: _State) -> dict:
    """Pass SIGINT, SIGTERM and SIGHUP on to the command; ignore Ctrl-Z. Returns the old handlers."""
    def on_signal(signum, frame) -> None:
        if state.received is None:
            state.received, state.received_at = signum, time.monotonic()
        _signal_job(state, signum)

    old = {s: signal.signal(s, on_signal) for s in FORWARDED}
    # Ctrl-Z would stop only the guard (the command has its own process group), and a stopped guard enforces no
    # time limit: ignore it (the watchdog's deadline covers an uncatchable SIGSTOP)
    old[signal.SIGTSTP] = signal.signal(signal.SIGTSTP, signal.SIG_IGN)
    return old


def run_follower(req: RunRequest, command: list[str], job_note: str, *, stdout: int | None = None,
                 log: Callable[[str], None] = lambda s: None) -> GuardOutcome:
    """A multi-node job's node other than the first: the first node's guard holds the one reservation for every
    node's GPUs and charges it once; this node touches no ledger and runs ``command`` under the same time limit
    (SIGTERM at ``req.hours``, SIGKILL after the grace), so the limit stops every node, each by its own guard."""
    state = _State()
    old = _forward_signals(state)
    try:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        run = RunRecord(budget=req.budget, command=req.command, shell=req.shell, gpus=req.gpus, gpu=req.gpu,
                        price_per_gpu_hour=req.price_per_gpu_hour, price_source=req.price_source, hours=req.hours,
                        grace_s=req.grace_s, setup_hours=req.setup_hours, id=0, estimate_usd=0.0, reserved_usd=0.0,
                        actual_usd=None, status="running", started_at=now, ended_at=None, wall_s=None, exit_code=None,
                        note=job_note, host=os.uname().nodename, guard_pid=os.getpid(), guard_start=None, cwd=os.getcwd())
        log(f"{job_note}. Starting: {req.command}")
        rec, recorded, code = _run(req, command, None, run, state, stdout, log, job_note)
        return GuardOutcome(rec, code, None, None, recorded)
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def run_guarded(req: RunRequest, command: list[str], ledger_path, *, stdout: int | None = None,
                log: Callable[[str], None] = lambda s: None, job_note: str = "") -> GuardOutcome:
    """Reserve (or raise Refusal), run ``command`` under the time limit ``req.hours``, record the outcome
    (``job_note``: the multi-node job the reservation covers, in the row's note)."""
    state = _State()
    old = _forward_signals(state)
    try:
        check_before_creating(ledger_path, req.budget, req.ceiling_usd, req.parent, "--ceiling")
        with Ledger(ledger_path) as ledger:
            run, change = ledger.reserve(req)
            if state.received is not None:          # interrupted before the command started: do not start it
                name = signal.Signals(state.received).name
                # set-up is charged in full, as when the command cannot start (126/127): it is not timed
                rec = ledger.finish(run.id, status="interrupted", exit_code=None, wall_s=0.0,
                                    actual_usd=req.setup_hours * req.gpus * req.price_per_gpu_hour,
                                    note=f"the guard received {name} before the command started; not started")
                return GuardOutcome(rec, 128 + state.received, change, ledger.budgets(req.budget)[0])
            if change:
                log(f"ceiling of budget '{req.budget}' changed from {fmt_usd(change[0])} to {fmt_usd(change[1])}")
            b = ledger.budgets(req.budget)[0]
            setup = f"{req.setup_hours:g} h set-up + " if req.setup_hours else ""
            log(f"run #{run.id}, budget '{req.budget}': reserved {fmt_usd(req.reserved_usd)} (estimate "
                f"{fmt_usd(req.estimate_usd)} for {setup}{req.hours:g} h + {req.grace_s:g} s grace); spent "
                f"{fmt_usd(b.spent_usd)}, reserved in all {fmt_usd(b.reserved_usd)}, ceiling {fmt_usd(b.ceiling_usd)}: "
                f"{fmt_usd(b.remaining_usd)} left. Starting: {req.command}")
            rec, recorded, code = _run(req, command, ledger, run, state, stdout, log, job_note)
            return GuardOutcome(rec, code, change, ledger.budgets(req.budget)[0], recorded)
    finally:
        for s, h in old.items():
            signal.signal(s, h)
