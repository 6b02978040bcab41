"""Estimate one training layout: step time from its parts, throughput, MFU/HFU, memory, time to train."""

from __future__ import annotations

from dataclasses import dataclass, field


from shardlab.comm.moe_dispatch import check_overlap_modules, moe_notes
from shardlab.errors import ShardlabError, field_name
from shardlab.rates.hardware import matmul_curve
from shardlab.estimate.step import evaluate
from shardlab.estimate.workload import Workload, workload_for, workload_memory
from shardlab.flops import six_psi_d
from shardlab.layout import TOKENS_PER_STEP, Layout, default_global_batch, layouts_to_arrays
from shardlab.layout_checks import validate
from shardlab.memory import MemoryReport, Overheads
from shardlab.specs.hardware import Cluster
from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import param_counts

DEFAULT_FRAMEWORK = "megatron-lm"
"""The framework estimates assume when none is named (printed with every estimate)."""
BREAKDOWN_KEYS = ("compute_s", "recompute_s", "tp_comm_s", "cp_comm_s", "ep_comm_s", "pp_p2p_s", "zero3_comm_s",
                  "pp_bubble_s", "dp_comm_s", "optimizer_s", "host_overhead_s", "offload_s")


@dataclass
class TrainingEstimate:
    """The answer of ``shardlab estimate`` for one layout."""

    model: ModelSpec
    layout: Layout
    cluster: Cluster
    workload: Workload
    microbatches: int
    step_time_s: float
    breakdown: dict[str, float]
    tokens_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    hfu: float
    memory: MemoryReport
    slowest_stage: int
    dp_comm_total_s: float
    tokens: float | None = None
    dp_window_s: float = 0.0
    """The compute the DP/ZeRO-1/2 reduction overlaps: the blocks' backward of the last micro-batch (s)."""
    notes: list[str] = field(default_factory=list)
    comm_total_s: dict[str, float] = field(default_factory=dict)
    """Per communication component of the breakdown (tp_comm_s, ...): what its collectives take in all, hidden
    or not (s); the breakdown holds what the step waits for."""

    @property
    def gpus(self) -> int:
        return self.layout.world_size

    @property
    def accelerator(self):
        return self.cluster.accelerator

    @property
    def fits(self) -> bool:
        return bool(self.memory.fits)

    @property
    def steps(self) -> int | None:
        """Optimizer steps to see ``tokens``: whole steps (the last one runs in full), so never less than one."""
        import math

        return None if self.tokens is None else math.ceil(self.tokens / (self.workload.global_batch * self.workload.seq_len)
                                                          - 1e-9)

    @property
    def train_time_s(self) -> float | None:
        return None if self.tokens is None else self.steps * self.step_time_s

    @property
    def gpu_hours(self) -> float | None:
        return None if self.tokens is None else self.train_time_s / 3600 * self.gpus

    def six_psi_d_time_s(self) -> float | None:
        """Time to train by C ≈ 6ΨD (active parameters) at this estimate's achieved model FLOP/s."""
        if self.tokens is None:
            return None
        return six_psi_d(param_counts(self.model).active, self.tokens) / (self.model_tflops_per_gpu * 1e12 * self.gpus)

    def to_dict(self) -> dict:
        lay = self.layout
        d = {
            "model": self.model.name, "gpus": self.gpus, "gpu": self.accelerator.id,
            "layout": {**lay.to_dict(), "microbatches": self.microbatches},
            "cluster": {"gpus_per_node": self.cluster.gpus_per_node, "intra_link": self.cluster.intra_link.id,
                        "inter_link": self.cluster.inter_link.id, "nodes": self.cluster.num_nodes},
            "workload": {"seq_len": self.workload.seq_len, "global_batch": self.workload.global_batch,
                         "precision": self.workload.precision, "optimizer": self.workload.optimizer,
                         "tokens_per_step": self.workload.seq_len * self.workload.global_batch,
                         "fp8_params": self.workload.fp8_params},
            "step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s,
            "model_tflops_per_gpu": self.model_tflops_per_gpu, "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu,
            "mfu": self.mfu, "hfu": self.hfu,
            "framework": {"id": self.workload.framework, "kernels": self.workload.kernels,
                          "attention_kernel": self.workload.attention_label, "dp_overlap": self.workload.dp_overlap,
                          "tp_comm_overlap": self.workload.tp_comm_overlap,
                          "moe_dispatcher": self.workload.moe.dispatcher,
                          "ep_comm_overlap": self.workload.moe.ep_comm_overlap,
                          "expert_imbalance": self.workload.moe.expert_imbalance,
                          "zero3_prefetch": self.workload.zero3_prefetch,
                          "zero3_regather_for_recompute": self.workload.zero3_regather_for_recompute,
                          "grad_reduce_bytes": self.workload.grad_reduce_bytes,
                          "main_grad_bytes": self.workload.main_grad_bytes,
                          "overlap_efficiency": float(self.cluster.accelerator.overlap_efficiency or 0.0),
                          "layer_host_s": float(self.workload.layer_host_s),
                          "pipeline_host_s": float(self.workload.pipeline_host_s),
                          "step_overhead_s": float(self.workload.step_overhead_s)},
            "flop_convention": "model FLOPs = 3 x forward (Korthikanti 2022 Eq. 7, full s^2 attention); hardware "
                               "FLOPs add "
                               "recomputation (Narayanan 2021 Eq. 3 with full recomputation)",
            "breakdown": dict(self.breakdown), "slowest_stage": self.slowest_stage,
            "dp_comm_total_s": self.dp_comm_total_s, "dp_window_s": self.dp_window_s,
            "comm_total_s": dict(self.comm_total_s),
            "memory": self.memory.to_dict(), "fits": self.fits, "notes": self.notes,
        }
        from shardlab.estimate.recipe_terms import offload_detail

        if offload_detail(self) is not None:
            d["offload"] = offload_detail(self)
        if self.tokens is not None:
            d.update(tokens=self.tokens, steps=self.steps, train_time_s=self.train_time_s,
                     train_days=self.train_time_s / 86400, gpu_hours=self.gpu_hours,
                     six_psi_d_days=self.six_psi_d_time_s() / 86400)
        return d


