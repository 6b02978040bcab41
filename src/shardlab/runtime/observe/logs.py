"""Read a distributed job's start-up output (torchrun, c10d, DDP, NCCL) and say what it shows.

The start-up log is a checksum of the layout: how many nodes and processes torchrun started, which
global ranks each node got, where the rendezvous and the TCPStore live, which backend and how many
parameter bytes DDP holds per rank, and for NCCL its version, the network it picked (IB, Socket), each
rank's GPU and bus id, and how each ring hop is connected (P2P/IPC inside a node, NET/IB between nodes).

Patterns follow the emitters' own format strings:
- torchrun (``torch/distributed/launcher/api.py`` "Starting elastic_operator with launch configs",
  ``elastic/agent/server/api.py`` "Rendezvous complete for workers. Result:"), printed with LOGLEVEL=INFO;
- c10d (``TCPStore.cpp`` "The server has started on port = %d"), TORCH_CPP_LOG_LEVEL=INFO;
- DDP (``logger.cpp`` "DDP Initialized with:" key: value block), TORCH_DISTRIBUTED_DEBUG=INFO or DETAIL;
- NCCL (libnccl.so.2's strings: "NCCL version %s", "%s comm %p rank %d nranks %d cudaDev %d nvmlDev %d busId
  %lx commId 0x%llx - Init START|COMPLETE", "comm %p rank %d nRanks %d nNodes %d localRanks %d localRank %d",
  "Using network %s", "Channel %02d/%d : %d[%d] -> %d[%d] [send|receive] via NET/%s/%d", "... via P2P/IPC",
  "Init timings - %s: rank %d nranks %d total %.2f"), printed with NCCL_DEBUG=INFO.
Pure text processing: no torch, no files (the CLI reads them).
"""

from __future__ import annotations

import re
from collections import Counter

_PREFIX = r"(?:^[IWE]\d{4} [\d:.]+ \d+ [^\s\]]+:\d+\] )?"
"""glog prefix torch's Python logging adds under LOGLEVEL=INFO (``I1122 23:40:11.831000 30646 path.py:254] ``)."""
_NCCL = re.compile(r"^(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL (?P<level>INFO|WARN) (?P<msg>.*)$")
_CONFIG = re.compile(_PREFIX + r"\s+(?P<key>entrypoint|min_nodes|max_nodes|nproc_per_node|run_id|rdzv_backend|"
                     r"rdzv_endpoint|max_restarts)\s*:\s*(?P<val>.*)$")
_RDZV = re.compile(_PREFIX + r"\s+(?P<key>restart_count|master_addr|master_port|group_rank|group_world_size|"
                   r"local_ranks|role_ranks|global_ranks|global_world_sizes)=(?P<val>.*)$")
_STORE = re.compile(r"TCPStore\.cpp:\d+\] \[c10d[^\]]*\] The server has started on port = (\d+)")
_DDP_HEAD = re.compile(r"\[Rank (\d+)\]: DDP Initialized with:")
_DDP_KEYS = ("backend_name", "world_size", "rank", "total_parameter_size_bytes", "num_parameter_tensors",
             "bucket_cap_bytes", "master_addr", "master_port", "module_name")
_INIT = re.compile(r"comm (?P<comm>0x[0-9a-f]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev (?P<dev>\d+) "
                   r"(?:nvmlDev \d+ )?busId (?P<bus>[0-9a-f]+) commId (?P<cid>0x[0-9a-f]+).* - Init (?P<what>START|COMPLETE)")
_NODES = re.compile(r"comm (0x[0-9a-f]+) rank (\d+) nRanks (\d+) nNodes (\d+) localRanks (\d+) localRank (\d+)")
_HOP = re.compile(r"Channel (\d+)/\d+ : (\d+)\[(\d+)\] -> (\d+)\[(\d+)\](?: \[(send|receive)\])? via (\S+)")
_TIMING = re.compile(r"Init timings - \S+: rank (\d+) nranks (\d+) total ([\d.]+)")


def _int_list(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"-?\d+", text)]


