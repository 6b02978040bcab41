"""Every bound on input size in one place, each with the reason it is where it is.

shardlab refuses input past these bounds (one line, exit code 2) instead of computing for minutes, filling
memory or printing an overflowed number. Each bound sits far above any real job (the reason says how far)
and low enough that the work it allows finishes in well under a second; benchmarks/fuzz_cli.py measures
the slowest calls.
"""

from __future__ import annotations

# ---- counts --------------------------------------------------------------------------------------
MAX_GPUS = 2**20
"""1,048,576 GPUs: about five times the largest cluster announced so far (xAI's Colossus, 200k GPUs in
2025). Bounds --gpus, --nodes × GPUs per node, world sizes and every parallel degree; divisor listing and
the planner's search stay fast below it."""

MAX_RANK_MAP = 32_768
"""GPUs up to which a plan's document lists every rank (the report's rank map): one row per rank, so a
million-GPU plan would write a 100 MB document; larger plans leave the per-rank detail out."""

MAX_GPUS_PER_NODE = 1024
"""GPUs in one scale-up domain: NVIDIA's GB200 NVL72 rack is 72, the NVLink Switch System tops out at 576."""

MAX_RANKS_PER_NODE = 1024
"""Processes a launcher starts on one machine (``run --nproc``, ``bench --nproc``): one per GPU or core;
1,024 covers the largest CPU servers and keeps one machine from being flooded with processes by a typo."""

MAX_SEQ_LEN = 2**24
"""16,777,216 tokens per sequence: longer than the longest published context window (10M, Llama 4 Scout)."""

MAX_BATCH = 2**24
"""Sequences per step or per micro-batch: 16.8M, thousands of times the 2,048-16,384 of frontier runs."""

MAX_MICROBATCHES = 2**20
"""Micro-batches per step: a million, far past the 4p-8p a pipeline needs (bubble (p−1)/(m+p−1) < 0.1% there)."""

MAX_TOKENS = 1e16
"""Training tokens: 10 quadrillion, about 600 times Llama 3's 15.6T."""

MAX_PARAMS = 1e15
"""Parameters: a quadrillion, about 500 times the largest published models (~2T)."""

MAX_BYTES = 2**60
"""Message and memory sizes: 1 EiB; stays exact in float arithmetic and far above any collective or GPU."""

MAX_MODEL_DIM = 2**24
"""Any one model dimension (width, heads, vocabulary, layers, experts): 16.8M, far past real models
(hidden sizes to ~2^15, vocabularies to ~2^18, layers to ~10^2-10^3)."""

MAX_LAYERS = 10_000
"""Transformer blocks: about 80 times the deepest published model (Llama 3.1 405B: 126); per-layer tables stay small."""

MAX_INT = 2**53
"""Any other whole number: the largest integer a float64 holds exactly (counts meet float arithmetic)."""

# ---- money and time ------------------------------------------------------------------------------
MAX_HOURS = 100_000.0
"""Hours of one run or set-up: 11.4 years; training runs take days to months."""

MAX_USD = 1e12
"""Dollars in one budget or ceiling: a trillion, above any compute budget ever announced."""

MAX_PRICE_USD_PER_GPU_HOUR = 10_000.0
"""USD per GPU-hour: cloud GPUs rent for $0.2-$15/h; a thousand times more is a typo."""

MAX_SECONDS = 1e9
"""Any duration in seconds (pipeline pass times, timeouts, grace periods): 31 years."""

MAX_TIMEOUT_S = 7 * 86400.0
"""Launcher timeouts and benchmark times: a week; shardlab's own runs take seconds to minutes."""

MAX_FLOAT = 1e15
"""Any other positive number (factors, rates): finite and far from float overflow when multiplied."""

MIN_HOURS = 1e-6
"""The shortest time in hours (3.6 ms); anything positive below is refused (dividing by 5e-324 overflows)."""

MIN_USD = 1e-6
"""The smallest positive amount of money or price, a ten-thousandth of a cent."""

MIN_SECONDS = 1e-9
"""The shortest positive duration: a nanosecond (pipeline pass and transfer times)."""

MIN_TIMEOUT_S = 1e-6
"""The shortest timeout or measuring time: a microsecond."""

MIN_SHARE = 1e-6
"""The smallest positive share or factor (efficiencies, bubble bounds, slowdowns): below it times overflow."""

