"""Checks of a `shardlab plan --json` document's training fields before they reach a job file (``export.build``):
a plan file is input, so a tampered or hand-edited value is refused in one line naming the field, what it must be,
and the fix, as the matching flag would be (``numbers.check_number`` and ``shardlab.limits``)."""

from __future__ import annotations

from shardlab import limits as L
from shardlab.errors import ShardlabError


def framework_id(fw) -> str | None:
    """The framework of a plan document: its id (plans carry the profile's mechanisms as a mapping)."""
    return fw.get("id") if isinstance(fw, dict) else fw


PLAN_FIX = "export the plan again with `shardlab plan --json`"
"""The fix every refusal of a plan file's field names (the file was written by `shardlab plan --json`)."""


def plan_refuse(field: str, must: str, got) -> ShardlabError:
    """One line naming the plan file's field, what it must be, what it holds and the fix."""
    shown = repr(got) if isinstance(got, str) else str(got)
    return ShardlabError(f"--plan FILE: {field} must be {must}, got {shown[:40]}; {PLAN_FIX}")


def plan_number(value, field: str, maximum: float, integer: bool = False, optional: bool = True,
                 allow_zero: bool = False):
    """A number of a plan file (``numbers.check_number``: finite, positive or with ``allow_zero`` zero, at most
    ``maximum``); None where ``optional``. The message names the plan's own field and the fix."""
    from shardlab.numbers import check_number

    if value is None and optional:
        return None
    try:
        return check_number(value, f"--plan FILE: {field}", integer=integer, maximum=maximum, allow_min=allow_zero,
                            reason="the bound of the matching flag")
    except ShardlabError as e:
        raise ShardlabError(f"{e}; {PLAN_FIX}") from None


def plan_workload(wl) -> dict:
    """A training plan's ``workload`` (plan --json), each field checked as the matching flag would be: whole
    sequence length and batch within shardlab's limits, known precision and optimizer, the recipe's choices."""
    from shardlab.memory.lora import QUANTIZATIONS
    from shardlab.memory.offload import MODES
    from shardlab.memory.precision import OPTIMIZERS, PRECISIONS

    if not isinstance(wl, dict):
        what = "is missing" if wl is None else f"must be a mapping, got a {type(wl).__name__}"
        raise ShardlabError(f"--plan FILE: workload {what} (seq_len, global_batch, precision, optimizer); {PLAN_FIX}")
    for key in ("seq_len", "global_batch", "precision", "optimizer"):
        if key not in wl:
            raise ShardlabError(f"--plan FILE: workload has no {key}; {PLAN_FIX}")
    plan_number(wl["seq_len"], "workload.seq_len", L.MAX_SEQ_LEN, integer=True, optional=False)
    plan_number(wl["global_batch"], "workload.global_batch", L.MAX_BATCH, integer=True, optional=False)
    if not isinstance(wl["precision"], str) or wl["precision"] not in PRECISIONS or \
            not isinstance(wl["optimizer"], str) or wl["optimizer"] not in OPTIMIZERS:
        raise ShardlabError(f"--plan FILE: precision {str(wl['precision'])[:20]!r} / optimizer "
                            f"{str(wl['optimizer'])[:20]!r} are not shardlab's ({', '.join(PRECISIONS)}; "
                            f"{', '.join(OPTIMIZERS)}); {PLAN_FIX}")
    for key, choices in (("offload", MODES), ("quantize_base", QUANTIZATIONS)):
        if wl.get(key) is not None and (not isinstance(wl[key], str) or wl[key] not in choices):
            raise plan_refuse(f"workload.{key}", f"one of {', '.join(choices)}", wl[key])
    plan_number(wl.get("lora_rank"), "workload.lora_rank", L.MAX_MODEL_DIM, integer=True)
    from shardlab.memory.lora import TARGETS
    from shardlab.memory.offload import DEVICES

    if wl.get("offload_device") is not None and wl["offload_device"] not in DEVICES:
        raise plan_refuse("workload.offload_device", f"one of {', '.join(DEVICES)}", wl["offload_device"])
    tg = wl.get("lora_targets")
    if tg is not None and not (isinstance(tg, list) and tg and all(isinstance(t, str) and t in TARGETS + ("all-linear",)
                                                                   for t in tg)):
        raise plan_refuse("workload.lora_targets", f"a list of {', '.join(TARGETS)} or all-linear", tg)
    if wl.get("fp8_params") not in (None, True, False):
        raise plan_refuse("workload.fp8_params", "true or false", wl["fp8_params"])
    return wl


