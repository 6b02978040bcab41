"""Catalogs of models, accelerators and links: data files with a source on every row.

The built-in files live in ``catalog/data``. Users add entries without touching code:
- ``--catalog FILE`` (or ``SHARDLAB_CATALOG=FILE[:FILE...]``): a YAML file with any of the sections
  ``models:``, ``accelerators:``, ``links:`` and ``prices:``; entries use the built-in schema and
  override built-ins with the same id;
- a hardware profile (written by ``shardlab calibrate``, read by ``--profile FILE``) is such a file with
  measured ``accelerators:``/``links:`` entries and a ``profile:`` section naming which ones to use
  (keys gpu, intra_link, inter_link, gpus_per_node, source, measured_at, and comm_overlap: false when the
  machine was measured not to overlap communication with compute);
- a model given as a path: a Hugging Face ``config.json``, or a YAML file holding one ModelSpec mapping.
Keys are checked strictly: a misspelt field is an error that names the allowed ones.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path

from shardlab.errors import ShardlabError, did_you_mean
from shardlab.specs.framework import KERNELS, Framework
from shardlab.specs.hardware import DTYPES, Accelerator, Link, MatmulEfficiency
from shardlab.specs.model import ModelSpec, model_from_dict

DATA_DIR = Path(__file__).parent / "data"
USER_SECTIONS = ("models", "accelerators", "links", "frameworks", "prices", "profile")
PROFILE_KEYS = {"gpu", "intra_link", "inter_link", "gpus_per_node", "source", "measured_at", "comm_overlap", "framework"}


def load_yaml(path: Path) -> object:
    """Read a YAML (or JSON) file; a parse error becomes a one-line ShardlabError naming the file."""
    import yaml

    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ShardlabError(f"cannot read {path}: {e.strerror}; check the path") from None
    try:
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ShardlabError(f"{path} is not valid YAML/JSON{where}: {getattr(e, 'problem', e)}; fix the file") from None


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


def _positive(where: str, name: str, key: str, v: object) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
        raise ShardlabError(f"{where}: entry '{name}' field '{key}' must be a positive number, got {v!r}")
    return float(v)


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
    d = _strict(where, name, d, _LINK_FIELDS, set())
    eff = _positive(where, name, "efficiency", d["efficiency"])
    if eff > 1:
        raise ShardlabError(f"{where}: link '{name}' efficiency must be in (0, 1], got {eff}")
    if d["scope"] not in ("intra", "inter"):
        raise ShardlabError(f"{where}: link '{name}' scope must be 'intra' or 'inter', got {d['scope']!r}")
    return Link(id=name, name=str(d["name"]), bandwidth_gbps=_positive(where, name, "bandwidth_gbps", d["bandwidth_gbps"]),
                latency_us=_positive(where, name, "latency_us", d["latency_us"]), efficiency=eff, scope=d["scope"],
                source=str(d["source"]))


_FW_FIELDS = {f.name for f in fields(Framework)} - {"id"}
_FW_OPTIONAL = {"notes", "zero3_live_params", "zero3_reduce_bucket_params"}


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
                "zero3_comm_per_gpu_nic", "hybrid_sharding"):
        if not isinstance(d[key], bool):
            raise ShardlabError(f"{where}: framework '{name}' field '{key}' must be true or false, got {d[key]!r}")
    if d["grad_reduce_bytes"] not in (0, 2, 4):
        raise ShardlabError(f"{where}: framework '{name}' grad_reduce_bytes must be 0 (gradient dtype), 2 or 4")
    for key, lo, hi in (("step_overhead_s", 0, 3600), ("layer_host_s", 0, 60), ("zero3_live_params", 0, 1e15),
                        ("zero3_reduce_bucket_params", 0, 1e15)):
        v = d.get(key, 0.0)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not lo <= v <= hi or v != v:
            raise ShardlabError(f"{where}: framework '{name}' field '{key}' must be a number in [{lo}, {hi}], got {v!r}")
    if d["pipeline_max_zero"] not in (0, 1, 2, 3):
        raise ShardlabError(f"{where}: framework '{name}' pipeline_max_zero must be 0, 1, 2 or 3")
    lists = {}
    for key, allowed in (("schedules", ("gpipe", "1f1b", "interleaved", "zb-h1")), ("axes", ("tp", "cp", "ep")),
                         ("zero_stages", (0, 1, 2, 3))):
        v = d[key]
        if not isinstance(v, list) or any(x not in allowed for x in v):
            raise ShardlabError(f"{where}: framework '{name}' field '{key}' must be a list of {list(allowed)}, got {v!r}")
        lists[key] = tuple(v)
    live = {k: float(d.get(k, 0.0)) for k in ("zero3_live_params", "zero3_reduce_bucket_params")}
    return Framework(id=name, **{**{k: d[k] for k in _FW_FIELDS - _FW_OPTIONAL}, **lists, **live},
                     notes=str(d.get("notes", "")))


@dataclass
class Catalog:
    """All known models, accelerators and links (built-ins plus user files)."""

    models: dict[str, ModelSpec] = field(default_factory=dict)
    """Model id -> spec."""
    accelerators: dict[str, Accelerator] = field(default_factory=dict)
    """Accelerator id -> spec."""
    links: dict[str, Link] = field(default_factory=dict)
    """Link id -> spec."""
    frameworks: dict[str, Framework] = field(default_factory=dict)
    """Framework id -> profile."""
    generations: dict[str, dict] = field(default_factory=dict)
    """Generation -> efficiencies (efficiencies.yaml), filled into accelerators that do not set their own."""
    prices: list[tuple[str, dict]] = field(default_factory=list)
    """Raw ``prices:`` sections of user files as (path, mapping), parsed by ``shardlab.cost``."""
    profile: dict | None = None
    """The ``profile:`` section of the last hardware profile loaded (which gpu/links it measured)."""

    def accelerator(self, name: str) -> Accelerator:
        try:
            return self.accelerators[name.lower()]
        except KeyError:
            raise ShardlabError(f"unknown GPU '{name}'{did_you_mean(name, self.accelerators)}; "
                                f"see `shardlab gpus`, or add one with --catalog FILE") from None

    def link(self, name: str) -> Link:
        try:
            return self.links[name.lower()]
        except KeyError:
            raise ShardlabError(f"unknown link '{name}'{did_you_mean(name, self.links)}; "
                                f"see `shardlab links`, or add one with --catalog FILE") from None

    def framework(self, name: str) -> Framework:
        try:
            return self.frameworks[name.lower()]
        except KeyError:
            raise ShardlabError(f"unknown framework '{name}'{did_you_mean(name, self.frameworks)}; "
                                f"choose one of {', '.join(self.frameworks)}, or add one with --catalog FILE") from None

    def model(self, name: str) -> ModelSpec:
        """A catalog id, ``hf:ORG/NAME`` (config.json from the Hugging Face Hub or its cache), a path to a Hugging Face
        config.json, or a path to a YAML ModelSpec."""
        key = name.lower()
        if key in self.models:
            return self.models[key]
        from shardlab.catalog.hub import is_hub_ref, load_hub_model

        if is_hub_ref(name):
            return load_hub_model(name)
        p = Path(name)
        if p.suffix.lower() in (".json", ".yaml", ".yml") or p.exists():
            return load_model_file(p)
        raise ShardlabError(f"unknown model '{name}'{did_you_mean(name, self.models)}; see `shardlab models`, "
                            f"or pass hf:ORG/NAME, a Hugging Face config.json path or --params N")

    def add_file(self, path: Path) -> None:
        """Merge a user catalog file (sections models/accelerators/links/prices)."""
        data = load_yaml(path)
        where = str(path)
        if not isinstance(data, dict) or not data or set(data) - set(USER_SECTIONS):
            raise ShardlabError(f"{where}: a catalog file is a mapping with sections from {list(USER_SECTIONS)}")
        for sec, entries in data.items():
            if not isinstance(entries, dict):
                raise ShardlabError(f"{where}: section '{sec}' must map ids to entries")
            if sec == "prices":
                self.prices.append((where, entries))
                continue
            if sec == "profile":
                if set(entries) - PROFILE_KEYS:
                    raise ShardlabError(f"{where}: section 'profile' allows keys {sorted(PROFILE_KEYS)}")
                # a later file's keys override an earlier one's (a framework profile on top of a hardware profile)
                self.profile = {**(self.profile or {}), **entries}
                continue
            for name, d in entries.items():
                name = str(name).lower()
                if sec == "models":
                    self.models[name] = model_from_dict(name, d, where)
                elif sec == "accelerators":
                    self.accelerators[name] = self.resolve_efficiencies(accelerator_from_dict(name, d, where))
                elif sec == "frameworks":
                    self.frameworks[name] = framework_from_dict(name, d, where)
                else:
                    self.links[name] = link_from_dict(name, d, where)
        self.check_references(where)

    def resolve_efficiencies(self, acc: Accelerator) -> Accelerator:
        """Fill the efficiencies an accelerator does not set from its generation's entry (efficiencies.yaml)."""
        from dataclasses import replace

        gen = self.generations.get(acc.generation)
        if gen is None or (acc.efficiency and acc.attention_efficiency and acc.memory_efficiency
                           and acc.overlap_efficiency is not None):
            return acc
        own = acc.efficiency is not None
        return replace(acc, efficiency=acc.efficiency or gen["matmul"],
                       attention_efficiency=acc.attention_efficiency or gen["attention"],
                       memory_efficiency=acc.memory_efficiency or gen["memory"],
                       attention_native_speedup=gen["attention_native_speedup"],
                       overlap_efficiency=acc.overlap_efficiency if acc.overlap_efficiency is not None else gen["overlap"],
                       efficiency_source=acc.efficiency_source if own else f"{acc.generation} generation: {gen['source']}")

    def check_references(self, where: str) -> None:
        for acc in self.accelerators.values():
            for key in (acc.scale_up_link, acc.system["intra_link"], acc.system["inter_link"]):
                if key not in self.links:
                    raise ShardlabError(f"{where}: accelerator '{acc.id}' names unknown link '{key}'{did_you_mean(key, self.links)}")


