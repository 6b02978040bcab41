"""The ledger's records: a run request, a recorded run, a budget summary, and the errors."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from shardlab.errors import ShardlabError

STATUSES = ("running", "finished", "failed", "killed-time-limit", "interrupted", "unfinished")
"""running: recorded, the command has (or is about to have) started; finished: exit code 0; failed: a
non-zero exit code, or the command could not start; killed-time-limit: stopped by the guard when its paid
time ran out; interrupted: the guard received SIGINT/SIGTERM/SIGHUP and passed it on; unfinished: found
still 'running' after its guard died, charged as its full reservation (flagged)."""


class LedgerError(ShardlabError):
    """The ledger cannot be used (corrupt, unreadable, locked, not a ledger): exit code 2, file untouched."""


@dataclass
class RunTerms:
    """What a guarded run is: shared by the request and the recorded row."""

    budget: str
    """Budget name."""
    command: str
    """The command as a shell-quoted string (or the shell text with ``--shell``)."""
    shell: bool
    """Whether the command runs through /bin/sh."""
    gpus: int
    """GPUs paid for."""
    gpu: str
    """GPU label (catalog id, or the name given with --price, or 'gpu')."""
    price_per_gpu_hour: float
    """USD per GPU-hour."""
    price_source: str
    """Where the price comes from."""
    hours: float
    """Paid hours: the time limit."""
    grace_s: float
    """Seconds between SIGTERM and SIGKILL when the time runs out."""
    setup_hours: float = field(default=0.0, kw_only=True)
    """Paid hours outside the command (provisioning, image pull, data staging): charged in full, not timed."""


@dataclass
class RunRequest(RunTerms):
    """What the guard asks the ledger for: a budget check and a reservation."""

    ceiling_usd: float | None = None
    """Ceiling to set (required when the budget is new; a different value updates it)."""
    parent: str | None = None
    """Parent budget to file this budget under (its ceiling binds too); None keeps the current parent."""

    @property
    def estimate_usd(self) -> float:
        """gpus × price × (set-up hours + hours): the paid time."""
        return self.gpus * self.price_per_gpu_hour * (self.setup_hours + self.hours)

    @property
    def reserved_usd(self) -> float:
        """The most the run can cost: set-up, the paid time and the SIGTERM grace period (the guard's SIGKILL
        lands at its end, and a run is never charged more than this)."""
        return self.gpus * self.price_per_gpu_hour * (self.setup_hours + self.hours + self.grace_s / 3600)


@dataclass
class RunRecord(RunTerms):
    """One row of the ``runs`` table."""

    id: int
    """Run number in this ledger."""
    estimate_usd: float
    """gpus × price × (set-up hours + hours)."""
    reserved_usd: float
    """Estimate plus the grace period: held against the budget while running."""
    actual_usd: float | None
    """gpus × price × (set-up hours + measured wall time), at most the reservation (the reservation for an
    unfinished run)."""
    status: str
    """One of STATUSES."""
    started_at: str
    """UTC ISO time the run was recorded, just before the command started."""
    ended_at: str | None
    """UTC ISO time the end was recorded (None while running and for unfinished runs)."""
    wall_s: float | None
    """Measured wall time of the command, seconds."""
    exit_code: int | None
    """The command's exit code (128 + N when killed by signal N; 126/127 when it could not start)."""
    note: str
    """What else happened (ceiling change, signal, why unfinished)."""
    host: str
    """Host name of the guard."""
    guard_pid: int
    """Process id of the guard (to tell a live run from a dead one)."""
    guard_start: str | None
    """Start time of the guard process in clock ticks since boot (/proc), against pid reuse."""
    cwd: str
    """Working directory of the command."""

    def to_dict(self) -> dict:
        d = {"id": self.id, **asdict(self)}
        d["shell"] = bool(self.shell)
        d["flagged"] = self.status == "unfinished"
        return d


RUN_COLUMNS = tuple(f.name for f in fields(RunRecord))


@dataclass
class BudgetSummary:
    """One budget: ceiling, what was spent, what running jobs hold, what is left."""

    name: str
    """Budget name."""
    ceiling_usd: float
    """The hard ceiling."""
    spent_usd: float
    """Actual cost of ended runs (unfinished runs count their full reservation)."""
    reserved_usd: float
    """Reservations held by running runs."""
    remaining_usd: float
    """ceiling − spent − reserved."""
    runs: int
    """Number of runs recorded."""
    unfinished: int
    """Runs flagged unfinished (charged as reserved)."""
    parent: str | None = None
    """The budget this one is part of (its ceiling binds too), or None. Spent and reserved include the runs
    of every budget below this one."""

    def to_dict(self) -> dict:
        return asdict(self)


class Refusal(ShardlabError):
    """The run would take a budget (its own or an ancestor) past its ceiling: exit code 3, nothing started."""

    exit_code = 3

    def __init__(self, req: RunRequest, spent_usd: float, reserved_usd: float, ceiling_usd: float,
                 binding: str | None = None, ceiling_change: tuple[float, float] | None = None):
        from shardlab.cost.estimate import fmt_usd

        self.req, self.spent_usd, self.reserved_usd, self.ceiling_usd = req, spent_usd, reserved_usd, ceiling_usd
        self.binding = binding or req.budget
        self.ceiling_change = ceiling_change
        """(old, new) ceiling when this call's --ceiling changed it: the change is kept although the run is refused."""
        changed = (f"; --ceiling changed it from {fmt_usd(ceiling_change[0])}, and the change is kept"
                   if ceiling_change else "")
        left = ceiling_usd - spent_usd - reserved_usd
        grace = req.reserved_usd - req.estimate_usd
        whose = (f"budget '{req.budget}'" if self.binding == req.budget else
                 f"budget '{req.budget}' is part of '{self.binding}', which")
        setup = f" including {req.setup_hours:g} h set-up" if req.setup_hours else ""
        super().__init__(
            f"refused: {whose} cannot pay for this run: estimate {fmt_usd(req.estimate_usd)}{setup}"
            f"{f' (+ {fmt_usd(grace)} for the {req.grace_s:g} s grace)' if grace > 0 else ''}, "
            f"spent so far {fmt_usd(spent_usd)}, reserved by running jobs {fmt_usd(reserved_usd)}, "
            f"ceiling {fmt_usd(ceiling_usd)} ({fmt_usd(left)} left{changed}); lower --hours or --gpus, or raise "
            + ("--ceiling" if self.binding == req.budget else
               f"the ceiling of '{self.binding}' (shardlab ledger --budget-name {self.binding} --set-ceiling USD)"))

    def to_dict(self) -> dict:
        return {"refused": True, "budget": self.req.budget, "binding_budget": self.binding,
                "estimate_usd": self.req.estimate_usd,
                "reserved_usd_needed": self.req.reserved_usd, "spent_usd": self.spent_usd,
                "reserved_usd": self.reserved_usd, "ceiling_usd": self.ceiling_usd,
                "remaining_usd": self.ceiling_usd - self.spent_usd - self.reserved_usd,
                "ceiling_changed_from": self.ceiling_change[0] if self.ceiling_change else None,
                "message": str(self)}


def process_start_ticks(pid: int) -> str | None:
    """Start time of process ``pid`` in clock ticks since boot (Linux /proc), or None elsewhere."""
    try:
        fields_ = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
        return fields_[19]
    except (OSError, IndexError):
        return None
