"""Quiz questions generated from the model with random numbers.

Each generator draws numbers from a seeded ``random.Random``, computes the answer with the core's own function
(the same one ``shardlab explain`` and the other commands call) and takes the worked solution from that
topic's explanation, so a question, its answer and its solution can never disagree.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import asdict, dataclass

from shardlab.units import fmt_count

PASS_MARK = 0.70
"""Share of correct answers that passes (the course's "quiz ≥ 70%")."""


@dataclass(frozen=True)
class Question:
    """One question with its answer."""

    topic: str
    """The explain topic it exercises."""
    text: str
    """The question, with its numbers and the unit of the answer."""
    kind: str
    """'choice' (answer with a letter) or 'numeric'."""
    answer: float
    """The correct number, or the index of the correct choice."""
    choices: tuple[str, ...] = ()
    """Options of a choice question, in order (a, b, c, ...)."""
    unit: str = ""
    """Unit of a numeric answer."""
    tolerance: float = 0.0
    """Accepted absolute error of a numeric answer (0: exact)."""
    solution: tuple[str, ...] = ()
    """The worked solution, step by step."""
    command: str = ""
    """The shardlab command that shows the full derivation."""
    mistakes: tuple[tuple[float, str], ...] = ()
    """Known wrong answers, each (value, the mistake it comes from), computed by the same functions as the answer;
    a wrong answer within the tolerance of one is named (``quiz_run.check``)."""

    @property
    def answer_text(self) -> str:
        if self.kind == "choice":
            return f"{'abcdefgh'[int(self.answer)]}) {self.choices[int(self.answer)]}"
        return f"{_fmt(self.answer)} {self.unit}".strip()

    @property
    def tolerance_text(self) -> str:
        if self.kind == "choice":
            return "answer with a letter"
        return "exact" if self.tolerance == 0 else f"± {_fmt(self.tolerance)} {self.unit}".rstrip()

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(choices=list(self.choices), solution=list(self.solution), answer_text=self.answer_text,
                 tolerance_text=self.tolerance_text, mistakes=[{"value": v, "mistake": m} for v, m in self.mistakes])
        return d


def _fmt(x: float) -> str:
    if float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.4g}" if abs(x) >= 1 else f"{x:.4g}"


def _explained(topic: str, **values) -> tuple[tuple[str, ...], str]:
    """(derivation steps, the explain command) of ``topic`` with ``values``."""
    from shardlab.teach.registry import explain

    ex = explain(topic, **values)
    words = " ".join(f"{k}={v}" for k, v in values.items())
    return tuple(ex.derivation), f"shardlab explain {topic} {words}".strip()


def _choice(rng: random.Random, correct: str, others: list[str]) -> tuple[tuple[str, ...], int]:
    opts = [correct] + [o for o in others if o != correct]
    rng.shuffle(opts)
    return tuple(opts), opts.index(correct)


# ---- generators ---------------------------------------------------------------------------------------
def q_zero(rng: random.Random) -> Question:
    from shardlab.layout import Layout
    from shardlab.memory.precision import state_bytes
    from shardlab.memory.states import state_report_from_count

    n = rng.choice([7, 13, 30, 70]) * 10**9
    d, z = rng.choice([8, 16, 32, 64, 128]), rng.choice([1, 2, 3])
    def gb_at(stage: int) -> float:
        return state_report_from_count(n, Layout(dp=d, zero=stage), state_bytes("bf16-mixed", "adamw")).total / 1e9

    gb = gb_at(z)
    shards = {1: "optimizer states", 2: "gradients", 3: "weights"}
    mistakes = tuple((round(gb_at(k), 3), f"ZeRO-{k}'s figure: ZeRO-{z} also shards the "
                      + " and the ".join(shards[j] for j in range(k + 1, z + 1))) for k in range(z))
    mistakes += ((round(gb * 1e9 / 2**30, 3), "the same bytes in GiB (2^30), not GB (10^9)"),)
    sol, cmd = _explained("zero", params=n, gpus=d, stage=z)      # in GB (10^9 bytes), as the ZeRO paper and the solution
    return Question("zero", f"ZeRO-{z} on {d} GPUs for a {fmt_count(n)}-parameter model in bf16 mixed precision with AdamW: "
                            f"model-state memory per GPU, in GB (10^9 bytes)?", "numeric", round(gb, 3), unit="GB",
                    tolerance=round(0.02 * gb, 3), solution=sol, command=cmd, mistakes=mistakes)


