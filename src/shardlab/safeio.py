"""Reading and writing the user's files safely: every file argument goes through here.

Input files (model YAML/config.json, --catalog, --profile, --overheads, benchmark JSON) are opened without
blocking and checked on the open descriptor before a byte is read: a FIFO, a device (/dev/zero,
/dev/urandom), a directory or a socket is refused, and so is a file over ``limits.MAX_FILE_BYTES``. The
text must be UTF-8. YAML/JSON documents are refused before parsing when they nest deeper than
``limits.MAX_NESTING`` (deep nesting crashed the C parser), and parsed without aliases (``&a``/``*a``:
they can build self-referencing or exponentially large documents), and a key that appears twice in one
mapping is refused (YAML loaders keep the last silently; JSON objects the same). Names longer than the
filesystem allows and names with NUL bytes are refused up front. Every problem is a one-line
ShardlabError naming the file and the fix. Output files are checked and written by ``shardlab.safeout``.
"""

from __future__ import annotations

import errno
import re
import os
import stat
from pathlib import Path

from shardlab.errors import ShardlabError
from shardlab.limits import MAX_FILE_BYTES, MAX_NAME_BYTES, MAX_NESTING, MAX_PATH_BYTES

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str | None:
    """What a non-regular file is ('a directory', 'a FIFO', ...), None for a regular file."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return None if stat.S_ISREG(mode) else "not a regular file"


def check_name(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a Path, refusing NUL bytes, empty names and names too long for the filesystem."""
    text = os.fspath(path)
    if isinstance(text, bytes):
        text = text.decode("utf-8", "surrogateescape")
    shown = text if len(text) <= 80 else text[:77] + "..."
    if not text.strip():
        raise ShardlabError(f"{what}: the file name is empty; give a path")
    if "\x00" in text:
        raise ShardlabError(f"{what} {shown!r}: a file name cannot contain a NUL byte")
    raw = text.encode("utf-8", "surrogateescape")
    if len(raw) > MAX_PATH_BYTES:
        raise ShardlabError(f"{what} {shown}: the path is {len(raw):,} bytes, longer than the filesystem allows "
                            f"({MAX_PATH_BYTES:,}); use a shorter path")
    longest = max((len(part) for part in raw.split(b"/")), default=0)
    if longest > MAX_NAME_BYTES:
        raise ShardlabError(f"{what} {shown}: a name in the path is {longest} bytes, longer than the filesystem "
                            f"allows ({MAX_NAME_BYTES}); use a shorter name")
    return Path(text)


