"""shard-check: PyTorch's real per-rank parameter shards at target scale, held against the memory model byte
for byte, without the hardware.

Measured side: a rank program (:func:`measure_rank`, one subprocess per rank it plays) joins PyTorch's *fake*
process group at world size N, builds the runtime GPT on the meta device, applies DTensor TP
(``runtime.parallel.tensor.apply_tp``) and FSDP2 (``runtime.parallel.fsdp.apply_fsdp``), and records each
parameter's local shape and its allocation: FSDP2's padded shard (``FSDPParam.padded_sharded_param_size``,
chunk 0's size on every rank) or the DTensor local tensor. One process per rank, since a 2-D fake mesh cannot
be re-initialised in the same process.

Which ranks run: rank 0 first; it also applies PyTorch's own DTensor sharding arithmetic
(``torch.distributed.tensor._utils._compute_local_shape_and_global_offset``) to every rank's mesh
coordinate and groups the ranks into *shard classes* (identical local shapes, and identical TP-local shapes
under FSDP padding). Then the first rank of every other class runs for real too (``ranks='all'`` runs every
rank). An executed rank whose real shapes differ from what the arithmetic derived for it (FSDP2 over TP on
uneven shards: ``_StridedShard``) makes the check run every rank instead.

Predicted side (``shardlab.memory``), for the TP coordinate of each class: ``TensorSpec.local_shape(spec, tp,
tp_rank=...)`` then, under FSDP, ``fsdp_shard_numel`` (ceil(d0 / dp) rows); the per-rank total is
``state_report(..., tp_rank).params_stored`` (the worst rank's is ``memory_model_bytes_per_rank``).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

from shardlab.errors import ShardlabError

DTYPES = {"fp32": ("float32", 4), "bf16": ("bfloat16", 2), "fp16": ("float16", 2)}


def resolve_spec(model: str, catalog_files: list[str]):
    from shardlab.catalog import get_catalog

    return get_catalog(catalog_files).model(model)


def coords(rank: int, tp: int) -> dict[str, int]:
    """Mesh coordinates of a global rank: tp fastest (``shardlab.layout``'s rank grid)."""
    return {"dp": rank // tp, "tp": rank % tp}


# ---- rank program (one process per rank played) ----------------------------------------------------
def measure_rank(spec, dp: int, tp: int, zero: int, rank: int, dtype: str, derive: bool) -> dict:
    """Play ``rank`` of a dp×tp fake-process-group job; return its parameters' shards (and, with ``derive``, the
    shard classes of every rank from PyTorch's DTensor sharding arithmetic)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset as local_of
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from shardlab.runtime.gpt import build_model
    from shardlab.runtime.parallel.fsdp import apply_fsdp
    from shardlab.runtime.parallel.tensor import apply_tp

    world = dp * tp
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    if tp > 1 and dp > 1:
        mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        tp_mesh, dp_mesh = mesh["tp"], mesh["dp"]
    else:
        one = init_device_mesh("cpu", (world,), mesh_dim_names=("tp" if tp > 1 else "dp",))
        tp_mesh, dp_mesh = (one, None) if tp > 1 else (None, one)
    model = build_model(spec, device="meta", dtype=getattr(torch, DTYPES[dtype][0]))
    if tp > 1:
        apply_tp(model, tp_mesh)
    if zero == 3 and dp > 1:
        apply_fsdp(model, dp_mesh)
    padded = {}
    for m in model.modules():
        if isinstance(m, FSDPModule):
            group = m._get_fsdp_state()._fsdp_param_group
            for fp in (group.fsdp_params if group else []):
                padded[id(fp.sharded_param)] = tuple(fp.padded_sharded_param_size)
    params, dmeta = {}, []
    for name, p in model.named_parameters():
        is_dt = isinstance(p, DTensor)
        local = tuple((p.to_local() if is_dt else p).shape)
        alloc = padded.get(id(p), local)
        params[name] = {"global_shape": list(p.shape), "placements": str(tuple(p.placements)) if is_dt else "plain",
                        "local_shape": list(local), "alloc_shape": list(alloc),
                        "alloc_bytes": math.prod(alloc) * p.element_size(), "fsdp": id(p) in padded}
        if is_dt:
            names = p.device_mesh.mesh_dim_names
            tp_only = [pl if n == "tp" else Replicate() for n, pl in zip(names, p.placements)]
            dmeta.append((name, tuple(p.shape), tuple(p.device_mesh.shape), names, tuple(p.placements), tp_only))
    doc = {"rank": rank, "world_size": world, "params": params}
    if derive:
        sig_of, classes, rank_class, memo = {}, [], [], {}

        def local(gshape, mshape, coord, pls):  # the 80 blocks of a 70B share a handful of (shape, placement) kinds
            key = (gshape, mshape, coord, str(pls))
            if key not in memo:
                memo[key] = tuple(local_of(gshape, mshape, list(coord), pls, skip_offset=True)[0])
            return memo[key]

        for r in range(world):
            c = coords(r, tp)
            sig = []
            for name, gshape, mshape, names, pls, tp_only in dmeta:
                coord = tuple(c[n] for n in names)
                sig.append((local(gshape, mshape, coord, pls), local(gshape, mshape, coord, tp_only)))
            key = tuple(sig)
            if key not in sig_of:
                sig_of[key] = len(classes)
                classes.append({"ranks": [], "local_shapes": {d[0]: list(s[0]) for d, s in zip(dmeta, sig)}})
            classes[sig_of[key]]["ranks"].append(r)
            rank_class.append(sig_of[key])
        doc["classes"], doc["rank_class"] = classes, rank_class
    dist.destroy_process_group()
    return doc


def main(argv: list[str] | None = None) -> None:
    """``python -m shardlab.runtime.shard_check JOB.json OUT.json``: play one rank of the job, write its document."""
    import warnings

    warnings.filterwarnings("ignore")
    job_path, out_path = (argv or sys.argv[1:])[:2]
    with open(job_path) as f:
        j = json.load(f)
    doc = measure_rank(resolve_spec(j["model"], j["catalog"]), j["dp"], j["tp"], j["zero"], j["rank"], j["dtype"],
                       j["derive"])
    with open(out_path, "w") as f:
        json.dump(doc, f)


# ---- host ------------------------------------------------------------------------------------------
def run_rank(model: str, catalog: list[str], dp: int, tp: int, zero: int, rank: int, dtype: str, derive: bool,
             timeout_s: float) -> dict:
    """Run :func:`main` for one rank in a fresh interpreter; returns its document."""
    job = dict(model=model, catalog=list(catalog), dp=dp, tp=tp, zero=zero, rank=rank, dtype=dtype, derive=derive)
    with tempfile.TemporaryDirectory(prefix=f"shard-check-rank{rank}-") as d:
        jp, out = os.path.join(d, "job.json"), os.path.join(d, "out.json")
        with open(jp, "w") as f:
            json.dump(job, f)
        try:
            from shardlab.proctree import die_with_parent

            r = subprocess.run([sys.executable, "-m", "shardlab.runtime.shard_check", jp, out], capture_output=True,
                               text=True, timeout=timeout_s, env={**os.environ, "OMP_NUM_THREADS": "1"},
                               preexec_fn=die_with_parent())
        except subprocess.TimeoutExpired:
            raise ShardlabError(f"shard-check rank {rank} took longer than {timeout_s:g} s; raise --timeout") from None
        if r.returncode != 0:
            lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
            raise ShardlabError(f"shard-check rank {rank} failed: {lines[-1] if lines else 'exit ' + str(r.returncode)}")
        with open(out) as f:
            return json.load(f)


def predicted(spec, layout, itemsize: int, tp_rank: int | None = None) -> dict[str, dict]:
    """The memory model's allocation per tensor on a rank of TP coordinate ``tp_rank`` (None: the worst rank)."""
    from shardlab.memory.states import expert_shard_dim, fsdp_shard_numel, stage_tensors

    out = {}
    for t in stage_tensors(spec, layout)[0].tensors:
        local = t.local_shape(spec, layout.tp, layout.ep, tp_rank, layout.etp)
        D = layout.expert_dp if t.ep_dim is not None else layout.dp_shard
        dim = expert_shard_dim(local, D) if t.ep_dim is not None else 0
        fsdp = layout.zero >= 3 and D > 1
        alloc = tuple(-(-n // D) if i == dim else n for i, n in enumerate(local)) if fsdp else local
        numel = fsdp_shard_numel(local, D, dim=dim) if fsdp else math.prod(local)
        out[t.name] = {"alloc_shape": list(alloc), "alloc_bytes": numel * itemsize}
    return out


def compare(pred: dict, meas: dict) -> list[dict]:
    """Tensors whose allocation differs (shape or bytes), or that exist on one side only."""
    bad = []
    for name in list(pred) + [n for n in meas if n not in pred]:
        p, m = pred.get(name), meas.get(name)
        if p is None or m is None or p["alloc_bytes"] != m["alloc_bytes"] or p["alloc_shape"] != m["alloc_shape"]:
            bad.append({"tensor": name, "predicted_shape": p and p["alloc_shape"], "predicted_bytes": p and p["alloc_bytes"],
                        "measured_shape": m and m["alloc_shape"], "measured_bytes": m and m["alloc_bytes"],
                        "measured_local_shape": m and m["local_shape"], "placements": m and m["placements"]})
    return bad


def shard_check(model: str, catalog: list[str], layout, dtype: str = "bf16", ranks: str = "auto",
                timeout_s: float = 600) -> dict:
    """Run the check (see the module docstring); returns the JSON document (``exact`` says whether all matched)."""
    from shardlab.memory.precision import state_bytes
    from shardlab.memory.states import stage_tensors, state_report

    spec = resolve_spec(model, catalog)
    dp, tp, world, itemsize = layout.dp, layout.tp, layout.world_size, DTYPES[dtype][1]
    t0 = time.perf_counter()
    runs = {0: run_rank(model, catalog, dp, tp, layout.zero, 0, dtype, True, timeout_s)}
    classes, rank_class = runs[0]["classes"], runs[0]["rank_class"]
    if ranks == "all":
        todo = list(range(1, world))
    elif ranks == "auto":
        todo = [c["ranks"][0] for c in classes if c["ranks"][0] != 0]
    else:
        todo = [r for r in ranks if r != 0]
    run_many = lambda rs: runs.update(_run_many(rs, model, catalog, dp, tp, layout.zero, dtype, timeout_s))  # noqa: E731
    run_many(todo)
    derivation_errors = _derivation_errors(runs, classes, rank_class)
    if escalated := bool(derivation_errors) and ranks == "auto" and len(runs) < world:
        run_many([r for r in range(world) if r not in runs])  # the arithmetic cannot group ranks here: run them all
    # every rank's measurement: its own run, or (not executed) the run of an executed rank of its derived class
    rep = {rank_class[r]: r for r in sorted(runs, reverse=True)}
    source = [r if r in runs else rep.get(rank_class[r]) for r in range(world)]
    unverified = [r for r in range(world) if source[r] is None or (derivation_errors and r not in runs)]
    tensors, sb, consistent = stage_tensors(spec, layout)[0].tensors, state_bytes("fp32", "sgd"), True
    total = lambda tp_rank: state_report(tensors, spec, layout, sb, tp_rank).params_stored * itemsize  # noqa: E731
    groups: dict = {}
    for r in range(world):
        if source[r] is not None:
            sig = tuple((n, tuple(p["alloc_shape"]), tuple(p["local_shape"])) for n, p in runs[source[r]]["params"].items())
            groups.setdefault(sig, []).append(r)
    out_classes, mismatches = [], []
    for i, members in enumerate(groups.values()):
        executed = [r for r in members if r in runs]
        run, tp_rank = runs[source[members[0]]], coords(members[0], tp)["tp"]
        pred = predicted(spec, layout, itemsize, tp_rank)
        consistent &= total(tp_rank) == sum(v["alloc_bytes"] for v in pred.values())
        bad = [{"class": i, "rank": source[members[0]], **b} for b in compare(pred, run["params"])]
        mismatches += bad
        out_classes.append({"class": i, "ranks": members, "executed_ranks": executed, "tensors": len(run["params"]),
                            "predicted_bytes": sum(v["alloc_bytes"] for v in pred.values()),
                            "measured_bytes": sum(v["alloc_bytes"] for v in run["params"].values()),
                            "mismatches": len(bad)})
    return {"model": spec.name, "world_size": world, "layout": {"dp": dp, "tp": tp, "zero": layout.zero},
            "dtype": dtype, "memory_model_bytes_per_rank": total(None), "memory_model_consistent": consistent,
            "classes": out_classes, "mismatches": mismatches, "derivation_errors": derivation_errors,
            "escalated_to_all_ranks": escalated, "unverified_ranks": unverified,
            "exact": not mismatches and not unverified,
            "executed_ranks": sorted(runs), "seconds": time.perf_counter() - t0}


def _run_many(ranks: list[int], model, catalog, dp, tp, zero, dtype, timeout_s) -> dict[int, dict]:
    """Execute ``ranks`` (two processes at a time: each one is single-threaded)."""
    with ThreadPoolExecutor(max_workers=max(1, min(2, os.cpu_count() or 1))) as ex:
        futs = {r: ex.submit(run_rank, model, catalog, dp, tp, zero, r, dtype, False, timeout_s) for r in ranks}
        return {r: f.result() for r, f in futs.items()}


def _derivation_errors(runs: dict, classes: list, rank_class: list) -> list[dict]:
    """Executed ranks whose real local shapes differ from what PyTorch's DTensor arithmetic derived for them
    (seen with FSDP2 over TP on uneven shards: ``_StridedShard`` arithmetic differs from FSDP2's chunks)."""
    errs = []
    for r, run in sorted(runs.items()):
        derived = classes[rank_class[r]]["local_shapes"]
        for name, p in run["params"].items():
            if name in derived and derived[name] != p["local_shape"]:
                errs.append({"rank": r, "tensor": name, "derived": derived[name], "executed": p["local_shape"]})
    return errs


def render(doc: dict) -> str:
    from shardlab.render.table import table

    lay = doc["layout"]
    mode = "FSDP2 over dp (zero 3)" if lay["zero"] == 3 and lay["dp"] > 1 else "dp replicas (zero 0)"
    head = (f"shard-check {doc['model']}: {doc['world_size']} ranks = dp {lay['dp']} x tp {lay['tp']}, {mode}; "
            f"{doc['dtype']} parameters on the meta device, PyTorch fake process group")
    rows = [[c["class"], _ranges(c["ranks"]), len(c["ranks"]), c["tensors"], f"{c['predicted_bytes']:,}",
             f"{c['measured_bytes']:,}", f"{c['measured_bytes'] - c['predicted_bytes']:+,}",
             ",".join(map(str, c["executed_ranks"])), "exact" if not c["mismatches"] else f"{c['mismatches']} differ"]
            for c in doc["classes"]]
    out = [table(["class", "ranks", "n", "tensors", "predicted B (memory model)", "measured B (PyTorch)", "diff",
                  "executed", "result"], rows, title=head)]
    out.append(f"memory model, worst rank (state_report params_stored x {DTYPES[doc['dtype']][1]} B): "
               f"{doc['memory_model_bytes_per_rank']:,} B{'' if doc['memory_model_consistent'] else ' (!= tensor sum)'}")
    out += [f"  MISMATCH class {m['class']} (rank {m['rank']}) {m['tensor']}: predicted {m['predicted_shape']} = "
            f"{m['predicted_bytes']} B, measured {m['measured_shape']} = {m['measured_bytes']} B (local "
            f"{m['measured_local_shape']}, {m['placements']})" for m in doc["mismatches"][:20]]
    for e in doc["derivation_errors"][:1]:
        out.append(f"note: PyTorch's DTensor shape arithmetic disagrees with FSDP2's real shards on "
                   f"{len(doc['derivation_errors'])} tensor(s) (e.g. rank {e['rank']} {e['tensor']}: derived "
                   f"{e['derived']}, real {e['executed']}); so every rank listed as executed ran for real")
    verdict = (f"every rank's tensors match byte for byte ({len(doc['classes'])} shard class(es), executed ranks "
               f"{_ranges(doc['executed_ranks'])}; {doc['seconds']:.1f} s)" if doc["exact"] else
               f"{len(doc['mismatches'])} tensor(s) differ from the memory model" if doc["mismatches"] else
               f"ranks {_ranges(doc['unverified_ranks'])} unverified (use --ranks all)")
    out.append(f"result: {'EXACT' if doc['exact'] else 'MISMATCH'}: {verdict}")
    return "\n".join(out)


def _ranges(ranks: list[int]) -> str:
    """[0,1,2,5,7,8] -> '0-2,5,7-8'."""
    spans: list[list[int]] = []
    for r in ranks:
        if spans and spans[-1][1] == r - 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


if __name__ == "__main__":
    main()
