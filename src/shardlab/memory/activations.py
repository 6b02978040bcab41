"""Activation memory of transformer blocks, per micro-batch, and how many micro-batches are in flight.

Source: Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
arXiv 2205.05198, §4 and Table 2. For a GPT block (LayerNorm, GELU MLP of 4h, dropout, fp16/bf16) the
bytes per layer are s·b·h·(34 + 5as/h); with tensor parallelism s·b·h·(10 + 24/t + 5as/(ht)); with
sequence parallelism everything divides by t; selective recomputation drops the 5as/h attention-score
terms; full recomputation keeps only the block input, 2·s·b·h.

We count each saved tensor by name so the same derivation covers other blocks:
- element size e (2 for bf16/fp16, 4 for fp32) and dropout masks of 1 byte;
- Llama-style blocks (RMSNorm, SwiGLU, no dropout): attention stores norm input, norm output (QKV input),
  Q, K and V (GQA: K and V are kv_heads·head_dim wide), the attention output (out-proj input); SwiGLU stores
  its input, the gate and up outputs, SiLU(gate), and the product (down input) - four f-wide tensors;
- flash attention (Dao et al. 2022) stores no s×s matrix, only the fp32 log-sum-exp (4·a·s·b bytes);
- torch.compile'd blocks (``compiled``) keep only the matmul outputs of the MLP (min-cut rematerialisation);
- MoE layers store the router logits and probabilities (fp32, s·b·E each), the k dispatched copies of each
  token and the expert outputs (e·k·s·b·h each), and the experts' intermediates for k·s·b tokens;
- context parallelism splits the sequence: s becomes s/cp for every term (attention keys stay s long).
Norm statistics (mean/rstd, 4-8 bytes per token) are left out, as in Korthikanti's table.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardlab import xp
from shardlab.layout import Layout, expert_tp_of
from shardlab.specs.model import ModelSpec
from shardlab.specs.tensors import kv_heads_local, layer_linear_shapes


@dataclass(frozen=True)
class ActivationContext:
    """Workload settings that activation memory depends on."""

    seq_len: int
    """Full sequence length s (before context-parallel splitting); the micro-batch b is the layout's."""
    elem_bytes: int
    """Bytes per saved activation element (2 for bf16/fp16, 4 for fp32)."""
    flash_attention: bool = True
    """Attention kernel keeps no s×s score matrix (FlashAttention; PyTorch SDPA)."""
    dropout: bool = False
    """Dropout after attention, MLP and embedding (1-byte masks; GPT-3-era training used it)."""
    fused_loss: bool = False
    """The loss kernel works in place on the logits (flash-attn's cross_entropy, Megatron's fused vocab-parallel
    cross entropy): no fp32 copy or saved log-softmax of the (tokens × vocabulary) logits."""
    linear_input_bytes: float = 0
    """Bytes per element of the inputs linear layers save for their weight gradient: 1 under FP8 training (TE
    saves the FP8 cast, ``memory/fp8.py``); 0 means elem_bytes."""
    compiled: bool = False
    """torch.compile'd blocks: AOTAutograd's min-cut partitioner saves the inputs of each fused elementwise chain
    and recomputes its outputs in backward, so the MLP keeps only the tensors its matmuls produce (SwiGLU: gate and
    up, not SiLU(gate) or the product; GELU: its input, not its output). Source: H. He, "Min-cut optimal(*)
    recomputation (i.e. activation checkpointing) with AOTAutograd", dev-discuss.pytorch.org, 2022;
    torch/_functorch/partitioners.py (min_cut_rematerialization_partition)."""

    expert_imbalance: float = 1.0
    """The busiest expert-parallel rank's routed tokens over the mean (``comm.moe_dispatch.MoeDispatch``): with EP its
    dispatched copies, expert outputs and expert intermediates scale with it."""
    ep_overlap: bool = False
    """The MoE all-to-all overlap runs (Megatron-core's combined 1F1B): one more micro-batch (PP 1) or virtual chunk
    in flight (``overlap_extra_in_flight``)."""

    @property
    def lin_bytes(self) -> float:
        return self.linear_input_bytes or self.elem_bytes


def _local_kv_width(spec: ModelSpec, t) -> int:
    return kv_heads_local(spec.num_kv_heads, t) * spec.head_dim_


def _tsh(layout):
    """Divisor of tensors replicated across TP ranks: tp with sequence parallelism, else 1 (array-safe)."""
    return xp.where(layout.sequence_parallel, layout.tp, 1)


def layer_activation_bytes(spec: ModelSpec, layer: int, layout: Layout, ctx: ActivationContext) -> tuple[float, float]:
    """Bytes one layer saves for backward for one micro-batch, no recomputation.

    Returns (total, selective): ``selective`` is the part selective recomputation removes, the sum of
    ``recompute_parts`` over the layout's ``recompute_modules`` (by default the attention core: the scores, softmax
    and dropout of the s×s matrices, or flash attention's log-sum-exp). ``layout`` may carry numpy arrays (tp, cp,
    micro_batch, sequence_parallel) for many layouts at once.
    """
    total, parts = _layer_parts(spec, layer, layout, ctx)
    mods = getattr(layout, "recompute_modules", None) or ("core_attn",)
    if "moe" in mods:   # moe_act and shared_experts sit inside the MoE layer's checkpoint: nothing more to drop
        mods = tuple(m for m in mods if m not in ("moe_act", "shared_experts"))
    return total, sum(parts[m] for m in mods)


