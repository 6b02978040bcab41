"""Every reproducer of the reliability issue, kept as a regression test: hostile numbers, work bounded by
input size, hostile files and config values. Each must give exit code 2 and one line naming the problem
(never a traceback, a hang or a non-finite number)."""

import json
import os
import sys

import pytest

from conftest import DATA, cli_main

LINUX = sys.platform.startswith("linux")


def one_line_error(args, *fragments):
    code, out, err = cli_main(*args)
    assert code == 2, (code, out[-500:], err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for f in fragments:
        assert f in err, err
    return err


@pytest.mark.parametrize("args, fragment", [
    (["cost", "--gpus", "1e400", "--hours", "1", "--price", "1"], "--gpus"),
    (["memory", "--params", "nan"], "--params must be a finite number"),
    (["estimate", "llama-3.1-8b", "--gpus", "8", "--tokens", "inf"], "--tokens must be a finite number"),
    (["comm", "all-reduce", "--size", "1e400", "--gpus", "8"], "--size"),
    (["pipeline", "--forward-s", "inf"], "--forward-s: must be a finite number"),
    (["plan", "--global-batch", "1e308"], "--global-batch"),
    (["shard", "--seq-len", "1e308"], "--seq-len"),
    (["cost", "--price", "inf", "--gpus", "1", "--hours", "1"], "--price: must be a finite number"),
    (["guard", "--hours", "inf", "--ceiling", "inf", "--budget-name", "x", "--gpus", "1", "--price", "1", "--", "true"],
     "--hours: must be a finite number"),
    (["comm", "all-reduce", "--size", "1MB", "--gpus", "8", "--link", ","], "--link ','"),
    (["run", "train", "--nodes", "0"], "--nodes"),
    (["run", "train", "--nodes", "x"], "--nodes"),
    (["run", "train", "--nodes", "2:1"], "MIN 2 is above MAX 1"),
    (["run", "train", "--node-rank", "3", "--nodes", "2"], "--node-rank 3 is outside 0..1"),
    (["run", "train", "--rdzv-endpoint", "host:99999"], "HOST:PORT"),
    (["estimate", "llama-3.1-8b", "--gpus", "8", "--tokens", "0.4"], "rounds to zero"),
    (["memory", "--params", "1e308"], "above the limit"),
    (["cost", "--gpus", "1e308", "--hours", "1", "--price", "1"], "above the limit"),
    (["memory", "llama-2-7b", "--tp", "1048576", "--pp", "1048576"], "above the limit"),
    (["plan", "--gpus", "99999999999999999999"], "above the limit"),
    (["plan", "--nodes", "1048576"], "above the limit"),
    (["pipeline", "--stages", "2", "--microbatches", "100000000"], "above the limit"),
    (["pipeline", "--max-bubble", "1e-30"], "too small to mean anything"),
    (["pipeline", "--max-bubble", "1e-6", "--stages", "64"], "micro-batches (closed form)"),
    (["comm", "inference", "llama-2-7b", "--compute-efficiency", "5e-324"], "too small"),
    (["pipeline", "--forward-s", "5e-324"], "too small"),
    (["pipeline", "--stages", "1000"], "the closed form gives bubble"),
    (["memory", "llama-2-7b", "--micro-batch", "0.5"], "whole number"),
])
def test_hostile_numbers_and_sizes(args, fragment):
    one_line_error(args, fragment)


def test_bounded_work_still_answers_where_it_can():
    code, out, _ = cli_main("pipeline", "--stages", "1000", "--microbatches", "100", "--json")
    assert code == 0 and json.loads(out)["stages"] == 1000
    code, out, _ = cli_main("pipeline", "--schedule", "1f1b", "--stages", "8", "--max-bubble", "0.10", "--json")
    assert code == 0 and json.loads(out)["microbatches"] == 63
    code, out, _ = cli_main("plan", "--gpus", "1048576", "--top", "1", "--json")
    assert code == 0 and json.loads(out)["plans"]


def test_divisors_by_square_root():
    from shardlab.layout_checks import divisors

    assert divisors(1) == [1] and divisors(12) == [1, 2, 3, 4, 6, 12] and divisors(49) == [1, 7, 49]
    assert divisors(4294967291) == [1, 4294967291]            # the largest 32-bit prime: 65,536 trial divisions


def test_json_never_carries_non_finite_numbers(capsys):
    from shardlab.cli import dumps

    text = dumps({"a": float("inf"), "b": [1.0, float("nan")], "c": 2})
    err = capsys.readouterr().err
    assert json.loads(text) == {"a": None, "b": [1.0, None], "c": 2}
    assert "NaN" not in text and "Infinity" not in text and "$.a" in err and "$.b[1]" in err


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("hostile")
    fifo = tmp_path / "fifo.yaml"
    if LINUX:
        os.mkfifo(fifo)
    files = {
        "fifo": fifo, "dir": tmp_path / "dir.yaml", "big": tmp_path / "big.json",
        "latin1": tmp_path / "latin1.yaml", "deep-flow": tmp_path / "deep.json", "deep-block": tmp_path / "deep.yaml",
        "deep-seq": tmp_path / "seq.yaml", "alias": tmp_path / "alias.yaml",
        "quoted-deep": tmp_path / "quoted-deep.yaml", "quoted-flow": tmp_path / "quoted-flow.yaml",
        "quoted-alias": tmp_path / "quoted-alias.yaml", "duplicate": tmp_path / "duplicate.yaml",
    }
    files["dir"].mkdir()
    files["big"].write_bytes(b" " * (2 * 2**20))
    files["latin1"].write_bytes("hidden_size: 4096 # caf\xe9\n".encode("latin-1"))
    files["deep-flow"].write_text("[" * 30000 + "]" * 30000)
    files["deep-block"].write_text("".join(" " * i + f"k{i}:\n" for i in range(1000)))      # 0.5 MB
    files["deep-seq"].write_text("- " * 30000 + "x\n")
    files["alias"].write_text("a: &x [1, 2]\nb: *x\n")
    # a quote inside a plain scalar is not a string in YAML: what follows must still be counted (libyaml's composer
    # recurses per level: 30,000 levels crashed the process; aliases expand)
    files["quoted-deep"].write_text("model_type: llama\nnote: b 'c\nx: " + "[" * 30000 + "]" * 30000 + "\nz: d'\n")
    files["quoted-flow"].write_text("a: [b 'c, " + "[" * 30000 + "]" * 30000 + "]\n")
    files["quoted-alias"].write_text("note: b 'c\nl0: &a0 [x, x]\nl1: [*a0, *a0]\nz: d'\n")
    files["duplicate"].write_text("hidden_size: 4096\nnum_layers: 2\nhidden_size: 8192\n")   # PyYAML keeps the last
    return files


@pytest.mark.skipif(not LINUX, reason="FIFOs and /dev files")
@pytest.mark.parametrize("flag", ["model", "--catalog", "--profile", "--overheads"])
@pytest.mark.parametrize("kind, fragment", [
    ("fifo", "is a FIFO"), ("dir", "is a directory"), ("big", "over the 1,048,576-byte limit"), ("latin1", "not UTF-8"),
    ("deep-flow", "nests about 30001 levels"), ("deep-block", "nests about"), ("deep-seq", "nests about 30001"),
    ("alias", "aliases"), ("/dev/zero", "character device"), ("/dev/urandom", "character device"),
    ("quoted-deep", "nests more than 64 levels"), ("quoted-flow", "nests more than 64 levels"), ("quoted-alias", "aliases"),
    ("duplicate", "line 3: key 'hidden_size' appears twice in one mapping (first at line 1)"),
])
def test_file_arguments_refuse_hostile_files(hostile, flag, kind, fragment):
    path = str(hostile.get(kind, kind))
    args = ["estimate", path, "--gpus", "8"] if flag == "model" else ["estimate", "llama-3.1-8b", "--gpus", "8", flag, path]
    one_line_error(args, fragment)


def test_file_names_too_long_or_with_nul(tmp_path):
    one_line_error(["models", str(tmp_path / ("n" * 300 + ".yaml"))], "longer than the filesystem allows")
    one_line_error(["models", "a\x00b.yaml"], "NUL")
    one_line_error(["gpus", "--catalog", "/" + "d/" * 2100 + "x.yaml"], "longer than the filesystem allows")


@pytest.mark.skipif(not LINUX, reason="FIFOs")
def test_output_paths_refuse_fifos_devices_and_directories(tmp_path):
    fifo = tmp_path / "out.md"
    os.mkfifo(fifo)
    one_line_error(["shard", "llama-3.1-8b", "--mermaid", str(fifo)], "is a FIFO")
    one_line_error(["shard", "llama-3.1-8b", "--mermaid", "/dev/zero"], "character device")
    one_line_error(["shard", "llama-3.1-8b", "--mermaid", str(tmp_path)], "is a directory")
    one_line_error(["shard", "llama-3.1-8b", "--mermaid", str(tmp_path / "no" / "x.md")], "does not exist")
    one_line_error(["pipeline", "--plot", str(tmp_path / "x.png" / "y.png")], "")
    one_line_error(["ledger", "--ledger", str(tmp_path / "l.sqlite"), "--markdown", str(fifo)], "is a FIFO")


def _config(tmp_path, **changes):
    cfg = json.loads((DATA / "llama-2-7b.json").read_text())
    cfg.update(changes)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return str(p)


@pytest.mark.parametrize("changes, fragment", [
    ({"head_dim": -4537}, "'head_dim' must be an integer >= 0"),      # the file's own key names
    ({"intermediate_size": "11008"}, "intermediate_size' must be a positive integer"),
    ({"num_key_value_heads": "32"}, "'num_key_value_heads' must be a positive integer"),
    ({"max_position_embeddings": 4096.5}, "'max_position_embeddings' must be a positive integer"),
    ({"num_hidden_layers": 10**9}, "num_layers 1,000,000,000 is above the limit"),
    ({"hidden_size": 2**40}, "hidden_size"),
])
def test_config_values_are_type_and_range_checked(tmp_path, changes, fragment):
    one_line_error(["estimate", _config(tmp_path, **changes), "--gpus", "8"], fragment)


@pytest.mark.parametrize("text, fragment", [
    ("links:\n  x:\n    name: X\n    bandwidth_gbps: .nan\n    latency_us: 1\n    efficiency: 0.5\n    scope: intra\n"
     "    source: me\n", "must be a finite number"),
    ("links:\n  x:\n    name: X\n    bandwidth_gbps: .inf\n    latency_us: 1\n    efficiency: 0.5\n    scope: intra\n"
     "    source: me\n", "must be a finite number"),
    ("links:\n  x:\n    name: [X]\n    bandwidth_gbps: 1\n    latency_us: 1\n    efficiency: 0.5\n    scope: intra\n"
     "    source: me\n", "must be text"),
    ("prices:\n  h100-sxm:\n    default: {on_demand: .nan, date: 2026-01-01, source: me}\n", "number of USD per GPU-hour"),
    ("prices:\n  h100-sxm:\n    default: {on_demand: 1e-300, date: 2026-01-01, source: me}\n", "from 1e-06"),
    ("profile:\n  gpus_per_node: many\n", "gpus_per_node must be a whole number"),
    ("models:\n  m:\n    family: llama\n    hidden_size: 64\n    num_layers: 2\n    num_heads: 4\n    num_kv_heads: 4\n"
     "    ffn_hidden_size: 128\n    vocab_size: 100\n    max_seq_len: 64\n    qkv_bias: 'yes'\n", "qkv_bias must be true or false"),
])
def test_catalog_values_are_checked(tmp_path, text, fragment):
    p = tmp_path / "cat.yaml"
    p.write_text(text)
    one_line_error(["cost", "--gpus", "1", "--gpu", "h100-sxm", "--hours", "1", "--catalog", str(p)], fragment)


def test_overheads_values_are_checked(tmp_path):
    p = tmp_path / "o.yaml"
    for text, fragment in (("fragmentation: .nan\n", "finite"), ("cuda_context_bytes: -1\n", "zero or more"),
                           ("fragmentation: 5\n", "above the limit")):
        p.write_text(text)
        one_line_error(["memory", "llama-2-7b", "--overheads", str(p)], fragment)


def test_number_parser_rules():
    from shardlab.errors import ShardlabError
    from shardlab.numbers import parse_number

    assert parse_number("1e3", "--x", integer=True) == 1000 and parse_number("1_000", "--x", integer=True) == 1000
    assert parse_number("7.5", "--x", integer=True, scale=1e9, round_to_int=True) == 7_500_000_000
    assert parse_number("0", "--x", allow_min=True) == 0
    for text, kw, msg in (("nan", {}, "finite"), ("-inf", {}, "finite"), ("1e400", {}, "overflows"),
                          ("0.4", {"integer": True}, "whole number"), ("0.4", {"integer": True, "round_to_int": True}, "rounds to zero"),
                          ("0", {}, "positive"), ("-1", {"allow_min": True}, "zero or more"), ("5", {"maximum": 4}, "above the limit"),
                          ("x", {}, "is not a number"), ("", {}, "is not a number")):
        with pytest.raises(ShardlabError, match=msg):
            parse_number(text, "--x", **kw)


def test_one_line_even_when_the_input_has_newlines():
    err = one_line_error(["comm", "all-reduce", "--gpus", "a\nb", "--size", "1MB"], "a\\nb")
    assert "\n" not in err.strip()


def test_launch_warns_when_ranks_outnumber_cores(capsys):
    from shardlab.runtime.launch import warn_oversubscribed

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert warn_oversubscribed(cores + 1, ["--device", "cpu"], {})
    assert "will be meaningless" in capsys.readouterr().err
    assert not warn_oversubscribed(cores, ["--device", "cpu"], {})
    assert not warn_oversubscribed(cores + 1, ["--device", "cuda"], {})


def test_launch_run_folders_are_removed_at_exit(monkeypatch):
    from shardlab.runtime import launch

    monkeypatch.delenv("SHARDLAB_KEEP_RUN_DIR", raising=False)
    d = launch._temp_run_dir()
    assert d.is_dir() and d in launch._TEMP_DIRS
    monkeypatch.setenv("SHARDLAB_KEEP_RUN_DIR", "1")
    kept = launch._temp_run_dir()
    assert kept not in launch._TEMP_DIRS
    kept.rmdir()


def test_findings_of_the_fuzz_campaign(tmp_path):
    """What benchmarks/fuzz_cli.py found in other commands, kept fixed."""
    answers = tmp_path / "answers.txt"
    answers.write_text("1e400\nnan\n")
    code, out, _ = cli_main("quiz", "--questions", "2", "--seed", "1", "--answers", str(answers))
    assert code == 1 and "too large to be an answer" in out + " " and " inf" not in out   # 0/2: below the pass mark
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 1, "bf16": 1}))
    one_line_error(["memory", "--from", str(ds)], "deepspeed config has a field of the wrong type")
    one_line_error(["validate", "--refit", "--plot", "/dev/full"], "cannot save a picture")


