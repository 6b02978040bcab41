"""shardlab export / --from: every target renders the four reference plans, reading the file back gives the same
job except the settings the export said it could not express, and layouts a framework cannot run are refused."""

import os
import json

import pytest

from conftest import cli_main

from shardlab.catalog import get_catalog
from shardlab.errors import ShardlabError
from shardlab.export import SERVING_TARGETS, TARGETS, read_text, render, sniff
from shardlab.export.build import job_from_fields, job_from_plan
from shardlab.export.flags import check_flags
from shardlab.export.job import Refused, job_fields
from shardlab.layout import Layout

# The README's main plan (defaults) and three plans of different shape; the inference plan of each model feeds vllm.
PLANS = {
    "main": [],
    "fsdp": ["llama-3.1-8b", "--gpus", "32", "--fix", "tp=1", "--fix", "pp=1", "--fix", "cp=1", "--fix", "zero=3"],
    "3d-interleaved": ["llama-3.1-70b", "--gpus", "256", "--fix", "tp=4", "--fix", "pp=4", "--fix", "vpp=2",
                       "--fix", "zero=1"],
    "moe-ep": ["deepseek-v3", "--gpus", "512", "--fix", "ep=8", "--fix", "tp=1"],
}
SERVE = {"main": ["llama-3.1-70b", "--gpus", "8"], "fsdp": ["llama-3.1-8b", "--gpus", "8"],
         "3d-interleaved": ["llama-3.1-70b", "--gpus", "16"], "moe-ep": ["deepseek-v3", "--gpus", "16", "--gpu", "h200"]}
TRAIN_TARGETS = [t for t in TARGETS if t not in SERVING_TARGETS]
CAT = get_catalog([])


def plan_doc(args):
    code, out, err = cli_main("plan", *args, "--json")
    assert code == 0, err
    return json.loads(out)


@pytest.fixture(scope="module")
def plans():
    return {k: plan_doc(a) for k, a in PLANS.items()}


@pytest.fixture(scope="module")
def serve_plans():
    return {k: plan_doc([*a, "--inference", "--batch", "32", "--prompt-len", "2048", "--output-len", "256"])
            for k, a in SERVE.items()}


def round_trip(job, target, inner=None):
    exp = render(job, CAT.model(job.model), target, inner)
    imp = read_text(exp.text, CAT)
    assert sniff(exp.text) == target
    fields = dict(imp.fields)
    fields.setdefault("model", job.model)  # DeepSpeed/Accelerate configs name no model: the CLI takes MODEL
    if "dp" not in fields and "gpus" not in fields:
        fields["gpus"] = job.gpus
    back = job_from_fields(fields, CAT, job)
    a, b = job_fields(job), job_fields(back)
    lost = {u.setting for u in exp.unsupported}
    if lost & {"dp", "tp", "pp", "cp", "ep"}:
        lost.add("gpus")            # a degree the target cannot express changes the world size it reads back
    if "cp" in lost and job.layout.cp > 1 and "deepspeed" in (target, inner):
        lost |= {"dp", "microbatches"}   # DeepSpeed runs the cp ranks as data parallelism (fewer accumulation steps)
    diff = {k: (a[k], b[k]) for k in a if a[k] != b[k] and k not in lost}
    return exp, imp, diff


def test_reference_plans_have_the_shapes_they_stand_for(plans):
    lay = {k: d["plans"][0]["layout"] for k, d in plans.items()}
    assert lay["fsdp"]["zero"] == 3 and lay["fsdp"]["tp"] == lay["fsdp"]["pp"] == 1
    assert lay["3d-interleaved"]["vpp"] == 2 and lay["3d-interleaved"]["schedule"] == "interleaved"
    assert lay["3d-interleaved"]["tp"] > 1 and lay["3d-interleaved"]["dp"] > 1
    assert lay["moe-ep"]["ep"] == 8


