"""torchrun with its key-value store listening on one address, never on every interface.

torchrun's rendezvous store (c10d's ``TCPStore``, which the ranks also use to find each other) listens on the
wildcard address (``*:port``, every interface, IPv4 and IPv6) even for a one-node job, and torch unpickles some of
what it holds, so anyone who can reach that port can join or feed the job. torch has no option for the store's bind
address, but ``TCPStore`` takes an already bound, listening socket (``master_listen_fd``). This module runs
torchrun (``torch.distributed.run.main``) in-process with the store class of its rendezvous backends (c10d, static
and the agent's own ``create_c10d_store``) replaced by one that, when it hosts the store, binds a socket to one
address first and hands it over:

- the address is the host torch gives each store, resolved: the rendezvous endpoint's host for the rendezvous store
  (the address the user named; it must be this node's), this node's ``--local-addr`` for the ranks' shared store
  (the launcher passes ``--local-addr 127.0.0.1`` to a one-node job: loopback);
- a wildcard, however spelled (0.0.0.0, ::, '0', a name that resolves to one), only with
  ``SHARDLAB_STORE_BIND_ANY=1`` (``--rdzv-bind-any``), else torchrun stops with the reason.

    python -m shardlab.runtime.bound_run TORCHRUN_ARGS...        # the arguments torchrun takes
"""

from __future__ import annotations

import datetime
import errno
import os
import socket
import sys

from torch.distributed import TCPStore as _TCPStore

from shardlab.runtime.preflight import BIND_ANY_ENV, is_wildcard

_SOCKETS: list[socket.socket] = []          # the listening sockets stay open as long as their stores


def listening_socket(host: str, port: int, env=os.environ) -> socket.socket:
    """A socket bound to ``host`` (resolved; its first address) and ``port`` (0: any free one), listening. A wildcard,
    however spelled (0.0.0.0, ::, '0', a name that resolves to one), only with SHARDLAB_STORE_BIND_ANY=1. Raises
    RuntimeError when the port is taken (torch's c10d then joins as a client: another agent on this machine hosts
    the store) and OSError, which stops torchrun at once, when the address is not this node's."""
    try:
        family, kind, proto, _, where = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)[0]
    except OSError as e:
        raise OSError(f"the rendezvous store's host {host!r} does not resolve ({e.strerror or e})") from None
    if (is_wildcard(where[0]) or is_wildcard(host)) and env.get(BIND_ANY_ENV) != "1":
        raise OSError(f"the rendezvous store would listen on every interface ({host} = {where[0]}); name the address "
                      "the other nodes reach (--local-addr, --rdzv-endpoint) or pass --rdzv-bind-any")
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(where)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise RuntimeError(f"the rendezvous store's port {port} on {where[0]} is taken") from e
        raise OSError(f"the rendezvous store cannot listen on {where[0]}:{port} ({e.strerror or e}); the address must "
                      "be one of this node's (--local-addr, or the endpoint's host on the node that hosts it)") from e
    return sock


class BoundTCPStore(_TCPStore):
    """``TCPStore`` whose server listens on one address (module doc); clients are unchanged."""

    def __init__(self, host_name, port, world_size=None, is_master=False, timeout=datetime.timedelta(seconds=300),
                 wait_for_workers=True, multi_tenant=False, master_listen_fd=None, use_libuv=True):
        if is_master and master_listen_fd is None:
            sock = listening_socket(str(host_name), int(port))
            _SOCKETS.append(sock)
            master_listen_fd, port = sock.fileno(), sock.getsockname()[1]
        super().__init__(host_name, port, world_size, is_master, timeout, wait_for_workers, multi_tenant,
                         master_listen_fd, use_libuv)


def install() -> None:
    """Replace the store class where torchrun's rendezvous backends and agent look it up."""
    import torch.distributed as dist
    import torch.distributed.elastic.rendezvous.c10d_rendezvous_backend as c10d
    import torch.distributed.elastic.rendezvous.static_tcp_rendezvous as static

    c10d.TCPStore = static.TCPStore = dist.TCPStore = BoundTCPStore


def main(argv: list[str] | None = None) -> None:
    install()
    from torch.distributed.run import main as torchrun

    torchrun(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    main()
