"""Pipeline schedules: the simulation equals the closed forms, agrees with the memory model's in-flight
counts, answers the inverse question, and shows a straggler setting the pace."""

import time

import pytest

from shardlab.errors import ShardlabError
from shardlab.layout import Layout
from shardlab.memory.activations import in_flight
from shardlab.pipeline import bubble_fraction_closed_form, min_microbatches, simulate

TIMES = [(1.0, 2.0, None), (1.0, 1.0, 1.0), (1.3, 2.1, 0.7), (2.0, 0.5, 0.1), (0.4, 3.0, None)]


def test_closed_forms_by_hand():
    assert bubble_fraction_closed_form("1f1b", 4, 8) == pytest.approx(3 / 11, abs=1e-15)
    assert bubble_fraction_closed_form("gpipe", 8, 32) == pytest.approx(7 / 39, abs=1e-15)
    assert bubble_fraction_closed_form("interleaved", 4, 8, 2) == pytest.approx(3 / 19, abs=1e-15)
    # ZB-H1, F = B = W = 1: idle (p-1)(F+B-W) = 3, work m(F+B+W) = 24 → 3/27, a third of 1F1B's idle 9
    assert bubble_fraction_closed_form("zb-h1", 4, 8, 1, 1.0, 1.0, 1.0) == pytest.approx(3 / 27, abs=1e-15)
    assert bubble_fraction_closed_form("zb-h1", 4, 8) == pytest.approx(3 / 27, abs=1e-15)  # backward 2 split in half


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_simulation_equals_closed_form_gpipe_1f1b(schedule):
    n = 0
    for p in range(1, 9):
        for m in list(range(1, 17)) + [31, 64]:
            for f, b, w in TIMES:
                r = simulate(schedule, p, m, 1, f, b, w)
                assert abs(r.bubble_fraction - bubble_fraction_closed_form(schedule, p, m, 1, f, b, w)) <= 1e-12, (p, m, f, b, w)
                n += 1
    assert n > 500


def test_simulation_equals_closed_form_interleaved():
    for p in range(2, 7):
        for m in range(p, 5 * p + 1, p):
            for v in (2, 3, 4):
                for f, b, w in TIMES[:3]:
                    r = simulate("interleaved", p, m, v, f, b, w)
                    want = bubble_fraction_closed_form("interleaved", p, m, v, f, b, w)
                    assert abs(r.bubble_fraction - want) <= 1e-12, (p, m, v)
                    assert want == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-14)


def test_simulation_equals_closed_form_zb_h1_when_f_equals_b():
    # Qi et al. assume equal pass times; the closed form is exact whenever F = B, any W, any m
    for p in range(1, 9):
        for m in list(range(1, 20)) + [40]:
            for f, w in ((1.0, 1.0), (1.0, 0.3), (0.7, 1.9), (2.0, 2.0)):
                r = simulate("zb-h1", p, m, 1, f, f, w)
                assert abs(r.bubble_fraction - bubble_fraction_closed_form("zb-h1", p, m, 1, f, f, w)) <= 1e-12, (p, m, f, w)


def test_zb_h1_has_a_third_of_1f1b_bubble_and_same_memory():
    a = simulate("1f1b", 8, 64, forward_s=1, backward_s=2)
    z = simulate("zb-h1", 8, 64, forward_s=1, backward_s=1, weight_grad_s=1)
    assert (z.step_time_s - z.ideal_time_s) == pytest.approx((a.step_time_s - a.ideal_time_s) / 3)
    assert z.peak_in_flight == a.peak_in_flight


@pytest.mark.parametrize("schedule,v", [("gpipe", 1), ("1f1b", 1), ("zb-h1", 1), ("interleaved", 2), ("interleaved", 3)])
def test_peak_in_flight_agrees_with_memory_model(schedule, v):
    for p in (2, 4, 8):
        for m in (p, 2 * p, 4 * p) if schedule == "interleaved" else (1, 3, p, 2 * p + 1):
            r = simulate(schedule, p, m, v)
            lay = Layout(pp=p, vpp=v, schedule=schedule)
            assert r.peak_in_flight_stage == pytest.approx([in_flight(lay, s, m) for s in range(p)]), (p, m)
    assert simulate("1f1b", 8, 32).peak_in_flight == [8, 7, 6, 5, 4, 3, 2, 1]
    assert simulate("gpipe", 4, 10).peak_in_flight == [10] * 4


def test_min_microbatches_inverse():
    assert min_microbatches("1f1b", 8, 0.10) == 63           # 7/70 = 10%; 62 gives 7/69 > 10%
    assert bubble_fraction_closed_form("1f1b", 8, 62) > 0.10
    assert min_microbatches("gpipe", 4, 0.5) == 3           # 3/6 = 50%
    m = min_microbatches("interleaved", 8, 0.10, v=2)        # (p-1)/(2m+p-1) ≤ 0.1 → m ≥ 31.5 → 32 (multiple of 8)
    assert m == 32
    m = min_microbatches("zb-h1", 8, 0.10)                   # (p-1)/(3m+p-1) ≤ 0.1 → m ≥ 21
    assert m == 21 and bubble_fraction_closed_form("zb-h1", 8, 20) > 0.10
    with pytest.raises(ShardlabError, match="between 0 and 1"):
        min_microbatches("1f1b", 8, 1.5)


