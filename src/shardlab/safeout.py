"""Writing the user's files safely: every output flag goes through here.

Output files (--mermaid, --markdown, --plot, --html, --out, --model-out, --steps-jsonl) must be regular files or
not exist yet, in an existing folder, with a name that is not empty; an output naming a file the same command reads
(the model, --catalog, --from-matmul ...), or the same file as another output of that command, is refused before
anything is written; an SQLite file (a ledger) is never overwritten. Every problem is a one-line ShardlabError
naming the flag and the fix. Reading is ``shardlab.safeio``.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from shardlab.errors import ShardlabError
from shardlab.safeio import _kind, _os_error, check_name


def check_output_path(path: str | os.PathLike, what: str) -> Path:
    """A path that can be written: a regular file or a new name, in an existing folder."""
    p = check_name(path, what)
    parent = p.parent if str(p.parent) else Path(".")
    try:
        pst = os.stat(parent)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            raise ShardlabError(f"{what} {p}: folder {parent} does not exist; create it or write elsewhere") from None
        raise _os_error(what, p, e) from None
    if not stat.S_ISDIR(pst.st_mode):
        raise ShardlabError(f"{what} {p}: {parent} is not a folder; write elsewhere")
    try:
        st = os.stat(p)
    except FileNotFoundError:
        return p
    except OSError as e:
        raise _os_error(what, p, e) from None
    kind = _kind(st.st_mode)
    if kind:
        raise ShardlabError(f"{what} {p} is {kind}; give a regular file name to write")
    if _is_sqlite(p):
        raise ShardlabError(f"{what} {p} is an SQLite database (a ledger, or its backup?); shardlab never writes over "
                            f"one: give another file name")
    kinds = OUTPUT_KINDS.get(what)
    if kinds and st.st_size > 0 and p.suffix.lower() not in kinds[0] and not _starts_with(p, kinds[1]):
        raise ShardlabError(f"{what} {p} already exists and is neither a {'/'.join(kinds[0])} file nor one shardlab "
                            f"wrote; shardlab replaces an existing file only with its own kind of output: give a new "
                            f"file name")
    return p


OUTPUT_KINDS = {"--steps-jsonl": ((".jsonl", ".ndjson", ".json"), b'{"step": '),
                "calibrate --out": ((".yaml", ".yml"), b"# shardlab ")}
"""(suffixes, the first bytes shardlab writes) of outputs whose flags are free-form paths: an existing file is
replaced only when it has one of the suffixes or starts as shardlab's own output does (a README named as
--steps-jsonl is kept). --plot and --html refuse other suffixes outright."""


def _starts_with(p: Path, head: bytes) -> bool:
    """Whether an existing file's first bytes are ``head`` (read without blocking on odd files)."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False
    try:
        return os.read(fd, len(head)) == head
    except OSError:
        return False
    finally:
        os.close(fd)


OUTPUT_DESTS = ("out", "mermaid", "markdown", "plot", "html", "model_out", "steps_jsonl")
"""The argparse destinations that name files shardlab writes."""


def _identity(value: object) -> tuple[int, int] | None:
    """(device, inode) of an existing regular file named by ``value``, else None."""
    if not isinstance(value, (str, os.PathLike)) or not str(value) or "\x00" in str(value):
        return None
    try:
        st = os.stat(value)
    except (OSError, ValueError):
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISREG(st.st_mode) else None


def refuse_output_over_input(args) -> None:
    """An output flag naming a file that the same command reads (``--mermaid m.json`` for model m.json, ``--out`` over
    ``--from-matmul``, ``--markdown`` over ``--catalog``) is refused before anything is written: nothing a user passed
    as input is overwritten."""
    values = vars(args)
    flag = lambda dest: ("OUT.html" if dest == "out" and values.get("command") == "report"     # noqa: E731
                         else f"--{dest.replace('_', '-')}")
    for d in OUTPUT_DESTS:
        if isinstance(values.get(d), str) and not values[d].strip():
            raise ShardlabError(f"{flag(d)}: the file name is empty; give a path")
    outs = {d: values[d] for d in OUTPUT_DESTS if values.get(d)}
    if not outs:
        return
    seen: dict[str, str] = {}
    for dest, out in outs.items():            # two outputs of one command into one file: the first would be lost
        if not isinstance(out, (str, os.PathLike)):
            continue
        try:
            real = os.path.realpath(out)
        except (OSError, ValueError):
            continue
        if real in seen:
            raise ShardlabError(f"{flag(seen[real])} and {flag(dest)} both name {out}: the second would overwrite the "
                                f"first; give each output its own file")
        seen[real] = dest
    inputs = {}
    for dest, v in values.items():
        if dest in OUTPUT_DESTS:
            continue
        for item in (v if isinstance(v, (list, tuple)) else [v]):
            ident = _identity(item)
            if ident:
                inputs.setdefault(ident, (dest, item))
    for dest, out in outs.items():
        ident = _identity(out)
        if ident in inputs:
            src, name = inputs[ident]
            raise ShardlabError(f"{flag(dest)} {out} is the file this command reads as "
                                f"{'the model' if src == 'model' else '--' + src.replace('_', '-')} ({name}); write "
                                f"the output to another file")


_SQLITE_MAGIC = b"SQLite format 3\x00"


def _is_sqlite(p: Path) -> bool:
    """Whether an existing regular file starts with SQLite's header (what a user recorded: never overwritten)."""
    return _starts_with(p, _SQLITE_MAGIC)


def save_with(writer, path: str | os.PathLike, what: str = "output file") -> Path:
    """``writer(path)`` (a figure's ``savefig``) after the same checks as ``write_text``: a write that fails (disk
    full, file-size limit) is one line, and the partial file it left is removed when there was none before."""
    p = check_output_path(path, what)
    existed = p.exists()
    try:
        writer(p)
    except OSError as e:
        if not existed and p.is_file():
            p.unlink(missing_ok=True)
        raise ShardlabError(f"cannot write {what} {p}: {e.strerror or e}; choose another path") from None
    return p


def write_text(path: str | os.PathLike, text: str, what: str = "output file") -> Path:
    """Write ``text`` (UTF-8) to a regular file, refusing FIFOs, devices and directories (never blocks)."""
    p = check_output_path(path, what)
    existed = p.exists()
    data = text.encode("utf-8")
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as e:
        raise ShardlabError(f"cannot write {what} {p}: {e.strerror or e}; choose another path") from None
    try:
        kind = _kind(os.fstat(fd).st_mode)
        if kind:
            raise ShardlabError(f"{what} {p} is {kind}; give a regular file name to write")
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
    except OSError as e:
        if not existed:              # do not leave a truncated file the user never had
            p.unlink(missing_ok=True)
        raise ShardlabError(f"cannot write {what} {p}: {e.strerror or e}; choose another path") from None
    finally:
        os.close(fd)
    return p


def replace_text(path: str | os.PathLike, text: str, what: str = "output file") -> Path:
    """Write ``text`` to a new file beside ``path`` and rename it over ``path`` (POSIX rename is atomic): a failed
    write leaves the old file as it was, never truncated."""
    p = Path(os.path.realpath(check_output_path(path, what)))    # a link's target is replaced, the link kept
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        if p.exists():
            os.chmod(tmp, stat.S_IMODE(os.stat(p).st_mode))
        os.replace(tmp, p)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise ShardlabError(f"cannot write {what} {p}: {e.strerror or e}; choose another path") from None
    return p

