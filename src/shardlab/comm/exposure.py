"""What a step waits for: the collective inventory (``comm.inventory``) grouped as the step model groups its
communication, with the step model's overlap rules applied (``comm.pricing``).

The inventory and the step model price the same calls with the same α–β functions, so for every group the
inventory's seconds equal the step model's total (``TrainingEstimate.comm_total_s``; tests hold them equal), and
``exposed_s`` is the breakdown's component: what extends the step after overlap. ``hidden_s`` is the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

GROUPS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("TP", "tp_comm_s", ("TP", "SP")),
    ("CP", "cp_comm_s", ("CP",)),
    ("EP", "ep_comm_s", ("EP",)),
    ("PP", "pp_p2p_s", ("PP",)),
    ("DP", "dp_comm_s", ("DP", "ZeRO")),
    ("FSDP", "zero3_comm_s", ("FSDP",)),
)
"""(group, the estimate's breakdown key, the inventory axes it holds); HSDP's replica all-reduce joins DP under ZeRO-1/2
and FSDP under ZeRO-3, as the step model prices it."""

RULES = {
    "TP": "critical path: every TP/SP call sits between two GEMMs that need its result (Megatron)",
    "CP": "the ring's K/V exchange hides under η × the attention core (forward; 2× in backward); the excess is exposed",
    "EP": "critical path: dispatch and combine sit between the router and the experts",
    "PP": "critical path: blocking sends between stages (the bubble is counted apart)",
    "DP": "the gradient reduction hides under η × the last micro-batch's backward; ZeRO-1/2's parameter all-gather "
          "after the optimizer step is exposed",
    "FSDP": "each unit's gather hides under η × the previous unit's compute, its reduce-scatter under the next "
            "unit's backward; the first gather and the last reduce-scatter have nothing to hide under",
}
"""The overlap rule of each group (``comm.pricing``; η = the accelerator's overlap efficiency)."""


@dataclass(frozen=True)
class Exposure:
    """One group of collectives: what it takes in all and what the step waits for."""

    group: str
    """TP (with SP), CP, EP, PP, DP (DDP, ZeRO-1/2, HSDP) or FSDP (ZeRO-3, HSDP)."""
    component: str
    """The estimate's breakdown key (tp_comm_s, ...)."""
    axes: tuple[str, ...]
    """Inventory axes in the group."""
    total_s: float
    """Σ time_per_step_s of the group's inventory rows (= the step model's total)."""
    exposed_s: float
    """What extends the step: the estimate's breakdown component."""
    rule: str
    """How the step model overlaps it."""

    @property
    def hidden_s(self) -> float:
        """Seconds the group spends under compute."""
        return max(self.total_s - self.exposed_s, 0.0)

    def to_dict(self) -> dict:
        return {"group": self.group, "component": self.component, "axes": list(self.axes), "total_s": self.total_s,
                "exposed_s": self.exposed_s, "hidden_s": self.hidden_s, "rule": self.rule}


def group_of(axis: str, zero: int) -> str:
    """The step-model group an inventory axis belongs to."""
    if axis == "HSDP":
        return "FSDP" if zero == 3 else "DP"
    for group, _, axes in GROUPS:
        if axis in axes:
            return group
    raise ValueError(f"unknown communication axis {axis!r}")


EP_OVERLAP_RULE = ("every micro-batch but the first runs its dispatch and combine under η × another's compute "
                   "(Megatron-core's all-to-all overlap, combined 1F1B); the excess is exposed")
"""The EP rule when the MoE all-to-all overlap applies."""


def exposure(items, breakdown: dict, zero: int, ep_overlap: bool = False) -> list[Exposure]:
    """The groups with any collective (``items``: CommItem or their dicts), in GROUPS order; ``ep_overlap``: the MoE
    all-to-all overlap applies (``comm.moe_dispatch.overlap_applies``), which changes the EP rule."""
    totals: dict[str, float] = {}
    axes: dict[str, list[str]] = {}
    for it in items:
        axis = it["axis"] if isinstance(it, dict) else it.axis
        secs = it["time_per_step_s"] if isinstance(it, dict) else it.time_per_step_s
        g = group_of(axis, zero)
        totals[g] = totals.get(g, 0.0) + secs
        if axis not in axes.setdefault(g, []):
            axes[g].append(axis)
    rules = {**RULES, **({"EP": EP_OVERLAP_RULE} if ep_overlap else {})}
    return [Exposure(g, key, tuple(axes[g]), totals[g], float(breakdown[key]), rules[g])
            for g, key, _ in GROUPS if g in totals]
