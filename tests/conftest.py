import json
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


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
