"""Megatron-Core recipe mechanisms: TP communication overlap (--tp-comm-overlap) and FP8 primary weights
(--fp8-params): the pricing, the memory, the CLI and the Megatron-LM / job-file round trip."""

import json

import numpy as np
import pytest

from shardlab.catalog import get_catalog
from shardlab.cli import main
from shardlab.comm.pricing import tp_overlapped_s
from shardlab.estimate import estimate_training
from shardlab.layout import Layout
from shardlab.memory import training_memory
from shardlab.memory.fp8 import Fp8Recipe, is_fp8_gemm
from shardlab.memory.overheads import NONE
from shardlab.memory.recipe import Recipe
from shardlab.specs.hardware import Cluster
from shardlab.specs.tensors import model_tensors

CAT = get_catalog()
L70 = CAT.model("llama-3.1-70b")
# NeMo's H100 Llama 3 70B layout (Megatron-Bridge performance tables): TP 4 x PP 8 x VP 5, micro-batch 1, 8k tokens
LAY = Layout(dp=2, tp=4, pp=8, vpp=5, schedule="interleaved", sequence_parallel=True, zero=1)
ARGS = ["llama-3.1-70b", "--gpus", "64", "--gpu", "h100-sxm", "--tp", "4", "--pp", "8", "--vpp", "5", "--schedule",
        "interleaved", "--sequence-parallel", "--zero", "1", "--global-batch", "128", "--seq-len", "8192",
        "--precision", "fp8-mixed"]


def _cluster(n=64):
    acc = CAT.accelerator("h100-sxm")
    return Cluster(acc, n, 8, CAT.link("nvlink4"), CAT.link("ib-ndr"))


def _est(**kw):
    return estimate_training(L70, LAY, _cluster(), seq_len=8192, global_batch=128, precision="fp8-mixed", **kw)


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_decomposition_shows_one_chunk_or_what_the_gemms_cannot_cover():
    # C < G: one of tp chunks shows; C > G: the excess plus a chunk of the GEMM's length; TP 1 has nothing to split
    assert tp_overlapped_s(0.8, 2.0, 4) == pytest.approx(0.2)
    assert tp_overlapped_s(3.0, 2.0, 4) == pytest.approx(1.0 + 0.5)
    assert tp_overlapped_s(0.8, 2.0, 1) == pytest.approx(0.8)
    got = tp_overlapped_s(np.array([0.8, 3.0]), np.array([2.0, 2.0]), np.array([8, 8]))
    assert got == pytest.approx([0.1, 1.25])


def test_overlap_hides_all_but_a_chunk_of_the_70b_tp_traffic():
    plain, over = _est(), _est(tp_comm_overlap=True)
    total = plain.breakdown["tp_comm_s"]
    assert plain.comm_total_s["tp_comm_s"] == pytest.approx(total)
    # what the collectives take in all does not change; what shows is a quarter (TP 4), plus the embedding's and the
    # cross-entropy's calls, which overlap nothing
    assert over.comm_total_s["tp_comm_s"] == pytest.approx(total)
    assert total / 4 < over.breakdown["tp_comm_s"] < total / 4 * 1.1
    # the step saves it on each of the 64 micro-batches and in the interleaved bubble, (p − 1)/v of a micro-batch's
    # time on the slowest stage
    bubble = (8 - 1) / 5 / 64
    assert plain.step_time_s - over.step_time_s == pytest.approx((total - over.breakdown["tp_comm_s"]) * (1 + bubble),
                                                                 rel=1e-3)
    assert over.workload.tp_comm_overlap and not plain.workload.tp_comm_overlap


