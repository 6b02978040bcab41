"""Each engine's disaggregated prefill/decode script and its read-back (the layout of the script: ``export.pd``).

Every instance line is the engine's own one-replica line (``vllm.arg_list``, ``sglang.arg_list``,
``tensorrt_llm.arg_list``) plus the settings below, checked against the engine's flag schema (``data/flags.yaml``);
reading back reads each instance with the engine's own reader and the router's lists for the roles.
"""

from __future__ import annotations

import json
import re
import shlex

import yaml

from shardlab.errors import ShardlabError
from shardlab.export import pd
from shardlab.export.flags import check_flags, require_valid, version
from shardlab.export.job import Export, Imported, LaunchJob, Unsupported, header
from shardlab.export.text import HEREDOC, as_int, flag_words, flags_dict

NIXL = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"}, separators=(",", ":"))
"""vLLM 0.11's KV-transfer configuration for P/D over NIXL (docs/features/nixl_connector_usage.md): every instance
both sends and receives; the proxy decides which instance prefills."""
VLLM_PROXY = '"${VLLM_SRC:-./vllm}/tests/v1/kv_connector/nixl_integration/toy_proxy_server.py"'
SGLANG_BACKEND = "mooncake"
"""SGLang's default KV transfer backend (--disaggregation-transfer-backend), written so it can be changed."""
TRT_CACHE = {"backend": "DEFAULT"}
"""TensorRT-LLM 1.0's cache transceiver (``cache_transceiver_config``): DEFAULT picks UCX or NIXL as built."""


def _checked(target: str, pairs) -> None:
    bad = []
    for k, v in pairs:
        bad += check_flags(target, {k: v})
    if bad:
        raise ShardlabError(f"{target} line: {bad[0]}")


def _requests(job: LaunchJob) -> str:
    s = job.serve
    return f"requests: {s.prompt_len} prompt + {s.output_len} output tokens"


def _export(job: LaunchJob, target: str, kind: str, text: str, uns: list, checked: str) -> Export:
    name = f"{job.model}-{target}-disaggregated.sh"
    return Export(target, kind, name, text, checked, tuple(uns), f"bash {name}")


# ---- vLLM -----------------------------------------------------------------------------------------
def render_vllm(job: LaunchJob) -> Export:
    from shardlab.export import vllm

    inst = pd.place(job)
    lines: dict[str, tuple[str, list]] = {}
    uns: list[Unsupported] = []
    for role in ("prefill", "decode"):
        repo, pairs, u = vllm.arg_list(pd.instance_job(job, role))
        pairs = pairs + [("kv-transfer-config", NIXL)]
        require_valid("vllm", dict(pairs))
        lines[role] = (repo, pairs)
        uns += [x for x in u if x.setting not in {y.setting for y in uns}]
    uns = [u for u in uns if u.setting != "nodes"]

    def line(i: pd.Instance) -> str:
        repo, pairs = lines[i.role]
        return (f"VLLM_NIXL_SIDE_CHANNEL_PORT={i.side_port} vllm serve {repo} \\\n    "
                + " \\\n    ".join(flag_words([("port", i.port), *pairs])))

    pre = [i for i in inst if i.role == "prefill"]
    dec = [i for i in inst if i.role == "decode"]
    proxy = [("host", "0.0.0.0"), ("port", pd.ROUTER_PORT), ("prefiller-hosts", " ".join(i.host for i in pre)),
             ("prefiller-ports", " ".join(str(i.port) for i in pre)), ("decoder-hosts", " ".join(i.host for i in dec)),
             ("decoder-ports", " ".join(str(i.port) for i in dec))]
    _checked("vllm-proxy", [(k, w) for k, v in proxy for w in str(v).split()])
    router = f"python {VLLM_PROXY} \\\n    " + " \\\n    ".join(f"--{k} {v}" for k, v in proxy)
    uns.append(Unsupported("router", "toy_proxy_server.py", "vLLM ships its P/D proxy as an example in its source "
                                                            "tree (set VLLM_SRC to a v0.11.0 checkout); production "
                                                            "deployments put llm-d's or Dynamo's router there"))
    head = header(job, "vllm", uns) + [f"checked against {version('vllm')} flag schema", _requests(job)]
    if job.serve.kv_blocks is not None:
        head.append(f"predicted KV-cache blocks per decode GPU: {job.serve.kv_blocks} of {vllm.BLOCK_TOKENS} tokens; "
                    f"vLLM logs its own count as '# GPU blocks' at start-up")
    return _export(job, "vllm", "vllm serve prefill and decode servers with their proxy",
                   pd.script(head, job, inst, line, router), uns, f"{version('vllm')} flag schema")


