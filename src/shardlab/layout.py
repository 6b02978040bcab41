"""Layout: how a job is split across GPUs, its validation, and the rank grid.

Rank grid (one pure function, ``rank_coords``): axes ordered ``tp`` fastest, then ``cp``, ``dp``,
``pp`` slowest (Megatron-LM's default order tp-cp-(ep)-dp-pp). A TP group is therefore consecutive
ranks and sits inside a node whenever tp <= GPUs per node; pipeline stages are the most distant.
Expert parallelism borrows from data parallelism (DeepSpeed-MoE, Megatron-core): an EP group is ``ep``
consecutive DP coordinates; experts are split across it and replicated across the dp/ep EP groups.

Worked example, 16 GPUs, tp=2, cp=1, dp=4, pp=2 (nodes of 8):
    rank  = tp_i + 2·dp_i + 8·pp_i
    TP groups  [0,1] [2,3] ... [14,15]            (inside a node)
    DP groups  [0,2,4,6] [1,3,5,7] [8,10,12,14] ... (inside a node)
    PP groups  [0,8] [1,9] ... [7,15]              (across the two nodes)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, make_dataclass, replace
from enum import StrEnum
from typing import Any

from shardlab.errors import ShardlabError

AXES = ("tp", "cp", "dp", "pp")
"""Rank-grid axis order, fastest first."""


class _Coded(StrEnum):
    """A named choice whose ``code`` (its position) is its value in the search's arrays."""

    @property
    def code(self) -> int:
        return tuple(type(self)).index(self)


