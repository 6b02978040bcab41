"""Disaggregated prefill/decode launch scripts (export.pd, export.pd_engines): every server line against its engine's
flag schema, the router's lists, the script through bash's own parser, and the read-back into the same estimate."""

import json
import shutil
import subprocess

import pytest

from conftest import cli_main
from shardlab.catalog import get_catalog
from shardlab.export import read_text, sniff
from shardlab.export.flags import check_flags
from shardlab.export.pd import commands, multi_flags
from shardlab.export.pd_engines import check_config
from shardlab.export.text import HEREDOC
from shardlab.export.tensorrt_llm import check_options
from shardlab.export.text import flags_dict
from shardlab.safeio import yaml_load

CAT = get_catalog([])
ENGINES = ("vllm", "sglang", "tensorrt-llm")
FLAGS = ("llama-3.1-70b", "--inference", "--disaggregated", "4:4", "--tp", "4", "--prefill-tp", "2",
         "--prompt-len", "4000", "--output-len", "500")


def export(tmp_path, target, *args):
    out = tmp_path / f"{target}.sh"
    code, _, err = cli_main("export", "--to", target, *args, "--out", str(out))
    assert code == 0, err
    return out.read_text(), out


def servers(target: str, text: str) -> list[dict]:
    mark = {"vllm": "vllm", "sglang": "sglang.launch_server", "tensorrt-llm": "trtllm-serve"}[target]
    return [flags_dict(c) for c in commands(text) if any(mark in w for w in c[:3]) and c[1:2] != ["disaggregated"]
            and not any("toy_proxy" in w for w in c)]