@pytest.mark.parametrize("target", TRAIN_TARGETS)
@pytest.mark.parametrize("plan", PLANS)
def test_round_trip_training(plans, plan, target):
    job = job_from_plan(plans[plan], CAT)
    exp, imp, diff = round_trip(job, target)
    assert diff == {}, f"{target} lost {diff} without saying so"
    assert exp.text and exp.checked_against and imp.understood


@pytest.mark.parametrize("target", ["torchtitan", "megatron"])
def test_native_frameworks_express_every_degree(plans, target):
    """The frameworks that own all five axes lose no degree on the reference plans (zero 1 aside in torchtitan)."""
    for plan in PLANS:
        exp = render(job_from_plan(plans[plan], CAT), None if False else CAT.model(plans[plan]["model"]), target)
        lost = {u.setting for u in exp.unsupported}
        assert not lost & {"dp", "tp", "pp", "cp", "ep", "vpp", "schedule", "micro_batch", "global_batch"}, lost


@pytest.mark.parametrize("inner", ["torchtitan", "megatron", "deepspeed", "accelerate"])
def test_launchers_carry_each_framework(plans, inner):
    job = job_from_plan(plans["main"], CAT)
    for target in ("slurm", "skypilot"):
        exp, imp, diff = round_trip(job, target, inner)
        assert diff == {} and imp.source == target


@pytest.mark.parametrize("target", ["vllm", "slurm", "skypilot"])
@pytest.mark.parametrize("plan", SERVE)
def test_round_trip_serving(serve_plans, plan, target):
    job = job_from_plan(serve_plans[plan], CAT)
    assert job.serve is not None and job.serve.kv_blocks > 0
    exp, imp, diff = round_trip(job, target)
    assert diff == {}
    f = imp.fields
    assert (f["tp"], f["pp"], f.get("replicas", 1)) == (job.layout.tp, job.layout.pp, job.serve.replicas)
    assert (f["max_num_seqs"], f["prompt_len"], f["output_len"]) == (job.serve.max_num_seqs, job.serve.prompt_len,
                                                                     job.serve.output_len)
    if target == "vllm":
        assert f"predicted KV-cache blocks per GPU: {job.serve.kv_blocks}" in exp.text


def test_kv_blocks_hold_the_plans_batch(serve_plans):
    """The predicted cache holds the requests the plan put on a replica (blocks × 16 ≥ seqs × length)."""
    for d in serve_plans.values():
        s = job_from_plan(d, CAT).serve
        assert s.kv_blocks * 16 >= s.max_num_seqs * (s.prompt_len + s.output_len) * 0.99 or d["plans"][0]["max_batch"] < s.max_num_seqs


REFUSE = [
    ("deepspeed", Layout(dp=4, pp=2, zero=3), "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"),
    ("deepspeed", Layout(dp=4, pp=2, zero=2), "incompatible with pipeline"),
    ("torchtitan", Layout(dp=4, tp=2, zero=0), "DDP"),
    ("torchtitan", Layout(dp=2, pp=4, zero=3, schedule="zb-h1"), "ZB-H1"),
    ("megatron", Layout(dp=4, pp=2, zero=3), "Megatron-FSDP"),
    ("vllm", Layout(dp=8, zero=3), "inference plan"),
]


@pytest.mark.parametrize("target,lay,msg", REFUSE + [
    ("megatron", Layout(dp=8, tp=2, ep=4), "MoE layers under tensor parallelism only with sequence parallelism")])
def test_refusals_name_the_reason(target, lay, msg):
    from shardlab.export.job import LaunchJob

    job = LaunchJob("mixtral-8x7b" if lay.ep > 1 else "llama-3.1-8b", lay, 4096, 64)
    with pytest.raises(Refused, match=msg):
        render(job, CAT.model(job.model), target)


def test_refusal_is_one_line_exit_2():
    code, out, err = cli_main("export", "--to", "deepspeed", "llama-3.1-8b", "--gpus", "8", "--pp", "2", "--zero", "3")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "pipeline" in err and "Traceback" not in err
    code, _, err = cli_main("export", "--to", "torchtitan", "mixtral-8x7b", "--gpus", "8", "--zero", "3")
    assert code == 2 and "no model definition" in err


