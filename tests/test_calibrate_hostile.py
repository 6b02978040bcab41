"""`shardlab calibrate` on hostile input files: one line on stderr naming the file and its field, exit code 2, no
traceback, bounded work, no network access driven by a document, and no profile left behind."""

import copy
import json
import os
import time
from pathlib import Path

import pytest
from conftest import DATA, _cache_repo, cli_main

RUN = json.loads((DATA / "run_train_fsdp_tp.json").read_text())
RUN["model_ref"] = "tiny"          # the field `run train --json` writes


def _write(path: Path, doc) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


def _refused(tmp_path, args, *fragments, out="out.yaml"):
    """Exit 2, one stderr line with ``fragments``, no traceback, no file at ``out`` (nor a temporary one beside it)."""
    before = set(os.listdir(tmp_path))
    code, stdout, err = cli_main(*args)
    assert code == 2, (code, stdout[-300:], err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for f in fragments:
        assert f in err, err
    assert not (tmp_path / out).exists()
    assert set(os.listdir(tmp_path)) <= before | {out}, set(os.listdir(tmp_path)) - before   # no temporary file left
    return err


@pytest.mark.parametrize("field, value, fragment", [
    ("tp", None, "layout.tp must be a positive whole number, got null"),
    ("tp", True, "layout.tp must be a positive whole number, got true"),
    ("tp", {}, "layout.tp must be a positive whole number, got {}"),
    ("dp", "2", "layout.dp must be a positive whole number, got \"2\""),
    ("pp", 1.5, "layout.pp must be a positive whole number"),
    ("cp", 0, "layout.cp must be a whole number from 1 to 1,048,576, got 0"),
    ("dp", 2**30, "layout.dp must be a whole number from 1 to 1,048,576"),
    ("zero", 7, "layout.zero must be a whole number from 0 to 3"),
    ("micro_batch", None, "layout.micro_batch must be a positive whole number"),
    ("stage_layers", 0, "layout.stage_layers must be null or a list of positive whole numbers"),
    ("stage_layers", "x", "layout.stage_layers must be null or a list"),
    ("stage_layers", [2, "x"], "layout.stage_layers[1] must be a positive whole number"),
    ("stage_layers", [1] * 100_000, "layout.stage_layers must be null or a list"),
    ("stage_layers", [2, 2], "layout.stage_layers needs 1 positive counts"),  # pp = 1 here: one count
    ("sequence_parallel", [1], "layout.sequence_parallel must be true or false, got [1]"),
    ("sequence_parallel", 1, "layout.sequence_parallel must be true or false"),
    ("schedule", 5, "layout.schedule must be one of"),
    ("recompute", "some", "layout.recompute must be one of"),
    ("recompute_fraction", "x", "layout.recompute_fraction must be a number"),
    ("recompute_fraction", 2.0, "layout.recompute_fraction 2 is above the limit of 1"),
    ("bogus", 1, "layout has unknown field(s) bogus"),
    ("tp", 3, "layout.tp 3 does not divide"),                                  # the estimate's check, in the file's words
])
def test_wrong_layout_fields_are_one_line(tmp_path, field, value, fragment):
    doc = copy.deepcopy(RUN)
    doc["layout"][field] = value
    _refused(tmp_path, ["calibrate", "--out", str(tmp_path / "out.yaml"), "--from-run", _write(tmp_path / "run_bad.json", doc)],
             "run_bad.json: " + fragment)


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: d.update(layout=[1]), "run_bad.json: layout must be an object"),
    (lambda d: d["workload"].update(precision=["x"]), "run_bad.json: workload.precision must be one of"),
    (lambda d: d["workload"].update(optimizer=None), "run_bad.json: workload.optimizer must be one of"),
    (lambda d: d["workload"].update(global_batch=6), "run_bad.json: workload.global_batch 6 is not divisible"),
    (lambda d: d.update(model_ref=["tiny"]), "run_bad.json: model_ref cannot be read"),
    (lambda d: d.update(ranks=[5]), None),                                      # a damaged ranks list: device cpu
    (lambda d: d["step_time"].update(measured_median_s=1e8), "run_bad.json: the measured step times"),
])
def test_wrong_run_fields_are_one_line(tmp_path, edit, fragment):
    doc = copy.deepcopy(RUN)
    edit(doc)
    args = ["calibrate", "--out", str(tmp_path / "out.yaml"), "--from-run", _write(tmp_path / "run_bad.json", doc)]
    if fragment is None:
        code, _, err = cli_main(*args)
        assert code == 0, err
        return
    _refused(tmp_path, args, fragment)


