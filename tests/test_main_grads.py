"""Megatron-LM holds bf16-mixed gradients in an fp32 main_grad buffer and reduces them in fp32; the other frameworks
keep the ZeRO paper's 2-byte gradients. Memory, estimate and `comm plan` agree on it."""

import json

import pytest

from conftest import cli_main


def _memory(*args):
    code, out, err = cli_main("memory", "--json", *args)
    assert code == 0, err
    return json.loads(out)["per_gpu"]


PSI, D = 7.5e9, 64


@pytest.mark.parametrize("zero,megatron_bytes", [(0, 18), (1, 6 + 12 / D), (3, 18 / D)])
def test_megatron_guide_bytes_per_parameter(zero, megatron_bytes):
    """Megatron-LM's distributed-optimizer guide: bf16 parameters with fp32 gradients take 18 bytes per parameter,
    6 + 12/d with the distributed optimizer; the ZeRO paper's DeepSpeed takes 16, 4 + 12/d, 16/d."""
    lay = ["--params", str(PSI), "--dp", str(D), "--zero", str(zero)]
    meg = _memory(*lay)
    assert meg["model_states"] == pytest.approx(PSI * megatron_bytes, rel=1e-6)
    zero_paper = {0: 16, 1: 4 + 12 / D, 3: 16 / D}[zero]
    assert _memory(*lay, "--framework", "deepspeed")["model_states"] == pytest.approx(PSI * zero_paper, rel=1e-6)
    assert _memory(*lay, "--grad-reduce-bf16")["model_states"] == pytest.approx(PSI * zero_paper, rel=1e-6)


def test_no_ddp_bucket_copy_beside_megatrons_buffer_and_fp16_keeps_fp16_gradients():
    lay = ["llama-3.1-8b", "--gpus", "8", "--seq-len", "2048"]
    meg, fsdp = _memory(*lay), _memory(*lay, "--framework", "pytorch-fsdp")
    assert "ddp_buckets" not in meg["other_breakdown"] and fsdp["other_breakdown"]["ddp_buckets"] == fsdp["gradients"]
    assert meg["gradients"] == 2 * fsdp["gradients"]
    assert _memory(*lay, "--precision", "fp16-mixed")["gradients"] == fsdp["gradients"]   # Megatron fp16: fp16 grads
    assert _memory(*lay, "--precision", "fp32")["gradients"] == 2 * fsdp["gradients"]


def _dp_bytes(*args):
    code, out, err = cli_main("comm", "plan", "llama-3.1-8b", "--gpus", "16", "--zero", "1", "--json", *args)
    assert code == 0, err
    items = [i for i in json.loads(out)["items"] if i["axis"] == "ZeRO" and i["op"] == "reduce-scatter"]
    return sum(i["bytes_per_call"] * i["calls_per_step"] for i in items)


def test_comm_plan_and_estimate_reduce_megatrons_gradients_in_fp32():
    fp32, bf16 = _dp_bytes(), _dp_bytes("--grad-reduce-bf16")
    assert fp32 == pytest.approx(2 * bf16, rel=1e-3)
    assert _dp_bytes("--framework", "deepspeed") == pytest.approx(bf16, rel=1e-3)
    code, out, _ = cli_main("estimate", "llama-3.1-8b", "--gpus", "16", "--zero", "1", "--json")
    fw = json.loads(out)["framework"]
    assert fw["grad_reduce_bytes"] == 4 and fw["main_grad_bytes"] == 4


def test_comm_plan_counts_one_stage_of_a_pipeline():
    """With pp 2 the busiest rank is one stage's: the head's calls (last stage) or the embedding's, never both."""
    code, out, err = cli_main("comm", "plan", "llama-3.1-70b", "--gpus", "64", "--tp", "8", "--pp", "2", "--zero", "1",
                              "--json")
    assert code == 0, err
    notes = [i["note"] for i in json.loads(out)["items"]]
    assert any("(last stage)" in n for n in notes) and not any("(first stage)" in n for n in notes)


def test_kv_cache_explanation_writes_the_mla_formula():
    code, out, err = cli_main("explain", "kv-cache", "model=deepseek-v3", "gpu=h200", "tp=8")
    assert code == 0, err
    flat = " ".join(out.split())
    assert "61 layers × (512 + 64) × 2 B = 70,272 B" in flat and "KV heads ×" not in flat