@pytest.mark.parametrize("path, value, fragment", [
    (("step_time", "measured_median_s"), True, "must be a number"),
    (("step_time", "measured_median_s"), "inf", "must be a number"),
    (("step_time", "measured_median_s"), 1e-300, "too small"),
    (("workload",), [1], "workload must be an object"),
    (("workload", "seq_len"), "64", "must be a whole number"),
    (("workload", "seq_len"), 10**30, "above the limit"),
    (("model_ref",), 5, "model_ref cannot be read"),
])
def test_calibrate_from_a_tampered_run_is_one_line(tmp_path, path, value, fragment):
    """`calibrate --from-run` on a `run train --json` document edited by hand: one line naming the field, exit 2."""
    import copy
    from pathlib import Path

    doc = json.loads((Path(__file__).parent / "data" / "run_train_fsdp_tp.json").read_text())
    doc["model_ref"] = "tiny"                      # the field `run train --json` writes since calibrate --from-run
    code, _, err = cli_main("calibrate", "--from-run", _write(tmp_path / "ok.json", doc), "--out", str(tmp_path / "ok.yaml"))
    assert code == 0, err                          # the untouched document is accepted
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    one_line_error(["calibrate", "--from-run", _write(tmp_path / "run.json", doc), "--out", str(tmp_path / "fw.yaml")],
                   fragment)


