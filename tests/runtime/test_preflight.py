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
    check("node0:29500", node0=["127.0.0.1"], worker1=["127.0.1.1"])   # the endpoint is this machine
    check("node0:29500", "10.0.0.2", node0=["10.0.0.1"])          # --local-addr given: nothing to look up


@pytest.mark.parametrize("table,match", [
    ({"node0": ["10.0.0.1"]}, "'worker1' does not resolve"),
    ({"node0": ["10.0.0.1"], "worker1": ["127.0.1.1"]}, "resolves only to 127.0.1.1 (loopback)"),
])
def test_an_unreachable_name_is_one_line_with_the_fix(table, match):
    with pytest.raises(ShardlabError, match=re.escape(match)) as e:
        check("node0:29500", **table)
    assert "--local-addr ADDR" in str(e.value) and "\n" not in str(e.value)
