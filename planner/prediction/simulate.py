"""Discrete-event simulation of an OpGraph under a plan: replay, plan comparison, what-if.

List scheduling (TicTac §3.1): every op runs on its resource for its oracle time; a
resource runs one op at a time per channel, and when a channel frees up the resource
takes a ready op with the lowest priority number, drawing uniformly among those tied
on it and the unprioritized ops. A plan's control edges are extra dependencies. Each
sample is fixed by `seed` and its sample number, so results are deterministic.

`simulation` (here) runs the pieces on one job, each in a module of its own:

- `planner.prediction.replay.replay`: each traced step with its own op times and its
  observed order (priority = start order per resource); ``replay_error = predicted /
  measured - 1`` against the step's busy makespan (its span less the idle time in which
  no op of the rank ran, as `planner.measure.metrics` defines the makespan m). One step
  as the replay runs it is `planner.prediction.step_model`; the waits lent by the other
  steps `overheads`; the releases from outside the rank `releases`; the cause of a miss
  `critical_path`; the error summaries `fidelity`.
- `planner.prediction.comparison.compare`: baseline (no priorities: random order),
  observed and any given plans on the same DAG and oracle: predicted iteration time
  (mean of N samples and percentiles), speedup vs the baseline mean and vs observed,
  efficiency E, overlap alpha — beside the replay error of the rank, so no prediction
  comes without it. Its samples are run by `planner.prediction.event_loop` on the
  arrays of `planner.prediction.compiled`.
- `planner.prediction.whatif.sweep`: the comparison over one what-if knob (TicTac
  Figures 7 and 10); `planner.prediction.timelines`: the schedules to look at.

What-if knobs: ``bandwidth_scale`` divides transfer times, ``compute_scale`` divides
compute times, ``latency`` (s) is added to each transfer, ``channels`` is the number
of concurrent transfers per network resource (each at the op's full oracle time; pair
it with ``bandwidth_scale = 1/channels`` to model one shared link).

All functions return JSON-ready dicts with ``"schema": "planner.simulation/1"``; times
are seconds. The loop itself lives in `planner.prediction._simkernel` (numba when installed).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from planner.model.oracle import mean_of_runs
from planner.model.plan import Plan
from planner.model.trace import Job
from planner.prediction.comparison import compare
from planner.prediction.replay import SCHEMA, _frame, job_arrays, replay, replayed_steps
from planner.prediction.timelines import timelines_of
from planner.prediction.whatif import sweep


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
    **knobs: float,
) -> dict[str, Any]:
    """Replay, comparison (and a sweep when `sweep_knob` is given) of one job; a TF
    plan's replay as `enforce` applies it (`replay`).

    With `timelines`, ``timelines`` lists the schedule of every plan per rank (its
    median sample) and the traced step with the median busy makespan (plan
    ``measured``), ready for `planner.export.chrome_trace.chrome_trace`; the graphs
    are not in the document (pass `job.graphs[rank]` for labels).
    """
    frame = _frame(job)
    oracles = {
        rank: mean_of_runs(graph, frame[frame["rank"] == rank])
        for rank, graph in job.graphs.items()
    }
    arrays = job_arrays(job, frame)  # each rank's graph compiled once, for every piece
    replayed = replay(job, seed=seed, frame=frame, plans=plans, enforce=enforce, arrays=arrays)
    steps = replayed_steps(replayed)
    comparison = compare(
        job, plans, samples=samples, seed=seed, timelines=timelines, oracles=oracles,
        frame=frame, replayed=steps, arrays=arrays, **knobs,
    )  # fmt: skip
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "kind": "simulation",
        "framework": job.framework,
        "sources": list(job.sources),
        "replay": replayed,
        "comparison": comparison,
        "sweep": None,
    }
    if sweep_knob is not None:
        document["sweep"] = sweep(
            job, sweep_knob, sweep_values, plans, samples=samples, seed=seed, oracles=oracles,
            frame=frame, replayed=steps, arrays=arrays, **knobs,
        )  # fmt: skip
    if timelines:
        document["timelines"] = timelines_of(job, comparison)
    return document