def test_runs_that_is_not_a_list_is_one_line(tmp_path):
    _refused(tmp_path, ["calibrate", "--out", str(tmp_path / "out.yaml"), "--from-run",
                        _write(tmp_path / "runs.json", {"runs": 5})], "runs.json: runs must be a list")


def test_too_many_runs_are_refused_before_any_estimate(tmp_path):
    one = {"model_ref": "tiny", "layout": {}, "workload": {"seq_len": 64, "global_batch": 8},
           "step_time": {"measured_median_s": 0.5}}
    many = tmp_path / "many.json"
    many.write_text(json.dumps([one] * 9_000, separators=(",", ":")))
    assert many.stat().st_size < 2**20
    t = time.perf_counter()
    _refused(tmp_path, ["calibrate", "--out", str(tmp_path / "out.yaml"), "--from-run", str(many)],
             "many.json: 9,000 runs, above the limit of 50")
    assert time.perf_counter() - t < 2.0
    # the cap counts the runs of every file together
    part = _write(tmp_path / "part.json", [one] * 30)
    _refused(tmp_path, ["calibrate", "--out", str(tmp_path / "out.yaml"), "--from-run", part, part], "60 runs")
    # copies of one run are priced once: 50 of them are quick
    t = time.perf_counter()
    code, _, err = cli_main("calibrate", "--out", str(tmp_path / "ok.yaml"), "--from-run", _write(tmp_path / "fifty.json", [one] * 50))
    assert code == 0 and time.perf_counter() - t < 2.0, err


def test_a_huge_model_is_refused_before_any_estimate(tmp_path):
    """A model file of 10,000 layers costs about a second an estimate: the blocks priced are bounded too."""
    model = json.loads((DATA / "hf-families" / "gemma-2-2b.json").read_text())
    model["num_hidden_layers"] = 10_000
    ref = _write(tmp_path / "deep.json", model)
    runs = [{"model_ref": ref, "layout": {}, "workload": {"seq_len": 64, "global_batch": 8},
             "step_time": {"measured_median_s": 0.5}}]
    t = time.perf_counter()
    _refused(tmp_path, ["calibrate", "--out", str(tmp_path / "out.yaml"), "--from-run", _write(tmp_path / "deep_run.json", runs)],
             "deep_run.json", "10,000 transformer blocks", "above the limit of 3,000")
    assert time.perf_counter() - t < 2.0


def test_hub_refs_in_a_document_are_read_from_the_cache_only(tmp_path, monkeypatch):
    pytest.importorskip("huggingface_hub")
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    _cache_repo(cache, "google/gemma-2-2b", (DATA / "hf-families" / "gemma-2-2b.json").read_bytes())
    doc = copy.deepcopy(RUN)
    doc["layout"] = {"dp": 2, "tp": 2}
    doc["model_ref"] = "hf:foo/bar"
    t = time.perf_counter()
    _refused(tmp_path, ["calibrate", "--out", str(tmp_path / "out.yaml"), "--from-run", _write(tmp_path / "run_hf.json", doc)],
             "run_hf.json: model_ref hf:foo/bar is not in the local Hugging Face cache",
             "resolved from the cache only", "shardlab models hf:foo/bar")
    assert time.perf_counter() - t < 5.0                # no Hub retries (they took about 24 s)
    assert "HF_HUB_OFFLINE" not in os.environ           # set around the lookup only
    doc["model_ref"] = "hf:google/gemma-2-2b"           # a cached model is read
    code, _, err = cli_main("calibrate", "--out", str(tmp_path / "fw.yaml"), "--from-run", _write(tmp_path / "run_ok.json", doc))
    assert code == 0, err
    assert "HF_HUB_OFFLINE" not in os.environ
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")           # a user's own setting is restored as it was
    cli_main("calibrate", "--out", str(tmp_path / "fw.yaml"), "--from-run", str(tmp_path / "run_hf.json"))
    assert os.environ["HF_HUB_OFFLINE"] == "0"


