"""Regression tests for reviewed training bugs: LoRA under op-level and partial recomputation, the 1F1B memory
lesson with m < p and with more stages than layers, --profile files without a profile: section, and clusters that
do not fill whole nodes."""

import json

import numpy as np
import pytest

from conftest import cli_main

from shardlab.errors import ShardlabError

LORA = ("estimate", "llama-3.1-8b", "--gpus", "8", "--global-batch", "64", "--lora-rank", "8")


def _lora(*extra):
    code, out, err = cli_main(*LORA, *extra, "--json")
    assert code == 0, err
    return json.loads(out)


# ---- 1: LoRA with --recompute op costs time ---------------------------------------------------------------------
def test_lora_op_recompute_costs_time():
    none, op, full = _lora("--recompute", "none"), _lora("--recompute", "op"), _lora("--recompute", "full")
    assert op["memory"]["headroom_bytes"] > none["memory"]["headroom_bytes"]      # it saves memory ...
    assert op["breakdown"]["recompute_s"] > 0                                       # ... so it re-runs work
    assert none["step_time_s"] < op["step_time_s"] < full["step_time_s"]
    assert op["mfu"] < none["mfu"] and op["mfu"] <= op["hfu"] <= 1


def test_lora_op_recompute_reruns_base_odd_matmuls_and_memory_bound_kernels():
    from shardlab.estimate.lora import lora_block_step_times

    lt = {"gemm_s": np.array(10.0), "attn_s": np.array(2.0), "elem_s": np.array(1.0),
          "gemm_op_recompute_s": np.array(4.0)}
    r = lora_block_step_times(lt, adapter_fwd_s=0.5, dequant_s=0.25, recompute="op", dequant_op_s=0.125)
    assert float(r["recompute_s"]) == 4.0 + 1.0 + 0.125
    codes = lora_block_step_times(lt, adapter_fwd_s=0.5, dequant_s=0.25, recompute=np.array([0, 1, 2, 3]),
                                  dequant_op_s=0.125)["recompute_s"]
    assert list(codes) == [0.0, 2.0, 13.75, 5.125]


def test_lora_op_hardware_flops_count_the_rerun_base_matmuls():
    from shardlab.catalog import get_catalog
    from shardlab.estimate.lora import lora_training_flops_per_token
    from shardlab.flops import op_recomputed_linear_params
    from shardlab.memory.lora import LoraSpec

    spec = get_catalog().model("llama-3.1-8b")
    model, hw = lora_training_flops_per_token(spec, 4096, LoraSpec(8), "op")
    assert hw == model + 2 * op_recomputed_linear_params(spec)
    _, full = lora_training_flops_per_token(spec, 4096, LoraSpec(8), "full")
    _, half = lora_training_flops_per_token(spec, 4096, LoraSpec(8), "full", 0.5)
    assert half - model == pytest.approx(0.5 * (full - model))


def test_qlora_op_recompute_dequantizes_the_rerun_weights_only():
    from shardlab.catalog import get_catalog
    from shardlab.estimate.lora import dequant_bytes_per_pass
    from shardlab.memory.lora import LoraSpec

    spec = get_catalog().model("llama-2-7b")
    q = LoraSpec(16, quantize_base="nf4")
    bits = 4 + 8 / 64 + 32 / (64 * 256)
    # forward order q, k, v, o, gate, up, down: k, o and up are re-run
    odd = 2 * 4096 * 4096 + 4096 * 11008
    assert float(dequant_bytes_per_pass(spec, 0, q, 1, op_only=True)) == pytest.approx(odd * (bits / 8 + 2))
    assert dequant_bytes_per_pass(spec, 0, LoraSpec(16), 1, op_only=True) == 0.0


# ---- 2: LoRA honours --recompute-fraction in the step time --------------------------------------------------------
def test_lora_recompute_fraction_scales_recompute_time():
    full, half = _lora("--recompute", "full"), _lora("--recompute", "full", "--recompute-fraction", "0.5")
    assert half["breakdown"]["recompute_s"] == pytest.approx(0.5 * full["breakdown"]["recompute_s"], rel=1e-9)
    assert half["step_time_s"] < full["step_time_s"]


# ---- 3: `explain 1f1b-memory` with m < p, and with more stages than layers ----------------------------------------
def test_1f1b_memory_with_fewer_microbatches_than_stages():
    code, out, err = cli_main("explain", "1f1b-memory", "p=8", "m=4")
    assert code == 0, err
    assert "1F1B holds 8" not in out and "stage 0 holds 8" not in out
    assert "1F1B holds 4 → 10.26 GiB" in out
    assert "20.52 GiB" not in out


def test_1f1b_memory_refuses_more_stages_than_layers():
    code, out, err = cli_main("explain", "1f1b-memory", "p=64", "m=16", "model=llama-3.1-8b")
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert "32 layers" in lines[0] and "p=32" in lines[0]


# ---- 4: --profile refuses a catalog file with no profile: section --------------------------------------------------
def test_profile_file_without_profile_section_is_refused():
    from shardlab.catalog import get_catalog

    with pytest.raises(ShardlabError, match=r"examples/my-hardware\.yaml has no profile: section; write one with "
                                            r"`shardlab calibrate`"):
        get_catalog([], profile="examples/my-hardware.yaml")


