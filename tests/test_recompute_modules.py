"""Megatron-core's selective recomputation modules (--recompute-modules): what each removes from the saved
activations, what it re-runs in backward, and that every surface (estimate, memory, plan, job files, the Megatron
export and its reader) carries them."""

import json

import pytest

from shardlab.catalog import get_catalog
from shardlab.cli import main
from shardlab.errors import ShardlabError
from shardlab.estimate import estimate_training
from shardlab.flops import training_flops_per_token
from shardlab.layout import RECOMPUTE_MODULES, Layout
from shardlab.layout_checks import validate
from shardlab.memory.activations import ActivationContext, layer_activation_bytes, recompute_parts
from shardlab.specs.hardware import Cluster
from conftest import run_cli

CAT = get_catalog()
H100 = CAT.accelerator("h100-sxm")
QWEN = CAT.model("qwen3-30b-a3b")
DSV3 = CAT.model("deepseek-v3")


def _cluster(n):
    return Cluster(H100, n, 8, CAT.link("nvlink4"), CAT.link("ib-ndr"))


def _est(spec, lay, **kw):
    return estimate_training(spec, lay, _cluster(lay.world_size), seq_len=4096, global_batch=kw.pop("gb", 64),
                             framework=CAT.framework("megatron-lm"), **kw)


def test_the_default_module_is_the_attention_core():
    ctx = ActivationContext(seq_len=4096, elem_bytes=2)
    plain = layer_activation_bytes(QWEN, 5, Layout(dp=8, ep=8, recompute="selective"), ctx)
    core = layer_activation_bytes(QWEN, 5, Layout(dp=8, ep=8, recompute="selective", recompute_modules=("core_attn",)),
                                  ctx)
    assert plain == core
    e1 = _est(QWEN, Layout(dp=8, ep=8, recompute="selective"))
    e2 = _est(QWEN, Layout(dp=8, ep=8, recompute="selective", recompute_modules=("core_attn",)))
    assert e1.step_time_s == e2.step_time_s and e1.memory.worst.total == e2.memory.worst.total


def test_each_module_removes_its_own_tensors():
    """Shapes for Qwen3-30B-A3B (h 2048, 128 experts of width 768, top-8), b = 1, s = 4096, bf16, no TP:
    layernorm drops the pre-MLP norm's output (s·h·2 B; Megatron-core's TE spec fuses the attention norm into the
    QKV GEMM); moe_act the SwiGLU's silu(gate) and product for the k copies (2·2 B · k·s·f); moe everything the
    routed layer keeps."""
    s, h, k, f, E, h_ds = 4096, 2048, 8, 768, 128, 7168
    ctx = ActivationContext(seq_len=s, elem_bytes=2)
    parts = recompute_parts(QWEN, 5, Layout(dp=8, ep=8), ctx)
    assert parts["layernorm"] == 2 * s * h
    assert parts["moe_act"] == 2 * 2 * k * s * f
    assert parts["moe"] == 2 * 4 * s * E + 4 * k * s * h + 8 * k * s * f     # router fp32 ×2, copies in/out, 4 f-wide
    assert parts["mlp"] == parts["mla_up_proj"] == parts["shared_experts"] == 0    # none in this block
    total, removed = layer_activation_bytes(QWEN, 5, Layout(dp=8, ep=8, recompute="selective",
                                                            recompute_modules=("moe_act", "layernorm")), ctx)
    assert removed == parts["moe_act"] + parts["layernorm"] and total > removed
    # FP8 saves linear inputs in one byte: the norm outputs that feed a GEMM shrink with them
    assert recompute_parts(QWEN, 5, Layout(), ActivationContext(seq_len=s, elem_bytes=2, linear_input_bytes=1)
                           )["layernorm"] == s * h
    # DeepSeek-V3: a dense block has an MLP to re-run, every block MLA up-projections and MLA's own input norm
    d = recompute_parts(DSV3, 0, Layout(), ctx)
    assert d["mlp"] > 0 and d["moe"] == 0 and d["mla_up_proj"] == 2 * s * 128 * (2 * 192 + 128)
    assert d["layernorm"] == 2 * s * h_ds and recompute_parts(DSV3, 5, Layout(), ctx)["layernorm"] == 2 * 2 * s * h_ds
    # inside the MoE layer's checkpoint, moe_act and shared_experts drop nothing more
    lay = lambda mods: Layout(dp=8, ep=8, recompute="selective", recompute_modules=mods)   # noqa: E731
    assert layer_activation_bytes(DSV3, 5, lay(("moe", "moe_act", "shared_experts")), ctx) == \
        layer_activation_bytes(DSV3, 5, lay(("moe",)), ctx)


