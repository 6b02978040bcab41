"""A torchrun job's rendezvous as its command line states it, and what its store says while it waits.

``rendezvous_of`` reads the node count and endpoint from the flags (``--nnodes N`` or ``MIN:MAX``, ``--rdzv-endpoint``;
also as ``--flag=value``); ``nodes_joined`` reads a c10d rendezvous' participants from its store as a client, and
``note_rendezvous`` records that count beside the ranks' files when the launcher stops a job that never gathered
its nodes (``launch.summarise`` words the timeout with it).
"""

from __future__ import annotations

import json
from pathlib import Path


RENDEZVOUS_FILE = "rendezvous.json"
"""What the launcher read from a multi-node job's rendezvous store when the job timed out before its ranks started."""


def read_json(path: Path) -> dict:
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return d if isinstance(d, dict) else {}


def flag_value(cmd: list[str], flag: str) -> str | None:
    """The value of ``flag`` in a command line (``--flag V`` or ``--flag=V``), or None."""
    for i, a in enumerate(cmd):
        if a == flag and i + 1 < len(cmd):
            return cmd[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def nodes_joined(cmd: list[str], timeout_s: float = 3.0) -> int | None:
    """How many nodes have joined the c10d rendezvous of torchrun command ``cmd``, read from its store as a client
    (no write, no count of its own): c10d keeps the round's participants in the pickled state under
    ``torch.rendezvous.<run id>`` (dynamic_rendezvous._RendezvousState). None when the store cannot be read, and for
    a static rendezvous, whose host store says it itself when its join timeout ends ('1/2 clients joined')."""
    nodes, endpoint = rendezvous_of(cmd)
    if nodes < 2 or endpoint == "?" or ":" not in endpoint or (flag_value(cmd, "--rdzv-backend") or "c10d") != "c10d":
        return None
    host, port = endpoint.rsplit(":", 1)
    try:
        import datetime
        import pickle
        from base64 import b64decode

        from torch.distributed import TCPStore

        store = TCPStore(host.strip("[]"), int(port), is_master=False, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s))
        key = "torch.rendezvous." + (flag_value(cmd, "--rdzv-id") or "none")
        if not store.check([key]):
            return 0
        raw = store.get(key)
        state = pickle.loads(b64decode(raw)) if raw and raw != b"Y2FuaW1hZGFt" else None   # c10d's empty sentinel
        return len(state.participants) if state is not None else 0
    except Exception:          # noqa: BLE001 - a store that cannot be read leaves the summary without a count
        return None


def note_rendezvous(cmd: list[str], rd: Path) -> None:
    """Record the rendezvous' joined-node count beside the ranks' files (``launch.summarise`` reads it); the launcher
    calls it when its job times out before any rank of this node started (still waiting for nodes)."""
    if rendezvous_of(cmd)[0] < 2:
        return
    joined = nodes_joined(cmd)
    if joined is not None:
        (rd / RENDEZVOUS_FILE).write_text(json.dumps({"joined": joined}))


def rendezvous_of(cmd: list[str]) -> tuple[int, str]:
    """(the most nodes torchrun was told to wait for, its rendezvous endpoint or '?') from its command line or flags
    (``--nnodes N`` or ``MIN:MAX``, also as ``--nnodes=N``)."""
    nn = flag_value(cmd, "--nnodes") or "1"
    try:
        n = int(nn.split(":")[-1])
    except ValueError:
        n = 1
    return n, flag_value(cmd, "--rdzv-endpoint") or "?"
