"""Catalog entries from their YAML mappings: strict keys, types and ranges, one line naming the entry and
the allowed fields on any error (accelerators, links, GPU generations, frameworks), and the safe YAML reader
every catalog file goes through."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

from shardlab.errors import ShardlabError
from shardlab.specs.framework import KERNELS, Framework
from shardlab.specs.hardware import DTYPES, Accelerator, Link, MatmulEfficiency

_PACKAGE = str(Path(__file__).resolve().parent.parent)
"""shardlab's own package folder: its data files are trusted (read directly, YAML anchors allowed)."""


def load_yaml(path: Path, what: str = "file") -> object:
    """Read a YAML (or JSON) file. The user's files go through ``shardlab.safeio`` (regular files only, size and
    nesting limits, UTF-8, no aliases); shardlab's own data files (which use YAML anchors) are read directly; duplicate keys are refused in both."""
    from shardlab import safeio

    if isinstance(path, Path) and path.is_absolute() and str(path).startswith(_PACKAGE):
        return safeio.yaml_load(path.read_text(encoding="utf-8"))
    return safeio.load_yaml(path, what)


def _strict(where: str, name: str, d: object, required: set[str], optional: set[str]) -> dict:
    if not isinstance(d, dict):
        raise ShardlabError(f"{where}: entry '{name}' must be a mapping, got {type(d).__name__}")
    missing = required - set(d)
    if missing:
        raise ShardlabError(f"{where}: entry '{name}' is missing {sorted(missing)}; add them")
    unknown = set(d) - required - optional
    if unknown:
        raise ShardlabError(f"{where}: entry '{name}' has unknown field(s) {sorted(unknown)}; allowed: {sorted(required | optional)}")
    return d


_ACC_REQUIRED = {"name", "vendor", "peak_tflops", "memory_gib", "memory_bandwidth_gbps", "scale_up_link", "host_link",
                 "tdp_w", "system", "source"}
_ACC_OPTIONAL = {"notes", "efficiency", "op_overhead_us", "generation", "attention_efficiency", "memory_efficiency",
                 "overlap_efficiency"}
_LINK_FIELDS = {f.name for f in fields(Link)} - {"id"}


FIELD_MAX = {"peak_tflops": 1e6, "memory_gib": 1e6, "memory_bandwidth_gbps": 1e8, "tdp_w": 1e6,
             "efficiency.max_fraction": 1.0, "efficiency.half_size": 1e12, "op_overhead_us": 1e9,
             "bandwidth_gbps": 1e8, "latency_us": 1e9, "efficiency": 1.0}
"""Upper bounds of catalog numbers (a thousand times today's parts: 10 PFLOP/s, 8 TB/s HBM, 1.8 TB/s links)."""


def _positive(where: str, name: str, key: str, v: object) -> float:
    from shardlab.numbers import check_number

    top = FIELD_MAX.get(key.split(".")[0] if key.startswith("peak_tflops") else key, 1e15)
    return float(check_number(v, f"{where}: entry '{name}' field '{key}'", maximum=top, smallest=1e-6))


def _text(where: str, name: str, key: str, v: object) -> str:
    if not isinstance(v, str):
        raise ShardlabError(f"{where}: entry '{name}' field '{key}' must be text, got {type(v).__name__} {str(v)[:40]!r}")
    if not v.replace("\n", " ").isprintable():     # ESC sequences, bidi overrides: tables print this text as is
        raise ShardlabError(f"{where}: entry '{name}' field '{key}' holds control characters ({v[:40]!r}); write plain text")
    return v


def _share(where: str, name: str, key: str, v: object) -> float | None:
    if v is None:
        return None
    v = _positive(where, name, key, v)
    if v > 1:
        raise ShardlabError(f"{where}: entry '{name}' field '{key}' is a share of a peak, at most 1, got {v}")
    return v


