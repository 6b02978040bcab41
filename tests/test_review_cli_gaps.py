"""Regression tests for reviewed CLI gaps: `shardlab cost --gpus N --hours H` ignoring layout flags (and a plan-based
cost ignoring --profile), LoRA selective recomputation ignoring --recompute-modules, and `explain 1f1b-memory` with
p = 1 (no pipeline)."""

import json
from pathlib import Path

import pytest

from conftest import cli_main

DATA = Path(__file__).resolve().parent / "data"
DIRECT = ("cost", "--gpus", "8", "--hours", "10", "--price", "2")


def _one_line_error(*args) -> str:
    code, out, err = cli_main(*args)
    assert code == 2 and out == "", (code, out, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


# ---- 1: a direct cost (--gpus N --hours H) refuses the flags that only a plan's hours could use ------------------
@pytest.mark.parametrize("flags", [
    ["--tp", "2"], ["--pp", "2"], ["--zero", "3"], ["--global-batch", "512"], ["--seq-len", "8192"],
    ["--micro-batch", "4"], ["--recompute", "full"], ["--precision", "fp32"], ["--lora-rank", "16"],
    ["--framework", "deepspeed"], ["--gpus-per-node", "4"], ["--inter-node-gbit", "400"], ["--grad-reduce-fp32"],
    ["--compile"], ["--microbatches", "8"], ["--tp", "1"],             # --tp 1: written, even at its default
])
def test_direct_cost_refuses_a_flag_it_would_ignore(flags):
    err = _one_line_error(*DIRECT, *flags)
    assert err.startswith(f"error: {flags[0]} cannot change a cost from --gpus N --hours H")
    assert "drop it" in err and "give MODEL with --tokens D instead of --hours" in err


def test_direct_cost_names_every_ignored_flag_and_the_valid_costs_still_work():
    err = _one_line_error(*DIRECT, "--tp", "2", "--zero", "1", "--recompute", "selective",
                          "--recompute-modules", "core_attn,mlp")
    assert "--tp, --zero, --recompute, --recompute-modules cannot change" in err and "drop them" in err
    for args in (DIRECT, ("cost", "--gpus", "2", "--gpu", "rtx-4090", "--hours", "2.5", "--setup-hours", "0.5",
                          "--budget", "3", "--json"),
                 ("cost", "--gpus", "8", "--gpu", "h100-sxm", "--hours", "10", "--provider", "aws"),
                 ("cost", "--gpus", "2", "--gpu", "rtx-4090", "--spot", "--hours", "2.5"),
                 ("cost", "--gpus", "4", "--gpu", "my-asic", "--price", "1.25", "--hours", "2", "--json"),
                 # plan-based: the layout flags are what the hours come from
                 ("cost", "llama-2-7b", "--gpus", "8", "--zero", "1", "--micro-batch", "1", "--global-batch", "512",
                  "--tokens", "1e6", "--json")):
        code, out, err = cli_main(*args)
        assert code == 0 and err == "", (args, err)
    assert json.loads(out)["hours_from"] == "plan"


def test_plan_based_cost_prices_the_profiles_hardware_and_a_direct_cost_refuses_a_profile(tmp_path):
    prof = tmp_path / "box.yaml"
    code, _, err = cli_main("calibrate", "--from-matmul", str(DATA / "bench_matmul_cpu.json"), "--from-collectives",
                            str(DATA / "bench_collectives_cpu.json"), "--name", "BOX", "--out", str(prof))
    assert code == 0, err
    flags = ("tiny-gpt2", "--precision", "fp32", "--gpus", "2", "--tokens", "1e9", "--profile", str(prof), "--json")
    code, out, err = cli_main("estimate", *flags)
    assert code == 0, err
    est = json.loads(out)
    code, out, err = cli_main("cost", *flags, "--price", "1")
    assert code == 0, err
    cost = json.loads(out)
    assert cost["gpu"] == "cpu-core-box"                      # was h100-sxm: the profile was not read
    assert cost["plan"]["train_time_s"] == pytest.approx(est["train_time_s"])
    assert cost["run_hours"] == pytest.approx(est["train_time_s"] / 3600)
    err = _one_line_error(*DIRECT, "--profile", str(prof))
    assert "--profile cannot change a cost" in err


# ---- 2: LoRA's selective recomputation follows --recompute-modules, as full training does --------------------------
def _spec(name="llama-3.1-8b"):
    from shardlab.catalog import get_catalog

    return get_catalog().model(name)


MODULES = [None, ("core_attn",), ("mlp",), ("core_attn", "mlp")]


def test_lora_recompute_flops_follow_the_modules_as_full_training_does():
    from shardlab.estimate.lora import lora_training_flops_per_token
    from shardlab.flops import training_flops_per_token
    from shardlab.memory.lora import LoraSpec

    spec, lora, seq = _spec(), LoraSpec(rank=16), 4096
    model = lora_training_flops_per_token(spec, seq, lora)[0]
    extra = {}
    for mods in MODULES:
        m, hw = lora_training_flops_per_token(spec, seq, lora, "selective", modules=mods)
        full_m, full_hw = training_flops_per_token(spec, seq, "selective", modules=mods)
        assert m == model
        extra[mods] = hw - m
        assert extra[mods] == pytest.approx(full_hw - full_m, rel=1e-12)    # the same re-run forward as full training
    assert extra[None] == extra[("core_attn",)] < extra[("mlp",)] < extra[("core_attn", "mlp")]
    assert extra[("core_attn", "mlp")] == pytest.approx(extra[("core_attn",)] + extra[("mlp",)])
    half = lora_training_flops_per_token(spec, seq, lora, "selective", fraction=0.5, modules=("mlp",))
    assert half[1] - half[0] == pytest.approx(0.5 * extra[("mlp",)])
    # the activation memory already followed the modules under LoRA: fewer saved activations with the MLP re-run
    acts = {}
    for mods in ("core_attn", "core_attn,mlp"):
        code, out, err = cli_main("memory", "llama-3.1-8b", "--gpus", "8", "--lora-rank", "16", "--recompute",
                                  "selective", "--recompute-modules", mods, "--json")
        assert code == 0, err
        acts[mods] = json.loads(out)["per_gpu"]["activations"]
    assert acts["core_attn,mlp"] < acts["core_attn"]


def _layer_times(spec, tp=1):
    from shardlab.rates.compute import layer_times
    from shardlab.rates.hardware import matmul_curve
    from shardlab.catalog import get_catalog

    acc = get_catalog().accelerator("h100-sxm")
    curve, _ = matmul_curve(acc)
    lt = layer_times(spec, 0, acc, curve, "bf16", seq_len=4096, tp=tp, cp=1, ep=1, micro_batch=1,
                     sequence_parallel=False, elem_bytes=2)
    return acc, curve, lt


@pytest.mark.parametrize("quantize", ["none", "nf4"])
def test_lora_recompute_time_follows_the_modules_as_full_training_does(quantize):
    from shardlab.estimate.lora import dequant_bytes_per_pass, lora_block_times
    from shardlab.memory.lora import LoraSpec
    from shardlab.rates.compute import block_step_times
    from shardlab.rates.hardware import memory_time_s

    spec, lora = _spec(), LoraSpec(rank=16, quantize_base=quantize)
    acc, curve, lt = _layer_times(spec)
    rec = {}
    for mods in MODULES:
        t = lora_block_times(spec, 0, lora, lt, 4096, 1, 1, "selective", acc, curve, "bf16", modules=mods)
        rec[mods] = float(t["recompute_s"])
        full = float(block_step_times(lt, "selective", modules=mods)["recompute_s"])
        mlp_dequant = float(memory_time_s(dequant_bytes_per_pass(spec, 0, lora, 1, modules=("mlp",)), acc))
        assert rec[mods] == pytest.approx(full + (mlp_dequant if mods and "mlp" in mods else 0.0), rel=1e-12)
    assert rec[None] == rec[("core_attn",)] < rec[("mlp",)] < rec[("core_attn", "mlp")]
    half = lora_block_times(spec, 0, lora, lt, 4096, 1, 1, "selective", acc, curve, "bf16", fraction=0.5,
                            modules=("core_attn", "mlp"))
    assert float(half["recompute_s"]) == pytest.approx(0.5 * rec[("core_attn", "mlp")])


def test_qlora_dequantizes_again_only_the_weights_the_modules_re_run():
    from shardlab.estimate.lora import dequant_bytes_per_pass
    from shardlab.memory.lora import LoraSpec, nf4_bits_per_weight

    spec, lora = _spec(), LoraSpec(rank=16, quantize_base="nf4")
    per = nf4_bits_per_weight(lora) / 8 + 2
    h, f = spec.hidden_size, spec.ffn_hidden_size
    assert dequant_bytes_per_pass(spec, 0, lora, 1, modules=("core_attn",)) == 0.0
    assert dequant_bytes_per_pass(spec, 0, lora, 1, modules=("mlp",)) == pytest.approx(3 * h * f * per)   # gate, up, down
    assert dequant_bytes_per_pass(spec, 0, lora, 2, modules=("mlp",)) == pytest.approx(3 * h * f * per / 2)
    assert dequant_bytes_per_pass(spec, 0, lora, 1, modules=("mlp",)) < dequant_bytes_per_pass(spec, 0, lora, 1)
    moe, lora_moe = _spec("mixtral-8x7b"), LoraSpec(rank=16, quantize_base="nf4")
    assert dequant_bytes_per_pass(moe, 0, lora_moe, 1, modules=("moe",)) > 0.0
    assert dequant_bytes_per_pass(moe, 0, lora_moe, 1, modules=("mlp",)) == 0.0      # a MoE block has no dense MLP


# ---- 3: `explain 1f1b-memory` with p = 1: no pipeline, one micro-batch in flight; p > 1 unchanged ------------------
P4_M16_DERIVATION = [
    "GPipe runs all m forwards, then all m backwards: every stage holds m micro-batches' activations at its peak",
    "1F1B runs p−i−1 warm-up forwards on stage i (no more than m), then alternates one forward and one backward: at "
    "most min(p − i, m) in flight, stage 0 holds min(p, m) = 4",
    "bubble: GPipe 15.8%, 1F1B 15.8%: the same (p−1)/(m+p−1)",
    "stage 0 (8 layers of llama-3.1-8b): one micro-batch's activations = 5.13 GiB; GPipe holds 16 → 82.06 GiB, 1F1B "
    "holds 4 → 20.52 GiB",
    "the simulation's peak per stage (table) matches the formula"]
P4_M16_PLAIN = (
    "Both schedules waste the same fill-and-drain time, but GPipe keeps every micro-batch's activations until the "
    "backward pass starts, while 1F1B starts backward as soon as the first micro-batch reaches the last stage and then "
    "frees one for every one it starts. So memory no longer grows with m: stage 0 holds at most p micro-batches, 4 "
    "instead of 16, 20.52 GiB instead of 82.06 GiB here. That is what lets 1F1B use many micro-batches to shrink the "
    "bubble.")


def _explain_json(*kv):
    code, out, err = cli_main("explain", "1f1b-memory", *kv, "--json")
    assert code == 0, err
    return json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))