def parse_startup(text: str) -> dict:
    """Facts found in start-up output: {torchrun, rendezvous, store_ports, ddp, nccl, warnings, lines}."""
    launch, rdzv, ddp, store_ports, warnings = {}, {}, {}, [], []
    nccl = {"version": None, "ranks": {}, "networks": Counter(), "transports": Counter(), "hops": [], "warnings": []}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line or line.startswith("#"):
            continue
        if m := _CONFIG.match(line):
            launch[m["key"]] = m["val"].strip()
        elif m := _RDZV.match(line):
            key, val = m["key"], m["val"].strip()
            rdzv.setdefault(key, [])
            rdzv[key].append(_int_list(val) if val.startswith("[") else (int(val) if val.isascii() and val.isdigit() else val))
        elif m := _STORE.search(line):
            store_ports.append(int(m.group(1)))
        elif m := _DDP_HEAD.search(line):
            rank, block = int(m.group(1)), {}
            while i < len(lines) and ":" in lines[i] and not lines[i].startswith("["):
                k, _, v = lines[i].partition(":")
                if k.strip() in _DDP_KEYS:
                    v = v.strip()
                    block[k.strip()] = int(v) if v.isascii() and v.isdigit() else v
                i += 1
            ddp[rank] = block
        elif m := re.match(r"^NCCL version (\S+)", line):
            nccl["version"] = m.group(1)
        elif m := _NCCL.match(line):
            _nccl_line(nccl, m)
        elif re.search(r"\b(WARNING|Warning|error|Error)\b", line) and "NCCL" not in line:
            warnings.append(line.strip()[:300])
    return {"torchrun": launch, "rendezvous": rdzv, "store_ports": store_ports, "ddp": ddp,
            "nccl": {**nccl, "networks": dict(nccl["networks"]), "transports": dict(nccl["transports"])},
            "warnings": warnings, "lines": len(lines)}


def _nccl_line(nccl: dict, m: re.Match) -> None:
    msg, host = m["msg"], m["host"]
    if m["level"] == "WARN":
        nccl["warnings"].append(f"{host} [{m['dev']}] {msg}"[:300])
        return
    if x := _INIT.search(msg):
        r = nccl["ranks"].setdefault(int(x["rank"]), {})
        r.update(host=host, pid=int(m["pid"]), cuda_dev=int(x["dev"]), bus_id=x["bus"], nranks=int(x["nranks"]),
                 comm_id=x["cid"])
        r["init"] = "complete" if x["what"] == "COMPLETE" else r.get("init", "started")
    elif x := _NODES.search(msg):
        r = nccl["ranks"].setdefault(int(x.group(2)), {})
        r.update(nnodes=int(x.group(4)), local_ranks=int(x.group(5)), local_rank=int(x.group(6)))
    elif x := re.match(r"Using network (\S+)", msg):
        nccl["networks"][x.group(1)] += 1
    elif x := _HOP.search(msg):
        via = x.group(7)
        kind = via.split("/")[0] + ("/" + via.split("/")[1] if via.startswith(("NET", "P2P")) else "")
        nccl["transports"][kind] += 1
        nccl["hops"].append({"channel": int(x.group(1)), "from": int(x.group(2)), "to": int(x.group(4)), "via": via})
    elif x := _TIMING.search(msg):
        nccl["ranks"].setdefault(int(x.group(1)), {})["init_s"] = float(x.group(3))