MAX_SIM_REQUESTS = 10_000
"""Requests the serving simulation plays for its percentiles (default 100-1,200): its work grows with them (about
0.25 ms per request, 0.5 ms under a closed loop of thousands of clients), so 10,000 take 2-5 s; a p99 needs a few
hundred."""

# ---- pipeline simulation -------------------------------------------------------------------------
MAX_PIPELINE_PASSES = 400_000
"""Passes (forward, backward, weight-gradient) in one simulated step: the event simulation costs about 1 µs
per pass on one core (plus numpy arrays of 10 numbers per pass), so 400k passes take about half a second
and 30 MB. Larger steps are refused with their closed-form bubble (``pipeline.closed_form``) in the message."""

MAX_COST_WORLDS = 24
"""World sizes `plan --objective cost` tries (it also searches fewer GPUs than given: whole nodes, or divisors of
one node). Power-of-two clusters up to 2^20 GPUs and 3 × 2^k ones up to 12,288 have at most 24 such sizes; a highly
composite count (55,440 or 720,720 GPUs) has 50-100, each a full search of up to a second. Past 24 the full count
and 23 sizes spread evenly on a log scale are searched."""

MAX_PLOTTED_PASSES = 20_000
"""Passes ``pipeline --plot`` draws, one box each: 20k boxes take about 3 s and a 4 MB SVG, and are already far
past what a reader can tell apart (a plot of 8 stages × 32 micro-batches has 512)."""

MAX_PIPELINE_STAGES = 1024
"""Pipeline ranks p: real pipelines use 2-128 stages (one per few layers); the timeline table has two lines a stage."""

# ---- files ---------------------------------------------------------------------------------------
MAX_FILE_BYTES = 2**20
"""Config, catalog, profile and benchmark files: 1 MiB. A Hugging Face config.json is a few KB, the whole
built-in catalog 60 KB; a larger file is the wrong file (a checkpoint, a log)."""

MAX_LOG_BYTES = 64 * 2**20
"""Log files `shardlab logs` reads: 64 MiB; the start-up lines it looks for are in the first few thousand."""

MAX_LOG_LINES = 500_000
"""Non-blank lines `shardlab logs` reads: NCCL_DEBUG=INFO prints about 50 start-up lines per rank, so this covers
the start-up of a 10,000-GPU job; an NCCL line costs about 16 µs to parse (a few regular expressions and the ring
hop it names), so the largest accepted log takes about 8 s. Cut longer logs to their start-up part."""

MAX_NESTING = 64
"""Nesting depth of a YAML/JSON document: real configs nest 2-4 levels; parsers recurse per level (30,000
levels crashed the YAML parser), so deeper input is refused before parsing."""

MAX_NAME_BYTES = 255
"""Bytes in one path component (Linux NAME_MAX)."""

MAX_PATH_BYTES = 4096
"""Bytes in a whole path (Linux PATH_MAX)."""

# ---- budgets -------------------------------------------------------------------------------------
MAX_BUDGET_DEPTH = 8
"""Levels of nested budgets (a lab inside a course inside a department...): a reservation checks every
ancestor in one transaction."""

# ---- fits, lists and maps ----------------------------------------------------------------------------
MAX_FIT_RUNS = 50
"""Measured runs one ``calibrate --from-run`` fits, over all its files. Each distinct run costs four estimates, 10-40 ms
on one core (a pipelined, interleaved 405B layout is the slow end), so 50 runs take at most about 2 s; a calibration
sweep is a few to a few dozen real training jobs, each minutes long. A 1 MB file holds about 9,000 small runs, which
took minutes; more runs than this are refused before any estimate."""

MAX_FIT_BLOCKS = 3_000
"""Transformer blocks a fit prices: the model's layers summed over the distinct runs. An estimate walks every block
(0.1-0.2 ms each, four estimates a run), so a run of a 10,000-layer model file alone took 3.6 s and 50 of them three
minutes; 3,000 blocks cost 1-2 s. shardlab's runtime trains small GPTs (tiny: 4 layers), so 50 runs of a 32-layer
model (1,600 blocks) still fit."""

MAX_LINKS = 16
"""Links one --link/--compare list may name: the catalog holds about twenty, and a table or plot of more is unreadable."""

MAX_MAP_GPUS = 1024
"""GPUs the 3d-layout map lists (one row each, and every TP/DP/PP group): a teaching grid, readable to about a
thousand rows; a million-GPU map took over 30 s and a gigabyte."""
