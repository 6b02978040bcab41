"""End to end through the real entry point and torchrun (gloo on CPU; NCCL on GPUs when present).

Each case costs 10-25 s on 2 cores (torchrun start-up and torch imports dominate). Parity tolerances are
explained in ``shardlab.runtime.compare.parity`` (loss 1e-5, gradients 1e-6 absolute).
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.slow
L = 4  # blocks of the tiny presets


def shardlab(*args, env=None, timeout=240):
    e = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "shardlab", *args], capture_output=True, text=True, timeout=timeout, env=e)


def run_json(*args, **kw):
    r = shardlab(*args, "--json", **kw)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_fsdp_train_json_contract_parity_and_exact_memory():
    d = run_json("run", "train", "--strategy", "fsdp", "--nproc-per-node", "2", "--steps", "3", "--check-parity")
    assert d["strategy"] == "fsdp" and d["world_size"] == 2 and len(d["losses"]) == 3
    assert d["losses"][-1] < d["losses"][0]                      # AdamW learns the synthetic chain
    assert d["parity"]["ok"], d["parity"]
    assert d["memory_states_exact"] and [p["rank"] for p in d["predicted"]] == [0, 1]
    for r in d["ranks"]:
        c = r["collectives"]
        assert r["step_time_s"] > 0 and r["peak_bytes"]["by_category"]["Total"] > 0
        # FSDP2: one all-gather per unit (4 blocks + root) in forward, a reduce-scatter per unit in backward
        assert c["all_gather"]["forward"]["count"] == L + 1 and c["reduce_scatter"]["backward"]["count"] == L + 1
    st = d["step_time"]
    assert st["slowest_rank"] in (0, 1) and st["spread"] >= 0
    assert st["instrumented"] is False and st["timed_steps"] == 1   # step 2: no tracker, no recorder
    assert st["predicted_catalog_gpu"] == "cpu-core"
    # the project's one sign convention (validate's too): (predicted − measured) / measured
    assert st["error"] == pytest.approx((st["predicted_s"] - st["measured_median_s"]) / st["measured_median_s"])
    for r in d["memory_comparison"]:
        p, m = r["predicted"]["activations"], r["measured"]["activations"]
        assert r["activations_error"] == pytest.approx((p - m) / m)


def test_interleaved_pipeline_with_tied_embeddings_matches_one_process():
    d = run_json("run", "train", "--strategy", "pp", "--nproc-per-node", "2", "--schedule", "interleaved", "--model",
                 "tiny-gpt2", "--steps", "2", "--check-parity")
    assert d["layout"]["vpp"] == 2 and d["loss_rank"] == 1         # chunk 3 (the head) lives on rank 1
    assert d["parity"]["ok"], d["parity"]
    assert d["memory_states_exact"]                                 # the head copy of the tied embedding included
    # per step, each of the 3 chunk boundaries carries one activation forward and one gradient backward per
    # micro-batch, filed under the phase that built it (1F1B fires a forward send with a backward receive);
    # the first step's warm-up vote and shape exchange are setup, not per-step traffic
    m = d["microbatches"]
    for op in ("send", "recv"):
        for ph in ("forward", "backward"):
            assert sum(r["collectives"][op][ph]["count"] for r in d["ranks"]) == 3 * m, (op, ph, d["ranks"])
        assert all(r["setup_collectives"][op]["first step"]["count"] > 0 for r in d["ranks"])


def test_megatron_tp_issues_one_all_reduce_per_attention_and_mlp_on_gloo():
    # the launching process never imports torch without --check-parity (only the ranks do: ~3 s saved per run)
    probe = ("import atexit, sys; atexit.register(lambda: print('driver imported torch:', 'torch' in sys.modules, "
             "file=sys.stderr)); from shardlab.cli import main; sys.exit(main(sys.argv[1:]))")
    r = subprocess.run([sys.executable, "-c", probe, "run", "train", "--strategy", "tp-megatron", "--nproc-per-node", "2",
                        "--global-batch", "2", "--steps", "2", "--json"], capture_output=True, text=True, timeout=240,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert "driver imported torch: False" in r.stderr
    d = json.loads(r.stdout)
    assert d["megatron_breakdown"]["mlp"]["per_instance_per_microbatch"]["all_reduce/forward"] == 1
    for r in d["ranks"]:
        ar = r["collectives"]["all_reduce"]
        # seen by the dispatcher (real gloo) and by the f/g operators' own counter: 2 per block + embedding / head
        assert ar["forward"]["count"] == 2 * L + 1 == r["megatron_counter"]["all_reduce/forward"]
        assert ar["backward"]["count"] == 2 * L + 1 == r["megatron_counter"]["all_reduce/backward"]
    assert d["memory_states_exact"]


def test_expert_parallel_on_gloo_matches_one_process_and_comm_plan():
    """ddp+ep on 2 ranks (each holds 2 of tiny-moe's 4 experts): the all-to-alls go through gloo, the gradients
    equal one process's, model states equal the memory model's, and the dispatcher's calls and average bytes
    equal `comm plan`'s."""
    d = run_json("run", "train", "--strategy", "ddp+ep", "--nproc-per-node", "2", "--model", "tiny-moe", "--steps", "2",
                 "--check-parity")
    assert d["layout"]["ep"] == 2 and d["parity"]["ok"], d["parity"]
    assert d["memory_states_exact"]
    rows = {r["collective"]: r for r in d["expert_dispatch"]}
    assert set(rows) == {"all_gather/forward", "all_to_all/forward", "all_to_all/backward"}
    assert all(r["match"] for r in rows.values()), rows
    assert rows["all_to_all/forward"]["measured_calls"] == 2 * L
    assert rows["all_to_all/forward"]["measured_bytes_per_call"] == 4 * 64 * 2 * 64 * 4   # b·s·k·h fp32
    for r in d["ranks"]:   # the tap saw them too: dispatch and combine in each pass, the counts in forward
        assert r["collectives"]["all_to_all"]["forward"]["count"] == 2 * L
        assert r["collectives"]["all_to_all"]["backward"]["count"] == 2 * L


@pytest.fixture(scope="module")
def two_hosts():
    """Two hosts on this machine: network namespaces joined by a veth pair, [(namespace, address)] (CI runs as root);
    None where namespaces cannot be made, and the nodes then meet on loopback."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        yield None
        return
    tag, net = f"sl{os.getpid() % 100000}", f"10.78.{os.getpid() % 250}"
    ns, veth, addr = (f"{tag}a", f"{tag}b"), (f"{tag}va", f"{tag}vb"), (f"{net}.1", f"{net}.2")
    steps = [["ip", "netns", "add", ns[0]], ["ip", "netns", "add", ns[1]],
             ["ip", "link", "add", veth[0], "type", "veth", "peer", "name", veth[1]]]
    for k in (0, 1):
        steps += [["ip", "link", "set", veth[k], "netns", ns[k]], ["ip", "-n", ns[k], "addr", "add", f"{addr[k]}/24", "dev",
                                                                 veth[k]],
                  ["ip", "-n", ns[k], "link", "set", veth[k], "up"], ["ip", "-n", ns[k], "link", "set", "lo", "up"]]
    try:
        for cmd in steps:
            subprocess.run(cmd, check=True, capture_output=True, timeout=20)
        yield list(zip(ns, addr))
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError):
        yield None
    finally:
        for n in ns:                                    # deleting a namespace deletes its end of the veth pair
            subprocess.run(["ip", "netns", "del", n], capture_output=True, timeout=20)


def _two_nodes(strategy: str, hosts, *extra: str, node_ranks: bool = False, nproc: int = 1) -> tuple[dict, dict]:
    """Two nodes (``nproc`` ranks each) joined by torchrun's c10d rendezvous (``node_ranks``: each given --node-rank, a static
    rendezvous), in two network namespaces when ``hosts`` has them (each node names its address with --local-addr),
    else both on loopback: (head's JSON, other's JSON), the head being the node that ran global rank 0 (c10d numbers
    nodes in the order they join; with node ranks it must be node 0)."""
    from shardlab.runtime.dist import free_port

    port = free_port()
    common = ["run", "train", "--strategy", strategy, "--nproc-per-node", str(nproc), "--nodes", "2", "--steps", "2",
              "--timeout", "120", *extra, "--json"] + ([] if node_ranks else ["--rdzv-id", "e2e"])
    rank = [["--node-rank", str(k)] if node_ranks else [] for k in (0, 1)]
    if hosts:
        cmds = [["ip", "netns", "exec", n, sys.executable, "-m", "shardlab", *common, *rank[k], "--rdzv-endpoint",
                 f"{hosts[0][1]}:{port}", "--local-addr", a] for k, (n, a) in enumerate(hosts)]
    else:
        cmds = [[sys.executable, "-m", "shardlab", *common, *rank[k], "--rdzv-endpoint", f"127.0.0.1:{port}"]
                for k in (0, 1)]
    e = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e) for c in cmds]
    try:
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-2000:]
    d0, d1 = (json.loads(out) for out, _ in outs)
    if node_ranks:
        assert not d0.get("report_elsewhere") and d1["report_elsewhere"]      # node 0 ran global rank 0
    return (d1, d0) if d0.get("report_elsewhere") else (d0, d1)


def test_two_nodes_are_one_job_with_one_report(two_hosts):
    """fsdp+tp over two nodes of two ranks each (two network namespaces where they can be made) with --check-parity:
    the node that ran global rank 0 reports every rank (memory exact, parity ok on the gathered gradients); the other node exits 0 with
    a document that says where the report is."""
    head, other = _two_nodes("fsdp+tp", two_hosts, "--check-parity", nproc=2)
    assert head["world_size"] == 4 and [r["rank"] for r in head["ranks"]] == [0, 1, 2, 3]
    assert head["layout"]["tp"] == 2 and head["layout"]["dp"] == 2        # TP pairs inside a node, FSDP across
    assert head["parity"]["ok"] and not head["parity"]["missing"] and head["memory_states_exact"]
    assert {r["node"]["group_rank"] for r in head["ranks"]} == {0, 1}
    assert other["report_elsewhere"] is True and other["ranks_here"] == [2, 3] and "global rank 0" in other["report"]
    from shardlab.runtime.train_report import render_train

    line = render_train(other)
    assert "\n" not in line and "ran rank(s) 2, 3 of 4" in line and "parity" in line


def test_pipeline_across_two_nodes_checks_parity_on_every_stage(two_hosts):
    """ddp+pp over two nodes of two ranks each, given their node ranks (a static rendezvous: node 0 hosts the store
    and runs ranks 0 and 1): some stages' gradients live on the other node; gathered to rank 0, parity compares every
    tensor (it reported 19 "missing" before the job's report was one)."""
    head, other = _two_nodes("ddp+pp", two_hosts, "--check-parity", node_ranks=True, nproc=2)
    assert head["layout"]["pp"] == 2 and head["layout"]["dp"] == 2 and head["parity"]["ok"]
    assert head["parity"]["missing"] == [] and head["parity"]["tensors_compared"] == 39
    assert other["report_elsewhere"] and other["ranks_here"] == [2, 3] and [r["rank"] for r in head["ranks"]] == [0, 1, 2, 3]


def test_hung_rank_ends_the_job_and_is_named():
    # the peers' collectives time out after 5 s (process-group timeout), well before the job's 60 s
    r = shardlab("run", "train", "--strategy", "ddp", "--nproc-per-node", "2", "--steps", "2", "--timeout", "60",
                 env={"SHARDLAB_FAULT": "1:hang:step 1", "SHARDLAB_PG_TIMEOUT_S": "5"}, timeout=120)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "rank 1 stopped responding at 'step 1" in r.stderr


def test_infer_tp2_tokens_equal_tp1_and_memory_equals_model():
    d = run_json("run", "infer", "--tp", "2", "--max-new-tokens", "8")
    assert len(d["tokens"]) == 8 and d["matches_tp1"] and d["ranks_agree"]
    assert d["memory_exact"]
    for r in d["ranks"]:
        assert r["weight_bytes"] == d["predicted"]["weight_bytes"] and r["kv_cache_bytes"] == d["predicted"]["kv_cache_bytes"]
    assert d["latency_per_token_s"] > 0
    # the f/g counter covers the counted pass only, as the dispatch recorder does (it counted both passes)
    for r in d["ranks"]:
        assert r["megatron_counter"] == {f"{op}/{ph}": v["count"] for op, d_ in r["collectives"].items()
                                         for ph, v in d_.items()}, r


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu
@pytest.mark.skipif(_gpus() == 0, reason="needs a CUDA GPU (NCCL path)")
def test_gpu_nccl_train_and_infer():
    n = str(min(2, _gpus()))
    d = run_json("run", "train", "--strategy", "fsdp", "--nproc-per-node", n, "--device", "cuda", "--check-parity")
    assert d["ranks"][0]["backend"] == "nccl" and d["parity"]["ok"] and d["memory_states_exact"]
    i = run_json("run", "infer", "--tp", n, "--device", "cuda")
    assert i["matches_tp1"] and i["memory_exact"]


_LISTEN_PROBE = """
import json, os
port = int(os.environ["MASTER_PORT"])
found = []
for path, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
    for line in open(path).read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        addr, p = local.split(":")
        if state == "0A" and int(p, 16) == port:
            found.append(addr)
print(json.dumps(found))
"""


def test_the_rendezvous_store_listens_on_loopback_only(tmp_path):
    """torchrun alone listens on every interface (``*:port``); the launcher's torchrun (runtime.bound_run) hands the
    store a socket bound to the address named: loopback for one node (0100007F = 127.0.0.1 in /proc/net/tcp)."""
    script = tmp_path / "probe.py"
    script.write_text(_LISTEN_PROBE)
    r = subprocess.run([sys.executable, "-m", "shardlab.runtime.bound_run", "--standalone", "--nproc-per-node", "1",
                        str(script)], capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    listeners = json.loads(r.stdout.strip().splitlines()[-1])
    assert listeners == ["0100007F"]


@pytest.mark.parametrize("how", [["--rdzv-id", "alone"], ["--node-rank", "0"]], ids=["c10d", "static"])
def test_a_node_left_alone_says_how_many_nodes_joined(how):
    """One of two nodes started: c10d's waiting node is stopped at --timeout and the launcher reads the round's
    participants from the store first; a static rendezvous' host store gives up before --timeout and counts them."""
    from shardlab.runtime.dist import free_port

    r = shardlab("run", "train", "--strategy", "ddp", "--nproc-per-node", "1", "--nodes", "2", "--steps", "1",
                 "--timeout", "6" if "--rdzv-id" in how else "10", *how, "--rdzv-endpoint", f"127.0.0.1:{free_port()}",
                 timeout=60)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr[-1500:]
    assert "only 1 of its 2 nodes joined" in r.stderr
