"""The aggregate of a run's per-step records: percentiles per rank, the straggler, its drag, the waiting.

Pure functions over the records of ``rank.STEP_FIELDS`` (no torch). For every step k and rank r:

- excess_r,k = blocked_r,k − min over ranks of blocked_k: collective time beyond what the least-waiting
  rank needed, i.e. time spent waiting for peers inside collectives;
- waited_r,k = boundary wait_r,k + excess_r,k: the time rank r lost waiting for others (the straggler
  signature: every rank but the slow one waits);
- own_r,k = data + step − excess: how long the step would take if rank r never waited;
- the job's step period_k = max over ranks of own_r,k (synchronous: the slowest sets the pace).

The straggler is the slowest rank (:func:`slowest_rank`, the one rule ``run train`` and ``run infer`` name it
by): the rank slowed with ``--slow-rank`` when one was, else the rank with the longest mean compute (its own
work, waits left out; a rank slowed only now and then is found too, its slow steps raise its mean). Each
step the rank with the largest own time sets the pace; the others' waiting that step is charged to it. Its
compute ratio is the geometric mean over steps of its compute time (step − blocked: its own
work) over the other ranks' median that step (paired, so load that varies over time cancels; geometric,
because a shared machine's noise is multiplicative), and at p99 the ratio of the 99th percentiles; its
natural ratio leaves the injected sleep out (how much slower the rank was on its own, e.g. on a busier core). Its drag = median period / median own time of the other ranks − 1: how much longer
a typical step takes because of it; the p99 drag compares the 99th percentiles (the tail). Steps the rank
program instruments (training: steps 0 and 1, memory tracker and dispatch recorder; inference: the
prefill) are left out.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

STRAGGLER_THRESHOLD = 0.10
"""A rank whose compute is more than 10% above the others' median (at the median or at p99) is a straggler candidate;
below, noise."""
STRAGGLER_DRAG = 0.05
"""...and it is called a straggler only when it also drags the job: the job's period at least 5% longer than the other
ranks' own time, at the median or at p99. A rank 29% slower at p99 that costs the job +1% is not one."""
PERCENTILES = (50, 90, 99)


def _pct(values, q) -> float:
    return float(np.percentile(np.asarray(values, dtype=float), q)) if len(values) else 0.0


def _median(values) -> float:
    return _pct(values, 50)


def clean_records(records: list[dict], skip_steps: int) -> list[dict]:
    """Records of the timed steps (step index ≥ skip_steps), or all when that would leave none."""
    kept = [r for r in records if r["step"] >= skip_steps]
    return kept or list(records)


def derive(records: list[dict]) -> dict[int, list[dict]]:
    """{rank: [records + excess_s, waited_s, own_s]} with the per-step cross-rank quantities above."""
    by_step: dict[int, list[dict]] = defaultdict(list)
    for r in records:
        by_step[r["step"]].append(r)
    out: dict[int, list[dict]] = defaultdict(list)
    for step, recs in sorted(by_step.items()):
        lo = min(r["blocked_s"] for r in recs)
        for r in recs:
            excess = r["blocked_s"] - lo
            out[r["rank"]].append({**r, "excess_s": excess, "waited_s": r["wait_s"] + excess,
                                   "own_s": r["data_s"] + r["step_s"] - excess})
    return dict(sorted(out.items()))


def rank_time_split(records: list[dict], skip_steps: int) -> dict[int, dict]:
    """Per rank, the mean over its timed steps (``skip_steps`` on) of where a step's time went, adding up:

    - compute_s = data + step − blocked: the rank's own work (batch, forward, backward, optimizer; injected sleep
      included), time blocked in collectives left out;
    - collectives_s = blocked − excess: the time in collectives the least-waiting rank needed that step (the
      transfer itself);
    - wait_s = boundary wait + excess: time spent waiting for other ranks, at the step-end barrier and inside
      collectives (0 for a lone rank, whose barrier counts in collectives_s);
    - step_s = compute_s + collectives_s + wait_s = data + step + boundary wait: the rank's whole step.

    Empty when there are no records (the ranks wrote none)."""
    return _split(derive(clean_records(records, skip_steps)))


def _split(recs: dict[int, list[dict]]) -> dict[int, dict]:
    """:func:`rank_time_split` of records already through :func:`derive`."""
    out = {}
    alone = len(recs) == 1        # a lone rank waits for nobody: its step-end barrier is the call's own cost
    for rank, rr in recs.items():
        compute = float(np.mean([r["data_s"] + r["step_s"] - r["blocked_s"] for r in rr]))
        coll = float(np.mean([r["blocked_s"] - r["excess_s"] for r in rr]))
        wait = float(np.mean([r["waited_s"] for r in rr]))
        if alone:
            coll, wait = coll + wait, 0.0
        out[rank] = {"steps": len(rr), "compute_s": compute, "collectives_s": coll, "wait_s": wait,
                     "step_s": compute + coll + wait}
    return out