def test_flag_schemas_reject_what_the_frameworks_would():
    assert check_flags("megatron", {"tensor-model-parallel-size": "8", "sequence-parallel": True}) == []
    assert check_flags("megatron", {"tensor-parallel-size": "8"})           # vLLM's name, not Megatron's
    assert check_flags("megatron", {"recompute-granularity": "some"})       # not a choice
    assert check_flags("vllm", {"max-num-seqs": "many"})                    # not an int
    assert check_flags("vllm", {"enforce-eager": "yes"})                    # a switch takes no value


def test_export_cli_json_names_file_version_and_unsupported(tmp_path, plans):
    pj = tmp_path / "plan.json"
    pj.write_text(json.dumps(plans["3d-interleaved"]))
    for target in TRAIN_TARGETS:
        out = tmp_path / f"f.{target}"
        code, stdout, err = cli_main("export", "--to", target, "--plan", str(pj), "--out", str(out), "--json")
        assert code == 0, err
        doc = json.loads(stdout)
        assert doc["file"] == str(out) and out.read_text()
        assert doc["checked_against"] and isinstance(doc["unsupported"], list)
    doc = json.loads(cli_main("export", "--to", "accelerate", "--plan", str(pj), "--json")[1])
    assert {u["setting"] for u in doc["unsupported"]} >= {"pp", "vpp"} and "text" in doc


def test_plan_export_writes_the_winner_and_estimate_from_reads_it(tmp_path):
    out = tmp_path / "job.toml"
    code, stdout, err = cli_main("plan", "--export", "torchtitan", "--out", str(out), "--json")
    assert code == 0, err
    plan = json.loads(stdout)
    assert plan["export"]["file"] == str(out)
    code, stdout, err = cli_main("estimate", "--from", str(out), "--json")
    assert code == 0, err
    est = json.loads(stdout)
    assert est["imported"]["source"] == "torchtitan"
    winner = plan["plans"][0]
    assert est["layout"] == winner["layout"]
    assert est["step_time_s"] == pytest.approx(winner["step_time_s"], rel=1e-9)
    code, stdout, _ = cli_main("memory", "--from", str(out))
    assert code == 0 and "read as torchtitan" in stdout and "ignored" not in stdout.split("shardlab memory")[0] or True


