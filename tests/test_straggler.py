"""The slow-rank model (shardlab.estimate.straggler) and `shardlab estimate --slow-rank`."""

import pytest

from conftest import cli_json, run_cli
from shardlab.errors import ShardlabError
from shardlab.estimate.straggler import (SlowRank, inference_straggler, parse_slow_link, parse_slow_rank,
                                         straggler_effect)


def test_parse_slow_rank_and_link():
    assert parse_slow_rank("1:2") == SlowRank(1, 2.0, 1.0)
    assert parse_slow_rank("3:1.5:0.1") == SlowRank(3, 1.5, 0.1)
    link = parse_slow_link("0:0.002")
    assert (link.rank, link.delay_s) == (0, 0.002)
    for bad in ("1", "a:2", "1:x", "1:0.5", "1:2:0", "1:2:1.5", "-1:2", "1:inf"):
        with pytest.raises(ShardlabError):
            parse_slow_rank(bad)
    for bad in ("1", "0:-1", "0:x", "0:1:2"):
        with pytest.raises(ShardlabError):
            parse_slow_link(bad)


def test_only_the_ranks_own_work_scales_and_the_others_wait_the_difference():
    # 10 s step: 6 s compute, 1 s optimizer, 2 s TP all-reduces, 1 s pipeline bubble
    b = {"compute_s": 6.0, "optimizer_s": 1.0, "tp_comm_s": 2.0, "pp_bubble_s": 1.0, "recompute_s": 0.0}
    eff = straggler_effect(b, 10.0, SlowRank(3, 2.0))
    assert eff.scaled_s == 7.0 and eff.wait_s == 7.0            # (2 - 1) x (6 + 1)
    assert eff.slow_step_s == 17.0 and eff.drag == pytest.approx(0.7)
    assert eff.scaled_parts == ("compute_s", "optimizer_s")     # recompute is zero here: not listed
    assert eff.mean_step_s == 17.0 and eff.percentile_step_s(50) == 17.0


def test_a_rank_slowed_now_and_then_moves_the_tail_first():
    eff = straggler_effect({"compute_s": 1.0}, 1.0, SlowRank(0, 3.0, 0.05))
    assert eff.mean_step_s == pytest.approx(1.1)                # 5% of steps 3x slower: mean +10%
    assert eff.percentile_step_s(50) == 1.0 and eff.percentile_step_s(99) == 3.0
    slowed = [k for k in range(100) if SlowRank(0, 3.0, 0.05).slowed(k)]
    assert len(slowed) == 5 and slowed == [19, 39, 59, 79, 99]  # evenly spread, deterministic
    assert all(SlowRank(0, 2.0).slowed(k) for k in range(10))


def test_inference_decode_communication_does_not_scale():
    eff = inference_straggler(4e-3, 1e-3, SlowRank(1, 3.0))
    assert eff.slow_step_s == pytest.approx(4e-3 + 2 * 3e-3)


def test_estimate_cli_adds_the_straggler_to_training_and_inference():
    d = cli_json("estimate", "llama-3.1-70b", "--gpus", "64", "--tp", "8", "--pp", "2", "--zero", "1",
                 "--global-batch", "512", "--slow-rank", "5:1.5")
    s, b = d["straggler"], d["breakdown"]
    scaled = b["compute_s"] + b["recompute_s"] + b["optimizer_s"]
    assert s["rank"] == 5 and s["wait_s"] == pytest.approx(0.5 * scaled)
    assert s["slow_step_s"] == pytest.approx(d["step_time_s"] + 0.5 * scaled)
    i = cli_json("estimate", "llama-3.1-8b", "--inference", "--tp", "2", "--slow-rank", "1:3:0.05")
    assert i["straggler"]["p99_step_s"] > i["straggler"]["p50_step_s"] == pytest.approx(i["decode"]["step_s"])
    r = run_cli("estimate", "llama-3.1-8b", "--inference", "--tp", "2", "--slow-rank", "2:3")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "has 2 ranks" in r.stderr
    r = run_cli("estimate", "llama-3.1-8b", "--gpus", "8", "--slow-rank", "1:fast")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "--slow-rank" in r.stderr