def test_modules_trade_memory_for_recompute_time_in_the_estimate():
    base = _est(QWEN, Layout(dp=8, ep=8))
    act = _est(QWEN, Layout(dp=8, ep=8, recompute="selective", recompute_modules=("moe_act", "layernorm")))
    moe = _est(QWEN, Layout(dp=8, ep=8, recompute="selective", recompute_modules=("moe",)))
    full = _est(QWEN, Layout(dp=8, ep=8, recompute="full"))
    assert base.memory.worst.activations > act.memory.worst.activations > moe.memory.worst.activations \
        > full.memory.worst.activations
    r = [e.breakdown["recompute_s"] for e in (base, act, moe, full)]
    assert r[0] == 0 < r[1] < r[2] < r[3]
    # the MoE layer's re-run forward dispatches and combines again: a third pass of its all-to-alls
    assert moe.breakdown["ep_comm_s"] == pytest.approx(base.breakdown["ep_comm_s"] * 1.5, rel=0.02)
    assert act.breakdown["ep_comm_s"] == base.breakdown["ep_comm_s"]
    # hardware FLOPs count the re-run matmuls (the routed experts' top-k share), model FLOPs do not
    assert moe.hardware_tflops_per_gpu > moe.model_tflops_per_gpu
    assert act.hardware_tflops_per_gpu == pytest.approx(act.model_tflops_per_gpu)


def test_hardware_flops_per_module():
    model, core = training_flops_per_token(DSV3, 4096, "selective")
    _, mlp = training_flops_per_token(DSV3, 4096, "selective", modules=("mlp",))
    _, up = training_flops_per_token(DSV3, 4096, "selective", modules=("mla_up_proj",))
    # DeepSeek-V3's three dense blocks: gate, up, down of 7168 × 18432, two FLOPs per weight
    assert mlp - model == 2 * 3 * 3 * 7168 * 18432
    # every block's q_b (1536 → 128·192) and kv_b (512 → 128·256)
    assert up - model == 2 * 61 * (1536 * 128 * 192 + 512 * 128 * 256)
    assert core > model


@pytest.mark.parametrize("lay,spec,msg", [
    (Layout(recompute="full", recompute_modules=("moe_act",)), QWEN, "add layout.recompute selective"),
    (Layout(recompute="selective", recompute_modules=("mla_up_proj",)), QWEN, "needs multi-head latent attention"),
    (Layout(recompute="selective", recompute_modules=("mlp",)), QWEN, "needs dense MLP blocks"),
    (Layout(recompute="selective", recompute_modules=("moe_act",)), CAT.model("llama-3.1-8b"), "mixture-of-experts"),
    (Layout(recompute="selective", recompute_modules=("moe", "moe")), QWEN, "distinct names"),
])
def test_refusals_name_the_problem(lay, spec, msg):
    with pytest.raises(ShardlabError, match=msg):
        validate(lay, spec)


def test_a_change_of_recomputation_drops_the_modules():
    lay = Layout(recompute="selective", recompute_modules=("moe_act",))
    assert lay.with_(recompute="full").recompute_modules is None
    assert set(RECOMPUTE_MODULES) >= {"core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts"}


def _run(argv, capsys):
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


FLAGS = ["qwen3-30b-a3b", "--gpus", "8", "--ep", "8", "--global-batch", "64", "--seq-len", "4096",
         "--framework", "megatron-lm", "--recompute", "selective", "--recompute-modules", "moe_act,layernorm"]


def test_cli_estimate_memory_and_plan_carry_the_modules(capsys):
    rc, out, _ = _run(["estimate", *FLAGS, "--json"], capsys)
    assert rc == 0
    doc = json.loads(out)
    assert doc["layout"]["recompute_modules"] == ["moe_act", "layernorm"]
    rc, out, _ = _run(["memory", *FLAGS], capsys)
    assert rc == 0 and "recompute selective (moe_act, layernorm)" in " ".join(out.split())
    bad = run_cli("estimate", *FLAGS[:-1], "moe_act,bogus")
    assert bad.returncode == 2 and "distinct names from core_attn" in bad.stderr and "Traceback" not in bad.stderr
    common = ["qwen3-30b-a3b", "--gpus", "8", "--gpu", "b200", "--global-batch", "64", "--seq-len", "4096",
              "--recompute", "selective", "--recompute-modules", "moe"]
    rc, out, _ = _run(["plan", *common, "--fix", "ep=8", "--json"], capsys)
    assert rc == 0
    plan = json.loads(out)["plans"][0]
    assert plan["layout"]["recompute_modules"] == ["moe"] and not plan["breakdown"]["offload_s"]
    # the plan's step time is the estimate's for its layout (the search priced the same modules)
    lay = plan["layout"]
    rc, out, _ = _run(["estimate", *common, "--ep", "8", "--zero", str(lay["zero"]), "--micro-batch",
                       str(lay["micro_batch"]), "--tp", str(lay["tp"]), "--pp", str(lay["pp"]), "--cp", str(lay["cp"]),
                       "--json"], capsys)
    assert rc == 0 and json.loads(out)["step_time_s"] == pytest.approx(plan["step_time_s"], rel=1e-9)