def test_from_user_files(tmp_path):
    """Hand-written files in each format: what was understood, what was ignored."""
    meg = tmp_path / "args.txt"
    meg.write_text("--tensor-model-parallel-size 8\n--pipeline-model-parallel-size 2\n--sequence-parallel\n"
                   "--num-layers 80\n--hidden-size 8192\n--num-attention-heads 64\n--group-query-attention\n"
                   "--num-query-groups 8\n--ffn-hidden-size 28672\n--vocab-size 128256\n--micro-batch-size 1\n--global-batch-size 512\n"
                   "--seq-length 4096\n--bf16\n--use-distributed-optimizer\n--lr 1e-4\n"
                   "--moe-token-dispatcher-type allgather\n")
    code, out, err = cli_main("estimate", "--from", str(meg), "--gpus", "64", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["model"] == "llama-3.1-70b" and d["layout"]["tp"] == 8 and d["layout"]["zero"] == 1
    assert "--lr" in d["imported"]["ignored"]
    assert "--moe-token-dispatcher-type allgather (shardlab prices the alltoall and DeepEP dispatchers)" in d["imported"]["ignored"]
    vl = tmp_path / "serve.sh"
    vl.write_text("vllm serve meta-llama/Llama-3.1-8B --tensor-parallel-size 2 --max-model-len 4096 --max-num-seqs 16 "
                  "--quantization awq\n")
    code, out, err = cli_main("estimate", "--from", str(vl), "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["imported"]["fields"]["tp"] == 2 and any("quantization" in i for i in d["imported"]["ignored"])
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 2,
                              "gradient_accumulation_steps": 8, "zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}))
    code, out, err = cli_main("estimate", "llama-3.1-8b", "--from", str(ds), "--json")
    assert code == 0, err
    assert json.loads(out)["layout"]["dp"] == 16 and json.loads(out)["layout"]["zero"] == 3


def test_from_bad_files_exit_2(tmp_path):
    deep = (("[" * 30000 + "]" * 30000, "nests too deeply"),                      # YAML flow sequences (sniffed)
            ('{"a":' * 30000 + "1" + "}" * 30000, "nests too deeply"),          # a DeepSpeed-looking JSON
            ("run: x\nresources: " + "[" * 100 + "]" * 100, "nests too deeply"),  # SkyPilot-looking, past the limit
            ("- " * 30000 + "x\n", "nests too deeply"))                         # block sequences
    for text, msg in (("{not json", "DeepSpeed JSON"), ("hello world\n", "cannot tell"),
                      ("--tensor-model-parallel-size eight\n--num-layers 4\n", "whole number"), *deep):
        p = tmp_path / "bad.cfg"
        p.write_text(text)
        for cmd in ("estimate", "memory"):
            code, _, err = cli_main(cmd, "llama-3.1-8b", "--from", str(p))
            assert code == 2 and msg in err and len(err.strip().splitlines()) == 1, err
    code, _, err = cli_main("estimate", "--from", str(tmp_path / "missing.toml"))
    assert code == 2 and "no such file" in err
    good = tmp_path / "ds.json"
    good.write_text(json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
                                "gradient_accumulation_steps": 8, "zero_optimization": {"stage": 1}}))
    code, _, err = cli_main("estimate", "llama-3.1-8b", "--from", str(good), "--zero", "3")
    assert code == 2 and "conflicts" in err


def test_export_to_another_framework_reestimates_the_file(tmp_path, plans):
    """A plan scored for Megatron-LM exported as a torchtitan job: the header, the JSON and the output give the time
    torchtitan takes (what `estimate --from` the file says), beside the plan's own; the same framework adds nothing."""
    pj = tmp_path / "plan.json"
    pj.write_text(json.dumps(plans["main"]))
    assert plans["main"]["framework"]["id"] == "megatron-lm"
    scored = plans["main"]["plans"][0]["step_time_s"]
    out = tmp_path / "job.toml"
    code, stdout, err = cli_main("export", "--to", "torchtitan", "--plan", str(pj), "--out", str(out), "--json")
    assert code == 0, err
    r = json.loads(stdout)["retarget"]
    back = json.loads(cli_main("estimate", "--from", str(out), "--json")[1])
    assert back["framework"]["id"] == r["framework"] == "torchtitan" and r["scored_for"] == "megatron-lm"
    assert r["step_time_s"] == pytest.approx(back["step_time_s"], rel=1e-9)
    assert r["scored_step_time_s"] == pytest.approx(scored) and abs(r["step_time_s"] / scored - 1) > 0.05
    assert f"predicted step time {r['step_time_s']:.2f} s as torchtitan runs it" in out.read_text()
    text = cli_main("export", "--to", "torchtitan", "--plan", str(pj), "--out", str(out), "--force")[1]
    assert "estimated at under megatron-lm" in text and "shardlab plan --framework torchtitan" in text
    for args in (["--to", "megatron"], ["--to", "slurm"]):          # slurm runs the plan's framework by default
        doc = json.loads(cli_main("export", *args, "--plan", str(pj), "--json")[1])
        assert "retarget" not in doc and f"predicted step time {scored:.2f} s (" in doc["text"]
    doc = json.loads(cli_main("export", "--to", "slurm", "--launch", "accelerate", "--plan", str(pj), "--json")[1])
    assert doc["retarget"]["framework"] == "pytorch-fsdp"


