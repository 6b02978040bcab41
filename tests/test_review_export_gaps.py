"""Regression tests for three reviewed export gaps: a job built from a file's fields (the far end of a round trip,
the re-estimate of an export for another framework) keeps the optimizer, the recompute fraction and HSDP's
replicas; a tampered `shardlab plan --json` file is refused field by field before anything reaches a job file; and
the Slurm and SkyPilot readers take GPUs per node from what the file says one node runs, never the whole job's GPUs."""

import json
import re

import pytest
import yaml

from conftest import cli_main, one_line_error

from shardlab.catalog import get_catalog
from shardlab.errors import ShardlabError
from shardlab.export import read_text, render
from shardlab.export.build import job_from_fields, job_from_plan
from shardlab.export.job import DEFAULT_GPUS_PER_NODE, LaunchJob
from shardlab.layout import Layout

CAT = get_catalog([])
MODEL = "llama-3.1-8b"


def ok_json(*args) -> dict:
    code, out, err = cli_main(*args, "--json")
    assert code == 0, err
    return json.loads(out)


# ---- 1: job_from_fields keeps the optimizer, the recompute fraction and HSDP's replicas -----------------------------
def test_job_from_fields_keeps_every_layout_field_and_the_optimizer():
    job = job_from_fields({"model": MODEL, "gpus": 16, "zero": 3, "dp_replicate": 2, "recompute": "full",
                           "recompute_fraction": 0.5, "wrap": 2, "optimizer": "sgd", "global_batch": 64}, CAT)
    lay = job.layout
    assert (lay.dp, lay.zero, lay.dp_replicate, lay.recompute, lay.recompute_fraction, lay.wrap) == \
        (16, 3, 2, "full", 0.5, 2)
    assert job.optimizer == "sgd"
    sel = job_from_fields({"model": MODEL, "gpus": 8, "recompute": "selective",
                           "recompute_modules": ["core_attn", "mlp"]}, CAT)
    assert sel.layout.recompute_modules == ("core_attn", "mlp")
    assert job_from_fields({"model": MODEL, "gpus": 8}, CAT).optimizer == "adamw"       # unnamed: the default
    with pytest.raises(ShardlabError, match="optimizer 'lion' is not one of adamw, sgd, adam-8bit"):
        job_from_fields({"model": MODEL, "gpus": 8, "optimizer": "lion"}, CAT)
    with pytest.raises(ShardlabError, match="recompute_fraction must be in"):            # checked as a layout's
        job_from_fields({"model": MODEL, "gpus": 8, "recompute": "full", "recompute_fraction": 1.5}, CAT)


@pytest.mark.parametrize("target, job", [
    ("torchtitan", LaunchJob(MODEL, Layout(dp=16, zero=3, dp_replicate=2, recompute="full", recompute_fraction=0.5),
                             4096, 64)),
    ("accelerate", LaunchJob(MODEL, Layout(dp=16, zero=3, dp_replicate=2), 4096, 64)),
    ("megatron", LaunchJob(MODEL, Layout(dp=16, zero=1, recompute="full", recompute_fraction=0.5), 4096, 64,
                           optimizer="sgd")),
    ("deepspeed", LaunchJob(MODEL, Layout(dp=16, zero=1), 4096, 64, optimizer="sgd")),
])
def test_a_round_trip_through_the_file_keeps_them(target, job):
    exp = render(job, CAT.model(MODEL), target)
    back = job_from_fields({"model": MODEL, "gpus": job.gpus, **read_text(exp.text, CAT, target).fields}, CAT, job)
    for key in ("dp_replicate", "recompute", "recompute_fraction", "zero", "dp"):
        assert getattr(back.layout, key) == getattr(job.layout, key), key
    assert back.optimizer == job.optimizer


