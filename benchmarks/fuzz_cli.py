"""The large fuzzing campaign: thousands of generated `shardlab` invocations over every command, in-process,
with the contract of tests/cli_fuzz.py checked on each (exit code 0/2/3, no traceback, one-line errors,
strict JSON, no nan/inf in the output, no hang), and a report: calls per command and exit code, findings
grouped by cause with one example each, and the time per call (median, 99th percentile, slowest).

Usage: OMP_NUM_THREADS=1 python benchmarks/fuzz_cli.py [N=5000] [--seed S] [--limit-s 60] [--slow-s 2]
       [--max-memory-gb 8]
Exit code 1 when anything was found.
"""

from __future__ import annotations

import argparse
import collections
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", nargs="?", type=int, default=5000, help="invocations (default 5000)")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: a new one, printed)")
    ap.add_argument("--limit-s", type=float, default=60.0, help="a call longer than this is a hang (default 60)")
    ap.add_argument("--slow-s", type=float, default=2.0, help="report calls longer than this (default 2)")
    ap.add_argument("--max-memory-gb", type=float, default=8.0,
                    help="address-space limit of this process, so that a runaway allocation is a finding (MemoryError), "
                         "not a machine out of memory (default 8)")
    a = ap.parse_args()
    import resource

    limit = int(a.max_memory_gb * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    from hypothesis import HealthCheck, Phase, given, seed, settings

    import cli_fuzz as F

    s = a.seed if a.seed is not None else random.randrange(2**32)
    tmp = Path(tempfile.mkdtemp(prefix="shardlab-fuzz-campaign-"))
    files = F.Files(tmp / "files")
    commands = F.discover()
    calls, found, examples, times = collections.Counter(), collections.Counter(), {}, collections.defaultdict(list)
    slow: list[tuple[float, list[str]]] = []
    reached = 0
    t_start = time.monotonic()

    @seed(s)
    @settings(max_examples=a.n, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(F.invocation(commands, files))
    def one(argv):
        nonlocal reached
        o = F.invoke(argv, a.limit_s)
        if sum(calls.values()) % 250 == 249:
            print(f"... {sum(calls.values()) + 1} calls, {sum(found.values())} findings", file=sys.stderr, flush=True)
        name = " ".join(argv[:2]) if argv[0] in ("comm", "run", "bench") else argv[0]
        calls[(name, "stub reached" if o.reached else f"exit {o.code}")] += 1
        reached += o.reached
        times[name].append(o.seconds)
        if o.seconds > a.slow_s:
            slow.append((o.seconds, argv))
        for p in F.check(o):
            key = F.cause(o, p)
            found[key] += 1
            examples.setdefault(key, (argv, p, (o.error or o.stderr)[-800:]))

    harness_error = None
    with F.environment(tmp):
        try:
            one()
        except Exception as e:                      # a bug of the generator, not of shardlab: report what ran
            harness_error = f"{type(e).__name__}: {e}"[:300]
    wall = time.monotonic() - t_start
    total = sum(calls.values())
    print(f"shardlab CLI fuzz campaign: {total} invocations over {len(commands)} commands in {wall:.0f} s "
          f"(seed {s}; files in {tmp})")
    if harness_error:
        print(f"THE GENERATOR STOPPED EARLY: {harness_error}")
    print(f"findings: {sum(found.values())} ({len(found)} distinct causes); hangs (> {a.limit_s:g} s): "
          f"{sum(v for k, v in found.items() if k.startswith('hang'))}; process/measurement stubs reached: {reached}")
    for key, n in found.most_common():
        argv, problem, detail = examples[key]
        print(f"\n  {n} x {key}\n    e.g. shardlab {' '.join(map(repr, argv))}\n    {problem}")
        print("    " + detail.strip().replace("\n", "\n    ")[-600:])
    print("\ncalls by command and outcome:")
    by_cmd = collections.defaultdict(dict)
    for (name, outcome), n in calls.items():
        by_cmd[name][outcome] = n
    for name in sorted(by_cmd):
        ts = sorted(times[name])
        p99 = ts[min(len(ts) - 1, int(0.99 * len(ts)))]
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(by_cmd[name].items()))
        print(f"  {name:<22} {len(ts):5d} calls ({outcomes}); time median {statistics.median(ts) * 1e3:.0f} ms, "
              f"p99 {p99 * 1e3:.0f} ms, max {ts[-1] * 1e3:.0f} ms")
    every = sorted(t for v in times.values() for t in v)
    print(f"\nall calls: median {statistics.median(every) * 1e3:.0f} ms, p99 {every[int(0.99 * (len(every) - 1))] * 1e3:.0f} ms, "
          f"max {every[-1]:.2f} s; {len(slow)} call(s) over {a.slow_s:g} s")
    for t, argv in sorted(slow, reverse=True)[:10]:
        print(f"  {t:.2f} s  shardlab {' '.join(map(repr, argv))[:200]}")
    return 1 if found or harness_error else 0


if __name__ == "__main__":
    raise SystemExit(main())
