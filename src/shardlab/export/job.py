"""The document every exporter reads and every importer writes: one job (model, layout, workload, cluster), and the
results of an export (file text + what it could not express) and of an import (the job + what was understood/ignored).

Conventions shared by every target (the issue's round-trip contract): a field the target cannot express is named in
``Export.unsupported`` (field, value, why); an importer leaves such a field at shardlab's default and names it in
``Imported.assumed``. A layout the target cannot run at all raises :class:`Refused` (exit code 2, one line).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardlab.errors import ShardlabError
from shardlab.layout import Layout

LAYOUT_FIELDS = ("dp", "tp", "pp", "cp", "ep", "etp", "zero", "vpp", "micro_batch", "recompute", "sequence_parallel",
                 "schedule", "stage_layers")
JOB_FIELDS = ("model", "gpus", "seq_len", "global_batch", "precision") + LAYOUT_FIELDS
"""What a round trip compares (``job_fields``)."""


class Refused(ShardlabError):
    """The target framework cannot run this layout (the message says why and what to change)."""


DEFAULT_GPUS_PER_NODE = 8
"""GPUs per node a file that does not say otherwise reads back as (the catalog's H100 nodes)."""


@dataclass(frozen=True)
class Serve:
    """Inference settings of a serving job (``shardlab plan --inference`` / ``estimate --inference``)."""

    max_num_seqs: int
    """Concurrent sequences per replica (shardlab's --batch per replica; vLLM --max-num-seqs)."""
    prompt_len: int
    """Prompt tokens per request."""
    output_len: int
    """Generated tokens per request (max model length = prompt_len + output_len)."""
    replicas: int = 1
    """Independent TP×PP engines (vLLM --data-parallel-size)."""
    gpu_memory_utilization: float = 0.9
    """Fraction of GPU memory the engine may use (vLLM's default 0.9; shardlab.estimate.inference uses the same)."""
    kv_blocks: int | None = None
    """KV-cache blocks of 16 tokens per GPU that the plan predicts (vLLM logs its own as '# GPU blocks')."""
    kv_cache_dtype: str = "auto"
    """KV-cache element type (vLLM --kv-cache-dtype; auto = the model dtype)."""
    weights: str = "bf16"
    """Block weights as the plan serves them (shardlab --weights): fp8 is vLLM's --quantization fp8 of the bf16
    checkpoint; int4/int8 need a pre-quantized (AWQ/GPTQ) checkpoint the exporter cannot name."""
    group_size: int | None = None
    """Input features per scale group of int4/int8 weights (shardlab --group-size); None: the scheme's default."""
    activations: str | None = None
    """Type the GEMMs run in (shardlab --activations); None: the default for the weights and GPU."""
    weights_from_checkpoint: bool = False
    """The weights are the published checkpoint's own type (``ModelSpec.checkpoint_weights``): a job file leaves
    ``weights`` out, so reading it back prices the checkpoint as it ships, under that name."""
    ep: int = 1
    """Expert-parallel GPUs of a replica (``serving.moe``; 1: experts TP-sliced)."""
    dp_attention: int = 1
    """Data-parallel attention ranks of a replica (each of TP ``layout.tp``), sharing its ep GPUs' experts."""
    pools: "Pools | None" = None
    """Disaggregated prefill/decode (``serving.disagg``): the two pools; None: every replica runs both phases."""
    load: "ServeLoad | None" = None
    """The traffic and targets the plan chose this layout for (None: a static-batch plan)."""


@dataclass(frozen=True)
class ServeLoad:
    """The load and latency targets a serving plan was made under, so that ``estimate FILE`` prices the layout where
    the plan put it: the capacity a plan found within its SLOs, or the load it was given."""

    arrival_rate: float | None = None
    """Poisson requests/s over all the job's replicas (or its two pools): the plan's capacity, or --arrival-rate."""
    concurrency: int | None = None
    """Closed-loop clients over all replicas (--concurrency), where the plan was given that load."""
    ttft_slo_s: float | None = None
    """The plan's TTFT target (--ttft-slo)."""
    tpot_slo_s: float | None = None
    """The plan's TPOT target (--tpot-slo)."""
    slo_percentile: str | None = None
    """The statistic the targets bind ('p50' or 'p99'; --slo-percentile)."""
    target_rate: float | None = None
    """The request rate a plan was asked to serve on the fewest GPUs (--target-rate): ``plan FILE`` asks again, and
    ``arrival_rate`` is that rate."""


@dataclass(frozen=True)
class Pools:
    """A disaggregated job's two pools of whole replicas. The decode replicas are the job's layout (TP
    ``layout.tp`` × the MoE layout's attention ranks); the prefill replicas have their own TP."""

    prefill_gpus: int
    """GPUs of the prefill pool (a whole number of prefill replicas)."""
    decode_gpus: int
    """GPUs of the decode pool (a whole number of decode replicas)."""
    prefill_tp: int
    """TP of each prefill replica."""
    prefill_gpu: str | None = None
    """GPU kind of the prefill pool when it differs from the job's (its own nodes); None: the job's."""
    prefill_pp: int = 1
    """Pipeline stages of each prefill replica."""

    @property
    def label(self) -> str:
        """The pools as `--disaggregated` takes them: 'P:D'."""
        return f"{self.prefill_gpus}:{self.decode_gpus}"


@dataclass(frozen=True)
class LaunchJob:
    """A training or serving job as shardlab sees it: what exporters turn into framework files."""

    model: str
    """Catalog id (``shardlab models``)."""
    layout: Layout
    """Degrees and per-step choices (``shardlab.layout``)."""
    seq_len: int
    """Tokens per sequence."""
    global_batch: int
    """Sequences per optimizer step (= micro_batch × dp × microbatches)."""
    precision: str = "bf16-mixed"
    """fp32, bf16-mixed, fp16-mixed or bf16 (pure)."""
    optimizer: str = "adamw"
    """adamw, sgd or adam-8bit."""
    gpu: str = "h100-sxm"
    """Accelerator id (``shardlab gpus``)."""
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    """GPUs per node (sets nodes = gpus / gpus_per_node)."""
    framework: str | None = None
    """Framework id (megatron-lm, deepspeed, pytorch-fsdp, torchtitan, vllm) the job runs on, if known."""
    grad_reduce_bytes: int | None = None
    """Bytes per reduced gradient element the estimate assumed (4: fp32, 2: bf16/fp16); None: the framework's default."""
    serve: Serve | None = None
    """Serving settings; None for training."""
    dropout: bool = False
    """Dropout in the blocks (GPT-3-era training, rate 0.1) as the estimate assumed; False: none (modern recipes)."""
    tp_comm_overlap: bool = False
    """TP/SP collectives pipelined with their GEMMs (Megatron-LM ``--tp-comm-overlap``) as the estimate assumed."""
    fp8_params: bool = False
    """FP8 primary weights (Megatron-LM ``--fp8-param-gather``) as the estimate assumed."""
    moe_dispatcher: str = "alltoall"
    """A MoE model's token dispatcher as the estimate assumed (``comm.moe_dispatch``)."""
    ep_comm_overlap: bool = False
    """The MoE all-to-all overlap (Megatron-LM ``--overlap-moe-expert-parallel-comm``) as the estimate assumed."""
    expert_imbalance: float = 1.0
    """The busiest expert-parallel rank's routed tokens over the mean, as the estimate assumed (not a launch flag)."""
    inter_node_gbit: float | None = None
    """The inter-node rate per node the estimate assumed (``--inter-node-gbit``), Gb/s; None: the catalog's link."""
    assumptions: tuple = ()
    """(key, value) pairs of the modelling switches the estimate assumed away from their defaults (``ASSUMPTIONS``):
    flash_attention False, compile True, dp_overlap False, attention_kernel, fused_loss. shardlab's job file carries
    them; a framework's file does not (its own code decides)."""
    notes: dict = field(default_factory=dict, compare=False, hash=False)
    """Estimates for comments (step_time_s, usd_per_hour, train_hours, usd, price_source); not part of the layout."""

    @property
    def gpus(self) -> int:
        if self.serve is not None and self.serve.pools is not None:
            return self.serve.pools.prefill_gpus + self.serve.pools.decode_gpus
        if self.serve is not None:
            return self.layout.tp * self.layout.pp * self.serve.dp_attention * self.serve.replicas
        return self.layout.world_size

    @property
    def nodes(self) -> int:
        return -(-self.gpus // self.gpus_per_node)

    @property
    def procs_per_node(self) -> int:
        return min(self.gpus, self.gpus_per_node)

    @property
    def microbatches(self) -> int:
        """Micro-batches per step per data-parallel rank (pipeline micro-batches or gradient-accumulation steps)."""
        return max(1, self.global_batch // (self.layout.micro_batch * self.layout.dp))


@dataclass(frozen=True)
class Unsupported:
    """One setting the target could not express."""

    setting: str
    """Layout/workload field (e.g. 'ep', 'recompute')."""
    value: object
    """shardlab's value that was not carried over."""
    why: str
    """What the target does instead, in one sentence."""

    def to_dict(self) -> dict:
        return {"setting": self.setting, "value": self.value, "why": self.why}

    def line(self) -> str:
        return f"{self.setting}={self.value}: {self.why}"


@dataclass(frozen=True)
class Export:
    """A rendered framework file."""

    target: str
    """Target id (torchtitan, megatron, deepspeed, accelerate, vllm, slurm, skypilot)."""
    kind: str
    """What the file is (e.g. 'job TOML')."""
    filename: str
    """Suggested file name."""
    text: str
    """The file's content."""
    checked_against: str
    """Framework and version whose own parser accepts this file (tests/test_export_real.py)."""
    unsupported: tuple[Unsupported, ...] = ()
    """Settings the target could not express."""
    launch: str = ""
    """How to start it (a command line), where the file alone does not say."""

    def to_dict(self) -> dict:
        return {"target": self.target, "kind": self.kind, "filename": self.filename,
                "checked_against": self.checked_against, "unsupported": [u.to_dict() for u in self.unsupported],
                "launch": self.launch}


@dataclass(frozen=True)
class Imported:
    """What an importer understood from a framework file."""

    source: str
    """Target id the file was read as."""
    fields: dict
    """Job fields read from the file (model, gpus, seq_len, global_batch, precision, layout fields, serve fields)."""
    understood: tuple[tuple[str, str], ...] = ()
    """(setting in the file, what it became in shardlab)."""
    ignored: tuple[str, ...] = ()
    """Settings in the file shardlab does not model (named so the user sees them)."""
    framework: str | None = None
    """Framework id the file belongs to."""

    def to_dict(self) -> dict:
        return {"source": self.source, "framework": self.framework, "fields": self.fields,
                "understood": [{"setting": a, "shardlab": b} for a, b in self.understood], "ignored": list(self.ignored)}


def job_fields(job: LaunchJob) -> dict:
    """The comparable fields of a job (what a round trip must give back)."""
    d = {"model": job.model, "gpus": job.gpus, "seq_len": job.seq_len, "global_batch": job.global_batch,
         "precision": job.precision}
    lay = job.layout.to_dict()
    d.update({k: lay[k] for k in LAYOUT_FIELDS})
    return d


RECIPE_WHY = {
    "lora_rank": "the file trains every weight; LoRA adapters (PEFT) are set up in the training script",
    "quantize_base": "the frozen NF4 base (QLoRA) is set up in the training script",
    "offload": "CPU/NVMe offload is not written; turn it on in the framework's own settings",
    "offload_device": "the offload device is not written; set it in the framework's own offload settings",
    "lora_targets": "the adapted layers are chosen in the training script's PEFT config (target_modules)",
}
"""The training recipe settings (shardlab.memory.recipe) that no exported file carries, and what to do instead."""


ASSUMPTIONS = ("flash_attention", "compile", "dp_overlap", "attention_kernel", "fused_loss")
"""Training workload switches a job file carries where they differ from the framework's default (``LaunchJob.assumptions``)."""


def assumptions_of(flash_attention=True, compile=None, dp_overlap=True, attention_kernel=None,
                   fused_loss=None) -> tuple:
    """``LaunchJob.assumptions`` from the estimate's switches: only those away from their defaults."""
    out = []
    if flash_attention is False:
        out.append(("flash_attention", False))
    if compile is not None:
        out.append(("compile", bool(compile)))
    if dp_overlap is False:
        out.append(("dp_overlap", False))
    if attention_kernel:
        out.append(("attention_kernel", str(attention_kernel)))
    if fused_loss is not None:
        out.append(("fused_loss", bool(fused_loss)))
    return tuple(out)


MEGATRON_ONLY = {
    "tp_comm_overlap": "TP communication overlap is written for Megatron-LM only (--tp-comm-overlap); torchtitan's "
                       "equivalent is parallelism.enable_async_tensor_parallel",
    "fp8_params": "FP8 primary weights are written for Megatron-LM only (--fp8-param-gather)",
    "ep_comm_overlap": "the MoE all-to-all overlap is written for Megatron-LM only "
                       "(--overlap-moe-expert-parallel-comm)",
}
"""Workload settings only the Megatron-LM export (and shardlab's own job file) carries, and what to do elsewhere."""


SERVING_NOT_CARRIED = {
    "speculative_tokens": "speculative decoding (--speculative-tokens, --draft, its acceptance) was priced but is not "
                          "written: add the engine's own setting (vLLM --speculative-config, SGLang --speculative-*, "
                          "TensorRT-LLM speculative_config) by hand",
    "two_batch_overlap": "two-batch overlap was priced but is not written: SGLang --enable-two-batch-overlap, vLLM "
                         "--enable-dbo",
    "redundant_experts": "redundant expert slots were priced but are not written: SGLang --ep-num-redundant-experts, "
                         "vLLM --enable-eplb with its num_redundant_experts",
    "chunked_prefill": "chunked prefill was forced on in the estimate; the file leaves the engine's default",
    "max_num_batched_tokens": "the token budget per step was set in the estimate; the file leaves the engine's default "
                              "(vLLM --max-num-batched-tokens, SGLang --chunked-prefill-size)",
    "scheduler_steps": "multi-step scheduling was set in the estimate; the file leaves the engine's default",
    "cuda_graph_max_batch": "the CUDA-graph capture size was set in the estimate; the file leaves the engine's default",
    "prefix_hit_rate": "a prefix-cache hit rate describes the traffic, not the engine: the file cannot carry it",
    "expert_imbalance": "the expert load imbalance describes the routing, not the engine: the file cannot carry it",
}
"""Serving flags the estimate prices that no launch file (nor shardlab's job file) carries: listed as not carried."""


ASSUMPTION_WHY = {
    "flash_attention": "the estimate priced attention without flash attention; the framework's own attention runs",
    "compile": "the estimate priced compiled blocks (torch.compile); the framework's own setting decides",
    "dp_overlap": "the estimate priced the gradient reduction after the backward; the framework overlaps as it does",
    "attention_kernel": "the estimate priced this attention kernel; the framework picks its own",
    "fused_loss": "the estimate priced this loss; the framework's own loss runs",
}
"""Why a framework's file does not carry a modelling switch of ``LaunchJob.assumptions`` (shardlab's job file does)."""
WRITTEN_ASSUMPTIONS = {("torchtitan", "compile")}
"""(target, switch) pairs a framework's file writes: torchtitan's [compile] enable."""


def recipe_unsupported(job: LaunchJob, target: str = "") -> tuple[Unsupported, ...]:
    """The job's recipe settings (``notes['recipe']``) as what the file could not express; for a target other than
    Megatron-LM or shardlab's job file, also the Megatron-only workload settings (``MEGATRON_ONLY``)."""
    out = tuple(Unsupported(k, v, RECIPE_WHY[k]) for k, v in (job.notes.get("recipe") or {}).items()
                if k in RECIPE_WHY and target != "shardlab")           # shardlab's job file writes the recipe
    out += tuple(Unsupported(k, v, SERVING_NOT_CARRIED[k]) for k, v in (job.notes.get("serving_not_carried") or {}).items()
                 if k in SERVING_NOT_CARRIED)
    load = job.serve.load if job.serve is not None else None
    if load is not None and target != "shardlab":     # shardlab's job file writes them ([serve], export.shardlab)
        what = {"arrival_rate": load.arrival_rate, "concurrency": load.concurrency, "ttft_slo": load.ttft_slo_s,
                "tpot_slo": load.tpot_slo_s, "slo_percentile": load.slo_percentile, "target_rate": load.target_rate}
        out += tuple(Unsupported(k, v, "the plan's load and latency targets describe the traffic, not the engine: "
                                       "the file cannot carry them (shardlab's job file does)")
                     for k, v in what.items() if v is not None)
    if target != "shardlab":
        out += tuple(Unsupported(k, v, ASSUMPTION_WHY[k]) for k, v in job.assumptions
                     if k in ASSUMPTION_WHY and (target, k) not in WRITTEN_ASSUMPTIONS)
    if target not in ("megatron", "shardlab"):
        out += tuple(Unsupported(k, True, why) for k, why in MEGATRON_ONLY.items() if getattr(job, k))
        if job.moe_dispatcher != "alltoall":
            out += (Unsupported("moe_dispatcher", job.moe_dispatcher, "DeepEP dispatch is written for Megatron-LM only "
                                "(--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep)"),)
    return out


def recipe_notes(offload, lora_rank, quantize_base, offload_device=None, lora_targets=None) -> dict:
    """``{'recipe': {...}}`` for the settings that differ from plain training, else {}: the offload device where it is
    not the default CPU and states are offloaded, the adapted layers where they are not all the linear ones."""
    offloaded = offload not in (None, "none")
    targets = list(lora_targets) if lora_rank and lora_targets and tuple(lora_targets) != ("all-linear",) else None
    r = {k: v for k, v in (("lora_rank", lora_rank), ("quantize_base", quantize_base), ("offload", offload),
                           ("offload_device", offload_device if offloaded and offload_device != "cpu" else None),
                           ("lora_targets", targets))
         if v not in (None, "none", 0)}
    return {"recipe": r} if r else {}


def header(job: LaunchJob, target: str, unsupported, inner: str | None = None) -> list[str]:
    """Comment lines (without the comment marker) opening every exported file."""
    from shardlab.serving.moe import replica_label

    lay = job.layout
    pools = job.serve.pools if job.serve else None
    what = (f"serve {job.model} disaggregated: a prefill pool of {pools.prefill_gpus} "
            f"{pools.prefill_gpu or job.gpu} GPUs (replicas of TP {pools.prefill_tp}"
            + (f" × PP {pools.prefill_pp}" if pools.prefill_pp > 1 else "") + ") and a decode pool of "
            f"{pools.decode_gpus} {job.gpu} GPUs (replicas of TP {lay.tp}" + (f" × PP {lay.pp}" if lay.pp > 1 else "")
            + (f" × {job.serve.dp_attention} attention ranks, EP {job.serve.ep}" if job.serve.dp_attention > 1 else
               f", EP {job.serve.ep}" if job.serve.ep > 1 else "") + "), the KV cache sent from one to the other"
            if pools else
            f"serve {job.model}: {job.serve.replicas} replica(s) of "
            + replica_label(lay.tp, lay.pp, job.serve.ep, job.serve.dp_attention) + f" on {job.gpu}"
            if job.serve else
            f"train {job.model} on {job.gpus} × {job.gpu} ({job.nodes} node(s) × {job.procs_per_node}): dp {lay.dp} × "
            f"tp {lay.tp} × pp {lay.pp} × cp {lay.cp}" + (f" (ep {lay.ep})" if lay.ep > 1 else "")
            + f", ZeRO-{lay.zero}, micro-batch {lay.micro_batch}, global batch {job.global_batch}, seq {job.seq_len}")
    out = [f"shardlab export --to {target}: {what}"]
    st, r = job.notes.get("step_time_s"), job.notes.get("retarget") or {}
    if st and "step_time_s" in r:
        fits = "" if r.get("fits", True) else "; as written it does not fit in GPU memory"
        out.append(f"predicted step time {st:.2f} s as {r['framework']} runs it (shardlab estimate; "
                   f"{r['scored_step_time_s']:.2f} s under {r['scored_for']}, the framework it was estimated with{fits}; "
                   f"an estimate, not a measurement)")
    elif st:
        scored = f" under {r['scored_for']}, not {r['framework']}" if r else ""
        out.append(f"predicted step time {st:.2f} s{scored} (shardlab estimate; an estimate, not a measurement)")
    for u in (*unsupported, *recipe_unsupported(job, inner or target)):   # a launcher: what its framework writes
        out.append(f"could not express {u.line()}")
    return out
