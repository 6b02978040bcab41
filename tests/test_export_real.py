"""The frameworks' own parsers accept what `shardlab export` writes (the `export-check` extra; CI installs it).

Each framework runs in its own interpreter (``python tests/test_export_real.py CHECK FILE...``, one JSON line per
file) so their imports and global state stay out of the test process:
  torchtitan 0.2.2   ConfigManager().parse_args(["--job.config_file", F]) → JobConfig; then the model on the meta
                     device, parallelized by torchtitan's own parallelize/pipelining functions on a fake process
                     group of the exported world size; rank 0's parameter bytes vs shardlab's (shard_check.predicted)
  DeepSpeed 0.19.8   DeepSpeedConfig(F, mpu) (batch arithmetic checked against the data-parallel size)
  Accelerate 1.15.0  load_config_from_file, then `accelerate launch`'s own argument parser and environment, then
                     FullyShardedDataParallelPlugin() and ParallelismConfig() built from that environment
  SkyPilot 0.14.1    sky.Task.from_yaml_str (validates against SkyPilot's task schema)
  Megatron-Core 0.16.1 TransformerConfig built from the exported flags (Megatron-LM copies args whose names match
                     the dataclass fields: core_transformer_config_from_args)
  Slurm              bash -n; the srun line's torchrun flags through torch.distributed.run's own parser
vLLM and Megatron-LM's full argparse need a GPU stack: their lines are checked against data/flags.yaml in render().
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from shardlab.catalog import get_catalog
from shardlab.export import render
from shardlab.export.build import job_from_plan
from shardlab.memory.states import chunk_layers

from test_export import PLANS, SERVE, plan_doc

CAT = get_catalog([])
HERE = os.path.abspath(__file__)


def have(mod: str) -> bool:
    try:   # a dotted name imports its parent: a missing parent raises instead of returning None
        return importlib.util.find_spec(mod) is not None
    except (ImportError, ValueError):
        return False


def need(mod: str, pkg: str):
    return pytest.mark.skipif(not have(mod), reason=f"{pkg} not installed (pip install -e '.[export-check]', see pyproject)")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Every target's file for the four reference plans: {target: [(plan, path, job)]}."""
    d = tmp_path_factory.mktemp("exports")
    out = {}
    for name, args in PLANS.items():
        job = job_from_plan(plan_doc(args), CAT)
        for target in ("torchtitan", "megatron", "deepspeed", "accelerate", "slurm", "skypilot"):
            exp = render(job, CAT.model(job.model), target)
            p = d / f"{name}-{exp.filename}"
            p.write_text(exp.text)
            out.setdefault(target, []).append((name, str(p), job))
    for name, args in SERVE.items():
        job = job_from_plan(plan_doc([*args, "--inference", "--batch", "32"]), CAT)
        for target in ("skypilot", "slurm"):
            exp = render(job, CAT.model(job.model), target)
            p = d / f"serve-{name}-{exp.filename}"
            p.write_text(exp.text)
            out.setdefault(target, []).append((f"serve-{name}", str(p), job))
    return out


def run_check(check: str, paths: list[str], timeout: int = 600) -> list[dict]:
    r = subprocess.run([sys.executable, HERE, check, *paths], capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "DS_BUILD_OPS": "0", "PYTHONWARNINGS": "ignore"})
    assert r.returncode == 0, r.stderr[-3000:]
    return [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]


@pytest.fixture(scope="module")
def torchtitan_results(files, tmp_path_factory):
    """One torchtitan process (its import costs seconds) checks every exported file and a misspelt key."""
    bad = tmp_path_factory.mktemp("torchtitan-bad") / "bad.toml"
    bad.write_text("[parallelism]\ntensor_parallel_degreee = 2\n")
    res = run_check("torchtitan", [p for _, p, _ in files["torchtitan"]] + [f"reject:{bad}"])
    return res[:-1], res[-1]


