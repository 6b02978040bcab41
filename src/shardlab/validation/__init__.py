"""Published training runs, and shardlab's predictions for them (``shardlab validate``).

The runs live in ``runs/*.yaml``, one file per publisher, each with its ``sources:`` (citation per source id) and
runs that state their configuration, the framework that ran them and what was measured. docs/validation.md
discusses each comparison; ``shardlab.validation.fit`` fits the few shared efficiencies and cross-validates them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from shardlab.errors import ShardlabError

RUNS_DIR = Path(__file__).parent / "runs"
CROSSVAL_FILE = Path(__file__).parent / "crossval.yaml"
_RUN_KEYS = {"id", "source", "framework", "model", "gpu", "gpus", "gpus_per_node", "intra_link", "inter_link",
             "inter_node_gbit", "tp", "pp", "cp", "ep", "vpp", "zero", "hsdp", "micro_batch", "global_batch", "seq_len",
             "precision", "recompute", "recompute_fraction", "recompute_modules", "dropout", "flash_attention", "dp_overlap", "compile",
             "schedule", "sequence_parallel", "grad_reduce_bytes", "measured_tflops_per_gpu", "measured_tokens_per_s_per_gpu",
             "convention", "measured_step_time_s", "reported_mfu", "assumed", "informational", "attention_kernel",
             "fused_loss", "fp8_all_gather", "fp8_params", "tp_comm_overlap", "moe_dispatcher", "ep_comm_overlap",
             "expert_imbalance", "etp"}
_FILE_KEYS = {"sources", "defaults", "runs"}


@dataclass(frozen=True)
class PublishedRun:
    """One published measurement and the configuration it was taken with."""

    id: str
    """Short name."""
    config: dict
    """The run's fields from its runs/*.yaml file."""
    measured: float
    """What the authors measured: TFLOP/s per GPU (in ``convention``) or tokens/s per GPU (``metric``)."""
    metric: str
    """'tflops_per_gpu' or 'tokens_per_s_per_gpu'."""
    convention: str
    """For TFLOP/s: 'hardware' (counts recomputation, Narayanan Eq. 3) or 'model' (MFU-style)."""
    source: str
    """Source id (a key of the file's ``sources:``)."""
    citation: str
    """The source's citation, with [primary]/[secondary]/[T]/[B] provenance tags."""
    framework: str
    """Framework id that ran it (catalog ``frameworks:``)."""
    informational: bool = False
    """Reported, but outside the accuracy target (its ``assumed`` says why)."""
    measured_step_time_s: float | None = None
    """Seconds per iteration when published."""

    @property
    def gpu(self) -> str:
        return self.config.get("gpu", "a100-80gb")


def _load_file(path: Path) -> list[PublishedRun]:
    from shardlab.catalog import load_yaml

    data = load_yaml(path)
    if not isinstance(data, dict) or set(data) - _FILE_KEYS or "runs" not in data:
        raise ShardlabError(f"{path}: a runs file has sections {sorted(_FILE_KEYS)}")
    sources = data.get("sources") or {}
    out = []
    for r in data["runs"]:
        unknown = set(r) - _RUN_KEYS
        if unknown:
            raise ShardlabError(f"{path}: run {r.get('id')} has unknown fields {sorted(unknown)}")
        if r.get("source") not in sources:
            raise ShardlabError(f"{path}: run {r.get('id')} names source {r.get('source')!r}, not in the file's sources")
        if ("measured_tflops_per_gpu" in r) == ("measured_tokens_per_s_per_gpu" in r):
            raise ShardlabError(f"{path}: run {r.get('id')} needs exactly one of measured_tflops_per_gpu, measured_tokens_per_s_per_gpu")
        metric = "tflops_per_gpu" if "measured_tflops_per_gpu" in r else "tokens_per_s_per_gpu"
        out.append(PublishedRun(str(r["id"]), dict(r), float(r[f"measured_{metric}"]), metric, r.get("convention", "hardware"),
                                r["source"], str(sources[r["source"]]), r["framework"], bool(r.get("informational", False)),
                                r.get("measured_step_time_s")))
    return out


