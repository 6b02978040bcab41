"""Parsing and formatting of sizes and times. Bytes stay integers inside; GB = 1e9 and GiB = 2**30
are applied only at the edge and always named."""

from __future__ import annotations

import re

from shardlab.errors import ShardlabError

_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 2**10, "m": 2**20, "g": 2**30,  # nccl-tests style: 8K, 256M are binary
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int | float, what: str = "size") -> int:
    """Parse '8KB' (1e3), '256MiB' (2**20), '1e6', '4K' (nccl-tests: 2**10) into an integer byte count
    (zero or more, at most ``limits.MAX_BYTES``; NaN, infinity and overflow are refused)."""
    from shardlab.limits import MAX_BYTES
    from shardlab.numbers import parse_number

    if isinstance(text, (int, float)) and not isinstance(text, bool):
        num, unit = text, ""
    else:
        m = _SIZE_RE.match(str(text))
        if not m:
            low = str(text).strip().lower().lstrip("+-")
            if low in ("nan", "inf", "infinity"):
                raise ShardlabError(f"{what} must be a finite number, got '{text}'")
            if str(text).strip().startswith("-"):
                raise ShardlabError(f"{what} must not be negative, got '{text}'")
            raise ShardlabError(f"cannot parse {what} '{text}': use a number with an optional unit, e.g. 8KB, 256MiB, 1e9")
        num, unit = m.group(1), m.group(2).lower()
    if unit not in _SIZE_UNITS:
        raise ShardlabError(f"unknown unit '{unit}' in {what} '{text}': use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB "
                            f"(K, M, G: binary, as nccl-tests)")
    return parse_number(num, what, integer=True, allow_min=True, maximum=MAX_BYTES, reason="1 EiB",
                        scale=float(_SIZE_UNITS[unit]), round_to_int=True)


def parse_count(text: str | int | float, what: str, maximum: float | None = None) -> int:
    """Parse counts such as '7.5e9', '70B', '300e9' tokens into a positive int (B = 1e9, M = 1e6, T = 1e12,
    K = 1e3); refuses NaN, infinity, overflow, values that round to zero and values above ``maximum``
    (default: ``limits.MAX_TOKENS``)."""
    from shardlab.limits import MAX_TOKENS
    from shardlab.numbers import parse_number

    s = str(text).strip()
    mult = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
    scale = 1.0
    if s and s[-1].lower() in mult and not s.lower().endswith(("inf", "infinity")):
        s, scale = s[:-1], mult[s[-1].lower()]
    try:
        return parse_number(s, what, integer=True, maximum=MAX_TOKENS if maximum is None else maximum,
                            scale=scale, round_to_int=True)
    except ShardlabError as e:
        if "is not a whole number" in str(e):
            raise ShardlabError(f"cannot parse {what} '{text}': use a number such as 7.5e9 or 70B") from None
        raise


def fmt_bytes(n: float, binary: bool = True) -> str:
    """'12.3 GiB' (binary, default) or '13.2 GB' (decimal)."""
    base, units = (1024.0, ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]) if binary else (1000.0, ["B", "KB", "MB", "GB", "TB", "PB"])
    v = float(n)
    for u in units:
        if abs(v) < base or u == units[-1]:
            return f"{v:.0f} {u}" if u == "B" else f"{v:.2f} {u}"
        v /= base
    return f"{v:.2f} {units[-1]}"


def flops_scale(max_tflops: float) -> tuple[float, str]:
    """(factor on TFLOP/s, unit) to show rates peaking at ``max_tflops``: GFLOP/s below 1 TFLOP/s (a CPU)."""
    return (1e3, "GFLOP/s") if max_tflops < 1 else (1.0, "TFLOP/s")


def fmt_count(n: float) -> str:
    """6.74B, 124.4M, 8.0K."""
    for div, suf in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f}{suf}"
    return f"{n:.0f}"


def fmt_time(s: float) -> str:
    """Seconds to a readable '12.3 ms', '4.56 s', '3.2 h'."""
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    if s < 120:
        return f"{s:.2f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 3 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} days"