def q_bubble(rng: random.Random) -> Question:
    from shardlab.pipeline.closed_form import bubble_fraction_closed_form

    p = rng.randint(2, 8)
    m = rng.randint(p, 4 * p)
    b = 100 * bubble_fraction_closed_form("1f1b", p, m)
    sol, cmd = _explained("pipeline-bubble", p=p, m=m)
    mistakes = ((round(100 * (p - 1) / m, 2), "(p−1)/m: the bubble over the ideal time, not its share of the whole step "
                                              "(p−1)/(m+p−1)"),)
    return Question("pipeline-bubble", f"1F1B with p = {p} stages and m = {m} micro-batches: what share of the step is the "
                                       f"bubble, in percent?", "numeric", round(b, 2), unit="%", tolerance=0.5,
                    solution=sol[:3], command=cmd, mistakes=mistakes)


def q_min_microbatches(rng: random.Random) -> Question:
    from shardlab.pipeline import min_microbatches

    p, x = rng.choice([4, 6, 8, 12, 16]), rng.choice([0.05, 0.10, 0.20])
    m = min_microbatches("1f1b", p, x)
    sol, cmd = _explained("pipeline-bubble", p=p, m=max(p, m), max_bubble=x)
    return Question("pipeline-bubble", f"1F1B with p = {p} stages: the fewest micro-batches per step that keep the bubble "
                                       f"at or below {100 * x:g}% of the step?", "numeric", m, unit="micro-batches",
                    solution=(sol[1], sol[3]), command=cmd)


def q_tp_collective(rng: random.Random) -> Question:
    from shardlab.shard.rules import block_collectives
    from shardlab.teach.topics._common import catalog

    kind, phase = rng.choice(["row", "column"]), rng.choice(["forward", "backward"])
    spec = catalog().model("llama-3.1-8b")
    ops = {c["op"] for c in block_collectives(spec, 2, seq_len=8, micro_batch=1, sequence_parallel=False)
           if c["phase"] == phase and f"{kind}-parallel" in c["where"]}
    correct = ops.pop() if ops else "none"
    opts, idx = _choice(rng, correct, ["all-reduce", "all-gather", "reduce-scatter", "none"])
    sol, cmd = _explained("tp-mlp")
    return Question("tp-mlp", f"Megatron tensor parallelism without sequence parallelism: which collective does a "
                              f"{kind}-parallel linear layer need in its {phase} pass?", "choice", idx, opts,
                    solution=(sol[0], sol[1], sol[-3]), command=cmd)


def q_bytes_per_param(rng: random.Random) -> Question:
    from shardlab.memory.precision import state_bytes
    from shardlab.teach.topics._common import OPTIMIZERS, PRECISIONS

    p, o = rng.choice(PRECISIONS), rng.choice(OPTIMIZERS)
    sb = state_bytes(p, o)
    sol, cmd = _explained("bytes-per-param", precision=p, optimizer=o)
    return Question("bytes-per-param", f"Training in {p} with {o}: bytes per parameter for weights + gradients + optimizer "
                                       f"state?", "numeric", sb.total, unit="bytes", solution=sol[:1], command=cmd)


def q_ring(rng: random.Random) -> Question:
    from shardlab.comm.collectives import collective_time
    from shardlab.teach.topics._common import catalog

    size = rng.choice([64, 256, 1024]) * 2**20
    n, lid = rng.choice([4, 8, 16]), rng.choice(["nvlink4", "ib-ndr", "pcie4"])
    ln = catalog().link(lid)
    ms = collective_time("all-reduce", size, n, ln, "ring").time_s * 1e3
    sol, cmd = _explained("ring-all-reduce", size=size, ranks=n, link=lid)
    plain = (ln.latency_us * 1e-6 + size / ln.bytes_per_s) * 1e3
    mistakes = ((round(plain, 3), "S/β: the message over the link once, the algorithm bandwidth; a ring all-reduce sends "
                                  "2(n−1)/n of it (the bus bandwidth factor) in 2(n−1) steps"),)
    return Question("ring-all-reduce", f"Ring all-reduce of {size // 2**20} MiB on {n} ranks over {lid} (α = {ln.latency_us:g} µs, "
                                       f"β = {ln.bytes_per_s / 1e9:.4g} GB/s achievable): time in milliseconds?",
                    "numeric", round(ms, 3), unit="ms", tolerance=round(0.05 * ms, 3), solution=sol[:2], command=cmd,
                    mistakes=mistakes)


