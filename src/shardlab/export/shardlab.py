"""shardlab's own job file: one TOML holding a job's model, cluster, layout, workload and framework (or serving
engine settings), written by ``plan --save FILE`` (or ``--export shardlab``) and read by ``estimate``, ``memory``,
``plan`` and ``export`` as their first argument (or ``--from FILE``); ``--set section.key=value`` overrides a field.

Every field of the job is written, so the file reproduces what it was written from: the winner's step time comes
back from ``shardlab estimate job.toml``. Sections and keys (docs/job-file.md):
  [shardlab]  format = "job", version = 1
  [model]     name
  [cluster]   gpu, gpus, gpus_per_node, inter_node_gbit (where --inter-node-gbit set it)
  [layout]    dp tp pp cp ep zero vpp micro_batch recompute recompute_fraction wrap dp_replicate sequence_parallel
              schedule stage_layers recompute_modules
  [workload]  seq_len global_batch precision optimizer dropout grad_reduce_bytes tp_comm_overlap fp8_params
              ep_comm_overlap (these three where true) moe_dispatcher expert_imbalance flash_attention compile
              dp_overlap attention_kernel fused_loss (where not the default) lora_rank quantize_base offload
              offload_device lora_targets (the recipe, where the plan used one)
  [framework] name (a training framework or the serving engine)
  [serve]     max_num_seqs prompt_len output_len replicas gpu_memory_utilization kv_cache_dtype (serving jobs); weights
              (left out where it is the checkpoint's own type) group_size activations (where the plan chose them);
              ep dp_attention (MoE layouts), disaggregated = "P:D" prefill_tp prefill_pp prefill_gpu (two pools), where set;
              arrival_rate concurrency ttft_slo tpot_slo slo_percentile (the plan's load, over all replicas, and targets);
              target_rate (a --target-rate plan's question: plan FILE asks it again)
"""

from __future__ import annotations

import tomllib

from shardlab.errors import ShardlabError
from shardlab.export.job import Export, Imported, LaunchJob
from shardlab.export.text import toml_dump
from shardlab.layout import LAYOUT_FIELDS

CHECKED = "Python's tomllib (shardlab's own reader, export/shardlab.py)"
VERSION = 1
LAYOUT_KEYS = LAYOUT_FIELDS
"""[layout] holds every field of ``layout.Layout``."""
WORKLOAD_KEYS = ("seq_len", "global_batch", "precision", "optimizer", "dropout", "grad_reduce_bytes", "tp_comm_overlap",
                 "fp8_params", "moe_dispatcher", "ep_comm_overlap", "expert_imbalance", "flash_attention", "compile",
                 "dp_overlap", "attention_kernel", "fused_loss", "lora_rank", "quantize_base", "offload", "offload_device",
                 "lora_targets")
LOAD_KEYS = ("arrival_rate", "concurrency", "ttft_slo", "tpot_slo", "slo_percentile", "target_rate")
"""[serve] keys of the plan's load and targets (``export.job.ServeLoad``): what ``estimate FILE`` prices the layout
under where no load or target is given beside the file."""
SERVE_KEYS = ("max_num_seqs", "prompt_len", "output_len", "replicas", "gpu_memory_utilization", "kv_cache_dtype", "weights",
              "group_size", "activations", "ep", "dp_attention", "disaggregated", "prefill_tp", "prefill_gpu", "prefill_pp",
              *LOAD_KEYS)
SERVE_DEFAULT = {"ep": 1, "dp_attention": 1, "disaggregated": None, "prefill_tp": None, "prefill_gpu": None,
                 "prefill_pp": None, "group_size": None, "activations": None, **{k: None for k in LOAD_KEYS}}
"""Serving keys written only where they differ from these (expert parallelism, disaggregated pools, a group size or
activations the plan chose). ``weights`` is left out where it is the checkpoint's own type (``Serve.weights_from_checkpoint``),
and so is a group size then: read back, the job prices the checkpoint as it ships."""
SECTIONS = {"shardlab": ("format", "version"), "model": ("name",), "cluster": ("gpu", "gpus", "gpus_per_node", "inter_node_gbit"),
            "layout": LAYOUT_KEYS, "workload": WORKLOAD_KEYS, "framework": ("name",), "serve": SERVE_KEYS,
            "estimate": ()}
"""The keys each section may hold ([estimate] carries the writer's figures, for reading, not read back)."""


def is_job_text(text: str) -> bool:
    """A shardlab job file opens a [shardlab] table saying format = "job"."""
    return "[shardlab]" in text and "format" in text


