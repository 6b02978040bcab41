"""Hardware profile from the user's own measurements: a catalog YAML that ``--profile``/``--catalog`` load.

The file has three sections (all strictly checked by ``shardlab.catalog``):
- ``accelerators:`` one entry, ``<base>-calibrated``: a copy of the base accelerator (``cpu-core`` on CPU,
  the catalog GPU matching ``torch.cuda.get_device_name()`` on CUDA) whose ``efficiency`` is fitted to the
  matmul benchmark, eff(n) = max_fraction · n / (n + half_size) with n = min(M, N, K) of the GEMM, so that
  eff(n) · peak_tflops[dtype] reproduces the measured FLOP/s. The peak stays the catalog's unless the
  measurements exceed it (or the catalog has none for the dtype): then the fitted asymptote becomes the
  peak and max_fraction is 1. ``memory_efficiency`` becomes the measured rate of the block's eager
  memory-bound kernels (``bench_matmul.bench_stream``) over the catalog bandwidth, so the
  estimate's memory-bound term runs at the measured rate (on a CPU far below the DRAM bandwidth: SiLU and
  softmax are compute-bound there).
- ``links:`` one entry, ``<base link>-calibrated``, fitted to the collectives benchmark:
  latency_us = α (per algorithm step), bandwidth_gbps × efficiency = β (bus bandwidth, GB/s). The base
  link's line rate is kept with efficiency = β / line rate when β is below it; otherwise bandwidth_gbps =
  β and efficiency = 1.
  ``op_overhead_us`` is the measured host time per eager operator (``bench_matmul.bench_op_overhead``, CPU).
- ``profile:`` which accelerator and links to use (gpu, intra_link, inter_link, gpus_per_node, source,
  measured_at) and ``comm_overlap`` (``runtime.bench.overlap``: whether a collective ran under compute). The
  inter-node link is the base accelerator's usual one: one host cannot measure it.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import asdict
from pathlib import Path

from shardlab.calibration import AlphaBetaFit, EfficiencyFit
from shardlab.errors import ShardlabError
from shardlab.specs.hardware import Accelerator, Link

_GPU_RULES = (  # (pattern on the lower-cased CUDA device name, catalog id); first match wins
    (r"gb200", "gb200"), (r"b200", "b200"), (r"h200", "h200"),
    (r"h100.*nvl", "h100-nvl"), (r"h100.*pcie", "h100-pcie"), (r"h100", "h100-sxm"),
    (r"a100.*pcie", "a100-pcie-80gb"), (r"a100.*40gb", "a100-40gb"), (r"a100", "a100-80gb"),
    (r"v100", "v100"), (r"l40s", "l40s"), (r"\bl4\b", "l4"), (r"4090", "rtx-4090"), (r"3090", "rtx-3090"),
    (r"mi325", "mi325x"), (r"mi300", "mi300x"), (r"mi250", "mi250x"),
)


def match_accelerator(device_name: str, device: str) -> str:
    """Catalog id of the base accelerator: ``cpu-core`` on CPU; on CUDA the entry matching the device name.

    torch names such as 'NVIDIA H100 80GB HBM3' (SXM), 'NVIDIA A100-SXM4-40GB', 'NVIDIA H100 PCIe'.
    """
    if device != "cuda":
        return "cpu-core"
    low = device_name.lower().replace("-", " ")
    for pat, acc in _GPU_RULES:
        if re.search(pat, low):
            return acc
    raise ShardlabError(f"no catalog GPU matches '{device_name}'; pass --gpu ID (see `shardlab gpus`) "
                        f"or add your GPU with --catalog FILE")


def accelerator_entry(base: Accelerator, fit: EfficiencyFit | None, dtype: str, link_id: str,
                      gpus_per_node: int, source: str, stream_gbps: float | None = None,
                      op_overhead_us: float | None = None) -> dict:
    """Catalog mapping of the calibrated accelerator (the base's fields, the fitted efficiency, and — when
    measured — memory_efficiency = the memory-bound kernels' rate / the base's bandwidth; when the measured rate
    beats the catalog bandwidth, the bandwidth is raised to it and the efficiency is 1; likewise the peak FLOP/s
    when the fitted max_fraction exceeds 1, and the source says so)."""
    peaks = dict(base.peak_tflops)
    bw = base.memory_bandwidth_gbps
    mem_eff = None
    if stream_gbps:
        mem_eff = stream_gbps / bw
        if mem_eff > 1:
            bw, mem_eff = _sig(stream_gbps), 1.0
        mem_eff = _sig(mem_eff)
    d = {"name": f"{base.name} (calibrated)", "vendor": base.vendor, "generation": base.generation, "peak_tflops": peaks,
         "memory_gib": base.memory_gib, "memory_bandwidth_gbps": bw,
         "scale_up_link": link_id, "host_link": base.host_link, "tdp_w": base.tdp_w,
         "system": {"gpus_per_node": gpus_per_node, "intra_link": link_id, "inter_link": base.system["inter_link"]},
         "source": (f"{source}; " + (f"memory_efficiency = {stream_gbps:.4g} GB/s measured on eager memory-bound kernels "
                                     f"/ {bw:g} GB/s; " if stream_gbps else "")
                    + f"other fields from the catalog entry '{base.id}' ({base.source})")}
    if mem_eff is not None:
        d["memory_efficiency"] = mem_eff
    if base.notes:
        d["notes"] = base.notes
    if op_overhead_us:
        d["op_overhead_us"] = _sig(op_overhead_us)
    elif base.op_overhead_us:
        d["op_overhead_us"] = base.op_overhead_us
    if fit is not None:
        m, peak_tf = fit.max_fraction, fit.peak_flops / 1e12
        raised = ""
        if m > 1 or not peaks.get(dtype):
            if peaks.get(dtype):
                raised = (f"; peak raised from the catalog's {_sig(peak_tf)} TFLOP/s: the fit's max_fraction "
                          f"{_sig(m)} > 1 means the GEMMs beat it")
            peak_tf, m = m * peak_tf, 1.0
            peaks[dtype] = _sig(peak_tf)
        d["efficiency"] = {"max_fraction": _sig(m), "half_size": _sig(fit.half_size),
                           "source": (f"fitted to {fit.points} {dtype} GEMMs measured with `shardlab bench matmul`: "
                                      f"eff(n) = max_fraction*n/(n+half_size), n = min(M,N,K); rel. rms "
                                      f"{fit.rel_rms:.1%} against peak {_sig(peak_tf)} TFLOP/s{raised}; {source}")}
    return d


def link_entry(base: Link, fit: AlphaBetaFit, source: str) -> dict:
    """Catalog mapping of the calibrated link: latency_us = α, bandwidth_gbps × efficiency = β."""
    beta = fit.beta_gbps
    line, eff = (base.bandwidth_gbps, beta / base.bandwidth_gbps) if beta <= base.bandwidth_gbps else (beta, 1.0)
    return {"name": f"{base.name} (calibrated)", "bandwidth_gbps": _sig(line), "latency_us": _sig(max(fit.latency_us, 1e-3)),
            "efficiency": _sig(min(eff, 1.0)), "scope": base.scope,
            "source": (f"fitted with `shardlab bench collectives` ({fit.op} α-β fit over {fit.points} points on "
                       f"{fit.world_size} ranks, rel. rms {fit.rel_rms:.1%}): alpha {fit.latency_us:.4g} us/step, "
                       f"beta {beta:.4g} GB/s bus bandwidth; {source}")}


def build_profile(base_acc: Accelerator, base_link: Link, eff_fit: EfficiencyFit | None, dtype: str,
                  link_fit: AlphaBetaFit | None, *, gpus_per_node: int, source: str, suffix: str = "calibrated",
                  measured_at: str | None = None, per_op: dict[str, AlphaBetaFit] | None = None,
                  stream_gbps: float | None = None, op_overhead_us: float | None = None,
                  comm_overlap: bool | None = None) -> dict:
    """The profile document (see the module docstring); either fit may be None (the catalog's value is kept)."""
    acc_id = f"{base_acc.id}-{suffix}"
    link_id = f"{base_link.id}-{suffix}" if link_fit is not None else base_link.id
    doc: dict = {"profile": {"gpu": acc_id, "intra_link": link_id, "inter_link": base_acc.system["inter_link"],
                             "gpus_per_node": gpus_per_node, "source": source,
                             "measured_at": measured_at or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}}
    if comm_overlap is not None:
        doc["profile"]["comm_overlap"] = bool(comm_overlap)
    doc["accelerators"] = {acc_id: accelerator_entry(base_acc, eff_fit, dtype, link_id, gpus_per_node, source,
                                                     stream_gbps, op_overhead_us)}
    if link_fit is not None:
        entry = link_entry(base_link, link_fit, source)
        if per_op:
            entry["source"] += "; per op: " + ", ".join(
                f"{op} alpha {f.latency_us:.4g} us beta {f.beta_gbps:.4g} GB/s" for op, f in per_op.items())
        doc["links"] = {link_id: entry}
    return doc


def write_profile(doc: dict, path: str | Path, header: str = "", inputs: str = "") -> Path:
    """Write the profile YAML (a commented header, then the sections), after checking that the catalog loads it: the
    text goes to a temporary file beside ``path``, is loaded, and only then replaces ``path``. A profile that does not
    load, or a failed write, leaves nothing behind (an existing file at ``path`` stays as it was). ``inputs`` names
    the files the profile was fitted from (the message blames them)."""
    import os
    import tempfile

    import yaml

    from shardlab.catalog import get_catalog

    p = Path(path)
    lines = ["# shardlab hardware profile (catalog YAML), written by `shardlab calibrate`.",
             f"# Use: {use_command(doc, 'THIS_FILE')}"]
    lines += [f"# {ln}" for ln in header.splitlines() if ln.strip()]
    body = yaml.safe_dump(doc, sort_keys=False, width=200, allow_unicode=True)
    parent = p.parent if str(p.parent) else Path(".")
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name[:200]}.", suffix=".tmp", dir=parent)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n" + body)
        try:   # strict schema check: a profile that does not load is never written
            get_catalog([tmp])
        except ShardlabError as e:
            detail = str(e).replace(f"{tmp}: ", "").replace(tmp, "the profile")
            raise ShardlabError(f"{inputs + ': ' if inputs else ''}the fitted profile would not load ({detail}); "
                                f"nothing was written to {p}") from None
        target = os.path.realpath(p)          # through a symbolic link, to the file it names
        try:
            mode = os.stat(target).st_mode & 0o7777
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, target)
        tmp = None
    except OSError as e:
        raise ShardlabError(f"cannot write the profile to {p}: {e.strerror or e}; choose a writable --out path") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return p


