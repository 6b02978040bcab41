"""What one slow rank costs a synchronous job: which parts of the step scale, what the other ranks wait.

In synchronous training every step ends in collectives that need every rank (DP gradient reduction, TP
all-reduces, pipeline sends), so the job moves at the pace of its slowest rank: "the slowest-rank rule"
(Dean & Barroso, "The Tail at Scale", CACM 56(2), 2013, for the fan-out form; Chen et al., "Revisiting
Distributed Synchronous SGD", arXiv 1604.00981, for training). If rank R computes ``factor`` times
slower, the parts of the step that are its own work grow by that factor and every other rank waits the
difference inside its next collective:

    slow step  = step + (factor − 1) · Σ scaled parts            (scaled: compute, recomputation, optimizer)
    wait       = (factor − 1) · Σ scaled parts                    (per slowed step, on every other rank)
    drag       = wait / step

Communication does not scale (the link is as fast as before); a 1F1B/GPipe bubble keeps its size, because
with one slow stage it is still (p − 1) stage times of the others (pipe = (m−1)·t_max + Σ t_s). When only
a ``fraction`` of the steps is slowed (a rank slowed now and then: a noisy neighbour, thermal throttling),
the mean step grows by fraction · wait while the p99 step is the slowed one as soon as fraction > 1%:
the tail grows long before the average does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shardlab.errors import ShardlabError

TRAINING_SCALED_KEYS = ("compute_s", "recompute_s", "optimizer_s")
"""Breakdown parts (``estimate.training.BREAKDOWN_KEYS``) that are a rank's own work."""


@dataclass(frozen=True)
class SlowRank:
    """An injected (or hypothetical) slow rank."""

    rank: int
    """Global rank that is slow."""
    factor: float
    """Its own work takes this many times longer (> 1 slows it)."""
    fraction: float = 1.0
    """Share of steps that are slowed (1: every step), spread evenly."""

    def slowed(self, step: int) -> bool:
        """Whether ``step`` is one of the slowed ones: evenly spaced, deterministic."""
        return math.floor((step + 1) * self.fraction + 1e-9) > math.floor(step * self.fraction + 1e-9)

    def label(self) -> str:
        return f"{self.rank}:{self.factor:g}" + (f":{self.fraction:g}" if self.fraction < 1 else "")


@dataclass(frozen=True)
class SlowLink:
    """An injected delay on every collective one rank issues."""

    rank: int
    """Global rank whose collectives are delayed."""
    delay_s: float
    """Seconds added to each of its collective calls."""