def render(job: LaunchJob, spec=None) -> Export:
    lay = job.layout.to_dict()
    doc: dict = {"shardlab": {"format": "job", "version": VERSION}, "model": {"name": job.model},
                 "cluster": {"gpu": job.gpu, "gpus": job.gpus, "gpus_per_node": job.gpus_per_node,
                             **({"inter_node_gbit": job.inter_node_gbit} if job.inter_node_gbit else {})},
                 "layout": {k: (list(lay[k]) if k in ("stage_layers", "recompute_modules") else lay[k]) for k in LAYOUT_KEYS
                            if lay.get(k) is not None and not (k == "etp" and not lay[k])},   # etp 0: as tp, unwritten
                 "workload": {"seq_len": job.seq_len, "global_batch": job.global_batch, "precision": job.precision,
                              "optimizer": job.optimizer, "dropout": job.dropout}}
    if job.grad_reduce_bytes is not None:
        doc["workload"]["grad_reduce_bytes"] = job.grad_reduce_bytes
    for key in ("tp_comm_overlap", "fp8_params", "ep_comm_overlap"):
        if getattr(job, key):
            doc["workload"][key] = True
    if job.moe_dispatcher != "alltoall":
        doc["workload"]["moe_dispatcher"] = job.moe_dispatcher
    if job.expert_imbalance != 1.0:
        doc["workload"]["expert_imbalance"] = job.expert_imbalance
    doc["workload"].update(dict(job.assumptions))          # the modelling switches away from their defaults
    doc["workload"].update(job.notes.get("recipe") or {})  # LoRA/QLoRA and offload, where the plan used them
    if job.framework:
        doc["framework"] = {"name": job.framework}
    if job.serve is not None:
        sv = job.serve
        vals = {**{k: getattr(sv, k) for k in SERVE_KEYS if hasattr(sv, k)},
                "disaggregated": sv.pools.label if sv.pools else None,
                "prefill_tp": sv.pools.prefill_tp if sv.pools else None,
                "prefill_gpu": sv.pools.prefill_gpu if sv.pools else None,
                "prefill_pp": sv.pools.prefill_pp if sv.pools and sv.pools.prefill_pp > 1 else None,
                **dict(zip(LOAD_KEYS, (sv.load.arrival_rate, sv.load.concurrency, sv.load.ttft_slo_s, sv.load.tpot_slo_s,
                                       sv.load.slo_percentile, sv.load.target_rate) if sv.load else (None,) * len(LOAD_KEYS)))}
        if sv.weights_from_checkpoint:
            vals.update(weights=None, group_size=None)
        doc["serve"] = {k: v for k, v in vals.items() if v is not None and (k not in SERVE_DEFAULT or v != SERVE_DEFAULT[k])}
        del doc["workload"]
    est = {k: v for k, v in job.notes.items() if k in ("step_time_s", "usd_per_hour") and isinstance(v, (int, float))}
    if est:
        doc["estimate"] = est
    head = ["shardlab job file: `shardlab estimate FILE`, `shardlab memory FILE`, `shardlab plan FILE`,",
            "`shardlab export FILE --to TARGET`; override a field with --set section.key=value (docs/job-file.md)"]
    name = f"{job.model.replace('/', '_')}.job.toml"
    return Export("shardlab", "shardlab job TOML", name, toml_dump(doc, head), CHECKED,
                  launch=f"shardlab estimate {name}")


def _check_keys(doc: dict) -> None:
    for sec, body in doc.items():
        if sec not in SECTIONS:
            raise ShardlabError(f"unknown section [{sec}]; a job file has {', '.join('[' + s + ']' for s in SECTIONS)}")
        if not isinstance(body, dict):
            raise ShardlabError(f"[{sec}] must be a table of keys")
        extra = [k for k in body if k not in SECTIONS[sec] and sec != "estimate"]
        if extra:
            raise ShardlabError(f"[{sec}] has no key '{extra[0]}'; it takes {', '.join(SECTIONS[sec])}")


TYPES = {"name": str, "gpu": str, "precision": str, "optimizer": str, "recompute": str, "schedule": str,
         "kv_cache_dtype": str, "weights": str, "activations": str, "disaggregated": str, "flash_attention": bool,
         "compile": bool, "dp_overlap": bool, "attention_kernel": str, "fused_loss": bool, "prefill_gpu": str, "sequence_parallel": bool, "dropout": bool,
         "tp_comm_overlap": bool, "fp8_params": bool, "ep_comm_overlap": bool, "moe_dispatcher": str,
         "expert_imbalance": float, "inter_node_gbit": float, "arrival_rate": float, "ttft_slo": float,
         "tpot_slo": float, "slo_percentile": str, "target_rate": float, "quantize_base": str, "offload": str, "offload_device": str, "lora_targets": tuple,
         "recompute_fraction": float, "gpu_memory_utilization": float, "stage_layers": list, "recompute_modules": tuple}
"""Keys whose values are not whole numbers (the rest are): checked before anything reads them (``tuple``: a list of
names)."""


