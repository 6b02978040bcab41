"""docs/curriculum.md stays true: every command in its table runs and prints the quoted text of its row.

Instant commands run in-process; the few `shardlab run ...` rows start torch processes and are marked slow
(each 10-40 s on 2 cores). Rows marked **pending** name a missing option and run nothing.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli_main

TABLE = Path(__file__).resolve().parents[1] / "docs" / "curriculum.md"
def rows() -> list[dict]:
    out = []
    for line in TABLE.read_text().splitlines():
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)]
        if len(cells) != 6 or not cells[1].isdigit():
            continue
        num, item, cmd, prints = cells[1:5]
        pending = cmd.startswith("**pending**")
        command = None if pending else re.match(r"^`(shardlab [^`]+)`$", cmd)
        out.append({"n": int(num), "item": item, "pending": pending, "command": command.group(1) if command else None,
                    "phrases": re.findall(r'"([^"]+)"', prints), "raw": cmd})
    return out


ROWS = rows()
FAST = [r for r in ROWS if r["command"] and not r["command"].startswith("shardlab run ")]
SLOW = [r for r in ROWS if r["command"] and r["command"].startswith("shardlab run ")]


def test_the_table_has_all_40_items_each_with_a_command_or_marked_pending():
    assert [r["n"] for r in ROWS] == list(range(1, 41))
    for r in ROWS:
        assert r["pending"] or r["command"], f"item {r['n']}: give one `shardlab ...` command or mark it **pending**"
        if r["command"]:
            assert r["phrases"], f"item {r['n']}: quote the text the command prints"
    assert len([r for r in ROWS if r["pending"]]) <= 4


def _check(r: dict, code: int, out: str, err: str) -> None:
    assert code == 0, f"item {r['n']}: `{r['command']}` exited {code}: {err[-2000:]}"
    missing = [p for p in r["phrases"] if p not in out]
    assert not missing, f"item {r['n']}: `{r['command']}` did not print {missing}"


@pytest.mark.parametrize("r", FAST, ids=[f"item{r['n']}" for r in FAST])
def test_instant_commands(r):
    args = r["command"].split()[1:]
    code, out, err = cli_main(*args)
    _check(r, code, out, err)


_CACHE: dict[str, tuple[int, str, str]] = {}


@pytest.mark.slow
@pytest.mark.parametrize("r", SLOW, ids=[f"item{r['n']}" for r in SLOW])
def test_torch_commands(r):
    pytest.importorskip("torch")
    cmd = r["command"]
    if cmd not in _CACHE:   # items 8 and 33 share one command
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        p = subprocess.run([sys.executable, "-m", "shardlab", *cmd.split()[1:]], capture_output=True, text=True,
                           timeout=400, env=env)
        _CACHE[cmd] = (p.returncode, p.stdout, p.stderr)
    _check(r, *_CACHE[cmd])
