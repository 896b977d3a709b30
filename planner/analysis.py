"""The end-to-end analyses the CLI offers, as functions returning JSON-ready dicts.

Every document carries ``"schema": "planner.<kind>/<version>"``; times are seconds,
sizes bytes. The CLI only renders these.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from planner import __version__
from planner.allreduce import allreduce_metrics, rank_parameters
from planner.errors import InputError
from planner.export.caramel_files import bucket_plan_document, control_deps_document
from planner.graph import OpGraph
from planner.metrics import StepMetrics, bounds, speedup_bound, step_metrics, summarize
from planner.oracle import TimeOracle, min_of_runs
from planner.plan import Plan
from planner.schedule import caramel, tictac
from planner.trace import Job, with_dedicated

ALGORITHMS = ("tic", "tac", "caramel")


def oracles(job: Job) -> dict[str, TimeOracle]:
    """The min-of-runs oracle of every rank (empty times where nothing was traced)."""
    frame = with_dedicated(job.trace, job.graphs)
    return {
        rank: min_of_runs(graph, frame[frame["rank"] == rank]) for rank, graph in job.graphs.items()
    }


def _first_source(job: Job) -> str | None:
    return job.sources[0] if job.sources else None


def inspect(job: Job) -> dict[str, Any]:
    """What is in the input: devices, op counts by kind, transfers, steps, notes."""
    oracle = oracles(job) if len(job.trace.timings) else {}
    ranks = []
    for rank in job.ranks:
        graph = job.graphs[rank]
        times = oracle.get(rank)
        carried = Counter(p.get("collective") for p in rank_parameters(job, rank))
        transfers = [
            {
                "name": name,
                "kind": graph.ops[name].kind,
                "resource": graph.ops[name].resource,
                "param": graph.ops[name].param,
                "nbytes": graph.ops[name].nbytes,
                "parameters": carried.get(name),
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
                "edges": graph.edge_count,
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


def has_collectives(graph: OpGraph) -> bool:
    return any(op.kind == "collective" for op in graph.ops.values())


def algorithms_for(job: Job) -> list[str]:
    """The schedulers that apply: TIC/TAC to PS workers, Caramel to all-reduce ranks."""
    timed = bool(len(job.trace.timings))
    found = []
    if any(graph.recvs for graph in job.graphs.values()) or not timed:
        found += ["tic", "tac"] if timed else ["tic"]
    if timed and any(has_collectives(graph) for graph in job.graphs.values()):
        found.append("caramel")
    return found


def _not_applicable(job: Job, algorithm: str, applicable: list[str]) -> str:
    """Why `algorithm` does not apply to the job, and which scheduler does."""
    timed = bool(len(job.trace.timings))
    if algorithm == "caramel":
        why = "Caramel plans all-reduce collectives; this input has none"
        if not timed:
            why = "Caramel needs timings; this input has none"
    elif algorithm == "tac" and not timed:
        why = "TAC needs timings; this input has none"
    else:
        why = f"{algorithm.upper()} orders parameter-server recvs; this input has none"
    names = " or ".join(a.upper() if a != "caramel" else "Caramel" for a in applicable)
    return f"{why}: use {names}" if applicable else f"{why}, and no scheduler applies"


def schedule(
    job: Job,
    algorithm: str,
    oracle: Mapping[str, TimeOracle] | None = None,
    channels: int = 1,
) -> dict[str, Plan]:
    """One plan per rank: TIC (graph only), TAC or Caramel (need timings).

    TIC and TAC use the min-of-runs oracle (TicTac §5); Caramel plans the ranks with
    collectives, one order for the job (`caramel_job_plan`).
    """
    if algorithm not in ALGORITHMS:
        raise InputError(None, f"unknown algorithm {algorithm!r} (choose from {ALGORITHMS})")
    applicable = algorithms_for(job)
    if algorithm not in applicable:
        raise InputError(_first_source(job), _not_applicable(job, algorithm, applicable))
    if algorithm == "tic":
        return {rank: tictac.tic(graph, rank=rank) for rank, graph in job.graphs.items()}
    if not len(job.trace.timings):
        problem = f"{algorithm.upper()} needs timings; input has none"
        raise InputError(_first_source(job), problem)
    oracle = oracle or oracles(job)
    if algorithm == "tac":
        try:
            return {
                rank: tictac.tac(g, oracle[rank].times, rank=rank) for rank, g in job.graphs.items()
            }
        except ValueError as exc:  # op times no real trace holds (e.g. years): bad input
            raise InputError(_first_source(job), f"cannot plan with TAC: {exc}") from None
    ranks = sorted(rank for rank, g in job.graphs.items() if has_collectives(g))
    if not ranks:
        problem = "Caramel plans all-reduce collectives; input has none"
        raise InputError(_first_source(job), problem)
    return caramel_job_plan(job, ranks, oracle, channels)


def caramel_job_plan(
    job: Job, ranks: list[str], oracle: Mapping[str, TimeOracle], channels: int = 1
) -> dict[str, Plan]:
    """One Caramel plan for all ranks of a job.

    Collectives must be issued in the same order on every rank (gloo and NCCL match
    them by order), so the plan is made once, on the first rank's DAG, with each op's
    time the largest over the ranks (a collective starts when its slowest rank is
    ready) and the network model fitted to the collectives of every rank.
    """
    reference = job.graphs[ranks[0]]
    times = {
        name: max(oracle[r].times.get(name, 0.0) for r in ranks if name in job.graphs[r].ops)
        for name in reference.ops
    }
    timings = job.trace.timings[job.trace.timings["rank"].isin(ranks)]
    network = caramel.trace_network_model(reference, timings)
    plan = caramel.caramel(reference, times, network, rank=ranks[0], channels=channels)
    plans = {}
    for rank in ranks:
        missing = set(plan.order) - set(job.graphs[rank].ops)
        if missing:
            raise InputError(
                _first_source(job), f"{rank} lacks collective {sorted(missing)[0]} of {ranks[0]}"
            )
        plans[rank] = replace(plan, rank=rank, inputs={**plan.inputs, "planned_on": ranks[0]})
    return plans


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
        ranks.append(
            {
                "rank": rank,
                "algorithm": plan.algorithm,
                "transfers": transfers,
                "control_edges": [list(edge) for edge in plan.control_edges],
                "inputs": dict(plan.inputs),
            }
        )
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
        raise InputError(_first_source(job), "metrics need timings; input has none")
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


def observed_orders(job: Job) -> list[dict[str, Any]]:
    """Per rank, the order in which the transfers started in its median-length step.

    Shown beside the plans so a reader sees what the planner would change.
    """
    result = []
    for rank, graph in sorted(job.graphs.items()):
        spans = job.trace.spans[job.trace.spans["rank"] == rank]
        if not len(spans):
            continue
        lengths = (spans["end"] - spans["start"]).to_numpy()
        iteration = int(spans["iteration"].to_numpy()[lengths.argsort()[(len(lengths) - 1) // 2]])
        rows = job.trace.of(rank, iteration)
        rows = rows[[n in graph.ops and graph.ops[n].is_transfer for n in rows["op"]]]
        order = rows.sort_values(["start", "op"], kind="stable")["op"].tolist()
        result.append({"rank": rank, "iteration": iteration, "order": order})
    return result


def analyze(
    job: Job,
    samples: int = 100,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """`planner.report/1`: inspect, the plans that apply, metrics and the simulation.

    The simulation replays the traced steps (with the replay error) and compares the
    plans against the random-order baseline; its schedules (`timelines`: the traced
    median step and each plan's median sample) are for the timeline export and the
    HTML report. `progress` is told the name of each stage as it starts.
    """
    step = progress or (lambda _stage: None)
    timed = bool(len(job.trace.timings))
    step("time oracle")
    oracle = oracles(job) if timed else None
    plans = {}
    for name in algorithms_for(job):
        step(f"planning {name}")
        plans[name] = schedule(job, name, oracle)
    step("metrics")
    report: dict[str, Any] = {
        "schema": "planner.report/1",
        "planner_version": __version__,
        "inspect": inspect(job),
        "plans": {name: plan_document(p, job.graphs) for name, p in plans.items()},
        "metrics": metrics(job) if timed else None,
        "observed_orders": observed_orders(job) if timed else [],
        "simulation": None,
        "exports": {},
    }
    if timed:
        step(f"simulating ({samples} samples per plan)")
        from planner import simulate

        report["simulation"] = simulate.simulation(
            job, plans, samples=samples, seed=seed, timelines=True
        )
    if "caramel" in plans:
        report["exports"]["control_deps"] = control_deps_document(plans["caramel"])
        report["exports"]["bucket_plan"] = bucket_plan_document(plans["caramel"])
    return report
