"""The machine probe ``run train`` takes before it predicts a CPU run: this machine's rates and the runtime's host time.

A CPU run is predicted badly from the catalog's generic core (``cpu-core``: 33-64% off on the tiny model's
ddp/fsdp/tp/pp runs) and no better from a ``shardlab calibrate`` profile alone: the kernels and links it measures are
right, but the eager runtime spends most of a small step in host work no kernel benchmark sees (per-operator
dispatch, FSDP2's pre/post hooks, DTensor's sharding propagation, the pipeline schedule's Python). The probe measures
both, on the job's own number of ranks, and caches the result per machine, torch version and strategy:

1. **Rates** (``calibrate``'s measurements, shortened): fp32 GEMMs of hidden 64-512 × 128 and 512 tokens on one thread
   (``bench_matmul``: the efficiency curve), the eager memory-bound kernels and the per-operator overhead; gloo
   all-reduce, all-gather, reduce-scatter and send-recv at 4 KiB-8 MiB on the job's ranks (``bench_collectives``; the
   link is the α-β fitted to the collectives the strategy runs, ``PART_OPS``). ``comm_overlap`` false on CPU (docs/calibration.md: gloo's thread shares the core the other rank
   computes on; measured overlap shares 0.00-0.05).
2. **Host time**: ``REFERENCE`` (a 4-block, width-128 Llama-style model that is none of the runtime's presets) trained
   for ``REFERENCE_STEPS`` steps under the job's strategy and rank count (seq 64, global batch 8), and torchtitan's
   mechanisms (FSDP2, DTensor TP, eager kernels: the peer the runtime is built like) with the host time per block
   and pass fitted to that one step time (``framework_fit.calibrate_framework``, the fit `calibrate --from-run`
   makes). The job's model is never timed: its prediction is out of sample.

The result is one catalog YAML (accelerator ``cpu-core-probed``, link ``loopback-probed``, framework
``shardlab-runtime-probed``) in ``cache_dir()``, named by the key; ``--reprobe`` measures again, ``--no-probe`` (or
``SHARDLAB_PROBE=0``) predicts from the catalog's generic core. benchmarks/bench_cpu_prediction.py measures the
outcome (docs/calibration.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from dataclasses import dataclass
from pathlib import Path

from shardlab.errors import ShardlabError

REFERENCE = {"family": "llama", "hidden_size": 128, "num_layers": 4, "num_heads": 8, "num_kv_heads": 4,
             "ffn_hidden_size": 352, "vocab_size": 256, "max_seq_len": 128,
             "source": "shardlab's probe reference: Llama-style, 4 blocks of width 128 (none of the runtime presets)"}
"""The model the probe trains to measure the runtime's host time (a ModelSpec mapping, written to a YAML file)."""
REFERENCE_STEPS = 12
"""Steps of the reference run (steps 0-1 are instrumented and left out: the median of 10; 6 left ±15% of noise)."""
GEMM_HIDDEN, GEMM_TOKENS = (64, 128, 256, 512), (128, 512)
"""The probe's GEMM grid (calibrate's CPU grid without its ends: 32 FLOP/s points instead of 48, 0.03 s each)."""
COLL_OPS = ("all-reduce", "all-gather", "reduce-scatter", "send-recv")
COLL_SIZES = (4096, 65536, 1 << 20, 8 << 20)
"""The collectives and sizes the probe times on the job's ranks (bytes)."""
PART_OPS = {"ddp": ("all-reduce",), "fsdp": ("all-gather", "reduce-scatter"), "tp": ("all-reduce",),
            "tp-megatron": ("all-reduce",), "sp": ("all-gather", "reduce-scatter"), "pp": ("send-recv",), "ep": ()}
"""The collectives each strategy part runs: the link is the α-β fitted to those rows (gloo's ops differ by 2-3× in
latency and bandwidth, docs/calibration.md, so one joint fit under-prices FSDP's reduce-scatter)."""
BASE_FRAMEWORK = "torchtitan"
"""The framework whose mechanisms the probed host time completes (FSDP2, DTensor TP, eager kernels, fp32 reduce)."""
RUNTIME_FRAMEWORK = "shardlab-runtime"
"""The probe's framework entry: ``BASE_FRAMEWORK``'s mechanisms, with nothing overlapped on a CPU."""
SUFFIX = "probed"


def _runtime_framework(device: str) -> dict:
    """torchtitan's mechanisms as the runtime runs them on ``device``: on a CPU no collective hides behind compute
    (gloo's thread needs the core the rank computes on: docs/calibration.md measured overlap shares of 0.00-0.05),
    so neither the data-parallel reduction nor the ZeRO-3 prefetch overlaps; host times start at 0 (the probe fits
    them)."""
    from dataclasses import asdict

    from shardlab.catalog import get_catalog

    fw = get_catalog().framework(BASE_FRAMEWORK)
    entry = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(fw).items() if k != "id"}
    cuda = device == "cuda"
    entry.update(name=f"the shardlab runtime on {device} ({fw.name}'s mechanisms)", dp_overlap=cuda and fw.dp_overlap,
                 zero3_prefetch=cuda and fw.zero3_prefetch, layer_host_s=0.0, step_overhead_s=0.0, layer_host_min_zero=0,
                 ddp_one_dimensional=False,
                 source=("src/shardlab/runtime/parallel (DDP, FSDP2 fully_shard, DTensor TP, its own pipeline "
                         f"schedules, eager kernels); overlap off on CPU (docs/calibration.md); other mechanisms from "
                         f"{fw.id}: {fw.source}"))
    return entry


