"""Observability parts that need no torchrun: exporter over real HTTP, aggregate, dashboard names, TensorBoard, logs."""

import json
import re
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

pytest.importorskip("prometheus_client")

from conftest import DATA, cli_main  # noqa: E402
from shardlab.runtime.observe.names import COMMON_LABELS, METRICS, series_names  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def _closed(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_exporter_serves_valid_prometheus_text_and_closes_its_port():
    from shardlab.runtime.observe.exporter import RankExporter
    from shardlab.runtime.observe.scrape import scrape

    labels = {"job_id": "j1", "node": "0", "rank": "1", "strategy": "fsdp"}
    e = RankExporter(labels)
    port = e.start(0)                     # the OS picks the port at bind time; start says which
    assert port > 0 and not _closed(port)
    try:
        e.metric("shardlab_step_seconds").observe(0.2)
        e.set_total("shardlab_collective_calls", 14, op="all_gather", group="dp")
        s1 = scrape("127.0.0.1", port)
        e.set_total("shardlab_collective_calls", 28, op="all_gather", group="dp")
        e.set_total("shardlab_collective_calls", 20, op="all_gather", group="dp")  # counters never go back
        s2 = scrape("127.0.0.1", port)
    finally:
        e.stop()
    assert s1.ok and s2.ok, (s1.error, s2.error)
    names = {n for n, _, _ in s2.samples}
    assert names <= series_names(gpu=False) and "shardlab_step_seconds_bucket" in names
    assert not any(n.endswith("_created") for n in names)
    assert s1.value("shardlab_collective_calls_total", op="all_gather") == 14
    assert s2.value("shardlab_collective_calls_total", op="all_gather", group="dp") == 28
    assert all({k: lab[k] for k in COMMON_LABELS} == labels for _, lab, _ in s2.samples)
    assert s2.value("shardlab_step_seconds_bucket", le="0.25") == 1 and s2.value("shardlab_step_seconds_bucket", le="0.1") == 0
    assert _closed(port)


def test_a_taken_port_is_a_one_line_error():
    from shardlab.errors import ShardlabError
    from shardlab.runtime.observe.launcher import choose_ports

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ShardlabError, match=f"metrics port {port} .* in use"):
            choose_ports("127.0.0.1", 1, port)


def test_ranks_bind_os_picked_ports_and_the_run_reports_them(tmp_path):
    """Without --metrics-port the launcher hands each rank port 0 (a port chosen in advance could be taken by the
    job's own connections before the rank binds it) and reports the ports the ranks published."""
    import json

    from shardlab.runtime.observe.launcher import ObserveOptions, Observation, choose_ports

    assert choose_ports("127.0.0.1", 3, None) == [0, 0, 0]
    obs = Observation(ObserveOptions(), 2, 2, kind="train")
    env = obs.prepare(tmp_path)
    assert json.loads(env["SHARDLAB_OBSERVE"])["metrics_ports"] == [0, 0]
    assert obs.bound_ports() == []                         # nothing published yet
    (tmp_path / "endpoints.json").write_text(json.dumps([{"rank": 0, "node": "0", "port": 41001, "host": "127.0.0.1"},
                                                         {"rank": 1, "node": "0", "port": 41002, "host": "127.0.0.1"}]))
    assert obs.bound_ports() == [41001, 41002]


def test_a_series_in_a_temporary_run_folder_is_not_reported_as_kept(tmp_path, monkeypatch):
    """The temporary run folder goes when the command exits: its steps.jsonl is not named as where the series is."""
    from shardlab.runtime import launch
    from shardlab.runtime.observe.launcher import ObserveOptions, Observation

    monkeypatch.setattr(launch, "_TEMP_DIRS", [tmp_path])
    obs = Observation(ObserveOptions(metrics=False), 1, 1, kind="train")
    obs.prepare(tmp_path)
    assert obs.finish(skip_steps=0)["steps_jsonl"] is None
    kept = tmp_path / "kept.jsonl"
    obs = Observation(ObserveOptions(metrics=False, steps_jsonl=str(kept)), 1, 1, kind="train")
    obs.prepare(tmp_path)
    assert obs.finish(skip_steps=0)["steps_jsonl"] == str(kept) and kept.exists()
    monkeypatch.setattr(launch, "_TEMP_DIRS", [])
    obs = Observation(ObserveOptions(metrics=False), 1, 1, kind="train")
    obs.prepare(tmp_path)
    assert obs.finish(skip_steps=0)["steps_jsonl"] == str(tmp_path / "steps.jsonl")


