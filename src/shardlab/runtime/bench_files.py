"""What ``shardlab calibrate`` reads before it fits: saved ``shardlab bench matmul|collectives --json`` documents
(their fields, types and ranges checked, so a hand-edited file fails in one line and not inside a fit), and
whether the matmul benchmark's GEMM sizes determine the efficiency curve at all."""

from __future__ import annotations

from shardlab.errors import ShardlabError


def load_bench(path: str, kind: str) -> dict:
    """A saved ``shardlab bench KIND --json`` document (checked for the fields calibration needs)."""
    from shardlab.safeio import load_json

    doc = load_json(path, f"--from-{kind} file")
    need = {"matmul": ("gemm", "size", "tflops"), "collectives": ("op", "size_bytes", "time_s", "world_size")}[kind]
    top = {"matmul": ("dtype", "device", "device_name"), "collectives": ("world_size",)}[kind]
    rows = doc.get("rows") if isinstance(doc, dict) else None
    if not rows or not isinstance(rows, list) or any(k not in doc for k in top) \
            or any(not isinstance(r, dict) or k not in r for r in rows for k in need):
        raise ShardlabError(f"{path} is not `shardlab bench {kind} --json` output (needs rows with {', '.join(need)})")
    _check_bench_values(doc, kind, path)
    return doc


def _check_bench_values(doc: dict, kind: str, path: str) -> None:
    """Types and ranges of the numbers calibration uses (a hand-edited file fails here, not in a fit)."""
    from shardlab.numbers import check_number
    from shardlab.runtime.bench_collectives import BENCH_OPS

    def text(v, what, allowed=None):
        if not isinstance(v, str) or (allowed and v not in allowed):
            raise ShardlabError(f"{path}: {what} must be {'one of ' + ', '.join(allowed) if allowed else 'text'}, "
                                f"got {str(v)[:40]!r}")
    for i, r in enumerate(doc["rows"]):
        where = f"{path}: rows[{i}]"
        if kind == "matmul":
            text(r["gemm"], f"rows[{i}].gemm")
            check_number(r["size"], f"{where}.size", maximum=1e9)
            check_number(r["tflops"], f"{where}.tflops", maximum=1e6)
        else:
            text(r["op"], f"rows[{i}].op", BENCH_OPS)
            check_number(r["size_bytes"], f"{where}.size_bytes", maximum=2**50)
            check_number(r["time_s"], f"{where}.time_s", maximum=1e6)
            check_number(r["world_size"], f"{where}.world_size", integer=True, minimum=2, allow_min=True, maximum=2**20)
    if kind == "matmul":
        text(doc["dtype"], "dtype", ("fp32", "tf32", "bf16", "fp16"))
        text(doc["device"], "device", ("cpu", "cuda"))
        text(doc["device_name"], "device_name")
        for key, field in (("stream", "gbps"), ("op_overhead", "op_overhead_us")):
            sub = doc.get(key)
            if sub is not None and (not isinstance(sub, dict) or (sub.get(field) is not None and not check_number(
                    sub[field], f"{path}: {key}.{field}", allow_min=True, maximum=1e9) >= 0)):
                raise ShardlabError(f"{path}: {key} must be a mapping with {field}")
    else:
        check_number(doc["world_size"], f"{path}: world_size", integer=True, minimum=2, allow_min=True, maximum=2**20)
        ov = doc.get("overlap")
        if ov is not None and (not isinstance(ov, dict) or not isinstance(ov.get("overlaps"), bool) or any(
                check_number(ov.get(k), f"{path}: overlap.{k}", allow_min=True) < 0
                for k in ("share", "size_bytes", "comm_s", "matmuls", "compute_s", "both_s"))):
            raise ShardlabError(f"{path}: overlap must be the mapping `bench collectives` writes")


def matmul_fit_warnings(mm: dict, matmul_file: str | None = None) -> list[str]:
    """The caveats of the analysed matmul benchmark's fit (``calibration.efficiency_fit_problems``), for the profile.
    A fit the GEMM sizes do not determine is refused: one line naming the file it came from (``matmul_file``, None
    when measured here) and the fix, the flags that set the sizes (--hidden, --tokens)."""
    from shardlab.calibration import EfficiencyFit, efficiency_fit_problems
    from shardlab.runtime.bench_matmul import default_grid

    fit = EfficiencyFit(**{k: mm["fit"][k] for k in ("max_fraction", "half_size", "peak_flops", "rel_rms", "points")})
    bad, warnings = efficiency_fit_problems([r["size"] for r in mm["rows"]], fit)
    if bad:
        hidden, tokens = default_grid(mm["device"])
        sizes = f"--hidden {','.join(map(str, hidden))} --tokens {','.join(map(str, tokens))}"
        fix = (f"remeasure with `shardlab bench matmul {sizes} --json`" if matmul_file else
               f"give --hidden and --tokens a range of sizes (the {mm['device']} defaults: {sizes})")
        raise ShardlabError(f"{matmul_file + ': ' if matmul_file else ''}{bad[0]}; no profile written: {fix}")
    return warnings
