"""Disaggregated prefill/decode launch scripts (DistServe, Zhong et al. OSDI 2024; ``serving.disagg``) for the three
serving engines, and their read-back.

One bash script starts every instance of both pools, each on its own GPUs (``CUDA_VISIBLE_DEVICES``) and port, and
the engine's router in front of them. An instance never spans nodes; on more than one node the script is run on each
with ``NODE_RANK`` (0 first) and ``NODE_ADDRS`` (the nodes' addresses, node 0 first) and starts that node's instances;
node 0 also runs the router. Each engine's own single-instance line (``vllm.arg_list`` ...) gives an instance's flags,
so a pool's instance is exactly what ``export --to ENGINE`` writes for one replica of its layout, plus the engine's
disaggregation settings:

- vLLM 0.11: ``--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'`` on every instance
  (docs/features/nixl_connector_usage.md), a distinct ``VLLM_NIXL_SIDE_CHANNEL_PORT`` per instance of a node, and
  the proxy of vLLM's source tree that sends each request to a prefill instance, then to a decode instance.
- SGLang 0.5.2: ``--disaggregation-mode prefill|decode``, ``--disaggregation-transfer-backend``, a bootstrap port
  per prefill instance, and ``python -m sglang_router.launch_router --pd-disaggregation``.
- TensorRT-LLM 1.0: a ``cache_transceiver_config`` in each pool's LLM-API options (the context servers without the
  overlap scheduler), and ``trtllm-serve disaggregated -c CONFIG`` listing the context and generation servers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from shardlab.errors import ShardlabError
from shardlab.export.job import LaunchJob, Refused
from shardlab.layout import Layout

ROUTER_PORT = 8000
PORT_BASE = {"prefill": 20000, "decode": 30000}
"""Each instance's HTTP port: the base of its pool + its slot on the node."""
SIDE_PORT_BASE = 40000
"""Per-instance transfer side ports (vLLM's NIXL side channel, SGLang's bootstrap port): base + 100 × slot."""


@dataclass(frozen=True)
class Instance:
    """One engine server of a pool."""

    role: str
    """prefill or decode."""
    node: int
    """Node index (0 first)."""
    slot: int
    """Index among the node's instances (sets its ports)."""
    gpus: tuple[int, ...]
    """GPU indices on its node (CUDA_VISIBLE_DEVICES)."""

    @property
    def port(self) -> int:
        return PORT_BASE[self.role] + self.slot

    @property
    def side_port(self) -> int:
        return SIDE_PORT_BASE + 100 * self.slot

    @property
    def host(self) -> str:
        return "localhost" if self.node == 0 else f"${{ADDR[{self.node}]}}"


def pool_gpus(job: LaunchJob) -> tuple[int, int]:
    """(GPUs of one prefill replica, GPUs of one decode replica)."""
    s = job.serve
    return s.pools.prefill_tp * s.pools.prefill_pp * s.dp_attention, job.layout.tp * job.layout.pp * s.dp_attention