def _records(factor: float, n_steps: int = 20, slow: int = 1, world: int = 3) -> list[dict]:
    """Synthetic records of a synchronous job: 100 ms of compute, 20 ms in collectives, rank `slow` x factor."""
    out = []
    for k in range(n_steps):
        own = {r: 0.1 * (factor if r == slow else 1.0) for r in range(world)}
        for r in range(world):
            out.append({"step": k, "rank": r, "step_s": own[r] + 0.02, "compute_s": own[r], "blocked_s": 0.02,
                        "coll_s": 0.02, "coll_calls": 9, "coll_bytes": 1000, "data_s": 0.0, "injected_s": 0.0,
                        "wait_s": max(own.values()) - own[r], "loss": 1.0, "time": k})
    return out


def test_summary_names_the_slow_rank_its_ratio_and_drag():
    from shardlab.runtime.observe.summary import summarise

    d = summarise(_records(2.0), skip_steps=2)
    st = d["straggler"]
    assert st["rank"] == 1 and st["is_straggler"] and st["compute_ratio"] == pytest.approx(2.0)
    assert st["natural_compute_ratio"] == pytest.approx(2.0)           # nothing injected in these records
    assert st["drag"] == pytest.approx(0.22 / 0.12 - 1)              # 220 ms steps instead of 120 ms
    assert st["others_wait_s"] == pytest.approx(0.1) and st["own_wait_s"] == pytest.approx(0.0)
    assert [r["steps"] for r in d["ranks"]] == [18, 18, 18]
    json.dumps(d, allow_nan=False)
    flat = summarise(_records(1.0), skip_steps=2)["straggler"]
    assert not flat["is_straggler"] and flat["drag"] == pytest.approx(0.0)
    # 29% slower at p99 but the job +1% longer (run infer's case): not a straggler; the same with a +8% drag: one
    from shardlab.runtime.observe.summary import is_straggler

    assert not is_straggler(1.09, 1.29, 0.01, 0.01) and is_straggler(1.09, 1.29, 0.01, 0.08)
    assert not is_straggler(1.05, 1.08, 0.20, 0.20)                     # a slow job, but no rank slower than the rest


def test_summary_finds_a_rank_waiting_inside_collectives():
    """Inference-like: no step boundary; the peers wait inside the next all-reduce (blocked time)."""
    from shardlab.runtime.observe.summary import summarise

    recs = [r | {"wait_s": 0.0} for r in _records(1.0, world=2)]
    for r in recs:
        if r["rank"] == 0:   # rank 0 waited 50 ms in its collectives for rank 1's slower compute
            r.update(blocked_s=0.07, step_s=0.17)
        else:
            r.update(compute_s=0.15, step_s=0.17)
    st = summarise(recs, skip_steps=0)["straggler"]
    assert st["rank"] == 1 and st["compute_ratio"] == pytest.approx(1.5) and st["others_wait_s"] == pytest.approx(0.05)


def _lagged_infer_records(n_tokens: int = 20, slowed=(4, 14)) -> list[dict]:
    """Inference on 2 ranks, rank 1 slowed 3x on a few tokens (--slow-rank 1:3:0.1): rank 0 waits for it inside the
    *next* token's all-reduce, and on the other tokens rank 0 is a hair slower (1 ms) so rank 1 waits that hair."""
    out = []
    for k in range(n_tokens):
        slow = k in slowed
        late = k - 1 in slowed                        # rank 0 waits 200 ms in this token's collectives
        c0, c1 = 0.101, 0.1 * (3 if slow else 1)
        b0, b1 = 0.02 + (0.2 if late else 0.0), 0.021 if not late else 0.02
        for r, c, b in ((0, c0, b0), (1, c1, b1)):
            out.append({"step": k, "rank": r, "step_s": c + b, "compute_s": c, "blocked_s": b, "coll_s": b,
                        "coll_calls": 2, "coll_bytes": 64, "data_s": 0.0, "wait_s": 0.0, "loss": None, "time": k,
                        "injected_s": 0.2 if r == 1 and slow else 0.0})
    return out