def _write(path, doc) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.mark.parametrize("field, value, fragment", [
    ("framework", 5, "framework must be a name"), ("gpus_per_node", "8", "gpus_per_node must be 1 to"),
    ("gpus_per_node", -8, "gpus_per_node must be 1 to"),
    ("model", 7, "not a `shardlab plan --json` document"), ("workload.seq_len", 10**400, "above the limit"),
    ("workload.global_batch", 0, "positive whole number"), ("workload.precision", ["x"], "are not shardlab's"),
    ("workload.precision", "fp4", "are not shardlab's"), ("workload.optimizer", "lion", "are not shardlab's"),
    ("workload.global_batch", 1023, "not a whole number of micro-batch × dp"),
    ("plans.0.layout.ep", 2, "needs a mixture-of-experts model"), ("plans.0.layout.vpp", 1000, "--vpp > 1 needs --pp > 1"),
])
def test_export_of_a_tampered_plan_is_one_line(tmp_path, field, value, fragment):
    bad = _tampered_plan(tmp_path, ("llama-3.1-8b", "--gpus", "8", "--top", "1"), field, value)
    one_line_error(["export", "--to", "megatron", "--plan", str(bad)], fragment)


def _tampered_plan(tmp_path, plan_args, field: str, value):
    """A `plan --json` file with one field (dotted path, list indexes as digits) set to ``value``."""
    code, out, err = cli_main("plan", *plan_args, "--json")
    assert code == 0, err
    doc = json.loads(out)
    *head, last = field.split(".")
    node = doc
    for key in head:
        node = node[int(key) if key.isdigit() else key]
    node[last] = value
    bad = tmp_path / "plan.json"
    bad.write_text(json.dumps(doc))
    return bad