TIME_SPLIT_DEFINITIONS = {
    "compute_s": "own work (batch, forward, backward, optimizer; injected sleep included) minus time blocked in "
                 "collectives",
    "collectives_s": "time blocked in collectives that the least-waiting rank also needed that step (the transfer); "
                     "a lone rank's step-end barrier too",
    "wait_s": "time waiting for other ranks: at the step-end barrier and inside collectives beyond the least-waiting "
              "rank's",
    "step_s": "compute_s + collectives_s + wait_s: the rank's whole step",
    "source": "means over the timed steps of the ranks' per-step records (rank*.steps.jsonl: perf_counter around "
              "each step, the collective tap's blocked time, the step-end barrier's wait)"}
"""What each number of a rank's ``time_split`` is (JSON and text say the same)."""


def slowest_rank(compute_s: dict[int, float], injected: int | None = None) -> dict | None:
    """The rank named slowest, by the one rule every report uses: the rank slowed with ``--slow-rank`` when one
    was (and ran), else the rank with the longest compute (ties: the lowest rank). Returns {rank, from, compute_s,
    others_compute_s (the other ranks' median), compute_ratio}, or None without ranks."""
    if not compute_s:
        return None
    if injected is not None and injected in compute_s:
        rank, source = injected, "--slow-rank"
    else:
        rank, source = max(sorted(compute_s), key=lambda k: compute_s[k]), "measured"
    others = [v for k, v in compute_s.items() if k != rank]
    ref = _median(others) if others else None
    return {"rank": rank, "from": source, "compute_s": compute_s[rank], "others_compute_s": ref,
            "compute_ratio": compute_s[rank] / ref if ref else None}


def slowest_of_split(split: dict[int, dict], injected: int | None = None) -> dict | None:
    """:func:`slowest_rank` over a :func:`rank_time_split`, with the waits that show its cost: the other ranks'
    mean wait per step (``others_wait_s``) and its own (``own_wait_s``)."""
    named = slowest_rank({k: v["compute_s"] for k, v in split.items()}, injected)
    if named is None:
        return None
    others = [v["wait_s"] for k, v in split.items() if k != named["rank"]]
    return {**named, "others_wait_s": float(np.mean(others)) if others else None,
            "own_wait_s": split[named["rank"]]["wait_s"]}


def summarise(records: list[dict], *, skip_steps: int, kind: str = "train", injected: int | None = None) -> dict:
    """The aggregate document (JSON-safe): per-rank rows, the job's period, the straggler and its drag.
    ``injected``: the rank slowed with ``--slow-rank`` (named the straggler, :func:`slowest_rank`)."""
    recs = derive(clean_records(records, skip_steps))
    if not recs:
        return {"ranks": [], "steps": 0, "straggler": None, "note": "no step records (the run took no timed step)"}
    rows = []
    for rank, rr in recs.items():
        step = [r["step_s"] for r in rr]
        n = len(rr)
        row = {"rank": rank, "steps": n, **{f"p{q}_step_s": _pct(step, q) for q in PERCENTILES},
               "mean_step_s": float(np.mean(step)), "median_compute_s": _median([r["compute_s"] for r in rr]),
               "mean_own_s": float(np.mean([r["own_s"] for r in rr]))}
        for key in ("wait_s", "blocked_s", "coll_s", "excess_s", "waited_s", "injected_s", "data_s"):
            row[f"mean_{key}"] = float(np.mean([r[key] for r in rr]))
        row["collective_calls_per_step"] = float(np.mean([r["coll_calls"] for r in rr]))
        row["collective_bytes_per_step"] = float(np.mean([r["coll_bytes"] for r in rr]))
        rows.append(row)
    periods = [max(r["own_s"] for r in recs_k) for recs_k in _by_step(recs).values()]
    job = {"steps": len(periods), **{f"p{q}_period_s": _pct(periods, q) for q in PERCENTILES},
           "mean_period_s": float(np.mean(periods))}
    doc = {"kind": kind, "skipped_steps": skip_steps, "ranks": rows, "job": job,
           "straggler": _straggler(rows, recs, job, injected),
           "definitions": {
               "step_s": "the rank's own step (train: forward+backward+optimizer; infer: one token)",
               "compute_s": "step_s - time blocked in collectives",
               "waited_s": "boundary wait + collective time beyond the least-waiting rank's, per step",
               "period_s": "max over ranks of (data + step - excess collective time): the job's pace",
               "drag": "median period / median own time of the other ranks - 1 (p99_drag: the same at p99)",
               "straggler": "the slowest rank: the one slowed with --slow-rank, else the one with the longest mean "
                            "compute"}}
    return doc