class Recompute(_Coded):
    """Activation recomputation (codes: none 0, selective 1, full 2, op 3)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"
    OP = "op"


class Schedule(_Coded):
    """Pipeline schedule (codes: 1f1b 0, gpipe 1, interleaved 2, zb-h1 3)."""

    ONE_F_ONE_B = "1f1b"
    GPIPE = "gpipe"
    INTERLEAVED = "interleaved"
    ZB_H1 = "zb-h1"


try:      # YAML writers (ledger, profiles, exports) see the enums' names, as JSON does
    import yaml

    yaml.SafeDumper.add_multi_representer(StrEnum, lambda dumper, v: dumper.represent_str(str(v)))
except ImportError:      # pragma: no cover - PyYAML is a dependency
    pass

_RECOMPUTE_ORDER = tuple(Recompute)
_SCHEDULE_ORDER = tuple(Schedule)
RECOMPUTE = tuple(r.value for r in Recompute)
"""Recomputation names, by code: none 0, selective 1, full 2, op 3."""
RECOMPUTE_MODULES = ("core_attn", "layernorm", "moe_act", "mla_up_proj", "mlp", "moe", "shared_experts")
"""The submodules selective recomputation can re-run (megatron-core 0.16.1 TransformerConfig.recompute_modules):
core_attn, the attention core; layernorm, the two pre-norms (their outputs discarded and recomputed); moe_act, the
routed experts' activation; mla_up_proj, MLA's up-projections (Q, K, V re-made from the latents); mlp, a dense
block's whole MLP; moe, a MoE block's whole MoE layer (router, dispatch, experts, combine); shared_experts, the
shared experts of a MoE block."""
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")
"""Schedule names in the order the command line lists them (codes: ``Schedule.code``)."""


@dataclass(frozen=True)
class Layout:
    """Parallel degrees and per-step choices of a training job."""

    dp: int = field(default=1, metadata={"array": "dp"})
    """Data-parallel degree (model replicas; ZeRO/FSDP shard over dp·cp)."""
    tp: int = field(default=1, metadata={"array": "tp"})
    """Tensor-parallel degree (Megatron column/row splits)."""
    pp: int = field(default=1, metadata={"array": "pp"})
    """Pipeline-parallel degree (stages)."""
    cp: int = field(default=1, metadata={"array": "cp"})
    """Context-parallel degree (sequence split for attention; ring attention)."""
    ep: int = field(default=1, metadata={"array": "ep"})
    """Expert-parallel degree (MoE models only; divides dp, or with ``etp`` below tp the stage's tp·cp·dp / etp)."""
    zero: int = field(default=0, metadata={"array": "zero"})
    """ZeRO stage over the data-parallel group: 0 none, 1 optimizer states, 2 + gradients, 3 + parameters (= FSDP full shard)."""
    vpp: int = field(default=1, metadata={"array": "vpp"})
    """Virtual pipeline stages (model chunks) per pipeline rank, for the interleaved schedule."""
    micro_batch: int = field(default=1, metadata={"array": "mb"})
    """Sequences per micro-batch per data-parallel rank."""
    recompute: Recompute = field(default=Recompute.NONE, metadata={"array": "rc"})
    """Activation recomputation: none, selective (attention core; Korthikanti 2022 §5), full (keep block inputs) or
    op (torchtitan's per-operator selective checkpointing: keep every other matmul output and the attention outputs,
    re-run the rest; torchtitan/models/llama3/infra/parallelize.py _save_list)."""
    recompute_fraction: float = field(default=1.0, metadata={"array": "rf"})
    """Share of the blocks the recomputation applies to (torchtitan's selective 'layer' option checkpoints every k-th
    block: 1/k; fms-fsdp's selective_checkpointing fraction); the other blocks keep everything."""
    wrap: int = field(default=1, metadata={"array": "wrap"})
    """ZeRO-3/FSDP wrap unit in transformer blocks: 1 = each block its own unit (transformer_auto_wrap_policy,
    torchtitan's per-block fully_shard), N = every N blocks together, 0 = the whole model as one unit (no
    overlap: gathered before the forward, held through the backward)."""
    dp_replicate: int = field(default=1, metadata={"array": "rep"})
    """Hybrid sharding (HSDP; torchtitan data_parallel_replicate_degree): ZeRO/FSDP shards model states over
    dp·cp / dp_replicate ranks (typically one node) and the replicas all-reduce gradients. 1 = shard over all of dp·cp."""
    sequence_parallel: bool = field(default=False, metadata={"array": "sp"})
    """Megatron sequence parallelism: norms/dropout activations split across TP ranks (Korthikanti 2022 §4.2.2)."""
    etp: int = field(default=0, metadata={"array": "etp"})
    """Expert tensor-parallel degree (Megatron-core --expert-tensor-parallel-size): the routed experts' matrices split
    over etp ranks instead of the attention's tp; 0 = tp (Megatron-core's default). Below tp, the expert group is
    carved from the stage's tp·cp·dp ranks (``expert_grid``): EP no longer has to divide dp."""
    schedule: Schedule = field(default=Schedule.ONE_F_ONE_B, metadata={"array": "sched"})
    """Pipeline schedule: gpipe, 1f1b, interleaved or zb-h1."""
    stage_layers: tuple[int, ...] | None = None
    """Layers per pipeline stage; None splits evenly (remainder to the middle stages)."""
    recompute_modules: tuple[str, ...] | None = None
    """What selective recomputation re-runs, as Megatron-core names its modules (``RECOMPUTE_MODULES``;
    --recompute-modules, TransformerConfig.recompute_modules): None = ('core_attn',), the attention core, which is
    Korthikanti's selective recomputation and Megatron-core's default. Only with recompute 'selective'."""

    def __post_init__(self):
        # names from flags, files and JSON become the enums (a bad name: one line naming the field and the choices)
        for name, enum in (("recompute", Recompute), ("schedule", Schedule)):
            value = getattr(self, name)
            if not isinstance(value, enum):
                try:
                    object.__setattr__(self, name, enum(value))
                except ValueError:
                    raise ShardlabError(f"layout field {name} is one of {', '.join(e.value for e in enum)}, got "
                                        f"{str(value)[:40]!r}") from None

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def dp_shard(self) -> int:
        """Size of the group ZeRO/FSDP shards non-expert model states over (dp × cp: CP ranks hold identical weights;
        divided by the HSDP replicas)."""
        return self.dp * self.cp // self.dp_replicate

    @property
    def expert_tp(self) -> int:
        """The degree the routed experts' matrices are split over (``etp``, or tp when 0)."""
        return expert_tp_of(self.tp, self.etp)

    @property
    def expert_dp(self) -> int:
        """The group ZeRO shards expert states over (``expert_grid``: dp·cp / ep with the experts split like the
        attention, tp·cp·dp / (ep·etp) with a narrower etp; divided by the HSDP replicas)."""
        return int(expert_grid(self.tp, self.cp, self.dp, self.ep, self.etp, self.dp_replicate)["edp"])

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stage_layers"] = list(self.stage_layers) if self.stage_layers else None
        d["recompute_modules"] = list(self.recompute_modules) if self.recompute_modules else None
        d["recompute"], d["schedule"] = str(self.recompute), str(self.schedule)   # plain strings for JSON/YAML/TOML
        return d

    def with_(self, **kw) -> Layout:
        """A copy with ``kw`` changed; a recomputation other than selective drops the selective modules."""
        if kw.get("recompute", "selective") != "selective" and "recompute_modules" not in kw:
            kw["recompute_modules"] = None
        return replace(self, **kw)


def expert_tp_of(tp, etp):
    """The routed experts' tensor-parallel degree from a layout's tp and etp (0 or None: tp); ints or arrays."""
    return tp if etp is None else etp + (etp == 0) * tp


def expert_grid(tp, cp, dp, ep, etp, rep=1) -> dict:
    """Where a pipeline stage's routed experts live (ints or numpy arrays alike): 'etp', their tensor-parallel degree;
    'ep_stride', the rank distance between members of an expert-parallel group; 'edp', the expert data-parallel
    group ZeRO shards expert states over and reduces their gradients across; 'edp_stride', the distance between its
    members.

    With etp = tp (``Layout.etp`` 0), EP borrows data-parallel coordinates (DeepSpeed-MoE; Megatron-core's default
    expert-TP): ep ranks tp·cp apart, replicated over dp·cp/ep. With etp < tp, Megatron-core lays its expert grid
    over the stage's tp·cp·dp ranks in the order etp, ep, edp (megatron/core/parallel_state.py, the expert
    RankGenerator with order tp-ep-dp-pp and no cp): EP members etp apart, EDP = tp·cp·dp / (ep·etp) members
    etp·ep apart (Qwen3-235B on 256 H100 with TP 2, EP 32, ETP 1: the EP group is 32 consecutive ranks, EDP 1)."""
    etp_eff = expert_tp_of(tp, etp)
    folded = etp_eff < tp
    ep_stride = folded * etp_eff + (1 - folded) * tp * cp
    edp = tp * cp * dp // (ep * etp_eff) // rep
    edp = edp + (edp < 1) * (1 - edp)
    return {"etp": etp_eff, "ep_stride": ep_stride, "edp": edp, "edp_stride": ep_stride * ep}


LAYOUT_FIELDS = tuple(f.name for f in fields(Layout))
"""Every field of a Layout, in order (job files, exports and JSON list these)."""
ARRAY_KEYS = {f.name: f.metadata["array"] for f in fields(Layout) if "array" in f.metadata}
"""Layout field -> key of the search's array form (``layouts_to_arrays``); stage_layers has none (the search splits
layers evenly)."""


def _encode(name: str, value):
    if name == "recompute":
        return Recompute(value).code
    if name == "schedule":
        return Schedule(value).code
    return value


def layouts_to_arrays(layouts) -> dict:
    """The search's array form of ``layouts``: one numpy array per ``ARRAY_KEYS`` key, enums as their codes (a
    schedule without a pipeline is 1F1B)."""
    import numpy as np

    out = {key: [] for key in ARRAY_KEYS.values()}
    for lay in layouts:
        for name, key in ARRAY_KEYS.items():
            value = getattr(lay, name)
            if name == "schedule" and lay.pp == 1:
                value = Schedule.ONE_F_ONE_B
            out[key].append(_encode(name, value))
    return {k: np.asarray(v) for k, v in out.items()}


def layout_from_arrays(arrays: dict, i: int) -> Layout:
    """Layout ``i`` of an array form (a key left out takes the field's default)."""
    kw = {}
    for f in fields(Layout):
        key = ARRAY_KEYS.get(f.name)
        if key is None or key not in arrays:
            continue
        v = arrays[key][i]
        kw[f.name] = (_RECOMPUTE_ORDER[int(v)] if f.name == "recompute" else _SCHEDULE_ORDER[int(v)]
                      if f.name == "schedule" else bool(v) if f.type in (bool, "bool")
                      else float(v) if f.type in (float, "float") else int(v))
    if kw.get("pp", 1) == 1:
        kw["schedule"] = Schedule.ONE_F_ONE_B
    return Layout(**kw)


ArrayLayout = make_dataclass(
    "ArrayLayout", [(f.name, Any, field(default=None)) for f in fields(Layout)], frozen=True,
    namespace={"__doc__": "A Layout whose fields are arrays over candidate layouts (the vectorised step and memory "
                          "models read the same field names; recompute holds codes).",
               "world_size": property(lambda s: s.dp * s.tp * s.pp * s.cp)})
"""The array-valued form of Layout, generated from its fields."""


TOKENS_PER_STEP = 4 * 2**20
"""Tokens per optimizer step every command assumes when the global batch is not given (about 4M: Llama 3 trained
at 4M-16M tokens per step, arXiv 2407.21783 §3.4.1; GPT-3 175B at 3.2M, arXiv 2005.14165 Table 2.1)."""


def default_global_batch(seq_len: int, layout: Layout) -> int:
    """Sequences per step when neither the global batch nor the micro-batch count is given, the same in plan,
    estimate, memory and comm plan: ``TOKENS_PER_STEP`` of ``seq_len``-token sequences, rounded down to whole
    micro-batches of micro_batch × dp (at least one; a multiple of pp under the interleaved schedule)."""
    per_mb = layout.micro_batch * layout.dp
    step = per_mb * (layout.pp if layout.schedule == "interleaved" and layout.pp > 1 else 1)
    return max(step, TOKENS_PER_STEP // max(seq_len, 1) // step * step)


def default_microbatches(pp: int) -> int:
    """Micro-batches per step when neither --microbatches nor --global-batch says: 4·pp with a pipeline
    (1F1B bubble (p−1)/(m+p−1) ≈ 20%, a common starting point), 1 without. Every command uses this one."""
    return 4 * pp if pp > 1 else 1


def split_layers(num_layers: int, stages: int) -> tuple[int, ...]:
    """Split ``num_layers`` across ``stages``; the remainder goes to middle stages first.

    The first stage also holds the embedding and the most micro-batches in flight, the last the output
    head and the loss, so they receive the fewest layers (the Llama 3 paper, arXiv 2407.21783 §3.3.2,
    removes one layer from the first and last stages for the same reason).
    """
    base, rem = divmod(num_layers, stages)
    sizes = [base] * stages
    middle = range(1, stages - 1) if stages > 2 else range(stages)
    order = list(middle) + ([0, stages - 1] if stages > 2 else [])       # linear in the stage count
    for s in order[:rem]:
        sizes[s] += 1
    return tuple(sizes)


def recompute_words(layout: Layout) -> str:
    """The recomputation as the output names it: 'selective (mlp, moe_act)' when modules are given."""
    mods = layout.recompute_modules
    return f"{layout.recompute} ({', '.join(mods)})" if mods and layout.recompute == "selective" else str(layout.recompute)


def wrap_word(n: int) -> str:
    """The --wrap value of an FSDP unit of ``n`` blocks (0: the whole model; ``cli.common.wrap_policy`` reads it)."""
    return "model" if n == 0 else "block" if n == 1 else f"{n}-blocks"
