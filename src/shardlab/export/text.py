"""Small writers and readers shared by the targets: TOML out (stdlib ``tomllib`` reads it back), comment blocks,
shell command lines (``shlex``), and argument lists to flag dictionaries."""

from __future__ import annotations

import json
import re
import shlex

from shardlab.errors import ShardlabError


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def toml_dump(sections: dict[str, dict], comments: list[str] = ()) -> str:
    """``{section: {key: value}}`` as TOML (tables of scalars and arrays only), comment lines first."""
    out = [f"# {c}" for c in comments]
    for name, body in sections.items():
        if out:
            out.append("")
        out.append(f"[{name}]")
        out += [f"{k} = {_toml_value(v)}" for k, v in body.items() if v is not None]
    return "\n".join(out) + "\n"


def comment_block(lines, marker: str = "#") -> str:
    return "".join(f"{marker} {ln}\n" for ln in lines)


def split_command(text: str) -> list[str]:
    """Shell words of a command or script: line continuations joined, comments dropped."""
    try:
        return shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError as e:
        raise ShardlabError(f"cannot read the command line: {e}; check its quotes") from None


def flag_words(pairs) -> list[str]:
    """``[(name, value or True)]`` as command-line words: ``--switch`` for True, ``--name a b`` for a tuple (argparse's
    nargs), else ``--name value`` (shell-quoted)."""
    return [f"--{k}" if v is True else f"--{k} {' '.join(shlex.quote(str(x)) for x in v)}" if isinstance(v, tuple)
            else f"--{k} {shlex.quote(str(v))}" for k, v in pairs]


HEREDOC = re.compile(r"cat > (\S+) <<'?EOF'?\n(.*?)\nEOF\n", re.S)
"""A file a script writes with a here-document (quoted or not): (name, body)."""


def flags_dict(words: list[str], lists: tuple[str, ...] = ()) -> dict[str, object]:
    """``--name value`` / ``--name=value`` / bare ``--switch`` → {name: value or True}; the last occurrence wins. A
    name in ``lists`` takes every word up to the next flag, as a tuple (argparse's nargs='*')."""
    out: dict[str, object] = {}
    i = 0
    while i < len(words):
        w = words[i]
        if w.startswith("--"):
            name, eq, val = w[2:].partition("=")
            if name in lists and eq:                # --name=a: one value (argparse's nargs with '=')
                out[name] = (val,) if val else ()
                i += 1
                continue
            if name in lists and not eq:
                j = i + 1
                while j < len(words) and not words[j].startswith("--"):
                    j += 1
                out[name] = tuple(words[i + 1:j])
                i = j
                continue
            if eq:
                out[name] = val
            elif i + 1 < len(words) and not words[i + 1].startswith("--"):
                out[name] = words[i + 1]
                i += 1
            else:
                out[name] = True
        i += 1
    return out


def as_int(flags: dict, name: str, where: str = "", lo: int = 1, hi: int | None = None, why: str = "") -> int | None:
    """The value of ``--name`` as a whole number in [lo, hi] (FieldError naming ``--name`` otherwise); None if absent."""
    if name not in flags:
        return None
    if flags[name] is True:
        raise FieldError(f"--{name}", _span(lo, hi) + (f" ({why})" if why else ""), None, wrong_type=True)
    return whole(str(flags[name]), f"--{name}", lo, hi, why)


# ---- checking the values a file gives (named by the file's own field, never by a shardlab flag) ----------------
class FieldError(ShardlabError):
    """A field of a framework file with a value of the wrong type or out of range. ``read_text`` puts the file's
    name in front (``str`` alone reads ``FIELD must be ..., got ...``)."""

    def __init__(self, field: str, must: str, got, wrong_type: bool = False):
        self.field, self.must, self.got, self.wrong_type = field, must, shown(got), wrong_type
        super().__init__(f"{field} must be {must}, got {self.got}")


class Said(str):
    """Text a message shows as it is (a description such as '3 parts', not a value quoted from the file)."""


def shown(value) -> str:
    """A value as the message quotes it: short, never a 5,000-digit number or a page of text."""
    if isinstance(value, Said):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if abs(value) < 10**15:
            return f"{value:,}"
        return f"{'-' if value < 0 else ''}a {len(str(abs(value))) if value.bit_length() < 14000 else 'more than 4,000'}-digit number"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, str):
        return repr(value if len(value) <= 40 else value[:37] + "...")
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, (list, tuple)):
        return "a list"
    return "nothing" if value is None else type(value).__name__