@pytest.mark.parametrize("m", [1, 16])
def test_1f1b_memory_with_one_stage_says_there_is_no_pipeline(m):
    from shardlab.layout import Layout
    from shardlab.memory.activations import in_flight

    code, out, err = cli_main("explain", "1f1b-memory", "p=1", f"m={m}")
    assert code == 0 and err == "", err
    text = " ".join(out.split())
    assert "no pipeline" in text and "1 in flight" in text and "gradient accumulation" in text
    for wrong in ("warm-up forwards on stage", "fill-and-drain time", "holds at most p micro-batches",
                  f"GPipe holds {m} →", "1F1B's saving shows"):
        assert wrong not in text, wrong
    assert ("would still hold all 16: 328.25 GiB" in text) == (m == 16)   # named as what no framework runs
    doc = _explain_json("p=1", f"m={m}")
    n = doc["numbers"]
    assert n["gpipe_peak_in_flight"] == n["1f1b_peak_in_flight"] == [1] and n["bubble"] == 0.0
    assert in_flight(Layout(pp=1, schedule="gpipe"), 0, m) == in_flight(Layout(pp=1), 0, m) == 1
    # one stage's micro-batch is all 32 layers: 4 × a 4-stage pipeline's 8 layers, and 1 of it is held
    per4 = _explain_json("p=4", f"m={m}")["numbers"]["activation_bytes_per_microbatch"]
    assert n["activation_bytes_per_microbatch"] == pytest.approx(4 * per4)
    assert doc["table"]["rows"] == [[0, 32, "1", 1, "20.52 GiB"]] and "20.52 GiB" in text
    for c in doc["commands"]:                      # each suggested command runs as written
        code, _, err = cli_main(*c.split())
        assert code == 0, (c, err)
    # more than one stage: the text is the one it was
    doc4 = _explain_json("p=4", "m=16")
    assert doc4["derivation"] == P4_M16_DERIVATION and doc4["plain"] == P4_M16_PLAIN
    assert doc4["title"] == "GPipe vs 1F1B: same bubble, different memory"
    assert doc4["numbers"]["gpipe_peak_in_flight"] == [16, 16, 16, 16]
    assert doc4["numbers"]["1f1b_peak_in_flight"] == [4, 3, 2, 1]


def test_estimate_and_plan_take_recompute_modules_with_lora():
    """The CLI no longer refuses --recompute-modules with LoRA: the step time follows the modules re-run."""
    times = {}
    for m in ("core_attn", "mlp", "core_attn,mlp"):
        code, out, err = cli_main("estimate", "llama-3.1-8b", "--gpus", "8", "--lora-rank", "16", "--recompute",
                                  "selective", "--recompute-modules", m, "--json")
        assert code == 0, err
        times[m] = json.loads(out)["step_time_s"]
    assert times["core_attn"] < times["mlp"] < times["core_attn,mlp"]
    code, out, err = cli_main("plan", "llama-3.1-8b", "--gpus", "8", "--lora-rank", "16", "--recompute-modules", "mlp",
                              "--json")
    assert code == 0, err