def apply_fitted(cat: Catalog, data: dict, where: str) -> None:
    """Overlay fitted efficiencies (fitted.yaml, written by benchmarks/fit_step_model.py) on generations and frameworks."""
    from dataclasses import replace

    fit = data.get("fit", {})
    note = f"fitted {fit.get('date', '?')} by `{fit.get('command', 'benchmarks/fit_step_model.py')}` to {fit.get('runs', '?')} published runs"
    shared = data.get("shared") or {}
    for gname, g in cat.generations.items():
        if "overlap" in shared:
            g["overlap"] = float(shared["overlap"])
    for gname, vals in (data.get("generations") or {}).items():
        g = cat.generations.get(gname)
        if g is None:
            raise ShardlabError(f"{where}: fitted values for unknown generation '{gname}'")
        vals = {**shared, **vals}
        m = g["matmul"]
        g["matmul"] = MatmulEfficiency(float(vals.get("max_fraction", m.max_fraction)), float(vals.get("half_size", m.half_size)),
                                       note)
        for key in ("attention", "memory", "overlap"):
            if key in vals:
                g[key] = float(vals[key])
        g["source"] = f"{note} (docs/validation.md); {g['source']}"
    for fname, vals in (data.get("frameworks") or {}).items():
        fw = cat.frameworks.get(fname)
        if fw is None:
            raise ShardlabError(f"{where}: fitted values for unknown framework '{fname}'")
        cat.frameworks[fname] = replace(fw, **{k: float(v) for k, v in vals.items()})


