"""Published training runs, and shardlab's predictions for them (``shardlab validate``).

The runs live in ``runs.yaml`` with their sources; docs/validation.md discusses each comparison.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from shardlab.errors import ShardlabError

RUNS_FILE = Path(__file__).parent / "runs.yaml"
_RUN_KEYS = {"id", "model", "gpu", "gpus", "gpus_per_node", "intra_link", "inter_link", "tp", "pp", "cp", "ep", "vpp",
             "zero", "micro_batch", "global_batch", "seq_len", "precision", "recompute", "dropout", "flash_attention",
             "dp_overlap", "schedule", "sequence_parallel", "grad_reduce_bytes", "measured_tflops_per_gpu", "convention",
             "measured_step_time_s", "source", "assumed", "informational"}


@dataclass(frozen=True)
class PublishedRun:
    """One published measurement and the configuration it was taken with."""

    id: str
    """Short name."""
    config: dict
    """The run's fields from runs.yaml."""
    measured_tflops_per_gpu: float
    """What the authors measured, in their FLOP convention."""
    convention: str
    """'hardware' (counts recomputation, Narayanan Eq. 3) or 'model' (MFU-style)."""
    source: str
    """Where the configuration and the number come from, [primary] or [secondary]."""
    informational: bool = False
    """Reported, but outside the accuracy target (see `assumed`)."""
    measured_step_time_s: float | None = None
    """Seconds per iteration when published."""


def load_runs(path: Path = RUNS_FILE) -> list[PublishedRun]:
    from shardlab.catalog import load_yaml

    data = load_yaml(path)
    out = []
    for r in data["runs"]:
        unknown = set(r) - _RUN_KEYS
        if unknown:
            raise ShardlabError(f"{path}: run {r.get('id')} has unknown fields {sorted(unknown)}")
        out.append(PublishedRun(r["id"], dict(r), float(r["measured_tflops_per_gpu"]), r.get("convention", "hardware"),
                                r["source"], bool(r.get("informational", False)), r.get("measured_step_time_s")))
    return out


def run_spec(run: PublishedRun, catalog):
    """ModelSpec of a run: a catalog id, or {gpt: [hidden, layers, heads]} (GPT block, vocabulary 51,200)."""
    from shardlab.specs.model import ModelSpec

    m = run.config["model"]
    if isinstance(m, str):
        return catalog.model(m)
    h, L, a = m["gpt"]
    seq = run.config.get("seq_len", 2048)
    return ModelSpec(name=f"gpt-{run.id}", family="gpt2", hidden_size=h, num_layers=L, num_heads=a, num_kv_heads=a,
                     ffn_hidden_size=4 * h, vocab_size=51200, max_seq_len=seq, mlp="gelu", norm="layernorm",
                     position="learned", tied_embeddings=True, qkv_bias=True, out_bias=True, mlp_bias=True,
                     source="Narayanan et al. 2021 GPT configuration (vocabulary padded to 51,200)").validate()


def predict(run: PublishedRun, catalog=None):
    """Estimate a published run with shardlab; returns a TrainingEstimate."""
    from shardlab.catalog import get_catalog
    from shardlab.estimate import estimate_training
    from shardlab.layout import Layout
    from shardlab.specs.hardware import Cluster

    cat = catalog or get_catalog()
    c = run.config
    acc = cat.accelerator(c.get("gpu", "a100-80gb"))
    gpn = c.get("gpus_per_node", acc.system["gpus_per_node"])
    cluster = Cluster(acc, c["gpus"], gpn, cat.link(c.get("intra_link", acc.system["intra_link"])),
                      cat.link(c.get("inter_link", acc.system["inter_link"])))
    tp, pp, cp = c.get("tp", 1), c.get("pp", 1), c.get("cp", 1)
    lay = Layout(dp=c["gpus"] // (tp * pp * cp), tp=tp, pp=pp, cp=cp, ep=c.get("ep", 1), zero=c.get("zero", 0),
                 vpp=c.get("vpp", 1), micro_batch=c.get("micro_batch", 1), recompute=c.get("recompute", "none"),
                 sequence_parallel=bool(c.get("sequence_parallel", False)), schedule=c.get("schedule", "1f1b"))
    return estimate_training(run_spec(run, cat), lay, cluster, seq_len=c.get("seq_len", 2048),
                             global_batch=c["global_batch"], precision=c.get("precision", "bf16-mixed"),
                             flash_attention=c.get("flash_attention", True), dropout=c.get("dropout", False),
                             dp_overlap=c.get("dp_overlap", True), grad_reduce_bytes=c.get("grad_reduce_bytes", 0))


@dataclass
class Comparison:
    """Predicted vs measured for one run."""

    run: PublishedRun
    predicted_tflops_per_gpu: float
    """In the run's convention."""
    error: float
    """(predicted − measured) / measured."""
    predicted_step_time_s: float
    estimate: object = field(repr=False, default=None)


def compare(runs: list[PublishedRun] | None = None, catalog=None) -> list[Comparison]:
    out = []
    for run in runs or load_runs():
        est = predict(run, catalog)
        pred = est.hardware_tflops_per_gpu if run.convention == "hardware" else est.model_tflops_per_gpu
        out.append(Comparison(run, pred, (pred - run.measured_tflops_per_gpu) / run.measured_tflops_per_gpu,
                              est.step_time_s, est))
    return out