@need("torchtitan", "torchtitan 0.2.2")
def test_torchtitan_config_manager_and_meta_parallelize(files, torchtitan_results):
    rows = files["torchtitan"]
    res, _ = torchtitan_results
    assert len(res) == len(rows)
    from shardlab.runtime.shard_check import predicted

    for (name, _, job), r in zip(rows, res):
        lay = job.layout
        assert (r["dp_shard"], r["tp"], r["pp"], r["cp"], r["ep"]) == (lay.dp, lay.tp, lay.pp, lay.cp, lay.ep), name
        assert r["global_batch"] == job.global_batch and r["seq_len"] == job.seq_len
        assert r["world"] == job.gpus and r["chunks"] == (lay.vpp if lay.pp > 1 else 1)
        # at rest FSDP2 holds the dp shard whatever the reshard policy, i.e. shardlab's ZeRO-3 shard
        pred = predicted(CAT.model(job.model), lay.with_(zero=3), 4, tp_rank=0)
        # torchtitan keeps DeepSeek-V3's router correction bias as a buffer (models/moe/moe.py register_buffer
        # "expert_bias"), shardlab counts it as a parameter like the Hugging Face checkpoint does
        buffers = sum(v["alloc_bytes"] for k, v in pred.items() if k.endswith("router.bias"))
        assert r["param_bytes"] == sum(v["alloc_bytes"] for v in pred.values()) - buffers, name


@need("torchtitan", "torchtitan 0.2.2")
def test_torchtitan_rejects_a_misspelt_key(torchtitan_results):
    _, bad = torchtitan_results
    assert bad["rejected"] and "tensor_parallel_degreee" in bad["error"], bad


@need("deepspeed", "DeepSpeed 0.19.8")
def test_deepspeed_config_class(files):
    rows = files["deepspeed"]
    bad = f"reject:{rows[0][1]}:3"  # a data-parallel size the batch arithmetic does not fit
    res = run_check("deepspeed", [f"{p}:{job.layout.dp * job.layout.cp}" for _, p, job in rows] + [bad])  # cp runs as dp
    for (name, _, job), r in zip(rows, res):
        assert r["zero_stage"] == job.layout.zero and r["train_batch_size"] == job.global_batch, name
        assert r["micro"] == job.layout.micro_batch and r["gas"] == job.microbatches // job.layout.cp
        assert r["autotp_size"] == (job.layout.tp if job.layout.tp > 1 else 0)
    assert len(res) == len(rows) + 1 and res[-1]["rejected"] and "batch" in res[-1]["error"], res[-1]


@need("accelerate", "Accelerate 1.15.0")
def test_accelerate_loader_launcher_and_plugins(files):
    rows = files["accelerate"]
    res = run_check("accelerate", [p for _, p, _ in rows])
    for (name, _, job), r in zip(rows, res):
        assert r["num_processes"] == job.gpus and r["distributed_type"] in ("FSDP", "MULTI_GPU")
        assert r["tp"] == job.layout.tp and r["dp_shard"] * r["tp"] * r["cp"] * r["dp_replicate"] == job.gpus, name
        assert r["fsdp_version"] == 2 and r["reshard_after_forward"] == (job.layout.zero == 3)


@need("sky", "SkyPilot 0.14.1")
def test_skypilot_task_schema(files):
    rows = files["skypilot"]
    res = run_check("skypilot", [p for _, p, _ in rows])
    for (name, _, job), r in zip(rows, res):
        assert r["num_nodes"] == job.nodes and r["accelerator_count"] == job.procs_per_node, name
        assert r["run_has_rendezvous" if not job.serve else "run_serves"]


@need("megatron.core", "Megatron-Core 0.16.1")
def test_megatron_core_transformer_config(files):
    rows = files["megatron"]
    res = run_check("megatron", [p for _, p, _ in rows])
    for (name, _, job), r in zip(rows, res):
        spec = CAT.model(job.model)
        assert (r["tp"], r["pp"], r["cp"], r["ep"]) == (job.layout.tp, job.layout.pp, job.layout.cp, job.layout.ep), name
        assert r["num_layers"] == spec.num_layers and r["hidden_size"] == spec.hidden_size
        assert r["dropout"] == [0.0, 0.0], name       # Megatron's defaults are 0.1; shardlab models no dropout
        assert r["vpp"] == (job.layout.vpp if job.layout.vpp > 1 else None)
        sizes = [len(c) for c in chunk_layers(spec, job.layout)]
        assert r["chunks"] in (None, sizes), name
        if len(set(sizes)) > 1 and job.layout.vpp > 1:
            assert r["chunks"] == sizes, name      # uneven virtual chunks go through --pipeline-model-parallel-layout