@lru_cache(maxsize=8)
def _builtin() -> Catalog:
    cat = Catalog()
    for name, d in (load_yaml(DATA_DIR / "links.yaml") or {}).items():
        cat.links[name] = link_from_dict(name, d, "links.yaml")
    for name, d in (load_yaml(DATA_DIR / "efficiencies.yaml") or {}).items():
        cat.generations[name] = generation_from_dict(name, d, "efficiencies.yaml")
    for name, d in (load_yaml(DATA_DIR / "frameworks.yaml") or {}).items():
        cat.frameworks[name] = framework_from_dict(name, d, "frameworks.yaml")
    apply_fitted(cat, load_yaml(DATA_DIR / "fitted.yaml") or {}, "fitted.yaml")
    for name, d in (load_yaml(DATA_DIR / "accelerators.yaml") or {}).items():
        cat.accelerators[name] = cat.resolve_efficiencies(accelerator_from_dict(name, d, "accelerators.yaml"))
    for name, d in (load_yaml(DATA_DIR / "models.yaml") or {}).items():
        cat.models[name] = model_from_dict(name, d, "models.yaml")

    cat.check_references("accelerators.yaml")
    return cat


def get_catalog(extra_files: tuple[str, ...] | list[str] = ()) -> Catalog:
    """The built-in catalog merged with ``SHARDLAB_CATALOG`` files and ``extra_files`` (later wins)."""
    base = _builtin()
    env = [p for p in os.environ.get("SHARDLAB_CATALOG", "").split(os.pathsep) if p]
    files = env + list(extra_files or ())
    if not files:
        return base
    cat = Catalog(dict(base.models), dict(base.accelerators), dict(base.links), dict(base.frameworks), dict(base.generations),
                  list(base.prices))
    for f in files:
        cat.add_file(Path(f))
    if cat.profile:
        for key in ("gpu",):
            if key in cat.profile:
                cat.accelerator(str(cat.profile[key]))
        for key in ("intra_link", "inter_link"):
            if key in cat.profile:
                cat.link(str(cat.profile[key]))
        if "framework" in cat.profile:
            cat.framework(str(cat.profile["framework"]))
    return cat


def load_model_file(path: Path) -> ModelSpec:
    """A Hugging Face config.json (recognised by ``model_type`` or GPT-2 keys) or a YAML ModelSpec mapping."""
    from shardlab.specs.hf import from_hf_config

    if not path.exists():
        raise ShardlabError(f"model file {path} does not exist; give a catalog id (see `shardlab models`) or an existing path")
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise ShardlabError(f"{path}: expected a JSON/YAML mapping describing a model")
    if "model_type" in data or "n_embd" in data or "hidden_size" in data and "num_hidden_layers" in data:
        return from_hf_config(data, name=path.stem if path.name != "config.json" else path.parent.name or "config", where=str(path))
    if "models" in data and isinstance(data["models"], dict) and len(data["models"]) == 1:
        (name, d), = data["models"].items()
        return model_from_dict(str(name), d, str(path))
    return model_from_dict(path.stem, data, str(path))