def recompute_parts(spec: ModelSpec, layer: int, layout: Layout, ctx: ActivationContext) -> dict:
    """What each Megatron-core recompute module (``layout.RECOMPUTE_MODULES``) removes from the bytes block
    ``layer`` saves for one micro-batch (0 where the block has no such module). Megatron-core
    (transformer_config.py, recompute_modules) discards the outputs of layernorm, moe_act and mla_up_proj and
    re-makes them from the inputs it keeps ('output-discarding checkpointing'); core_attn, mlp, moe and
    shared_experts checkpoint the whole submodule, keeping only its input, which the block keeps anyway (the
    norm's output, the residual stream). Its Transformer Engine spec fuses the pre-attention norm into the QKV GEMM
    and a dense block's pre-MLP norm into fc1, so 'layernorm' counts only MLA's input norm and a MoE block's pre-MLP
    norm (gpt_layer_specs.py)."""
    return _layer_parts(spec, layer, layout, ctx)[1]


def _layer_parts(spec: ModelSpec, layer: int, layout: Layout, ctx: ActivationContext) -> tuple:
    e, t = ctx.elem_bytes, layout.tp
    li = ctx.lin_bytes                            # saved linear inputs (1 byte under FP8)
    s_l = ctx.seq_len / layout.cp
    sb = s_l * layout.micro_batch
    tsh = _tsh(layout)  # divisor of tensors replicated across TP without SP
    mask = 1 if ctx.dropout else 0
    h = spec.hidden_size
    a_loc = spec.num_heads / t
    # norm inputs saved per block beyond the pre-norms: none for one shared norm (its output feeds both branches),
    # one per sublayer for the post-norms of sandwich blocks (Gemma 2/3)
    attn_norm_in, ffn_norm_in = {"shared": (1, 0), "sandwich": (2, 2)}.get(spec.block_norms, (1, 1))

    parts = dict.fromkeys(("core_attn", "layernorm", "moe_act", "mla_up_proj", "mlp", "moe", "shared_experts"), 0.0)
    # --- attention ---------------------------------------------------------------------------
    total = (attn_norm_in * e + li) * sb * h / tsh  # norm input(s) + norm output (= QKV input)
    # Megatron-core's Transformer Engine spec fuses the pre-attention norm into the QKV GEMM and a dense block's pre-MLP
    # norm into fc1 (gpt_layer_specs.py: IdentityOp), so 'layernorm' re-makes only the norms it keeps apart: MLA's
    # input norm and a MoE block's pre-MLP norm
    parts["layernorm"] = li * sb * h / tsh if spec.mla is not None else 0.0
    total += mask * sb * h / tsh                  # dropout mask after the output projection
    if spec.mla is None:
        total += e * sb * spec.q_size / t         # Q
        total += 2 * e * sb * _local_kv_width(spec, t)  # K, V
        total += li * sb * spec.q_size / t        # attention output = out-proj input
    else:
        m = spec.mla
        if m.q_lora_rank:
            total += 2 * e * sb * m.q_lora_rank   # q_a output, q_norm output (replicated, low rank)
        total += e * sb * (m.kv_lora_rank + m.qk_rope_head_dim) + e * sb * m.kv_lora_rank  # kv_a out, kv_norm out
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        total += e * sb * a_loc * (2 * qk + 2 * m.v_head_dim)  # Q, K, V, attention output
        parts["mla_up_proj"] = e * sb * a_loc * (2 * qk + m.v_head_dim)   # Q, K, V: the up-projections' outputs
    if ctx.flash_attention:
        scores = 4 * a_loc * sb                    # fp32 log-sum-exp per query row
    else:
        # softmax output e, plus with dropout its mask (1) and output (e); keys span the full sequence
        scores = (e + mask * (1 + e)) * a_loc * sb * ctx.seq_len
    total += scores
    parts["core_attn"] = scores

    # --- feed-forward ----------------------------------------------------------------------------
    total += (ffn_norm_in * e + (li if ffn_norm_in else 0)) * sb * h / tsh  # norm input + output (= MLP input)
    if spec.is_moe_layer(layer):   # a MoE block's pre-MLP norm output
        parts["layernorm"] = parts["layernorm"] + (li if ffn_norm_in else 0) * sb * h / tsh
    total += mask * sb * h / tsh                  # dropout mask after the MLP
    # f-wide tensors saved per token: SwiGLU gate, up, silu(gate) and the product (= down input); GELU its input
    # and output (= down input). The down projection's input is a linear input (FP8 under fp8-mixed).
    inter = (3 * e + li) if spec.mlp == "swiglu" else (e + li)
    if ctx.compiled:   # the elementwise outputs (SiLU(gate)·up, GELU(x)) are recomputed from the matmul outputs
        inter = 2 * e if spec.mlp == "swiglu" else e
    # the activation's outputs (SwiGLU: silu(gate) and the product; GELU: its output), which moe_act re-makes
    act_out = (e + li) if spec.mlp == "swiglu" else li
    if ctx.compiled:
        act_out = 0
    if spec.is_moe_layer(layer):
        moe = spec.moe
        k, fe = moe.top_k, moe.expert_ffn_hidden_size
        f = xp.where(layout.ep > 1, ctx.expert_imbalance, 1.0)   # the busiest EP rank's share of the copies
        routed = 2 * 4 * sb * moe.num_experts      # router logits and probabilities, fp32
        # with experts split over fewer ranks than TP (etp < tp), a rank keeps the copies of its etp-rank share of
        # the TP group's tokens, not of all of them (layout.expert_grid)
        routed += f * (li + e) * k * sb * h * expert_tp_of(t, layout.etp) / t   # dispatched copies, expert outputs
        routed += f * inter * k * sb * fe / t      # expert intermediates for k·s·b tokens
        total += routed
        parts["moe_act"] = f * act_out * k * sb * fe / t
        if moe.shared_width:
            shared = inter * sb * moe.shared_width / t
            total += shared
            parts["shared_experts"] = shared
        parts["moe"] = routed + parts["shared_experts"]
    else:
        parts["mlp"] = inter * sb * spec.ffn_hidden_size / t
        total += parts["mlp"]
    return total, parts


