"""The end-to-end analyses the CLI offers, as functions returning JSON-ready dicts.

Every document carries ``"schema": "planner.<kind>/<version>"``; times are seconds,
sizes bytes. The CLI only renders these.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from planner import __version__
from planner.allreduce import allreduce_metrics
from planner.errors import InputError
from planner.graph import OpGraph
from planner.metrics import StepMetrics, bounds, speedup_bound, step_metrics, summarize
from planner.oracle import TimeOracle, min_of_runs
from planner.plan import Plan
from planner.schedule import tictac
from planner.trace import Job, with_dedicated

ALGORITHMS = ("tic", "tac")


def oracles(job: Job) -> dict[str, TimeOracle]:
    """The min-of-runs oracle of every rank (empty times where nothing was traced)."""
    frame = with_dedicated(job.trace, job.graphs)
    return {
        rank: min_of_runs(graph, frame[frame["rank"] == rank]) for rank, graph in job.graphs.items()
    }


def inspect(job: Job) -> dict[str, Any]:
    """What is in the input: devices, op counts by kind, transfers, steps, notes."""
    oracle = oracles(job) if len(job.trace.timings) else {}
    ranks = []
    for rank in job.ranks:
        graph = job.graphs[rank]
        times = oracle.get(rank)
        transfers = [
            {
                "name": name,
                "kind": graph.ops[name].kind,
                "resource": graph.ops[name].resource,
                "param": graph.ops[name].param,
                "nbytes": graph.ops[name].nbytes,
                "time": times.time(name) if times else None,
                "observed_in": times.observed_in.get(name, 0) if times else 0,
            }
            for name in graph.transfers
        ]
        ranks.append(
            {
                "rank": rank,
                "resources": graph.resources,
                "ops": len(graph),
                "edges": graph.dag.number_of_edges(),
                "ops_by_kind": dict(sorted(Counter(o.kind for o in graph.ops.values()).items())),
                "ops_by_type": dict(
                    Counter(o.type or o.kind for o in graph.ops.values()).most_common(10)
                ),
                "transfer_bytes": sum(t["nbytes"] for t in transfers),
                "iterations": job.trace.iterations(rank),
                "transfers": transfers,
            }
        )
    return {
        "schema": "planner.inspect/1",
        "framework": job.framework,
        "sources": list(job.sources),
        "notes": list(job.notes),
        "ranks": ranks,
    }


def schedule(job: Job, algorithm: str) -> dict[str, Plan]:
    """One plan per rank with TIC (graph only) or TAC (needs timings)."""
    if algorithm not in ALGORITHMS:
        raise InputError(None, f"unknown algorithm {algorithm!r} (choose from {ALGORITHMS})")
    if algorithm == "tic":
        return {rank: tictac.tic(graph, rank=rank) for rank, graph in job.graphs.items()}
    if not len(job.trace.timings):
        raise InputError(
            job.sources[0] if job.sources else None, "TAC needs timings; input has none"
        )
    oracle = oracles(job)
    return {
        rank: tictac.tac(graph, oracle[rank].times, rank=rank) for rank, graph in job.graphs.items()
    }


def plan_document(plans: Mapping[str, Plan], graphs: Mapping[str, OpGraph]) -> dict[str, Any]:
    """`planner.priorities/1`: per rank, every planned transfer with priority and order_index."""
    ranks = []
    for rank in sorted(plans):
        plan, graph = plans[rank], graphs[rank]
        index = plan.order_index()
        transfers = []
        for name in plan.order:
            op = graph.ops[name]
            entry: dict[str, Any] = {
                "name": name,
                "param": op.param,
                "resource": op.resource,
                "nbytes": op.nbytes,
                "priority": plan.priority[name],
                "order_index": index[name],
            }
            for prop, values in sorted(plan.properties.items()):
                if name in values:
                    value = float(values[name])
                    entry[prop] = value if value != float("inf") else None
            transfers.append(entry)
        ranks.append({"rank": rank, "algorithm": plan.algorithm, "transfers": transfers})
    return {"schema": "planner.priorities/1", "ranks": ranks}


def _step_dict(s: StepMetrics) -> dict[str, Any]:
    return {
        "rank": s.rank,
        "iteration": s.iteration,
        "makespan": s.makespan,
        "idle": s.idle,
        "busy_makespan": s.busy_makespan,
        "umax": s.umax,
        "lmin": s.lmin,
        "efficiency": s.efficiency,
        "speedup_bound": s.speedup_bound,
    }


def metrics(job: Job) -> dict[str, Any]:
    """`planner.metrics/1`: per-step figures, per-rank summaries and the oracle bounds."""
    if not len(job.trace.timings):
        raise InputError(
            job.sources[0] if job.sources else None, "metrics need timings; input has none"
        )
    frame = with_dedicated(job.trace, job.graphs)
    oracle = oracles(job)
    steps: list[dict[str, Any]] = []
    ranks: list[dict[str, Any]] = []
    for rank in job.ranks:
        graph = job.graphs[rank]
        of_rank = frame[frame["rank"] == rank]
        per_step = [
            step_metrics(graph, rank, int(number), rows)
            for number, rows in of_rank.groupby("iteration", sort=True)
        ]
        steps.extend(_step_dict(s) for s in per_step)
        umax, lmin = bounds(oracle[rank].times, graph)
        ranks.append(
            {
                "rank": rank,
                **summarize(per_step),
                "oracle_umax": umax,
                "oracle_lmin": lmin,
                "oracle_speedup_bound": speedup_bound(umax, lmin),
            }
        )
    document: dict[str, Any] = {
        "schema": "planner.metrics/1",
        "framework": job.framework,
        "steps": steps,
        "ranks": ranks,
        "allreduce": None,
    }
    if any(op.kind == "collective" for g in job.graphs.values() for op in g.ops.values()):
        document["allreduce"] = allreduce_metrics(job)
    return document


def analyze(job: Job) -> dict[str, Any]:
    """`planner.report/1`: inspect + TIC + TAC (when timed) + metrics."""
    timed = bool(len(job.trace.timings))
    plans = {"tic": schedule(job, "tic")}
    if timed:
        plans["tac"] = schedule(job, "tac")
    report: dict[str, Any] = {
        "schema": "planner.report/1",
        "planner_version": __version__,
        "inspect": inspect(job),
        "plans": {name: plan_document(p, job.graphs) for name, p in plans.items()},
        "metrics": metrics(job) if timed else None,
    }
    return report
