"""`planner simulate` of a multi-rank job, one rank per task, the same document byte for
byte as `planner.prediction.simulate.simulation` on the whole job.

What a rank's replay needs of the others: the waits of its collectives for the last
rank (`planner.model.waits`, from every rank's collective rows: a collective's time in the
replay is its transfer plus its wait as seen) and, per step, the latest time a peer was
ready for each of its transfers (`planner.prediction.releases.peer_releases`: a collective
cannot start before). The plans need the job's Caramel plan (`planner.job.pipeline`). So a
job is read in two passes: `replay_summary` (the rank's summary plus its ready times),
then the parent computes the waits, the releases and the plan, and `rank_simulation`
replays and compares the rank alone. A worker holds one rank at a time (the second pass needs what
only all ranks together give), so the first pass keeps the loaded rank on disk as numpy
columns (`rank_store`) and the second reads it from there, or reads the trace again
where the store is not (a Dask worker on another machine).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from planner.errors import InputError
from planner.job.summaries import load_one_rank, summary_of

if TYPE_CHECKING:
    from planner.model.plan import Plan
    from planner.model.trace import Job


def replay_summary(paths: Sequence[str], store: str | None = None) -> dict[str, Any]:
    """One task of the first pass: `summaries.summary_of` the rank plus ``ready``: step ->
    transfer -> the time (epoch ns) the rank was ready for it
    (`planner.prediction.releases.peer_releases`).
    `store`: a folder where the loaded rank is kept for the second pass (`rank_store`)."""
    from planner.job import rank_store

    try:
        job = load_one_rank(paths)
        summary = ready_summary(job, paths, summary_of(job, paths, plans=True))
    except InputError as exc:
        return {"error": [exc.path, exc.problem]}
    if store is not None:
        rank_store.save(store, paths, job)
    return summary


def ready_summary(job: Job, paths: Sequence[str], summary: dict[str, Any]) -> dict[str, Any]:
    """`summary` (the `summary_of` one-rank `job`) plus its ``ready`` times (see
    `replay_summary`); InputError when the rank has no timings."""
    from planner.model.oracle import TimeOracle
    from planner.prediction.compiled import compile_graph
    from planner.prediction.releases import spans_of
    from planner.prediction.replay import _step_models, require_timings

    require_timings(job)
    (rank,) = job.ranks
    compiled = compile_graph(job.graphs[rank])
    # the ready times follow the observed starts and durations alone: neither the ops'
    # dedicated times nor the fallback oracle (times of unrecorded ops) change them
    rows = job.trace.of(rank)
    models = _step_models(compiled, rows, TimeOracle(times={}), spans_of(job, rank))
    ready: dict[int, dict[str, int]] = {}
    for it, (_, _, model) in models.items():
        keep = [int(i) for i in (compiled.transfer & model.observed).nonzero()[0]]
        ready[int(it)] = {compiled.names[i]: int(model.ready[i]) + model.t0 for i in keep}
    summary["ready"] = ready
    return summary


def releases(ranks: Sequence[Mapping[str, Any]]) -> dict[str, dict[int, dict[str, int]]]:
    """Rank -> step -> transfer -> the latest time another rank was ready for it in that
    step (`planner.prediction.releases.peer_releases` on the summaries' ``ready``; empty
    with one rank)."""
    if len(ranks) < 2:
        return {}
    top: dict[tuple[int, str], list[Any]] = {}  # (step, op) -> [t1, rank of t1, t2]
    for r in ranks:
        for it, ready in r["ready"].items():
            for name, t in ready.items():
                best = top.setdefault((it, name), [-1, None, -1])
                if t > best[0]:
                    best[:] = [t, r["rank"], best[0]]
                elif t > best[2]:
                    best[2] = t
    out: dict[str, dict[int, dict[str, int]]] = {}
    for r in ranks:
        mine = out.setdefault(r["rank"], {})
        for it in r["ready"]:
            mine[it] = {}
        for (it, name), (t1, who, t2) in top.items():
            if it in mine:
                latest = t2 if who == r["rank"] else t1
                if latest >= 0:
                    mine[it][name] = latest
    return out


def with_waits(job: Job, waits: Mapping[tuple[int, str], int]) -> Job:
    """A one-rank `job` whose ``wait`` column holds its collectives' waits in the whole
    job (`pipeline.job_waits`), as the joint ingest gives them (a new `Trace`: a trace is
    never mutated, and its column table and DataFrame views must agree)."""
    from dataclasses import replace

    import numpy as np

    from planner.model.trace import Trace

    table = job.trace.table
    wait = np.zeros(len(table["op"]), dtype=np.int64)
    rows = np.flatnonzero(np.isin(table["op"], list({op for _, op in waits})))  # collectives
    for r in rows.tolist():
        wait[r] = waits.get((int(table["iteration"][r]), table["op"][r]), 0)
    trace = Trace(table={**table, "wait": wait}, span_table=job.trace.span_table)
    return replace(job, trace=trace)


def rank_simulation(
    paths: Sequence[str],
    waits: Mapping[tuple[int, str], int],
    ready: Mapping[int, Mapping[str, int]],
    plan: Plan | None,
    options: Mapping[str, Any],
    store: str | None = None,
    later: int = 0,
) -> dict[str, Any]:
    """One task of the second pass: replay and compare one rank as
        `simulate.simulation` does on the whole job, with the job's `waits` for this rank,
        its peers' `ready` times (`releases`) and the job's Caramel `plan` as every rank runs
    it (`stages.job_plan`; None: no plan).
        `options`: samples, seed, sweep_knob, sweep_values and the knobs. The rank comes
        from `store` when the first pass kept it there, else from `paths`. `later`: about
        how many ranks this process replays after this one (`_simkernel.load_ahead`)."""
    from planner.job import rank_store
    from planner.prediction import _simkernel

    job = rank_store.load(store, paths) if store is not None else None
    try:
        job = job or load_one_rank(paths)
    except InputError as exc:
        return {"error": [exc.path, exc.problem]}
    before = _simkernel.dispatched()
    record = simulation_of(job, waits, ready, plan, options)
    _simkernel.load_ahead(_simkernel.dispatched() - before, later)
    return record


def simulation_of(
    job: Job,
    waits: Mapping[tuple[int, str], int] | None,
    ready: Mapping[int, Mapping[str, int]],
    plan: Plan | None,
    options: Mapping[str, Any],
    timelines: bool = False,
) -> dict[str, Any]:
    """`rank_simulation` of a loaded one-rank `job`; with `timelines`, the record's
    ``timelines`` holds the rank's schedules as `planner.prediction.timelines.timelines_of`
    gives them (the traced median step and each plan's median sample)."""
    import numpy as np

    from planner.model.oracle import mean_of_runs
    from planner.model.trace import queued_before
    from planner.prediction.comparison import compare
    from planner.prediction.compiled import rank_arrays, rank_rows
    from planner.prediction.fidelity import _error_summary
    from planner.prediction.fsdp_whatif import rank_whatif
    from planner.prediction.releases import _latest, carried_over, spans_of
    from planner.prediction.replay import _frame, _replay_rank
    from planner.prediction.step_timing import cpu_spans_of
    from planner.prediction.timelines import timelines_of
    from planner.prediction.whatif import sweep as sweep_of

    (rank,) = job.ranks
    if waits is not None:  # None: the job's trace holds them (a rank of a loaded job)
        job = with_waits(job, waits)
    graph = job.graphs[rank]
    frame = _frame(job)
    rows = rank_rows(frame, rank)
    # the graph compiled and its rows looked up once, for the replay and the comparison
    compiled, known = rank_arrays(graph, rows)
    oracle = mean_of_runs(graph, rows)
    peers = {}
    for it, times in ready.items():
        latest = np.full(len(compiled.names), -1, dtype=np.int64)
        for name, t in times.items():
            i = compiled.index.get(name)
            if i is not None and compiled.transfer[i]:
                latest[i] = t
        peers[it] = latest
    seed, samples = options["seed"], options["samples"]
    spans = spans_of(job, rank)
    # as `planner.prediction.replay.replay`: peers' readiness, and the queue each stream
    # carries over
    queue = carried_over(compiled, known, spans, queued_before(job, rank))
    release = _latest(peers if ready else None, queue)
    pools = job.framework == "tensorflow"
    plans = {}
    if plan is not None:
        plans = {"caramel": {rank: replace(plan, rank=rank)}}
    steps = _replay_rank(
        compiled, known, oracle, seed, spans, release, len(graph.ops), pools,
        {name: p[rank] for name, p in plans.items()}, cpu_spans_of(job, rank),
        hooked=job.framework == "pytorch",
    )  # fmt: skip
    knobs = options["knobs"]
    shared = {
        "samples": samples, "seed": seed, "oracles": {rank: oracle}, "frame": frame,
        "arrays": {rank: (compiled, known)},
    }  # fmt: skip
    comparison = compare(job, plans, replayed={rank: steps}, timelines=timelines, **shared, **knobs)
    sweep = None
    if options["sweep_knob"] is not None:
        sweep = sweep_of(
            job, options["sweep_knob"], options["sweep_values"], plans,
            replayed={rank: steps}, **shared, **knobs,
        )  # fmt: skip
    return {
        "rank": rank,
        "sources": list(job.sources),
        "fsdp_whatif": rank_whatif(job, rank),
        "timelines": timelines_of(job, comparison) if timelines else None,
        "replay": {"rank": rank, **_error_summary(steps), "steps": steps},
        "comparison": comparison,
        "sweep": sweep,
    }


def job_simulation(
    results: Sequence[dict[str, Any]], framework: str, sources: Sequence[str]
) -> dict[str, Any]:
    """The job's `planner.simulation/1` from its ranks' `rank_simulation` records."""
    from planner.prediction.fidelity import _all_errors
    from planner.prediction.fsdp_whatif import join
    from planner.prediction.replay import SCHEMA

    for result in results:
        if "error" in result:
            raise InputError(*result["error"])
    ranks = sorted(results, key=lambda r: r["rank"])
    replays = [r["replay"] for r in ranks]
    first = ranks[0]["comparison"]
    comparison = {**{k: v for k, v in first.items() if k != "ranks"}}
    comparison["ranks"] = [entry for r in ranks for entry in r["comparison"]["ranks"]]
    sweep = None
    if ranks[0]["sweep"] is not None:
        sweep = {k: v for k, v in ranks[0]["sweep"].items() if k != "ranks"}
        sweep["ranks"] = [entry for r in ranks for entry in r["sweep"]["ranks"]]
    document = {
        "schema": SCHEMA,
        "kind": "simulation",
        "framework": framework,
        "sources": list(sources),
        "replay": {
            "schema": SCHEMA,
            "kind": "replay",
            "ranks": replays,
            **_all_errors(replays),
        },
        "comparison": comparison,
        "sweep": sweep,
    }
    whatif = join(r.get("fsdp_whatif") for r in ranks)
    if whatif is not None:
        document["fsdp_whatif"] = whatif
    return document