def place(job: LaunchJob) -> list[Instance]:
    """Every instance of both pools, prefill first, packed onto nodes of ``gpus_per_node`` GPUs in order; an
    instance that would cross a node boundary starts the next node."""
    pools, gpn = job.serve.pools, job.gpus_per_node
    per = dict(zip(("prefill", "decode"), pool_gpus(job)))
    total = {"prefill": pools.prefill_gpus, "decode": pools.decode_gpus}
    out: list[Instance] = []
    node, used, slot = 0, 0, 0
    for role in ("prefill", "decode"):
        n = per[role]
        if role == "decode" and pools.prefill_gpu and used:      # another GPU kind: the decode pool's own nodes
            node, used, slot = node + 1, 0, 0
        if n > gpn:
            raise Refused(f"a {role} replica of {n} GPUs spans nodes of {gpn}; the script starts one server per "
                          f"replica on one node: use a layout of at most {gpn} GPUs per replica")
        if total[role] % n:
            raise Refused(f"the {role} pool's {total[role]} GPUs are not whole replicas of {n}")
        for _ in range(total[role] // n):
            if used + n > gpn:
                node, used, slot = node + 1, 0, 0
            out.append(Instance(role, node, slot, tuple(range(used, used + n))))
            used, slot = used + n, slot + 1
    return out


def instance_job(job: LaunchJob, role: str) -> LaunchJob:
    """The one-replica job an instance of ``role`` runs (what the engine's own line writer takes)."""
    s = job.serve
    tp, pp = (s.pools.prefill_tp, s.pools.prefill_pp) if role == "prefill" else (job.layout.tp, job.layout.pp)
    return replace(job, layout=Layout(tp=tp, pp=pp), serve=replace(s, replicas=1, pools=None))


def script(header: list[str], job: LaunchJob, inst: list[Instance], line, router: str, files: str = "") -> str:
    """The bash script: ``line(instance)`` is an instance's command (without the GPUs and the trailing &),
    ``router`` the router's command, ``files`` what is written before (here-documents)."""
    from shardlab.export.text import comment_block

    nodes = max(i.node for i in inst) + 1
    per = pool_gpus(job)
    n_pre = sum(i.role == "prefill" for i in inst)
    lines = header + [f"prefill pool: {n_pre} server(s) of {per[0]} GPU(s); decode pool: {len(inst) - n_pre} server(s) "
                      f"of {per[1]} GPU(s); router on port {ROUTER_PORT} of node 0"]
    if nodes > 1:
        lines.append(f"{nodes} nodes: run this script on each with NODE_RANK=K (0 .. {nodes - 1}) and NODE_ADDRS="
                     f"'ADDR0 ADDR1 ...' (every node's address, node 0 first); each starts its own servers")
    out = ["#!/usr/bin/env bash", comment_block(lines).rstrip("\n"), "set -euo pipefail",
           'NODE_RANK=${NODE_RANK:-0}', 'read -r -a ADDR <<< "${NODE_ADDRS:-localhost}"',
           "trap 'kill 0' EXIT                  # the servers stop with the script", ""]
    if files:
        out.append(files.rstrip("\n"))
    seen = {"prefill": 0, "decode": 0}
    for i in inst:
        guard = f'[ "$NODE_RANK" = {i.node} ] && ' if nodes > 1 else ""
        out.append(f"# {i.role} server {seen[i.role]} (node {i.node})")
        seen[i.role] += 1
        out.append(f"{guard}CUDA_VISIBLE_DEVICES={','.join(map(str, i.gpus))} {line(i)} &")
    out += [f"# router (node 0), the address clients use: http://HOST:{ROUTER_PORT}",
            ('[ "$NODE_RANK" = 0 ] && ' if nodes > 1 else "") + router + " &", "wait", ""]
    return "\n".join(out)


# ---- reading a script back -----------------------------------------------------------------------
def commands(text: str) -> list[list[str]]:
    """The script's commands as shell words: continuations joined, comments, here-documents, environment
    assignments, node guards and the trailing & dropped."""
    import re

    from shardlab.export.text import HEREDOC, split_command

    body = HEREDOC.sub("", text).replace("\\\n", " ")
    out = []
    for raw in body.split("\n"):
        raw = re.sub(r'^\s*\[ "\$NODE_RANK" = \d+ \] && ', "", raw)
        w = split_command(raw)
        while w and "=" in w[0] and not w[0].startswith("-"):
            w = w[1:]
        if w and w[-1] == "&":
            w = w[:-1]
        if w:
            out.append(w)
    return out


def multi_flags(words_: list[str]) -> dict[str, list[str]]:
    """``--name v1 v2 ...`` → {name: [v1, v2, ...]} (repeated flags append; a bare switch → [])."""
    out: dict[str, list[str]] = {}
    cur = None
    for w in words_:
        if w.startswith("--"):
            cur = w[2:]
            out.setdefault(cur, [])
        elif cur is not None:
            out[cur].append(w)
    return out


def port_of(fl: dict, where: str) -> int:
    from shardlab.export.text import as_int

    p = as_int(fl, "port", where, 1, 65535)
    if p is None:
        raise ShardlabError(f"{where}: a server of a disaggregated script names no --port; fix the file")
    return p


def pools_fields(roles: list[tuple[str, dict]], where: str) -> dict:
    """``disaggregated`` ('P:D') and ``prefill_tp`` from [(role, the instance's fields)]; the decode instances'
    fields are the job's (all instances of a pool must agree)."""
    by = {"prefill": [f for r, f in roles if r == "prefill"], "decode": [f for r, f in roles if r == "decode"]}
    for role, fs in by.items():
        if not fs:
            raise ShardlabError(f"{where}: the script has no {role} server; a disaggregated job needs both pools")
        keys = ("tp", "pp", "ep", "dp_attention")
        if any({k: f.get(k, 1) for k in keys} != {k: fs[0].get(k, 1) for k in keys} for f in fs):
            raise ShardlabError(f"{where}: the {role} servers differ in layout; shardlab models one layout per pool")
    gpus = lambda f: f.get("tp", 1) * f.get("pp", 1) * f.get("dp_attention", 1)   # noqa: E731
    dec = dict(by["decode"][0])
    dec.pop("replicas", None)
    dec["prefill_tp"] = by["prefill"][0]["tp"]
    if by["prefill"][0].get("pp", 1) > 1:
        dec["prefill_pp"] = by["prefill"][0]["pp"]
    dec["disaggregated"] = f"{len(by['prefill']) * gpus(by['prefill'][0])}:{len(by['decode']) * gpus(dec)}"
    return dec


def understood(f: dict) -> tuple[str, str]:
    return ("prefill and decode servers", f"--disaggregated {f['disaggregated']} --prefill-tp {f['prefill_tp']} "
                                          + (f"--prefill-pp {f['prefill_pp']} " if f.get("prefill_pp") else "")
                                          + (f"--prefill-gpu {f['prefill_gpu']} " if f.get("prefill_gpu") else "")
                                          + f"(decode TP {f['tp']}" + (f" × PP {f['pp']}" if f.get("pp", 1) > 1 else "")
                                          + ")")


def prefill_kind(text: str) -> str | None:
    """The prefill pool's GPU kind where the script's header names one other than the decode pool's."""
    import re

    m = re.search(r"a prefill pool of \d+ (\S+) GPUs .*? a decode pool of \d+ (\S+) GPUs", text)
    return m.group(1) if m and m.group(1) != m.group(2) else None


