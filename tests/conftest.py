import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
os.environ["SHARDLAB_WIDE"] = "1"
os.environ["SHARDLAB_QUIZ_DB"] = os.path.join(__import__("tempfile").mkdtemp(prefix="shardlab-quiz-"), "quiz.sqlite")
"""Quiz attempts the tests take are kept in a temporary database, not the user's."""
os.environ["SHARDLAB_PROBE"] = "0"
os.environ["SHARDLAB_CACHE_DIR"] = __import__("tempfile").mkdtemp(prefix="shardlab-cache-")
"""`run train` predicts from the catalog in the tests (each strategy's machine probe takes ~12 s); tests/runtime/
test_probe.py turns the probe on, with this temporary cache, never the user's."""
"""The tests read the human output one line per table row (as --wide prints it); tests/test_output_width.py unsets
it, sets COLUMNS and checks that the output fits."""


@pytest.fixture
def data_dir() -> Path:
    return DATA


def run_cli(*args: str, check: bool | None = None) -> subprocess.CompletedProcess:
    """Run `python -m shardlab ARGS` in a subprocess (the real entry point, exit codes included)."""
    return subprocess.run([sys.executable, "-m", "shardlab", *args], capture_output=True, text=True, timeout=120)


def cli_json(*args: str) -> dict:
    r = run_cli(*args, "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def cli_main(*args: str):
    """In-process call of the CLI: (exit code, stdout, stderr) via capsys-free redirection."""
    import contextlib
    import io

    from shardlab.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:
            code = e.code
    return code, out.getvalue(), err.getvalue()


_VALIDATE_INFERENCE: list = []


def validate_inference_output() -> tuple[int, str, str]:
    """`validate --inference --json` run once per test session (a full leave-one-source-out, about 30 s): the tests
    that read it share one run (the catalog and the rows do not change while the suite runs)."""
    if not _VALIDATE_INFERENCE:
        _VALIDATE_INFERENCE.append(cli_main("validate", "--inference", "--json"))
    return _VALIDATE_INFERENCE[0]


def hand_edit(path, *statements) -> None:
    """Edit a SQLite file behind shardlab's back, as a user with the sqlite3 shell could: each statement is SQL text
    or (SQL, parameters); committed and closed."""
    import sqlite3

    con = sqlite3.connect(path)
    try:
        for st in statements:
            sql, params = (st, ()) if isinstance(st, str) else st
            con.execute(sql, params)
        con.commit()
    finally:
        con.close()


def pytest_collection_finish(session):
    """torch.testing._internal.common_distributed (imported by the threaded tests at collection) sets
    TORCH_SHOW_CPP_STACKTRACES=1 in this process; every torchrun job a later test starts would inherit it and
    symbolize a C++ stack (addr2line over libtorch) for each exception torch raises and catches inside, about 20%
    of those jobs' time. The tests do not read those stacks."""
    import os

    os.environ.pop("TORCH_SHOW_CPP_STACKTRACES", None)


COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _cache_repo(cache: Path, repo: str, config: bytes, commit: str = COMMIT) -> None:
    """The layout huggingface_hub writes: blobs/<sha256>, snapshots/<commit>/config.json -> blob, refs/main = commit."""
    root = cache / f"models--{repo.replace('/', '--')}"
    blob = hashlib.sha256(config).hexdigest()
    (root / "blobs").mkdir(parents=True)
    (root / "refs").mkdir()
    (root / "snapshots" / commit).mkdir(parents=True)
    (root / "blobs" / blob).write_bytes(config)
    (root / "refs" / "main").write_text(commit)
    os.symlink(f"../../blobs/{blob}", root / "snapshots" / commit / "config.json")


INTERNALS = ("Traceback", "__init__", "TypeError", "OperationalError", "positional argument")
"""What a one-line refusal never shows: Python's internals."""


def one_line_error(args, *fragments):
    """Run the CLI on ``args``: exit code 2 and one stderr line holding every fragment and no internals."""
    code, out, err = cli_main(*args)
    assert code == 2, (code, out[-500:], err)
    assert len(err.strip().splitlines()) == 1, err
    for bad in INTERNALS:
        assert bad not in err, err
    for f in fragments:
        assert f in err, err
    return err