def _by_step(recs: dict[int, list[dict]]) -> dict[int, list[dict]]:
    steps: dict[int, list[dict]] = defaultdict(list)
    for rr in recs.values():
        for r in rr:
            steps[r["step"]].append(r)
    return dict(sorted(steps.items()))


def _straggler(rows: list[dict], recs: dict[int, list[dict]], job: dict, injected: int | None) -> dict | None:
    if len(rows) < 2:
        return None
    split = _split(recs)
    named = slowest_rank({k: v["compute_s"] for k, v in split.items()}, injected)
    # every step, the rank with the largest own time set the pace; the others' waiting is charged to it
    caused: dict[int, float] = defaultdict(float)
    paced: dict[int, int] = defaultdict(int)
    steps = _by_step(recs)
    for recs_k in steps.values():
        pacer = max(recs_k, key=lambda r: r["own_s"])
        paced[pacer["rank"]] += 1
        caused[pacer["rank"]] += sum(r["waited_s"] for r in recs_k if r is not pacer)
    slow = next(r for r in rows if r["rank"] == named["rank"])
    others = [r for r in rows if r is not slow]
    comp = {r["rank"]: [x["compute_s"] for x in recs[r["rank"]]] for r in rows}
    ratio = _paired_ratio(steps, slow["rank"], lambda r: r["compute_s"])
    natural = _paired_ratio(steps, slow["rank"], lambda r: r["compute_s"] - r["injected_s"])
    ref99 = _median([_pct(comp[o["rank"]], 99) for o in others])
    ratio99 = _pct(comp[slow["rank"]], 99) / ref99 if ref99 > 0 else 0.0
    own_others = [r["own_s"] for o in others for r in recs[o["rank"]]]
    base, base99 = _median(own_others), _pct(own_others, 99)
    return {"rank": slow["rank"], "rank_from": named["from"], "compute_ratio": ratio, "natural_compute_ratio": natural,
            "p99_compute_ratio": ratio99,
            "is_straggler": is_straggler(ratio, ratio99, _drag(job["p50_period_s"], base), _drag(job["p99_period_s"], base99)),
            "paced_steps_fraction": paced[slow["rank"]] / len(steps), "caused_wait_s": caused[slow["rank"]] / len(steps),
            "drag": job["p50_period_s"] / base - 1.0 if base > 0 else 0.0, "base_step_s": base,
            "period_s": job["p50_period_s"],
            "p99_drag": job["p99_period_s"] / base99 - 1.0 if base99 > 0 else 0.0, "p99_base_step_s": base99,
            "others_wait_s": float(np.mean([o["mean_waited_s"] for o in others])), "own_wait_s": slow["mean_waited_s"]}


def is_straggler(ratio: float, ratio99: float, drag: float, drag99: float) -> bool:
    """Over STRAGGLER_THRESHOLD slower than the others (median or p99) and dragging the job by STRAGGLER_DRAG or more."""
    return max(ratio, ratio99) > 1.0 + STRAGGLER_THRESHOLD and max(drag, drag99) >= STRAGGLER_DRAG


def _drag(period: float, base: float) -> float:
    return period / base - 1.0 if base > 0 else 0.0


def _paired_ratio(steps: dict[int, list[dict]], rank: int, value) -> float:
    """Geometric mean over steps of value(rank) / median value(other ranks) that step: the ranks of one step
    ran under the same load, so a shared machine's swings cancel, and its noise is multiplicative."""
    ratios = []
    for recs_k in steps.values():
        mine = [value(r) for r in recs_k if r["rank"] == rank]
        ref = _median([value(r) for r in recs_k if r["rank"] != rank]) if len(recs_k) > 1 else 0.0
        if mine and mine[0] > 0 and ref > 0:
            ratios.append(mine[0] / ref)
    return float(np.exp(np.mean(np.log(ratios)))) if ratios else 0.0


def compare_prediction(doc: dict, predicted: dict | None) -> dict | None:
    """Predicted (``estimate.straggler``) beside measured drag, at the median and at p99, for an injected slow rank."""
    st = doc.get("straggler")
    if not predicted or not st:
        return None
    base = predicted["base_step_s"]
    return {"predicted_drag": predicted["p50_step_s"] / base - 1.0 if base else 0.0, "measured_drag": st["drag"],
            "predicted_p99_drag": predicted["p99_step_s"] / base - 1.0 if base else 0.0,
            "measured_p99_drag": st["p99_drag"], "injected_rank_named": st["rank"] == predicted["rank"]}