@need("megatron.core", "Megatron-Core 0.16.1")
def test_megatron_core_takes_deepep_and_the_all_to_all_overlap(tmp_path):
    """--moe-dispatcher deepep and --ep-comm-overlap as written pass Megatron-Core's own checks (flex dispatcher with
    the DeepEP backend; the overlap's EP > 1, virtual stages with PP, no full recomputation, bf16)."""
    out = subprocess.run([sys.executable, "-m", "shardlab", "export", "qwen3-235b-a22b", "--to", "megatron", "--gpus",
                          "256", "--gpus-per-node", "8", "--tp", "2", "--sequence-parallel", "--pp", "8", "--vpp", "4",
                          "--schedule", "interleaved", "--ep", "16", "--global-batch", "2048", "--recompute",
                          "selective", "--recompute-modules", "moe_act,layernorm", "--moe-dispatcher", "deepep",
                          "--ep-comm-overlap", "--json"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    path = tmp_path / "job.sh"
    path.write_text(json.loads(out.stdout)["text"])
    (r,) = run_check("megatron", [str(path)])
    assert r["dispatcher"] == ["flex", "deepep"] and r["ep_overlap"] is True and r["ep"] == 16 and r["vpp"] == 4


@need("megatron.core", "Megatron-Core 0.16.1")
@pytest.mark.parametrize("argv,mods", [
    (["qwen3-30b-a3b", "--gpus", "8", "--ep", "8"], "moe_act,layernorm"),
    (["deepseek-v3", "--gpus", "256", "--pp", "8", "--ep", "32"], "mlp,moe_act,mla_up_proj")])
def test_megatron_core_takes_the_recompute_modules(tmp_path, argv, mods):
    """Megatron-Core's own TransformerConfig accepts the exported --recompute-modules (it refuses moe_act without
    grouped-GEMM experts and mla_up_proj without MLA) and keeps them as written."""
    from shardlab.cli.common import module_list

    out = subprocess.run([sys.executable, "-m", "shardlab", "export", *argv, "--to", "megatron", "--gpus-per-node", "8",
                          "--recompute", "selective", "--recompute-modules", mods, "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    path = tmp_path / "job.sh"
    path.write_text(json.loads(out.stdout)["text"])
    (r,) = run_check("megatron", [str(path)])
    assert r["recompute_granularity"] == "selective" and tuple(r["recompute_modules"]) == module_list(mods)
    assert r["moe_grouped_gemm"] is True


def test_slurm_scripts_parse(files):
    rows = files["slurm"]
    res = run_check("slurm", [p for _, p, _ in rows])
    for (name, _, job), r in zip(rows, res):
        assert r["bash_n"] == 0, name
        if not job.serve:
            assert r["nproc_per_node"] == str(job.procs_per_node) and r["rdzv_backend"] == "c10d"


# ---- the checks, run as `python tests/test_export_real.py CHECK FILE...` ---------------------------------
def _torchtitan_imports():
    import types

    # torchtitan imports its MoE triton kernels at module load (models/moe/kernels.py); triton is a GPU compiler that
    # is not installed here, and nothing below runs those kernels: stand in for that one module only.
    k = types.ModuleType("torchtitan.models.moe.kernels")

    def gpu_only(*a, **kw):
        raise RuntimeError("GPU-only triton kernel")

    k.generate_permute_indices = k.fill_indices_wrapper = gpu_only
    sys.modules["torchtitan.models.moe.kernels"] = k
    import torchtitan.distributed.parallel_dims as pdm

    pdm.device_type = "cpu"  # torchtitan assumes cuda when it finds no accelerator


def check_torchtitan(path: str) -> dict:
    import math

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import ParallelDims
    from torchtitan.protocols.train_spec import get_train_spec

    c = ConfigManager().parse_args(["--job.config_file", path])
    p = c.parallelism
    world = (p.data_parallel_replicate_degree * p.data_parallel_shard_degree * p.context_parallel_degree
             * p.tensor_parallel_degree * p.pipeline_parallel_degree)
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    pd = ParallelDims(dp_shard=p.data_parallel_shard_degree, dp_replicate=p.data_parallel_replicate_degree,
                      cp=p.context_parallel_degree, tp=p.tensor_parallel_degree, pp=p.pipeline_parallel_degree,
                      ep=p.expert_parallel_degree, etp=p.expert_tensor_parallel_degree, world_size=world)
    spec = get_train_spec(c.model.name)
    args = spec.model_args[c.model.flavor]
    args.update_from_config(c)
    with torch.device("meta"):
        model = spec.model_cls(args)
    if pd.pp_enabled:
        loss_fn = spec.build_loss_fn(c, parallel_dims=pd)
        _, parts, _, _ = spec.pipelining_fn(model, pd, c, torch.device("cpu"), args, spec.parallelize_fn, loss_fn)
    else:
        parts = [spec.parallelize_fn(model, pd, c)]
    padded = {}
    for m in parts:
        for mod in m.modules():
            if isinstance(mod, FSDPModule):
                g = mod._get_fsdp_state()._fsdp_param_group
                for fp in (g.fsdp_params if g else []):
                    padded[id(fp.sharded_param)] = tuple(fp.padded_sharded_param_size)
    total = 0
    for m in parts:
        for _, prm in m.named_parameters():
            shape = padded.get(id(prm)) or tuple((prm.to_local() if isinstance(prm, DTensor) else prm).shape)
            total += math.prod(shape) * prm.element_size()
    dist.destroy_process_group()
    return {"world": world, "dp_shard": p.data_parallel_shard_degree * p.data_parallel_replicate_degree,
            "tp": p.tensor_parallel_degree, "pp": p.pipeline_parallel_degree, "cp": p.context_parallel_degree,
            "ep": p.expert_parallel_degree, "global_batch": c.training.global_batch_size, "seq_len": c.training.seq_len,
            "chunks": len(parts), "param_bytes": total}


def check_deepspeed(arg: str) -> dict:
    import deepspeed.comm as dscomm
    from deepspeed.runtime.config import DeepSpeedConfig

    path, dp = arg.rsplit(":", 1)
    # DeepSpeedConfig asks deepspeed.comm for this process's rank, then the mpu for the data-parallel size; starting
    # deepspeed.comm on a CPU would JIT-compile its shared-memory op, so this process answers as rank 0 of the job
    dscomm.get_rank = lambda group=None: 0

    class Mpu:  # DeepSpeed's model-parallel-unit interface (what Megatron passes): the data-parallel size
        def get_data_parallel_world_size(self):
            return int(dp)

    c = DeepSpeedConfig(path, mpu=Mpu())
    return {"zero_stage": c.zero_optimization_stage, "train_batch_size": c.train_batch_size,
            "micro": c.train_micro_batch_size_per_gpu, "gas": c.gradient_accumulation_steps,
            "autotp_size": c.tensor_parallel_config.autotp_size}


def check_accelerate(path: str) -> dict:
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    cfg = load_config_from_file(path)
    args = launch_command_parser().parse_args(["--config_file", path, "train.py"])
    args, _, _ = _validate_launch_command(args)
    env = prepare_multi_gpu_env(args)
    os.environ.update(env)
    fsdp = FullyShardedDataParallelPlugin() if cfg.distributed_type.value == "FSDP" else None
    pc = ParallelismConfig()
    return {"num_processes": cfg.num_processes, "distributed_type": cfg.distributed_type.value,
            "fsdp_version": fsdp.fsdp_version if fsdp else 2,
            "reshard_after_forward": bool(fsdp.reshard_after_forward) if fsdp else False,
            "dp_replicate": pc.dp_replicate_size, "dp_shard": pc.dp_shard_size, "tp": pc.tp_size, "cp": pc.cp_size}


def check_skypilot(path: str) -> dict:
    import sky

    with open(path) as f:
        task = sky.Task.from_yaml_str(f.read())
    res = next(iter(task.resources))
    (acc, count), = res.accelerators.items()
    return {"num_nodes": task.num_nodes, "accelerator": acc, "accelerator_count": int(count),
            "run_has_rendezvous": "--master-addr" in task.run, "run_serves": "vllm serve" in task.run}


def check_megatron(path: str) -> dict:
    import dataclasses

    import torch.nn.functional as F
    from megatron.core.transformer.transformer_config import TransformerConfig

    from shardlab.export.text import flags_dict, split_command

    words = split_command(open(path).read())
    fl = flags_dict(words[words.index("pretrain_gpt.py") + 1:], lists=("recompute-modules",))
    args = {k.replace("-", "_"): v for k, v in fl.items()}
    names = {f.name: f for f in dataclasses.fields(TransformerConfig)}
    def value(k, v):  # argparse's types for these flags
        if v is True:
            return True
        if isinstance(v, tuple):  # nargs='*' (--recompute-modules)
            return list(v)
        if k == "moe_layer_freq":
            return list(eval(v))  # Megatron-LM's moe_freq_type evaluates the expression the same way
        for cast in (int, float):
            try:
                return cast(v)
            except ValueError:
                pass
        return v

    kw = {}
    for k, v in args.items():  # what core_transformer_config_from_args copies: flags named like the fields
        if k in names:
            kw[k] = value(k, v)
    if "fp8-format" in fl:     # argparse's dest for --fp8-format is the config's fp8 field
        kw["fp8"] = fl["fp8-format"]
    L, pp = int(fl["num-layers"]), int(fl["pipeline-model-parallel-size"])
    per = fl.get("num-layers-per-virtual-pipeline-stage")
    vpp = L // (pp * int(per)) if per else None
    if "num-virtual-stages-per-pipeline-rank" in fl:     # Megatron's flag for unequal chunks
        vpp = int(fl["num-virtual-stages-per-pipeline-rank"])
    kw.update(num_moe_experts=int(fl["num-experts"]) if "num-experts" in fl else None,
              gated_linear_unit="swiglu" in fl, activation_func=F.silu if "swiglu" in fl else F.gelu,
              add_bias_linear="disable-bias-linear" not in fl, virtual_pipeline_model_parallel_size=vpp,
              bf16="bf16" in fl, pipeline_dtype=__import__("torch").bfloat16 if pp > 1 else None,
              recompute_num_layers=int(fl["recompute-num-layers"]) if "recompute-num-layers" in fl else None)
    if "multi-latent-attention" in fl:
        from megatron.core.transformer.transformer_config import MLATransformerConfig as TransformerConfig  # noqa: N806
        kw["qk_head_dim"] = int(fl["qk-head-dim"])
    kw = {k: v for k, v in kw.items() if k in {f.name for f in dataclasses.fields(TransformerConfig)}}
    c = TransformerConfig(**kw)
    chunks = None
    if c.pipeline_model_parallel_layout is not None:   # Megatron-Core's own parse: decoder layers per chunk, model order
        from megatron.core.transformer.enums import LayerType

        lay = c.pipeline_model_parallel_layout
        chunks = [lay.layout[r][v].count(LayerType.decoder) for v in range(lay.virtual_pipeline_model_parallel_size)
                  for r in range(lay.pipeline_model_parallel_size)]
    return {"tp": c.tensor_model_parallel_size, "pp": c.pipeline_model_parallel_size, "cp": c.context_parallel_size,
            "ep": c.expert_model_parallel_size, "vpp": c.virtual_pipeline_model_parallel_size,
            "num_layers": c.num_layers, "hidden_size": c.hidden_size, "chunks": chunks,
            "dropout": [c.attention_dropout, c.hidden_dropout], "recompute_granularity": c.recompute_granularity,
            "recompute_modules": c.recompute_modules, "moe_grouped_gemm": c.moe_grouped_gemm,
            "dispatcher": [c.moe_token_dispatcher_type, c.moe_flex_dispatcher_backend],
            "ep_overlap": c.overlap_moe_expert_parallel_comm}


def check_slurm(path: str) -> dict:
    import re

    from torch.distributed.run import get_args_parser

    from shardlab.export.text import split_command

    text = open(path).read()
    bash_n = subprocess.run(["bash", "-n", path]).returncode
    joined = re.sub(r"\\\n\s*", " ", text)          # shell line continuations
    line = next((ln for ln in joined.splitlines() if ln.startswith("srun torchrun")), None)
    out = {"bash_n": bash_n}
    if line:
        words = split_command(line.replace('"$SLURM_NNODES"', "4").replace('"$SLURM_JOB_ID"', "7")
                              .replace('"$head_node:29500"', "node0:29500"))
        words = words[2:]
        cut = words.index("-m") if "-m" in words else next(i for i, w in enumerate(words) if w.endswith(".py"))
        a = get_args_parser().parse_args(words[:cut] + ["script.py"])
        out.update(nproc_per_node=a.nproc_per_node, rdzv_backend=a.rdzv_backend, nnodes=a.nnodes)
    out["heredoc_closed"] = text.count("<<'SHARDLAB_EOF'") == len(re.findall(r"^SHARDLAB_EOF$", text, flags=re.M))
    return out


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")
    check, paths = sys.argv[1], sys.argv[2:]
    if check.startswith("torchtitan"):
        _torchtitan_imports()
    fn = globals()[f"check_{check}"]
    for p in paths:
        if p.startswith("reject:"):   # a file the framework's own parser must refuse
            try:
                fn(p.removeprefix("reject:"))
                print(json.dumps({"rejected": False}), flush=True)
            except (Exception, SystemExit) as e:
                print(json.dumps({"rejected": True, "error": f"{type(e).__name__}: {e}"[:300]}), flush=True)
            continue
        print(json.dumps(fn(p)), flush=True)