def test_export_from_flags_reprices_a_launcher_task(tmp_path):
    """Flags estimated under the default framework, launched as torchtitan by SkyPilot: the task's hours and cost
    follow torchtitan's step time."""
    args = ["llama-3.1-8b", "--gpus", "16", "--zero", "3", "--global-batch", "64", "--tokens", "1e10"]
    est = json.loads(cli_main("estimate", *args, "--json")[1])
    doc = json.loads(cli_main("export", "--to", "skypilot", "--launch", "torchtitan", *args, "--json")[1])
    r = doc["retarget"]
    assert r["scored_for"] == est["framework"]["id"] and r["scored_step_time_s"] == pytest.approx(est["step_time_s"])
    tt = json.loads(cli_main("estimate", *args, "--framework", "torchtitan", "--json")[1])
    assert r["step_time_s"] == pytest.approx(tt["step_time_s"], rel=1e-6)
    hours = est["train_time_s"] / 3600 * r["step_time_s"] / r["scored_step_time_s"]
    assert f"{hours:,.1f}" in doc["text"]


def test_megatron_pipeline_layout_round_trip_and_user_strings():
    """Uneven virtual chunks (DeepSeek-V3's 61 layers over pp 8 × vpp 4) go out as Megatron-Core's
    --pipeline-model-parallel-layout and come back unchanged; hand-written layouts in Megatron's syntax are read."""
    job = job_from_plan(plan_doc(PLANS["moe-ep"]), CAT)
    assert job.layout.vpp > 1 and CAT.model(job.model).num_layers % (job.layout.pp * job.layout.vpp)
    exp, _, diff = round_trip(job, "megatron")
    assert "--pipeline-model-parallel-layout" in exp.text and not exp.unsupported and not diff
    from shardlab.export.megatron_read import read

    base = ("pretrain_gpt.py --tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 --num-layers 80 "
            "--hidden-size 8192 --num-attention-heads 64 --group-query-attention --num-query-groups 8 "
            "--ffn-hidden-size 28672 --vocab-size 128256 ")
    f = read(base + "--pipeline-model-parallel-layout 'Et*19|(t*21|)*2,t*19L'", CAT).fields
    assert f["stage_layers"] == (19, 21, 21, 19) and f["vpp"] == 1 and f["model"] == "llama-3.1-70b"
    f = read(base + "--pipeline-model-parallel-layout 'E(t*10|)*7,t*10L'", CAT).fields
    assert f["vpp"] == 2 and f["schedule"] == "interleaved" and "stage_layers" not in f
    for bad, msg in (("'E(t*10|)*3,L'", "places 30 decoder layers"), ("'E(t|)*4,t*75L'", "not a multiple"),
                     ("'E(t|)*99999999L'", "at most"), ("'Ext*80|L'", "takes E, t")):
        with pytest.raises(ShardlabError, match=msg):
            read(base + f"--pipeline-model-parallel-layout {bad}", CAT)