def test_profile_file_with_profile_section_is_read(tmp_path):
    from shardlab.catalog import get_catalog

    f = tmp_path / "prof.yaml"
    f.write_text("profile:\n  gpu: a100-80gb\n  source: test\n")
    assert get_catalog([], profile=str(f)).profile["gpu"] == "a100-80gb"
    empty = tmp_path / "empty.yaml"
    empty.write_text("profile: {}\n")
    with pytest.raises(ShardlabError, match="has no profile: section"):
        get_catalog([], profile=str(empty))


# ---- 5: a training cluster fills whole nodes (or is part of one) --------------------------------------------------
def _cluster(n, gpn):
    from shardlab.catalog import get_catalog
    from shardlab.specs.hardware import Cluster

    cat = get_catalog()
    acc = cat.accelerator("h100-sxm")
    return Cluster(acc, n, gpn, cat.link(acc.system["intra_link"]), cat.link(acc.system["inter_link"]))


def test_cluster_that_does_not_fill_whole_nodes_is_refused():
    with pytest.raises(ShardlabError) as e:
        _cluster(8, 3).require_whole_nodes()
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("8 GPUs do not fill whole nodes of 3; use a multiple of 3 (cluster.gpus 6 or 9) or "
                          "cluster.gpus_per_node that divides 8")


@pytest.mark.parametrize("n, gpn", [(4, 8), (8, 8), (16, 8), (1, 8), (9, 3)])
def test_part_of_one_node_or_whole_nodes_stay_valid(n, gpn):
    cl = _cluster(n, gpn)
    assert cl.require_whole_nodes() is cl


def test_serving_pools_may_leave_a_node_part_used():
    """A Cluster itself does not check: a disaggregated plan's 12-GPU prefill pool on nodes of 8 is built and read
    back (tests/test_serving_disagg.py::test_plan_splits_over_two_gpu_kinds_per_dollar)."""
    assert _cluster(12, 8).num_gpus == 12


def test_the_command_line_refuses_a_profile_without_one_and_a_partial_node():
    from conftest import cli_main
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "my-hardware.yaml"
    code, out, err = cli_main("estimate", "llama-3.1-8b", "--gpus", "8", "--profile", str(example))
    assert code == 2 and "no profile: section" in err and err.count("\n") == 1
    code, out, err = cli_main("estimate", "llama-3.1-8b", "--gpus", "8", "--gpus-per-node", "3")
    assert code == 2 and "whole nodes of 3" in err
    code, out, err = cli_main("estimate", "llama-3.1-8b", "--gpus", "4")
    assert code == 0, err


def test_lora_hardware_flops_follow_the_recompute_mode_and_fraction():
    import json
    from conftest import cli_main

    def hfu(*flags):
        code, out, err = cli_main("estimate", "llama-3.1-8b", "--gpus", "8", "--global-batch", "64", "--lora-rank", "8",
                                  *flags, "--json")
        assert code == 0, err
        return json.loads(out)["hfu"]
    full, half, op = hfu("--recompute", "full"), hfu("--recompute", "full", "--recompute-fraction", "0.5"), \
        hfu("--recompute", "op")
    assert half != full and op < full


@pytest.mark.parametrize("flags, words", [
    (["--recompute-fraction", "0.5"], "no effect without recomputation"),
    (["--wrap", "4-blocks", "--zero", "1"], "under ZeRO-1 it has no effect"),
    (["--fp8-all-gather", "--zero", "1", "--precision", "fp8-mixed"], "FP8 all-gather applies to ZeRO-3"),
    (["--compile", "--framework", "megatron-lm"], "compilation is not priced"),
])
def test_a_setting_that_changes_nothing_is_said(flags, words):
    code, out, err = cli_main("estimate", "llama-3.1-8b", "--gpus", "8", "--global-batch", "64", *flags, "--json")
    assert code == 0, err
    assert any(words in n for n in json.loads(out)["notes"])


@pytest.mark.parametrize("argv", [
    ("llama-3.1-8b", "--gpus", "8", "--zero", "3", "--framework", "pytorch-fsdp", "--global-batch", "96", "--seq-len",
     "9216", "--fused-loss"),
    ("qwen3-30b-a3b", "--gpus", "16", "--tp", "1", "--pp", "2", "--vpp", "2", "--schedule", "interleaved", "--ep", "8",
     "--zero", "1", "--global-batch", "256", "--seq-len", "4096", "--ep-comm-overlap", "--tp-comm-overlap",
     "--attention-kernel", "flash2", "--dropout"),
])
def test_memory_takes_estimates_flags_and_agrees_with_it(argv):
    """`shardlab memory` with the same flags shows estimate's breakdown: it refused --fused-loss and
    --ep-comm-overlap (and so reported 91.6 GB, does not fit, for a layout estimate fits at 81.2 GB)."""
    code, out, err = cli_main("estimate", *argv, "--json")
    assert code == 0, err
    est = json.loads(out)
    code, out, err = cli_main("memory", *argv, "--json")
    assert code == 0, err
    mem = json.loads(out)
    assert mem["per_gpu"]["total"] == est["memory"]["per_gpu"]["total"] and mem["fits"] == est["fits"]


def test_cost_names_a_job_file_for_what_it_is(tmp_path):
    job = tmp_path / "j.toml"
    code, out, err = cli_main("plan", "llama-3.1-8b", "--gpus", "8", "--global-batch", "64", "--save", str(job))
    assert code == 0, err
    code, out, err = cli_main("cost", str(job), "--tokens", "1e9")
    assert code == 2 and "is a shardlab job file" in err and "estimate" in err and err.count("\n") == 1