def test_fp8_primary_weights_drop_the_bf16_copy_of_every_fp8_gemm_weight():
    lay = Layout(dp=8, zero=1)
    l7 = CAT.model("llama-2-7b")
    f8 = training_memory(lay, model=l7, seq_len=2048, overheads=NONE, precision="fp8-mixed").worst
    prim = training_memory(lay, model=l7, seq_len=2048, overheads=NONE, precision="fp8-mixed",
                           recipe=Recipe(fp8=Fp8Recipe(primary_weights=True, all_gather=True))).worst
    linear = sum(t.numel for t in model_tensors(l7) if is_fp8_gemm(t, l7))
    assert linear == 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)
    assert f8.weights - prim.weights == 2 * linear                 # the bf16 weights of the FP8 GEMMs
    assert prim.other["fp8_weight_cache"] == f8.other["fp8_weight_cache"] == 2 * linear   # FP8 weight + transpose
    assert (prim.gradients, prim.optimizer) == (f8.gradients, f8.optimizer)


def test_the_70b_recipe_fits_only_with_fp8_params_and_bf16_gradients():
    plain = _est()
    both = _est(grad_reduce_bytes=2, recipe=Recipe(fp8=Fp8Recipe(primary_weights=True, all_gather=True)))
    assert not plain.memory.fits and both.memory.fits
    # the planner's vectorised memory is the exact report's, with FP8 primary weights too
    from shardlab.estimate.step import evaluate
    from shardlab.layout import layouts_to_arrays

    r = evaluate(L70, both.cluster, both.workload, layouts_to_arrays([LAY]))
    assert float(r["memory_bytes"][0]) == pytest.approx(both.memory.worst.total, rel=1e-3)


def test_flags_need_their_context(capsys):
    code, _, err = _run(capsys, "estimate", "llama-3.1-8b", "--gpus", "8", "--fp8-params")
    assert code == 2 and "--precision fp8-mixed" in err and len(err.strip().splitlines()) == 1
    code, _, err = _run(capsys, "estimate", "llama-3.1-8b", "--inference", "--tp-comm-overlap")
    assert code == 2 and "--tp-comm-overlap" in err and len(err.strip().splitlines()) == 1


def test_megatron_line_and_job_file_carry_both_and_read_back(tmp_path, capsys):
    flags = ["--grad-reduce-bf16", "--fp8-params", "--tp-comm-overlap"]
    code, out, _ = _run(capsys, "estimate", *ARGS, *flags, "--json")
    assert code == 0
    want = json.loads(out)["step_time_s"]
    for target, name in (("megatron", "train.sh"), ("shardlab", "job.toml")):
        path = tmp_path / name
        code, out, _ = _run(capsys, "export", "--to", target, *ARGS, *flags, "--out", str(path), "--json")
        assert code == 0 and json.loads(out)["unsupported"] == []
        text = path.read_text()
        if target == "megatron":
            assert "--tp-comm-overlap" in text and "--fp8-param-gather" in text and "--grad-reduce-in-bf16" in text
        else:
            assert "tp_comm_overlap = true" in text and "fp8_params = true" in text
        code, out, _ = _run(capsys, "estimate", "--from", str(path), "--json")
        assert code == 0
        d = json.loads(out)
        assert d["step_time_s"] == pytest.approx(want, rel=1e-9) and d["framework"]["tp_comm_overlap"] is True


def test_other_targets_say_they_cannot_carry_them(tmp_path, capsys):
    small = ["llama-3.1-8b", "--gpus", "8", "--global-batch", "64", "--seq-len", "4096"]
    code, out, _ = _run(capsys, "export", "--to", "torchtitan", *small, "--tp", "2", "--zero", "3", "--tp-comm-overlap",
                        "--out", str(tmp_path / "job.toml"), "--json")
    assert code == 0
    said = {u["setting"]: u["why"] for u in json.loads(out)["unsupported"]}
    assert "enable_async_tensor_parallel" in said["tp_comm_overlap"]
    code, out, _ = _run(capsys, "export", "--to", "deepspeed", *small, "--zero", "3", "--precision", "fp8-mixed",
                        "--fp8-params", "--out", str(tmp_path / "ds.json"), "--json")
    assert code == 0
    said = {u["setting"]: u["why"] for u in json.loads(out)["unsupported"]}
    assert "--fp8-param-gather" in said["fp8_params"]
    # Megatron-LM overlaps TP communication only with sequence parallelism: the line says so instead of failing
    args = [a for a in ARGS if a != "--sequence-parallel"]
    code, out, _ = _run(capsys, "export", "--to", "megatron", *args, "--tp-comm-overlap", "--out",
                        str(tmp_path / "t.sh"), "--json")
    assert code == 0 and "--tp-comm-overlap" not in (tmp_path / "t.sh").read_text()
    assert [u["setting"] for u in json.loads(out)["unsupported"]] == ["tp_comm_overlap"]


