"""torchrun with its key-value store listening on one address, never on every interface.

torchrun's rendezvous store (c10d's ``TCPStore``, which the ranks also use to find each other) listens on the
wildcard address (``*:port``, every interface, IPv4 and IPv6) even for a one-node job, and torch unpickles some of
what it holds, so anyone who can reach that port can join or feed the job. torch has no option for the store's bind
address, but ``TCPStore`` takes an already bound, listening socket (``master_listen_fd``). This module runs
torchrun (``torch.distributed.run.main``) in-process with the store class of its rendezvous backends (c10d, static
and the agent's own ``create_c10d_store``) replaced by one that, when it hosts the store, binds a socket to one
address first and hands it over:

- ``SHARDLAB_STORE_BIND`` (set by ``shardlab.runtime.launch``): the address; otherwise the store's own host name,
  resolved (``localhost`` for ``--standalone``: loopback; the rendezvous endpoint's host for a multi-node job: the
  address the user named, which must be this node's);
- a wildcard address (0.0.0.0, ::) only with ``SHARDLAB_STORE_BIND_ANY=1`` (``--rdzv-bind-any``), else the store
  refuses to start with the reason.

    python -m shardlab.runtime.bound_run TORCHRUN_ARGS...        # the arguments torchrun takes
"""

from __future__ import annotations

import datetime
import os
import socket
import sys

from torch.distributed import TCPStore as _TCPStore

from shardlab.runtime.preflight import BIND_ANY_ENV, BIND_ENV, is_wildcard

_SOCKETS: list[socket.socket] = []          # the listening sockets stay open as long as their stores


def listening_socket(host: str, port: int, env=os.environ) -> socket.socket:
    """A socket bound to ``host`` (resolved; its first address) and ``port`` (0: any free one), listening. Raises
    RuntimeError (what torch's rendezvous code expects from a store that cannot start) naming the fix."""
    addr = env.get(BIND_ENV) or host
    if is_wildcard(addr) and env.get(BIND_ANY_ENV) != "1":
        raise RuntimeError(f"the rendezvous store would listen on every interface ({addr or 'no address'}); name the "
                           "address the other nodes reach (--local-addr, --rdzv-endpoint) or pass --rdzv-bind-any")
    try:
        family, kind, proto, _, where = socket.getaddrinfo(addr.strip("[]"), port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(where)
        sock.listen(2048)
    except OSError as e:
        raise RuntimeError(f"the rendezvous store cannot listen on {addr}:{port} ({e.strerror or e}); the address "
                           "must be one of this node's (--local-addr)") from e
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
