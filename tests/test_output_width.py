"""The human output fits the terminal: tables wrap their text cells (numbers never), move a long text column under
each row when the numbers alone fill the width, and prose wraps at spaces; --wide keeps one line per row."""

import pytest

from conftest import cli_main
from shardlab.render.table import OUTPUT_WIDTH, fit_text, table


@pytest.fixture
def narrow(monkeypatch):
    monkeypatch.delenv("SHARDLAB_WIDE")
    monkeypatch.setenv("COLUMNS", "100")


@pytest.mark.parametrize("argv", [
    ["plan"],
    ["estimate", "llama-3.1-70b", "--gpus", "64", "--tp", "8", "--pp", "2", "--zero", "1"],
    ["memory", "llama-3.1-70b", "--gpus", "64", "--tp", "8", "--pp", "2", "--zero", "1"],
    ["comm", "plan", "llama-3.1-70b", "--gpus", "64", "--tp", "8", "--pp", "2"],
    ["estimate", "llama-3.1-8b", "--inference", "--serve", "--concurrency", "32"],
    ["explain", "zero"], ["gpus"],
    ["plan", "llama-3.1-8b", "--inference", "--serve", "--gpus", "8", "--prompt-len", "1000", "--output-len", "200",
     "--ttft-slo", "1", "--tpot-slo", "0.05"],
])
def test_no_line_wider_than_the_terminal(narrow, argv):
    code, out, err = cli_main(*argv)
    assert code == 0, err
    wide = [line for line in out.splitlines() if len(line) > 100]
    assert not wide, wide[:3]


def test_wide_keeps_one_line_per_row(narrow):
    code, out, _ = cli_main("plan", "--wide")
    assert code == 0 and max(len(line) for line in out.splitlines()) > 200
    rows = [line for line in out.splitlines() if line.startswith("SP    all-gather")]
    assert rows and all("critical path" in r for r in rows)      # the risk text stays on its row


def test_table_fitting_rules():
    token = OUTPUT_WIDTH.set(60)
    try:
        t = table(["name", "count", "why"], [["alpha", "1,234", "a long explanation " * 4],
                                             ["beta", "5", "short"]])
        lines = t.splitlines()
        assert max(len(x) for x in lines) <= 60
        assert lines[2].split()[:2] == ["alpha", "1,234"] and "a long explanation" in lines[2]
        assert lines[3].startswith(" " * 14 + "explanation")   # wrapped inside its cell, under its column
        nums = table(["a", *[f"n{i}" for i in range(8)], "note"],
                     [["x", *["123,456"] * 8, "one two three four five six seven"]])
        assert "    note: one two three four five six seven" in nums.splitlines()   # moved under the row
        assert "(under each row: note" in nums
        assert fit_text("word " * 30).count("\n") >= 2 and all(len(x) <= 60 for x in fit_text("word " * 30).split("\n"))
        kv = fit_text("     10,455  " + "hybrid sharding needs ZeRO " * 4)
        assert kv.splitlines()[1].startswith(" " * 13) and all(len(x) <= 60 for x in kv.splitlines())
    finally:
        OUTPUT_WIDTH.reset(token)
    assert max(len(x) for x in table(["a", "b"], [["x", "y " * 100]]).splitlines()) > 100   # no limit: one line
