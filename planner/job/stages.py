"""The stage functions a job's analyses are made of, as functions returning JSON-ready
dicts: the plans (TIC/TAC per rank, Caramel's one plan for the job), a rank's figures
from what it saw alone (`rank_metrics`), its observed order, the DDP bucket advice.

Every job-level analysis runs them one way (`planner.job.analysis`: per rank, then
folded), whether its ranks come from one loaded job or from one task each on a pool or
Dask (`planner.job.parallel`). Every document carries ``"schema":
"planner.<kind>/<version>"``; times are seconds, sizes bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

from planner.errors import InputError
from planner.export import ddp_buckets
from planner.measure.allreduce import allreduce_metrics
from planner.measure.foreign_load import is_loaded
from planner.measure.inspection import inspect, oracles  # noqa: F401 (the API of this module)
from planner.measure.metrics import (
    StepMetrics,
    bounds,
    collectives_alone,
    device_ops,
    queued_times,
    rank_step_metrics,
    speedup_bound,
    summarize,
)
from planner.model import records
from planner.model.graph import OpGraph
from planner.model.oracle import NetworkModel, TimeOracle
from planner.model.plan import Plan
from planner.model.trace import Job, dedicated_columns, rank_meta, rank_partial_steps
from planner.planning import buckets, caramel, tictac
from planner.planning.activation import gradient_transfers
from planner.planning.read_units import planned_as_units
from planner.planning.scope import group_scope, rank_problem, scope_line

if TYPE_CHECKING:
    import pandas as pd

ALGORITHMS = ("tic", "tac", "caramel")


def _first_source(job: Job) -> str | None:
    return job.sources[0] if job.sources else None


def has_collectives(graph: OpGraph) -> bool:
    return any(op.kind == "collective" for op in graph.ops.values())


def algorithms_for(job: Job) -> list[str]:
    """The schedulers that apply: TIC/TAC to PS workers, Caramel to all-reduce ranks."""
    timed = bool(job.trace.rows)
    found = []
    if any(graph.recvs for graph in job.graphs.values()) or not timed:
        found += ["tic", "tac"] if timed else ["tic"]
    if timed and caramel_problem(job) is None:
        found.append("caramel")
    return found


def caramel_problem(job: Job) -> str | None:
    """Why Caramel does not plan the job, None where it does: it has no collectives, it
    shards its gradients (FSDP/ZeRO: no gradient all-reduces to order), or none of its
    process groups is data-parallel (`scope.group_scope`)."""
    ranks = [r for r, g in job.graphs.items() if has_collectives(g)]
    if not ranks:
        return "Caramel plans all-reduce collectives; this input has none"
    problems = (rank_problem(job.graphs[r], rank_meta(job, r)) for r in ranks)
    return next((p for p in problems if p is not None), None)


def _not_applicable(job: Job, algorithm: str, applicable: list[str]) -> str:
    """Why `algorithm` does not apply to the job, and which scheduler does."""
    timed = bool(job.trace.rows)
    if algorithm == "caramel":
        why = caramel_problem(job) or ""
        if not timed:
            why = "Caramel needs timings; this input has none"
    elif algorithm == "tac" and not timed:
        why = "TAC needs timings; this input has none"
    else:
        why = f"{algorithm.upper()} orders parameter-server recvs; this input has none"
    names = " or ".join(a.upper() if a != "caramel" else "Caramel" for a in applicable)
    return f"{why}: use {names}" if applicable else f"{why}, and no scheduler applies"


def check_applies(job: Job, algorithm: str) -> None:
    """InputError unless `algorithm` plans this job: one of `ALGORITHMS` that applies
    (`algorithms_for`), with the timings TAC and Caramel need."""
    if algorithm not in ALGORITHMS:
        raise InputError(None, f"unknown algorithm {algorithm!r} (choose from {ALGORITHMS})")
    applicable = algorithms_for(job)
    if algorithm not in applicable:
        raise InputError(_first_source(job), _not_applicable(job, algorithm, applicable))
    if algorithm != "tic" and not job.trace.rows:
        problem = f"{algorithm.upper()} needs timings; input has none"
        raise InputError(_first_source(job), problem)


def ps_plans(
    job: Job, algorithm: str, oracle: Mapping[str, TimeOracle] | None = None
) -> dict[str, Plan]:
    """One plan per rank of a parameter-server job: TIC (graph only) or TAC on the
    min-of-runs oracle (TicTac §5); `check_applies` first."""
    if algorithm == "tic":
        return {
            rank: planned_as_units(graph, partial(tictac.tic, rank=rank))
            for rank, graph in job.graphs.items()
        }
    oracle = oracle or oracles(job)
    graphs = job.graphs.items()
    try:
        return {
            rank: planned_as_units(g, partial(tictac.tac, time=oracle[rank].times, rank=rank))
            for rank, g in graphs
        }
    except ValueError as exc:  # op times no real trace holds (e.g. years): bad input
        raise InputError(_first_source(job), f"cannot plan with TAC: {exc}") from None


def caramel_reference_plan(
    reference: OpGraph,
    rank: str,
    times: Mapping[str, float],
    timings: pd.DataFrame,
    channels: int = 1,
    benchmark: NetworkModel | None = None,
    scope: Mapping[str, Any] | None = None,
) -> Plan:
    """Caramel's one plan for the job, made on the reference rank's DAG (gloo and NCCL
    match collectives by their order, so every rank must issue them in the same order),
    with the job's op `times` (each the largest over the ranks: a collective starts when
    its slowest rank is ready) and the network model fitted to `timings` (``op``,
    ``duration``, ``wait`` rows of every rank's transfers). A fit that does not hold
    (`caramel.network_problem`) gives way to `benchmark` when given, else the plan
    batches nothing; ``inputs["network_note"]`` says which and why. `scope`
    (`scope.group_scope`): on a rank of several process groups, only the data-parallel
    groups' collectives are planned; ``inputs["process_groups"]`` names them and the
    groups left alone.
    """
    network = caramel.trace_network_model(reference, timings)
    problem = caramel.network_problem(network)
    source = "trace"
    if problem is not None and benchmark is not None:
        network, source = benchmark, "benchmark"
        note = f"the trace's network fit is not used: {problem}; using the benchmark model"
    elif problem is not None:
        note = f"planned without batching: {problem}; give a benchmark model (--network)"
    else:
        note = None
    params = None
    if scope is not None:
        planned = set(scope["planned"])
        params = [p for p in gradient_transfers(reference) if p in planned]
    plan = caramel.caramel(
        reference, times, network, rank=rank, channels=channels, params=params,
        batching_on=problem is None or source == "benchmark",
    )  # fmt: skip
    # a GPU op cannot be held back by the hook that applies the plan, and the reference
    # rank's (``gpu0/...``) are no other rank's: its edges to GPU ops are the DAG's
    # (a collective enqueued after the kernels before it), already there at run time
    host = tuple(
        (u, v)
        for u, v in plan.control_edges
        if not (
            reference.ops[u].resource.startswith("gpu")
            or reference.ops[v].resource.startswith("gpu")
        )
    )
    inputs = {**plan.inputs, "network_source": source, "network_note": note}
    if scope is not None:
        inputs["process_groups"] = {
            "groups": scope["groups"], "left_alone": scope["left_alone"],
            "note": scope_line(scope),
        }  # fmt: skip
    return replace(plan, control_edges=host, inputs=inputs)


def caramel_rank_plans(
    plan: Plan,
    ops_of: Mapping[str, Collection[str]],
    source: str | None,
    holds: Callable[[str], bool] | None = None,
) -> dict[str, Plan]:
    """The reference rank's Caramel `plan` for every rank of `ops_of` (rank -> its op
    names, or its transfers' where `holds` is given); InputError naming `source` when a
    rank lacks one of the planned collectives. The control edges are `job_plan`'s:
    kept where every rank holds both ends (`holds`, by default from `ops_of`)."""
    if holds is None:
        common = set.intersection(*(set(ops) for ops in ops_of.values())) if ops_of else set()
        holds = common.__contains__
    shared = job_plan(plan, holds)
    plans = {}
    for rank, ops in ops_of.items():
        missing = set(plan.order) - set(ops)
        if missing:
            raise InputError(source, f"{rank} lacks collective {sorted(missing)[0]} of {plan.rank}")
        plans[rank] = replace(shared, rank=rank)
    return plans


def job_plan(plan: Plan, holds: Callable[[str], bool]) -> Plan:
    """The reference rank's Caramel `plan` as every rank runs it (still named for the
    reference rank: each rank's copy is ``replace(..., rank=rank)``): its control edges
    kept where every rank holds both ends (`holds`; an edge naming an op some rank lacks
    would order nothing there, and its replay would refuse it),
    ``inputs["control_edges_dropped"]`` counting the others, ``planned_on`` the
    reference rank. The one rule of the joint path and the per-rank path."""
    edges = tuple((u, v) for u, v in plan.control_edges if holds(u) and holds(v))
    inputs = {**plan.inputs, "planned_on": plan.rank}
    if len(edges) < len(plan.control_edges):
        inputs["control_edges_dropped"] = len(plan.control_edges) - len(edges)
    return replace(plan, control_edges=edges, inputs=inputs)


def plan_document(
    plans: Mapping[str, Plan], graphs: Mapping[str, OpGraph], meta: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """`planner.priorities/1`: per rank, every planned transfer with priority and order_index
    (and, for a DDP job, the buckets it carries and the traced model: `ddp_buckets`)."""
    material = {rank: plan_material(graphs[rank], rank, plans[rank].order, meta) for rank in plans}
    return plans_document(plans, material)


def plan_material(
    graph: OpGraph, rank: str, names: Iterable[str], meta: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """What the priority document says of a rank's transfers `names` besides the plan: each
    one's param, resource, bytes and DDP buckets, and the traced model (`ddp_buckets`).
    Small, so that a rank's worker can send it instead of its graph (`planner.job.pipeline`)."""
    params = list(((meta or {}).get("parameters") or {}).get(rank) or ())
    ops = {}
    for name in names:
        op = graph.ops[name]
        entry: dict[str, Any] = {"param": op.param, "resource": op.resource, "nbytes": op.nbytes}
        buckets = ddp_buckets.bucket_entries(graph, [name], params)
        if buckets is not None:
            entry["buckets"] = buckets
        ops[name] = entry
    source = ((meta or {}).get("parameter_source") or {}).get(rank)
    return {"ops": ops, "model": ddp_buckets.model_entry(graph, params, source)}


def plans_document(
    plans: Mapping[str, Plan], material: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """`planner.priorities/1` from the plans and each rank's `plan_material`."""
    ranks = []
    for rank in sorted(plans):
        plan, known = plans[rank], material[rank]
        index = plan.order_index()
        transfers = []
        for name in plan.order:
            op = known["ops"][name]
            entry: dict[str, Any] = {
                "name": name,
                "param": op["param"],
                "resource": op["resource"],
                "nbytes": op["nbytes"],
                "priority": plan.priority[name],
                "order_index": index[name],
            }
            if "buckets" in op:
                entry["buckets"] = op["buckets"]
            for prop, values in sorted(plan.properties.items()):
                if name in values:
                    value = float(values[name])
                    entry[prop] = value if value != float("inf") else None
            transfers.append(entry)
        doc: dict[str, Any] = {
            "rank": rank,
            "algorithm": plan.algorithm,
            "transfers": transfers,
            "control_edges": [list(edge) for edge in plan.control_edges],
            "inputs": dict(plan.inputs),
        }
        if known["model"] is not None:
            doc["model"] = known["model"]
        ranks.append(doc)
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


def rank_metrics(job: Job, oracle: Mapping[str, TimeOracle] | None = None) -> dict[str, Any]:
    """`planner.metrics/1` of each rank of `job` from what it saw alone: per-step figures,
    its summary and its oracle bounds, before the job level joins the ranks
    (`planner.job.analysis.metrics`: the waits of each collective for its last rank).

    `oracle`: the job's `oracles`, when a caller has them already (computed once, handed on).
    """
    if not job.trace.rows:
        raise InputError(_first_source(job), "metrics need timings; input has none")
    # per-rank figures from what each rank saw (a collective's whole span), so that a
    # rank reads the same alone (analyze-ranks) or in its job; waits are reported apart
    resource, dedicated = dedicated_columns(job.trace, job.graphs, transfer_only=False)
    oracle = oracle or oracles(job)
    table = job.trace.table
    steps: list[dict[str, Any]] = []
    ranks: list[dict[str, Any]] = []
    notes: list[str] = []
    for rank in job.ranks:
        graph = job.graphs[rank]
        rows = job.trace.rows_of(rank)
        of_rank = {k: table[k][rows] for k in ("op", "iteration", "start", "duration")}
        of_rank.update(resource=resource[rows], dedicated=dedicated[rows])
        device = device_ops(graph)
        per_step = rank_step_metrics(graph, rank, of_rank, device)
        alone = collectives_alone(job, rank)
        if alone:  # nothing crosses a network: no transfer to order
            per_step = [replace(s, efficiency=None, speedup_bound=None) for s in per_step]
        partial = rank_partial_steps(job.trace, rank, graph)
        recorded = rank_meta(job, rank).get("queued")  # TF: per step and op, ns queued
        queued = queued_times(recorded, of_rank) if recorded is not None else {}
        for s in per_step:
            entry = _step_dict(s)
            if s.iteration in queued:
                entry["queued"] = queued[s.iteration]
            if s.iteration in partial:
                entry["partial"] = records.note(rank, s.iteration, partial[s.iteration])
                notes.append(entry["partial"])
            steps.append(entry)
        per_step = [s for s in per_step if s.iteration not in partial] or per_step
        times = oracle[rank].times
        if device is not None:
            times = {n: t for n, t in times.items() if n in device}
        umax, lmin = bounds(times, graph)
        applies = bool(graph.transfers) and not alone
        if alone:
            notes.append(
                f"{rank}: a one-rank job (distributedInfo.world_size 1): its collectives move "
                "nothing over a network, so nothing to order: efficiency E and speedup bound "
                "S do not apply (null), and --min-efficiency checks nothing"
            )
        elif not applies:
            notes.append(
                f"{rank}: no transfers, so nothing to order: efficiency E and speedup bound S "
                "do not apply (null), and --min-efficiency checks nothing"
            )
        elif device is not None:
            notes.append(
                f"{rank}: GPU rank: Umax, Lmin, E and S count the device work (GPU streams "
                "and collectives); the CPU ops that launch it are not counted twice"
            )
        ranks.append(
            {
                "rank": rank,
                **summarize(per_step),
                "oracle_umax": umax,
                "oracle_lmin": lmin,
                "oracle_speedup_bound": speedup_bound(umax, lmin) if applies else None,
            }
        )
    document: dict[str, Any] = {
        "schema": "planner.metrics/1",
        "framework": job.framework,
        "steps": steps,
        "ranks": ranks,
        "allreduce": None,
        "notes": notes,
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


def bucket_sweep(
    job: Job,
    network: NetworkModel | None = None,
    untraced_step_time: float | None = None,
    reference: Job | None = None,
    reference_untraced_step_time: float | None = None,
) -> dict[str, Any] | None:
    """DDP bucket advice (`planner.planning.buckets.sweep`) with the benchmark model when given,
    else the trace's fit (a note says when that fit does not hold); with the job's step
    time without the profiler, the profiler's cost taken out of the traced steps; with a
    `reference` trace of the job at one bucket (and its untraced step time), the backward
    pass's own contention factor measured from it (`buckets.backward_factor`)."""
    ranks = sorted(r for r, g in job.graphs.items() if has_collectives(g))
    if not ranks:
        return None
    timings = job.trace.timings
    scope = group_scope(job.graphs[ranks[0]], rank_meta(job, ranks[0]))
    if scope is not None:  # the data-parallel group's transfers alone (`scope`)
        timings = timings[timings["op"].isin(scope["planned"])]
    fitted = caramel.trace_network_model(job.graphs[ranks[0]], timings)
    model = network or fitted
    profile = buckets.profile(job)
    if model is None:
        return None if profile is None else no_network_sweep()
    if profile is None:
        return None
    ref = reference_profile(reference)
    return profile_sweep(profile, model, fitted, network, untraced_step_time, ref,
                         reference_untraced_step_time)  # fmt: skip


def reference_profile(reference: Job | None) -> buckets.Profile | None:
    """The bucket profile of a reference trace (`buckets.backward_factor`); `InputError`
    when it has no gradient-ready times."""
    if reference is None:
        return None
    found = buckets.profile(reference)
    if found is None:
        raise InputError(None, "--bucket-reference: the trace has no gradient-ready times")
    return found


def profile_sweep(
    profile: buckets.Profile,
    model: NetworkModel,
    fitted: NetworkModel | None,
    network: NetworkModel | None,
    untraced_step_time: float | None,
    reference: buckets.Profile | None = None,
    reference_untraced_step_time: float | None = None,
) -> dict[str, Any]:
    """`buckets.sweep_profile` with `model` and the notes on it (`sweep_notes`);
    `InputError` when an untraced step time cannot be its traced configuration's or the
    reference trace cannot be one."""
    try:
        document = buckets.sweep_profile(
            profile, model, untraced_step_time=untraced_step_time, reference=reference,
            reference_untraced_step_time=reference_untraced_step_time,
        )  # fmt: skip
    except buckets.BadReference as err:
        raise InputError(None, f"--bucket-reference: {err}") from err
    except ValueError as err:
        raise InputError(None, f"--untraced-step-time: {err}") from err
    return sweep_notes(document, fitted, network)


def no_network_sweep() -> dict[str, Any]:
    """The bucket advice of a job whose transfers cannot be fitted and no benchmark given."""
    return {
        "schema": "planner.bucket_sweep/1",
        "caps": [],
        "replay_error": None,
        "recommended_cap_mb": None,
        "reason": "no network model: the trace's transfers cannot be fitted (fewer than "
        "2 sizes); give a benchmark model (--network) for bucket advice",
    }


def sweep_notes(
    document: dict[str, Any], fitted: NetworkModel | None, network: NetworkModel | None
) -> dict[str, Any]:
    """A `buckets.sweep` `document` with the model it used (the benchmark `network` or
    the trace's `fitted` one) and, when that fit does not hold, no recommendation."""
    problem = caramel.network_problem(fitted) if network is None else None
    document["network_source"] = "benchmark" if network is not None else "trace"
    document["network_note"] = None
    if problem:
        document["network_note"] = (
            f"the trace's network fit cannot be trusted ({problem}): the predictions are "
            "rough; give a benchmark model (--network)"
        )
        document["recommended_cap_mb"] = None
        if not is_loaded(document.get("foreign_load")):  # the load, said first, explains more
            document["reason"] = "no recommendation without a network model that holds"
    return document


def add_predictions(bucket_plan: dict[str, Any], simulation: Mapping[str, Any] | None) -> None:
    """Each rank's predicted iteration time of the Caramel plan, the simulator's (the
    figure `planner simulate` prints), with the replay error of the observed order."""
    by_rank = {r["rank"]: r for r in (simulation or {}).get("comparison", {}).get("ranks", [])}
    for entry in bucket_plan["ranks"]:
        rank = by_rank.get(entry["rank"], {})
        planned = next((p for p in rank.get("plans", []) if p["plan"] == "caramel"), None)
        entry["predicted_iteration_time"] = planned["predicted"] if planned else None
        entry["replay_error"] = rank.get("replay_error_median")
