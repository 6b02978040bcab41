"""Regression tests for the second adversarial review: paths with an unknown ~user, bytes that are not UTF-8
on their way to SQLite or a strict stdout, hand-edited process ids, work that grew past its input (a pipeline
picture, a list of links, padded logs), control characters echoed in error lines, and misleading messages.
Each case: exit code 2 and one line naming the problem and the fix (never a traceback)."""

import json
import sqlite3
import subprocess
import sys

import pytest

from conftest import DATA, cli_main
from test_reliability_inputs import one_line_error


@pytest.mark.parametrize("var, value, fragment", [
    ("SHARDLAB_LEDGER", "~shardlab_nouser/x.sqlite", "$SHARDLAB_LEDGER '~shardlab_nouser/x.sqlite' starts with a ~"),
    ("XDG_DATA_HOME", "~shardlab_nobody", "$XDG_DATA_HOME '~shardlab_nobody' starts with a ~ that names no user"),
])
def test_a_tilde_naming_no_user_is_one_line(monkeypatch, var, value, fragment):
    monkeypatch.delenv("SHARDLAB_LEDGER", raising=False)
    monkeypatch.setenv(var, value)
    one_line_error(["ledger"], fragment, "write the full path")
    one_line_error(["ledger", "--ledger", "~shardlab_nouser/l.sqlite"], "--ledger '~shardlab_nouser/l.sqlite'")


def test_bytes_that_are_not_utf8_reach_the_ledger_escaped(tmp_path):
    """A command argument and a working folder named in Latin-1 are recorded as \\xe9 escapes; a budget name that is
    not UTF-8 is refused. Run as a real process: the arguments arrive as bytes, as a shell passes them."""
    led = tmp_path / "l.sqlite"
    folder = tmp_path / "caf\udce9"          # the bytes b"caf\xe9" as Python names them
    folder.mkdir()
    r = subprocess.run([sys.executable, "-m", "shardlab", "ledger", "--ledger", str(led), "--budget-name", "\udcff\udcfe"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--budget-name must be a short name" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "shardlab", "guard", "--ledger", str(led), "--budget-name", "b",
                        "--ceiling", "5", "--gpus", "1", "--price", "1", "--hours", "1", "--", "echo", "\udcff"],
                       capture_output=True, text=True, errors="replace", timeout=60, cwd=folder)
    assert r.returncode == 0, r.stderr
    code, out, err = cli_main("ledger", "--ledger", str(led), "--json")
    run, = json.loads(out)["runs"]
    assert run["command"] == "echo '\\xff'" and run["cwd"].endswith("caf\\xe9"), run


@pytest.mark.parametrize("pid", [2**62, -1, 0])
def test_a_hand_edited_guard_pid_is_named(tmp_path, pid):
    from shardlab.ledger import Ledger, RunRequest

    path = tmp_path / "l.sqlite"
    with Ledger(path) as led:
        led.reserve(RunRequest(budget="b", ceiling_usd=10.0, command="x", shell=False, gpus=1, gpu="gpu",
                               price_per_gpu_hour=1.0, price_source="--price", hours=1.0, grace_s=1.0))
    con = sqlite3.connect(path)
    con.execute("UPDATE runs SET guard_pid = ? WHERE id = 1", (pid,))    # a 'running' row: recovery would probe it
    con.commit()
    con.close()
    one_line_error(["ledger", "--ledger", str(path)], "run 1 has an invalid guard_pid")


def test_a_strict_utf8_stdout_gets_escapes_not_a_crash(tmp_path):
    model = tmp_path / "m\udce9.json"
    model.write_bytes((DATA / "gpt2.json").read_bytes())
    r = subprocess.run([sys.executable, "-m", "shardlab", "models", str(model)], capture_output=True, text=True,
                       timeout=60, env={**__import__("os").environ, "PYTHONIOENCODING": "utf-8"})
    assert r.returncode == 0 and "m\\udce9" in r.stdout and "Traceback" not in r.stderr, r.stderr


def test_pipeline_plot_is_bounded(tmp_path):
    pic = tmp_path / "pp.svg"
    one_line_error(["pipeline", "--stages", "600", "--microbatches", "330", "--plot", str(pic)],
                   "--plot draws one box per pass", "396,000, over the 20,000")
    assert not pic.exists()


@pytest.mark.parametrize("links, fragment", [
    (",".join(["nvlink4"] * 21_000), "--link names 21,000 links; give at most 16"),
    ("nvlink4,pcie5,nvlink4", "--link names link 'nvlink4' twice"),
])
def test_link_lists_are_bounded_and_unique(links, fragment):
    one_line_error(["comm", "all-gather", "--gpus", "8", "--sweep", "--link", links], fragment)


