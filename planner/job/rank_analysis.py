"""`planner analyze` of a multi-rank job, one rank per task: the same `planner.report/1`
as `analysis.analyze` on the whole job.

A worker reads one rank, computes its time oracle once and hands it on to the rank's
inspection, metrics and Caramel terms (`summaries.summary_of`), its ready times for the
replay (`rank_replay.ready_summary`), its observed transfer order and the per-rank part
of the DDP bucket profile (`buckets.profile` of the rank: per-gradient ready times,
collective spans, lanes). The parent joins the summaries: the waits and the metrics
(`pipeline.job_metrics`), the job's Caramel plan (one task on the reference rank), the
transfers' oracle times less the waits for `inspect`, the bucket sweep on the joined
profile. A second pass replays and compares each rank (`rank_replay.simulation_of`),
with its bucket-plan entry and, for a bounded set of ranks (`shown_ranks.timeline_ranks`), its
schedules for the report's timelines. The first pass keeps each loaded rank on disk as
numpy columns (`rank_store`) and the second reads it from there, not from its trace: a
worker that kept its ranks in memory across the barrier would hold all of them, and the
package writes no pickle (`tests/test_safety.py`). Where the store is not there (a Dask
worker on another machine) the second pass reads the trace again, to the same answer.
On a local pool the two passes have their own workers: the first pass's never load the
replay's compiled loop, this process loads it while they work, and the second pass's
are forked from it afterwards, sharing that one copy.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

from planner.errors import InputError
from planner.job.summaries import load_one_rank, summary_of

if TYPE_CHECKING:
    from planner.model.graph import OpGraph
    from planner.model.oracle import NetworkModel
    from planner.model.plan import Plan
    from planner.model.trace import Job
    from planner.planning.bucket_profile import Profile

    RankSource = Sequence[str] | Job
    """A task's rank: its input files (read by the task) or, in this process, the rank
    loaded already (`analysis.rank_view`)."""

ONE_RANK_NOTE = "one rank: a collective's wait for its peers cannot be told"


def analysis_summary(source: RankSource, store: str | None = None) -> dict[str, Any]:
    """One task of the first pass: the rank's `rank_replay.replay_summary` plus its
    inspection entry, observed transfer order and bucket profile; its oracle computed
    once. An error record (``{"error": [path, problem]}``) for bad input. `store`: a
    folder where the rank read from its paths is kept for the second pass (`rank_store`)."""
    from planner.job import rank_store, stages
    from planner.job.rank_replay import ready_summary
    from planner.model.trace import rank_meta
    from planner.planning import buckets

    paths = source if isinstance(source, Sequence) else source.sources
    try:
        job = load_one_rank(paths) if isinstance(source, Sequence) else source
        oracle = stages.oracles(job) if job.trace.rows else {}
        summary = summary_of(job, paths, plans=True, oracle=oracle)
        summary = ready_summary(job, paths, summary)
    except InputError as exc:
        return {"error": [exc.path, exc.problem]}
    (rank,) = job.ranks
    graph = job.graphs[rank]
    inspected = stages.inspect(job, oracle)
    summary["inspect"] = inspected["ranks"][0]
    summary["notes"] = [n for n in inspected["notes"] if not n.startswith(ONE_RANK_NOTE)]
    summary["observed_orders"] = stages.observed_orders(job)
    summary["recvs"] = bool(graph.recvs)
    summary["profile"] = buckets.rank_profile(job, rank)
    summary["gradient_ready"] = bool(rank_meta(job, rank).get("gradient_ready"))
    summary["cpu"] = not any(op.resource.startswith("gpu") for op in graph.ops.values())
    if store is not None and isinstance(source, Sequence):
        rank_store.save(store, paths, job)
    return summary


def warm_task(paths: Sequence[str]) -> dict[str, Any]:
    """A task that loads the replay's compiled loop (`_simkernel.warm`) in a worker that
    would otherwise wait for the parent between the two passes (about 0.5 s a process
    that the second pass no longer spends). `paths` is unused (a task's signature)."""
    from planner.prediction import _simkernel

    _simkernel.warm()
    return {}


def rank_report(
    source: RankSource,
    waits: Mapping[tuple[int, str], int] | None,
    ready: Mapping[int, Mapping[str, int]],
    plan: Plan,
    options: Mapping[str, Any],
    timelines: bool,
    store: str | None = None,
) -> dict[str, Any]:
    """One task of the second pass: the rank's replay and plan comparison
    (`rank_replay.simulation_of`), its entry of Caramel's bucket plan and, with
    `timelines`, its schedules and the ops they name (for timeline.json's labels). A
    rank given by its paths comes from `store` when the first pass kept it there, else
    from the paths."""
    from planner.export.caramel_files import bucket_plan_document
    from planner.job import rank_store
    from planner.job.rank_replay import simulation_of

    if not isinstance(source, Sequence):  # a view's trace holds the job's waits already
        job, waits = source, None
    else:
        job = rank_store.load(store, source) if store is not None else None
        try:
            job = job or load_one_rank(source)
        except InputError as exc:
            return {"error": [exc.path, exc.problem]}
    record = simulation_of(job, waits, ready, plan, options, timelines)
    (rank,) = job.ranks
    graph = job.graphs[rank]
    planned = {rank: replace(plan, rank=rank)}
    (record["bucket_plan"],) = bucket_plan_document(planned, job.graphs, job.meta)["ranks"]
    if timelines:
        named = {op for s in record["timelines"] for op in s["timeline"]["op"]}
        record["ops"] = {name: graph.ops[name] for name in sorted(named) if name in graph.ops}
    return record


def joined_profile(ranks: Sequence[Mapping[str, Any]]) -> Profile | None:
    """The job's `buckets.profile` from its ranks' own (`buckets.join`)."""
    from planner.planning import buckets

    with_ready = [r["profile"] for r in ranks if r["gradient_ready"]]
    return buckets.join(with_ready, all(r["cpu"] for r in ranks))


def report_ranks(
    rank_inputs: Sequence[RankSource],
    workers: int | None = None,
    dask_address: str | None = None,
    *,
    samples: int = 100,
    seed: int = 0,
    network: NetworkModel | None = None,
    notes: Sequence[str] = (),
    untraced_step_time: float | None = None,
    reference: Job | None = None,
    reference_untraced_step_time: float | None = None,
    sources: Sequence[str] | None = None,
) -> tuple[dict[str, Any], dict[str, OpGraph], list[dict[str, Any]]] | None:
    """(`planner.report/1`, rank -> the ops its timelines name (an `OpGraph` without
    edges, for `report.outputs.analysis_files`), per-worker usage) of a
    job of PyTorch all-reduce ranks, one rank per task (`parallel.rank_mapper`); None
    when the job is not one (a rank with parameter-server transfers or without
    collectives): one process analyses it (`analysis.analyze`). `notes`: the job's
    notes on skipped files (`parallel.split_ranks`); `untraced_step_time`: the job's
    step time without the profiler, for the bucket advice, as are `reference` (the job
    traced with one bucket) and its untraced step time. The ranks of a job loaded in
    this process (`analysis.rank_view` each, `workers` 1) are its `rank_inputs` too:
    then `sources` are the job's, as each view holds them all."""
    from planner.job import pipeline, stages, summaries
    from planner.job.parallel import usage_of

    folded = summaries.Folded()
    with (
        tempfile.TemporaryDirectory(prefix="planner-ranks-") as store,
        ExitStack() as stack,
    ):
        _, mapper, results = _first_pass(stack, rank_inputs, workers, dask_address,
                                         store, folded, samples)  # fmt: skip
        ranks = pipeline.checked(results)
        if not ranks or any(r["recvs"] or r["caramel"] is None for r in ranks):
            return None
        source_of = {r["rank"]: s for r, s in zip(results, rank_inputs, strict=True)}
        pipeline.check_same_job(ranks)
        waits = pipeline.job_waits(ranks)
        opened: dict[str, dict[str, float]] = {}
        planned, inputs = pipeline.caramel_inputs(ranks, folded.times, waits, opened)
        task = partial(pipeline.reference_plan, **inputs, benchmark=network, store=store)
        referenced = mapper(task, [source_of[planned[0]["rank"]]], None, lazy=True)
        warming = _warming(mapper, ranks, samples, workers, dask_address is not None)
        metrics = pipeline.job_metrics(ranks, waits)
        (planned_reference,) = referenced
        if "error" in planned_reference:
            raise InputError(*planned_reference["error"])
        holds = folded.holds()  # the plan every rank runs, as the joint path's
        plan = stages.job_plan(planned_reference["plan"], holds)
        options = {"samples": samples, "seed": seed, "sweep_knob": None, "sweep_values": [],
                   "knobs": {}}  # fmt: skip
        # the second pass runs while this process joins what needs the summaries
        pending = _second_pass(mapper, ranks, source_of, waits, plan, metrics, options, store)
        joined = _joined(ranks, planned, waits, opened, notes, holds, planned_reference,
                         (network, untraced_step_time, reference,
                          reference_untraced_step_time), sources)  # fmt: skip
        usage = usage_of(results)
        del results, ranks, planned, waits, opened
        replays = list(pending)
        for _ in warming:
            pass
    report, done = _report(replays, metrics, joined)
    return report, _label_graphs(done), usage + usage_of(replays)


def _first_pass(
    stack: ExitStack,
    rank_inputs: Sequence[Sequence[str]],
    workers: int | None,
    dask_address: str | None,
    store: str,
    folded: Any,
    samples: int,
) -> tuple[bool, Any, list[dict[str, Any]]]:
    """(whether the second pass's pool is forked from this process, the mapper of the
    second pass, the first pass's records folded into `folded`). On a local pool the
    first pass's workers exit once it is done and the second's are forked from this
    process, which holds the replay's compiled loop by then (`_first_pass_loading`)."""
    from planner.job import summaries
    from planner.job.parallel import pool_size, rank_mapper

    forked = dask_address is None and pool_size(workers, len(rank_inputs)) > 1
    mapper = stack.enter_context(rank_mapper(workers, dask_address, len(rank_inputs)))
    task = partial(analysis_summary, store=store)
    fold = summaries.fold(folded)
    if not forked:
        return forked, mapper, mapper(task, rank_inputs, fold)
    results = _first_pass_loading(mapper(task, rank_inputs, fold, lazy=True), samples)
    stack.close()
    return forked, stack.enter_context(rank_mapper(workers, None, len(rank_inputs))), results


def _warming(
    mapper: Any, ranks: Sequence[Mapping[str, Any]], samples: int, workers: int | None,
    on_dask: bool,
) -> Iterable[dict[str, Any]]:  # fmt: skip
    """On Dask the other workers would wait for the plan: they load the replay's compiled
    loop meanwhile, ahead of the second pass's tasks, where one rank's replay is expected
    to pass the Python loop's share (the records are taken at the end: dropping a lazy
    map cancels what has not started). A local pool's second pass has it from this
    process already where it needs it (`_first_pass_loading`); in this one process the
    map would run only after the replays, for nothing."""
    from planner.job.parallel import pool_size
    from planner.prediction import _simkernel

    ops = max(r["inspect"]["ops"] for r in ranks)
    if not on_dask or not _simkernel.loads_compiled(ops, samples):
        return ()
    return mapper(warm_task, [[]] * pool_size(workers, len(ranks)), None, lazy=True)


def _second_pass(
    mapper: Any,
    ranks: Sequence[Mapping[str, Any]],
    source_of: Mapping[str, RankSource],
    waits: Any,
    plan: Plan,
    metrics: Mapping[str, Any],
    options: Mapping[str, Any],
    store: str,
) -> Iterable[dict[str, Any]]:
    """The second pass's records (`rank_report`), sent to the workers at once: each rank
    with its waits, its peers' ready times, the job's plan and whether its schedules go
    in the report (`shown_ranks.timeline_ranks`)."""
    from planner.job.rank_replay import releases
    from planner.job.shown_ranks import timeline_ranks

    _, waited, _ = waits
    ready = releases(ranks)
    chosen = timeline_ranks([r["rank"] for r in ranks], metrics)
    args = [
        (waited.get(r["rank"], {}), ready.get(r["rank"], {}), plan, options,
         r["rank"] in chosen, store)
        for r in ranks
    ]  # fmt: skip
    return mapper(rank_report, [source_of[r["rank"]] for r in ranks], None, args, lazy=True)


def _joined(
    ranks: Sequence[Mapping[str, Any]],
    planned: Sequence[Mapping[str, Any]],
    waits: Any,
    opened: Mapping[str, Mapping[str, float]],
    notes: Sequence[str],
    holds: Any,
    planned_reference: Mapping[str, Any],
    advice: tuple[NetworkModel | None, float | None, Job | None, float | None],
    job_sources: Sequence[str] | None = None,
) -> dict[str, Any]:
    """What the report takes from the summaries while the second pass runs: sources (the
    job's, `job_sources`, where each rank is a view holding them all; else joined from
    the ranks'), framework, the inspection, the observed orders, the bucket advice
    (`advice`: the benchmark network, the untraced step time, the reference trace and
    its untraced step time), the plan of every rank and its priority document."""
    from planner.job import pipeline, stages

    frame, waited, alignment = waits
    sources = list(job_sources) if job_sources is not None else pipeline.joint_sources(ranks)
    network, untraced_step_time, reference, reference_untraced_step_time = advice
    ops_of = {r["rank"]: r["caramel"]["material"]["ops"] for r in planned}
    plans = stages.caramel_rank_plans(
        planned_reference["plan"], ops_of, planned[0]["sources"][0], holds
    )
    material = {r["rank"]: r["caramel"]["material"] for r in planned}
    return {
        "sources": sources,
        "framework": ranks[0]["framework"],
        "inspect": _inspect(ranks, frame, waited, alignment, sources, notes, opened),
        "observed_orders": [o for r in ranks for o in r["observed_orders"]],
        "bucket_sweep": _bucket_sweep(
            ranks,
            planned_reference["network"],
            network,
            untraced_step_time,
            (reference, reference_untraced_step_time),
        ),  # fmt: skip
        "plans": plans,
        "priorities": stages.plans_document(plans, material),
    }


def _report(
    replays: list[dict[str, Any]], metrics: dict[str, Any], joined: dict[str, Any]
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(`planner.report/1`, the replayed ranks' records in rank order) from the second
    pass's records, the job's metrics and what was `_joined` of the summaries."""
    from planner.export.caramel_files import control_deps_document
    from planner.job import stages
    from planner.job.rank_replay import job_simulation
    from planner.job.verdict import with_verdict
    from planner.version import __version__

    simulation = job_simulation(replays, joined["framework"], joined["sources"])
    done = sorted((r for r in replays if "error" not in r), key=lambda r: r["rank"])
    simulation["timelines"] = [s for r in done if r["timelines"] for s in r["timelines"]]
    report: dict[str, Any] = {
        "schema": "planner.report/1",
        "planner_version": __version__,
        "inspect": joined["inspect"],
        "plans": {"caramel": joined["priorities"]},
        "metrics": metrics,
        "observed_orders": joined["observed_orders"],
        "simulation": simulation,
        "exports": {},
    }
    report["bucket_sweep"] = joined["bucket_sweep"]
    report["exports"]["control_deps"] = control_deps_document(joined["plans"])
    bucket_plan = {"schema": "planner.bucket_plan/1", "ranks": [r["bucket_plan"] for r in done]}
    stages.add_predictions(bucket_plan, simulation)
    report["exports"]["bucket_plan"] = bucket_plan
    return with_verdict(report), done


def _first_pass_loading(records: Iterable[dict[str, Any]], samples: int) -> list[dict[str, Any]]:
    """The first pass's records, taken while this process loads the replay's compiled loop
    (`_simkernel.warm`, in a thread) once a rank is large enough to need it.

    A local pool's second pass is forked from this process after the first pass, so
    that its workers share one copy of the loop (about 100 MiB and 0.5 s of CPU a
    process) instead of each loading its own; the first pass's workers never load it.
    The thread runs while they read the ranks, when this process would only wait."""
    from planner.prediction import _simkernel

    failed: list[BaseException] = []

    def load() -> None:
        try:
            _simkernel.warm()
        except BaseException as exc:  # raised again in this thread, below
            failed.append(exc)

    loading: threading.Thread | None = None
    results = []
    for record in records:
        results.append(record)
        if loading is None and _simkernel.loads_compiled(
            record.get("inspect", {}).get("ops", 0), samples
        ):
            loading = threading.Thread(target=load, name="planner-warm", daemon=True)
            loading.start()
    if loading is not None:
        loading.join()
    if failed:
        raise failed[0]
    return results


def _label_graphs(records: Sequence[Mapping[str, Any]]) -> dict[str, OpGraph]:
    """Rank -> a graph of the ops its timelines name, without edges: what timeline.json
    reads of a rank's DAG (each op's kind, phase, parameter and bytes)."""
    from planner.model.graph import OpGraph

    empty = np.zeros(0, dtype=np.int64)
    return {
        r["rank"]: OpGraph(ops=r["ops"], src=empty, dst=empty, control=np.zeros(0, dtype=bool))
        for r in records
        if "ops" in r
    }


def _inspect(
    ranks: Sequence[Mapping[str, Any]],
    frame: Any,
    waited: Mapping[str, Mapping[tuple[int, str], int]],
    alignment: Any,
    sources: list[str],
    notes: Sequence[str],
    opened: Mapping[str, Mapping[str, float]],
) -> dict[str, Any]:
    """`planner.inspect/1` of the job from the ranks' entries: each transfer's oracle
    time with the waits cut out (`pipeline._open_times`, from `opened` when the plan's
    inputs computed them) and its mean wait for peers."""
    from planner.job.pipeline import _open_times, with_communication
    from planner.measure.inspection import waits_by_op

    mean_wait = waits_by_op(frame["rank"], frame["op"], frame["wait"])
    entries = []
    for r in ranks:
        entry = dict(r["inspect"])
        times = opened.get(r["rank"])
        if times is None:
            times = _open_times(r["bounds"], r["caramel"], waited.get(r["rank"], {}))
        entry["transfers"] = [
            {
                **t,
                "time": times.get(t["name"], 0.0) if t["time"] is not None else None,
                "wait_mean": float(mean_wait.get((r["rank"], t["name"]), 0.0)),
            }
            for t in entry["transfers"]
        ]
        entries.append(entry)
    document = {
        "schema": "planner.inspect/1",
        "framework": ranks[0]["framework"],
        "sources": sources,
        "notes": [n for r in ranks for n in r["notes"]] + list(notes),
        "ranks": entries,
        "clock_alignment": alignment,
    }
    return with_communication(document, ranks)


def _bucket_sweep(
    ranks: Sequence[Mapping[str, Any]],
    fitted: NetworkModel | None,
    network: NetworkModel | None,
    untraced_step_time: float | None,
    reference: tuple[Job | None, float | None] = (None, None),
) -> dict[str, Any] | None:
    """`stages.bucket_sweep` on the joined profile (`joined_profile`) with the
    benchmark model when given, else the trace's fit of every rank's transfers; with
    the reference trace and its untraced step time (`buckets.backward_factor`)."""
    from planner.job import stages

    profile = joined_profile(ranks)
    model = network or fitted
    if model is None:
        return None if profile is None else stages.no_network_sweep()
    if profile is None:
        return None
    ref = stages.reference_profile(reference[0])
    return stages.profile_sweep(profile, model, fitted, network, untraced_step_time, ref,
                                  reference[1])  # fmt: skip
