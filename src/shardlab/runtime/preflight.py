"""Checks a node makes before it starts its ranks in a multi-node job, so a network mistake is one line, not a timeout.

torchrun's c10d rendezvous hands every node the address the others use to reach it: its ``--local-addr``, else its
host name (torch.distributed.run, ``--local-addr`` help). A host name that does not resolve, or resolves only to a
loopback address (Debian's ``127.0.1.1 hostname`` line in /etc/hosts), leaves the other nodes waiting until the job's
timeout. All nodes on one machine (an endpoint on loopback) need no check.
"""

from __future__ import annotations

import ipaddress
import socket

from shardlab.errors import ShardlabError


def _loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr.split("%", 1)[0]).is_loopback
    except ValueError:
        return addr == "localhost"


def check_reachable_name(endpoint: str, local_addr: str | None, *, hostname=socket.gethostname,
                         resolve=socket.getaddrinfo) -> None:
    """Refuse, in one line naming the fix, a node the others could not reach by the name torchrun hands out."""
    host = endpoint.rsplit(":", 1)[0].strip("[]")
    if local_addr or _loopback(host):
        return
    try:
        host_ips = {ai[4][0] for ai in resolve(host, None)}
    except (OSError, UnicodeError):
        host_ips = set()
    if host_ips and all(_loopback(ip) for ip in host_ips):
        return                     # the endpoint is this machine itself: every node is here
    name = hostname()
    try:
        ips = {ai[4][0] for ai in resolve(name, None)}
    except (OSError, UnicodeError):
        raise ShardlabError(f"this node's host name '{name[:64]}' does not resolve, and the other nodes reach it by "
                            f"that name (torchrun hands it out): add it to /etc/hosts on every node, or pass "
                            f"--local-addr ADDR (this node's address on the network the nodes share)") from None
    if ips and all(_loopback(ip) for ip in ips):
        raise ShardlabError(f"this node's host name '{name[:64]}' resolves only to {sorted(ips)[0]} (loopback), which the "
                            f"other nodes cannot reach: pass --local-addr ADDR (this node's address on the network the "
                            f"nodes share), or map the name to that address in /etc/hosts")