def test_logs_padded_with_blank_lines_parse_fast_and_long_logs_are_refused(tmp_path):
    import time

    padded = tmp_path / "padded.log"
    padded.write_bytes(b"\n" * (16 * 2**20) + (DATA / "logs" / "torchrun-gloo-ddp-2ranks.log").read_bytes())
    t0 = time.perf_counter()
    code, out, err = cli_main("logs", str(padded), "--json")
    assert code == 0, err
    assert time.perf_counter() - t0 < 20 and json.loads(out)["torchrun"], "16 MiB of blank lines must cost little"
    long = tmp_path / "long.log"
    long.write_bytes(b"x\n" * 500_001)
    one_line_error(["logs", str(long)], "more than 500,000 lines")
    big = tmp_path / "big.log"
    big.write_bytes(b"x " * (20 * 2**20))
    one_line_error(["logs", str(big), str(big)], "more than 64 MiB in all")


def test_control_characters_in_echoed_text_are_escaped():
    err = one_line_error(["plan", "bad\x1b[31mred\u2028x\u202e"], "bad\\x1b[31mred\\u2028x\\u202e")
    assert "\x1b" not in err and "\u2028" not in err and "\u202e" not in err


def test_an_abbreviated_json_flag_still_gets_the_error_document():
    code, out, err = cli_main("plan", "--gpus", "abc", "--js")
    assert code == 2 and json.loads(out)["exit_code"] == 2


@pytest.mark.parametrize("args, fragment", [
    (["comm"], "choose what to price: a collective"),
    (["run"], "choose what to run: train, infer or precision"),
    (["validate", "--run", ""], "--run needs a run id"),
    (["validate", "--run", "zero3-175b-384", "--framework", "torchtitan"], "--framework goes with the whole set"),
    (["validate", "--run", "zero3-175b-384", "--refit"], "--refit goes with the whole set"),
    (["plan", "--fix", "tp=\u0662"], "--fix tp=\u0662: use AXIS=VALUE"),          # Arabic-Indic two
    (["plan", "--fix", "tp=\u00b2"], "--fix tp=\u00b2: use AXIS=VALUE"),          # superscript two
    (["plan", "--gpus", "\u0668"], "is not a whole number"),
])
def test_missing_subcommands_and_odd_values_are_refused(args, fragment):
    one_line_error(args, fragment)


def test_a_one_gpu_plan_that_does_not_fit_says_memory_not_redundancy():
    code, out, err = cli_main("plan", "llama-3.1-8b", "--gpus", "1", "--gpu", "l4")
    assert code == 0 and "NO LAYOUT FITS" in out and "does not fit in GPU memory" in out, (out, err)


def test_a_file_model_is_exported_from_its_file_not_its_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bom.json").write_bytes((DATA / "llama-3.1-8b.json").read_bytes())
    code, out, err = cli_main("export", "bom.json", "--to", "megatron", "--gpus", "8", "--json")
    assert code == 0, err
    code, out, err = cli_main("plan", "bom.json", "--gpus", "8", "--json")
    assert code == 0 and json.loads(out)["model_ref"] == str(tmp_path / "bom.json"), err
    (tmp_path / "p.json").write_text(out)
    code, _, err = cli_main("export", "--plan", "p.json", "--to", "deepspeed", "--out", "ds.json")
    assert code == 0 and "unknown model" not in err, err
    code, _, err = cli_main("plan", "bom.json", "--gpus", "8", "--export", "megatron", "--out", "m.sh")
    assert code == 0, err


def test_a_mpt_flag_must_be_true_or_false(tmp_path):
    cfg = {"model_type": "mpt", "d_model": 512, "n_heads": 8, "n_layers": 2, "expansion_ratio": 4, "max_seq_len": 512,
           "vocab_size": 1000, "no_bias": "no"}
    (tmp_path / "mpt.json").write_text(json.dumps(cfg))
    one_line_error(["models", str(tmp_path / "mpt.json")], "'no_bias' must be true or false, got 'no'")


