"""The launcher's failure summaries (from rank files and torchrun's report) and the measuring tools."""

import json

import pytest

from shardlab.runtime.launch import LaunchResult, summarise, torchrun_command

TORCHRUN_REPORT = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
shardlab.runtime.train_worker FAILED
------------------------------------------------------------
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 5128)  (SIGTERM)
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_13:17:17
  host      : node7
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 5129)
============================================================
"""


def _result(tmp_path, rc=1, stderr="", timed_out=False):
    return LaunchResult(rc, "", stderr, 1.0, tmp_path, timed_out)


def _write(tmp_path, name, doc):
    (tmp_path / name).write_text(json.dumps(doc))


def test_own_exception_beats_peers_that_timed_out(tmp_path):
    _write(tmp_path, "rank0.error.json", {"rank": 0, "error": "RuntimeError: Timed out waiting 5000ms for recv", "time": 2})
    _write(tmp_path, "rank1.error.json", {"rank": 1, "error": "ValueError: bad shape", "time": 1})
    rank, msg = summarise(_result(tmp_path), 60)
    assert rank == 1 and msg.startswith("rank 1 failed: ValueError: bad shape") and "\n" not in msg


def test_silent_rank_is_blamed_when_peers_only_waited(tmp_path):
    for r in (0, 1):
        _write(tmp_path, f"rank{r}.heartbeat.json", {"rank": r, "seq": 5 - r, "phase": f"step {2 - r}", "time": 0})
    _write(tmp_path, "rank0.error.json", {"rank": 0, "error": "RuntimeError: [/x/y.cc:78] Timed out waiting 5000ms"})
    rank, msg = summarise(_result(tmp_path), 60)
    assert rank == 1 and "rank 1 stopped responding at 'step 1'" in msg and "/x/y.cc" not in msg


def test_torchrun_root_cause_is_parsed(tmp_path):
    rank, msg = summarise(_result(tmp_path, stderr=TORCHRUN_REPORT), 60)
    assert rank == 3 and "killed by SIGKILL on host node7" in msg


def test_timeout_without_progress_difference_says_so(tmp_path):
    for r in (0, 1):
        _write(tmp_path, f"rank{r}.heartbeat.json", {"rank": r, "seq": 3, "phase": "step 1", "time": 0})
    rank, msg = summarise(_result(tmp_path, rc=-9, timed_out=True), 30)
    assert rank is None and msg.startswith("timed out after 30 s")


def test_a_rendezvous_that_never_gathered_its_nodes_says_so(tmp_path):
    """A node whose peers never joined: no rank of it started, so the summary names the rendezvous, not a hung rank."""
    cmd = torchrun_command("m", 2, [], ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "node0:29500"])
    res = LaunchResult(-9, "", "", 30.0, tmp_path, True, command=cmd)
    rank, msg = summarise(res, 30)
    assert rank is None and "before any rank of this node started" in msg and "node0:29500" in msg
    assert "its 2 nodes" in msg and "start the same command on every node" in msg
    single = LaunchResult(-9, "", "", 30.0, tmp_path, True, command=torchrun_command("m", 2, []))
    assert "no rank reported an error" in summarise(single, 30)[1]        # one node: the old wording


def test_a_rank_killed_during_start_up_is_blamed_not_a_survivor(tmp_path):
    """Rank 3 was killed before its first heartbeat (torchrun's root cause says so); ranks 0-2 waited at 'init process
    group' and left no result: the summary names rank 3, not the first silent survivor."""
    for r in (0, 1, 2):
        _write(tmp_path, f"rank{r}.heartbeat.json", {"rank": r, "seq": 1, "phase": "init process group", "time": 0})
    rank, msg = summarise(_result(tmp_path, stderr=TORCHRUN_REPORT), 60)
    assert rank == 3 and msg.startswith("rank 3 died during start-up (killed by SIGKILL on host node7)")


def test_the_rendezvous_timeout_keeps_torchruns_own_exception(tmp_path):
    cmd = torchrun_command("m", 2, [], ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "node0:29500"])
    err = ("Traceback (most recent call last):\n  ...\ntorch.distributed.elastic.rendezvous.api.RendezvousConnectionError: "
           "The connection to the C10d store has failed.\n")
    rank, msg = summarise(LaunchResult(-9, "", err, 30.0, tmp_path, True, command=cmd), 30)
    assert msg.endswith("torchrun said: torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The "
                        "connection to the C10d store has failed.")


def test_rendezvous_flags_replace_standalone():
    assert "--standalone" in torchrun_command("m", 2, [])
    cmd = torchrun_command("m", 8, ["--a"], ["--nnodes", "2", "--rdzv-endpoint", "h:29500", "--rdzv-backend", "c10d"])
    assert "--standalone" not in cmd and cmd[-3:] == ["-m", "m", "--a"] and "--nnodes" in cmd


torch = pytest.importorskip("torch")


def test_saved_activations_count_what_autograd_keeps():
    """x @ W then relu: autograd keeps x (for dW) and the relu output (for its backward); not the weight."""
    from shardlab.runtime.metrics import SavedActivations

    w = torch.nn.Parameter(torch.randn(32, 16))
    x = torch.randn(8, 32)
    with SavedActivations([w]) as sa:
        y = torch.relu(x @ w)
    assert sa.peak_bytes == 8 * 32 * 4 + 8 * 16 * 4
    y.sum().backward()
    del y
    assert sa.current_bytes == 8 * 32 * 4  # the relu output went with the graph; x is still ours
    del x
    assert sa.current_bytes == 0


def test_model_state_bytes_count_storages_once():
    from shardlab.runtime.metrics import model_state_bytes, storage_bytes

    p = torch.nn.Parameter(torch.zeros(10, 4))
    p.grad = torch.ones(10, 4)
    opt = torch.optim.AdamW([p], foreach=False)
    opt.step()
    got = model_state_bytes([p], opt)
    assert got == {"weights": 160, "gradients": 160, "optimizer": 320, "optimizer_step_counters": 4}
    base = torch.zeros(100)
    assert storage_bytes([base[:10], base[10:20]]) == 400  # two views of one storage: the storage once