def test_export_for_another_framework_reestimates_the_file_as_written(tmp_path):
    """A layout scored for Megatron-LM written as a torchtitan job: the step time the export gives is what
    `estimate --from` the file says, HSDP and the every-other-block recomputation included."""
    args = (MODEL, "--gpus", "16", "--zero", "3", "--dp-replicate", "2", "--recompute", "full",
            "--recompute-fraction", "0.5", "--global-batch", "64", "--framework", "megatron-lm")
    out = tmp_path / "job.toml"
    r = ok_json("export", "--to", "torchtitan", *args, "--out", str(out))["retarget"]
    assert r["framework"] == "torchtitan" and r["scored_for"] == "megatron-lm"
    back = ok_json("estimate", "--from", str(out))
    assert (back["layout"]["dp_replicate"], back["layout"]["recompute_fraction"]) == (2, 0.5)
    assert r["step_time_s"] == pytest.approx(back["step_time_s"], rel=1e-9)
    # the plan route too: `plan --export` re-estimates what it writes
    doc = ok_json("plan", MODEL, "--gpus", "16", "--fix", "zero=3", "--fix", "hs=1", "--fix", "tp=1", "--fix", "pp=1",
                  "--fix", "cp=1", "--global-batch", "64", "--top", "1", "--framework", "megatron-lm",
                  "--export", "torchtitan", "--out", str(tmp_path / "p.toml"))
    assert doc["framework"]["id"] == "megatron-lm" and doc["plans"][0]["layout"]["dp_replicate"] == 2
    back = ok_json("estimate", "--from", str(tmp_path / "p.toml"))
    assert doc["export"]["retarget"]["step_time_s"] == pytest.approx(back["step_time_s"], rel=1e-9)


# ---- 2: a tampered plan file is refused, field by field ---------------------------------------------------------
@pytest.fixture(scope="module")
def plan_doc():
    return ok_json("plan", MODEL, "--gpus", "8", "--top", "1")


def _tampered(tmp_path, doc: dict, field: str, value) -> str:
    doc = json.loads(json.dumps(doc))
    *head, last = field.split(".")
    node = doc
    for key in head:
        node = node[int(key) if key.isdigit() else key]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("field, value, fragments", [
    ("framework", "not-a-framework", ("framework 'not-a-framework' is not a framework shardlab knows", "--catalog")),
    ("framework.id", "nope", ("framework 'nope' is not a framework shardlab knows",)),
    ("framework", ["megatron-lm"], ("framework must be a name, or an object with an id",)),
    ("workload.seq_len", -4096, ("workload.seq_len must be a positive whole number",)),
    ("workload.seq_len", 10**30, ("workload.seq_len", "above the limit of 16,777,216")),
    ("workload.seq_len", 4096.5, ("workload.seq_len must be a whole number",)),
    ("workload.seq_len", "4096", ("workload.seq_len must be a whole number",)),
    ("workload.seq_len", True, ("workload.seq_len must be a whole number",)),
    ("workload.seq_len", KeyError, ("workload has no seq_len",)),
    ("workload.global_batch", 64.0, ("workload.global_batch must be a whole number",)),
    ("workload.global_batch", "64", ("workload.global_batch must be a whole number",)),
    ("workload.global_batch", 2**40, ("workload.global_batch", "above the limit")),
    ("workload", [1], ("workload must be a mapping",)),
    ("workload.lora_rank", -3, ("workload.lora_rank must be a positive whole number",)),
    ("workload.offload", "gpu", ("workload.offload must be one of none, optimizer, params, both",)),
    ("workload.quantize_base", "int3", ("workload.quantize_base must be one of none, nf4",)),
    ("workload.fp8_params", "yes", ("workload.fp8_params must be true or false",)),
    ("framework.moe_dispatcher", "weird", ("framework.moe_dispatcher must be one of alltoall, deepep",)),
    ("framework.expert_imbalance", 0.5, ("framework.expert_imbalance must be in [1, 64]",)),
    ("framework.ep_comm_overlap", "yes", ("framework.ep_comm_overlap must be true or false",)),
    ("plans.0.step_time_s", "fast", ("plans[0].step_time_s must be a number",)),
])
@pytest.mark.parametrize("target", ["shardlab", "torchtitan"])
def test_a_tampered_plan_is_one_line_naming_the_field(tmp_path, plan_doc, field, value, fragments, target):
    bad = _tampered(tmp_path, plan_doc, field, value)
    out = tmp_path / "out.file"
    one_line_error(["export", "--to", target, "--plan", bad, "--out", str(out)], *fragments,
                   "export the plan again with `shardlab plan --json`")
    assert not out.exists()                             # nothing written


def test_a_plan_read_as_a_dict_refuses_nan_and_infinity(plan_doc):
    """JSON files cannot hold NaN (the reader refuses them), but job_from_plan takes any mapping."""
    for field, value in (("seq_len", float("nan")), ("global_batch", float("inf"))):
        doc = json.loads(json.dumps(plan_doc))
        doc["workload"][field] = value
        with pytest.raises(ShardlabError, match=f"workload.{field} must be a finite number"):
            job_from_plan(doc, CAT)