# ---- SGLang ---------------------------------------------------------------------------------------
def render_sglang(job: LaunchJob) -> Export:
    from shardlab.export import sglang

    inst = pd.place(job)
    lines, uns = {}, []
    for role in ("prefill", "decode"):
        repo, pairs, u = sglang.arg_list(pd.instance_job(job, role))
        pairs = pairs + [("disaggregation-mode", role), ("disaggregation-transfer-backend", SGLANG_BACKEND)]
        require_valid("sglang", dict(pairs))
        lines[role] = pairs
        uns += [x for x in u if x.setting not in {y.setting for y in uns} and x.setting != "nodes"]

    def line(i: pd.Instance) -> str:
        extra = [("host", "0.0.0.0"), ("port", i.port)] + (
            [("disaggregation-bootstrap-port", i.side_port)] if i.role == "prefill" else [])
        require_valid("sglang", dict(extra))
        return "python -m sglang.launch_server \\\n    " + " \\\n    ".join(flag_words(lines[i.role] + extra))

    router = ["--pd-disaggregation"] + [f"--prefill http://{i.host}:{i.port} {i.side_port}" for i in inst
                                        if i.role == "prefill"]
    router += [f"--decode http://{i.host}:{i.port}" for i in inst if i.role == "decode"]
    router += ["--host 0.0.0.0", f"--port {pd.ROUTER_PORT}"]
    _checked("sglang-router", [(r.split()[0][2:], r.split()[1] if len(r.split()) > 1 else True) for r in router])
    text = pd.script(header(job, "sglang", uns) + [f"checked against {version('sglang')} flag schema", _requests(job)],
                     job, inst, line, "python -m sglang_router.launch_router \\\n    " + " \\\n    ".join(router))
    return _export(job, "sglang", "SGLang prefill and decode servers with sglang_router", text, uns,
                   f"{version('sglang')} flag schema")


# ---- TensorRT-LLM ---------------------------------------------------------------------------------
def render_trtllm(job: LaunchJob) -> Export:
    from shardlab.export import tensorrt_llm as trt

    inst = pd.place(job)
    lines, files, uns = {}, [], []
    for role in ("prefill", "decode"):
        repo, pairs, options, u = trt.arg_list(pd.instance_job(job, role))
        options["cache_transceiver_config"] = dict(TRT_CACHE)
        if role == "prefill":                       # the context servers run without the overlap scheduler
            options["disable_overlap_scheduler"] = True
        bad = trt.check_options(options)
        if bad:
            raise ShardlabError(f"tensorrt-llm options: {bad[0]}")
        name = f"{job.model}-{role}-options.yml"
        pairs = pairs + [("extra_llm_api_options", name)]
        require_valid("tensorrt-llm", dict(pairs))
        lines[role] = (repo, pairs)
        files.append(f"cat > {name} <<'EOF'\n{yaml.safe_dump(options, sort_keys=False).rstrip()}\nEOF")
        uns += [x for x in u if x.setting not in {y.setting for y in uns} and x.setting not in ("nodes", "replicas")]
    url = lambda i: f"{i.host}:{i.port}"            # noqa: E731
    config = {"hostname": "0.0.0.0", "port": pd.ROUTER_PORT, "backend": "pytorch",
              "context_servers": {"num_instances": sum(i.role == "prefill" for i in inst),
                                  "urls": [url(i) for i in inst if i.role == "prefill"]},
              "generation_servers": {"num_instances": sum(i.role == "decode" for i in inst),
                                     "urls": [url(i) for i in inst if i.role == "decode"]}}
    bad = check_config(config)
    if bad:
        raise ShardlabError(f"tensorrt-llm disaggregated config: {bad[0]}")
    cfg = f"{job.model}-disagg.yml"
    files.append(f"cat > {cfg} <<EOF\n{yaml.safe_dump(config, sort_keys=False).rstrip()}\nEOF")   # expands ${ADDR[k]}

    def line(i: pd.Instance) -> str:
        repo, pairs = lines[i.role]
        return (f"trtllm-serve {repo} \\\n    "
                + " \\\n    ".join(flag_words([("host", "0.0.0.0"), ("port", i.port), *pairs])))

    text = pd.script(header(job, "tensorrt-llm", uns) + [f"checked against {version('tensorrt-llm')} option schema",
                                                         _requests(job)],
                     job, inst, line, f"trtllm-serve disaggregated -c {cfg}", "\n".join(files) + "\n")
    return _export(job, "tensorrt-llm", "trtllm-serve context and generation servers with the disaggregated router",
                   text, uns, f"{version('tensorrt-llm')} option schema")


