"""Strategy names (``ddp``, ``fsdp+tp``, ``pp``, ...) -> degrees and the Layout the analytic core predicts.

A strategy is '+'-joined parts: one data-parallel kind (``ddp`` or ``fsdp``), one tensor-parallel kind
(``tp``: DTensor; ``tp-megatron``: our f/g layers), ``sp`` (sequence parallel, with ``tp``), ``pp`` and ``ep``
(expert parallel, carved out of ``ddp``: ``--ep`` consecutive data-parallel ranks split the experts).
Degrees: a part alone takes all ranks; combined, ``tp`` and ``pp`` default to 2 (``--tp``/``--pp``
override) and data parallelism takes the rest; ``ep`` defaults to the data-parallel degree. Ranks are placed on the analytic core's grid
(``shardlab.layout``: tp fastest, then dp, pp slowest), as a (pp, dp, tp) device mesh.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from shardlab.errors import ShardlabError
from shardlab.layout import Layout, Schedule


class StrategyPart(StrEnum):
    """One '+'-joined part of a --strategy name."""

    DDP = "ddp"
    FSDP = "fsdp"
    TP = "tp"
    TP_MEGATRON = "tp-megatron"
    SP = "sp"
    PP = "pp"
    EP = "ep"


PARTS = tuple(p.value for p in StrategyPart)
EXAMPLES = ("ddp", "fsdp", "tp", "tp+sp", "tp-megatron", "pp", "fsdp+tp", "ddp+pp", "fsdp+pp", "ddp+tp-megatron",
            "ddp+ep")


@dataclass(frozen=True)
class Strategy:
    """A parsed strategy with its degrees."""

    name: str
    """Canonical name, e.g. 'fsdp+tp'."""
    data: str | None
    """'ddp', 'fsdp' or None (no data parallelism)."""
    tp_kind: str | None
    """'dtensor' (parallelize_module), 'megatron' (our f/g layers) or None."""
    sequence_parallel: bool
    """Megatron sequence parallelism on the TP group (DTensor plan)."""
    dp: int
    """Data-parallel degree."""
    tp: int
    """Tensor-parallel degree."""
    pp: int
    """Pipeline-parallel degree."""
    vpp: int = 1
    """Model chunks per pipeline rank (interleaved schedule)."""
    schedule: Schedule = Schedule.ONE_F_ONE_B
    """Pipeline schedule: gpipe, 1f1b or interleaved."""
    ep: int = 1
    """Expert-parallel degree (divides dp: ``ep`` data-parallel ranks split the routed experts)."""

    def __post_init__(self):
        object.__setattr__(self, "schedule", Schedule(self.schedule))
        if self.data is not None:
            object.__setattr__(self, "data", StrategyPart(self.data))

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def layout(self, micro_batch: int = 1) -> Layout:
        """The Layout the memory and step-time models are evaluated on (fsdp = ZeRO-3, ddp = ZeRO-0)."""
        return Layout(dp=self.dp, tp=self.tp, pp=self.pp, ep=self.ep, zero=3 if self.data == "fsdp" else 0, vpp=self.vpp,
                      micro_batch=micro_batch, sequence_parallel=self.sequence_parallel,
                      schedule=self.schedule if self.pp > 1 else "1f1b")


def parse_strategy(text: str, nproc: int, *, tp: int | None = None, pp: int | None = None, vpp: int = 1,
                   schedule: str = "1f1b", ep: int | None = None) -> Strategy:
    """Parse ``text`` for ``nproc`` ranks; raises a one-line ShardlabError with the fix on bad input."""
    parts = [p.strip().lower() for p in text.split("+") if p.strip()]
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts or len(set(parts)) != len(parts):
        raise ShardlabError(f"--strategy '{text}': parts are {', '.join(PARTS)} joined by '+' "
                            f"(e.g. {', '.join(EXAMPLES)})")
    data = [p for p in parts if p in ("ddp", "fsdp")]
    tpk = [p for p in parts if p in ("tp", "tp-megatron")]
    if len(data) > 1 or len(tpk) > 1:
        raise ShardlabError(f"--strategy '{text}': choose one of ddp/fsdp and one of tp/tp-megatron")
    sp, has_pp = "sp" in parts, "pp" in parts
    if sp and tpk != ["tp"]:
        raise ShardlabError("sp (sequence parallel) runs with the DTensor plan: use --strategy tp+sp")
    if data == ["ddp"] and tpk == ["tp"]:
        raise ShardlabError("DDP cannot wrap DTensor parameters: use fsdp+tp, or ddp+tp-megatron")
    n_axes = sum(bool(x) for x in (data, tpk, has_pp))
    t = (tp or (nproc if n_axes == 1 else 2)) if tpk else 1
    p = (pp or (nproc if n_axes == 1 else 2)) if has_pp else 1
    if tp and not tpk:
        raise ShardlabError(f"--tp {tp} given but --strategy '{text}' has no tp part; add +tp")
    if pp and not has_pp:
        raise ShardlabError(f"--pp {pp} given but --strategy '{text}' has no pp part; add +pp")
    has_ep = "ep" in parts
    if ep and not has_ep:
        raise ShardlabError(f"--ep {ep} given but --strategy '{text}' has no ep part; add +ep")
    if has_ep and (data != ["ddp"] or tpk or has_pp):
        raise ShardlabError(f"--strategy '{text}': expert parallelism runs as ddp+ep (experts split over data-parallel "
                            "ranks, the rest replicated); with tp, pp or fsdp it is predicted only")
    if nproc % (t * p):
        raise ShardlabError(f"--nproc-per-node {nproc} is not divisible by tp×pp = {t}×{p}; choose --nproc-per-node as a multiple of {t * p}")
    dp = nproc // (t * p)
    if dp > 1 and not data:
        raise ShardlabError(f"--nproc-per-node {nproc} leaves {dp} data-parallel replicas (tp×pp = {t * p}) but --strategy "
                            f"'{text}' has no ddp/fsdp part; add +ddp or +fsdp, or set --nproc-per-node {t * p}")
    sched = schedule if has_pp else "1f1b"
    if has_pp and schedule == "interleaved" and vpp < 2:
        vpp = 2
    if vpp > 1 and not (has_pp and sched == "interleaved"):
        raise ShardlabError("--vpp > 1 needs pp with --schedule interleaved")
    e = (ep or dp) if has_ep else 1
    if dp % e:
        raise ShardlabError(f"--ep {e} must divide the data-parallel degree {dp} (--nproc-per-node {nproc}); e.g. --ep "
                            f"{max(d for d in range(1, dp + 1) if dp % d == 0 and d <= e)}")
    canon = "+".join(x for x in PARTS if x in parts)
    return Strategy(canon, data[0] if data else None, {"tp": "dtensor", "tp-megatron": "megatron"}.get(tpk[0]) if tpk else None,
                    sp, dp, t, p, vpp, sched, e)
