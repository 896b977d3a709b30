"""A job's analyses end to end. `metrics` and Caramel's plan (`schedule`) run one way:
each rank through the rank stage (`planner.job.summaries.summary_of`), then the job
level folds the ranks' results (`planner.job.pipeline`). A job loaded whole in this
process runs its ranks here (`rank_results`); `planner.job.parallel` maps the same rank
stage over a pool or Dask, one rank's input per task, and folds the same way: one
answer, byte for byte, whatever the mapper. `analyze` joins them with the replay of the
whole job (`planner.prediction.simulate`; per rank: `planner.job.rank_analysis`).

Every document carries ``"schema": "planner.<kind>/<version>"``; times are seconds,
sizes bytes. The CLI only renders these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from planner.errors import InputError
from planner.export.caramel_files import bucket_plan_document, control_deps_document
from planner.job import pipeline, shown_ranks, stages, summaries
from planner.job.stages import (  # noqa: F401 (the stages the API and the CLI call by this name)
    ALGORITHMS,
    algorithms_for,
    inspect,
    oracles,
    plan_document,
)
from planner.job.verdict import with_verdict
from planner.model.oracle import NetworkModel, TimeOracle
from planner.model.plan import Plan
from planner.model.trace import Job
from planner.version import __version__


def rank_view(job: Job, rank: str) -> Job:
    """`job` seen by one of its ranks, as a pool's task reads that rank alone: its graph,
    its rows of the trace (`Trace.of_rank`), the job's sources, notes and meta. A job of
    one rank is its own view."""
    if list(job.graphs) == [rank]:
        return job
    trace = job.trace.of_rank(rank)
    return Job(job.framework, {rank: job.graphs[rank]}, trace, job.sources, job.notes, job.meta)


@dataclass
class RankResults:
    """Every rank's summary (`summaries.summary_of`, what a pool's task returns), what the
    job level folds of them (`summaries.fold`) and the waits for peers the load found
    (`pipeline.loaded_waits`): the input of every job-level join."""

    summaries: list[dict[str, Any]]
    folded: summaries.Folded
    waits: pipeline.Waits


def rank_results(
    job: Job,
    oracle: Mapping[str, TimeOracle] | None = None,
    plans: bool = False,
    metrics: bool = True,
) -> RankResults:
    """Each rank of `job` through the rank stage (`summary_of`, with the terms of the
    job's Caramel plan when `plans`, its metrics unless not `metrics`), in this process,
    folded as a pool's parent folds them. `oracle`: the job's `oracles`, when a caller
    has them (computed once); else each rank's from its view, as a pool's task does."""
    folded = summaries.Folded()
    fold = summaries.fold(folded)
    found = [
        fold(
            summaries.summary_of(
                rank_view(job, rank),
                job.sources,
                plans,
                {rank: oracle[rank]} if oracle else None,
                metrics,
            )
        )  # fmt: skip
        for rank in job.ranks
    ]
    alignment = job.meta.get("clock_alignment")
    aligned = alignment if isinstance(alignment, dict) else None
    return RankResults(found, folded, pipeline.loaded_waits(found, aligned))


def metrics(
    job: Job, oracle: Mapping[str, TimeOracle] | None = None, ranks: RankResults | None = None
) -> dict[str, Any]:
    """`planner.metrics/1`: per-step figures, per-rank summaries and the oracle bounds,
    joined from the ranks' summaries by `pipeline.job_metrics`. `oracle`: the job's
    `oracles`, `ranks`: its `rank_results`, when a caller has them (computed once)."""
    if not job.trace.rows:
        source = job.sources[0] if job.sources else None
        raise InputError(source, "metrics need timings; input has none")
    ranks = ranks or rank_results(job, oracle)
    document = pipeline.job_metrics(ranks.summaries, ranks.waits)
    if "horovod" in job.meta:  # a Horovod timeline's negotiation wait vs transfer per step
        document["horovod"] = job.meta["horovod"]
    return document


def schedule(
    job: Job,
    algorithm: str,
    oracle: Mapping[str, TimeOracle] | None = None,
    channels: int = 1,
    network: NetworkModel | None = None,
    ranks: RankResults | None = None,
) -> dict[str, Plan]:
    """One plan per rank: TIC (graph only) or TAC per rank (`stages.ps_plans`), or
    Caramel's one plan for the job (`caramel_plans`). `network`: a benchmark model for
    Caramel where the trace's fit does not hold."""
    stages.check_applies(job, algorithm)
    if algorithm != "caramel":
        return stages.ps_plans(job, algorithm, oracle)
    ranks = ranks or rank_results(job, oracle, plans=True, metrics=False)
    return caramel_plans(job, ranks, channels, network)


def caramel_plans(
    job: Job, ranks: RankResults, channels: int = 1, network: NetworkModel | None = None
) -> dict[str, Plan]:
    """Caramel's one plan for the job, on every rank with collectives: the ranks' terms
    joined (`pipeline.caramel_inputs`: each op's time the largest over the ranks, the
    waits for peers cut out, the network fitted to every rank's transfers), planned on
    the reference rank's DAG (`pipeline.plan_on`) and given to every rank with the
    control edges every rank holds (`stages.caramel_rank_plans`): as a pool plans it."""
    planned, inputs = pipeline.caramel_inputs(ranks.summaries, ranks.folded.times, ranks.waits)
    reference = planned[0]["rank"]
    found = pipeline.plan_on(job.graphs[reference], reference, **inputs, channels=channels,
                             benchmark=network)  # fmt: skip
    ops_of = {r["rank"]: job.graphs[r["rank"]].ops for r in planned}
    source = job.sources[0] if job.sources else None
    return stages.caramel_rank_plans(found["plan"], ops_of, source, ranks.folded.holds())


def simulation(
    job: Job,
    plans: Mapping[str, Mapping[str, Plan]] | None = None,
    *,
    samples: int = 100,
    seed: int = 0,
    sweep_knob: str | None = None,
    sweep_values: Sequence[float] = (),
    timelines: bool = False,
    enforce: str | None = "arrival",
    ranks: RankResults | None = None,
    **knobs: float,
) -> dict[str, Any]:
    """`planner.simulation/1`: the replay of the traced steps, the plans' comparison (and a
    sweep of `sweep_knob`). A PyTorch all-reduce job (every rank with collectives, Caramel's
    plan or none) runs its ranks one by one as a pool's tasks do (`per_rank_replay`:
    each rank's ready times and waits, then its replay with its peers' releases); a
    parameter-server job, whose TIC/TAC plans and TF executor pools have no per-rank
    path, is replayed whole (`planner.prediction.simulate.simulation`, a TF plan as
    `enforce` applies it). `ranks`: the job's `rank_results`, when a caller has them."""
    if not per_rank_replay(job, plans):
        from planner.prediction import simulate

        return with_fsdp_whatif(job, simulate.simulation(
            job, plans, samples=samples, seed=seed, sweep_knob=sweep_knob,
            sweep_values=sweep_values, timelines=timelines, enforce=enforce, **knobs,
        ))  # fmt: skip
    from planner.job import rank_replay

    ranks = ranks or rank_results(job, plans=True, metrics=False)
    views = {rank: rank_view(job, rank) for rank in job.ranks}
    ready = [rank_replay.ready_summary(views[r["rank"]], job.sources, r) for r in ranks.summaries]
    released = rank_replay.releases(ready)
    options = {"samples": samples, "seed": seed, "sweep_knob": sweep_knob,
               "sweep_values": list(sweep_values), "knobs": knobs}  # fmt: skip
    caramel = (plans or {}).get("caramel") or {}
    # each view's trace holds the job's waits for peers: none to put in (None)
    records = [
        rank_replay.simulation_of(
            views[rank], None, released.get(rank, {}), caramel.get(rank), options, timelines
        )
        for rank in job.ranks
    ]
    document = rank_replay.job_simulation(records, job.framework, job.sources)
    if timelines:
        document["timelines"] = [s for r in records for s in r["timelines"] or []]
    return document


def with_fsdp_whatif(job: Job, document: dict[str, Any]) -> dict[str, Any]:
    """`document` with the FSDP what-if (``fsdp_whatif``) where `job` reduce-scatters
    (`planner.prediction.fsdp_whatif`): prefetch, resharding and unit size replayed."""
    from planner.prediction.fsdp_whatif import fsdp_whatif

    found = fsdp_whatif(job)
    if found is not None:
        document["fsdp_whatif"] = found
    return document


def per_rank_replay(job: Job, plans: Mapping[str, Any] | None) -> bool:
    """Whether `simulation` replays `job` rank by rank: a PyTorch job whose every rank
    has collectives and no parameter-server recvs, every rank of its trace analysed (not
    one rank selected from its job), planned with Caramel or not at all."""
    return (
        job.framework == "pytorch"
        and set(plans or {}) <= {"caramel"}
        and set(job.trace.ranks) == set(job.graphs)
        and all(stages.has_collectives(g) and not g.recvs for g in job.graphs.values())
    )


def analyze(
    job: Job,
    samples: int = 100,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    network: NetworkModel | None = None,
    untraced_step_time: float | None = None,
    reference: Job | None = None,
    reference_untraced_step_time: float | None = None,
) -> dict[str, Any]:
    """`planner.report/1`: inspect, the plans that apply, metrics and the simulation.

    The simulation replays the traced steps (with the replay error) and compares the
    plans against the random-order baseline; its schedules (`timelines`: the traced
    median step and each plan's median sample) are for the timeline export and the
    HTML report: every rank's up to `TIMELINE_RANKS` ranks, above only those of
    `timeline_ranks` (as `planner.job.rank_analysis`, the same report per rank). `progress`
    is told the name of each stage as it starts. `untraced_step_time`: the job's step
    time without the profiler, for the bucket advice (`bucket_sweep`), as are
    `reference` (the job traced with one bucket) and its untraced step time.
    """
    step = progress or (lambda _stage: None)
    timed = bool(job.trace.rows)
    if timed and per_rank_replay(job, dict.fromkeys(stages.algorithms_for(job))):
        step(f"ranks, one by one ({samples} samples per plan)")
        done = analyze_ranks(
            job, samples=samples, seed=seed, network=network,
            untraced_step_time=untraced_step_time, reference=reference,
            reference_untraced_step_time=reference_untraced_step_time,
        )  # fmt: skip
        if done is not None:
            return done
    step("time oracle")
    oracle = oracles(job) if timed else None
    ranks = None
    if timed:
        step("ranks")
        ranks = rank_results(job, oracle, plans="caramel" in stages.algorithms_for(job))
    plans = {}
    for name in stages.algorithms_for(job):
        step(f"planning {name}")
        plans[name] = schedule(job, name, oracle, network=network, ranks=ranks)
    step("metrics")
    report: dict[str, Any] = {
        "schema": "planner.report/1",
        "planner_version": __version__,
        "inspect": stages.inspect(job, oracle),
        "plans": {name: stages.plan_document(p, job.graphs, job.meta) for name, p in plans.items()},
        "metrics": metrics(job, oracle, ranks) if timed else None,
        "observed_orders": stages.observed_orders(job) if timed else [],
        "simulation": None,
        "exports": {},
    }
    if timed:
        step(f"simulating ({samples} samples per plan)")
        report["simulation"] = simulation(
            job, plans, samples=samples, seed=seed, timelines=True, ranks=ranks
        )
        if report["metrics"] is not None and len(job.ranks) > shown_ranks.TIMELINE_RANKS:
            kept = shown_ranks.timeline_ranks(job.ranks, report["metrics"])
            timelines = report["simulation"]["timelines"]
            report["simulation"]["timelines"] = [s for s in timelines if s["rank"] in kept]
    report["bucket_sweep"] = None
    if "caramel" in plans:
        report["bucket_sweep"] = stages.bucket_sweep(
            job, network, untraced_step_time, reference, reference_untraced_step_time
        )
    if "caramel" in plans:
        report["exports"]["control_deps"] = control_deps_document(plans["caramel"])
        bucket_plan = bucket_plan_document(plans["caramel"], job.graphs, job.meta)
        stages.add_predictions(bucket_plan, report["simulation"])
        report["exports"]["bucket_plan"] = bucket_plan
    return with_verdict(report)


def analyze_ranks(
    job: Job,
    *,
    samples: int = 100,
    seed: int = 0,
    network: NetworkModel | None = None,
    untraced_step_time: float | None = None,
    reference: Job | None = None,
    reference_untraced_step_time: float | None = None,
) -> dict[str, Any] | None:
    """`analyze` of a PyTorch all-reduce job (`per_rank_replay`), rank by rank in this
    process through the two passes a pool runs (`planner.job.rank_analysis.report_ranks`),
    each task given the rank's view (`rank_view`, without the job's notes: the job
    level adds them once) instead of its files; None where that path refuses the job."""
    from planner.job import rank_analysis

    views = [replace(rank_view(job, rank), notes=()) for rank in job.ranks]
    done = rank_analysis.report_ranks(
        views, 1, samples=samples, seed=seed, network=network, notes=job.notes,
        untraced_step_time=untraced_step_time, reference=reference,
        reference_untraced_step_time=reference_untraced_step_time, sources=job.sources,
    )  # fmt: skip
    return None if done is None else done[0]
