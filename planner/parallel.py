"""Per-rank ingest and analysis in parallel, reduced to job-level figures.

Each task loads the input of ONE rank (its trace files, or its folder), computes that
rank's metrics and time-oracle bounds, and returns only those small figures plus the
iteration spans; the reducer combines them. Whole traces never leave the worker.
Runs on a local process pool (`concurrent.futures`) by default, or on a Dask cluster
given its scheduler address (the `dask` extra); there the paths must be readable by
the Dask workers (a shared file system).
"""

from __future__ import annotations

import os
import resource
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from statistics import fmean
from typing import Any

from planner.errors import InputError

SCHEMA = "planner.ranks/1"

RankInput = Sequence[str | Path]
"""The files (or one folder) of one rank: e.g. a Kineto trace and its Execution Trace."""


def analyze_rank(paths: RankInput) -> dict[str, Any]:
    """One task: load one rank's input and return its small summary (or an error record).

    Errors are returned as ``{"error": [path, problem]}`` rather than raised, so they
    cross process and network boundaries intact.
    """
    from planner import analysis
    from planner.ingest import detect

    try:
        job = detect.load([Path(p) for p in paths])
        if len(job.graphs) != 1:
            raise InputError(
                paths[0], f"holds {len(job.graphs)} ranks ({', '.join(job.ranks)}); give one rank"
            )
        document = analysis.metrics(job)
    except InputError as exc:
        return {"error": [exc.path, exc.problem]}
    spans = job.trace.spans
    (rank,) = job.ranks
    graph = job.graphs[rank]
    t = job.trace.timings
    coll = t[t["op"].isin([n for n, op in graph.ops.items() if op.kind == "collective"])]
    return {
        "rank": rank,
        "framework": job.framework,
        "sources": list(job.sources),
        "ops": len(job.graphs[rank].ops),
        "steps": document["steps"],
        "summary": document["ranks"][0],
        "spans": {
            int(row.iteration): [int(row.start), int(row.end)]
            for row in spans.itertuples(index=False)
        },
        "collectives": [
            [int(i), str(o), int(a), int(d)]
            for i, o, a, d in zip(
                coll["iteration"], coll["op"], coll["start"], coll["duration"], strict=True
            )  # fmt: skip
        ],
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "pid": os.getpid(),
    }


def reduce_ranks(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Job-level figures from per-rank summaries; InputError for the first failed rank."""
    for result in results:
        if "error" in result:
            path, problem = result["error"]
            raise InputError(path, problem)
    by_rank: dict[str, dict[str, Any]] = {}
    for result in results:
        if result["rank"] in by_rank:
            raise InputError(
                result["sources"][0],
                f"rank {result['rank']!r} also comes from {by_rank[result['rank']]['sources'][0]}",
            )
        by_rank[result["rank"]] = result
    ranks = [by_rank[r] for r in sorted(by_rank)]
    frameworks = sorted({r["framework"] for r in ranks})
    if len(frameworks) > 1:
        raise InputError(ranks[0]["sources"][0], f"ranks mix frameworks ({', '.join(frameworks)})")
    common = sorted(set.intersection(*(set(r["spans"]) for r in ranks))) if ranks else []
    stragglers = _stragglers(ranks)
    iterations = []
    for number in common:
        lengths = [r["spans"][number][1] - r["spans"][number][0] for r in ranks]
        waited = stragglers.get(number)
        iterations.append(
            {
                "iteration": number,
                "duration": max(lengths) / 1e9,
                "straggler": waited["straggler_time"] if waited else 0.0,
                "slowest_rank": waited["slowest_rank"] if waited else None,
            }
        )
    efficiencies = [
        s["efficiency"] for r in ranks for s in r["steps"] if s["efficiency"] is not None
    ]
    return {
        "schema": SCHEMA,
        "framework": frameworks[0] if frameworks else None,
        "ranks": [
            {
                "rank": r["rank"],
                "sources": r["sources"],
                "ops": r["ops"],
                **{k: v for k, v in r["summary"].items() if k != "rank"},
            }
            for r in ranks
        ],
        "steps": [s for r in ranks for s in r["steps"]],
        "iterations": iterations,
        "job": {
            "ranks": len(ranks),
            "common_iterations": len(common),
            "mean_efficiency": fmean(efficiencies) if efficiencies else None,
            "min_efficiency": min(efficiencies) if efficiencies else None,
            "mean_iteration": fmean(i["duration"] for i in iterations) if iterations else None,
            "max_straggler": max((i["straggler"] for i in iterations), default=None),
        },
    }


def _stragglers(ranks: Sequence[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Step -> straggler figures from the ranks' collectives (`planner.waits`), the same
    definition `planner metrics` uses on a whole job."""
    import pandas as pd

    from planner import waits

    rows = pd.DataFrame(
        [[r["rank"], *c] for r in ranks for c in r.get("collectives", [])],
        columns=["rank", "iteration", "op", "start", "duration"],
    )
    if rows.empty:
        return {}
    rows["wait"] = waits.split_waits(rows)[0]
    return {int(s["iteration"]): s for s in waits.straggler_times(rows).to_dict("records")}


def analyze_ranks(
    rank_inputs: Sequence[RankInput],
    workers: int | None = None,
    dask_address: str | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Analyse every rank's input in parallel; (job document, per-worker resource records).

    `rank_inputs`: one entry per rank (its files, or its folder). `workers`: process pool
    size (default: CPU count; 1 runs in this process, no pool). `dask_address`: run the
    tasks on that Dask scheduler instead (``tcp://host:8786``; needs ``pip install
    planner[dask]``). Raises InputError for the first bad rank input.
    """
    tasks = [[str(p) for p in paths] for paths in rank_inputs]
    if not tasks:
        raise InputError(None, "no rank inputs given")
    if dask_address is not None:
        results = _on_dask(tasks, dask_address)
    elif workers == 1:
        results = [analyze_rank(t) for t in tasks]
    else:
        with ProcessPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
            results = list(pool.map(analyze_rank, tasks))
    usage = [
        {"rank": r.get("rank"), "pid": r.get("pid"), "peak_rss_mib": r.get("peak_rss_mib")}
        for r in results
        if "error" not in r
    ]
    return reduce_ranks(results), usage


def _on_dask(tasks: list[list[str]], address: str) -> list[dict[str, Any]]:
    try:
        from distributed import Client
    except ImportError:
        raise InputError(None, "--dask needs the dask extra: pip install 'planner[dask]'") from None
    try:
        client = Client(address, timeout="10s")
    except (OSError, TimeoutError) as exc:
        raise InputError(None, f"cannot reach the Dask scheduler at {address} ({exc})") from None
    with client:
        futures = client.map(analyze_rank, tasks, pure=False)
        return list(client.gather(futures))
