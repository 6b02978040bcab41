"""TensorBoard scalars of a run's step records, written with tensorboardX and read back for checking.

tensorboardX writes TensorBoard's event files (TFRecord framing of ``Event`` protocol buffers) with only
protobuf and numpy, where ``torch.utils.tensorboard`` needs the whole ``tensorboard`` package. One run
directory per rank (``rank0``, ``rank1``, ...), so TensorBoard overlays the ranks on each chart.
"""

from __future__ import annotations

import struct
from pathlib import Path

SCALARS = {"step/seconds": "step_s", "step/compute_seconds": "compute_s", "step/wait_seconds": "wait_s",
           "collectives/seconds": "coll_s", "collectives/blocked_seconds": "blocked_s",
           "collectives/calls": "coll_calls", "data/wait_seconds": "data_s", "loss": "loss"}
"""TensorBoard tag -> record field."""


def write_scalars(records: list[dict], logdir: str) -> dict:
    """Write every record's fields as scalars at global_step = step; returns {logdir, runs, scalars}."""
    from shardlab.errors import ShardlabError

    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        raise ShardlabError("--tensorboard needs tensorboardX: pip install 'shardlab[observe]'") from None
    root = Path(logdir)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ShardlabError(f"cannot create --tensorboard directory {logdir}: {e.strerror}") from None
    writers, n = {}, 0
    for r in records:
        w = writers.get(r["rank"])
        if w is None:
            w = writers[r["rank"]] = SummaryWriter(logdir=str(root / f"rank{r['rank']}"))
        for tag, field in SCALARS.items():
            v = r.get(field)
            if v is not None:
                w.add_scalar(tag, float(v), global_step=int(r["step"]), walltime=r.get("time"))
                n += 1
    for w in writers.values():
        w.close()
    return {"logdir": str(root), "runs": sorted(f"rank{k}" for k in writers), "scalars": n}


def _records(path: Path):
    """TFRecord framing: uint64 length, uint32 masked CRC of the length, data, uint32 masked CRC of the data."""
    data = path.read_bytes()
    i = 0
    while i + 12 <= len(data):
        (n,) = struct.unpack("<Q", data[i:i + 8])
        yield data[i + 12:i + 12 + n]
        i += 12 + n + 4


def read_scalars(logdir: str) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """{run: {tag: [(step, value)]}} parsed from the event files under ``logdir`` (checks what we wrote)."""
    from tensorboardX.proto.event_pb2 import Event

    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for f in sorted(Path(logdir).rglob("events.out.tfevents.*")):
        run = f.parent.name
        for raw in _records(f):
            ev = Event()
            ev.ParseFromString(raw)
            for v in ev.summary.value:
                out.setdefault(run, {}).setdefault(v.tag, []).append((ev.step, v.simple_value))
    return out