def expand_user(path: str | os.PathLike, what: str) -> Path:
    """``path`` with a leading ``~`` or ``~user`` expanded; a user that does not exist (or no home to expand to)
    is one line naming ``what`` (the flag or variable the path came from), not the RuntimeError pathlib raises."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        raise ShardlabError(f"{what} '{os.fspath(path)[:200]}' starts with a ~ that names no user's home folder; "
                            f"write the full path") from None


def _os_error(what: str, path: Path, e: OSError, fix: str = "check the path") -> ShardlabError:
    why = e.strerror or str(e)
    if e.errno == errno.ENOENT:
        return ShardlabError(f"{what} {path} does not exist; {fix}")
    if e.errno == errno.ENAMETOOLONG:
        return ShardlabError(f"{what} {path}: the name is too long for the filesystem; use a shorter path")
    return ShardlabError(f"cannot read {what} {path}: {why}; {fix}")


def read_bytes(path: str | os.PathLike, what: str = "file", max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``; anything else is a one-line ShardlabError."""
    p = check_name(path, what)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise _os_error(what, p, e) from None
    try:
        st = os.fstat(fd)
        kind = _kind(st.st_mode)
        if kind:
            raise ShardlabError(f"{what} {p} is {kind}, not a file; give a regular file")
        if st.st_size > max_bytes:
            raise ShardlabError(f"{what} {p} is {st.st_size:,} bytes, over the {max_bytes:,}-byte limit for such "
                                f"files; is it the right file?")
        chunks, total = [], 0
        while True:
            try:
                chunk = os.read(fd, 1 << 20)
            except OSError as e:
                raise _os_error(what, p, e) from None
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:       # the file grew after fstat
                raise ShardlabError(f"{what} {p} is over the {max_bytes:,}-byte limit for such files; is it the right file?")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike, what: str = "file", max_bytes: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of a regular file (a byte-order mark is dropped); see ``read_bytes``."""
    data = read_bytes(path, what, max_bytes)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ShardlabError(f"{what} {path} is not UTF-8 text (byte {e.start:,}, line {line}: {data[e.start:e.start + 1]!r}); "
                            f"save it as UTF-8") from None


_SPECIAL = re.compile(r"[\"'\\#\[\]{}&*]")


def scan_yaml(text: str) -> tuple[int, int | None]:
    """(an upper bound on how deep a YAML/JSON document nests, the line of its first anchor or alias or None),
    found without parsing it.

    Counts, per line, the block indentation levels open (a stack of indentation columns), the compact
    nested sequences on the line ('- - x') and the flow brackets open ('[', '{', outside quoted strings).
    Real configs stay under 10; anything deep enough to hurt a recursive parser is far above the limit.
    """
    indents: list[int] = []
    flow, worst, quote, alias = 0, 0, None, None
    for number, line in enumerate(text.split("\n"), 1):
        if quote is None:
            body = line.lstrip(" \t")
            if not body or body.startswith("#"):
                continue
            col = len(line) - len(body)
            while indents and indents[-1] > col:
                indents.pop()
            if not indents or indents[-1] < col:
                indents.append(col)
            compact = 0
            while body[:2] in ("- ", "? ", ": ") or body == "-":
                compact += 1
                body = body[2:].lstrip(" ")
        else:
            body, compact = line, 0
        peak, skip = flow, -1
        for m in _SPECIAL.finditer(body):
            i, ch = m.start(), m.group()
            if i <= skip:
                continue
            prev = body[i - 1] if i else " "
            if quote is not None:
                if ch == "\\" and quote == '"':
                    skip = i + 1
                elif ch == quote:
                    if quote == "'" and body[i + 1:i + 2] == "'":
                        skip = i + 1
                    else:
                        quote = None
            elif ch in "\"'" and prev in " \t[{,":
                quote = ch
            elif ch == "#" and prev in " \t":
                break
            elif ch in "&*":
                if alias is None and prev in " \t[{," and body[i + 1:i + 2] not in ("", " ", "\t", "\r"):
                    alias = number
            elif ch in "[{":
                flow += 1
                peak = max(peak, flow)
            elif ch in "]}":
                flow = max(0, flow - 1)
        worst = max(worst, len(indents) + compact + peak)
    return worst, alias


def scan_yaml_tokens(text: str) -> tuple[int, int | None]:
    """What ``scan_yaml`` estimates, exactly: the deepest nesting of collections and the line of the first anchor or
    alias, from YAML's own token stream (libyaml's scanner when present). Scanning is iterative and expands nothing,
    so it is safe where composing is not (the composer recurses per level and expands aliases). The quick line
    scanner can be misled by a quote inside a plain scalar (``note: b 'c``), which YAML does not treat as a string;
    the tokens cannot. A text the scanner rejects is left to the parser, which reports it.

    The scan stops at the first level past ``MAX_NESTING`` (the depth returned is then ``MAX_NESTING + 1``): the
    scanner's work per token grows with the open flow levels, so a 1 MiB run of ``[`` would take minutes."""
    import yaml

    opens = (yaml.BlockSequenceStartToken, yaml.BlockMappingStartToken, yaml.FlowSequenceStartToken,
             yaml.FlowMappingStartToken)
    closes = (yaml.BlockEndToken, yaml.FlowSequenceEndToken, yaml.FlowMappingEndToken)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(text)
    depth = worst = 0
    try:
        while loader.check_token():
            tok = loader.get_token()
            if isinstance(tok, opens):
                depth += 1
                worst = max(worst, depth)
                if worst > MAX_NESTING:
                    return worst, None
            elif isinstance(tok, closes):
                depth -= 1
            elif isinstance(tok, (yaml.AnchorToken, yaml.AliasToken)):
                return worst, tok.start_mark.line + 1
    except yaml.YAMLError as e:
        # libyaml's scanner (PyYAML's CSafeLoader, 6.0.4 seen) refuses deep nesting itself, before handing out the
        # tokens that open it
        if "nesting depth" in str(getattr(e, "problem", None) or ""):
            return MAX_NESTING + 1, None
    finally:
        loader.dispose()
    return worst, None


_LOADER = None
DuplicateKey = None
"""The error class ``yaml_loader`` raises (a ``yaml.constructor.ConstructorError``), set when it is first built."""


def yaml_loader():
    """PyYAML's safe loader (libyaml's when present) that refuses a key appearing twice in one mapping: YAML says
    keys are unique (YAML 1.2 §3.2.1.1) but PyYAML keeps the last one, so a catalog entry or a setting written twice
    would silently replace the first. The error (``DuplicateKey``, a ConstructorError) marks the second key."""
    global _LOADER, DuplicateKey
    if _LOADER is None:
        import yaml

        class DuplicateKey(yaml.constructor.ConstructorError):
            """A key written twice in one mapping."""

        class StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            def construct_mapping(self, node, deep=False):
                seen = {}
                for key_node, _ in node.value:
                    if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                        continue
                    key = self.construct_object(key_node)
                    try:
                        if key in seen:
                            raise DuplicateKey(
                                None, None, f"key {str(key)[:60]!r} appears twice in one mapping (first at line "
                                f"{seen[key]}); keep one", key_node.start_mark)
                        seen[key] = key_node.start_mark.line + 1
                    except TypeError:                   # an unhashable key: the constructor reports it
                        continue
                return super().construct_mapping(node, deep)

        _LOADER = StrictLoader
    return _LOADER


def yaml_load(text: str) -> object:
    """``yaml.load`` with ``yaml_loader`` (duplicate keys refused)."""
    import yaml

    return yaml.load(text, Loader=yaml_loader())


def _packaged(where: str) -> bool:
    """A data file shipped inside the shardlab package (its own catalog and validation data)."""
    try:
        return Path(where).resolve().is_relative_to(Path(__file__).resolve().parent)
    except (OSError, ValueError):
        return False


def parse_yaml(text: str, where: str) -> object:
    """Parse YAML (or JSON) text from ``where`` with the nesting and alias rules above: the quick line scan, then,
    for a user's file, the exact token scan (``scan_yaml_tokens``)."""
    import yaml

    depth, alias = scan_yaml(text)
    if depth <= MAX_NESTING and alias is None and not _packaged(where):
        depth, alias = scan_yaml_tokens(text)         # stops one level past the limit
    if depth > MAX_NESTING:
        about = f"about {depth}" if depth > MAX_NESTING + 1 else f"more than {MAX_NESTING}"
        raise ShardlabError(f"{where} nests {about} levels deep, over the limit of {MAX_NESTING} (config files "
                            f"nest a few levels); is it the right file?")
    if alias is not None:
        raise ShardlabError(f"{where} line {alias}: YAML anchors and aliases (&name, *name) are not accepted in "
                            f"shardlab files; write the values out")
    try:
        return yaml_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise ShardlabError(f"{where} is not valid YAML/JSON{at}: {getattr(e, 'problem', None) or e}; fix the file") from None
    except RecursionError:
        raise ShardlabError(f"{where} nests too deeply to read (limit {MAX_NESTING} levels); is it the right file?") from None
    except (ValueError, OverflowError) as e:       # e.g. an integer of more digits than Python converts
        raise ShardlabError(f"{where} holds a value that cannot be read ({str(e)[:80]}); fix the file") from None


def load_yaml(path: str | os.PathLike, what: str = "file") -> object:
    """Read and parse a user's YAML/JSON file (``read_text`` + ``parse_yaml``)."""
    return parse_yaml(read_text(path, what), str(path))


def _json_constant(name: str):
    raise ValueError(f"{name} is not a number JSON allows")


def _json_unique(pairs: list) -> dict:
    out = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"key {k[:60]!r} appears twice in one object; keep one")
        out[k] = v
    return out


def json_loads(text: str) -> object:
    """``json.loads`` that refuses NaN/Infinity literals and a key written twice in one object (``json`` keeps the
    last; DeepSpeed's own config reader refuses duplicates too: deepspeed/runtime/config.py,
    dict_raise_error_on_duplicate_keys). Raises ValueError (json.JSONDecodeError for syntax)."""
    import json

    return json.loads(text, parse_constant=_json_constant, object_pairs_hook=_json_unique)


def load_json(path: str | os.PathLike, what: str = "file") -> object:
    """Read and parse a JSON file with the same checks (``json_loads``: no NaN/Infinity, no key twice)."""
    text = read_text(path, what)
    depth, _ = scan_yaml(text)
    if depth > MAX_NESTING:
        raise ShardlabError(f"{what} {path} nests about {depth} levels deep, over the limit of {MAX_NESTING}; "
                            f"is it the right file?")
    try:
        return json_loads(text)
    except (ValueError, RecursionError) as e:
        raise ShardlabError(f"{what} {path} is not JSON ({str(e)[:100]}); fix or regenerate it") from None