def test_a_profile_that_would_not_load_is_not_written(tmp_path):
    mm = json.loads((DATA / "bench_matmul_cpu.json").read_text())
    for r in mm["rows"]:
        r["tflops"] = 1e6
    fast = _write(tmp_path / "mm_fast.json", mm)
    args = ["calibrate", "--out", str(tmp_path / "out.yaml"), "--from-matmul", fast, "--skip-collectives"]
    _refused(tmp_path, args, "mm_fast.json: rows give a peak of 1.001e+06 TFLOP/s", "above the limit")
    (tmp_path / "out.yaml").write_text("kept\n")        # an existing file is left as it was
    code, _, err = cli_main(*args)
    assert code == 2 and (tmp_path / "out.yaml").read_text() == "kept\n", err
    # too fast a memory for the catalog
    mm = json.loads((DATA / "bench_matmul_cpu.json").read_text())
    mm["stream"]["gbps"] = 5e8
    (tmp_path / "out.yaml").unlink()
    _refused(tmp_path, ["calibrate", "--out", str(tmp_path / "out.yaml"), "--from-matmul",
                        _write(tmp_path / "mm_stream.json", mm), "--skip-collectives"],
             "mm_stream.json: stream.gbps gives a memory bandwidth of 5e+08 GB/s")


def test_write_profile_checks_before_writing(tmp_path):
    """The last guard (any field the calibrate checks miss): the catalog's own check, on a temporary file."""
    from shardlab.errors import ShardlabError
    from shardlab.runtime.calibrate import write_profile

    out = tmp_path / "p.yaml"
    out.write_text("old\n")
    with pytest.raises(ShardlabError, match=r"^m\.json: the fitted profile would not load \(entry 'x'") as e:
        write_profile({"accelerators": {"x": {"name": 5}}}, out, inputs="m.json")
    assert str(tmp_path) not in str(e.value).replace(str(out), "")        # the temporary file is not named
    assert out.read_text() == "old\n" and os.listdir(tmp_path) == ["p.yaml"]


def test_too_few_collective_sizes_say_what_to_measure(tmp_path):
    coll = json.loads((DATA / "bench_collectives_cpu.json").read_text())
    coll["rows"] = [r for r in coll["rows"] if r["op"] == "all-gather"][:1]
    one = _write(tmp_path / "coll_onerow.json", coll)
    err = _refused(tmp_path, ["calibrate", "--out", str(tmp_path / "out.yaml"), "--from-matmul",
                              str(DATA / "bench_matmul_cpu.json"), "--from-collectives", one],
                   "coll_onerow.json: 1 row(s) at 1 message size(s)", "at least 2 message sizes",
                   "shardlab bench collectives")
    assert "(have )" not in err and "use --link-fit joint" not in err


def test_too_few_gemms_name_the_file(tmp_path):
    mm = json.loads((DATA / "bench_matmul_cpu.json").read_text())
    mm["rows"] = mm["rows"][:1]
    _refused(tmp_path, ["calibrate", "--out", str(tmp_path / "out.yaml"), "--from-matmul",
                        _write(tmp_path / "mm_one.json", mm), "--skip-collectives"],
             "mm_one.json: need at least two GEMMs", "shardlab bench matmul --json")


@pytest.mark.parametrize("name", ["a b", "x/y", "a" * 33, "ü"])
def test_a_bad_name_blames_the_flag_not_the_benchmark_files(tmp_path, name):
    err = _refused(tmp_path, ["calibrate", "--from-matmul", str(DATA / "bench_matmul_cpu.json"), "--from-collectives",
                              str(DATA / "bench_collectives_cpu.json"), "--name", name, "--out",
                              str(tmp_path / "out.yaml")], "argument --name", "is not an id suffix")
    assert "bench_matmul_cpu.json" not in err


def test_an_upper_case_name_writes_a_profile_that_loads(tmp_path):
    out = tmp_path / "p.yaml"
    code, _, err = cli_main("calibrate", "--from-matmul", str(DATA / "bench_matmul_cpu.json"), "--from-collectives",
                            str(DATA / "bench_collectives_cpu.json"), "--name", "BOX", "--out", str(out))
    assert code == 0, err
    code, _, err = cli_main("estimate", "tiny-gpt2", "--precision", "fp32", "--profile", str(out), "--gpus", "2")
    assert code == 0, err