def test_hf_home_that_is_a_file_is_named_as_the_cache(tmp_path):
    """In a child process: huggingface_hub reads HF_HOME once, at import, and keeps it for the whole process."""
    import os

    pytest.importorskip("huggingface_hub")
    not_a_folder = tmp_path / "hf"
    not_a_folder.write_text("x")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_CACHE"}
    env.update(HF_HOME=str(not_a_folder), HF_HUB_OFFLINE="1")
    r = subprocess.run([sys.executable, "-m", "shardlab", "models", "hf:org/name"], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 2 and "cache" in r.stderr and "set HF_HUB_OFFLINE=1" not in r.stderr, r.stderr


def test_a_pipeline_too_long_to_simulate_is_priced_by_its_closed_form(tmp_path):
    """A large global batch through 8 stages: 40,000 micro-batches, 640,000 passes, past the simulation's limit.
    plan and estimate (and their page) give the closed-form bubble instead of refusing the layout."""
    code, out, err = cli_main("plan", "llama-3.1-8b", "--gpus", "16", "--global-batch", "160000", "--fix", "pp=8",
                              "--json")
    assert code == 0, err
    pipe = json.loads(out)["detail"]["pipeline"]
    assert pipe["simulated"] is False and pipe["bubble_fraction_closed_form"] < 1e-3 and "7/40007" in pipe["closed_form"]
    page = tmp_path / "e.html"
    code, out, err = cli_main("estimate", "llama-3.1-8b", "--gpus", "16", "--pp", "8", "--global-batch", "160000",
                              "--html", str(page))
    assert code == 0, err
    assert "by the closed form" in page.read_text(encoding="utf-8")


def test_the_cost_objective_searches_a_bounded_spread_of_world_sizes():
    from shardlab.layout_checks import divisors
    from shardlab.limits import MAX_COST_WORLDS
    from shardlab.planner.search import _spread

    every = [d for d in divisors(720_720) if d % 8 == 0 or 8 % d == 0]      # 99 sizes
    some = _spread(every)
    assert len(some) <= MAX_COST_WORLDS and some[-1] == 720_720 and some[0] == 1 and set(some) <= set(every)
    ratios = [b / a for a, b in zip(some, some[1:])]
    assert max(ratios) < 4, ratios                                        # spread, not bunched at one end
    small = [d for d in divisors(3072) if d % 8 == 0 or 8 % d == 0]
    assert _spread(small) == small                                        # real clusters: every size


def test_plan_export_when_nothing_fits_says_so(tmp_path):
    out = tmp_path / "x.sh"
    one_line_error(["plan", "llama-3.1-8b", "--gpus", "1", "--gpu", "l4", "--export", "megatron", "--out", str(out)],
                   "no layout fits, so --export megatron wrote nothing")
    assert not out.exists()


def test_report_draws_serving_under_load(tmp_path):
    out = tmp_path / "serve.html"
    code, _, err = cli_main("report", str(out), "llama-3.1-8b", "--inference", "--serve", "--concurrency", "8", "--tp", "2")
    assert code == 0, err
    assert "Steady state (continuous batching)" in out.read_text(encoding="utf-8")


def test_the_3d_layout_map_is_for_small_grids():
    one_line_error(["explain", "3d-layout", "gpus=1048576"], "3d-layout draws one row per GPU: at most 1,024")


@pytest.mark.parametrize("args, fragment", [
    (["validate", "--plot", ""], "--plot: the file name is empty; give a path"),
    (["pipeline", "--stages", "4", "--microbatches", "8", "--plot", " "], "--plot: the file name is empty"),
    (["validate", "--run", "zero3-175b-384", "--model-out", ""], "--model-out: the file name is empty"),
])
def test_an_empty_output_name_is_refused(args, fragment):
    one_line_error(args, fragment)


def test_two_outputs_into_one_file_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    one_line_error(["plan", "llama-3.1-8b", "--gpus", "8", "--export", "deepspeed", "--out", "same.html",
                    "--html", "same.html"], "--out and --html both name same.html")
    assert not (tmp_path / "same.html").exists()
    (tmp_path / "gpt2.json").write_bytes((DATA / "gpt2.json").read_bytes())
    (tmp_path / "link.html").symlink_to("gpt2.json")
    one_line_error(["report", "link.html", "gpt2.json", "--gpus", "2", "--tp", "2"],
                   "OUT.html link.html is the file this command reads as the model")
    assert (tmp_path / "gpt2.json").read_bytes() == (DATA / "gpt2.json").read_bytes()


@pytest.mark.parametrize("args, fragment", [
    (["plan", "llama-3.1-8b", "--inference", "--gpus", "8", "--cp", "2", "--zero", "3", "--recompute", "full"],
     "--cp, --zero, --recompute describe(s) training"),
    (["estimate", "llama-3.1-8b", "--inference", "--tp", "2", "--seq-len", "4096", "--microbatches", "4"],
     "--microbatches, --seq-len describe(s) training"),
    (["estimate", "llama-3.1-8b", "--inference", "--tp", "2", "--recompute", "none"], "--recompute describe(s) training"),
])
def test_training_flags_are_refused_under_inference_not_ignored(args, fragment):
    one_line_error(args, fragment)


def test_quiz_answers_with_decimals_are_not_read_as_numbered_lines(tmp_path):
    code, out, err = cli_main("quiz", "--topic", "interleaving", "--questions", "3", "--seed", "1", "--json")
    assert code == 0, err
    key = [q["answer"] for q in json.loads(out)["questions"]]
    plain = tmp_path / "key.txt"
    plain.write_text("\n".join(f"{a:g}" for a in key) + "\n")
    numbered = tmp_path / "key2.txt"
    numbered.write_text("".join(f"{i}. {a:g}\n" for i, a in enumerate(key, 1)))
    for f in (plain, numbered):
        code, out, err = cli_main("quiz", "--topic", "interleaving", "--questions", "3", "--seed", "1", "--answers", str(f))
        assert code == 0 and "100%" in out, (out, err)


def test_a_decimal_comma_is_not_read_as_thousands():
    from shardlab.teach.quiz import Question
    from shardlab.teach.quiz_run import check

    q = Question.__new__(Question)
    object.__setattr__(q, "kind", "number")
    object.__setattr__(q, "answer", 17.95)
    object.__setattr__(q, "tolerance", 0.01)
    assert check(q, "17,95") == (False, "'17,95' is ambiguous: write decimals with a point (17.95) and group thousands "
                                        "as 1,024")
    assert check(q, "17.95")[0]
    object.__setattr__(q, "answer", 1024.0)
    assert check(q, "1,024")[0]


@pytest.mark.parametrize("body, fragment", [
    ('accelerators:\n  evil-gpu:\n    name: "Evil \\e[2J\\e]0;pwned\\a GPU"\n', "field 'name' holds control characters"),
    ('links:\n  "a\\e[31m": {}\n', "has the id 'a\\x1b[31m'; an id is 1-64 letters"),
    ('links:\n  "": {}\n', "has the id ''"),
    ('links:\n  null: {}\n', "has the id 'None'"),
])
def test_catalog_ids_and_names_cannot_carry_terminal_escapes(tmp_path, body, fragment):
    cat = tmp_path / "esc.yaml"
    if "evil-gpu" in body:                 # a complete entry but for the name
        h100 = ("    vendor: nvidia\n    generation: hopper\n    peak_tflops: {fp32: 67, tf32: 495, bf16: 989, fp16: 989, "
                "fp8: 1979, int8: 1979, int4: null}\n    memory_gib: 80\n    memory_bandwidth_gbps: 3350\n"
                "    scale_up_link: nvlink4\n    host_link: pcie5\n    tdp_w: 700\n"
                "    system: {gpus_per_node: 8, intra_link: nvlink4, inter_link: ib-ndr}\n    source: s\n")
        body += h100
    cat.write_text(body)
    err = one_line_error(["gpus", "--catalog", str(cat)], fragment)
    assert "\x1b" not in err


def test_export_refuses_a_broken_price_section_as_cost_does(tmp_path):
    cat = tmp_path / "badprice.yaml"
    cat.write_text('prices:\n  h100-sxm:\n    default:\n      on_demand: .nan\n      date: "2026"\n      source: x\n')
    one_line_error(["export", "llama-3.1-8b", "--to", "skypilot", "--gpus", "8", "--zero", "3", "--catalog", str(cat)],
                   "field 'on_demand' must be a number of USD per GPU-hour")


def test_lora_rank_is_bounded_by_the_adapted_weights_and_its_activations_add_up():
    one_line_error(["memory", "llama-3.1-8b", "--gpus", "1", "--lora-rank", "100000"],
                   "--lora-rank 100,000 is above the rank of every adapted weight (min(in, out) is at most 4,096)")
    code, out, err = cli_main("memory", "llama-3.1-8b", "--gpus", "1", "--lora-rank", "16", "--json")
    assert code == 0, err
    doc = json.loads(out)
    line = doc["explain"]["activations"]
    import re

    def gib(text):
        v, unit = re.match(r"([\d.,]+) (GiB|MiB|KiB)", text).groups()
        return float(v.replace(",", "")) * {"GiB": 1, "MiB": 2**-10, "KiB": 2**-20}[unit]
    terms = [gib(t) for t in re.findall(r"= ([\d.,]+ (?:GiB|MiB)) \+", line)]
    terms += [gib(t) for t in re.findall(r"(?:inputs|intermediates) ([\d.,]+ (?:GiB|MiB))", line)]
    total = gib(line.rsplit("= ", 1)[1])
    assert "LoRA adapters' r-wide intermediates" in line and abs(sum(terms) - total) < 0.011, (terms, total, line)