def _check_fitted(doc: dict, dtype: str, matmul_src: str, coll_src: str) -> None:
    """Every number the measurements put into the profile, against the catalog's bounds (``catalog.entries``): one line
    that blames the input file and its field, before anything is written."""
    from shardlab.catalog.entries import FIELD_MAX

    prof = doc["profile"]
    a = doc["accelerators"][prof["gpu"]]
    eff = a.get("efficiency") or {}
    mm_fix = "remeasure with `shardlab bench matmul --json`"
    checks = [
        (a["peak_tflops"].get(dtype), FIELD_MAX["peak_tflops"], matmul_src, "rows give a peak of {v:.4g} TFLOP/s "
         f"{dtype}", "TFLOP/s", "check the rows' tflops, or " + mm_fix),
        (eff.get("max_fraction"), 1.0, matmul_src, "rows reach only {v:.3g} of the peak", "", "check the rows' tflops, "
         "or " + mm_fix),
        (eff.get("half_size"), FIELD_MAX["efficiency.half_size"], matmul_src, "rows give a half-efficiency GEMM size of "
         "{v:.4g}", "", "check the rows' size and tflops, or " + mm_fix),
        (a["memory_bandwidth_gbps"], FIELD_MAX["memory_bandwidth_gbps"], matmul_src, "stream.gbps gives a memory "
         "bandwidth of {v:.4g} GB/s", "GB/s", "check stream.gbps, or " + mm_fix),
        (a.get("memory_efficiency"), 1.0, matmul_src, "stream.gbps gives a memory efficiency of {v:.3g}", "",
         "check stream.gbps, or " + mm_fix),
        (a.get("op_overhead_us"), FIELD_MAX["op_overhead_us"], matmul_src, "op_overhead.op_overhead_us gives "
         "{v:.4g} us per operator", "us", "check op_overhead, or " + mm_fix),
    ]
    lk = (doc.get("links") or {}).get(prof["intra_link"])
    if lk is not None:
        coll_fix = "remeasure with `shardlab bench collectives --nproc-per-node 2 --sizes 1KiB:64MiB --json`"
        checks += [
            (lk["bandwidth_gbps"], FIELD_MAX["bandwidth_gbps"], coll_src, "rows give a bus bandwidth of {v:.4g} GB/s",
             "GB/s", "check the rows' size_bytes and time_s, or " + coll_fix),
            (lk["efficiency"], 1.0, coll_src, "rows give a bus bandwidth of {v:.3g} of the link's line rate", "",
             "check the rows' size_bytes and time_s, or " + coll_fix),
            (lk["latency_us"], FIELD_MAX["latency_us"], coll_src, "rows give a latency of {v:.4g} us per step", "us",
             "check the rows' time_s, or " + coll_fix),
        ]
    for v, top, src, what, unit, fix in checks:
        if v is None:
            continue
        if v > top:
            raise ShardlabError(f"{src}: {what.format(v=v)}, above the limit of {top:g}{' ' + unit if unit else ''} a "
                                f"profile holds; {fix}")
        if v < 1e-6:
            raise ShardlabError(f"{src}: {what.format(v=v)}, below the smallest value of 1e-06 a profile holds; {fix}")