def checks(facts: dict) -> list[dict]:
    """Consistency checks of the layout the log describes: [{check, ok, detail}]."""
    out = []
    rz = facts["rendezvous"]
    if rz.get("global_world_sizes"):
        sizes = {s for lst in rz["global_world_sizes"] for s in lst}
        ranks = sorted(r for lst in rz.get("global_ranks", []) for r in lst)
        nodes = rz.get("group_world_size", [None])[0]
        nproc = facts["torchrun"].get("nproc_per_node")
        out.append({"check": "torchrun: world size = nodes × processes per node", "ok": len(sizes) == 1 and (
            nodes is None or not (str(nproc).isascii() and str(nproc).isdigit()) or sizes == {nodes * int(nproc)}),
                    "detail": f"world size {sorted(sizes)}, {nodes} node(s) × {nproc} processes"})
        out.append({"check": "torchrun: this node's global ranks are distinct", "ok": len(ranks) == len(set(ranks)),
                    "detail": f"global ranks {ranks}"})
    if facts["ddp"]:
        tot = {d.get("total_parameter_size_bytes") for d in facts["ddp"].values()}
        out.append({"check": "DDP: every rank holds the same replica", "ok": len(tot) == 1,
                    "detail": f"parameter bytes per rank {sorted(t for t in tot if t is not None)}"})
    nr = facts["nccl"]["ranks"]
    if nr:
        n = {r.get("nranks") for r in nr.values() if r.get("nranks")}
        out.append({"check": "NCCL: every rank agrees on nranks", "ok": len(n) == 1, "detail": f"nranks {sorted(n)}"})
        if len(n) == 1:
            want = set(range(n.pop()))
            out.append({"check": "NCCL: ranks 0..n-1 all initialised", "ok": set(nr) == want and all(
                r.get("init") == "complete" for r in nr.values()),
                        "detail": f"{sum(r.get('init') == 'complete' for r in nr.values())} of {len(want)} Init COMPLETE"})
        host = {r: v.get("host") for r, v in nr.items()}
        hops = [h for h in facts["nccl"]["hops"] if host.get(h["from"]) and host.get(h["to"])]
        bad = [h for h in hops if (host[h["from"]] != host[h["to"]]) != h["via"].startswith("NET")]
        if hops:
            out.append({"check": "NCCL: hops between hosts go over the network, hops inside a host do not",
                        "ok": not bad, "detail": f"{len(hops)} hop(s) over {len(set(host.values()))} host(s)"
                        + (f"; unexpected: {bad[0]['from']} -> {bad[0]['to']} via {bad[0]['via']}" if bad else "")})
    return out


def render_startup(facts: dict, found: list[dict]) -> str:
    """The human report of ``shardlab logs``."""
    from shardlab.render.table import kv_lines, table

    out = []
    tr, rz = facts["torchrun"], facts["rendezvous"]
    if tr or rz:
        pairs = [(k, v) for k, v in tr.items()]
        for k in ("master_addr", "master_port", "group_rank", "group_world_size", "global_ranks", "global_world_sizes"):
            if k in rz:
                pairs.append((k, ", ".join(str(v) for v in rz[k])))
        out += ["torchrun (launch configuration and rendezvous result):", kv_lines(pairs, "  ")]
    if facts["store_ports"]:
        out.append(f"c10d TCPStore servers on port(s) {', '.join(map(str, facts['store_ports']))} "
                   f"(the first is the rendezvous store, the next the workers')")
    if facts["ddp"]:
        rows = [[r, d.get("backend_name"), d.get("world_size"), f"{d.get('total_parameter_size_bytes', 0):,}",
                 d.get("num_parameter_tensors"), f"{d.get('bucket_cap_bytes', 0):,}"] for r, d in sorted(facts["ddp"].items())]
        out += ["", table(["rank", "backend", "world", "parameter bytes", "tensors", "bucket cap B"], rows,
                          title="DDP (each rank holds a full replica; gradients all-reduced per bucket)")]
    nc = facts["nccl"]
    if nc["version"] or nc["ranks"]:
        out += ["", f"NCCL {nc['version'] or '(version line not found)'}; network: "
                    f"{', '.join(nc['networks']) or 'not printed'}; ring hops by transport: "
                    f"{', '.join(f'{k} {v}' for k, v in nc['transports'].items()) or 'none printed'}"]
        rows = [[r, d.get("host"), d.get("cuda_dev"), d.get("bus_id"), d.get("nranks"), d.get("nnodes"),
                 d.get("local_rank"), d.get("init", "-"), "-" if d.get("init_s") is None else f"{d['init_s']:.2f} s"]
                for r, d in sorted(nc["ranks"].items())]
        if rows:
            out.append(table(["rank", "host", "cudaDev", "busId", "nranks", "nodes", "local rank", "init", "init time"],
                             rows, title="NCCL communicator per rank"))
        out += [f"NCCL WARN: {w}" for w in nc["warnings"]]
    out += [f"warning: {w}" for w in facts["warnings"][:10]]
    if found:
        out += ["", table(["check", "result", "detail"], [[c["check"], "ok" if c["ok"] else "FAILED", c["detail"]]
                                                          for c in found], title="consistency checks")]
    return "\n".join(out)
