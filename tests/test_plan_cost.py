"""`shardlab cost` from a plan: time-to-train × GPUs × price, end to end through the real estimate."""

import json

import pytest

from conftest import cli_main


def test_cost_from_estimate_equals_hours_times_gpus_times_price():
    args = ["llama-3.1-8b", "--gpus", "16", "--tp", "2", "--zero", "1", "--global-batch", "256", "--tokens", "1e11"]
    code, out, err = cli_main("estimate", *args, "--gpu", "h100-sxm", "--json")
    assert code == 0, err
    est = json.loads(out)
    code, out, err = cli_main("cost", *args, "--gpu", "h100-sxm", "--price", "2.5", "--setup-hours", "1", "--json")
    assert code == 0, err
    cost = json.loads(out)
    hours = est["train_time_s"] / 3600 + 1
    assert cost["gpus"] == 16 and cost["price_per_gpu_hour"] == 2.5
    assert cost["hours"] == pytest.approx(hours, rel=1e-6)
    assert cost["usd"] == pytest.approx(16 * 2.5 * hours, rel=1e-6)


def test_cost_from_plan_needs_tokens_or_hours():
    code, _, err = cli_main("cost", "llama-3.1-8b", "--gpus", "8", "--price", "2")
    assert code == 2 and len(err.strip().splitlines()) == 1