def bash_parses(path) -> None:
    bash = shutil.which("bash")
    if bash:
        r = subprocess.run([bash, "-n", str(path)], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("target", ENGINES)
def test_pools_as_servers_round_trip_into_the_same_estimate(tmp_path, target):
    text, path = export(tmp_path, target, *FLAGS)
    assert sniff(text) == target
    bash_parses(path)
    srv = servers(target, text)
    assert len(srv) == 3                                    # two prefill servers of TP 2, one decode server of TP 4
    schema = {"vllm": "vllm", "sglang": "sglang", "tensorrt-llm": "tensorrt-llm"}[target]
    for fl in srv:
        fl.pop("model-path", None) if target != "sglang" else None
        assert check_flags(schema, {k: v for k, v in fl.items() if k != "model-path" or target == "sglang"}) == []
    tp = {"vllm": "tensor-parallel-size", "sglang": "tp-size", "tensorrt-llm": "tp_size"}[target]
    assert sorted(int(fl[tp]) for fl in srv) == [2, 2, 4]
    ports = [int(fl["port"]) for fl in srv]
    assert len(set(ports)) == 3
    if target == "vllm":
        assert all(json.loads(fl["kv-transfer-config"])["kv_connector"] == "NixlConnector" for fl in srv)
        proxy = next(multi_flags(c) for c in commands(text) if any("toy_proxy" in w for w in c))
        assert sorted(map(int, proxy["prefiller-ports"] + proxy["decoder-ports"])) == sorted(ports)
        assert "# GPU blocks" in text
    elif target == "sglang":
        assert sorted(fl["disaggregation-mode"] for fl in srv) == ["decode", "prefill", "prefill"]
        router = next(c for c in commands(text) if any("launch_router" in w for w in c))
        assert "--pd-disaggregation" in router and router.count("--prefill") == 2 and router.count("--decode") == 1
    else:
        docs = {m.group(1): yaml_load(m.group(2)) for m in HEREDOC.finditer(text)}
        conf = docs["llama-3.1-70b-disagg.yml"]
        assert check_config(conf) == [] and len(conf["context_servers"]["urls"]) == 2
        pre = docs["llama-3.1-70b-prefill-options.yml"]
        assert check_options(pre) == [] and pre["disable_overlap_scheduler"] is True
        assert pre["cache_transceiver_config"]["backend"] == "DEFAULT"
    f = read_text(text, CAT).fields
    assert (f["disaggregated"], f["prefill_tp"], f["tp"]) == ("4:4", 2, 4)
    fw = [] if target == "vllm" else ["--framework", target]
    # the file caps each server's sequences at the decode replica's capacity (--max-num-seqs): the same estimate with
    # that cap (the engine's activation peak, so its KV blocks, follow the cap)
    direct = json.loads(cli_main("estimate", *FLAGS, "--serve", "--json", *fw, "--max-num-seqs",
                                 str(f["max_num_seqs"]))[1])
    back = json.loads(cli_main("estimate", "--from", str(path), "--json")[1])
    assert back["disaggregated"] == direct["disaggregated"] and back["kv_transfer_s"] == direct["kv_transfer_s"]


def test_plan_exports_its_disaggregated_winner_across_two_nodes(tmp_path):
    out = tmp_path / "pd.sh"
    code, doc, err = cli_main("plan", "llama-3.1-70b", "--inference", "--serve", "--gpus", "16", "--prompt-len", "4000",
                              "--output-len", "500", "--ttft-slo", "1", "--tpot-slo", "0.025", "--export", "sglang",
                              "--out", str(out), "--json")
    assert code == 0, err
    doc = json.loads(doc)
    assert doc["comparison"]["winner"] == "disaggregated"
    best = doc["disaggregated"][0]
    text = out.read_text()
    bash_parses(out)
    assert 'NODE_RANK" = 1 ]' in text and "${ADDR[1]}" in text          # the decode server on the second node
    f = read_text(text, CAT).fields
    assert f["disaggregated"] == f"{best['prefill']['gpus']}:{best['decode']['gpus']}"
    assert (f["prefill_tp"], f["tp"]) == (best["prefill"]["tp"], best["decode"]["tp"])
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(doc))
    code, _, err = cli_main("export", "--to", "shardlab", "--plan", str(plan), "--out", str(tmp_path / "j.toml"))
    assert code == 0, err
    assert f'disaggregated = "{f["disaggregated"]}"' in (tmp_path / "j.toml").read_text()
    code, out2, err = cli_main("export", "--to", "vllm", "--plan", str(plan), "--rank", "1", "--json")
    assert code == 0 and "disaggregated" not in json.loads(out2)["kind"]    # --rank picks the aggregated plans
    for target in ("slurm", "skypilot"):        # one command per node cannot start two pools: the way out, named
        code, _, err = cli_main("export", "--to", target, "--plan", str(plan), "--launch", "vllm")
        assert code == 2 and err.count("\n") == 1 and "--to vllm" in err and "--rank 1" in err
    code, _, err = cli_main("plan", "llama-3.1-70b", "--inference", "--serve", "--gpus", "16", "--prompt-len", "4000",
                            "--output-len", "500", "--ttft-slo", "1", "--tpot-slo", "0.025", "--export", "slurm",
                            "--launch", "vllm", "--out", str(tmp_path / "job.sbatch"))
    assert code == 0, err                       # plan --export slurm: the aggregated winner
    assert "--disaggregat" not in (tmp_path / "job.sbatch").read_text() and "vllm serve" in (tmp_path / "job.sbatch").read_text()


@pytest.mark.parametrize("pools,word", [("3:4", "whole replicas"), ("4:0", "P:D"), ("4:4:4", "P:D")])
def test_pools_that_do_not_split_into_replicas_are_one_line(pools, word):
    code, _, err = cli_main("export", "--to", "sglang", "llama-3.1-70b", "--inference", "--disaggregated", pools,
                            "--tp", "4", "--prefill-tp", "2")
    assert code == 2 and err.count("\n") == 1 and word in err and "Traceback" not in err


def test_a_script_without_its_router_lists_is_one_line(tmp_path):
    text, path = export(tmp_path, "vllm", *FLAGS)
    path.write_text("\n".join(x for x in text.split("\n") if "toy_proxy" not in x and "--prefiller" not in x
                              and "--decoder" not in x))
    code, _, err = cli_main("estimate", "--from", str(path))
    assert code == 2 and err.count("\n") == 1 and "proxy" in err


