"""run train's machine probe (``shardlab.runtime.probe``): keyed and cached per machine, torch version and strategy,
measured on the job's ranks, and what the prediction then comes from. Accuracy is a benchmark's business
(benchmarks/bench_cpu_prediction.py), not a test's."""

import json
import os
import subprocess
import sys

import pytest

from shardlab.runtime import probe


def _key(**kw):
    base = dict(device="cpu", nproc=2, strategy="fsdp", torch_version="2.13.0+cpu",
                layout={"dp": 2, "tp": 1, "pp": 1, "ep": 1, "zero": 3, "vpp": 1, "schedule": "1f1b", "micro_batch": 4})
    return probe.probe_key(**{**base, **kw})


def test_key_names_the_machine_torch_ranks_and_strategy(monkeypatch, tmp_path):
    monkeypatch.setenv("SHARDLAB_CACHE_DIR", str(tmp_path))
    k = _key()
    assert {"host", "cpu", "cores", "torch", "device", "nproc", "strategy", "layout"} <= set(k)
    assert "micro_batch" not in k["layout"]          # the job's batch split is not the machine's
    assert probe.probe_path(k) == probe.probe_path(_key())
    paths = {probe.probe_path(_key(**kw)) for kw in ({}, {"torch_version": "2.14.0"}, {"nproc": 4},
                                                     {"strategy": "ddp"}, {"device": "cuda"})}
    assert len(paths) == 5 and all(p.parent == tmp_path / "probes" for p in paths)


def test_switch_and_cache_dir(monkeypatch, tmp_path):
    for v, want in (("0", False), ("off", False), ("no", False), ("1", True), ("", True)):
        monkeypatch.setenv("SHARDLAB_PROBE", v)
        assert probe.enabled() is want
    monkeypatch.setenv("SHARDLAB_PROBE", "1")
    assert probe.enabled(False) is False                     # --no-probe
    monkeypatch.delenv("SHARDLAB_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert probe.cache_dir() == tmp_path / "shardlab" / "probes"


def test_each_strategy_prices_its_own_collectives():
    assert probe.strategy_ops("ddp") == ("all-reduce",)
    assert probe.strategy_ops("fsdp") == ("all-gather", "reduce-scatter")
    assert probe.strategy_ops("fsdp+tp") == ("all-reduce", "all-gather", "reduce-scatter")
    assert probe.strategy_ops("pp") == ("send-recv",) and probe.strategy_ops("ddp+pp") == ("all-reduce", "send-recv")
    assert probe.strategy_ops("ep") == probe.COLL_OPS      # nothing named: every probed op


def test_a_damaged_or_foreign_cache_file_is_measured_again(monkeypatch, tmp_path):
    monkeypatch.setenv("SHARDLAB_CACHE_DIR", str(tmp_path))
    k = _key()
    path = probe.probe_path(k)
    path.parent.mkdir(parents=True)
    for text in ("profile: [1, 2", "profile:\n  gpu: cpu-core\n  probe: '{}'\n", "\x00\x01"):
        path.write_text(text)
        assert probe._read(path, k) is None


def test_reference_is_none_of_the_presets():
    from shardlab.catalog import get_catalog

    cat = get_catalog()
    ref = {k: v for k, v in probe.REFERENCE.items() if k != "source"}
    for name in ("tiny", "small", "tiny-gpt2", "tiny-moe"):
        m = cat.models[name]
        assert (m.hidden_size, m.num_layers) != (ref["hidden_size"], ref["num_layers"]), name


@pytest.mark.slow
def test_run_train_probes_once_then_reads_the_cache(tmp_path, monkeypatch):
    """ddp on 2 ranks: the first run measures the probe (rates on the job's ranks, the reference model's step),
    predicts from it and says so; asked again for the same machine, torch, ranks and strategy, the probe is read
    from the cache without measuring; --reprobe with --no-probe is refused in one line."""
    pytest.importorskip("torch")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SHARDLAB_PROBE": "1", "SHARDLAB_CACHE_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "shardlab", "run", "train", "--strategy", "ddp", "--nproc-per-node", "2",
                        "--steps", "3", "--json"], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    first = json.loads(r.stdout)["step_time"]
    pr = first["probe"]
    assert pr["fresh"] is True and pr["key"]["strategy"] == "ddp" and pr["key"]["nproc"] == 2
    assert pr["layer_host_s"] is not None and pr["layer_host_s"] >= 0
    assert "cpu-core-probed" in first["predicted_from"] and "this machine's probe (measured now" in first["predicted_from"]
    assert first["predicted_catalog_gpu"] is None and first["predicted_s"] > 0
    from shardlab.catalog import get_catalog

    cat = get_catalog([pr["path"]])
    assert cat.profile["framework"] == "shardlab-runtime-probed" and cat.profile["comm_overlap"] is False
    fw = cat.framework("shardlab-runtime-probed")
    assert fw.dp_overlap is False and fw.zero3_prefetch is False and fw.layer_host_s == pytest.approx(pr["layer_host_s"],
                                                                                                       rel=1e-3)
    assert "all-reduce (the collectives ddp runs)" in cat.links["loopback-probed"].source
    monkeypatch.setenv("SHARDLAB_CACHE_DIR", str(tmp_path))
    again = probe.ensure_probe(strategy="ddp", nproc=2, tp=None, pp=None, schedule="1f1b", vpp=1,
                               layout=pr["key"]["layout"], torch_version=pr["key"]["torch"], status=pytest.fail)
    assert again.fresh is False and str(again.path) == pr["path"] and again.measured_at == pr["measured_at"]
    from conftest import cli_main

    code, out, err = cli_main("run", "train", "--reprobe", "--no-probe")
    assert code == 2 and "--reprobe" in err and "Traceback" not in err
