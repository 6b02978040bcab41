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
Keys are checked strictly (``catalog/entries.py``): a misspelt field is an error that names the allowed ones.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from shardlab.errors import ShardlabError, did_you_mean
from shardlab.catalog.entries import (accelerator_from_dict, framework_from_dict, generation_from_dict, link_from_dict,
                                     load_yaml)
from shardlab.specs.framework import Framework
from shardlab.specs.hardware import Accelerator, Link, MatmulEfficiency
from shardlab.specs.model import ModelSpec, model_from_dict

DATA_DIR = Path(__file__).parent / "data"
USER_SECTIONS = ("models", "accelerators", "links", "frameworks", "prices", "profile")
PROFILE_KEYS = {"gpu", "intra_link", "inter_link", "gpus_per_node", "source", "measured_at", "comm_overlap", "framework",
                "probe"}


_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
"""A catalog id: what a command line names (--gpu h100-sxm), printed as is in tables and messages."""


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
        from shardlab.safeio import check_name

        key = name.lower()
        if key in self.models:
            return self.models[key]
        from shardlab.catalog.hub import is_hub_ref, load_hub_model

        if is_hub_ref(name):
            return load_hub_model(name)
        p = check_name(name, "model file")
        if p.is_dir() and (p / "config.json").is_file():   # a checkpoint folder: its config.json
            return load_model_file(p / "config.json")
        if p.suffix.lower() in (".json", ".yaml", ".yml") or os.path.lexists(p):
            return load_model_file(p)
        raise ShardlabError(f"unknown model '{name}'{did_you_mean(name, self.models)}; see `shardlab models`, "
                            f"or pass hf:ORG/NAME, a Hugging Face config.json path or --params N")

    def model_ref(self, name: str) -> str | None:
        """How a later command finds the model ``name`` named, when it is not a catalog id: ``hf:ORG/NAME`` as
        given, a file as its absolute path (a plan document keeps it so that `export --plan` reads the same
        shapes); None for a catalog id."""
        if name.lower() in self.models:
            return None
        from shardlab.catalog.hub import is_hub_ref

        if is_hub_ref(name):
            return name
        try:
            return str(Path(name).resolve())
        except (OSError, RuntimeError, ValueError):
            return name

    def add_file(self, path: Path) -> None:
        """Merge a user catalog file (sections models/accelerators/links/prices)."""
        data = load_yaml(path, "catalog file")
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
                # a later file's keys override an earlier one's (a framework profile on top of a hardware profile)
                self.profile = {**(self.profile or {}), **_profile(where, entries)}
                continue
            for name, d in entries.items():
                if not isinstance(name, str) or not _ID.fullmatch(name):
                    raise ShardlabError(f"{where}: section '{sec}' has the id {str(name)[:40]!r}; an id is 1-64 letters, "
                                        f"digits and . _ + - (starting with a letter or digit), e.g. my-gpu")
                name = name.lower()
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


def _profile(where: str, entries: dict) -> dict:
    """The ``profile:`` section, keys and value types checked."""
    from shardlab.limits import MAX_GPUS_PER_NODE
    from shardlab.numbers import check_number

    if set(entries) - PROFILE_KEYS:
        raise ShardlabError(f"{where}: section 'profile' allows keys {sorted(PROFILE_KEYS)}")
    for key, v in entries.items():
        if key == "gpus_per_node":
            check_number(v, f"{where}: profile gpus_per_node", integer=True, maximum=MAX_GPUS_PER_NODE)
        elif key == "comm_overlap":
            if not isinstance(v, bool):
                raise ShardlabError(f"{where}: profile comm_overlap must be true or false, got {v!r}")
        elif not isinstance(v, str):
            raise ShardlabError(f"{where}: profile {key} must be text, got {type(v).__name__} {str(v)[:40]!r}")
    return dict(entries)


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
        # a fitted switch (validation.fit.SWITCHES) is a true/false field; the rest are numbers
        for k, v in vals.items():
            if isinstance(getattr(fw, k, None), bool) and v not in (True, False):   # 0/1 compare equal; "false" not
                raise ShardlabError(f"{where}: framework '{fname}' field '{k}' must be true or false, got {v!r}")
        cat.frameworks[fname] = replace(fw, **{k: bool(v) if isinstance(getattr(fw, k, None), bool) else float(v)
                                               for k, v in vals.items()})


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


def get_catalog(extra_files: tuple[str, ...] | list[str] = (), profile: str | None = None) -> Catalog:
    """The built-in catalog merged with ``SHARDLAB_CATALOG`` files and ``extra_files`` (later wins), then the hardware
    profile ``profile`` (``--profile FILE``), which must hold a non-empty ``profile:`` section: a plain catalog file
    given as a profile would change nothing the user asked for."""
    base = _builtin()
    env = [p for p in os.environ.get("SHARDLAB_CATALOG", "").split(os.pathsep) if p]
    files = env + list(extra_files or ())
    if not files and not profile:
        return base
    cat = Catalog(dict(base.models), dict(base.accelerators), dict(base.links), dict(base.frameworks), dict(base.generations),
                  list(base.prices))
    for f in files:
        cat.add_file(Path(f))
    if profile:
        before, cat.profile = cat.profile, None
        cat.add_file(Path(profile))
        if not cat.profile:         # no (or an empty) profile: section
            raise ShardlabError(f"{profile} has no profile: section; write one with `shardlab calibrate` "
                                f"(or pass a plain catalog file with --catalog)")
        cat.profile = {**(before or {}), **cat.profile}
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

    if not os.path.lexists(path):
        raise ShardlabError(f"model file {path} does not exist; give a catalog id (see `shardlab models`) or an existing path")
    data = load_yaml(path, "model file")
    if not isinstance(data, dict):
        raise ShardlabError(f"{path}: expected a JSON/YAML mapping describing a model")
    if "model_type" in data or "n_embd" in data or "hidden_size" in data and "num_hidden_layers" in data:
        return from_hf_config(data, name=path.stem if path.name != "config.json" else path.parent.name or "config", where=str(path))
    if "plans" in data and "model" in data:          # a `shardlab plan --json` document, not a model
        raise ShardlabError(f"{path} is a `shardlab plan --json` document, not a model: turn its winner into a job file "
                            f"with `shardlab export --plan {path} --to shardlab --out job.toml` (or save it with "
                            f"`shardlab plan ... --save job.toml`) and give that")
    if "models" in data and isinstance(data["models"], dict) and len(data["models"]) == 1:
        (name, d), = data["models"].items()
        return model_from_dict(str(name), d, str(path))
    return model_from_dict(path.stem, data, str(path))