@dataclass(frozen=True)
class Probe:
    """A probe profile on disk and what it says."""

    path: Path
    """The catalog YAML (load it with ``get_catalog([path])``)."""
    fresh: bool
    """Measured by this call (False: read from the cache)."""
    measured_at: str
    """ISO time of the measurement."""
    layer_host_s: float | None
    """Host time per block and pass fitted to the reference run (None: the strategy has no dense reference)."""
    key: dict
    """What the cache is keyed on (machine, torch version, device, ranks, strategy)."""


def cache_dir() -> Path:
    """``$SHARDLAB_CACHE_DIR/probes``, else ``$XDG_CACHE_HOME/shardlab/probes``, else ``~/.cache/shardlab/probes``."""
    root = os.environ.get("SHARDLAB_CACHE_DIR")
    if root:
        return Path(root) / "probes"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "shardlab" / "probes"


def enabled(flag: bool = True) -> bool:
    """Whether ``run train`` probes: the flag (``--no-probe`` clears it) and ``SHARDLAB_PROBE`` (0/off/no: never)."""
    return flag and os.environ.get("SHARDLAB_PROBE", "1").strip().lower() not in ("0", "off", "no", "false")


def probe_key(*, device: str, nproc: int, strategy: str, torch_version: str, layout: dict) -> dict:
    """The cache key: this machine (host name, CPU model, cores), the torch version, the device, the ranks and the
    strategy with its degrees (the host time depends on all of them)."""
    from shardlab.runtime.bench_matmul import device_name
    from shardlab.runtime.calibrate import gpus_per_node

    return {"host": platform.node()[:64], "cpu": device_name(None, "cpu")[:120], "cores": gpus_per_node("cpu"),
            "torch": torch_version,
            "device": device, "nproc": nproc, "strategy": strategy,
            "layout": {k: layout[k] for k in ("dp", "tp", "pp", "ep", "zero", "vpp", "schedule") if k in layout}}


def probe_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"{key['strategy'].replace('+', '_')}-{key['nproc']}-{digest}.yaml"


def _read(path: Path, key: dict) -> Probe | None:
    """The cached probe, or None when missing or unreadable (a damaged cache file is measured again, not trusted)."""
    try:
        from shardlab.catalog import get_catalog

        cat = get_catalog([str(path)])
        prof = cat.profile or {}
        if prof.get("probe") != _key_text(key):
            return None
        host = cat.framework(prof["framework"]).layer_host_s if prof.get("framework") else None
    except (ShardlabError, OSError, KeyError):
        return None
    return Probe(path, False, str(prof.get("measured_at", "?")), host, key)


def _key_text(key: dict) -> str:
    return json.dumps(key, sort_keys=True)


def ensure_probe(*, strategy: str, nproc: int, tp, pp, schedule: str, vpp: int, layout: dict,
                 torch_version: str, device: str = "cpu", refresh: bool = False, timeout_s: float = 300.0,
                 status=None) -> Probe:
    """The cached probe for this machine, torch version, ranks and strategy, measured first when missing (or
    ``refresh``). ``status(text)`` reports progress."""
    key = probe_key(device=device, nproc=nproc, strategy=strategy, torch_version=torch_version, layout=layout)
    path = probe_path(key)
    if not refresh and (hit := _read(path, key)) is not None:
        return hit
    from shardlab.runtime.calibrate import write_profile

    say = status or (lambda text: None)
    path.parent.mkdir(parents=True, exist_ok=True)
    hw = _measure_rates(nproc, device, say, strategy)
    hw["frameworks"] = {RUNTIME_FRAMEWORK: _runtime_framework(device)}
    with tempfile.TemporaryDirectory(prefix="shardlab-probe-") as d:
        hw_file = Path(d) / "rates.yaml"
        write_profile(hw, hw_file)
        doc, layer_s = _fit_host(hw, hw_file, Path(d), strategy=strategy, nproc=nproc, tp=tp, pp=pp,
                                 schedule=schedule, vpp=vpp, device=device, timeout_s=timeout_s, say=say)
    doc["profile"]["probe"] = _key_text(key)
    header = (f"shardlab run train's machine probe for {strategy} on {nproc} ranks ({key['cpu']}, torch "
              f"{torch_version}); measured {doc['profile']['measured_at']}; delete the file or pass --reprobe to "
              "measure again")
    write_profile(doc, path, header)
    return Probe(path, True, doc["profile"]["measured_at"], layer_s, key)