def check_types(values: dict, where: str) -> None:
    """Refuse, naming the key, a value of the wrong type (a hand-edited file, or --set)."""
    for k, v in values.items():
        want = TYPES.get(k, int)
        ok = (isinstance(v, (int, float)) and not isinstance(v, bool) if want is float else
              isinstance(v, list) and all(isinstance(x, str) for x in v) if want is tuple else
              isinstance(v, want) and not (want is int and isinstance(v, bool)))
        if want is list and ok:
            ok = all(isinstance(x, int) and not isinstance(x, bool) for x in v)
        if not ok:
            kind = {str: "text", bool: "true or false", float: "a number", list: "a list of whole numbers",
                    tuple: "a list of names", int: "a whole number"}[want]
            raise ShardlabError(f"{where}: {k} = {v!r} must be {kind}; fix it")


def check_load(sv: dict) -> None:
    """The [serve] load and targets (``LOAD_KEYS``): finite and positive, a whole number of clients, the statistic
    p50 or p99, as the flags they stand for take them; one line naming the key otherwise."""
    import math

    from shardlab import limits as L

    for key, least, most in (("arrival_rate", 1e-6, L.MAX_FLOAT), ("target_rate", 1e-6, L.MAX_FLOAT), ("ttft_slo", 1e-6, L.MAX_FLOAT),
                             ("tpot_slo", 1e-6, L.MAX_FLOAT), ("concurrency", 1, L.MAX_BATCH)):
        v = sv.get(key)         # the bounds of the flags they stand for (--arrival-rate, --ttft-slo, ...)
        if v is not None and not (math.isfinite(v) and least <= v <= most):
            raise ShardlabError(f"[serve]: {key} = {v!r} must be a number from {least:g} to {most:g}; fix it")
    if sv.get("slo_percentile") not in (None, "p50", "p99"):
        raise ShardlabError(f"[serve]: slo_percentile = {sv['slo_percentile']!r} must be \"p50\" or \"p99\"; fix it")
    if sv.get("target_rate") is not None and sv.get("concurrency") is not None:
        raise ShardlabError("[serve]: target_rate (requests/s to serve on the fewest GPUs) is a Poisson rate; it does "
                            "not go with concurrency (clients): keep one")
    if sv.get("target_rate") is not None and sv.get("ttft_slo") is None and sv.get("tpot_slo") is None:
        raise ShardlabError("[serve]: target_rate is served within targets: add ttft_slo or tpot_slo (or drop it)")


def fields_of(doc: dict) -> tuple[dict, str | None]:
    """(importer fields, framework) of a parsed job file."""
    head = doc.get("shardlab")
    if not isinstance(head, dict) or head.get("format") != "job":
        raise ShardlabError('not a shardlab job file: it needs a [shardlab] table with format = "job"')
    if head.get("version") != VERSION:
        raise ShardlabError(f"[shardlab] version {head.get('version')!r}: this shardlab reads version {VERSION}")
    _check_keys(doc)
    for sec, body in doc.items():
        if sec not in ("shardlab", "estimate"):
            check_types(body, f"[{sec}]")
    f: dict = {}
    if "name" in doc.get("model", {}):
        f["model"] = doc["model"]["name"]
    cl = doc.get("cluster", {})
    for k in ("gpu", "gpus_per_node", "inter_node_gbit"):
        if k in cl:
            f[k] = cl[k]
    lay = doc.get("layout", {})
    for k in LAYOUT_KEYS:
        if k in lay:
            f[k] = tuple(lay[k]) if k in ("stage_layers", "recompute_modules") and isinstance(lay[k], list) else lay[k]
    wl = doc.get("workload", {})
    for k in WORKLOAD_KEYS:
        if k in wl:
            f[k] = wl[k]
    if "serve" in doc:
        sv = doc["serve"]
        check_load(sv)
        f.update({k: sv[k] for k in SERVE_KEYS if k in sv})
        if "kv_cache_dtype" in f:
            kv = kv_field(f.pop("kv_cache_dtype"))
            if kv:
                f["kv_cache"] = kv
    if "gpus" in cl:             # a serving job's GPUs are its replicas × tp × pp: only `plan` takes them back
        f["serve_gpus" if "serve" in doc else "gpus"] = cl["gpus"]
    fw = doc.get("framework", {}).get("name")
    return f, fw if isinstance(fw, str) else None


def kv_field(kv: str) -> str | None:
    """A KV-cache dtype as the estimate takes it: auto (the model's dtype, its default) -> None; vLLM's fp8_e4m3 /
    fp8_e5m2 -> fp8."""
    kv = str(kv)
    return None if kv == "auto" else ("fp8" if kv.startswith("fp8") else kv)


def read(text: str, catalog=None) -> Imported:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ShardlabError(f"not valid TOML ({str(e)[:120]}); fix the file") from None
    f, fw = fields_of(doc)
    named = {("model", "name"): "model", ("framework", "name"): "framework", ("serve", "max_num_seqs"): "batch"}
    und = tuple((f"[{sec}] {k} = {v}", named.get((sec, k), k)) for sec, body in doc.items()
                if sec in SECTIONS and sec not in ("shardlab", "estimate") for k, v in body.items())
    return Imported("shardlab", f, und, (), fw)
