"""hf:ORG/NAME models through huggingface_hub, against a Hugging Face cache built in a temporary directory (no network)."""

import json
from pathlib import Path

import pytest

pytest.importorskip("huggingface_hub")

from shardlab.catalog import get_catalog  # noqa: E402
from shardlab.catalog.hub import parse_ref  # noqa: E402
from shardlab.cli import main  # noqa: E402
from shardlab.errors import ShardlabError  # noqa: E402
from shardlab.specs.tensors import param_counts  # noqa: E402

DATA = Path(__file__).parent / "data" / "hf-families"
from conftest import COMMIT, _cache_repo  # noqa: E402


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    _cache_repo(cache, "google/gemma-2-2b", (DATA / "gemma-2-2b.json").read_bytes())
    _cache_repo(cache, "Qwen/Qwen3-30B-A3B", (DATA / "qwen3-30b-a3b.json").read_bytes())
    return cache


def test_models_command_reads_the_cache(hf_cache, capsys):
    assert main(["models", "hf:google/gemma-2-2b", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["params"] == 2_614_341_888
    assert "google/gemma-2-2b@main" in doc["model"]["source"] and COMMIT[:12] in doc["model"]["source"]


def test_hub_model_anywhere_a_model_is_accepted(hf_cache, capsys):
    assert main(["memory", "hf:Qwen/Qwen3-30B-A3B", "--gpus", "8", "--zero", "3", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model"]["params"] == 30_532_122_624 and doc["model"]["name"] == "hf:Qwen/Qwen3-30B-A3B"


def test_hf_home_is_honoured(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _cache_repo(tmp_path / "hub", "google/gemma-2-2b", (DATA / "gemma-2-2b.json").read_bytes())
    assert param_counts(get_catalog().model("hf:google/gemma-2-2b")).total == 2_614_341_888


def test_offline_and_not_cached_is_one_line_with_the_fix(hf_cache, capsys):
    assert main(["models", "hf:meta-llama/Llama-3.1-8B"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "not in the Hugging Face cache" in err and str(hf_cache) in err
    assert "HF_HUB_OFFLINE" in err and "pass its path" in err


def test_gated_repo_names_hf_token(monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import GatedRepoError

    seen = {}

    def fake_download(repo, filename, **kw):
        seen.update(kw, repo=repo)
        e = GatedRepoError.__new__(GatedRepoError)
        Exception.__init__(e, "401 gated")
        raise e

    from shardlab.catalog import hub

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    monkeypatch.setattr(hub, "_hub_reachable", lambda: True)      # as with a network (the probe is tested below)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(ShardlabError, match="gated.*HF_TOKEN"):
        get_catalog().model("hf:meta-llama/Llama-3.1-8B@v1")
    assert seen["token"] == "hf_secret" and seen["revision"] == "v1" and seen["repo"] == "meta-llama/Llama-3.1-8B"
    assert seen["local_files_only"] is False


def test_missing_extra_names_the_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "huggingface_hub", None)
    with pytest.raises(ShardlabError, match=r"shardlab\[hub\]"):
        get_catalog().model("hf:google/gemma-2-2b")


@pytest.mark.parametrize("bad", ["hf:gemma", "hf:a/b/c", "hf:/x", "hf:a b/c"])
def test_malformed_reference(bad):
    with pytest.raises(ShardlabError, match="hf:ORG/NAME"):
        parse_ref(bad)


@pytest.mark.parametrize("config, msg", [(b'{"a":' * 30000 + b"1" + b"}" * 30000, "nests"),
                                         (b'{"hidden_size": NaN}', "not JSON"), (b"\xff\xfe", "UTF-8")])
def test_tampered_cache_entry_is_one_line(tmp_path, monkeypatch, capsys, config, msg):
    """A cache entry is read like any user file (nesting, NaN, encoding): one line naming it and the fix."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _cache_repo(tmp_path, "acme/broken", config)
    assert main(["models", "hf:acme/broken"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and msg in err and "delete it and fetch again" in err, err


def test_no_network_uses_the_cache_within_seconds(hf_cache, monkeypatch):
    """HF_HUB_OFFLINE unset and the Hub unreachable: the cached model is read after one quick probe (not the ~24 s of
    huggingface_hub's retries), and an uncached one is one line saying the Hub did not answer."""
    import time

    from shardlab.catalog import hub

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")        # the discard port: refused at once
    monkeypatch.setattr(hub, "_REACHABLE", {})
    t0 = time.monotonic()
    assert param_counts(get_catalog().model("hf:google/gemma-2-2b")).total == 2_614_341_888
    assert time.monotonic() - t0 < 5
    code, _, err = __import__("conftest").cli_main("models", "hf:meta-llama/Llama-3.1-8B")
    assert code == 2 and "did not answer within 3 s" in err