def op_saved_bytes(spec: ModelSpec, layer: int, layout: Layout, ctx: ActivationContext):
    """Bytes one layer keeps under torchtitan's per-operator selective checkpointing (recompute='op').

    torchtitan's policy (torchtitan/models/llama3/infra/parallelize.py, ``_save_list``) saves the outputs of the
    attention kernel and of every other matmul (the 1st, 3rd, ... in forward order) and recomputes everything
    else in backward; the block input is kept as the checkpoint's input. For a Llama block: x, Q, V, the attention
    output (+ its fp32 log-sum-exp), the gate projection and the down projection outputs.
    """
    e = ctx.elem_bytes
    sb = ctx.seq_len / layout.cp * layout.micro_batch
    kept = layer_input_bytes(spec, layout, ctx)
    kept = kept + e * sb * spec.q_size / layout.tp + 4 * spec.num_heads / layout.tp * sb   # attention output, LSE
    for i, (n_out, _n_in, tokens_share) in enumerate(layer_linear_shapes(spec, layer, layout.tp, layout.ep)):
        if i % 2 == 0:
            kept = kept + e * sb * tokens_share * n_out
    return kept


def overlap_extra_in_flight(layout):
    """Whole-stage micro-batches the MoE all-to-all overlap adds in flight where it runs: Megatron-core's combined
    1F1B runs one micro-batch's forward beside another's backward, one more micro-batch without a pipeline
    (combined_1f1b_schedule_for_no_pipelining) and one more virtual chunk in the interleaved warm-up (schedules.py).
    Array-safe."""
    return xp.where(layout.pp > 1, 1.0 / xp.maximum(layout.vpp, 1), 1.0)


def layer_input_bytes(spec: ModelSpec, layout: Layout, ctx: ActivationContext) -> float:
    """The block input kept per layer under full recomputation: e·s·b·h (÷ t with sequence parallelism)."""
    return ctx.elem_bytes * ctx.seq_len / layout.cp * layout.micro_batch * spec.hidden_size / _tsh(layout)


def in_flight(layout: Layout, stage: int, microbatches: int) -> float:
    """Micro-batches whose activations pipeline rank ``stage`` holds at its peak (whole-stage equivalents).

    - no pipeline: 1 (gradient accumulation runs micro-batches one after another);
    - GPipe: all m forward passes precede the backward passes (Huang et al. 2019);
    - 1F1B and ZB-H1: stage i holds min(p − i, m) (Narayanan et al. 2021 §2.2; Qi et al. 2024 keep 1F1B's memory);
    - interleaved with v chunks: rank i holds min(2(p − i − 1) + (v − 1)p + 1, m·v) chunk activations of 1/v of its
      layers each (Megatron-LM's warm-up count), i.e. p(1 + (p − 1)/(p·v)) on the first rank (Korthikanti §4.3).
    ``microbatches`` may be a numpy array (the layout's pp, vpp and schedule are scalars).
    """
    p, m = layout.pp, microbatches
    if p == 1:
        return m * 0 + 1.0
    if layout.schedule == "gpipe":
        return m * 1.0
    if layout.schedule == "interleaved" and layout.vpp > 1:
        v = layout.vpp
        return xp.minimum(2 * (p - stage - 1) + (v - 1) * p + 1, m * v) / v
    return xp.minimum(p - stage, m) * 1.0
