"""A job's analyses end to end, one way: each rank through the stage functions
(`planner.job.stages`, `planner.job.summaries.summary_of`), then the job level folds the
ranks' results (`planner.job.pipeline`). A job loaded whole in this process runs its ranks
here; `planner.job.parallel` maps the same rank stage over a pool or Dask, one rank's
input per task, and folds the same way: one answer, byte for byte, whatever the mapper.

Every document carries ``"schema": "planner.<kind>/<version>"``; times are seconds,
sizes bytes. The CLI only renders these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from planner.errors import InputError
from planner.export.caramel_files import bucket_plan_document, control_deps_document
from planner.job import pipeline, stages
from planner.job.stages import (  # noqa: F401 (the stages the API and the CLI call by this name)
    ALGORITHMS,
    algorithms_for,
    inspect,
    oracles,
    plan_document,
    schedule,
)
from planner.job.summaries import summary_of
from planner.job.verdict import with_verdict
from planner.model.oracle import NetworkModel, TimeOracle
from planner.model.trace import Job
from planner.version import __version__


def rank_view(job: Job, rank: str) -> Job:
    """`job` seen by one of its ranks: its graph, the trace rows of it (the shared
    table; each stage reads its rank's rows), the job's sources and meta."""
    return Job(job.framework, {rank: job.graphs[rank]}, job.trace, job.sources, job.notes, job.meta)


def metrics(job: Job, oracle: Mapping[str, TimeOracle] | None = None) -> dict[str, Any]:
    """`planner.metrics/1`: per-step figures, per-rank summaries and the oracle bounds;
    each rank's summary (`summary_of`, as a pool's task makes it), folded by
    `pipeline.job_metrics`. `oracle`: the job's `oracles`, when a caller has them already
    (computed once, handed on)."""
    if not len(job.trace.timings):
        source = job.sources[0] if job.sources else None
        raise InputError(source, "metrics need timings; input has none")
    oracle = oracle or oracles(job)
    results = [
        summary_of(rank_view(job, rank), job.sources, oracle={rank: oracle[rank]})
        for rank in job.ranks
    ]
    return pipeline.job_metrics(results)


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
    timed = bool(len(job.trace.timings))
    step("time oracle")
    oracle = stages.oracles(job) if timed else None
    plans = {}
    for name in stages.algorithms_for(job):
        step(f"planning {name}")
        plans[name] = stages.schedule(job, name, oracle, network=network)
    step("metrics")
    report: dict[str, Any] = {
        "schema": "planner.report/1",
        "planner_version": __version__,
        "inspect": stages.inspect(job, oracle),
        "plans": {name: stages.plan_document(p, job.graphs, job.meta) for name, p in plans.items()},
        "metrics": metrics(job, oracle) if timed else None,
        "observed_orders": stages.observed_orders(job) if timed else [],
        "simulation": None,
        "exports": {},
    }
    if timed:
        step(f"simulating ({samples} samples per plan)")
        from planner.prediction import simulate

        report["simulation"] = simulate.simulation(
            job, plans, samples=samples, seed=seed, timelines=True
        )
        if report["metrics"] is not None and len(job.ranks) > stages.TIMELINE_RANKS:
            kept = stages.timeline_ranks(job.ranks, report["metrics"])
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