def test_a_plan_exports_with_the_catalog_that_knows_its_framework(tmp_path, plan_doc):
    """An untouched plan exports every field as before; a plan made with a catalog file's framework exports with that
    --catalog, and without it is refused naming the fix (not echoed into the job file as a name nothing knows)."""
    from dataclasses import asdict

    pj = tmp_path / "plan.json"
    pj.write_text(json.dumps(plan_doc))
    text = ok_json("export", "--to", "shardlab", "--plan", str(pj))["text"]
    wl = plan_doc["workload"]
    assert f"seq_len = {wl['seq_len']}" in text and f"global_batch = {wl['global_batch']}" in text
    assert f'name = "{plan_doc["framework"]["id"]}"' in text
    base = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(CAT.framework("torchtitan")).items()
            if k != "id"}
    fw = tmp_path / "fw.yaml"
    fw.write_text(yaml.safe_dump({"frameworks": {"my-titan": {**base, "source": "ours"}}}))
    pj.write_text(json.dumps(ok_json("plan", MODEL, "--gpus", "8", "--top", "1", "--catalog", str(fw),
                                     "--framework", "my-titan")))
    one_line_error(["export", "--to", "shardlab", "--plan", str(pj)], "framework 'my-titan'", "--catalog FILE")
    text = ok_json("export", "--to", "shardlab", "--plan", str(pj), "--catalog", str(fw))["text"]
    assert 'name = "my-titan"' in text


# ---- 3: GPUs per node from what a Slurm script or SkyPilot task says one node runs -------------------------------
SHAPES = [(8, 8), (16, 8), (8, 4)]
"""(GPUs, GPUs per node): 1 node × 8, 2 nodes × 8, 2 nodes × 4."""


def _export(tmp_path, target: str, launch: str, gpus: int, per_node: int, gpu: str = "h100-sxm"):
    path = tmp_path / ("job.sbatch" if target == "slurm" else "task.yaml")
    code, _, err = cli_main("export", "--to", target, "--launch", launch, MODEL, "--gpu", gpu, "--gpus", str(gpus),
                            "--gpus-per-node", str(per_node), "--zero", "3", "--global-batch", "64", "--out", str(path),
                            "--force")
    assert code == 0, err
    return path


