"""`shardlab run train|infer` without launching: lazy imports, one-line errors with the fix, exit codes."""

import json
import subprocess
import sys

import pytest

from conftest import cli_main
from shardlab.errors import ShardlabError


def test_cli_registration_does_not_import_torch():
    code = "import sys; from shardlab.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "False"


def test_missing_torch_is_a_one_line_error_with_the_install_command():
    code = ("import sys; sys.modules['torch'] = None\n"
            "from shardlab.cli import main\n"
            "sys.exit(main(['run', 'train', '--strategy', 'ddp']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "pip install torch==2.13.0" in r.stderr
    assert "shardlab[runtime]" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("args,match", [
    (["run", "train", "--strategy", "zero3"], "parts are"),
    (["run", "train", "--strategy", "tp", "--nproc-per-node", "3"], "KV heads"),
    (["run", "train", "--strategy", "ddp", "--global-batch", "3"], "not divisible"),
    (["run", "train", "--model", "no-such-model"], "unknown model"),
    (["run", "train", "--rdzv-id", "job"], "--rdzv-endpoint"),
    (["run", "train", "--nodes", "2"], "--nodes 2 needs --rdzv-endpoint HOST:PORT"),
    (["run", "train", "--nodes", "1:2"], "--nodes 1:2 needs --rdzv-endpoint HOST:PORT"),
    (["run", "train", "--nodes", "2", "--rdzv-endpoint", "127.0.0.1:29500"], "a multi-node job needs --rdzv-id ID"),
    (["run", "train", "--strategy", "ddp+ep"], "tiny has none; use a mixture-of-experts model"),
    (["run", "train", "--strategy", "ddp+ep", "--nproc-per-node", "3", "--global-batch", "6", "--model", "tiny-moe"],
     "--ep 3 must divide tiny-moe's 4 experts"),
    (["run", "infer", "--tp", "3"], "--tp 3"),
    (["run", "infer", "--prompt", ""], "--prompt is empty"),
])
def test_bad_input_exits_2_with_one_line(args, match):
    pytest.importorskip("torch")
    code, out, err = cli_main(*args)
    assert code == 2 and match in err and len(err.strip().splitlines()) == 1 and out == ""


def _fake_launch(steps_done: int, signum: int):
    """A `launch` that leaves what a real job leaves in its run folder after `steps_done` steps (per-step records,
    heartbeats), then is interrupted as launch is (the job stopped, the run folder attached to the interrupt)."""
    def launch(module, nproc, args, *, timeout_s, torchrun_args=None, observer=None, **kw):
        import json as _json

        from shardlab.interrupts import Interrupted
        from shardlab.runtime.launch import _temp_run_dir

        rd = _temp_run_dir()
        for r in range(nproc):
            recs = [{"step": k, "rank": r, "step_s": 0.1, "wait_s": 0.01 * r, "data_s": 0.0, "compute_s": 0.08,
                     "blocked_s": 0.02, "coll_s": 0.02, "coll_calls": 2, "coll_bytes": 64, "injected_s": 0.0,
                     "loss": 1.0, "time": 1.0 + k} for k in range(steps_done)]
            (rd / f"rank{r}.steps.jsonl").write_text("".join(_json.dumps(x) + "\n" for x in recs) + '{"step": 9, "ra')
            (rd / f"rank{r}.heartbeat.json").write_text(_json.dumps({"rank": r, "seq": 9, "phase": f"step {steps_done} "
                                                                     "forward/backward", "time": 1.0}))
        e = Interrupted(signum)
        e.run_dir = rd
        raise e
    return launch


def _one_json_document(text: str) -> dict:
    def no_constant(name):
        raise AssertionError(f"{name} in the JSON")
    return json.loads(text, parse_constant=no_constant)      # one document, all of stdout, strict JSON


@pytest.mark.parametrize("cmd, signum, unit", [
    (["run", "train", "--strategy", "ddp", "--nproc-per-node", "2", "--steps", "50"], 2, "step"),
    (["run", "infer", "--tp", "2", "--max-new-tokens", "50"], 15, "token"),
])
def test_an_interrupted_run_prints_one_json_document(tmp_path, monkeypatch, cmd, signum, unit):
    """Ctrl-C or SIGTERM while the job runs: under --json still one document (interrupted, the steps every rank
    recorded, where the records are), the stderr line and the exit code 128 + signal as before."""
    pytest.importorskip("torch")
    from shardlab.runtime import launch

    monkeypatch.setattr(launch, "launch", _fake_launch(7, signum))
    series = tmp_path / "s.jsonl"
    code, out, err = cli_main(*cmd, "--no-metrics", "--steps-jsonl", str(series), "--json")
    assert code == 128 + signum and err.strip().splitlines() == [f"interrupted ({'SIGINT' if signum == 2 else 'SIGTERM'}): "
                                                                 "stopped"], err
    d = _one_json_document(out)
    assert d["interrupted"] is True and d["exit_code"] == code and d["command"] == " ".join(cmd[:2])
    p = d["progress"]
    assert p["unit"] == unit and p["planned"] == 50 and p["finished"] == 7 and not p["job_finished"]
    assert [r["last_phase"] for r in p["ranks"]] == ["step 7 forward/backward"] * 2
    assert set(p["time_split"]) == {"0", "1"}                       # the recorded steps past the instrumented ones
    assert p["logs"]["steps_jsonl"] == str(series) and len(series.read_text().splitlines()) == 14
    assert "7 of 50" in d["note"] and str(series) in d["note"]
    # text mode is as it was: no document, the one stderr line
    code, out, err = cli_main(*cmd, "--no-metrics")
    assert code == 128 + signum and out == "" and len(err.strip().splitlines()) == 1


def test_interrupted_before_the_job_started_is_one_json_document(monkeypatch):
    pytest.importorskip("torch")
    from shardlab.runtime import train

    def interrupted(req):
        raise KeyboardInterrupt
    monkeypatch.setattr(train, "prepare", interrupted)
    code, out, err = cli_main("run", "train", "--no-metrics", "--json")
    d = _one_json_document(out)
    assert code == 130 and d["exit_code"] == 130 and d["signal"] == "SIGINT" and d["progress"] is None
    assert "before the job started" in d["note"] and "interrupted (SIGINT)" in err


@pytest.mark.parametrize("target, argv, words", [
    ("shardlab.runtime.bench_collectives:run_collectives", ["bench", "collectives", "--nproc-per-node", "2"], "nothing measured"),
    ("shardlab.runtime.bench_matmul:bench_matmul", ["calibrate", "--out", "p.yaml", "--skip-collectives"],
     "no profile was written"),
    ("shardlab.runtime.precision:run_precision", ["run", "precision"], "nothing measured was kept"),
])
def test_other_measuring_commands_interrupted_print_one_json_document(tmp_path, monkeypatch, target, argv, words):
    pytest.importorskip("torch")
    import importlib

    from shardlab.interrupts import Interrupted

    def stopped(*a, **k):
        raise Interrupted(15)
    mod, attr = target.split(":")
    monkeypatch.setattr(importlib.import_module(mod), attr, stopped)
    monkeypatch.chdir(tmp_path)
    code, out, err = cli_main(*argv, "--json")
    d = _one_json_document(out)
    assert code == 143 and d["exit_code"] == 143 and d["signal"] == "SIGTERM" and words in d["note"], (out, err)
    assert err.strip().splitlines() == ["interrupted (SIGTERM): stopped"] and not (tmp_path / "p.yaml").exists()


@pytest.mark.parametrize("argv,needle", [
    (["run", "infer", "--plot", "x.png"], "--plot applies to a --sweep"),
    (["run", "infer", "--sweep", "--plot", "x.txt"], "use a .png, .svg or .pdf"),
    (["run", "infer", "--prompt", "a" * 45000], "at most 8,192"),
    (["run", "train", "--strategy", "tp+sp", "--nproc-per-node", "2", "--model", "tiny-gpt2"], "RoPE models"),
    (["run", "train", "--strategy", "tp+sp", "--nproc-per-node", "2", "--seq-len", "63"], "use --seq-len 62"),
    (["bench", "matmul", "--hidden", "1000000"], "give smaller --hidden"),
    (["bench", "collectives", "--sizes", "1KiB:1TiB", "--no-metrics"], "give smaller --sizes"),
])
def test_runtime_inputs_refused_before_anything_runs(argv, needle, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = cli_main(*argv)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_outputs_keep_files_of_another_kind_and_torchrun_takes_a_log_dir(tmp_path):
    from shardlab.runtime.launch import torchrun_command
    from shardlab.safeout import check_output_path, replace_text

    readme = tmp_path / "README.md"
    readme.write_text("# mine\n")
    for what in ("--steps-jsonl", "calibrate --out"):
        with pytest.raises(ShardlabError, match="neither a .* nor one shardlab wrote"):
            check_output_path(readme, what)
    prof = tmp_path / "prof"                                   # shardlab's own output, whatever its name: replaced
    prof.write_text("# shardlab hardware profile\n")
    assert check_output_path(prof, "calibrate --out") == prof
    old = tmp_path / "steps.jsonl"
    old.write_text('{"step": 0}\n')
    replace_text(old, '{"step": 1}\n', "--steps-jsonl")
    assert old.read_text() == '{"step": 1}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "prof", "steps.jsonl"]
    cmd = torchrun_command("m", 2, [], log_dir=tmp_path / "te")
    assert cmd[cmd.index("--log-dir") + 1] == str(tmp_path / "te")
    assert torchrun_command("m", 2, [], ["--log-dir", "/x"], log_dir=tmp_path).count("--log-dir") == 1   # the user's


def test_alpha_beta_needs_two_distinct_sizes():
    from shardlab.calibration import fit_alpha_beta

    rows = [{"op": "all-reduce", "size_bytes": 8, "time_s": 1e-5, "world_size": 2}] * 3
    with pytest.raises(ShardlabError, match="two measured sizes"):
        fit_alpha_beta(rows)


@pytest.mark.parametrize("argv, words", [
    (["--nodes", "2", "--node-rank", "0", "--rdzv-endpoint", "127.0.0.1:29500", "--rdzv-backend", "c10d"],
     "--node-rank has no effect under --rdzv-backend c10d"),
    (["--nodes", "1:2", "--node-rank", "0", "--rdzv-endpoint", "127.0.0.1:29500"], "needs a fixed node count"),
    (["--nodes", "2", "--node-rank", "0", "--rdzv-endpoint", "0.0.0.0:29500"], "--rdzv-endpoint names no single address"),
    (["--nodes", "2", "--rdzv-endpoint", "127.0.0.1:29500", "--rdzv-id", "j", "--local-addr", "::"],
     "--local-addr names no single address"),
])
def test_launch_flags_that_cannot_do_what_they_say_are_refused(argv, words):
    code, _, err = cli_main("run", "train", "--strategy", "ddp", *argv)
    assert code == 2 and words in err and err.count("\n") == 1


def test_node_ranks_mean_a_static_rendezvous_and_one_node_gets_its_own_id():
    import argparse

    import os

    from shardlab.cli.runtime_cmds import torchrun_args
    from shardlab.runtime.preflight import BIND_ANY_ENV, launch_env, is_wildcard

    before = dict(os.environ)
    blank = dict(nnodes=None, node_rank=None, rdzv_endpoint=None, rdzv_id=None, rdzv_backend=None)
    out = torchrun_args(argparse.Namespace(**{**blank, "nnodes": "2", "node_rank": 1, "rdzv_endpoint": "127.0.0.1:29500"}))
    assert out[out.index("--rdzv-backend") + 1] == "static" and out[out.index("--node-rank") + 1] == "1"
    ids = {torchrun_args(argparse.Namespace(**{**blank, "rdzv_endpoint": "127.0.0.1:29500"}))[-1] for _ in range(2)}
    assert len(ids) == 2 and all(i.startswith("shardlab-") for i in ids)          # never a fixed, guessable id
    out = torchrun_args(argparse.Namespace(**{**blank, "nnodes": "2", "node_rank": 0, "rdzv_endpoint": "0.0.0.0:29500",
                                              "rdzv_bind_any": True, "local_addr": "127.0.0.1"}))
    env = launch_env(out)                       # what the launcher gives torchrun: never this process's environment
    assert env[BIND_ANY_ENV] == "1" and env["GLOO_SOCKET_IFNAME"] == "lo"
    assert all(is_wildcard(w) for w in ("0", "0.0", "0x0", "0.0.0.0", "::", "[::]", ""))   # every spelling
    assert not any(is_wildcard(w) for w in ("127.0.0.1", "10.0.0.1", "node0", "::1"))
    assert dict(os.environ) == before