def check_config(config: dict) -> list[str]:
    """Problems of a ``trtllm-serve disaggregated`` config against the schema (empty when valid)."""
    from shardlab.export.flags import schemas

    spec = schemas()["tensorrt-llm"]["disaggregated"]
    bad = [f"{k} is not a key of {version('tensorrt-llm')}'s disaggregated config" for k in config if k not in spec]
    for k in ("context_servers", "generation_servers"):
        v = config.get(k)
        if not isinstance(v, dict) or set(v) - set(spec[k]["keys"]) or not isinstance(v.get("urls"), list):
            bad.append(f"{k} takes the keys {spec[k]['keys']} with a list of urls, got {str(v)[:80]}")
    return bad


# ---- reading back ---------------------------------------------------------------------------------
def _one(reader, words: list[str], text: str, prefix: str = "") -> dict:
    m = re.search(r"requests: \d{1,9} prompt \+ \d{1,9} output tokens", text)
    return reader(prefix + shlex.join(words) + ("\n# " + m.group(0) if m else "") + "\n", None)


def read(target: str, text: str) -> Imported:
    """A disaggregated script of ``target`` back into the job's fields (decode layout, pools, prefill TP)."""
    from shardlab.export import sglang, tensorrt_llm as trt, vllm

    where = f"{target} disaggregated script"
    cmds = pd.commands(text)
    roles: list[tuple[str, dict]] = []
    first: Imported | None = None
    if target == "vllm":
        proxy = next((pd.multi_flags(c) for c in cmds if any("toy_proxy_server" in w for w in c)), None)
        if proxy is None:
            raise ShardlabError(f"{where}: no proxy line names the prefill and decode servers; fix the file")
        pre_ports = {_port(p, where) for p in proxy.get("prefiller-ports", [])}
        for c in cmds:
            if "serve" in c and c[0].endswith("vllm"):
                port = pd.port_of(flags_dict(c), f"vllm serve ({where})")
                imp = _one(vllm.read_one, c, text)
                roles.append(("prefill" if port in pre_ports else "decode", imp.fields))
                first = imp if roles[-1][0] == "decode" else first
    elif target == "sglang":
        for c in cmds:
            if any("sglang.launch_server" in w for w in c):
                mode = flags_dict(c).get("disaggregation-mode")
                if mode not in ("prefill", "decode"):
                    raise ShardlabError(f"{where}: a server without --disaggregation-mode prefill|decode; fix the file")
                imp = _one(sglang.read_one, c, text)
                roles.append((mode, imp.fields))
                first = imp if mode == "decode" else first
    else:
        docs = {m.group(1): m.group(2) for m in HEREDOC.finditer(text)}
        cfg = next((c for c in cmds if c[:2] == ["trtllm-serve", "disaggregated"]), None)
        if cfg is None or "-c" not in cfg or cfg.index("-c") + 1 >= len(cfg) or cfg[cfg.index("-c") + 1] not in docs:
            raise ShardlabError(f"{where}: no `trtllm-serve disaggregated -c CONFIG` with its config in the script; "
                                f"fix the file")
        from shardlab.safeio import yaml_load

        try:
            conf = yaml_load(docs[cfg[cfg.index("-c") + 1]])
        except (yaml.YAMLError, ValueError, TypeError, OverflowError, RecursionError):
            raise ShardlabError(f"{where}: its disaggregated config is not valid YAML; fix the file") from None
        if not isinstance(conf, dict) or check_config(conf):
            raise ShardlabError(f"{where}: its disaggregated config lacks context_servers/generation_servers urls; "
                                f"fix the file")
        ctx = {_port(str(u).rsplit(":", 1)[-1], where) for u in conf["context_servers"]["urls"]}
        for c in cmds:
            if c and c[0] == "trtllm-serve" and c[1:2] != ["disaggregated"]:
                fl = flags_dict(c)
                port = pd.port_of(fl, f"trtllm-serve ({where})")
                opt = str(fl.get("extra_llm_api_options", ""))
                pre = f"cat > {opt} <<'EOF'\n{docs[opt]}\nEOF\n" if opt in docs else ""
                imp = _one(trt.read_one, c, text, pre)
                roles.append(("prefill" if port in ctx else "decode", imp.fields))
                first = imp if port not in ctx else first
    if first is None:
        raise ShardlabError(f"{where}: no decode server found; fix the file")
    f = pd.pools_fields(roles, where)
    kind = pd.prefill_kind(text)
    if kind:
        f["prefill_gpu"] = kind
    quiet = ("disaggregation", "cache_transceiver_config", "disable_overlap_scheduler", "kv-transfer-config")
    ign = tuple(x for x in first.ignored if not any(q in x for q in quiet))
    return Imported(target, f, (pd.understood(f), *first.understood), ign, framework=first.framework)


def _port(text: str, where: str) -> int:
    p = as_int({"port": text.strip()}, "port", where, 1, 65535)
    return int(p)


def is_disaggregated(text: str) -> bool:
    return ("NixlConnector" in text or "--disaggregation-mode" in text or "trtllm-serve disaggregated" in text)