def accelerator_from_dict(name: str, d: dict, where: str) -> Accelerator:
    """Build an Accelerator from a catalog mapping (strict keys, positive numbers)."""
    d = _strict(where, name, d, _ACC_REQUIRED, _ACC_OPTIONAL)
    peaks = d["peak_tflops"]
    if not isinstance(peaks, dict) or set(peaks) - set(DTYPES):
        raise ShardlabError(f"{where}: '{name}' peak_tflops must map dtypes {list(DTYPES)} to TFLOP/s or null")
    peaks = {k: (None if peaks.get(k) is None else _positive(where, name, f"peak_tflops.{k}", peaks[k])) for k in DTYPES}
    system = _strict(where, f"{name}.system", d["system"], {"gpus_per_node", "intra_link", "inter_link"}, set())
    from shardlab.limits import MAX_GPUS_PER_NODE
    from shardlab.numbers import check_number

    check_number(system["gpus_per_node"], f"{where}: entry '{name}' field 'system.gpus_per_node'", integer=True,
                 maximum=MAX_GPUS_PER_NODE)
    for key in ("intra_link", "inter_link"):
        system[key] = _text(where, name, f"system.{key}", system[key]).lower()
    for key in ("name", "vendor", "scale_up_link", "host_link", "source"):
        _text(where, name, key, d[key])
    if d.get("notes") is not None:
        _text(where, name, "notes", d["notes"])
    eff = d.get("efficiency")
    if eff is not None:
        eff = _strict(where, f"{name}.efficiency", eff, {"max_fraction", "half_size"}, {"source"})
        eff = MatmulEfficiency(_positive(where, name, "efficiency.max_fraction", eff["max_fraction"]),
                               _positive(where, name, "efficiency.half_size", eff["half_size"]), str(eff.get("source", "")))
    return Accelerator(
        id=name, name=str(d["name"]), vendor=str(d["vendor"]), peak_tflops=peaks,
        memory_gib=_positive(where, name, "memory_gib", d["memory_gib"]),
        memory_bandwidth_gbps=_positive(where, name, "memory_bandwidth_gbps", d["memory_bandwidth_gbps"]),
        scale_up_link=str(d["scale_up_link"]), host_link=str(d["host_link"]),
        tdp_w=_positive(where, name, "tdp_w", d["tdp_w"]), system=dict(system), source=str(d["source"]),
        notes=str(d.get("notes", "")), efficiency=eff, generation=str(d.get("generation", name)),
        attention_efficiency=_share(where, name, "attention_efficiency", d.get("attention_efficiency")),
        memory_efficiency=_share(where, name, "memory_efficiency", d.get("memory_efficiency")),
        overlap_efficiency=_share(where, name, "overlap_efficiency", d.get("overlap_efficiency")),
        efficiency_source=eff.source if eff is not None else "",
        op_overhead_us=_positive(where, name, "op_overhead_us", d["op_overhead_us"]) if d.get("op_overhead_us") else 0.0)


def link_from_dict(name: str, d: dict, where: str) -> Link:
    """Build a Link from a catalog mapping (strict keys, positive numbers, efficiency in (0, 1])."""
    d = _strict(where, name, d, _LINK_FIELDS - {"mesh_peers", "socket_gpus"}, {"mesh_peers", "socket_gpus"})
    for key in ("mesh_peers", "socket_gpus"):
        v = d.get(key, 0)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 1024:
            raise ShardlabError(f"{where}: link '{name}' {key} must be a whole number of GPUs or links (0-1024), got {v!r}")
    for key in ("name", "scope", "source"):
        _text(where, name, key, d[key])
    eff = _positive(where, name, "efficiency", d["efficiency"])
    if eff > 1:
        raise ShardlabError(f"{where}: link '{name}' efficiency must be in (0, 1], got {eff}")
    if d["scope"] not in ("intra", "inter"):
        raise ShardlabError(f"{where}: link '{name}' scope must be 'intra' or 'inter', got {d['scope']!r}")
    return Link(id=name, name=str(d["name"]), bandwidth_gbps=_positive(where, name, "bandwidth_gbps", d["bandwidth_gbps"]),
                latency_us=_positive(where, name, "latency_us", d["latency_us"]), efficiency=eff, scope=d["scope"],
                source=str(d["source"]), mesh_peers=d.get("mesh_peers", 0), socket_gpus=d.get("socket_gpus", 0))


_FW_FIELDS = {f.name for f in fields(Framework)} - {"id"}
_FW_OPTIONAL = {"notes", "zero3_live_params", "zero3_reduce_bucket_params", "main_grad_buffer", "pipeline_host_s",
                "moe_tp_needs_sp", "layer_host_min_zero", "ddp_one_dimensional", "expert_tp"}