@pytest.mark.parametrize("field, value, fragment", [
    ("plans.0.replicas", 0, "plans[0].replicas must be"), ("plans.0.tp", 0, "tp must be a positive whole number"),
    ("batch", -32, "batch must be a positive whole number"), ("serving.weights", "fp2", "are not shardlab settings"),
    ("serving.gpu_memory_utilization", 1.5, "must be in (0, 1]"),
])
def test_export_of_a_tampered_serving_plan_is_one_line(tmp_path, field, value, fragment):
    bad = _tampered_plan(tmp_path, ("llama-3.1-8b", "--inference", "--gpus", "2"), field, value)
    one_line_error(["export", "--to", "vllm", "--plan", str(bad)], fragment)


@pytest.mark.parametrize("field, value, fragment", [
    ("tie_word_embeddings", "false", "must be true or false"), ("model_type", ["llama"], "model_type must be text"),
    ("architectures", [["x"]], "no model_type"),
])
def test_hf_config_fields_of_the_wrong_type_are_one_line(tmp_path, field, value, fragment):
    """A string "false" is not read as true (it would count the head twice); unhashable names do not crash."""
    from pathlib import Path

    doc = json.loads((Path(__file__).parent / "data" / "llama-2-7b.json").read_text())
    doc[field] = value
    if field == "architectures":
        doc.pop("model_type", None)
    one_line_error(["models", _write(tmp_path / "config.json", doc)], fragment)


