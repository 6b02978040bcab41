"""Export a plan to the configuration files of the frameworks people run, and read those files back.

One module per target, each a pure pair ``render(job, spec) -> Export`` / ``read(text, catalog) -> Imported``
(no torch, no framework imports): torchtitan (job TOML), megatron (pretrain_gpt.py arguments), deepspeed (config
JSON), accelerate (FSDP config YAML), vllm (``vllm serve`` line), slurm (sbatch script), skypilot (task YAML).
The round-trip contract: ``read(render(job).text)`` gives back every job field except those ``render`` listed in
``Export.unsupported``.
"""

from __future__ import annotations

import importlib
import json
import os

import yaml

from shardlab.errors import ShardlabError
from shardlab import safeio
from shardlab.safeio import yaml_load
from shardlab.export.job import Export, Imported, LaunchJob

TARGETS = ("torchtitan", "megatron", "deepspeed", "accelerate", "vllm", "slurm", "skypilot")
LAUNCHERS = ("slurm", "skypilot")


def _module(target: str):
    if target not in TARGETS:
        raise ShardlabError(f"unknown export target '{target}'; choose one of {', '.join(TARGETS)}")
    return importlib.import_module(f"shardlab.export.{target}")


def render(job: LaunchJob, spec, target: str, inner: str | None = None) -> Export:
    """The framework file for ``job`` (``inner``: which framework a launcher target runs)."""
    mod = _module(target)
    if target in LAUNCHERS:
        return mod.render(job, spec, inner)
    if inner is not None:
        raise ShardlabError(f"--launch applies to the launcher targets ({', '.join(LAUNCHERS)}), not {target}")
    return mod.render(job, spec)


def sniff(text: str) -> str:
    """Which target's file ``text`` is."""
    s = text.lstrip()
    if "#SBATCH" in text:
        return "slurm"
    if s.startswith("{"):
        return "deepspeed"
    if "vllm serve" in text or "vllm.entrypoints" in text:
        if "run:" not in text:
            return "vllm"
    try:
        doc = yaml_load(text)
    except yaml.YAMLError as e:
        if isinstance(e, safeio.DuplicateKey):
            raise ShardlabError(f"this file, line {e.problem_mark.line + 1}: {e.problem}; fix the file") from None
        doc = None
    if isinstance(doc, dict):
        if "run" in doc and ("resources" in doc or "num_nodes" in doc):
            return "skypilot"
        if "distributed_type" in doc:
            return "accelerate"
    if "[parallelism]" in text or ("[model]" in text and "[training]" in text):
        return "torchtitan"
    if "pretrain_gpt.py" in text or "--tensor-model-parallel-size" in text or "--num-layers" in text:
        return "megatron"
    raise ShardlabError("cannot tell what this file is: shardlab reads a torchtitan TOML, a DeepSpeed JSON, an "
                        "Accelerate YAML, Megatron-LM arguments, a vllm serve line, a Slurm script or a SkyPilot YAML")


def read_text(text: str, catalog, target: str | None = None) -> Imported:
    from shardlab.limits import MAX_NESTING
    from shardlab.safeio import scan_yaml, scan_yaml_tokens

    if scan_yaml(text)[0] > MAX_NESTING:     # checked before any parser (sniff's included) recurses into it
        raise ShardlabError(f"this file nests too deeply to read (config files nest a few levels; shardlab's limit is "
                            f"{MAX_NESTING}); is it the right file?")
    target = target or sniff(text)
    if target in ("accelerate", "skypilot"):      # YAML: the exact token scan (a quote in a plain scalar misleads the quick one)
        depth, alias = scan_yaml_tokens(text)
        if depth > MAX_NESTING or alias is not None:
            raise ShardlabError(f"this {target} YAML " + (f"nests more than {MAX_NESTING} levels deep"
                                                          if depth > MAX_NESTING else f"uses an anchor or alias (line {alias})")
                                + "; write the values out")
    try:
        imported = _module(target).read(text, catalog)
    except ShardlabError:
        raise
    except (AttributeError, TypeError, ValueError, KeyError, IndexError, ZeroDivisionError, OverflowError) as e:
        # a field of the wrong type or value (text where a number or a section belongs): one line, never a traceback
        raise ShardlabError(f"this {target} config has a field of the wrong type or value ({type(e).__name__}: "
                            f"{str(e)[:120]}); fix the file") from None
    check_fields(imported.fields, f"this {target} config")
    return imported


def check_fields(fields: dict, where: str) -> None:
    """The numbers a file gave, held to the same bounds as the flags they stand for (a file is input too)."""
    from shardlab import limits as L
    from shardlab.numbers import check_number

    bounds = {"gpus": L.MAX_GPUS, "gpus_per_node": L.MAX_GPUS_PER_NODE, "seq_len": L.MAX_SEQ_LEN,
              "global_batch": L.MAX_BATCH, "micro_batch": L.MAX_BATCH, "batch": L.MAX_BATCH,
              "prompt_len": L.MAX_SEQ_LEN, "output_len": L.MAX_SEQ_LEN, "max_num_seqs": L.MAX_BATCH,
              "max_num_batched_tokens": L.MAX_SEQ_LEN}
    for key, value in fields.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        check_number(value, f"{where}: {key}", integer=isinstance(value, int), minimum=0.0,
                     allow_min=key in ("zero",) or not isinstance(value, int),
                     maximum=bounds.get(key, L.MAX_GPUS if isinstance(value, int) else L.MAX_FLOAT),
                     reason="the bound of the matching flag")


def read_file(path: str, catalog) -> Imported:
    from shardlab.safeio import check_name, read_text as safe_read

    if not os.path.lexists(check_name(path, "--from")):
        raise ShardlabError(f"--from {path}: no such file")
    return read_text(safe_read(path, "--from"), catalog)


def to_json(exp: Export, path: str | None, job: LaunchJob) -> dict:
    d = exp.to_dict()
    d["file"] = path
    d["job"] = {"model": job.model, "gpus": job.gpus, "gpu": job.gpu, "nodes": job.nodes,
                "layout": job.layout.to_dict(), "global_batch": job.global_batch, "seq_len": job.seq_len,
                "precision": job.precision}
    if path is None:
        d["text"] = exp.text
    return json.loads(json.dumps(d))