def test_planner_memory_shards_fp8_experts_over_the_expert_group():
    """ZeRO-3 with FP8 primary weights on a MoE model: the routed experts' FP8 shards are over dp·cp/ep, as the
    exact report has them; the planner's vectorised memory agrees."""
    from shardlab.estimate.step import evaluate
    from shardlab.layout import layouts_to_arrays

    spec = CAT.model("mixtral-8x7b")
    for ep in (4, 8):
        lay = Layout(dp=8, ep=ep, zero=3)
        est = estimate_training(spec, lay, _cluster(8), seq_len=4096, global_batch=64, precision="fp8-mixed",
                                recipe=Recipe(fp8=Fp8Recipe(primary_weights=True, all_gather=True)))
        r = evaluate(spec, est.cluster, est.workload, layouts_to_arrays([lay]))
        assert float(r["memory_bytes"][0]) == pytest.approx(est.memory.worst.total, rel=2e-3)


def test_fp8_all_gather_stays_a_zero3_setting():
    """torchtitan's FSDP flag changes nothing under ZeRO-1 (the distributed optimizer gathers bf16 there); FP8
    primary weights gather in FP8 at every stage."""
    base = ["estimate", "llama-3.1-8b", "--gpus", "16", "--zero", "1", "--precision", "fp8-mixed", "--seq-len", "4096",
            "--global-batch", "64", "--json"]

    import contextlib
    import io

    totals = []
    for extra in ((), ("--fp8-all-gather",), ("--fp8-params",)):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            assert main([*base, *extra]) == 0
        d = json.loads(buf.getvalue())
        totals.append(d["comm_total_s"]["dp_comm_s"])
    assert totals[0] == pytest.approx(totals[1], rel=1e-12) and totals[2] < totals[0]


def test_plans_and_launchers_carry_both_flags(tmp_path, capsys):
    flags = ["--fp8-params", "--tp-comm-overlap", "--sequence-parallel"]
    plan_args = ["llama-3.1-70b", "--gpus", "64", "--gpu", "h100-sxm", "--precision", "fp8-mixed", "--seq-len", "8192",
                 "--global-batch", "128", "--fix", "tp=4", "--fix", "pp=8", "--top", "1"]
    out = tmp_path / "pe.sh"
    code, doc, err = _run(capsys, "plan", *plan_args, *flags, "--export", "megatron", "--out", str(out), "--json")
    assert code == 0, err
    text = out.read_text()
    assert "--tp-comm-overlap" in text and "--fp8-param-gather" in text and "could not express" not in text
    assert json.loads(doc)["workload"]["fp8_params"] is True
    code, doc, err = _run(capsys, "export", "--to", "slurm", "--launch", "megatron", *ARGS, "--fp8-params",
                          "--tp-comm-overlap", "--out", str(tmp_path / "job.sbatch"), "--json")
    assert code == 0, err
    script = (tmp_path / "job.sbatch").read_text()
    assert "--tp-comm-overlap" in script and "--fp8-param-gather" in script
    assert not {u["setting"] for u in json.loads(doc)["unsupported"]} & {"tp_comm_overlap", "fp8_params"}
    assert "could not express tp_comm_overlap" not in script


def test_validate_replays_a_nemo_row_with_its_recipe_flags(capsys):
    code, out, err = _run(capsys, "validate", "--run", "mcore-70b-h100-25.09", "--json")
    assert code == 0, err
    d = json.loads(out)
    cmd = json.dumps(d)
    assert "--fp8-params" in cmd and "--grad-reduce-bf16" in cmd and "--fp8-all-gather" not in cmd