def _no_link_fit(coll: dict, link_fit: str, src: str) -> ShardlabError:
    """Why the collectives results have no ``link_fit`` α–β fit, and what to measure."""
    rows = coll.get("rows") or []
    ops = list(dict.fromkeys(r["op"] for r in rows))
    sel = [r for r in rows if link_fit == "joint" or r["op"] == link_fit]
    if not sel:
        return ShardlabError(f"--link-fit {link_fit}: no such fit, {src} has no {link_fit} rows (it measured {', '.join(ops) or 'nothing'}); "
                             f"measure it with `shardlab bench collectives --ops {link_fit} --sizes 1KiB:64MiB --json`, or "
                             f"use --link-fit joint")
    sizes = len({r["size_bytes"] for r in sel})
    what = "" if link_fit == "joint" else f"{link_fit} "
    if sizes < 2:
        return ShardlabError(f"{src}: {len(sel)} {what}row(s) at {sizes} message size(s): fitting a link's latency and "
                             f"bandwidth needs at least 2 message sizes (8 or more fit well); measure a size range with "
                             f"`shardlab bench collectives --nproc-per-node 2 --sizes 1KiB:64MiB --json`")
    reason = (coll.get("fit_errors") or {}).get(link_fit) or "the fit failed"
    return ShardlabError(f"{src}: no {link_fit} latency/bandwidth fit from its {len(sel)} {what}rows: {reason}; or "
                         f"remeasure with `shardlab bench collectives --nproc-per-node 2 --sizes 1KiB:64MiB --json`")


