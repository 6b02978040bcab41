"""A saved serving plan's load and targets ([serve] arrival_rate, concurrency, ttft_slo, tpot_slo, slo_percentile,
target_rate: ``export.shardlab.LOAD_KEYS``) as the flags of the command that reads the file (``from_file``)."""

from __future__ import annotations


def apply_load(args, f: dict, parser) -> None:
    """A serving file's load and targets (``export.shardlab.LOAD_KEYS``, the plan's), for ``estimate`` and ``plan``
    (other commands take neither), where nothing of the kind is given beside the file:

    - the targets (--ttft-slo, --tpot-slo), and the layout is priced or searched under load (--serve);
    - ``estimate``: the file's load as the one replica it prices sees it (requests/s over all replicas split
      evenly; clients as a balancer deals them, ⌈C/n⌉ to the busiest replicas, which it prices; a disaggregated
      job's two pools take the load whole); given --slo-percentile, the layout's capacity under the targets instead;
    - ``plan``: a closed loop of clients again; a --target-rate plan's rate as --target-rate again (the fewest GPUs,
      up to the file's); requests/s only without targets (with them, the plan searches the capacity again: the
      file's rate is that capacity, or a load the search then finds the room for)."""
    from shardlab.errors import ShardlabError
    from shardlab.export.shardlab import LOAD_KEYS

    load = {k: f.pop(k) for k in LOAD_KEYS if k in f}
    command = parser.prog.split()[1:]
    if load and "max_num_seqs" not in f and "prompt_len" not in f:
        raise ShardlabError(f"{args.from_file} is a training job: [serve] {', '.join(load)} describe(s) a serving "
                            f"plan's load; drop them (a serving job file comes from `shardlab plan --inference`)")
    if load and command == ["export"]:          # a job file written again carries them on (export.job.ServeLoad)
        from shardlab.export.job import ServeLoad

        args.file_load = ServeLoad(load.get("arrival_rate"), load.get("concurrency"), load.get("ttft_slo"),
                                   load.get("tpot_slo"), load.get("slo_percentile"), load.get("target_rate"))
    if not load or command not in (["estimate"], ["plan"]):
        return
    if "arrival_rate" in load and "concurrency" in load:
        raise ShardlabError(f"{args.from_file}: [serve] gives both arrival_rate and concurrency; keep one (one load: "
                            f"Poisson requests/s, or a closed loop of clients)")
    rate, clients = load.get("arrival_rate", load.get("target_rate")), load.get("concurrency")
    given = any(getattr(args, k, None) is not None for k in ("concurrency", "arrival_rate", "slo_percentile",
                                                                  "target_rate"))
    for key in ("ttft_slo", "tpot_slo"):
        if key in load and getattr(args, key, None) is None:
            setattr(args, key, float(load[key]))
    targets = getattr(args, "ttft_slo", None) is not None or getattr(args, "tpot_slo", None) is not None
    if command == ["plan"]:
        if not any(getattr(args, k, None) is not None for k in ("concurrency", "arrival_rate", "target_rate")):
            if clients is not None:
                args.concurrency = int(clients)
            elif "target_rate" in load and targets:     # a --target-rate plan's question: the fewest GPUs again
                args.target_rate = float(load["target_rate"])
            elif rate is not None and not targets:
                args.arrival_rate = float(rate)
        if targets and args.concurrency is None and getattr(args, "slo_percentile", None) is None \
                and "slo_percentile" in load:           # searched under the file's statistic too
            args.slo_percentile = load["slo_percentile"]
    elif not given:
        split = 1 if "disaggregated" in f else max(1, int(f.get("replicas", 1) or 1))
        if rate is not None or clients is not None:   # the verdict in the file's statistic (serve_cmds.slo_verdict)
            args.verdict_percentile = load.get("slo_percentile")
        if rate is not None:
            args.arrival_rate = float(rate) / split
        elif clients is not None:              # a balancer gives each replica ⌊C/n⌋ or ⌈C/n⌉ clients: estimate
            args.concurrency = -(-clients // split)   # prices a busiest one, the totals add the others
            if clients % split:
                args.file_clients = (int(clients), split)
        elif "slo_percentile" in load:
            args.slo_percentile = load["slo_percentile"]
    if hasattr(args, "serve") and (targets or rate is not None or clients is not None):
        args.serve = True                          # the targets and the load are serving's: under load
