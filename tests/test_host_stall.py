"""FSDP's per-unit host stall applies only where FSDP shards (layer_host_min_zero), and torchtitan's one-dimensional
DDP: the estimate, its note, the planner's filter, the refusal and the catalog check."""

import json
from pathlib import Path

import pytest

from conftest import cli_main
from shardlab.catalog import get_catalog, load_yaml
from shardlab.catalog.entries import __file__ as entries_file
from shardlab.catalog.entries import framework_from_dict
from shardlab.errors import ShardlabError
from shardlab.layout import Layout

CAT = get_catalog()
ARGS = ["llama-3.1-70b", "--gpus", "64", "--gpu", "h100-sxm", "--tp", "8", "--pp", "2", "--global-batch", "512",
        "--seq-len", "4096", "--json"]


def _estimate(framework: str, zero: int) -> dict:
    code, out, err = cli_main("estimate", *ARGS, "--zero", str(zero), "--framework", framework)
    assert code == 0, err
    return json.loads(out)


def test_fsdp_host_stall_only_where_fsdp_shards():
    """The issue's layout: torchtitan at ZeRO-1 within 1.5x of Megatron-LM with no host stall and a note saying why;
    at ZeRO-3 the fitted stall (every published torchtitan run is ZeRO-3) is priced as before."""
    titan, mega = _estimate("torchtitan", 1), _estimate("megatron-lm", 1)
    assert titan["breakdown"]["host_overhead_s"] == 0.0
    assert any("no host stall per block" in n and "ZeRO-1" in n for n in titan["notes"])
    assert 1.0 < titan["step_time_s"] / mega["step_time_s"] < 1.5
    z3 = _estimate("torchtitan", 3)
    fw = CAT.framework("torchtitan")
    blocks_per_stage, microbatches = 40, 128                    # 80 layers over pp 2; 512 / (micro-batch 1 x dp 4)
    assert z3["breakdown"]["host_overhead_s"] == pytest.approx(2 * fw.layer_host_s * blocks_per_stage * microbatches
                                                               + fw.step_overhead_s, rel=1e-6)
    assert not any("no host stall" in n for n in z3["notes"])
    # DeepSpeed's stall (activation checkpointing synchronises per module) applies at every stage
    ds = CAT.framework("deepspeed")
    assert ds.layer_host_min_zero == 0 and ds.layer_host_s > 0
    assert _estimate("deepspeed", 1)["breakdown"]["host_overhead_s"] > 0


def test_torchtitan_ddp_is_one_dimensional():
    fw = CAT.framework("torchtitan")
    assert "one-dimensional" in fw.refusal(Layout(dp=4, tp=2, zero=0))
    assert "one-dimensional" in fw.refusal(Layout(dp=1, cp=2, tp=2, zero=0))
    assert fw.refusal(Layout(dp=1, tp=2, pp=2, zero=0)) is None         # no data parallelism: nothing to replicate
    assert fw.refusal(Layout(dp=8, zero=0)) is None
    assert CAT.framework("megatron-lm").refusal(Layout(dp=4, tp=2, zero=0)) is None
    code, out, err = cli_main("plan", "--framework", "torchtitan", "--json")
    assert code == 0, err
    plans = [p["layout"] for p in json.loads(out)["plans"]]
    assert plans and all(not (p["zero"] == 0 and (p["cp"] > 1 or (p["dp"] > 1 and max(p["tp"], p["pp"]) > 1)))
                         for p in plans)


def test_layer_host_min_zero_is_checked():
    base = load_yaml(Path(entries_file).parent / "data" / "frameworks.yaml")["torchtitan"]
    assert framework_from_dict("t", dict(base), "x").layer_host_min_zero == 3
    with pytest.raises(ShardlabError, match="layer_host_min_zero must be 0, 1, 2 or 3"):
        framework_from_dict("t", {**base, "layer_host_min_zero": 5}, "x")
    with pytest.raises(ShardlabError, match="ddp_one_dimensional"):
        framework_from_dict("t", {**base, "ddp_one_dimensional": "yes"}, "x")


def test_the_runtime_profile_keeps_its_own_data_parallelism():
    """The shardlab runtime takes torchtitan's mechanisms but runs DDP beside TP and PP, and its host time is
    measured at every stage: neither torchtitan rule carries over."""
    from shardlab.runtime.probe import _runtime_framework

    fw = framework_from_dict("shardlab-runtime", _runtime_framework("cpu"), "x")
    assert fw.layer_host_min_zero == 0 and not fw.ddp_one_dimensional
    assert fw.refusal(Layout(dp=2, pp=2, zero=0)) is None and fw.refusal(Layout(dp=2, tp=2, zero=0)) is None
