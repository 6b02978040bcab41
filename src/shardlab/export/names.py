"""Framework names of catalog models and accelerators (``data/names.yaml``), and finding a catalog model from the
shapes a framework file gives (Megatron-LM flags, a torchtitan flavor, a Hugging Face id)."""

from __future__ import annotations

import functools
import os

from shardlab.errors import ShardlabError
from shardlab.safeio import yaml_load


@functools.lru_cache(maxsize=1)
def names() -> dict:
    with open(os.path.join(os.path.dirname(__file__), "data", "names.yaml")) as f:
        return yaml_load(f.read())


def model_entry(model: str) -> dict:
    return names()["models"].get(model, {})


def hf_id(model: str) -> str | None:
    return model_entry(model).get("hf")


def checkpoint_weights(model: str) -> str:
    """The catalog model's checkpoint weight type ('fp8', 'fp4'; '' for a 16-bit checkpoint or a model not in the
    catalog): what an engine loads from its repository as it ships (``ModelSpec.checkpoint_weights``)."""
    from shardlab.catalog import get_catalog

    cat = get_catalog()
    return cat.models[model].checkpoint_weights if model in cat.models else ""


def as_shipped_note(engine: str, repo: str, ckpt: str, weights: str) -> str:
    """Why a launch file cannot serve ``weights`` from a repository that ships ``ckpt`` weights."""
    return (f"{engine} loads {repo} as it ships ({ckpt} block weights, read from its config); the predicted KV blocks "
            f"here are for {weights} weights: drop --weights (or give {ckpt}) to price what the engine runs")


def torchtitan_flavor(model: str) -> tuple[str, str] | None:
    tt = model_entry(model).get("torchtitan")
    return tuple(tt) if tt else None


def layer_class(family: str) -> str | None:
    return names()["layer_class"].get(family)


def skypilot_accelerator(gpu: str) -> str:
    acc = names()["skypilot_accelerators"].get(gpu)
    if acc is None:
        raise ShardlabError(f"no SkyPilot accelerator name known for '{gpu}'; pick one of "
                            f"{', '.join(sorted(names()['skypilot_accelerators']))} with --gpu")
    return acc


def gpu_from_skypilot(name: str) -> str | None:
    for gpu, acc in names()["skypilot_accelerators"].items():
        if acc.lower() == name.lower():
            return gpu
    return None


def model_from_hf(repo: str) -> str | None:
    """Catalog id of a Hugging Face repository id (case-insensitive), or None."""
    for mid, e in names()["models"].items():
        if e.get("hf", "").lower() == repo.strip("/").lower():
            return mid
    return None


def model_from_torchtitan(name: str, flavor: str) -> str | None:
    for mid, e in names()["models"].items():
        if e.get("torchtitan") == [name, flavor]:
            return mid
    return None


SHAPE_KEYS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "num_experts", "vocab_size")


def shape_of(spec) -> dict:
    return {"num_layers": spec.num_layers, "hidden_size": spec.hidden_size, "num_heads": spec.num_heads,
            "num_kv_heads": spec.num_kv_heads, "ffn_hidden_size": spec.ffn_hidden_size,
            "num_experts": spec.moe.num_experts if spec.moe else 0, "vocab_size": spec.vocab_size}


def models_with_shape(catalog, shape: dict) -> list[str]:
    """Catalog models whose shapes match every key given in ``shape``."""
    hits = []
    for mid, spec in catalog.models.items():
        mine = shape_of(spec)
        if all(mine[k] == v for k, v in shape.items() if k in mine and v is not None):
            hits.append(mid)
    return hits


def read_model(repo, label: str = "model") -> tuple[dict, list, list]:
    """(fields, understood, ignored) of a serving line's Hugging Face repository: the catalog model it names, or a
    note to give MODEL."""
    f, und, ign = {}, [], []
    mid = model_from_hf(str(repo)) if repo else None
    if mid:
        f["model"] = mid
        und.append((f"{label} {repo}", mid))
    else:
        ign.append(f"model {str(repo)[:80]} (no catalog model; give MODEL)")
    return f, und, ign
