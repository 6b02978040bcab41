"""Errors and notes name fields; the command line maps each field back to its flag (issue: the CLI is not the API)."""

from __future__ import annotations

import io
import json
import re
import tokenize
from pathlib import Path

import pytest

from conftest import cli_main
from shardlab.catalog import get_catalog
from shardlab.cli.fields import FLAGS, flag_of
from shardlab.errors import ShardlabError, field_name
from shardlab.layout import Layout
from shardlab.layout_checks import validate

SRC = Path(__file__).resolve().parents[1] / "src" / "shardlab"
CORE = ["layout.py", "estimate", "memory", "serving", "planner", "comm", "specs", "pipeline", "shard", "cost", "rates",
        "calibration.py", "flops.py"]
SURFACE = json.loads((Path(__file__).parent / "data" / "cli_surface.json").read_text(encoding="utf-8"))


def test_every_field_maps_to_a_real_flag():
    options = {o for opts in SURFACE.values() for o in opts}
    assert not sorted(f for f in FLAGS.values() if f not in options)
    assert len(set(FLAGS.values())) == len(FLAGS)                     # one field per flag, so the map reads back
    assert flag_of("layout.tp") == "--tp" and flag_of("no.such") == "no.such"


def test_the_library_names_fields_and_the_command_line_names_flags(capsys):
    spec = get_catalog().model("llama-2-70b")
    with pytest.raises(ShardlabError, match=r"^layout\.tp 3 does not divide llama-2-70b's 64 attention heads"):
        validate(Layout(tp=3), spec)
    code, _, err = cli_main("estimate", "llama-2-70b", "--tp", "3", "--gpus", "3")
    assert code == 2 and "--tp 3 does not divide llama-2-70b's 64 attention heads" in err and "layout.tp" not in err
    assert field_name("workload.global_batch") == "workload.global_batch"   # the command line's names did not leak


def test_notes_name_the_flag_on_the_command_line_and_the_field_in_the_library():
    from shardlab.estimate import estimate_training
    from shardlab.specs.hardware import Cluster

    cat = get_catalog()
    acc = cat.accelerator("h100-sxm")
    cl = Cluster(acc, 8, 8, cat.link("nvlink4"), cat.link("ib-ndr"))
    est = estimate_training(cat.model("llama-3.1-8b"), Layout(dp=8), cl, seq_len=4096)
    assert any(n.startswith("workload.global_batch not given") for n in est.notes), est.notes
    code, out, _ = cli_main("estimate", "llama-3.1-8b", "--gpus", "8", "--json")
    assert code == 0 and any(n.startswith("--global-batch not given") for n in json.loads(out)["notes"])


def _flag_mentions(path: Path):
    """Field flags written literally in the core's one-line string literals (outside backticks, a command line or a
    framework's own flag such as Megatron's --overlap-param-gather)."""
    flags = set(FLAGS.values())
    text = path.read_text(encoding="utf-8")
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type != tokenize.STRING or tok.string.startswith(('"""', "'''", 'f"""', "f'''", 'r"""')):
            continue
        for m in re.finditer(r"(?<![\w-])(--[a-z][a-z0-9-]*)(?![\w-])", tok.string):
            before = tok.string[:m.start()]
            if m.group(1) in flags and before.count("`") % 2 == 0 and "shardlab " not in before[-60:] and \
                    not re.search(r"(Megatron|vLLM|DeepSpeed|torchtitan|SGLang|TensorRT)\S*\s*$", before[-40:]):
                yield f"{path.relative_to(SRC)}:{tok.start[0]}: {m.group(1)}"


def test_the_analytic_core_names_no_flag():
    found = [hit for c in CORE for p in ([SRC / c] if (SRC / c).is_file() else sorted((SRC / c).rglob("*.py")))
             for hit in _flag_mentions(p)]
    assert not found, "name the field with errors.field_name (cli/fields.py maps it to its flag):\n" + "\n".join(found)