def generation_from_dict(name: str, d: dict, where: str) -> dict:
    """One generation's efficiencies (efficiencies.yaml): matmul curve, attention and memory shares, source."""
    d = _strict(where, name, d, {"matmul", "attention", "memory", "overlap", "source"}, {"attention_native_speedup"})
    m = _strict(where, f"{name}.matmul", d["matmul"], {"max_fraction", "half_size"}, set())
    shares = {k: _positive(where, name, k, d[k]) for k in ("attention", "memory", "overlap")}
    frac = _positive(where, name, "matmul.max_fraction", m["max_fraction"])
    if frac > 1 or any(v > 1 for v in shares.values()):
        raise ShardlabError(f"{where}: generation '{name}' efficiencies are shares of a peak, at most 1")
    speedup = _positive(where, name, "attention_native_speedup", d.get("attention_native_speedup", 1.0))
    return {"matmul": MatmulEfficiency(frac, _positive(where, name, "matmul.half_size", m["half_size"]), str(d["source"])),
            **shares, "attention_native_speedup": speedup, "source": str(d["source"])}


def framework_from_dict(name: str, d: dict, where: str) -> Framework:
    """Build a Framework profile from a catalog mapping (strict keys and types)."""
    d = _strict(where, name, d, _FW_FIELDS - _FW_OPTIONAL, _FW_OPTIONAL)
    if d["attention_kernel"] not in ("flash2", "native"):
        raise ShardlabError(f"{where}: framework '{name}' attention_kernel must be flash2 or native, got {d['attention_kernel']!r}")
    if d["kernels"] not in KERNELS:
        raise ShardlabError(f"{where}: framework '{name}' kernels must be one of {', '.join(KERNELS)}, got {d['kernels']!r}")
    for key in ("compiles", "fused_loss", "dp_overlap", "zero3_prefetch", "zero3_regather_for_recompute",
                "zero3_comm_per_gpu_nic", "hybrid_sharding", "main_grad_buffer", "moe_tp_needs_sp", "ddp_one_dimensional"):
        if not isinstance(d.get(key, False), bool):
            raise ShardlabError(f"{where}: framework '{name}' field '{key}' must be true or false, got {d.get(key)!r}")
    if d["grad_reduce_bytes"] not in (0, 2, 4):
        raise ShardlabError(f"{where}: framework '{name}' grad_reduce_bytes must be 0 (gradient dtype), 2 or 4")
    for key, lo, hi in (("step_overhead_s", 0, 3600), ("layer_host_s", 0, 60), ("pipeline_host_s", 0, 60),
                        ("zero3_live_params", 0, 1e15), ("zero3_reduce_bucket_params", 0, 1e15)):
        v = d.get(key, 0.0)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not lo <= v <= hi or v != v:
            raise ShardlabError(f"{where}: framework '{name}' field '{key}' must be a number in [{lo}, {hi}], got {v!r}")
    if d.get("expert_tp", "tp") not in ("tp", "one", "divisor"):
        raise ShardlabError(f"{where}: framework '{name}' expert_tp must be tp, one or divisor, got {d.get('expert_tp')!r}")
    if d.get("layer_host_min_zero", 0) not in (0, 1, 2, 3):
        raise ShardlabError(f"{where}: framework '{name}' layer_host_min_zero must be 0, 1, 2 or 3")
    if d["pipeline_max_zero"] not in (0, 1, 2, 3):
        raise ShardlabError(f"{where}: framework '{name}' pipeline_max_zero must be 0, 1, 2 or 3")
    lists = {}
    for key, allowed in (("schedules", ("gpipe", "1f1b", "interleaved", "zb-h1")), ("axes", ("tp", "cp", "ep")),
                         ("zero_stages", (0, 1, 2, 3))):
        v = d[key]
        if not isinstance(v, list) or any(x not in allowed for x in v):
            raise ShardlabError(f"{where}: framework '{name}' field '{key}' must be a list of {list(allowed)}, got {v!r}")
        lists[key] = tuple(v)
    live = {k: float(d.get(k, 0.0)) for k in ("zero3_live_params", "zero3_reduce_bucket_params", "pipeline_host_s")}
    return Framework(id=name, **{**{k: d[k] for k in _FW_FIELDS - _FW_OPTIONAL}, **lists, **live},
                     notes=str(d.get("notes", "")), main_grad_buffer=d.get("main_grad_buffer", False),
                     moe_tp_needs_sp=d.get("moe_tp_needs_sp", False),
                     layer_host_min_zero=int(d.get("layer_host_min_zero", 0)),
                     ddp_one_dimensional=d.get("ddp_one_dimensional", False),
                     expert_tp=d.get("expert_tp", "tp"))
