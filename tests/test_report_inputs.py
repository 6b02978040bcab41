"""report and plan take what the user wrote: a layout at its default values, a pinned ZeRO stage, a short
sequence; the page's embedded JSON survives any text; a failed write of a page or picture is one line and leaves
no partial file."""

import json

import pytest

from conftest import cli_main

from shardlab.errors import ShardlabError
from shardlab.report.html.page import _json_script
from shardlab.safeout import save_with


def test_report_draws_a_layout_given_at_its_default_values(tmp_path):
    code, out, err = cli_main("report", str(tmp_path / "r.html"), "llama-3.1-8b", "--gpus", "8", "--tp", "1", "--pp",
                              "1", "--zero", "0", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert "plans" not in doc and doc["layout"]["zero"] == 0 and doc["layout"]["dp"] == 8   # the estimate, not a plan


def test_a_pinned_zero_stage_is_kept_when_nothing_fits():
    code, out, err = cli_main("plan", "llama-3.1-8b", "--gpus", "8", "--fix", "tp=1", "--fix", "pp=1", "--fix", "cp=1",
                              "--fix", "zero=0", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["plans"] == [] and doc["workload"]["offload"] == "none"     # no ZeRO-3 offload plan in its place


def test_a_sequence_shorter_than_a_context_parallel_split_is_planned():
    code, out, err = cli_main("plan", "gpt2", "--gpus", "2", "--seq-len", "128", "--json")
    assert code == 0, err
    assert json.loads(out)["plans"] and all(p["layout"]["cp"] == 1 for p in json.loads(out)["plans"])


def test_embedded_json_cannot_open_a_comment_or_close_the_script():
    text = "<!--<script>x</script>&"
    s = _json_script({"name": text})
    assert "<" not in s and ">" not in s and "&" not in s and json.loads(s) == {"name": text}


def test_a_failed_picture_write_is_one_line_and_leaves_no_partial_file(tmp_path):
    def writer(path):
        path.write_bytes(b"partial")
        raise OSError(27, "File too large")

    out = tmp_path / "p.png"
    with pytest.raises(ShardlabError, match="cannot write --plot .*File too large"):
        save_with(writer, out, "--plot")
    assert not out.exists()
    mine = tmp_path / "mine.png"
    mine.write_bytes(b"keep")
    with pytest.raises(ShardlabError):
        save_with(lambda p: (_ for _ in ()).throw(OSError(13, "Permission denied")), mine, "--plot")
    assert mine.read_bytes() == b"keep"          # a file the user had is not removed


def test_the_tp_diagram_works_on_the_context_parallel_ranks_tokens():
    from shardlab.catalog import get_catalog
    from shardlab.planner.detail import _group_text
    from shardlab.shard import block_mermaid

    spec = get_catalog().model("llama-3.1-70b")
    local = block_mermaid(spec, 2, seq_len=4096 // 4, micro_batch=1, sequence_parallel=True)
    assert "(1, 512, 8192)" in local                 # s/cp = 1024 tokens, split over tp 2 by sequence parallelism
    assert _group_text([9, 11, 13, 15]) == "ranks 9, 11, 13, 15 (4 ranks, stride 2)"


def test_models_names_the_split_by_role_not_by_dim_index():
    code, out, err = cli_main("models", "mixtral-8x7b")
    assert code == 0, err
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("layers.0.")}
    assert "dim 1 (column)" in rows["layers.0.moe.experts.w1"] and "dim 2 (row)" in rows["layers.0.moe.experts.w2"]
    assert "dim 0 (column)" in rows["layers.0.attention.wq.weight"]
    code, out, err = cli_main("models", "gpt2")
    assert code == 0, err
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("layers.0.")}
    assert "dim 0 (column)" in rows["layers.0.attention.wq.bias"]       # a column-parallel layer's bias splits too