def _span(lo: int, hi: int | None) -> str:
    if hi is None:
        return "a whole number" + ("" if lo is None else " ≥ 0" if lo == 0 else f" ≥ {lo:,}")
    return f"a whole number from {lo:,} to {hi:,}"


def whole(value, field: str, lo: int = 1, hi: int | None = None, why: str = "") -> int:
    """``value`` (a parsed int, or the text of a command-line flag) as a whole number in [lo, hi], else FieldError."""
    must = _span(lo, hi) + (f" ({why})" if why else "")
    if isinstance(value, str):
        s = value.strip()
        t = s[1:] if s[:1] in "+-" else s
        if not (t.isascii() and t.isdigit()):
            raise FieldError(field, must, value, wrong_type=True)
        if len(t) > 30:                           # int() of thousands of digits is refused by Python; far out of range anyway
            raise FieldError(field, must, value)
        value_int = int(s)
    elif isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(field, must, value, wrong_type=True)
    else:
        value_int = value
    if value_int < lo or (hi is not None and value_int > hi):
        raise FieldError(field, must, value_int)
    return value_int


def fraction(value, field: str) -> float:
    """A share in (0, 1] (``--gpu-memory-utilization``), from a number or a flag's text."""
    import math

    must = "a number in (0, 1], e.g. 0.9"
    v = value
    if isinstance(v, str):
        try:
            v = float(v.strip()) if len(v) <= 40 else None
        except ValueError:
            v = None
        if v is None:
            raise FieldError(field, must, value, wrong_type=True)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise FieldError(field, must, value, wrong_type=True)
    if not math.isfinite(v) or not 0 < v <= 1 or v < 1e-6:
        raise FieldError(field, must, value)
    return float(v)


def flag(value, field: str) -> bool:
    """A yes/no field: a YAML boolean, or exactly the text true/false (any case), as Accelerate and SkyPilot take it."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise FieldError(field, "true or false", value, wrong_type=True)


def section(doc: dict, key: str, field: str | None = None) -> dict:
    """``doc[key]`` when it is a mapping (missing or empty: {}); anything else is a FieldError."""
    v = doc.get(key)
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise FieldError(field or key, "a section of settings (key: value pairs)", v, wrong_type=True)
    return v


def even_split(num_layers: int, stages: int) -> tuple[int, ...]:
    """``shardlab.layout.split_layers`` (the remainder to the middle stages first, then the first and the last): the
    even split a file's stage sizes are compared with."""
    from shardlab.layout import split_layers

    return split_layers(num_layers, stages)


class FileError(ShardlabError):
    """An error that already names the file it is about (a launcher's reader passes it on unchanged)."""


def serving_fields(fl: dict, text: str, where: str, seqs: str, length: str, memory: str, f: dict, und: list,
                   ign: list) -> None:
    """Read the settings every serving engine's line has, under its own flag names, into ``f``: ``seqs`` (sequences
    per replica), ``length`` (prompt + output tokens, split as the file's 'requests:' comment says, else at most 256
    output tokens) and ``memory`` (the usable memory share); what each became goes to ``und``, assumptions to
    ``ign``."""
    import re

    from shardlab import limits as L

    if seqs in fl:
        f["max_num_seqs"] = as_int(fl, seqs, where, 1, L.MAX_BATCH)
        und.append((f"--{seqs} {f['max_num_seqs']}", "concurrent sequences per replica (--batch)"))
    m = re.search(r"requests: (\d{1,9}) prompt \+ (\d{1,9}) output tokens", text)
    if length in fl:
        total = as_int(fl, length, where, 2, L.MAX_SEQ_LEN, "prompt and output tokens, at least one of each")
        if m and int(m.group(1)) + int(m.group(2)) == total:
            f["prompt_len"], f["output_len"] = int(m.group(1)), int(m.group(2))
        else:
            f["output_len"] = min(256, total // 2)
            f["prompt_len"] = total - f["output_len"]
            ign.append(f"prompt/output split of --{length} {total} assumed {f['prompt_len']} + {f['output_len']}")
        und.append((f"--{length} {total}", "prompt + output tokens"))
    if memory in fl:
        f["gpu_memory_utilization"] = fraction(fl[memory], f"--{memory}")
        und.append((f"--{memory} {f['gpu_memory_utilization']:g}", "usable memory fraction"))