def q_regime(rng: random.Random) -> Question:
    from shardlab.comm.inference import decode_step, prefill_step
    from shardlab.teach.topics._common import catalog

    cat = catalog()
    spec, phase, lid = cat.model("llama-2-7b"), rng.choice(["decode", "prefill"]), rng.choice(["nvlink4", "ethernet-10g"])
    kw = dict(tp=2, batch=1, accelerator=cat.accelerator("h100-sxm"), link=cat.link(lid))
    st = decode_step(spec, context_len=2048, **kw) if phase == "decode" else prefill_step(spec, prompt_len=2048, **kw)
    opts, idx = _choice(rng, f"{st.comm_regime}-bound", ["latency-bound", "bandwidth-bound"])
    sol, cmd = _explained("decode-vs-prefill", links=lid)
    return Question("decode-vs-prefill", f"Llama-2-7B with TP 2 over {lid}: is each TP all-reduce of a {phase} "
                                         f"{'step (batch 1)' if phase == 'decode' else 'of a 2048-token prompt'} "
                                         f"latency-bound or bandwidth-bound?", "choice", idx, opts,
                    solution=sol[1:4], command=cmd)


def q_kv(rng: random.Random) -> Question:
    from shardlab.memory.inference import kv_cache_bytes_per_token
    from shardlab.teach.topics._common import catalog

    mid, tp = rng.choice(["llama-2-7b", "llama-3.1-8b", "mistral-7b", "llama-2-13b"]), rng.choice([1, 2])
    spec = catalog().model(mid)
    kib = kv_cache_bytes_per_token(spec, tp)[0] / 1024
    sol, cmd = _explained("kv-cache", model=mid, tp=tp)
    mistakes = ((kib / 2, "K alone (or V alone): the cache holds both"),
                (kib * tp, "the whole model's cache: TP splits the KV heads over the GPUs") if tp > 1 else
                (kib * spec.num_heads / spec.num_kv_heads, "one KV head per query head: grouped-query attention shares "
                                                           "each KV head over a group"))
    return Question("kv-cache", f"{mid} in bf16 with TP {tp}: KV-cache bytes per token on one GPU, in KiB?", "numeric",
                    kib, unit="KiB", tolerance=round(0.01 * kib, 3), solution=sol[1:2], command=cmd,
                    mistakes=tuple(x for x in mistakes if abs(x[0] - kib) > 0.02 * kib))


def q_in_flight(rng: random.Random) -> Question:
    from shardlab.layout import Layout
    from shardlab.memory.activations import in_flight

    p = rng.randint(2, 8)
    m, sched, stage = rng.randint(p + 1, 4 * p), rng.choice(["gpipe", "1f1b"]), rng.randint(0, p - 1)
    n = in_flight(Layout(pp=p, schedule=sched), stage, m)
    sol, cmd = _explained("1f1b-memory", p=p, m=m)
    return Question("1f1b-memory", f"{'GPipe' if sched == 'gpipe' else '1F1B'} with p = {p} stages and m = {m} micro-batches: "
                                   f"how many micro-batches' activations does stage {stage} (0 = first) hold at its peak?",
                    "numeric", n, unit="micro-batches", solution=sol[:2], command=cmd)


def q_fp16(rng: random.Random) -> Question:
    from shardlab.numerics import FORMATS, classify

    g = rng.choice([1, 2, 5]) * 10.0 ** -rng.randint(4, 10)
    fmt = rng.choice(["fp16", "bf16"])
    cls = classify(g, FORMATS[fmt])
    names = {"zero": "it becomes 0 (underflow)", "subnormal": "a subnormal (kept, with fewer significant bits)",
             "normal": "a normal number"}
    opts, idx = _choice(rng, names[cls], list(names.values()))
    sol, cmd = _explained("bf16-vs-fp16", grad=g)
    return Question("bf16-vs-fp16", f"A gradient of {g:.0e} stored in {fmt}: what is it?", "choice", idx, opts,
                    solution=sol[:4], command=cmd)


def q_buckets(rng: random.Random) -> Question:
    from shardlab.comm.inventory import DDP_BUCKET_BYTES

    n = rng.choice([124, 350, 774, 1558, 3000]) * 10**6
    b = math.ceil(n * 2 / DDP_BUCKET_BYTES)
    mistakes = ((math.ceil(n * 4 / DDP_BUCKET_BYTES), "fp32 gradients (4 bytes each): the question's are bf16"),
                (math.ceil(n * 2 / (25 * 10**6)), "25 MB (10^6 bytes) buckets: PyTorch's are 25 MiB"))
    return Question("ddp-buckets", f"DDP with bf16 gradients for a {fmt_count(n)}-parameter model and PyTorch's default "
                                   f"25 MiB buckets: how many bucket all-reduces per step (ignore the small first bucket)?",
                    "numeric", b, unit="buckets",
                    solution=(f"gradient bytes = {fmt_count(n)} × 2 B = {2 * n:,} B",
                              f"buckets = ⌈{2 * n:,} / {DDP_BUCKET_BYTES:,}⌉ = {b} (25 MiB = {DDP_BUCKET_BYTES:,} B); "
                              f"fp32 gradients (Megatron-LM's default under bf16, as `shardlab explain ddp-buckets` "
                              f"shows) double the bytes and the buckets"),
                    command="shardlab explain ddp-buckets",
                    mistakes=tuple(x for x in mistakes if x[0] != b))