def test_the_slowest_rank_is_the_slow_one_by_one_rule():
    """The rank named slowest is the one slowed (or the longest compute): not a rank charged with its peers'
    waiting one token late (inference waits inside the next token's all-reduce), which named rank 0 "the slowest"."""
    from shardlab.runtime.observe.report import render_observability, slowest_line
    from shardlab.runtime.observe.summary import rank_time_split, slowest_of_split, summarise

    recs = _lagged_infer_records()
    for injected in (None, 1):
        st = summarise(recs, skip_steps=1, kind="infer", injected=injected)["straggler"]
        assert st["rank"] == 1 and st["rank_from"] == ("measured" if injected is None else "--slow-rank"), st
    split = rank_time_split(recs, 1)
    named = slowest_of_split(split)
    assert named["rank"] == 1 and named["compute_ratio"] > 1.1           # 0.12 s mean compute against 0.101 s
    assert slowest_of_split(split, injected=0)["rank"] == 0                # the --slow-rank rank is the one named
    # one wording everywhere: the run commands' line and the observability summary's
    doc = summarise(recs, skip_steps=1, kind="infer", injected=1)
    assert "slowest rank 1 (slowed with --slow-rank)" in render_observability(doc, unit="token")
    assert slowest_line({**slowest_of_split(split, 1)}, "token").startswith("slowest rank 1 (slowed with --slow-rank): ")
    assert "rank 0, the slowest" not in render_observability(summarise(recs, skip_steps=1, kind="infer"), unit="token")


def test_each_rank_step_splits_into_compute_collectives_and_waiting():
    """The per-rank step includes the time a rank waited for the slow one (at the step-end barrier in training,
    inside collectives in inference): compute + collectives + waiting = the step, the same on every rank."""
    from shardlab.runtime.observe.summary import rank_time_split

    split = rank_time_split(_records(2.0, world=2), skip_steps=2)           # training: rank 1 computes 2x
    assert split[0]["compute_s"] == pytest.approx(0.1) and split[0]["wait_s"] == pytest.approx(0.1)
    assert split[1]["compute_s"] == pytest.approx(0.2) and split[1]["wait_s"] == pytest.approx(0.0)
    for sp in split.values():
        assert sp["collectives_s"] == pytest.approx(0.02) and sp["steps"] == 18
        assert sp["step_s"] == pytest.approx(sp["compute_s"] + sp["collectives_s"] + sp["wait_s"]) == pytest.approx(0.22)
    inf = rank_time_split(_lagged_infer_records(), 1)                       # inference: the wait is in the all-reduce
    assert inf[0]["wait_s"] > 10 * inf[1]["wait_s"] and inf[0]["compute_s"] < inf[1]["compute_s"]
    assert inf[0]["step_s"] == pytest.approx(inf[0]["compute_s"] + inf[0]["collectives_s"] + inf[0]["wait_s"])


def test_run_train_reports_the_whole_step_per_rank_and_the_slowest_by_compute():
    """`run train`'s per-rank step_time_s and table include the waiting; the slowest rank is the slowed one even
    though every rank's whole step is as long (the others wait for it); text and JSON agree."""
    from shardlab.runtime.observe.summary import rank_time_split
    from shardlab.runtime.step_time import apply_time_split, measured_step_time
    from shardlab.runtime.train_report import render_train

    doc = json.loads((DATA / "run_train_fsdp_tp.json").read_text())
    recs = [r | {"rank": r["rank"]} for r in _records(2.0, world=4, slow=2)]
    split = rank_time_split(recs, 2)
    apply_time_split(doc["ranks"], split, 512)
    st, slowest = measured_step_time(doc["ranks"], split, injected=2)
    doc["step_time"].update(st)
    doc["slowest"] = slowest
    r0 = next(r for r in doc["ranks"] if r["rank"] == 0)
    assert r0["step_time_s"] == pytest.approx(0.22) and r0["time_split"]["wait_s"] == pytest.approx(0.1)
    assert st["slowest_rank"] == slowest["rank"] == 2 and st["slowest_rank_from"] == "--slow-rank"
    assert st["spread_of"] == "compute" and st["spread"] == pytest.approx(1.0)
    assert measured_step_time(doc["ranks"], split, injected=None)[1]["rank"] == 2     # measured: the same rank
    text = render_train(doc)
    assert "compute + in collectives + waiting" in text and "slowest rank 2 (slowed with --slow-rank): compute " in text
    row0 = next(ln for ln in text.splitlines() if ln.split()[:2] == ["0", "0,0,0"])
    assert row0.split()[2:10] == ["100.00", "ms", "20.00", "ms", "100.00", "ms", "220.00", "ms"], row0
    json.dumps(doc, allow_nan=False)