def plan_framework(fw, catalog) -> tuple[str | None, dict]:
    """(framework id, MoE dispatch settings) of a training plan's ``framework``: a framework the catalog knows (the
    one the plan was made with: a catalog file's own needs the same --catalog), its dispatcher one shardlab
    prices, its expert imbalance in [1, 64], its overlap true or false."""
    from shardlab.comm.moe_dispatch import DISPATCHERS, MAX_EXPERT_IMBALANCE

    fid = framework_id(fw)
    if fw is not None and not (isinstance(fw, (str, dict)) and isinstance(fid, str)):
        raise plan_refuse("framework", "a name, or an object with an id", fid if isinstance(fw, dict) else fw)
    if fid is not None:
        try:
            fid = catalog.framework(fid).id
        except ShardlabError:
            raise ShardlabError(f"--plan FILE: framework {fid[:40]!r} is not a framework shardlab knows (choose one of "
                                f"{', '.join(catalog.frameworks)}); {PLAN_FIX}, or give the --catalog FILE that "
                                f"defines it") from None
    moe = {k: fw[k] for k in ("moe_dispatcher", "ep_comm_overlap", "expert_imbalance") if k in fw} \
        if isinstance(fw, dict) else {}
    if "moe_dispatcher" in moe and moe["moe_dispatcher"] not in DISPATCHERS:
        raise plan_refuse("framework.moe_dispatcher", f"one of {', '.join(DISPATCHERS)}", moe["moe_dispatcher"])
    if "ep_comm_overlap" in moe and not isinstance(moe["ep_comm_overlap"], bool):
        raise plan_refuse("framework.ep_comm_overlap", "true or false", moe["ep_comm_overlap"])
    if "expert_imbalance" in moe:
        f = plan_number(moe["expert_imbalance"], "framework.expert_imbalance", MAX_EXPERT_IMBALANCE, optional=False)
        if f < 1:
            raise plan_refuse("framework.expert_imbalance", f"in [1, {MAX_EXPERT_IMBALANCE:g}] (the busiest "
                               f"expert-parallel rank's tokens over the mean)", f)
        moe["expert_imbalance"] = float(f)
    return fid, moe


def plan_load(doc: dict, capacity, where: str):
    """The ``ServeLoad`` of a serving plan (``export.job``): the load it was given (``load``: clients or requests/s over
    all replicas; ``target.rate`` of a --target-rate plan, kept as its question too), else the capacity its search
    found within the SLOs (``capacity``, the plan entry's
    ``max_request_rate``; none where it meets them at no load), and its ``slo``. None for a static-batch plan."""
    from shardlab.export.job import ServeLoad

    load, slo = doc.get("load"), doc.get("slo")
    if not isinstance(load, dict) and not isinstance(slo, dict):
        return None
    load = load if isinstance(load, dict) else {}
    slo = slo if isinstance(slo, dict) else {}
    rate = plan_number(load.get("arrival_rate"), "load.arrival_rate", L.MAX_FLOAT)
    clients = plan_number(load.get("concurrency"), "load.concurrency", L.MAX_BATCH, integer=True)
    target = doc.get("target")
    asked = plan_number(target.get("rate"), "target.rate", L.MAX_FLOAT) if isinstance(target, dict) else None
    if rate is None and clients is None:          # --target-rate: the rate asked for; else the capacity found
        rate = asked if asked is not None else (plan_number(capacity, f"{where}.max_request_rate", L.MAX_FLOAT)
                                                if capacity else None)
    pct = slo.get("percentile")
    if pct not in (None, "p50", "p99"):
        raise plan_refuse("slo.percentile", "p50 or p99", pct)
    return ServeLoad(arrival_rate=None if rate is None else float(rate), concurrency=clients,
                     ttft_slo_s=plan_number(slo.get("ttft_s"), "slo.ttft_s", L.MAX_FLOAT),
                     tpot_slo_s=plan_number(slo.get("tpot_s"), "slo.tpot_s", L.MAX_FLOAT), slo_percentile=pct,
                     target_rate=None if asked is None else float(asked))
