"""run train inside a Slurm allocation: the rendezvous read from Slurm's environment (runtime/slurm.py)."""

import argparse

import pytest

from shardlab.errors import ShardlabError
from shardlab.runtime.slurm import first_host, from_environment

JOB = {"SLURM_JOB_ID": "4242", "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_NTASKS": "2",
       "SLURM_JOB_NODELIST": "node[07-08]"}


@pytest.mark.parametrize("text,want", [("node[07-08]", "node07"), ("node[3,5-9],gpu1", "node3"), ("a,b", "a"),
                                       ("x[3]", "x3"), ("gpu-[010-012]-ib", "gpu-010-ib"), ("single", "single")])
def test_first_host_of_a_node_list(text, want):
    assert first_host(text) == want


def test_rendezvous_from_the_environment():
    r = from_environment(JOB)
    assert (r.nnodes, r.node_rank, r.endpoint, r.rdzv_id) == (2, 1, "node07:29500", "slurm-4242")
    assert from_environment({}) is None and from_environment({**JOB, "SLURM_NNODES": "1", "SLURM_NTASKS": "1"}) is None


@pytest.mark.parametrize("change,match", [({"SLURM_NTASKS": "4"}, "--ntasks-per-node=1"),
                                          ({"SLURM_NODEID": "2"}, "outside 0..1"), ({"SLURM_NNODES": "x"}, "whole number"),
                                          ({"SLURM_JOB_NODELIST": ""}, "names no host"),
                                          ({"SLURM_JOB_ID": "1;rm -rf /"}, "not a job id")])
def test_a_broken_environment_is_one_line(change, match):
    with pytest.raises(ShardlabError, match=match):
        from_environment({**JOB, **change})


def test_run_flags_come_from_slurm_unless_given(monkeypatch):
    from shardlab.cli.runtime_cmds import torchrun_args

    for k, v in JOB.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr("shardlab.runtime.preflight.check_reachable_name", lambda *a, **k: None)   # no node07 here
    blank = dict(nnodes=None, node_rank=None, rdzv_endpoint=None, rdzv_id=None, rdzv_backend=None)
    out = torchrun_args(argparse.Namespace(**blank))
    # Slurm numbers the nodes (SLURM_NODEID): a static rendezvous keeps that order (global ranks 2 and 3 here)
    assert out == ("--nnodes", "2", "--node-rank", "1", "--rdzv-backend", "static", "--rdzv-endpoint", "node07:29500",
                   "--rdzv-conf", "timeout=180", "--rdzv-id", "slurm-4242")
    given = torchrun_args(argparse.Namespace(**{**blank, "nnodes": "2", "rdzv_endpoint": "head:29400", "rdzv_id": "mine"}))
    assert "head:29400" in given and "node07:29500" not in given        # flags win over the environment