def test_megatron_export_and_job_file_read_back(tmp_path, capsys):
    for to, name in (("megatron", "qwen3-30b-a3b-megatron.sh"), ("shardlab", "qwen3-30b-a3b-job.toml")):
        rc, out, err = _run(["export", *FLAGS, "--to", to, "--json"], capsys)
        assert rc == 0, err
        text = json.loads(out)["text"]
        if to == "megatron":
            assert "--recompute-granularity selective" in text and "--recompute-modules moe_act layernorm" in text
        f = tmp_path / name
        f.write_text(text)
        rc, out, err = _run(["estimate", "--from", str(f), "--json"], capsys)
        assert rc == 0, err
        assert json.loads(out)["layout"]["recompute_modules"] == ["moe_act", "layernorm"]
    # a hand-edited job file with a bad module is one line naming it
    bad = tmp_path / "bad.toml"
    bad.write_text((tmp_path / "qwen3-30b-a3b-job.toml").read_text().replace('"moe_act"', '"moe_activation"'))
    rc, _, err = _run(["estimate", "--from", str(bad)], capsys)
    assert rc == 2 and "moe_activation" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_fp8_export_with_moe_act_or_layernorm_writes_current_scaling(capsys):
    """Megatron-core 0.16.1 refuses delayed FP8 scaling with moe_act or layernorm recomputation
    (transformer_config.py: 'Delayed scaling does not support moe_act and layernorm recompute for fp8'), so the
    export writes per-tensor current scaling and says so."""
    rc, out, err = _run(["export", *FLAGS, "--gpu", "b200", "--precision", "fp8-mixed", "--to", "megatron", "--json"],
                        capsys)
    assert rc == 0, err
    doc = json.loads(out)
    assert "--fp8-recipe tensorwise" in doc["text"]
    assert [u["setting"] for u in doc["unsupported"]] == ["fp8_recipe"]
    rc, out, _ = _run(["export", *FLAGS[:-2], "--recompute-modules", "core_attn", "--gpu", "b200", "--precision",
                       "fp8-mixed", "--to", "megatron", "--json"], capsys)
    assert rc == 0 and "--fp8-recipe" not in json.loads(out)["text"]


def test_modules_under_inference_in_set_and_in_megatron_files(tmp_path, capsys):
    bad = run_cli("estimate", "qwen3-30b-a3b", "--inference", "--recompute-modules", "moe_act")
    assert bad.returncode == 2 and "--recompute-modules" in bad.stderr and "training" in bad.stderr
    rc, out, err = _run(["export", *FLAGS, "--to", "shardlab", "--json"], capsys)
    job = tmp_path / "job.toml"
    job.write_text(json.loads(out)["text"])
    rc, out, err = _run(["estimate", "--from", str(job), "--set", "layout.recompute=full", "--json"], capsys)
    assert rc == 0, err
    assert json.loads(out)["layout"]["recompute"] == "full" and json.loads(out)["layout"]["recompute_modules"] is None
    # the Megatron reader: '=' form, and an empty list (selective recomputation of nothing)
    rc, out, err = _run(["export", *FLAGS, "--to", "megatron", "--json"], capsys)
    text = json.loads(out)["text"]
    for new, want in (("--recompute-modules=moe_act", ("selective", ["moe_act"])), ("--recompute-modules", ("none", None))):
        f = tmp_path / "m.sh"
        f.write_text(text.replace("--recompute-modules moe_act layernorm", new))
        rc, out, err = _run(["estimate", "--from", str(f), "--json"], capsys)
        assert rc == 0, err
        lay = json.loads(out)["layout"]
        assert (lay["recompute"], lay["recompute_modules"]) == want