@lru_cache(maxsize=1)
def _all_runs() -> tuple[PublishedRun, ...]:
    runs = [r for p in sorted(RUNS_DIR.glob("*.yaml")) for r in _load_file(p)]
    ids = [r.id for r in runs]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise ShardlabError(f"validation runs: duplicate ids {sorted(dup)}")
    return tuple(runs)


def load_runs() -> list[PublishedRun]:
    """Every published run in ``runs/*.yaml``."""
    return list(_all_runs())


# ---- models of the runs --------------------------------------------------------------------------
def run_spec(run: PublishedRun, catalog):
    """ModelSpec of a run: a catalog id or a shape shorthand (``model_from_shorthand``)."""
    m = run.config["model"]
    if isinstance(m, str):
        return catalog.model(m)
    return model_from_shorthand(m, run.config.get("seq_len", 2048), "", run.citation)


def model_from_shorthand(m: dict, seq: int, label: str = "", source: str = ""):
    """A ModelSpec from a shape shorthand:
    {gpt: [h, L, a]} (Narayanan 2021 GPT: 4h MLP, vocabulary 51,200, learned positions, biases, tied),
    {mpt: [h, L, a]} (MosaicML MPT: 4h GELU MLP, vocabulary 50,368, learned positions, no biases, tied),
    {llama: {hidden, layers, heads, kv_heads, ffn, vocab}} (RMSNorm, SwiGLU, RoPE, untied)."""
    from shardlab.specs.model import ModelSpec

    if "gpt" in m or "mpt" in m:
        gpt = "gpt" in m
        h, L, a = m["gpt" if gpt else "mpt"]
        return ModelSpec(name=label or f"{'gpt' if gpt else 'mpt'}-h{h}-l{L}-a{a}", family="gpt2", hidden_size=h, num_layers=L, num_heads=a,
                         num_kv_heads=a, ffn_hidden_size=4 * h, vocab_size=51200 if gpt else 50368, max_seq_len=seq, mlp="gelu",
                         norm="layernorm", position="learned", tied_embeddings=True, qkv_bias=gpt, out_bias=gpt, mlp_bias=gpt,
                         source="Narayanan et al. 2021 GPT configuration (vocabulary padded to 51,200)" if gpt else
                         "MosaicML llm-foundry scripts/train/yamls/pretrain/mpt-*.yaml (expansion 4, vocabulary 50,368, no_bias)"
                         ).validate()
    d = m["llama"]
    return ModelSpec(name=label or f"llama-h{d['hidden']}-l{d['layers']}-f{d['ffn']}", family="llama", hidden_size=d["hidden"], num_layers=d["layers"],
                     num_heads=d["heads"], num_kv_heads=d["kv_heads"], ffn_hidden_size=d["ffn"], vocab_size=d["vocab"],
                     max_seq_len=seq, source=source).validate()


def run_cluster(run: PublishedRun, catalog):
    """The run's cluster; ``inter_node_gbit`` (per node, as sources state it) sets the per-GPU inter-node rate."""
    from shardlab.specs.hardware import Cluster

    c = run.config
    acc = catalog.accelerator(run.gpu)
    gpn = c.get("gpus_per_node", acc.system["gpus_per_node"])
    inter = catalog.link(c.get("inter_link", acc.system["inter_link"]))
    if c.get("inter_node_gbit"):
        from shardlab.specs.hardware import per_node_rate

        inter = per_node_rate(inter, c["inter_node_gbit"], gpn)
    return Cluster(acc, c["gpus"], gpn, catalog.link(c.get("intra_link", acc.system["intra_link"])), inter)


