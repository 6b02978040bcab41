"""Dollars before launch: GPUs × hours × price, plus set-up time. Pure arithmetic and its sentence."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from shardlab.errors import ShardlabError


@dataclass(frozen=True)
class CostEstimate:
    """What a run will cost. Field names follow the JSON contract of ``shardlab cost --json``."""

    gpus: int
    """Number of GPUs rented."""
    price_per_gpu_hour: float
    """USD per GPU-hour."""
    run_hours: float
    """Hours of work (time to train from a plan, or the hours given)."""
    setup_hours: float
    """Hours paid before the work starts (provisioning, image pull, data staging, warm-up)."""
    hours: float
    """Paid hours in total: run_hours + setup_hours."""
    usd_per_hour: float
    """USD per hour for all the GPUs: gpus × price_per_gpu_hour."""
    usd: float
    """USD in total: usd_per_hour × hours."""
    budget_usd: float | None = None
    """The budget to compare with, if one was given."""
    spare_usd: float | None = None
    """budget_usd − usd (negative: over budget), if a budget was given."""

    def to_dict(self) -> dict:
        return asdict(self)


def cost_estimate(gpus: int, run_hours: float, price_per_gpu_hour: float, setup_hours: float = 0.0,
                  budget_usd: float | None = None) -> CostEstimate:
    """usd = gpus × price_per_gpu_hour × (run_hours + setup_hours); spare = budget − usd."""
    if not isinstance(gpus, int) or gpus <= 0:
        raise ShardlabError(f"the GPU count must be a positive whole number, got {gpus}")
    for name, v in (("hours", run_hours), ("price per GPU-hour", price_per_gpu_hour)):
        if not v > 0:
            raise ShardlabError(f"{name} must be a positive number, got {v}")
    if not setup_hours >= 0:
        raise ShardlabError(f"set-up hours must be zero or more, got {setup_hours}")
    if budget_usd is not None and not budget_usd >= 0:
        raise ShardlabError(f"the budget must be zero or more USD, got {budget_usd}")
    hours = run_hours + setup_hours
    per_hour = gpus * price_per_gpu_hour
    usd = per_hour * hours
    spare = None if budget_usd is None else budget_usd - usd
    if spare is not None and abs(spare) <= 1e-9 * max(1.0, budget_usd):   # 0.1 × 3 ≠ 0.3 in binary: exactly the budget
        spare = 0.0
    return CostEstimate(gpus, price_per_gpu_hour, run_hours, setup_hours, hours, per_hour, usd, budget_usd, spare)


def fmt_usd(x: float) -> str:
    """'$2.10', '$1,234.50', '-$0.10'; under a cent four decimals ('$0.0019'), then '<$0.0001'."""
    sign = "-" if x < 0 else ""
    a = abs(x)
    if a == 0 or a >= 0.01:
        return f"{sign}${a:,.2f}"
    if a >= 0.0001:
        return f"{sign}${a:.4f}"
    return f"{sign}<$0.0001"


def fmt_rate(x: float) -> str:
    """A price per hour: two decimals, three where the third is not zero ('$0.35', '$0.375'); a price under a
    cent keeps its digits to a millionth ('$0.0004')."""
    if 0 < abs(x) < 0.01:
        return f"${x:.6f}".rstrip("0")
    s = f"{x:,.3f}"
    return "$" + (s[:-1] if s.endswith("0") else s)


def fmt_hours(h: float) -> str:
    """'3.0 h', '0.25 h', '1,234 h (51.4 days)'."""
    if h >= 100:
        return f"{h:,.0f} h ({h / 24:,.1f} days)"
    if h >= 1:
        return f"{h:.1f} h"
    return f"{h:.2g} h"


def sentence(est: CostEstimate, gpu_label: str, *, price_is_estimate: bool = False,
             hours_from_plan: bool = False) -> str:
    """The line a careful engineer writes before launching, e.g.
    '2 × RTX 4090 at $0.35/h each = $0.70/h; about 3.0 h including set-up = $2.10. Budget $3.00: $0.90 to spare.'"""
    each = " each" if est.gpus > 1 else ""
    what = " ".join(w for w in ("to train (estimated)" if hours_from_plan else "",
                                "including set-up" if est.setup_hours > 0 else "") if w)
    s = (f"{est.gpus} × {gpu_label} at {fmt_rate(est.price_per_gpu_hour)}/h{each} = {fmt_rate(est.usd_per_hour)}/h; "
         f"about {fmt_hours(est.hours)}{' ' + what if what else ''} = {fmt_usd(est.usd)}.")
    if est.budget_usd is not None:
        if est.spare_usd >= 0:
            s += f" Budget {fmt_usd(est.budget_usd)}: {fmt_usd(est.spare_usd)} to spare."
        else:
            s += f" Budget {fmt_usd(est.budget_usd)}: {fmt_usd(-est.spare_usd)} OVER; cut hours or GPUs, or raise the budget."
    if price_is_estimate:
        s += " (The price is an estimate, not a quote.)"
    return s