def fit_summary(fit: AlphaBetaFit | EfficiencyFit) -> dict:
    """JSON-friendly view of a fit, with the derived units."""
    d = asdict(fit)
    if isinstance(fit, AlphaBetaFit):
        d.update(latency_us=fit.latency_us, beta_gbps=fit.beta_gbps)
    else:
        d.update(peak_tflops=fit.peak_flops / 1e12)
    return d


def _sig(x: float, digits: int = 4) -> float:
    """Round to ``digits`` significant digits (readable YAML, no float noise)."""
    return float(f"{x:.{digits}g}")


def make_profile(mm: dict, coll: dict | None, catalog, *, out: str, link: str | None, link_fit: str,
                 suffix: str, matmul_file: str | None = None, collectives_file: str | None = None,
                 warnings: list[str] | None = None) -> tuple[dict, str]:
    """Fit, build and write the profile; returns the command's (JSON document, text). ``matmul_file`` and
    ``collectives_file``: the files the measurements came from (named in errors), None when measured here;
    ``warnings``: caveats of the fits (``bench_files.matmul_fit_warnings``), in the JSON, the text and the profile's header."""
    from shardlab.calibration import AlphaBetaFit, EfficiencyFit
    from shardlab.render.table import kv_lines

    acc = catalog.accelerator(mm["accelerator"])
    base_link = catalog.link(link or acc.system["intra_link"])
    eff = EfficiencyFit(**{k: mm["fit"][k] for k in ("max_fraction", "half_size", "peak_flops", "rel_rms", "points")})
    ab = per_op = None
    if coll is not None:
        fits = {k: AlphaBetaFit(**{f: v[f] for f in ("op", "world_size", "alpha_s", "beta_bytes_per_s", "rel_rms",
                                                       "points")}) for k, v in coll["fits"].items()}
        if link_fit not in fits:
            raise _no_link_fit(coll, link_fit, collectives_file or "the collectives benchmark")
        ab, per_op = fits[link_fit], {k: f for k, f in fits.items() if k != "joint"}
    where = f"{mm['device_name']} ({mm['device']}, torch {mm.get('torch_version', '?')})"
    gpn = gpus_per_node(mm["device"]) if coll is None else max(gpus_per_node(mm["device"]), coll["world_size"])
    stream = (mm.get("stream") or {}).get("gbps")
    overhead = (mm.get("op_overhead") or {}).get("op_overhead_us")
    overlap = (coll or {}).get("overlap")
    doc = build_profile(acc, base_link, eff, mm["dtype"], ab, gpus_per_node=gpn, suffix=suffix,
                        source=f"measured on {where} by shardlab calibrate", per_op=per_op, stream_gbps=stream,
                        op_overhead_us=overhead, comm_overlap=overlap["overlaps"] if overlap else None)
    header = (f"matmul: {eff.points} {mm['dtype']} GEMMs; collectives: "
              + (f"{coll.get('backend', '?')} on {coll['world_size']} ranks, link = the '{link_fit}' fit"
                 if coll else "not measured (catalog link kept)"))
    warnings = list(warnings or [])
    header += "".join(f"\nwarning: {w}" for w in warnings)
    mm_src, coll_src = matmul_file or "the matmul benchmark", collectives_file or "the collectives benchmark"
    _check_fitted(doc, mm["dtype"], mm_src, coll_src)
    path = write_profile(doc, out, header, inputs=" and ".join(dict.fromkeys(
        [mm_src] + ([coll_src] if coll is not None else []))))
    prof = doc["profile"]
    a = doc["accelerators"][prof["gpu"]]
    pairs = [("profile", str(path)), ("accelerator", f"{prof['gpu']} (from {acc.id}): efficiency "
             f"{a['efficiency']['max_fraction']}·n/(n+{a['efficiency']['half_size']}) × peak "
             f"{a['peak_tflops'][mm['dtype']]} TFLOP/s {mm['dtype']}, rel. rms {eff.rel_rms:.1%}; memory-bound kernels "
             + (f"{stream:.3g} GB/s measured -> memory_bandwidth_gbps {a['memory_bandwidth_gbps']}" if stream else
                f"not measured (catalog {a['memory_bandwidth_gbps']} GB/s)"))]
    if ab is not None:
        lk = doc["links"][prof["intra_link"]]
        pairs.append(("intra link", f"{prof['intra_link']} (from {base_link.id}): alpha {lk['latency_us']} us/step, "
                      f"beta {ab.beta_gbps:.4g} GB/s = {lk['bandwidth_gbps']} GB/s x {lk['efficiency']} ({link_fit} fit, "
                      f"rel. rms {ab.rel_rms:.1%})"))
    else:
        pairs.append(("intra link", f"{prof['intra_link']} (catalog, not measured)"))
    if overhead:
        pairs.append(("operator overhead", f"{a['op_overhead_us']} us per eager operator (op_overhead_us)"))
    if overlap:
        from shardlab.runtime.bench.overlap import describe

        pairs.append(("overlap", describe(overlap).split(": ", 1)[1]))
    pairs += [("inter link", f"{prof['inter_link']} (catalog: one host cannot measure it)"),
              ("gpus per node", prof["gpus_per_node"]),
              ("use it", use_command(doc, str(path)))]
    result = {"profile_path": str(path), "profile": doc, "matmul": mm, "collectives": coll, "warnings": warnings}
    text = kv_lines(pairs)
    return result, text + "".join(f"\nwarning: {w}" for w in warnings)


def gpus_per_node(device: str) -> int:
    """Accelerators on this host: CUDA devices, or CPU cores (the CPU runtime puts one rank on a core)."""
    if device == "cuda":
        import torch

        return max(1, torch.cuda.device_count())
    import os

    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def use_command(doc: dict, path: str) -> str:
    """How to estimate with the profile; a CPU profile measures fp32 only, so it names that precision."""
    from shardlab.specs.hardware import TRAINING_PRECISION

    gpu = (doc.get("profile") or {}).get("gpu")
    if gpu not in (doc.get("accelerators") or {}):      # a framework-only profile (calibrate --from-run)
        return f"shardlab estimate MODEL ... --profile {path}"
    peaks = doc["accelerators"][gpu]["peak_tflops"]
    prec = "" if peaks.get("bf16") else next((f" --precision {TRAINING_PRECISION[k]}" for k in ("fp16", "fp32")
                                              if peaks.get(k)), "")
    return f"shardlab estimate MODEL{prec} ... --profile {path}   (or --catalog {path} --gpu {gpu})"
