"""FP8, offload and LoRA/QLoRA in the step model, the estimate and the planner (wired through Workload.recipe)."""

import json

import pytest

from shardlab.catalog import get_catalog
from shardlab.cli import main
from shardlab.estimate import estimate_training
from shardlab.estimate.offload import CPU_ADAM_PARAMS_PER_S
from shardlab.layout import Layout
from shardlab.memory.lora import LoraSpec
from shardlab.memory.offload import Offload
from shardlab.memory.recipe import Recipe
from shardlab.specs.hardware import Cluster

CAT = get_catalog()
H100 = CAT.accelerator("h100-sxm")


def _cluster(n, acc=H100):
    return Cluster(acc, n, 8, CAT.link("nvlink4"), CAT.link("ib-ndr"))


def _est(model, n, lay, **kw):
    return estimate_training(CAT.model(model), lay, _cluster(n), seq_len=kw.pop("seq_len", 4096), global_batch=kw.pop("gb", 16), **kw)


def test_fp8_speeds_up_linear_gemms_only():
    lay = Layout(dp=8, zero=3)
    bf = _est("llama-3.1-8b", 8, lay)
    f8 = _est("llama-3.1-8b", 8, lay, precision="fp8-mixed")
    # GEMMs at twice the peak, attention and memory-bound kernels unchanged, casts added: between 1× and 2×
    assert 1.2 < bf.breakdown["compute_s"] / f8.breakdown["compute_s"] < 2.0
    assert f8.memory.worst.activations < bf.memory.worst.activations    # FP8-saved linear inputs


def test_fp8_on_a100_is_refused():
    with pytest.raises(Exception, match="no fp8 peak"):
        estimate_training(CAT.model("llama-3.1-8b"), Layout(dp=8), _cluster(8, CAT.accelerator("a100-80gb")), seq_len=2048,
                          global_batch=8, precision="fp8-mixed")


def test_offload_time_is_the_cpu_step_and_unhidden_transfers():
    rec = Recipe(offload=Offload("optimizer"), host_link_bytes_per_s=CAT.link("pcie5").bytes_per_s)
    e = _est("llama-3.1-8b", 8, Layout(dp=8, zero=2), recipe=rec)
    part = -(-8_030_261_248 // 8)
    cpu = part * 8 / CPU_ADAM_PARAMS_PER_S
    assert e.breakdown["optimizer_s"] == 0 and e.breakdown["offload_s"] == pytest.approx(cpu + 2 * part / 51.2e9, rel=1e-3)
    assert e.to_dict()["offload"]["cpu_adam_s"] == pytest.approx(cpu)
    assert e.memory.worst.optimizer == 0 and e.memory.worst.host_total > 0


def test_lora_step_has_no_weight_gradient_gemms():
    full = _est("llama-2-7b", 1, Layout(), seq_len=2048, gb=4)
    lora = _est("llama-2-7b", 1, Layout(), seq_len=2048, gb=4, recipe=Recipe(lora=LoraSpec(16)))
    ratio = lora.breakdown["compute_s"] / full.breakdown["compute_s"]
    assert 0.62 < ratio < 0.8           # ≈ 2/3 (forward + dgrad) plus attention and the r-wide adapter GEMMs (slow)
    assert lora.breakdown["optimizer_s"] < full.breakdown["optimizer_s"] / 100
    assert lora.memory.worst.gradients < full.memory.worst.gradients / 100


def test_planner_uses_offload_when_nothing_fits(capsys):
    assert main(["plan", "llama-3.1-70b", "--gpus", "4", "--seq-len", "4096", "--global-batch", "16", "--top", "1",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["workload"]["offload"] == "both" and doc["plans"][0]["layout"]["zero"] == 3
    assert "without offload" in doc["notes"][0] and doc["plans"][0]["breakdown"]["offload_s"] > 0
    # the host RAM it needs is stated (the catalog holds no host capacity to check it against)
    assert doc["host_bytes_per_gpu"] > 0 and "host memory the winner needs" in doc["notes"][1]
    assert f"{doc['host_bytes_per_gpu'] / 2**30:,.1f} GiB per GPU" in doc["notes"][1]


def test_qlora_plan_and_estimate_cli(capsys):
    assert main(["estimate", "llama-2-7b", "--gpu", "rtx-4090", "--gpus", "1", "--lora-rank", "16", "--quantize-base",
                 "nf4", "--seq-len", "2048", "--global-batch", "8", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fits"] and doc["memory"]["recipe"]["lora"]["trainable_params"] == 39_976_960


def test_inference_refuses_training_recipe_flags(capsys):
    assert main(["estimate", "llama-3.1-8b", "--inference", "--lora-rank", "8"]) == 2
    assert "--lora-rank" in capsys.readouterr().err


@pytest.mark.parametrize("argv,fix", [
    (["--fp8-all-gather"], "--precision fp8-mixed"), (["--fp8-amax-history", "16"], "--precision fp8-mixed"),
    (["--offload-device", "nvme"], "--offload"), (["--lora-targets", "q,v"], "--lora-rank"),
    (["--quantize-base", "nf4"], "--lora-rank"), (["--lora-rank", "8", "--lora-targets", "qq"], "all-linear"),
])
def test_recipe_flags_without_their_recipe_are_refused(argv, fix, capsys):
    try:
        rc = main(["memory", "llama-3.1-8b", "--gpus", "8", "--zero", "3"] + argv)
    except SystemExit as e:  # argparse rejects a bad --lora-targets value itself
        rc = e.code
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert fix in err and "\n" not in err
