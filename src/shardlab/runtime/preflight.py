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


BIND_ANY_ENV = "SHARDLAB_STORE_BIND_ANY"
"""'1': a wildcard bind address is allowed (asked for explicitly, ``--rdzv-bind-any``)."""


def is_wildcard(addr: str) -> bool:
    """True for an address that listens on every interface: 0.0.0.0 and :: in any spelling the resolver takes as one
    ('0', '0.0', '0x0': inet_aton's forms) and the empty host."""
    addr = addr.strip("[]")
    if not addr:
        return True
    try:
        return ipaddress.ip_address(addr.split("%", 1)[0]).is_unspecified
    except ValueError:
        pass
    try:
        return socket.inet_aton(addr) == b"\0\0\0\0"
    except OSError:
        return False


def _loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr.split("%", 1)[0]).is_loopback
    except ValueError:
        return addr == "localhost"


def check_reachable_name(endpoint: str, local_addr: str | None, *, hostname=socket.gethostname,
                         resolve=socket.getaddrinfo) -> None:
    """Refuse, in one line naming the fix, a node the others could not reach by the name torchrun hands out, an
    endpoint this node cannot resolve or has no route to, and a --local-addr no interface of this node holds."""
    host = endpoint.rsplit(":", 1)[0].strip("[]")
    if local_addr and not is_wildcard(local_addr) and _is_ipv4(local_addr) and interface_of(local_addr) is None:
        raise ShardlabError(f"--local-addr {local_addr} is not an address of this node (no interface holds it): name "
                            "this node's own address on the network the nodes share")
    if _loopback(host):
        return
    try:
        host_ips = {ai[4][0] for ai in resolve(host, None)}
    except (OSError, UnicodeError):
        raise ShardlabError(f"the rendezvous endpoint's host '{host[:64]}' does not resolve on this node: give its "
                            "address (--rdzv-endpoint ADDR:PORT) or add the name to /etc/hosts") from None
    if host_ips and all(_loopback(ip) for ip in host_ips):
        # a name this node resolves only to loopback (Debian's '127.0.1.1 hostname' line): the store would listen
        # there, where no other machine reaches it (a literal loopback endpoint means every node is on this machine)
        raise ShardlabError(f"the rendezvous endpoint's host '{host[:64]}' resolves only to {sorted(host_ips)[0]} "
                            "(loopback) on this node, where the store would listen out of the other nodes' reach: give "
                            "the endpoint as the address the nodes share (--rdzv-endpoint ADDR:PORT), or map the name "
                            "to it in /etc/hosts")
    port = endpoint.rsplit(":", 1)[1] if ":" in endpoint else "29500"
    if not any(_routable(ip, int(port) if port.isdigit() else 29500) for ip in host_ips):
        raise ShardlabError(f"this node has no route to the rendezvous endpoint {host[:64]} ({sorted(host_ips)[0]}): "
                            "check the network between the nodes, or give the endpoint's address on a network this "
                            "node shares with it")
    if local_addr:
        return                     # the others reach this node by the address it names, not by its host name
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


def _routable(ip: str, port: int) -> bool:
    """Whether the kernel has a route to ``ip`` (a UDP connect sends nothing: it only picks the route and the
    source address, and fails at once with 'Network is unreachable' when there is none)."""
    try:
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect((ip.split("%", 1)[0], port))
        return True
    except OSError:
        return False


def _is_ipv4(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr.strip("[]")).version == 4
    except ValueError:
        return False


def interface_of(addr: str) -> str | None:
    """The network interface that holds IPv4 address ``addr`` on this host (Linux SIOCGIFADDR), or None."""
    import fcntl
    import struct

    try:
        want = socket.inet_aton(addr)
    except OSError:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                got = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))   # SIOCGIFADDR
            except OSError:
                continue                          # no IPv4 address on it
            if got[20:24] == want:
                return name
    return None


def bind_collectives_to(local_addr: str, env) -> str | None:
    """Gloo (and NCCL's bootstrap) pick their interface from the host name, which may resolve to loopback: point them
    at the interface of ``--local-addr`` unless the user set one (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME). Returns the
    interface set, or None."""
    name = interface_of(local_addr)
    if name is None:
        return None
    env.setdefault("GLOO_SOCKET_IFNAME", name)
    env.setdefault("NCCL_SOCKET_IFNAME", name)
    return name


def launch_env(torchrun_args) -> dict:
    """Environment the launcher gives torchrun and the ranks from the rendezvous flags (never this process's own
    environment): the collectives' interface (``bind_collectives_to``), and the wildcard permission when the flags
    name a wildcard (the command line refuses one unless --rdzv-bind-any asked for it; ``runtime.bound_run``)."""
    from shardlab.runtime.rendezvous import flag_value

    args = list(torchrun_args or ())
    env: dict = {}
    local, endpoint = flag_value(args, "--local-addr"), flag_value(args, "--rdzv-endpoint")
    if local:
        bind_collectives_to(local.strip("[]"), env)
    if any(v is not None and is_wildcard(v) for v in (local, endpoint.rsplit(":", 1)[0] if endpoint else None)):
        env[BIND_ANY_ENV] = "1"
    return env