def strategy_ops(strategy: str) -> tuple[str, ...]:
    """The collectives ``strategy`` runs (``PART_OPS``), or every probed op when it names none of them."""
    ops = {op for part in strategy.split("+") for op in PART_OPS.get(part, ())}
    return tuple(op for op in COLL_OPS if op in ops) or COLL_OPS


def _measure_rates(nproc: int, device: str, say, strategy: str) -> dict:
    """calibrate's rates, shortened: the GEMM curve, memory-bound kernels and operator overhead on one thread, and
    the gloo α-β on the job's ranks."""
    from shardlab.catalog import get_catalog
    from shardlab.runtime import bench_collectives as bc
    from shardlab.runtime import bench_matmul as bm
    from shardlab.runtime.calibrate import build_profile, match_accelerator
    from shardlab.calibration import AlphaBetaFit, EfficiencyFit, fit_alpha_beta

    cat = get_catalog()
    say("probing this machine: matmuls")
    mm = bm.bench_matmul("fp32", device, GEMM_HIDDEN, GEMM_TOKENS, min_time_s=0.03, threads=1)
    acc = cat.accelerator(match_accelerator(mm["device_name"], device))
    mm = bm.analyse(mm, acc)
    say("probing this machine: collectives")
    coll = bc.analyse(bc.run_collectives(nproc, list(COLL_OPS), list(COLL_SIZES), iters=10, warmup=2,
                                         min_time_s=0.02, timeout_s=120, device=device, overlap=False))
    eff = EfficiencyFit(**{k: mm["fit"][k] for k in ("max_fraction", "half_size", "peak_flops", "rel_rms", "points")})
    ops = strategy_ops(strategy)
    try:       # one α and β over the rows of the collectives this strategy runs
        ab = fit_alpha_beta([r for r in coll["rows"] if r["op"] in ops])
    except ShardlabError:
        raise ShardlabError("the probe's collectives gave no α-β fit (times did not grow with size); rerun with "
                            "--reprobe on a quieter machine, or predict from the catalog with --no-probe") from None
    per_op = {k: AlphaBetaFit(**{f: v[f] for f in ("op", "world_size", "alpha_s", "beta_bytes_per_s", "rel_rms",
                                                     "points")}) for k, v in coll["fits"].items() if k != "joint"}
    where = f"{mm['device_name']} ({device}, torch {mm.get('torch_version', '?')})"
    return build_profile(acc, cat.link(acc.system["intra_link"]), eff, "fp32", ab, gpus_per_node=max(nproc, 1),
                         suffix=SUFFIX, per_op=per_op,
                         source=(f"measured on {where} by shardlab run train's probe; the link fitted to "
                                 f"{', '.join(ops)} (the collectives {strategy} runs)"),
                         stream_gbps=(mm.get("stream") or {}).get("gbps"),
                         op_overhead_us=(mm.get("op_overhead") or {}).get("op_overhead_us"),
                         comm_overlap=device == "cuda")


def _fit_host(hw: dict, hw_file: Path, tmp: Path, *, strategy, nproc, tp, pp, schedule, vpp, device, timeout_s, say) -> tuple[dict, float | None]:
    """Train ``REFERENCE`` under the strategy and fit the host time per block and pass; returns (profile, seconds)."""
    import yaml

    from shardlab.catalog import get_catalog
    from shardlab.runtime.framework_fit import calibrate_framework
    from shardlab.runtime.train import TrainRequest, run_train

    if "ep" in strategy.split("+"):      # the reference is dense: expert parallelism has nothing to route there
        hw["profile"]["framework"] = RUNTIME_FRAMEWORK
        return hw, None
    ref = tmp / "probe-reference.yaml"
    ref.write_text(yaml.safe_dump(REFERENCE, sort_keys=False), encoding="utf-8")
    say(f"probing this machine: the runtime's host time ({strategy} on a reference model)")
    run = run_train(TrainRequest(strategy, nproc, model=str(ref), steps=REFERENCE_STEPS, tp=tp, pp=pp, schedule=schedule,
                                 vpp=vpp, device=device, timeout_s=timeout_s, probe=False))
    cat = get_catalog([str(hw_file)])
    fw_doc, fit = calibrate_framework([("the probe's reference run", run)], cat, base=RUNTIME_FRAMEWORK,
                                      gpu=hw["profile"]["gpu"], link=hw["profile"]["intra_link"], suffix=SUFFIX,
                                      command="shardlab run train (machine probe)")
    out = {**hw, "frameworks": {**hw["frameworks"], **fw_doc["frameworks"]}}
    fw = out["frameworks"][fw_doc["profile"]["framework"]]
    fw["notes"] = (f"{fw.get('notes', '')}; fitted to the probe's reference run ({strategy} on {nproc} ranks: "
                   f"{1e3 * run['step_time']['measured_median_s']:.4g} ms per step measured)")
    out["profile"] = {**hw["profile"], "framework": fw_doc["profile"]["framework"]}
    return out, fit.layer_host_s