def _dashboard_metric_names() -> set[str]:
    dash = json.loads((EXAMPLES / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs.append(dash["templating"]["list"][1]["definition"])
    return {m for e in exprs for m in re.findall(r"\b(shardlab_[a-z_]+)", e)}


def test_grafana_dashboard_uses_exactly_the_exported_names():
    used = _dashboard_metric_names()
    exported = series_names(gpu=True)
    assert used <= exported, used - exported                       # no panel queries a name the code does not export
    families = {m.name for m in METRICS}
    covered = {f for f in families if any(s in used for s in next(m for m in METRICS if m.name == f).series)}
    assert covered == families, families - covered                 # and every exported family has a panel


def test_prometheus_example_config_targets_and_syntax():
    cfg = yaml.safe_load((EXAMPLES / "prometheus.yml").read_text())
    targets = cfg["scrape_configs"][0]["static_configs"][0]["targets"]
    assert targets == ["127.0.0.1:9510", "127.0.0.1:9511"] and cfg["scrape_configs"][0]["metrics_path"] == "/metrics"
    if shutil.which("promtool"):
        r = subprocess.run(["promtool", "check", "config", str(EXAMPLES / "prometheus.yml")], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr


def test_docs_list_every_metric():
    doc = (ROOT / "docs" / "observability.md").read_text()
    missing = [s for m in METRICS for s in m.series[:1] if s not in doc]
    assert not missing, missing


def test_tensorboard_scalars_read_back(tmp_path):
    pytest.importorskip("tensorboardX")
    from shardlab.runtime.observe.tensorboard import read_scalars, write_scalars

    info = write_scalars(_records(2.0, n_steps=5, world=2), str(tmp_path / "tb"))
    back = read_scalars(str(tmp_path / "tb"))
    assert info["runs"] == ["rank0", "rank1"] == sorted(back)
    assert [s for s, _ in back["rank1"]["step/seconds"]] == [0, 1, 2, 3, 4]
    assert back["rank1"]["step/compute_seconds"][0][1] == pytest.approx(0.2)
    assert back["rank0"]["step/wait_seconds"][0][1] == pytest.approx(0.1)


def test_logs_reader_on_a_captured_cpu_run_and_an_nccl_example():
    from shardlab.runtime.observe.logs import checks, parse_startup

    cpu = parse_startup((DATA / "logs" / "torchrun-gloo-ddp-2ranks.log").read_text())
    assert cpu["torchrun"]["nproc_per_node"] == "2" and cpu["rendezvous"]["global_ranks"] == [[0, 1]]
    assert cpu["rendezvous"]["global_world_sizes"] == [[2, 2]] and cpu["ddp"][1]["backend_name"] == "gloo"
    assert cpu["ddp"][0]["total_parameter_size_bytes"] == 919808      # the tiny preset's fp32 weights
    assert all(c["ok"] for c in checks(cpu))
    nccl = parse_startup((DATA / "logs" / "nccl-2nodes-4gpus.log").read_text())
    n = nccl["nccl"]
    assert n["version"] == "2.32.3+cuda12.9" and sorted(n["ranks"]) == [0, 1, 2, 3]
    assert {r["host"] for r in n["ranks"].values()} == {"node0", "node1"} and n["networks"] == {"IB": 4}
    assert n["transports"] == {"NET/IB": 4, "P2P/IPC": 2} and all(c["ok"] for c in checks(nccl))
    # a hop inside a host that claims the network is caught
    bad = (DATA / "logs" / "nccl-2nodes-4gpus.log").read_text().replace("0[0] -> 1[1] via P2P/IPC", "0[0] -> 1[1] via NET/IB/0")
    assert not all(c["ok"] for c in checks(parse_startup(bad)))


def test_logs_command_json_and_errors(tmp_path):
    code, out, _ = cli_main("logs", str(DATA / "logs" / "nccl-2nodes-4gpus.log"), "--json")
    d = json.loads(out)
    assert code == 0 and d["nccl"]["ranks"]["3"]["host"] == "node1" and all(c["ok"] for c in d["checks"])
    empty = tmp_path / "empty.log"
    empty.write_text("nothing here\n")
    code, _, err = cli_main("logs", str(empty))
    assert code == 2 and err.count("\n") == 1 and "NCCL_DEBUG=INFO" in err


def test_infer_slow_rank_prediction_is_made():
    """`run infer --slow-rank` prints a predicted drag (the decode roofline on CPU cores in fp32)."""
    from types import SimpleNamespace

    from shardlab.catalog import get_catalog
    from shardlab.estimate.straggler import parse_slow_rank
    from shardlab.runtime.observe.report import infer_prediction

    spec = get_catalog().model("gpt2")
    req = SimpleNamespace(observe=SimpleNamespace(slow_rank=parse_slow_rank("1:4:0.1")), max_new_tokens=40)
    pred = infer_prediction(spec, 2, 16, req)
    assert pred is not None and "decode roofline" in pred["source"]
    assert json.dumps(pred, allow_nan=False)


@pytest.mark.parametrize("steps, which", [(1, "step 0, the only one"), (2, "step 1 (it carries the collective recorder")])
def test_the_instrumented_step_note_names_a_step_the_run_has(steps, which):
    from shardlab.runtime.train_report import step_time_notes

    doc = {"step_time": {"instrumented": True}, "workload": {"steps": steps}, "ranks": [{"device": "cuda"}]}
    note, = step_time_notes(doc)
    assert f"with --steps {steps} it is {which}" in note and "median of steps 2 and later" in note
    assert ("step 1" in note) == (steps > 1)
    assert "--steps 3 or more" in note and "torch/utils/benchmark/utils/timer.py" in note


def test_a_lone_rank_waits_for_nobody():
    """One rank: its step-end barrier (about 150 µs on gloo) is the call's own cost, counted in collectives, not
    'waiting for other ranks'; the step still adds up."""
    from shardlab.runtime.observe.summary import rank_time_split

    recs = [{**r, "wait_s": 0.00015} for r in _records(1.0, world=1)]
    sp = rank_time_split(recs, skip_steps=2)[0]
    assert sp["wait_s"] == 0.0 and sp["collectives_s"] == pytest.approx(0.02015)
    assert sp["step_s"] == pytest.approx(0.1 + 0.02 + 0.00015)


def test_logs_reader_takes_paths_with_dashes():
    """torch's glog prefix carries the file's path; a venv inside a project named with a dash must still parse."""
    from shardlab.runtime.observe.logs import parse_startup

    text = (DATA / "logs" / "torchrun-gloo-ddp-2ranks.log").read_text()
    dashed = text.replace(" torch/distributed/", " /home/me/my-proj/.venv/lib/python3.11/site-packages/torch/distributed/")
    assert dashed != text
    facts = parse_startup(dashed)
    assert facts["torchrun"]["nproc_per_node"] == "2" and facts["rendezvous"]["global_ranks"] == [[0, 1]]


def test_live_table_marks_the_slow_rank():
    """The live table's last column points at a rank whose own time (step minus waiting) is over 10% above the
    others'; ranks within that are not marked."""
    from shardlab.runtime.observe.live import render, slow_rank

    def row(rank, step_s, wait_s):
        return {"rank": rank, "node": "n0", "steps": 5, "planned": 10, "step_s": step_s, "tokens_per_s": 100.0,
                "loss": 1.0, "coll_s": 0.01, "blocked_s": 0.01, "wait_s": wait_s, "rss_bytes": 0, "gpu_util": None}
    rows = [row("0", 0.30, 0.15), row("1", 0.30, 0.0), row("2", 0.30, 0.14)]     # rank 1 never waits: it is slow
    assert slow_rank(rows) == "1"
    text = render(rows, "live")
    assert [ln.endswith("<- slowest") for ln in text.splitlines()[-3:]] == [False, True, False]
    even = [row("0", 0.30, 0.01), row("1", 0.30, 0.0), row("2", 0.30, 0.02)]
    assert slow_rank(even) is None and "slowest" not in render(even, "live")


def test_long_runs_summarise_their_losses():
    from shardlab.runtime.train_report import loss_line

    long = loss_line([7.0 - 0.01 * i for i in range(200)], 0)
    assert "step 0 7.0000 -> step 199 5.0100" in long and "lowest 5.0100 at step 199" in long
    assert "every 20th step" in long and "(all 200 in --json)" in long and len(long) < 300
    assert loss_line([3.0, 2.5], 1) == "loss per step (global batch, seen by rank 1): 3.0000  2.5000"