def positions_notes(spec: ModelSpec, seq_len: int) -> list[str]:
    """A sequence longer than the model's positions: refused for a learned position table (it has no row for them),
    a note for RoPE and ALiBi (long-context training extends them; the estimate prices the length asked)."""
    if seq_len <= spec.max_seq_len:
        return []
    if spec.position == "learned":
        raise ShardlabError(f"{field_name('workload.seq_len')} {seq_len:,} exceeds {spec.name}'s {spec.max_seq_len:,} "
                            "learned positions; use "
                            f"at most {spec.max_seq_len:,}")
    return [f"{field_name('workload.seq_len')} {seq_len:,} is beyond {spec.name}'s {spec.max_seq_len:,} positions: "
            "priced as asked, as "
            f"long-context training that extends its {'RoPE' if spec.position == 'rope' else 'ALiBi'} "
            f"positions would run"]


def estimate_training(spec: ModelSpec, layout: Layout, cluster: Cluster, *, seq_len: int, global_batch: int | None = None,
                      microbatches: int | None = None, precision: str = "bf16-mixed", optimizer: str = "adamw",
                      tokens: float | None = None, flash_attention: bool = True, dropout: bool = False,
                      framework=None, dp_overlap: bool | None = None, grad_reduce_bytes: int | None = None,
                      compile: bool | None = None, attention_kernel: str | None = None, fused_loss: bool | None = None,
                      overheads: Overheads = Overheads(), recipe=None, tp_comm_overlap: bool = False,
                      moe=None) -> TrainingEstimate:
    """Estimate one layout. ``global_batch`` (sequences per step) or ``microbatches`` sets the batch.

    ``framework``: a Framework profile (default: the catalog's megatron-lm); ``dp_overlap``, ``grad_reduce_bytes`` and
    ``compile`` override its mechanisms when not None; ``recipe``: FP8/offload/LoRA (memory/recipe.py); ``moe``: a
    MoE model's dispatcher, all-to-all overlap and routing imbalance (comm/moe_dispatch.py)."""
    validate(layout, spec, cluster.num_gpus, seq_len)
    if framework is None:
        from shardlab.catalog import get_catalog

        framework = get_catalog().framework(DEFAULT_FRAMEWORK)
    notes: list[str] = positions_notes(spec, seq_len)
    why = framework.refusal(layout, spec)
    if why:   # a what-if stays answerable; `plan` only searches what the framework runs, `export` refuses
        notes.append(f"{why} (priced as asked, with {framework.id}'s mechanisms)")
    per_mb = layout.micro_batch * layout.dp
    if global_batch is None:
        global_batch = microbatches * per_mb if microbatches else default_global_batch(seq_len, layout)
        if microbatches is None:
            notes.append(f"{field_name('workload.global_batch')} not given: assumed {global_batch} sequences, about "
                         f"{TOKENS_PER_STEP // 2**20}M tokens per step as plan assumes ({global_batch // per_mb} "
                         "micro-batches per step)")
    if global_batch % per_mb:
        raise ShardlabError(f"{field_name('workload.global_batch')} {global_batch} is not divisible by micro-batch × "
                            "dp = "
                            f"{layout.micro_batch}×{layout.dp} = {per_mb}; choose a multiple of {per_mb}")
    m = global_batch // per_mb
    if microbatches is not None and microbatches != m:
        raise ShardlabError(f"{field_name('workload.microbatches')} {microbatches} disagrees with "
                            f"{field_name('workload.global_batch')} {global_batch} / "
                            f"(micro-batch × dp = {per_mb}) = {m}; give one of them")
    if layout.schedule == "interleaved" and layout.pp > 1 and m % layout.pp:
        raise ShardlabError(f"the interleaved schedule needs the micro-batch count ({m}) to be a multiple of "
                            f"{field_name('layout.pp')} {layout.pp}")
    wl = workload_for(framework, seq_len=seq_len, global_batch=global_batch, precision=precision, optimizer=optimizer,
                      flash_attention=flash_attention, dropout=dropout, dp_overlap=dp_overlap,
                      grad_reduce_bytes=grad_reduce_bytes, compile=compile, attention_kernel=attention_kernel,
                      fused_loss=fused_loss, recipe=recipe, tp_comm_overlap=tp_comm_overlap, moe=moe)
    if tp_comm_overlap and (layout.tp == 1 or not layout.sequence_parallel):
        notes.append(f"{field_name('workload.tp_comm_overlap')} overlaps the sequence-parallel all-gathers and "
                     f"reduce-scatters of TP > 1 ({field_name('layout.sequence_parallel')}; Megatron-Core asserts it): "
                     "not applied to this layout")
    check_overlap_modules(wl.moe, layout.recompute_modules)
    notes += moe_notes(wl.moe, layout, spec, precision)
    notes += idle_flag_notes(framework, layout, wl, compile)
    if wl.layer_host_s and layout.zero < wl.layer_host_min_zero:
        notes.append(f"no host stall per block: {framework.id}'s {1e3 * wl.layer_host_s:.2g} ms per block and pass is "
                     f"FSDP's per-unit work around units gathered every micro-batch (unshard, reshard, reduce-scatter "
                     f"hooks), priced at ZeRO stage {wl.layer_host_min_zero} or above; under ZeRO-{layout.zero} the "
                     "host's work is queued ahead of the GPU")
    r = evaluate(spec, cluster, wl, layouts_to_arrays([layout]), overheads, stage_layers=layout.stage_layers,
                 recompute_modules=layout.recompute_modules)
    mem = workload_memory(layout, spec, cluster.accelerator, wl, m, overheads)
    if matmul_curve(cluster.accelerator)[1]:
        notes.append(f"{cluster.accelerator.id} has no fitted matmul efficiency: using the default curve (estimate)")
    val = lambda k: float(r[k][0])
    return TrainingEstimate(
        model=spec, layout=layout, cluster=cluster, workload=wl, microbatches=m, step_time_s=val("step_time_s"),
        breakdown={k: val(k) for k in BREAKDOWN_KEYS}, tokens_per_s=val("tokens_per_s"),
        model_tflops_per_gpu=val("model_tflops_per_gpu"), hardware_tflops_per_gpu=val("hardware_tflops_per_gpu"),
        mfu=val("mfu"), hfu=val("hfu"), memory=mem, slowest_stage=int(r["slowest_stage"][0]),
        dp_comm_total_s=val("dp_comm_total_s"), tokens=tokens, notes=notes, dp_window_s=val("dp_window_s"),
        comm_total_s={"tp_comm_s": val("tp_comm_total_s"), "cp_comm_s": val("cp_comm_total_s"), "ep_comm_s": val("ep_comm_total_s"),
                      "pp_p2p_s": val("pp_p2p_s"), "zero3_comm_s": val("zero3_comm_total_s"),
                      "dp_comm_s": val("dp_comm_total_s")})


def idle_flag_notes(framework, layout, wl, compile) -> list[str]:
    """Settings given that change nothing for this layout and framework: said, not silently ignored."""
    out = []
    if layout.recompute == "none" and layout.recompute_fraction != 1.0:
        out.append(f"{field_name('layout.recompute_fraction')} {layout.recompute_fraction:g} has no effect without "
                   f"recomputation ({field_name('layout.recompute')} full, selective or op)")
    if layout.zero < 3 and layout.wrap != 1:
        out.append(f"{field_name('layout.wrap')} sets ZeRO-3/FSDP units; under ZeRO-{layout.zero} it has no effect")
    fp8 = getattr(wl.recipe, "fp8", None)
    if fp8 is not None and getattr(fp8, "all_gather", False) and not getattr(fp8, "primary_weights", False) \
            and layout.zero < 3:
        out.append(f"the FP8 all-gather applies to ZeRO-3's parameter gathers; under ZeRO-{layout.zero} it has no effect")
    if compile and framework.kernels_for(True) != "compiled":
        out.append(f"{framework.id} runs its own {framework.kernels} kernels: compilation is not priced "
                   f"({'it does not compile blocks' if not framework.compiles else 'already compiled'})")
    return out
