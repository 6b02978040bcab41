"""A node the others could not reach by the name torchrun hands out is refused before its ranks start."""

import re
import socket

import pytest

from shardlab.errors import ShardlabError
from shardlab.runtime.preflight import check_reachable_name


def resolver(table):
    def resolve(host, port):
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, 0)) for ip in table[host]]
    return resolve


def check(endpoint, local_addr=None, **table):
    check_reachable_name(endpoint, local_addr, hostname=lambda: "worker1", resolve=resolver(table))


def test_reachable_names_and_one_machine_pass():
    check("node0:29500", node0=["10.0.0.1"], worker1=["10.0.0.2"])
    check("127.0.0.1:29500")                                      # every node on this machine
    check("node0:29500", "127.0.0.1", node0=["10.0.0.1"])         # --local-addr given (held here): nothing to look up


def test_an_endpoint_name_that_resolves_to_loopback_here_is_refused():
    """Debian's '127.0.1.1 hostname' line on the store's node: the store would listen where no other node reaches."""
    with pytest.raises(ShardlabError, match="resolves only to 127.0.1.1 .loopback. on this node"):
        check("node0:29500", node0=["127.0.1.1"], worker1=["10.0.0.2"])


def test_an_endpoint_that_does_not_resolve_and_an_address_not_held_here_are_refused():
    with pytest.raises(ShardlabError, match="endpoint's host 'node9' does not resolve on this node"):
        check("node9:29500", worker1=["10.0.0.2"])
    with pytest.raises(ShardlabError, match="--local-addr 192.0.2.77 is not an address of this node"):
        check("node0:29500", "192.0.2.77", node0=["10.0.0.1"])
    from shardlab.runtime import preflight

    assert preflight._routable("127.0.0.1", 29500)            # a UDP connect picks a route and sends nothing


def test_an_endpoint_without_a_route_is_refused(monkeypatch):
    """No route to the endpoint's address (the kernel's UDP connect fails at once): one line before anything starts;
    stubbed here, since this host may route every address."""
    monkeypatch.setattr("shardlab.runtime.preflight._routable", lambda ip, port: False)
    with pytest.raises(ShardlabError, match="no route to the rendezvous endpoint node0 .10.0.0.1."):
        check("node0:29500", node0=["10.0.0.1"], worker1=["10.0.0.2"])


@pytest.mark.parametrize("table,match", [
    ({"node0": ["10.0.0.1"]}, "'worker1' does not resolve"),
    ({"node0": ["10.0.0.1"], "worker1": ["127.0.1.1"]}, "resolves only to 127.0.1.1 (loopback)"),
])
def test_an_unreachable_name_is_one_line_with_the_fix(table, match):
    with pytest.raises(ShardlabError, match=re.escape(match)) as e:
        check("node0:29500", **table)
    assert "--local-addr ADDR" in str(e.value) and "\n" not in str(e.value)


def test_local_addr_names_the_interface_and_the_store_host(monkeypatch):
    """--local-addr: gloo and NCCL are pointed at the interface that holds it (unless set), and the node whose address
    is the endpoint hosts the c10d store (torchrun would look for the endpoint among its host name's addresses)."""
    import argparse

    from shardlab.cli.runtime_cmds import torchrun_args
    from shardlab.runtime.preflight import bind_collectives_to, interface_of

    assert interface_of("127.0.0.1") == "lo" and interface_of("192.0.2.77") is None and interface_of("x") is None
    env = {"GLOO_SOCKET_IFNAME": "eth9"}
    assert bind_collectives_to("127.0.0.1", env) == "lo" and env == {"GLOO_SOCKET_IFNAME": "eth9",
                                                                      "NCCL_SOCKET_IFNAME": "lo"}
    monkeypatch.setattr("shardlab.runtime.preflight.check_reachable_name", lambda *a, **k: None)
    monkeypatch.setattr("shardlab.runtime.preflight.bind_collectives_to", lambda *a, **k: None)
    base = dict(nnodes="2", node_rank=None, rdzv_endpoint="10.0.0.1:29500", rdzv_id="j", rdzv_backend=None)
    head = torchrun_args(argparse.Namespace(**base, local_addr="10.0.0.1"))
    other = torchrun_args(argparse.Namespace(**base, local_addr="10.0.0.2"))
    assert head[-4:] == ("--local-addr", "10.0.0.1", "--rdzv-conf", "is_host=1")
    assert other[-2:] == ("--local-addr", "10.0.0.2") and "--rdzv-conf" not in other