def _reads_back(path, gpus: int, per_node: int, *model: str) -> None:
    """The file's reader, the job built from its fields and `estimate [MODEL] --from` all give ``gpus`` on nodes of
    ``per_node``."""
    f = read_text(path.read_text(), CAT).fields
    assert f["gpus_per_node"] == per_node and f.get("gpus", gpus) == gpus, f      # torchtitan's degrees give the GPUs
    job = job_from_fields({"model": MODEL, **f}, CAT)
    assert (job.gpus, job.gpus_per_node, job.nodes) == (gpus, per_node, gpus // per_node)
    est = ok_json("estimate", *model, "--from", str(path))
    assert (est["gpus"], est["cluster"]["gpus_per_node"], est["cluster"]["nodes"]) == (gpus, per_node, gpus // per_node)


def _drop_per_node(text: str, per_node: int) -> str:
    return text.replace(f"#SBATCH --gpus-per-node={per_node}\n", "")


SLURM_VARIANTS = {
    "as written": lambda t, n: t,
    "gres": lambda t, n: t.replace(f"--gpus-per-node={n}", f"--gres=gpu:{n}"),
    "gres with a type": lambda t, n: t.replace(f"--gpus-per-node={n}", f"--gres=gpu:h100:{n}"),
    "gpus per task": lambda t, n: t.replace(f"--gpus-per-node={n}", "--gpus-per-task=1").replace(
        "--ntasks-per-node=1", f"--ntasks-per-node={n}"),
    "only the launch line": _drop_per_node,
}


@pytest.mark.parametrize("gpus, per_node", SHAPES)
@pytest.mark.parametrize("launch", ["torchtitan", "megatron"])
def test_slurm_round_trip_reads_gpus_per_node_from_the_script(tmp_path, gpus, per_node, launch):
    path = _export(tmp_path, "slurm", launch, gpus, per_node)
    written = path.read_text()
    assert f"#SBATCH --nodes={gpus // per_node}" in written and f"#SBATCH --gpus-per-node={per_node}" in written
    for name, edit in SLURM_VARIANTS.items():
        path.write_text(edit(written, per_node))
        _reads_back(path, gpus, per_node)


@pytest.mark.parametrize("gpus, per_node", SHAPES)
def test_slurm_script_that_states_no_gpus_per_node(tmp_path, gpus, per_node):
    """No per-node line and no rank count on the launch line: the job's GPUs over its nodes, never all of them on
    one node of a multi-node job."""
    path = _export(tmp_path, "slurm", "torchtitan", gpus, per_node)
    text = _drop_per_node(path.read_text(), per_node).replace(f"--nproc-per-node {per_node} ",
                                                              '--nproc-per-node "$SLURM_GPUS_ON_NODE" ')
    path.write_text(text)
    _reads_back(path, gpus, per_node)
    # no --nodes either: shardlab's default node, no larger than the job
    path.write_text(re.sub(r"#SBATCH --nodes=\d+\n", "", text))
    f = read_text(path.read_text(), CAT).fields
    assert f["gpus_per_node"] == min(gpus, DEFAULT_GPUS_PER_NODE) and f["dp"] == gpus


def test_slurm_one_task_per_gpu_without_torchrun(tmp_path):
    """`srun python pretrain_gpt.py` under --ntasks-per-node=4 on 2 nodes: 8 ranks, 4 per node."""
    path = _export(tmp_path, "slurm", "megatron", 8, 4)
    text = _drop_per_node(path.read_text(), 4).replace("--ntasks-per-node=1", "--ntasks-per-node=4")
    text = re.sub(r"srun torchrun .*? pretrain_gpt\.py", "srun python pretrain_gpt.py", text)
    assert "torchrun" not in text
    path.write_text(text)
    _reads_back(path, 8, 4)


def test_slurm_gpu_whose_catalog_node_is_a_whole_rack(tmp_path):
    """GB200's catalog system is an NVL72 rack: a 2-node × 4 script without a per-node line is still 2 nodes of 4."""
    path = _export(tmp_path, "slurm", "megatron", 8, 4, gpu="gb200")
    path.write_text(_drop_per_node(path.read_text(), 4))
    f = read_text(path.read_text(), CAT).fields
    assert (f["gpus"], f["gpus_per_node"]) == (8, 4)
    est = ok_json("estimate", "--from", str(path))
    assert (est["cluster"]["gpus_per_node"], est["cluster"]["nodes"]) == (4, 2)


def test_slurm_per_node_counts_are_bounded_by_name(tmp_path):
    path = _export(tmp_path, "slurm", "torchtitan", 16, 8)
    for old, new, fragment in (("--gpus-per-node=8", "--gres=gpu:5000", "#SBATCH --gres=gpu:N must be a whole number"),
                               ("--gpus-per-node=8", "--gpus-per-task=0", "#SBATCH --gpus-per-task must be a whole")):
        bad = tmp_path / "bad.sbatch"
        bad.write_text(path.read_text().replace(old, new))
        one_line_error(["estimate", "--from", str(bad)], fragment, "bad.sbatch")


@pytest.mark.parametrize("gpus, per_node", SHAPES)
def test_skypilot_round_trip_reads_gpus_per_node_from_the_task(tmp_path, gpus, per_node):
    """accelerators: H100:N is per node, times num_nodes; a task without accelerators: the ranks its run line starts
    per node (`shardlab run train --nproc-per-node N`), else the job's GPUs (torchtitan's degrees) over num_nodes,
    never one node of them all."""
    acc = f"  accelerators: H100:{per_node}\n"
    for launch in ("torchtitan", "megatron", "shardlab"):
        path = _export(tmp_path, "skypilot", launch, gpus, per_node)
        written = path.read_text()
        assert acc in written and f"num_nodes: {gpus // per_node}" in written
        variants = [written, written.replace(acc, f"  accelerators: {{H100: {per_node}}}\n")]
        if launch != "megatron":        # its run line reads $SKYPILOT_NUM_GPUS_PER_NODE: the count is the task's
            variants.append(written.replace(acc, ""))
        for text in variants:
            path.write_text(text)
            # the runtime's task names its model only in comments outside `run:`, which SkyPilot's reader skips
            _reads_back(path, gpus, per_node, *((MODEL,) if launch == "shardlab" else ()))


def test_a_megatron_task_without_accelerators_reads_its_nodes_as_default_nodes(tmp_path):
    """Megatron-LM's run line takes its GPUs from $SKYPILOT_NUM_GPUS_PER_NODE: without accelerators the task says
    num_nodes and nothing per node. It reads back as that many default nodes (8 GPUs each), the data parallelism
    from them, not as one node of TP × PP GPUs beside '8 GPUs per node'."""
    path = _export(tmp_path, "skypilot", "megatron", 16, 8)
    path.write_text(path.read_text().replace("  accelerators: H100:8\n", ""))
    est = ok_json("estimate", "--from", str(path))
    lay = est["layout"]
    assert (est["cluster"]["gpus_per_node"], est["cluster"]["nodes"]) == (8, 2)
    assert lay["dp"] * lay["tp"] * lay["pp"] * lay["cp"] == 16
