"""Models from the Hugging Face Hub: ``hf:ORG/NAME[@REVISION]`` wherever a model is accepted.

Only ``config.json`` is fetched, through ``huggingface_hub.hf_hub_download`` (the optional extra
``pip install 'shardlab[hub]'``), so it lands in the standard Hugging Face cache
(``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``) and is shared with
transformers. With ``HF_HUB_OFFLINE=1``, or when the Hub cannot be reached, the cached copy is used.
``HF_TOKEN`` (or a token saved by ``hf auth login``) opens gated and private repositories.
Every failure becomes one ShardlabError line that names the fix.
"""

from __future__ import annotations

import os
from pathlib import Path

from shardlab.errors import ShardlabError

PREFIX = "hf:"


def is_hub_ref(name: str) -> bool:
    """True for ``hf:ORG/NAME`` references."""
    return name.lower().startswith(PREFIX)


def parse_ref(ref: str) -> tuple[str, str | None]:
    """'hf:ORG/NAME@rev' -> ('ORG/NAME', 'rev'); a ShardlabError for a malformed reference."""
    body = ref[len(PREFIX):]
    repo, _, rev = body.partition("@")
    parts = repo.split("/")
    if len(parts) != 2 or not all(parts) or any(c.isspace() for c in repo) or len(repo) > 96:
        raise ShardlabError(f"'{ref}' is not a Hub model reference; write hf:ORG/NAME (e.g. hf:google/gemma-2-2b), "
                            f"optionally @REVISION")
    return repo, rev or None


NETWORK_PROBE_S = 3.0
"""How long shardlab waits for the Hub's address to answer before it uses the local cache (huggingface_hub's own
retries take about 24 s without a network)."""
_REACHABLE: dict[str, bool] = {}


def _hub_reachable() -> bool:
    """A TCP connection to the Hub endpoint (HF_ENDPOINT, else huggingface.co:443) within NETWORK_PROBE_S; cached for
    the process."""
    import socket
    from urllib.parse import urlparse

    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    key = f"{host}:{port}"
    if key not in _REACHABLE:
        try:
            with socket.create_connection((host, port), timeout=NETWORK_PROBE_S):
                _REACHABLE[key] = True
        except OSError:
            _REACHABLE[key] = False
    return _REACHABLE[key]


def _offline() -> bool:
    """HF_HUB_OFFLINE, or no answer from the Hub within NETWORK_PROBE_S: read the cache only."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return True
    return not _hub_reachable()


def cache_dir() -> str | None:
    """The cache directory from the environment at call time (None: the library's default)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]) / "hub")
    return None


def fetch_config(ref: str) -> tuple[dict, str]:
    """(config mapping, local path) of ``hf:ORG/NAME[@rev]``'s config.json, from the cache or the Hub."""
    repo, rev = parse_ref(ref)
    try:
        import huggingface_hub
        import huggingface_hub.constants
        from huggingface_hub import errors
        from huggingface_hub.utils import disable_progress_bars, logging
    except ImportError:
        raise ShardlabError(f"{ref}: reading models from the Hub needs huggingface_hub: pip install 'shardlab[hub]' "
                            f"(or download config.json and pass its path)") from None
    disable_progress_bars()
    logging.set_verbosity_error()  # no retry chatter on stderr: the error below is the one line
    where = cache_dir() or huggingface_hub.constants.HF_HUB_CACHE
    try:
        path = huggingface_hub.hf_hub_download(repo, "config.json", revision=rev, cache_dir=cache_dir(),
                                               token=os.environ.get("HF_TOKEN") or None, local_files_only=_offline())
    except errors.GatedRepoError:
        raise ShardlabError(f"{ref} is gated: accept its licence on the model page, then set HF_TOKEN to a token with "
                            f"access (or run `hf auth login`)") from None
    except errors.RepositoryNotFoundError:
        raise ShardlabError(f"{ref}: no such repository on the Hub, or it is private; check ORG/NAME, or set HF_TOKEN "
                            f"for a private one") from None
    except errors.RevisionNotFoundError:
        raise ShardlabError(f"{ref}: revision '{rev}' does not exist; drop @{rev} or name an existing branch, tag or commit") from None
    except errors.LocalEntryNotFoundError:
        env_off = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
        how = ("HF_HUB_OFFLINE is set" if env_off else f"the Hub did not answer within {NETWORK_PROBE_S:g} s")
        raise ShardlabError(f"{ref}: config.json is not in the Hugging Face cache ({where}) and {how}; run once with a "
                            f"connection (unset HF_HUB_OFFLINE), or download config.json and pass its path") from None
    except errors.EntryNotFoundError:
        raise ShardlabError(f"{ref} has no config.json (not a transformers model repository); pass a config file path") from None
    except errors.HFValidationError:         # a repo id or revision the library refuses ('org/na..me', '-org/x')
        raise ShardlabError(f"'{ref}' is not a valid Hub repository id; write hf:ORG/NAME with letters, digits, '-', "
                            f"'_' and '.' (not starting or ending with '-' or '.', no '--' or '..')") from None
    except OSError as e:  # the cache folder on this disk (not a folder, not writable, full), else the network
        import errno

        if e.errno in (errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EEXIST,
                       errno.ENAMETOOLONG, errno.ELOOP):
            raise ShardlabError(f"{ref}: the Hugging Face cache at {where} cannot be used ({e.strerror or type(e).__name__}); "
                                f"check HF_HOME / HF_HUB_CACHE (a writable folder), or pass a config.json path") from None
        fix = "check HF_HOME / HF_HUB_CACHE" if _offline() else "retry, or set HF_HUB_OFFLINE=1 to use the cache"
        raise ShardlabError(f"{ref}: could not fetch config.json ({type(e).__name__}); {fix}") from None
    except ValueError as e:   # a hand-edited cache (refs/main pointing outside the snapshot folder)
        raise ShardlabError(f"{ref}: the Hugging Face cache at {where} is damaged ({str(e)[:80]}); delete this model's "
                            f"folder there and fetch again") from None
    from shardlab.safeio import load_json

    try:                        # size, file kind, nesting and NaN checks: a cache entry is a file like any other
        data = load_json(path, "cached config.json")
    except ShardlabError as e:
        why = str(e).removesuffix("; fix or regenerate it").removesuffix("; is it the right file?")  # one fix: ours
        raise ShardlabError(f"{ref}: {why}; delete it and fetch again") from None
    if not isinstance(data, dict):
        raise ShardlabError(f"{ref}: config.json at {path} is not a JSON object; delete it and fetch again")
    return data, str(path)


def load_hub_model(ref: str):
    """A ModelSpec for ``hf:ORG/NAME[@rev]`` (name = the reference, source = the repository and cached file)."""
    from shardlab.specs.hf import from_hf_config

    data, path = fetch_config(ref)
    repo, rev = parse_ref(ref)
    spec = from_hf_config(data, name=ref, where=f"{ref} config.json")
    snapshot = Path(path).parent.name
    note = spec.source[spec.source.index("("):] if "(" in spec.source else ""
    return spec.with_(source=f"Hugging Face Hub {repo}@{rev or 'main'} config.json, snapshot {snapshot[:12]} in the local "
                             f"Hugging Face cache {note}".rstrip())
