"""`shardlab run train|infer` without launching: lazy imports, one-line errors with the fix, exit codes."""

import subprocess
import sys

import pytest

from conftest import cli_main


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
    (["run", "train", "--strategy", "tp", "--nproc", "3"], "KV heads"),
    (["run", "train", "--strategy", "ddp", "--global-batch", "3"], "not divisible"),
    (["run", "train", "--model", "no-such-model"], "unknown model"),
    (["run", "train", "--rdzv-id", "job"], "--rdzv-endpoint"),
    (["run", "infer", "--tp", "3"], "--tp 3"),
    (["run", "infer", "--prompt", ""], "--prompt is empty"),
])
def test_bad_input_exits_2_with_one_line(args, match):
    pytest.importorskip("torch")
    code, out, err = cli_main(*args)
    assert code == 2 and match in err and len(err.strip().splitlines()) == 1 and out == ""