def predict_inputs(run: PublishedRun, catalog):
    """(ModelSpec, Layout, Cluster, workload keywords) of a run, as its source states them."""
    from shardlab.layout import Layout

    c = run.config
    cluster = run_cluster(run, catalog)
    tp, pp, cp = c.get("tp", 1), c.get("pp", 1), c.get("cp", 1)
    dp = c["gpus"] // (tp * pp * cp)
    # HSDP: shard inside a node, replicate across nodes
    rep = max(1, dp // max(1, cluster.gpus_per_node // (tp * cp))) if c.get("hsdp") else 1
    lay = Layout(dp=dp, tp=tp, pp=pp, cp=cp, ep=c.get("ep", 1), etp=c.get("etp", 0), zero=c.get("zero", 0),
                 dp_replicate=rep,
                 vpp=c.get("vpp", 1), micro_batch=c.get("micro_batch", 1), recompute=c.get("recompute", "none"),
                 recompute_fraction=float(c.get("recompute_fraction", 1.0)),
                 recompute_modules=tuple(c["recompute_modules"]) if c.get("recompute_modules") else None,
                 sequence_parallel=bool(c.get("sequence_parallel", False)), schedule=c.get("schedule", "1f1b"))
    kw = dict(seq_len=c.get("seq_len", 2048), global_batch=c["global_batch"], precision=c.get("precision", "bf16-mixed"),
              flash_attention=c.get("flash_attention", True), dropout=c.get("dropout", False),
              dp_overlap=c.get("dp_overlap"), grad_reduce_bytes=c.get("grad_reduce_bytes"), compile=c.get("compile"),
              attention_kernel=c.get("attention_kernel"), fused_loss=c.get("fused_loss"),
              tp_comm_overlap=bool(c.get("tp_comm_overlap", False)))
    if any(k in c for k in ("moe_dispatcher", "ep_comm_overlap", "expert_imbalance")):
        from shardlab.comm.moe_dispatch import MoeDispatch

        kw["moe"] = MoeDispatch(c.get("moe_dispatcher", "alltoall"), bool(c.get("ep_comm_overlap", False)),
                                float(c.get("expert_imbalance", 1.0)))
    if c.get("fp8_all_gather") or c.get("fp8_params"):   # torchtitan enable_fsdp_float8_all_gather; Megatron FP8 params
        from shardlab.memory.fp8 import Fp8Recipe
        from shardlab.memory.recipe import Recipe

        kw["recipe"] = Recipe(fp8=Fp8Recipe(all_gather=True, primary_weights=bool(c.get("fp8_params"))))
    return run_spec(run, catalog), lay, cluster, kw


def predict(run: PublishedRun, catalog=None, params=None):
    """Estimate a published run with shardlab; returns a TrainingEstimate. ``params`` (a FittedParams) replaces
    the catalog's fitted efficiencies (cross-validation refits them without the run's source)."""
    from shardlab.catalog import get_catalog
    from shardlab.estimate import estimate_training

    cat = catalog or get_catalog()
    if params is not None:
        cat = params.apply(cat)
    spec, lay, cluster, kw = predict_inputs(run, cat)
    return estimate_training(spec, lay, cluster, framework=cat.framework(run.framework), **kw)


@dataclass
class Comparison:
    """Predicted vs measured for one run."""

    run: PublishedRun
    predicted: float
    """In the run's metric and convention."""
    error: float
    """(predicted − measured) / measured."""
    predicted_step_time_s: float
    family: str
    """framework × GPU generation, e.g. 'pytorch-fsdp × ampere'; mixture-of-experts models are their own families
    ('megatron-lm MoE × hopper'): their expert dispatch, grouped GEMMs and host work are not a dense model's."""
    estimate: object = field(repr=False, default=None)


def predicted_metric(run: PublishedRun, est) -> float:
    if run.metric == "tokens_per_s_per_gpu":
        return est.tokens_per_s / est.gpus
    return est.hardware_tflops_per_gpu if run.convention == "hardware" else est.model_tflops_per_gpu


def family_of(run: PublishedRun, catalog) -> str:
    moe = isinstance(run.config.get("model"), str) and catalog.model(run.config["model"]).moe is not None
    return f"{run.framework}{' MoE' if moe else ''} × {catalog.accelerator(run.gpu).generation}"


def compare(runs: list[PublishedRun] | None = None, catalog=None, params=None) -> list[Comparison]:
    from shardlab.catalog import get_catalog

    cat = catalog or get_catalog()
    out = []
    for run in runs if runs is not None else load_runs():
        est = predict(run, cat, params)
        pred = predicted_metric(run, est)
        out.append(Comparison(run, pred, (pred - run.measured) / run.measured, est.step_time_s, family_of(run, cat), est))
    return out
