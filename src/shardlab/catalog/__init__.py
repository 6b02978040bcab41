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
from shardlab.specs.hardware import DTYPES, Accelerator, Link, MatmulEfficiency
from shardlab.specs.model import ModelSpec, model_from_dict

DATA_DIR = Path(__file__).parent / "data"
USER_SECTIONS = ("models", "accelerators", "links", "prices", "profile")
PROFILE_KEYS = {"gpu", "intra_link", "inter_link", "gpus_per_node", "source", "measured_at", "comm_overlap"}


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
_ACC_OPTIONAL = {"notes", "efficiency", "op_overhead_us"}
_LINK_FIELDS = {f.name for f in fields(Link)} - {"id"}


def _positive(where: str, name: str, key: str, v: object) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
        raise ShardlabError(f"{where}: entry '{name}' field '{key}' must be a positive number, got {v!r}")
    return float(v)


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
        notes=str(d.get("notes", "")), efficiency=eff,
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


@dataclass
class Catalog:
    """All known models, accelerators and links (built-ins plus user files)."""

    models: dict[str, ModelSpec] = field(default_factory=dict)
    """Model id -> spec."""
    accelerators: dict[str, Accelerator] = field(default_factory=dict)
    """Accelerator id -> spec."""
    links: dict[str, Link] = field(default_factory=dict)
    """Link id -> spec."""
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
                self.profile = dict(entries)
                continue
            for name, d in entries.items():
                name = str(name).lower()
                if sec == "models":
                    self.models[name] = model_from_dict(name, d, where)
                elif sec == "accelerators":
                    self.accelerators[name] = accelerator_from_dict(name, d, where)
                else:
                    self.links[name] = link_from_dict(name, d, where)
        self.check_references(where)

    def check_references(self, where: str) -> None:
        for acc in self.accelerators.values():
            for key in (acc.scale_up_link, acc.system["intra_link"], acc.system["inter_link"]):
                if key not in self.links:
                    raise ShardlabError(f"{where}: accelerator '{acc.id}' names unknown link '{key}'{did_you_mean(key, self.links)}")


@lru_cache(maxsize=8)
def _builtin() -> Catalog:
    cat = Catalog()
    for name, d in (load_yaml(DATA_DIR / "links.yaml") or {}).items():
        cat.links[name] = link_from_dict(name, d, "links.yaml")
    for name, d in (load_yaml(DATA_DIR / "accelerators.yaml") or {}).items():
        cat.accelerators[name] = accelerator_from_dict(name, d, "accelerators.yaml")
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
    cat = Catalog(dict(base.models), dict(base.accelerators), dict(base.links), list(base.prices))
    for f in files:
        cat.add_file(Path(f))
    if cat.profile:
        for key in ("gpu",):
            if key in cat.profile:
                cat.accelerator(str(cat.profile[key]))
        for key in ("intra_link", "inter_link"):
            if key in cat.profile:
                cat.link(str(cat.profile[key]))
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
