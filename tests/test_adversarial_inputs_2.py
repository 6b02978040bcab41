"""Reproducers of the second adversarial-input review, kept as regression tests: each bad input gives exit code 2
and one line naming the problem (never a traceback, never a silent fallback to a default, and for `run` commands
never after the job was launched)."""

import json
import sqlite3

import pytest

from conftest import cli_main, one_line_error



# ---- an empty value is refused, not read as 'not given' (the default was used silently) -------------------------
@pytest.mark.parametrize("args, flag", [
    (["estimate", "llama-2-7b", "--gpus", "8", "--gpu", ""], "--gpu"),
    (["estimate", "llama-2-7b", "--gpus", "8", "--framework", ""], "--framework"),
    (["estimate", "llama-2-7b", "--gpus", "8", "--intra-link", ""], "--intra-link"),
    (["estimate", "llama-2-7b", "--gpus", "8", "--tokens", ""], "--tokens"),
    (["estimate", "llama-2-7b", "--gpus", "8", "--profile", ""], "--profile"),
    (["estimate", "llama-2-7b", "--gpus", "8", "--from", ""], "--from"),
    (["memory", "llama-2-7b", "--overheads", " "], "--overheads"),
    (["memory", ""], "MODEL"),
    (["plan", "", "--gpus", "8"], "MODEL"),
    (["models", "--catalog", ""], "--catalog"),
    (["export", "--to", "megatron", "--plan", ""], "--plan"),
    (["cost", "--gpus", "1", "--hours", "1", "--provider", ""], "--provider"),
    (["run", "train", "--predict-gpu", ""], "--predict-gpu"),
    (["calibrate", "--out", "x.yaml", "--from-matmul", ""], "--from-matmul"),
])
def test_empty_values_are_refused(args, flag):
    one_line_error(args, f"argument {flag}", "the value is empty")


def test_empty_ledger_path_is_refused_not_the_default_ledger(tmp_path, monkeypatch):
    monkeypatch.setenv("SHARDLAB_LEDGER", str(tmp_path / "default.sqlite"))
    one_line_error(["ledger", "--ledger", ""], "--ledger", "the value is empty")


def test_the_guarded_command_keeps_its_empty_arguments(tmp_path):
    code, out, err = cli_main("guard", "--ledger", str(tmp_path / "l.sqlite"), "--budget-name", "b", "--ceiling", "5",
                              "--gpus", "1", "--price", "1", "--hours", "0.01", "--", "true", "")
    assert code == 0, err


def test_flags_with_their_own_empty_message_keep_it():
    one_line_error(["validate", "--run", ""], "--run needs a run id")
    one_line_error(["pipeline", "--plot", ""], "--plot: the file name is empty")


# ---- a ledger whose table lost a column (a hand edit) ---------------------------------------------------------
@pytest.mark.parametrize("table, column", [("runs", "note"), ("budgets", "parent"), ("runs", "setup_hours")])
def test_ledger_with_a_dropped_column_is_one_line(tmp_path, table, column):
    led = str(tmp_path / "l.sqlite")
    code, _, err = cli_main("ledger", "--ledger", led, "--budget-name", "b", "--set-ceiling", "10")
    assert code == 0, err
    with sqlite3.connect(led) as c:
        c.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    # --set-ceiling read the runs outside a transaction: sqlite3.OperationalError escaped as a traceback
    for args in (["--budget-name", "b", "--set-ceiling", "20"], ["--json"], []):
        one_line_error(["ledger", "--ledger", led, *args], f"lacks {column}", "--ledger NEW_PATH")


# ---- a model mapping without its required fields ---------------------------------------------------------------
def test_model_file_missing_fields_names_them(tmp_path):
    (tmp_path / "m.yaml").write_text("hidden_size: 64\n")
    one_line_error(["memory", str(tmp_path / "m.yaml")], "is missing ['family', 'num_layers'")
    (tmp_path / "e.json").write_text("{}")
    one_line_error(["models", str(tmp_path / "e.json")], "is missing")
    (tmp_path / "cat.yaml").write_text(json.dumps({"models": {"m": {
        "family": "llama", "hidden_size": 64, "num_layers": 2, "num_heads": 2, "num_kv_heads": 2, "ffn_hidden_size": 128,
        "vocab_size": 100, "max_seq_len": 64, "moe": {}}}}))
    one_line_error(["models", "--catalog", str(tmp_path / "cat.yaml")], "field 'moe' is missing ['num_experts'")
    (tmp_path / "typo.yaml").write_text("hidden_sise: 64\n")
    one_line_error(["memory", str(tmp_path / "typo.yaml")], "unknown field(s) ['hidden_sise']")


# ---- `run` refuses bad inputs before it launches anything ------------------------------------------------------
@pytest.fixture
def no_launch():
    """The launcher and benchmarks replaced by a stub: reaching it means the bad input was not caught in time."""
    import cli_fuzz as F

    with F.stubs():
        yield F.ReachedExecution


@pytest.mark.parametrize("extra, fragment", [
    (["--profile", "{garbage}"], "not UTF-8"),                  # was read after the job, then dropped silently
    (["--predict-gpu", "no-such-gpu"], "unknown GPU 'no-such-gpu'"),
    (["--tensorboard", "{garbage}"], "is not a folder"),        # was found only when writing, after the job
    (["--metrics-host", "a b"], "--metrics-host"),              # every rank failed at its start
    (["--metrics-host", "nohost.invalid"], "cannot listen there"),
])
def test_run_train_checks_before_launch(tmp_path, no_launch, extra, fragment):
    pytest.importorskip("torch")
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"\xff\xfe\x00binary")
    args = ["run", "train", "--strategy", "ddp", "--nproc-per-node", "2"] + [a.replace("{garbage}", str(garbage)) for a in extra]
    try:
        one_line_error(args, fragment)
    except no_launch:
        pytest.fail(f"{extra}: the job was launched before the input was checked")


def test_run_train_good_profile_and_host_still_reach_the_launch(tmp_path, no_launch):
    pytest.importorskip("torch")
    with pytest.raises(no_launch):
        cli_main("run", "train", "--strategy", "ddp", "--nproc-per-node", "2", "--predict-gpu", "a100-80gb",
                 "--metrics-host", "127.0.0.1", "--tensorboard", str(tmp_path / "tb"))


def test_metrics_port_check_speaks_ipv6():
    """`--metrics-host ::1 --metrics-port N` checks N on ::1 (it used to try an IPv4 socket there, so every port
    looked taken and the message blamed the port)."""
    import socket

    from shardlab.runtime.observe.launcher import port_free

    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        held = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        held.bind(("::1", 0))
    except OSError:
        pytest.skip("::1 cannot be bound here")
    with held:
        held.listen()
        port = held.getsockname()[1]
        assert not port_free("::1", port)
    assert port_free("::1", 0)