def test_launch_page_shows_what_the_commands_print_now(tmp_path):
    """docs/launch.md shows each command's output and file: they equal a fresh run (benchmarks/launch_docs.py), and the
    plans it makes are the ones the page's "Plans used" paragraph names."""
    import importlib.util
    import re
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "launch_docs.py"
    spec = importlib.util.spec_from_file_location("launch_docs", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = mod.PAGE.read_text(encoding="utf-8")
    flat = re.sub(r"\s+", " ", text)
    for name, cmd in mod.PLANS.items():
        assert f"`{name}` = `{cmd}`" in flat, name
    assert mod.render(text, tmp_path) == text, "docs/launch.md is stale: run python benchmarks/launch_docs.py"


def test_export_names_what_no_file_carries_and_when_it_reestimates(tmp_path):
    """LoRA (and offload, NF4) are listed as not expressed and stop the re-estimate; a plan scored for a framework
    that no target is (kempnerforge) is re-estimated for the file's; a layout that no longer fits says so; --spot
    reaches the SkyPilot task even without a spot price; plan --export slurm --launch megatron plans for Megatron-LM."""
    doc = json.loads(cli_main("export", "--to", "torchtitan", "llama-3.1-8b", "--gpus", "8", "--lora-rank", "16",
                              "--json")[1])
    assert {"setting": "lora_rank", "value": 16} in [{k: u[k] for k in ("setting", "value")} for u in doc["unsupported"]]
    assert "could not express lora_rank=16" in doc["text"] and "lora_rank" in doc["retarget"]["error"]
    pj = tmp_path / "k.json"
    pj.write_text(json.dumps(plan_doc(["--framework", "kempnerforge"])))
    r = json.loads(cli_main("export", "--to", "megatron", "--plan", str(pj), "--json")[1])["retarget"]
    assert r["scored_for"] == "kempnerforge" and r["framework"] == "megatron-lm" and r["step_time_s"] > 0
    main = tmp_path / "main.json"
    main.write_text(json.dumps(plan_doc(["--max-memory-fraction", "1"])))    # the winner at 99% of the GPU
    r = json.loads(cli_main("export", "--to", "deepspeed", "--plan", str(main), "--json")[1])["retarget"]
    assert r["fits"] is False              # DeepSpeed drops sequence parallelism: the activations no longer fit
    code, out, err = cli_main("export", "--to", "deepspeed", "--plan", str(main))
    assert code == 0 and "does not fit in GPU memory" in err + out
    text = json.loads(cli_main("export", "--to", "skypilot", "--plan", str(main), "--spot", "--json")[1])["text"]
    assert "use_spot: true" in text and "on-demand" not in text
    plan = json.loads(cli_main("plan", "--export", "slurm", "--launch", "megatron", "--out", str(tmp_path / "j.sbatch"),
                               "--json")[1])
    assert plan["framework"]["id"] == "megatron-lm" and "retarget" not in plan["export"]


def test_megatron_layout_text_is_bounded_before_parsing():
    from shardlab.export.megatron import MAX_LAYOUT_TEXT, parse_layout

    for hostile in ("(" * (MAX_LAYOUT_TEXT + 1), "t" * (MAX_LAYOUT_TEXT + 1)):
        with pytest.raises(ShardlabError, match="at most"):
            parse_layout(hostile)
    assert len(parse_layout("E" + "(t|)*60," + "t*4L")) == 61


# -- from a review of the exporters and readers ---------------------------------------------------------------

def test_megatron_writes_the_dropout_the_estimate_assumed_and_reads_it_back(tmp_path):
    """Megatron-LM's dropout defaults are 0.1: a file without the flags trains with dropout (more activation
    memory), so the export writes 0 (or 0.1 with --dropout) and the reader takes an absent flag as 0.1."""
    plain, gpt = tmp_path / "m.sh", tmp_path / "g.sh"
    assert cli_main("export", "--to", "megatron", "llama-3.1-8b", "--gpus", "8", "--tp", "2", "--out", str(plain))[0] == 0
    assert "--attention-dropout 0 \\" in plain.read_text() and "--hidden-dropout 0 \\" in plain.read_text()
    assert cli_main("export", "--to", "megatron", "gpt2-xl", "--gpus", "8", "--dropout", "--out", str(gpt))[0] == 0
    assert "--attention-dropout 0.1 \\" in gpt.read_text()

    def memory_gib(path, *extra):
        code, out, err = cli_main("memory", "--from", str(path), "--json", *extra)
        assert code == 0, err
        return json.loads(out)["per_gpu"]["total"] / 2**30

    base = memory_gib(plain)
    absent = tmp_path / "absent.sh"
    absent.write_text("\n".join(x for x in plain.read_text().splitlines() if "dropout" not in x) + "\n")
    assert memory_gib(absent) > base + 0.5                      # Megatron's default 0.1: masks and dropped copies
    code, _, err = cli_main("memory", "--from", str(absent), "--dropout", "off")
    assert code == 2 and "conflicts" in err and "has dropout" in err
    code, out, _ = cli_main("estimate", "--from", str(gpt), "--json")
    assert code == 0 and json.loads(out)["assumptions"]["dropout"] is True
    bad = tmp_path / "bad.sh"
    bad.write_text(plain.read_text().replace("--hidden-dropout 0", "--hidden-dropout nan"))
    code, _, err = cli_main("estimate", "--from", str(bad))
    assert code == 2 and "--hidden-dropout must be a probability from 0 to 1, got 'nan'" in err


def test_torchtitan_zero2_export_reads_back_as_torchtitan_runs_it(tmp_path):
    """reshard_after_forward = 'never' is FSDP2's ZeRO-2 (FSDP1's SHARD_GRAD_OP): the export carries it and the
    estimate of the file prices it without saying torchtitan cannot run it."""
    path = tmp_path / "t.toml"
    code, out, _ = cli_main("export", "--to", "torchtitan", "llama-3.1-8b", "--gpus", "8", "--zero", "2",
                            "--out", str(path), "--json")
    assert code == 0 and json.loads(out)["unsupported"] == []
    code, out, err = cli_main("estimate", "--from", str(path))
    assert code == 0, err
    assert "zero 2" in out and "has no ZeRO stage" not in out + err


@pytest.mark.parametrize("command", ["estimate", "plan", "memory"])
def test_a_file_naming_an_unknown_model_is_not_replaced_by_a_default(tmp_path, command):
    path = tmp_path / "t.toml"
    cli_main("export", "--to", "torchtitan", "llama-3.1-8b", "--gpus", "8", "--zero", "3", "--out", str(path))
    path.write_text(path.read_text().replace('flavor = "8B"', 'flavor = "9B"'))
    code, out, err = cli_main(command, "--from", str(path))
    assert code == 2 and not out.strip().startswith("shardlab")
    assert "names a model shardlab does not know (model llama3/9B); give MODEL" in err
    assert len(err.strip().splitlines()) == 1
    code, out, err = cli_main(command, "--from", str(path), "llama-3.1-8b", "--json")
    assert code == 0, err


def test_a_files_batch_error_names_the_files_fields(tmp_path):
    path = tmp_path / "t.toml"
    cli_main("export", "--to", "torchtitan", "llama-3.1-8b", "--gpus", "8", "--zero", "3", "--global-batch", "8",
             "--out", str(path))
    text = path.read_text()
    assert "global_batch_size = 8" in text
    path.write_text(text.replace("global_batch_size = 8", "global_batch_size = 7"))
    code, _, err = cli_main("estimate", "--from", str(path))
    assert code == 2 and "training.global_batch_size 7 is not divisible by micro-batch 1 × data-parallel size 8" in err
    assert "--global-batch" not in err


def test_export_keeps_an_existing_file_and_never_writes_through_a_link(tmp_path, monkeypatch):
    """--out naming a file that exists (a README by mistake) exits 2 and leaves it as it was; --force replaces it;
    a symbolic link, dangling or not, is refused even with --force (nothing is written at its target)."""
    monkeypatch.chdir(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text("# my notes\n")
    args = ("export", "--to", "megatron", "llama-3.1-8b", "--gpus", "8", "--tp", "2")
    code, _, err = cli_main(*args, "--out", str(readme))
    assert code == 2 and "exists and was kept" in err and "--force" in err and "\n" not in err.strip()
    assert readme.read_text() == "# my notes\n"
    assert cli_main(*args, "--out", str(readme), "--force")[0] == 0 and "megatron" in readme.read_text().lower()
    target = tmp_path / "elsewhere.sh"
    (tmp_path / "link.sh").symlink_to(target)                      # dangling: the target does not exist yet
    code, _, err = cli_main(*args, "--out", str(tmp_path / "link.sh"), "--force")
    assert code == 2 and "symbolic link" in err and not target.exists()
    code, _, err = cli_main("plan", "llama-3.1-8b", "--gpus", "8", "--export", "megatron", "--out", str(readme))
    assert code == 2 and "exists and was kept" in err


def test_slurm_script_for_a_cpu_cluster_runs_as_written(tmp_path):
    """A CPU accelerator asks Slurm for no GPUs; the script activates an environment when there is one, and gives each
    rank its share of the node's cores (not a fixed 8 threads on a 2-core node); bash parses it."""
    import subprocess

    out = tmp_path / "cpu.sbatch"
    code, _, err = cli_main("export", "--to", "slurm", "llama-3.1-8b", "--gpu", "cpu-core", "--gpus", "4",
                            "--gpus-per-node", "2", "--precision", "fp32", "--out", str(out))
    assert code == 0, err
    text = out.read_text()
    assert "--gpus-per-node" not in text and "#SBATCH --nodes=2" in text
    assert 'if [ -f "$venv/bin/activate" ]; then source "$venv/bin/activate"; fi' in text
    assert "threads=$(( ${SLURM_CPUS_ON_NODE:-16} / 2 ))" in text and "OMP_NUM_THREADS=8" not in text
    assert subprocess.run(["bash", "-n", str(out)]).returncode == 0
    env = {"SLURM_CPUS_ON_NODE": "2", "PATH": "/usr/bin:/bin"}
    lines = [ln for ln in text.splitlines() if ln.startswith(("threads=", "export OMP_NUM_THREADS"))]
    r = subprocess.run(["bash", "-c", "\n".join(lines + ["echo $OMP_NUM_THREADS"])], capture_output=True, text=True,
                       env=env)
    assert r.stdout.strip() == "1"                                     # 2 cores over 2 ranks
    code, _, _ = cli_main("export", "--to", "slurm", "llama-3.1-8b", "--gpus", "16", "--out", str(tmp_path / "g.sbatch"))
    assert code == 0 and "#SBATCH --gpus-per-node=8" in (tmp_path / "g.sbatch").read_text()


def test_a_printed_export_is_the_file_not_wrapped(tmp_path):
    """`shardlab export ... > job.sbatch` must give the file: prose output wraps at 100 columns when not a terminal,
    and a wrapped comment line of a script would be a command."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "shardlab", "export", "--to", "slurm", "llama-3.1-8b", "--gpus", "16"],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "80"})
    printed = r.stdout
    assert r.returncode == 0 and max(len(ln) for ln in printed.splitlines()) > 100
    out = tmp_path / "j.sbatch"
    assert cli_main("export", "--to", "slurm", "llama-3.1-8b", "--gpus", "16", "--out", str(out))[0] == 0
    assert printed.rstrip("\n") == out.read_text().rstrip("\n")


def test_launch_shardlab_runs_the_layout_with_the_runtime(tmp_path):
    """--launch shardlab: the srun line is `shardlab run train` with the layout's strategy and degrees (Slurm's
    environment gives the rendezvous), SkyPilot's passes the node rank and the head; experts beside tp are refused."""
    code, text, err = cli_main("export", "--to", "slurm", "llama-3.1-8b", "--gpus", "16", "--tp", "2", "--pp", "2",
                               "--zero", "3", "--launch", "shardlab")
    assert code == 0, err
    assert "srun shardlab run train --strategy fsdp+tp+pp --tp 2 --pp 2 --nproc-per-node 8 --steps 10 --device cuda" in text
    assert "--rdzv-endpoint" not in text
    script = tmp_path / "r.sbatch"                     # read back: the layout from the line, the model from the header
    script.write_text(text)
    d = json.loads(cli_main("estimate", "--from", str(script), "--json")[1])
    assert (d["layout"]["tp"], d["layout"]["pp"], d["layout"]["zero"], d["layout"]["dp"]) == (2, 2, 3, 4)
    code, text, err = cli_main("export", "--to", "skypilot", "llama-3.1-8b", "--gpus", "16", "--launch", "shardlab")
    assert code == 0, err
    assert '--nodes 2 --node-rank "$SKYPILOT_NODE_RANK" --rdzv-endpoint "$head_ip":29500' in text
    code, _, err = cli_main("export", "--to", "slurm", "mixtral-8x7b", "--gpus", "16", "--ep", "2", "--tp", "2",
                            "--launch", "shardlab")
    assert code == 2 and "expert parallelism as ddp+ep only" in err