def test_pools_of_two_gpu_kinds(tmp_path):
    """Splitwise's mixed pools: H100 prefill, H200 decode; the KV crosses the NIC even where 4 + 4 GPUs would share
    a node, each pool has its own memory, and the script puts the decode pool on its own node and reads back."""
    args = ("llama-3.1-70b", "--inference", "--disaggregated", "4:4", "--tp", "4", "--prefill-tp", "4", "--gpu", "h200",
            "--prompt-len", "4000", "--output-len", "500")
    code, out, err = cli_main("estimate", *args, "--prefill-gpu", "h100-sxm", "--serve", "--arrival-rate", "1", "--json")
    assert code == 0, err
    d = json.loads(out)["disaggregated"]
    assert (d["prefill"]["gpu"], d["decode"]["gpu"], d["kv_link"]) == ("h100-sxm", "h200", "inter")
    assert d["decode"]["kv_blocks_per_gpu"] > 2 * d["prefill"]["kv_blocks_per_gpu"]       # 141 GB against 80 GB
    same = json.loads(cli_main("estimate", *args, "--serve", "--arrival-rate", "1", "--json")[1])["disaggregated"]
    assert same["kv_link"] == "intra" and same["kv_transfer_s"] < d["kv_transfer_s"]
    text, path = export(tmp_path, "vllm", *args, "--prefill-gpu", "h100-sxm")
    bash_parses(path)
    assert 'NODE_RANK" = 1 ] && CUDA_VISIBLE_DEVICES=0,1,2,3 VLLM' in text          # the decode server's own node
    f = read_text(text, CAT).fields
    assert (f["disaggregated"], f["prefill_gpu"]) == ("4:4", "h100-sxm")
    back = json.loads(cli_main("estimate", "--from", str(path), "--gpu", "h200", "--json")[1])["disaggregated"]
    assert back["prefill"]["gpu"] == "h100-sxm" and back["kv_link"] == "inter"


def test_pipeline_stages_in_both_pools_round_trip(tmp_path):
    text, path = export(tmp_path, "sglang", "llama-3.1-70b", "--inference", "--disaggregated", "8:8", "--tp", "4",
                        "--pp", "2", "--prefill-tp", "2", "--prefill-pp", "2", "--prompt-len", "4000", "--output-len",
                        "500")
    bash_parses(path)
    assert text.count("--pp-size 2") == 3 and "replicas of TP 2 × PP 2" in text
    f = read_text(text, CAT).fields
    assert (f["tp"], f["pp"], f["prefill_tp"], f["prefill_pp"]) == (4, 2, 2, 2)
    back = json.loads(cli_main("estimate", "--from", str(path), "--json")[1])["disaggregated"]
    assert (back["prefill"]["pp"], back["decode"]["pp"]) == (2, 2)


@pytest.mark.parametrize("flags,word", [(["--prefill-gpu", "h100-sxm"], "--disaggregated"),
                                        (["--disaggregated", "4:4", "--prefill-gpu", "h999"], "h999")])
def test_prefill_gpu_bad_input_is_one_line(flags, word):
    code, _, err = cli_main("estimate", "llama-3.1-70b", "--inference", "--serve", "--tp", "4", *flags)
    assert code == 2 and err.count("\n") == 1 and word in err and "Traceback" not in err


@pytest.mark.parametrize("target,old,new,word", [
    ("vllm", "--port 20000", "--port abc", "--port"),
    ("vllm", "--prefiller-ports 20000 20001", "--prefiller-ports x y", "--port"),
    ("sglang", "--disaggregation-mode prefill", "--disaggregation-mode both", "--disaggregation-mode"),
    ("sglang", "--tp-size 2", "--tp-size 3", "prefill servers"),
    ("sglang", "--disaggregation-mode prefill", "--disaggregation-mode decode", "no prefill server"),
    ("tensorrt-llm", "context_servers:", "context_servers: [", "YAML"),
    ("tensorrt-llm", "urls:", "urlz:", "urls"),
    ("tensorrt-llm", "--port 30002", "--port 0", "--port"),
])
def test_tampered_disaggregated_scripts_are_one_line(tmp_path, target, old, new, word):
    text, path = export(tmp_path, target, "llama-3.1-70b", "--inference", "--disaggregated", "4:4", "--tp", "4",
                        "--prefill-tp", "2")
    assert old in text
    path.write_text(text.replace(old, new))
    code, _, err = cli_main("estimate", "--from", str(path))
    assert code == 2 and err.count("\n") == 1 and word in err and "Traceback" not in err