def q_interleaved(rng: random.Random) -> Question:
    from shardlab.pipeline.closed_form import bubble_fraction_closed_form

    p, v = rng.choice([2, 4, 8]), rng.choice([2, 4])
    m = p * rng.randint(1, 4)
    b = 100 * bubble_fraction_closed_form("interleaved", p, m, v)
    sol, cmd = _explained("interleaving", p=p, m=m, v=v)
    mistakes = ((round(100 * bubble_fraction_closed_form("1f1b", p, m), 2),
                 "plain 1F1B's bubble: interleaving v chunks divides the bubble time by v"),)
    return Question("interleaving", f"Interleaved 1F1B with p = {p}, m = {m} and v = {v} chunks per GPU: bubble as a share "
                                    f"of the step, in percent?", "numeric", round(b, 2), unit="%", tolerance=0.5,
                    solution=sol[1:2], command=cmd, mistakes=mistakes)


def q_heads(rng: random.Random) -> Question:
    from shardlab.shard.rules import valid_tp
    from shardlab.teach.topics._common import catalog

    mid = rng.choice(["llama-2-7b", "llama-3.1-70b", "qwen2.5-7b", "gpt2-xl", "mistral-7b"])
    spec = catalog().model(mid)
    ok = [t for t in valid_tp(spec) if t > 1]
    t = rng.choice(ok[:4])
    short = {"seq": spec.max_seq_len} if spec.max_seq_len < 4096 else {}     # the topic's default 4,096 tokens, or fewer
    sol, cmd = _explained("tp-attention", model=mid, tp=t, **short)
    return Question("tp-attention", f"{mid} ({spec.num_heads} attention heads) with TP {t}: how many whole query heads does "
                                    f"each GPU compute?", "numeric", spec.num_heads // t, unit="heads",
                    solution=sol[:1], command=cmd)


def q_cost(rng: random.Random) -> Question:
    from shardlab.cost.estimate import cost_estimate

    g, price = rng.choice([1, 2, 4, 8]), rng.choice([0.35, 0.79, 1.99, 2.49])
    h, s = rng.choice([1.0, 2.5, 4.0, 10.0]), rng.choice([0.25, 0.5, 1.0])
    usd = cost_estimate(g, h, price, s).usd
    sol, cmd = _explained("cost", gpus=g, price=price, hours=h, setup=s)
    mistakes = ((round(cost_estimate(g, h, price, 0).usd, 4), "the work alone: set-up time is paid too"),
                (round(cost_estimate(1, h, price, s).usd, 4), "one GPU's cost: the price is per GPU-hour") if g > 1 else
                (round(price * (h + s) * 8, 4), "an 8-GPU node's cost"))
    return Question("cost", f"{g} GPU(s) at ${price:g} per GPU-hour, {h:g} h of work plus {s:g} h of set-up: the cost in "
                            f"dollars?", "numeric", round(usd, 4), unit="USD", tolerance=0.01, solution=sol[:3], command=cmd,
                    mistakes=mistakes)


GENERATORS: dict[str, list[Callable[[random.Random], Question]]] = {
    "zero": [q_zero], "pipeline-bubble": [q_bubble, q_min_microbatches], "tp-mlp": [q_tp_collective],
    "bytes-per-param": [q_bytes_per_param], "ring-all-reduce": [q_ring], "decode-vs-prefill": [q_regime],
    "kv-cache": [q_kv], "1f1b-memory": [q_in_flight], "bf16-vs-fp16": [q_fp16], "ddp-buckets": [q_buckets],
    "interleaving": [q_interleaved], "tp-attention": [q_heads], "cost": [q_cost],
}
"""Question generators by topic."""


def make_quiz(n: int, seed: int, topics: list[str] | None = None) -> list[Question]:
    """``n`` questions drawn with ``seed``, cycling over the (chosen) topics in a shuffled order."""
    from shardlab.errors import ShardlabError, did_you_mean

    names = list(GENERATORS)
    for t in topics or []:
        if t not in GENERATORS:
            raise ShardlabError(f"no quiz questions on '{t}'{did_you_mean(t, names)}; quiz topics: {', '.join(names)}")
    pool = [g for t in (topics or names) for g in GENERATORS[t]]
    rng = random.Random(seed)
    order = pool[:]
    rng.shuffle(order)
    return [order[i % len(order)](rng) for i in range(n)]
