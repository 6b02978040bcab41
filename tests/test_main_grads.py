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


def test_the_gradient_dtype_survives_export_and_reading_back(tmp_path):
    """A plan that assumed bf16 reduction under Megatron-LM exports --grad-reduce-in-bf16, and `estimate --from` the
    script gets the plan's memory back; FP8 is written as --bf16 --fp8-format hybrid; DeepSpeed says fp32 reduction
    in communication_data_type."""
    plan = tmp_path / "p.json"
    code, out, err = cli_main("plan", "llama-3.1-8b", "--gpus", "16", "--tp", "2", "--pp", "2", "--zero", "1", "--seq-len",
                              "4096", "--global-batch", "32", "--top", "1", "--grad-reduce-bf16", "--json")
    assert code == 0, err
    plan.write_text(out)
    planned = json.loads(out)["plans"][0]["memory_bytes"]
    script = tmp_path / "x.sh"
    assert cli_main("export", "--to", "megatron", "--plan", str(plan), "--out", str(script))[0] == 0
    assert "--grad-reduce-in-bf16" in script.read_text()
    code, out, err = cli_main("estimate", "--from", str(script), "--json")
    assert code == 0, err
    back = json.loads(out)
    assert back["framework"]["main_grad_bytes"] == 2 and back["memory"]["per_gpu"]["total"] == planned
    fp8 = tmp_path / "f8.sh"
    assert cli_main("export", "--to", "megatron", "llama-3.1-8b", "--gpus", "8", "--precision", "fp8-mixed", "--out",
                    str(fp8))[0] == 0
    assert "--fp8-format hybrid" in fp8.read_text()
    code, out, _ = cli_main("estimate", "--from", str(fp8), "--json")
    assert json.loads(out)["workload"]["precision"] == "fp8-mixed"
    ds = tmp_path / "ds.json"
    assert cli_main("export", "--to", "deepspeed", "llama-3.1-8b", "--gpus", "8", "--zero", "1", "--grad-reduce-fp32",
                    "--out", str(ds))[0] == 0
    assert json.loads(ds.read_text())["communication_data_type"] == "fp32"


def test_ladder_and_cost_take_the_gradient_flags_and_megatrons_zero1_has_no_bucket():
    code, a, _ = cli_main("memory", "--finetune-ladder", "--json")
    code2, b, _ = cli_main("memory", "--finetune-ladder", "--grad-reduce-bf16", "--json")
    assert code == code2 == 0
    full = lambda d: {r["model"]: r["full"] for r in json.loads(d)["rows"]}["llama-3.1-8b"]  # noqa: E731
    assert full(b) < full(a)
    code, _, err = cli_main("cost", "llama-3.1-8b", "--gpus", "8", "--zero", "1", "--seq-len", "4096", "--global-batch",
                            "64", "--tokens", "1e9", "--grad-reduce-bf16")
    assert code == 0, err
    lay = ["llama-3.1-8b", "--gpus", "16", "--zero", "1", "--seq-len", "2048"]
    assert "zero_buckets" not in _memory(*lay)["other_breakdown"]
    assert _memory(*lay, "--framework", "deepspeed")["other_breakdown"]["zero_buckets"] > 0