@pytest.mark.parametrize("moe_field, fragment", [("shared_expert_ffn_hidden_size: -1000000", "must be zero or more"),
                                                 ("shared_expert_ffn_hidden_size: 1000000000000000000000000000000",
                                                  "above the limit"),
                                                 ("shared_expert_gate: 'x'", "must be true or false")])
def test_every_model_field_is_checked_by_its_type(tmp_path, moe_field, fragment):
    f = tmp_path / "moe.yaml"
    f.write_text("family: qwen2-moe\nhidden_size: 64\nnum_layers: 2\nnum_heads: 4\nnum_kv_heads: 4\nffn_hidden_size: 128\n"
                 "vocab_size: 100\nmax_seq_len: 128\nmoe: {num_experts: 4, top_k: 2, expert_ffn_hidden_size: 32, "
                 f"{moe_field}}}\n")
    one_line_error(["models", str(f)], fragment)


def test_conflicting_or_ignored_flags_are_refused_not_dropped():
    one_line_error(["plan", "llama-3.1-8b", "--gpus", "8", "--fix", "tp=8", "--tp", "2"], "disagree")
    one_line_error(["plan", "llama-3.1-8b", "--gpus", "8", "--fix", "tp=8", "--fix", "tp=2"], "pin each axis once")
    one_line_error(["plan", "llama-3.1-8b", "--gpus", "8", "--dp", "4"], "--dp")
    one_line_error(["estimate", "llama-3.1-8b", "--serve"], "add --inference")
    one_line_error(["plan", "llama-3.1-8b", "--gpus", "8", "--ttft-slo", "0.5"], "add --inference")
    code, out, err = cli_main("plan", "llama-3.1-8b", "--gpus", "8", "--tp", "2", "--top", "2", "--json")
    assert code == 0, err                           # a layout flag on plan pins its axis, as --fix does
    assert {p["layout"]["tp"] for p in json.loads(out)["plans"]} == {2}
    for flags, key, value in ((["--tp", "1"], "tp", 1), (["--zero", "0"], "zero", 0),   # defaults pin too when written
                              (["--recompute", "none"], "recompute", "none")):
        code, out, err = cli_main("plan", "llama-3.1-70b", "--gpus", "64", *flags, "--top", "3", "--json")
        assert code == 0, err
        assert {p["layout"][key] for p in json.loads(out)["plans"]} == {value}, flags
    for flags in (["--wrap", "model"], ["--recompute-fraction", "0.5"], ["--dp-replicate", "8"]):
        one_line_error(["plan", "llama-3.1-8b", "--gpus", "64", *flags], flags[0], "shardlab estimate")
    one_line_error(["plan", "llama-3.1-8b", "--gpus", "64", "--fix", "hs=2"], "hs is 0")