def _number(text: str, what: str, flag: str, example: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ShardlabError(f"{flag} {what} '{text}' is not a number; use e.g. {flag} {example}") from None
    if not math.isfinite(v):
        raise ShardlabError(f"{flag} {what} must be finite, got '{text}'")
    return v


def _rank(text: str, flag: str, example: str) -> int:
    if not (text.strip().isascii() and text.strip().isdigit()):
        raise ShardlabError(f"{flag} rank '{text}' is not a rank number (0, 1, ...); use e.g. {flag} {example}")
    return int(text)


def parse_slow_rank(text: str) -> SlowRank:
    """'R:FACTOR' or 'R:FACTOR:FRACTION', e.g. '1:2' (rank 1 twice as slow), '1:3:0.1' (every tenth step)."""
    parts = text.split(":")
    if len(parts) not in (2, 3):
        raise ShardlabError(f"--slow-rank '{text}': use RANK:FACTOR[:FRACTION], e.g. --slow-rank 1:2")
    rank = _rank(parts[0], "--slow-rank", "1:2")
    factor = _number(parts[1], "factor", "--slow-rank", "1:2")
    if not 1.0 <= factor <= 100.0:
        raise ShardlabError(f"--slow-rank factor must be between 1 and 100 (times slower), got {parts[1]}")
    frac = _number(parts[2], "fraction", "--slow-rank", "1:3:0.1") if len(parts) == 3 else 1.0
    if not 0.0 < frac <= 1.0:
        raise ShardlabError(f"--slow-rank fraction is the share of slowed steps, in (0, 1], got {parts[2]}")
    return SlowRank(rank, factor, frac)


def parse_slow_link(text: str) -> SlowLink:
    """'R:SECONDS', e.g. '0:0.002' (2 ms more on each of rank 0's collectives)."""
    parts = text.split(":")
    if len(parts) != 2:
        raise ShardlabError(f"--slow-link '{text}': use RANK:SECONDS, e.g. --slow-link 0:0.002")
    delay = _number(parts[1], "delay", "--slow-link", "0:0.002")
    if not 0.0 <= delay <= 10.0:
        raise ShardlabError(f"--slow-link delay must be between 0 and 10 seconds per collective, got {parts[1]}")
    return SlowLink(_rank(parts[0], "--slow-link", "0:0.002"), delay)


def check_rank(slow, world_size: int, flag: str) -> None:
    """The slow rank must exist in a job of ``world_size`` ranks."""
    if slow is not None and slow.rank >= world_size:
        raise ShardlabError(f"{flag} names rank {slow.rank} but the job has {world_size} ranks (0..{world_size - 1})")


@dataclass(frozen=True)
class StragglerEffect:
    """The predicted cost of one slow rank."""

    slow: SlowRank
    """The slow rank."""
    base_step_s: float
    """Step time with every rank at full speed."""
    scaled_s: float
    """Sum of the parts that are the rank's own work (they scale with the factor)."""
    scaled_parts: tuple[str, ...]
    """Which breakdown parts scale."""
    wait_s: float
    """Time every other rank waits per slowed step = (factor − 1) · scaled_s."""

    @property
    def slow_step_s(self) -> float:
        """A slowed step: the whole job moves at the slow rank's pace."""
        return self.base_step_s + self.wait_s

    @property
    def mean_step_s(self) -> float:
        return self.base_step_s + self.slow.fraction * self.wait_s

    @property
    def drag(self) -> float:
        """Relative cost of a slowed step: wait / base step."""
        return self.wait_s / self.base_step_s if self.base_step_s > 0 else 0.0

    def percentile_step_s(self, q: float) -> float:
        """The q-th percentile (0-100) of the step time: the slowed step once more than (100 − q)% are slowed."""
        return self.slow_step_s if self.slow.fraction > 1.0 - q / 100.0 + 1e-12 else self.base_step_s

    def to_dict(self) -> dict:
        return {"rank": self.slow.rank, "factor": self.slow.factor, "fraction": self.slow.fraction,
                "base_step_s": self.base_step_s, "scaled_s": self.scaled_s, "scaled_parts": list(self.scaled_parts),
                "wait_s": self.wait_s, "slow_step_s": self.slow_step_s, "mean_step_s": self.mean_step_s,
                "p50_step_s": self.percentile_step_s(50), "p99_step_s": self.percentile_step_s(99),
                "drag": self.drag,
                "rule": "slow step = step + (factor - 1) x (compute + recompute + optimizer); communication and the "
                        "1F1B/GPipe bubble do not scale; every other rank waits the difference"}


def straggler_effect(breakdown: dict[str, float], step_time_s: float, slow: SlowRank,
                     scaled_keys: tuple[str, ...] = TRAINING_SCALED_KEYS) -> StragglerEffect:
    """Apply a slow rank to an estimate's step breakdown (training: ``TrainingEstimate.breakdown``; inference:
    ``{"compute_s": step − communication, ...}`` with ``scaled_keys=("compute_s",)``)."""
    scaled = sum(float(breakdown.get(k, 0.0)) for k in scaled_keys)
    return StragglerEffect(slow, float(step_time_s), scaled, tuple(k for k in scaled_keys if breakdown.get(k)),
                           (slow.factor - 1.0) * scaled)


def inference_straggler(step_time_s: float, comm_time_s: float, slow: SlowRank) -> StragglerEffect:
    """A slow tensor-parallel rank in decoding: its compute/HBM time scales, the all-reduces do not; every
    token waits for it at the next all-reduce, so per-token latency (and its p99) grows for the group."""
    return straggler_effect({"compute_s": max(step_time_s - comm_time_s, 0.0)}, step_time_s, slow, ("compute_s",))


def effect_of_estimate(doc: dict, slow: SlowRank) -> StragglerEffect:
    """The effect on an estimate's JSON document: training (``breakdown``, ``step_time_s``) or inference
    (``decode``: one token's step and its all-reduce time)."""
    if "breakdown" in doc:
        return straggler_effect(doc["breakdown"], doc["step_time_s"], slow)
    dec = doc["decode"]    # serving model (estimate.inference): step_s and comm_s per decode step
    return inference_straggler(dec.get("step_s", dec.get("step_time_s")), dec.get("comm_s", dec.get("comm_time_s", 0.0)), slow)


def render_effect(eff: StragglerEffect, unit: str) -> str:
    """The worked lines of ``estimate --slow-rank``."""
    ms = lambda s: f"{s * 1e3:.3f} ms" if s < 1 else f"{s:.3f} s"
    parts = ", ".join(p.removesuffix("_s") for p in eff.scaled_parts) or "nothing"
    lines = [f"slow rank {eff.slow.rank} at {eff.slow.factor:g}× (its own work: {parts} = {ms(eff.scaled_s)} of the "
             f"{ms(eff.base_step_s)} {unit}; communication does not scale):",
             f"  slowed {unit} = {ms(eff.base_step_s)} + ({eff.slow.factor:g} − 1) × {ms(eff.scaled_s)} = "
             f"{ms(eff.slow_step_s)} for every rank (synchronous: the slowest rank sets the pace)",
             f"  every other rank waits {ms(eff.wait_s)} per slowed {unit}: each slowed {unit} takes {eff.drag * 100:+.1f}% longer"]
    if eff.slow.fraction < 1:
        lines.append(f"  on {eff.slow.fraction:.0%} of the {unit}s: mean {ms(eff.mean_step_s)} "
                     f"({(eff.mean_step_s / eff.base_step_s - 1) * 100:+.1f}%), p50 {ms(eff.percentile_step_s(50))}, "
                     f"p99 {ms(eff.percentile_step_s(99))}: the tail grows before the mean does")
    lines.append("  (the slowest-rank rule: Dean & Barroso, The Tail at Scale, 2013; shardlab.estimate.straggler)")
    return "\n".join(lines)


def with_slow_rank(text: str | None, doc: dict, human: str) -> tuple[dict, str]:
    """`shardlab estimate ... --slow-rank R:FACTOR[:FRACTION]`: the document and text with the effect added."""
    if not text:
        return doc, human
    slow = parse_slow_rank(text)
    check_rank(slow, int(doc.get("gpus") or 1), "--slow-rank")
    eff = effect_of_estimate(doc, slow)
    return {**doc, "straggler": eff.to_dict()}, human + "\n\n" + render_effect(eff, "step" if "breakdown" in doc else
                                                                             "decoded token")