def test_straggler_sets_the_pace():
    # GPipe is a flow shop of identical jobs: makespan = Σ stage times + (m-1) × the slowest stage
    p, m, X = 4, 8, 2.0
    r = simulate("gpipe", p, m, stage_slowdown={2: X})
    assert r.step_time_s == pytest.approx(((p - 1 + X) + (m - 1) * X) * 3.0)
    for sched in ("1f1b", "zb-h1"):
        base = simulate(sched, 8, 64)
        slow = simulate(sched, 8, 64, stage_slowdown={5: 1.5})
        assert slow.step_time_s >= 64 * 1.5 * 3.0                 # the slow stage's own work
        assert slow.step_time_s > base.step_time_s
        assert slow.busy_s[5] == pytest.approx(1.5 * base.busy_s[5])
        assert slow.ideal_time_s == pytest.approx(slow.busy_s[5])


def test_p2p_time_in_gpipe():
    r = simulate("gpipe", 4, 8, p2p_s=0.25)
    assert r.step_time_s == pytest.approx((8 + 3) * 3.0 + 2 * 3 * 0.25)


def test_events_respect_dependencies_and_never_overlap():
    r = simulate("interleaved", 4, 8, 2, p2p_s=0.1)
    ev = r.events
    assert len(ev) == 2 * 4 * 8 * 2
    assert len({(s, k, j, c) for s, k, j, c, _, _ in ev}) == len(ev)
    by_stage = {}
    for s, k, j, c, a, b in ev:
        by_stage.setdefault(s, []).append((a, b))
    for spans in by_stage.values():
        spans.sort()
        assert all(x[1] <= y[0] + 1e-12 for x, y in zip(spans, spans[1:]))
    end = {(s, k, j, c): b for s, k, j, c, a, b in ev}
    for s, k, j, c, a, b in ev:
        if k == "F" and (s, c) != (0, 0):
            prev = (s - 1, "F", j, c) if s > 0 else (3, "F", j, c - 1)
            assert a >= end[prev] + 0.1 - 1e-12


def test_zb_h1_splits_backward_and_says_so():
    r = simulate("zb-h1", 4, 8, backward_s=3.0)
    assert r.durations_s["backward_s"] == r.durations_s["weight_grad_s"] == 1.5
    assert any("split in half" in n for n in r.notes)
    assert {e[1] for e in r.events} == {"F", "B", "W"}


@pytest.mark.parametrize("kw,msg", [
    (dict(schedule="interleaved", stages=8, microbatches=4, vpp=2), "≥ --stages"),
    (dict(schedule="interleaved", stages=4, microbatches=6, vpp=2), "multiple of 4"),
    (dict(schedule="interleaved", stages=4, microbatches=8, vpp=1), "layout.vpp 2"),
    (dict(schedule="1f1b", stages=4, microbatches=8, vpp=2), "interleaved schedule only"),
    (dict(schedule="pipedream", stages=4, microbatches=8), "unknown schedule"),
    (dict(schedule="1f1b", stages=0, microbatches=8), "positive"),
    (dict(schedule="1f1b", stages=4, microbatches=8, p2p_s=-1), "zero or more"),
    (dict(schedule="1f1b", stages=4, microbatches=8, stage_slowdown={9: 2}), "outside"),
])
def test_bad_input(kw, msg):
    with pytest.raises(ShardlabError, match=msg):
        simulate(**kw)


def test_simulator_is_fast():
    t = time.process_time()
    r = simulate("1f1b", 64, 1024)
    took = time.process_time() - t
    assert r.bubble_fraction == pytest.approx(63 / 1087, abs=1e-12)
    assert took < 2.0   # typically ~0.2 s; generous for a loaded 2-core CI machine (benchmarks/bench_pipeline.py)


@pytest.mark.parametrize("schedule, p, x, v, want", [
    ("zb-h1", 16, 0.05, 1, 95),     # 15 idle vs 3m of work once m >= p (Qi et al. 2023 §3.1): 15/(3m+15) <= 0.05
    ("zb-h1", 64, 0.01, 1, 2079),   # was 4,094 and refused as over the pass limit
    ("zb-h1", 8, 0.02, 1, 115),
    ("1f1b", 8, 0.10, 1, 63),       # (p-1)/(m+p-1) <= x
    ("interleaved", 8, 0.10, 2, 32),
])
def test_fewest_microbatches_is_the_smallest_that_meets_the_bound(schedule, p, x, v, want):
    from shardlab.pipeline.closed_form import bubble_fraction_closed_form, min_microbatches

    m = min_microbatches(schedule, p, x, v)
    step = p if schedule == "interleaved" else 1
    assert m == want
    assert bubble_fraction_closed_form(schedule, p, m, v) <= x + 1e-12
    assert m - step < step or bubble_fraction_closed_form(schedule, p, m - step, v) > x