@pytest.mark.skipif(not LINUX or not os.path.exists("/dev/full"), reason="/dev/full")
def test_a_full_or_closed_stdout_is_one_line_exit_2():
    import subprocess
    import sys

    for redirect in ("> /dev/full", ">&-"):
        r = subprocess.run(f"{sys.executable} -m shardlab models {redirect}", shell=True, capture_output=True, text=True,
                           timeout=60, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert r.stderr.strip().count("\n") == 0 and "could not write the output" in r.stderr


def test_a_key_written_twice_is_refused_not_overwritten(tmp_path):
    """YAML and JSON loaders keep the last of two equal keys; shardlab refuses the file and names both lines."""
    code, out, err = cli_main("plan", "llama-3.1-8b", "--gpus", "8", "--top", "1", "--json")
    assert code == 0, err
    dup = tmp_path / "plan.json"
    dup.write_text(out.replace('"framework":', '"framework": "x", "framework":', 1))
    one_line_error(["export", "--to", "megatron", "--plan", str(dup)], "key 'framework' appears twice in one object")
    cat = tmp_path / "cat.yaml"
    cat.write_text("accelerators:\n  my-gpu: {peak_tflops: 100, peak_tflops: 200}\n")
    one_line_error(["gpus", "--catalog", str(cat)], "line 2: key 'peak_tflops' appears twice")
    acc = tmp_path / "accelerate.yaml"
    acc.write_text("distributed_type: FSDP\nnum_processes: 8\nnum_processes: 16\n")
    one_line_error(["estimate", "--from", str(acc), "llama-3.1-8b"], "key 'num_processes' appears twice")
    ok = tmp_path / "nested.yaml"                  # the same key in two different mappings is fine
    ok.write_text("models:\n  a: {hidden_size: 64}\n  b: {hidden_size: 64}\n")
    assert "appears twice" not in cli_main("models", "--catalog", str(ok))[2]
    ds = tmp_path / "ds_config.json"               # DeepSpeed's own reader refuses duplicate keys too
    ds.write_text('{"train_batch_size": 8, "train_batch_size": 16}')
    one_line_error(["estimate", "--from", str(ds), "llama-3.1-8b"], "key 'train_batch_size' appears twice")


@pytest.mark.parametrize("args, fragment", [
    (["estimate", "no-such-model", "--json"], "unknown model"),                 # the command's own error
    (["estimate", "llama-3.1-8b", "--gpus", "x", "--json"], "--gpus"),          # argparse's
    (["cost", "--gpus", "1", "--hours", "1", "--price", "nan", "--json"], "--price"),
])
def test_errors_under_json_are_one_document_on_stdout_too(args, fragment):
    """With --json a program reading stdout always gets one JSON document: an error is {"error", "exit_code"},
    the same line as on stderr."""
    code, out, err = cli_main(*args)
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1
    doc = json.loads(out)
    assert doc == {"error": err.strip()[len("error: "):], "exit_code": 2} and fragment in doc["error"]
    code, out, err = cli_main(*[a for a in args if a != "--json"])
    assert code == 2 and out == ""                                             # without --json stdout stays empty


def test_a_bad_catalog_is_refused_by_commands_that_read_none():
    # bench collectives prices nothing from the catalog; a broken --catalog still gets its one line, before launch
    one_line_error(["bench", "collectives", "--nproc-per-node", "2", "--catalog", "/dev/zero"], "character device")
    one_line_error(["run", "train", "--timeout", "99999999"], "99,999,999", "604,800 (a week)")


def test_an_unknown_flag_points_to_its_subcommands_help():
    one_line_error(["run", "infer", "--nproc-per-node", "2"], "--nproc-per-node 2", "see `shardlab run infer --help`")
    one_line_error(["plan", "llama-3.1-8b", "--gpus", "8", "--bogus"], "see `shardlab plan --help`")


@pytest.mark.parametrize("fix, words", [
    ("tp=0", "tp is a whole number from 1"), ("pp=0", "pp is a whole number from 1"), ("mb=0", "mb is a whole number"),
    ("rc=7", "rc is one of 0, 1, 2"), ("sp=2", "sp is one of 0, 1"), ("vpp=16", "vpp is one of 1, 2, 4, 8"),
    ("zero=4", "zero is one of 0, 1, 2, 3"), ("ep=0", "ep is a whole number from 1"),
])
def test_plan_fix_values_outside_the_search_are_refused(fix, words):
    # tp=0 and pp=0 were ZeroDivisionError tracebacks; mb=0 said "NO LAYOUT FITS"; sp=2 was read as on
    err = one_line_error(["plan", "--fix", fix], words)
    assert "Warning" not in err


@pytest.mark.parametrize("args, words", [
    (["comm", "all-reduce", "--size", "0", "--gpus", "8"], "0 bytes sends nothing"),
    (["pipeline", "--stages", "4", "--slowdown", "2"], "--slowdown needs --slow-stage"),
    (["pipeline", "--stages", "4", "--slow-stage", "2", "--slowdown", "0.5"], "a straggler runs slower"),
])
def test_comm_and_pipeline_inputs_that_mean_nothing(args, words):
    one_line_error(args, words)


@pytest.mark.parametrize("args, words", [
    (["memory", "gpt3-175b", "--gpus", "1024", "--tp", "8", "--pp", "16", "--seq-len", "8192"], "2,048 learned positions"),
    (["comm", "plan", "gpt3-175b", "--gpus", "1024", "--tp", "8", "--pp", "16", "--seq-len", "8192"],
     "2,048 learned positions"),
    (["plan", "llama-3.1-8b", "--gpus", "8", "--vpp", "3"], "--vpp 3: plan searches vpp in 1, 2, 4, 8"),
    (["shard", "llama-3.1-8b", "--tp", "8", "--sequence-parallel", "--seq-len", "4100"], "does not divide them"),
])
def test_every_command_applies_the_same_sequence_and_layout_rules(args, words):
    one_line_error(args, words)


def test_zero_bubble_with_chunks_per_rank_still_exports_to_torchtitan(tmp_path):
    code, out, err = cli_main("export", "llama-3.1-8b", "--gpus", "16", "--pp", "4", "--dp", "4", "--zero", "3",
                              "--schedule", "zb-h1", "--vpp", "2", "--global-batch", "64", "--to", "torchtitan",
                              "--out", str(tmp_path / "tt.toml"))
    assert code == 0 and "InterleavedZeroBubble" in (tmp_path / "tt.toml").read_text(), err


def test_memory_notes_a_sequence_beyond_rope_positions():
    code, out, err = cli_main("memory", "llama-3.1-8b", "--seq-len", "200000", "--tp", "8", "--cp", "8", "--gpus", "64",
                              "--json")
    assert code == 0 and any("beyond llama-3.1-8b's 131,072 positions" in n for n in json.loads(out)["notes"]), err
