"""The plan comparison: baseline (random order), observed and each plan on the same DAG and
mean op times (`compare`), with TicTac's bounds, Caramel's overlap and batching, the
what-if knobs (`KNOBS`) and each plan's replayed gain beside the comparison's own error.
Apart from the replay, whose steps it reads, because it samples whole iterations of a
mean oracle instead."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from planner.errors import InputError
from planner.measure.metrics import efficiency
from planner.model.oracle import TimeOracle, mean_of_runs
from planner.model.plan import Plan
from planner.model.trace import Job, busy_time
from planner.planning import hook_calls
from planner.planning.ticks import TICKS_PER_SECOND
from planner.prediction import _simkernel, enforced, hook_cost
from planner.prediction.compiled import (
    Compiled,
    KnownRows,
    _device_ops,
    _plan_parts,
    capacities,
    observed_priorities,
    op_seconds,
    rank_arrays,
    rank_rows,
    to_ticks,
)
from planner.prediction.event_loop import Run, _stats, bounds, overlap, run, timeline
from planner.prediction.fidelity import RELIABLE, _error_summary
from planner.prediction.replay import SCHEMA, _frame, job_arrays, replay, replayed_steps

KNOBS: dict[str, float] = {
    "bandwidth_scale": 1.0,
    "compute_scale": 1.0,
    "latency": 0.0,
    "channels": 1,
}


REFERENCE_PLANS = ("baseline", "observed")


def _comparison_error(
    entries: Sequence[dict[str, Any]], steps: Sequence[dict[str, Any]], knobs: Mapping[str, float]
) -> dict[str, Any]:
    """The comparison's own error, like with like (`observed_times` says how its sample
    is timed): its busy time for the observed order (mean op times, no gaps, one op at
    a time per resource) against the mean measured busy time of the complete steps
    (``comparison_error``), its wall-clock time against their mean wall-clock time
    (``comparison_wall_error``). Meaningful only without what-if knobs; a warning
    naming each one above `RELIABLE`."""
    observed = next((e for e in entries if e["plan"] == "observed"), None)
    complete = [s for s in steps if not s.get("partial") and s["measured"] > 0]
    none = {"comparison_error": None, "comparison_wall_error": None, "comparison_warning": None}
    if observed is None or not complete or any(knobs[k] != v for k, v in KNOBS.items()):
        return none
    error = observed["predicted_busy"] / float(np.mean([s["measured"] for s in complete])) - 1.0
    walls = [s["wall"] for s in complete if s.get("wall")]
    wall = observed["predicted_wall"] / float(np.mean(walls)) - 1.0 if walls else None
    off = [
        f"{e * 100:+.1f}% off the measured {what} (predicted {what} against measured {what})"
        for e, what in ((error, "busy time"), (wall, "wall-clock time"))
        if e is not None and abs(e) > RELIABLE
    ]
    warning = None
    if off:
        warning = (
            f"the plan comparison predicts the observed order {' and '.join(off)} (mean op "
            "times, no gaps, one op at a time per resource): its plan gains are uncertain "
            "by as much; each plan's replayed gain (the traced steps replayed with the plan, "
            "the replay error above being its error) is the one to go by"
        )
    return {"comparison_error": error, "comparison_wall_error": wall, "comparison_warning": warning}


def _knobs(**given: float) -> dict[str, float]:
    knobs = {**KNOBS}
    for name, value in given.items():
        if name not in KNOBS:
            raise InputError(None, f"unknown knob {name!r} (choose from {', '.join(KNOBS)})")
        knobs[name] = value
    knobs["channels"] = int(knobs["channels"])
    return knobs


def batching(
    compiled: Compiled, seconds: np.ndarray, plan: Plan
) -> tuple[np.ndarray, tuple[tuple[str, str], ...], int]:
    """Caramel's batches (§4.2) as the simulator sees them.

    A batch is sent once its last member is ready, as one transfer of the summed bytes:
    a + b * sum(d) instead of sum(a + b * d). So the first member in plan order waits
    for every member's producers (extra edges), and each later member is charged its
    time less the latency `a` of the network model it was planned with. Split depth is
    not simulated: one channel carries the chunks back to back, which the linear model
    prices the same. Returns (op seconds, extra edges, number of batches of 2+).
    """
    groups = [g for g in plan.inputs.get("groups", ()) if len(g.get("params", ())) > 1]
    network = plan.inputs.get("network") or {}
    if not groups or not network:
        return seconds, (), 0
    latency = float(network.get("a", 0.0))
    adjusted = seconds.copy()
    edges: list[tuple[str, str]] = []
    position = {name: i for i, name in enumerate(plan.order)}
    for group in groups:
        members = sorted(
            (m for m in group["params"] if m in compiled.index),
            key=lambda m: position.get(m, len(position)),
        )
        if len(members) < 2:
            continue
        first = members[0]
        for member in members[1:]:
            i = compiled.index[member]
            adjusted[i] = max(0.0, adjusted[i] - latency)
            edges.extend((p, first) for p in _predecessors(compiled, i) if p != first)
    return adjusted, tuple(dict.fromkeys(edges)), len(groups)


def _predecessors(compiled: Compiled, i: int) -> list[str]:
    """The predecessors of op `i`, in the order of their first edge into it (as the
    graph's networkx view lists them; (speed) without building that view)."""
    names = compiled.names
    return list(dict.fromkeys(names[u] for u in compiled.src[compiled.dst == i].tolist()))


def _compare_rank(
    compiled: Compiled,
    rows: pd.DataFrame,
    known: KnownRows,
    seconds: np.ndarray,
    plans: Mapping[str, Plan],
    channels: int,
    samples: int,
    seed: int,
    timelines: bool,
    hooked: bool = False,
) -> list[dict[str, Any]]:
    """Entries of baseline, observed and `plans` for one rank (same DAG and op times);
    `rows`: the rank's rows, `known` their `op_rows`; `hooked`: a plan runs through
    planner's DDP hook, whose calls take time on the ops that launch its collectives
    (`hook_cost`)."""
    umax, lmin = bounds(compiled, seconds, capacities(compiled, channels))
    runs: dict[str, Run] = {}
    extra: dict[str, dict[str, Any]] = {}
    runs["baseline"] = run(
        compiled, seconds, None, channels=channels, samples=samples, seed=seed, record=True
    )
    steps = observed_priorities(compiled, rows, known)
    if steps:
        per_step = max(1, -(-samples // len(steps)))
        step_runs = [
            run(
                compiled,
                seconds,
                priority,
                channels=channels,
                samples=per_step,
                seed=seed,
                record=True,
            )
            for _, priority in steps
        ]
        means = np.array([r.makespan.mean() for r in step_runs])
        pick = int(np.argsort(means, kind="stable")[(len(means) - 1) // 2])
        chosen = step_runs[pick]
        makespan = np.concatenate([r.makespan for r in step_runs])
        runs["observed"] = Run(makespan, chosen.seconds, chosen.recorded, chosen.start, chosen.lane)
        extra["observed"] = {"iteration": steps[pick][0]}
    for name, plan in plans.items():
        runs[name], extra[name] = _plan_run(
            compiled, seconds, plan, channels, samples, seed, hooked
        )
    if "observed" in runs:
        extra["observed"].update(observed_times(compiled, runs["observed"]))
    base = float(runs["baseline"].makespan.mean())
    observed = float(runs["observed"].makespan.mean()) if "observed" in runs else None
    out = []
    for name, result in runs.items():
        stats = _stats(result.makespan)
        t = stats["predicted"]
        entry: dict[str, Any] = {
            "plan": name,
            **stats,
            "speedup_vs_baseline": base / t - 1.0 if t > 0 else None,
            "speedup_vs_observed": observed / t - 1.0 if t > 0 and observed else None,
            "efficiency": efficiency(umax, lmin, t),
            **overlap(compiled, result),
            **extra.get(name, {}),
        }
        if timelines:
            entry["timeline"] = timeline(compiled, result)
        out.append(entry)
    return out


def _plan_run(
    compiled: Compiled,
    seconds: np.ndarray,
    plan: Plan,
    channels: int,
    samples: int,
    seed: int,
    hooked: bool,
) -> tuple[Run, dict[str, Any]]:
    """`plan`'s samples on the rank's DAG (`_compare_rank`) and the figures its entry
    adds: the groups it batched, the time of its hook's calls (on the ops that launch its
    collectives, `hook_cost`), or that it orders nothing."""
    extra: dict[str, Any] = {}
    priority, control = _plan_parts(plan)
    plan_seconds, batch_edges, batched = batching(compiled, seconds, plan)
    if hooked and hook_calls.calls(plan):
        launchers, cost, extra["hook_seconds"] = hook_cost.hook_time(compiled, plan, seconds)
        plan_seconds = plan_seconds.copy()
        plan_seconds[launchers] += cost
    if batched:
        extra["batched_groups"] = batched
    ran = run(compiled, plan_seconds, priority, (*control, *batch_edges), channels=channels,
              samples=samples, seed=seed, record=True)  # fmt: skip
    if not priority and not control:
        extra = {"note": "plan orders nothing: same as baseline"}
    return ran, extra


def observed_times(compiled: Compiled, observed: Run) -> dict[str, float]:
    """The observed order's recorded sample timed as a traced step is:
    ``predicted_busy``, the union of the spans of the ops a step's busy time counts
    (a GPU rank's device work, `_device_ops`; every op on a CPU rank), and
    ``predicted_wall``, from the first of those ops' start to the last op's end (a GPU
    step's clock starts at its first device op)."""
    assert observed.start is not None
    device = _device_ops(compiled)
    timed = device if device.any() else np.ones(len(device), dtype=bool)
    start, took = to_ticks(observed.start), to_ticks(observed.seconds)
    busy = busy_time(start[timed], took[timed]) / TICKS_PER_SECOND
    wall = float((observed.start + observed.seconds).max() - observed.start[timed].min())
    return {"predicted_busy": float(busy), "predicted_wall": wall}


def replayed_plan(steps: Sequence[Mapping[str, Any]], name: str) -> dict[str, Any] | None:
    """A plan's prediction by the replay (`_replay_plans`), over the rank's complete
    steps: median ``predicted_wall`` (s) and median ``gain`` over the observed order
    replayed on the same steps, the ``steps`` it ran on and the first ``error`` of a
    step it could not run on, ``enforce``: the TF module's mode it ran as (None: its
    order and edges as they are) and ``caution``: what that mode's replay is known to
    miss (`enforced.caution`). The observed order is the replay itself (gain 0);
    None for a plan the steps were not replayed with (the baseline orders nothing)."""
    complete = [s for s in steps if not s.get("partial")]
    if name == "observed":
        runs = [{"predicted_wall": s["predicted_wall"], "gain": 0.0} for s in complete]
    else:
        runs = [s.get("plans", {}).get(name) for s in complete]
        if not complete or any(r is None for r in runs):
            return None
    ran = [r for r in runs if r.get("gain") is not None]
    failed = next((r["error"] for r in runs if "error" in r), None)
    return {
        "predicted_wall": float(np.median([r["predicted_wall"] for r in ran])) if ran else None,
        "gain": float(np.median([r["gain"] for r in ran])) if ran else None,
        "steps": len(ran),
        "error": failed,
        "enforce": (mode := next((r["enforce"] for r in ran if r.get("enforce")), None)),
        "caution": enforced.caution(mode),
    }


def compare(
    job: Job,
    plans: Mapping[str, Mapping[str, Plan]] | None = None,
    *,
    samples: int = 100,
    seed: int = 0,
    timelines: bool = False,
    oracles: Mapping[str, TimeOracle] | None = None,
    frame: pd.DataFrame | None = None,
    replayed: Mapping[str, Sequence[dict[str, Any]]] | None = None,
    arrays: Mapping[str, tuple[Compiled, KnownRows]] | None = None,
    **knobs: float,
) -> dict[str, Any]:
    """Baseline, observed and the given plans ({name: {rank: Plan}}) on each rank.

    Every rank entry carries its oracle bounds, its replay errors and one entry per
    plan: predicted iteration time (mean of `samples`), p5/p50/p95/min/max, speedups
    vs the baseline mean and vs observed, efficiency E (TicTac §3.2) and Caramel's
    overlap alpha (of the median sample). `timelines` adds that sample's schedule per
    plan (see `planner.export.chrome_trace`). `knobs`: see `KNOBS`. `oracles` and
    `frame` (`with_dedicated` timings) default to the mean-of-runs oracle of the trace;
    `replayed` (rank -> the steps of a `replay`) saves replaying the traced steps again,
    `arrays` (rank -> `rank_arrays` of its graph and its rows of `frame`) compiling its
    graph and looking up its rows again.
    """
    plans = plans or {}
    for name in plans:
        if name in REFERENCE_PLANS:
            raise InputError(None, f"plan name {name!r} is reserved")
    settings = _knobs(**knobs)
    frame = _frame(job) if frame is None else frame
    if replayed is None or any(rank not in replayed for rank in job.ranks):
        arrays = job_arrays(job, frame) if arrays is None else arrays  # for both
        again = replayed_steps(replay(job, seed=seed, frame=frame, arrays=arrays))
        replayed = {**again, **(replayed or {})}
    scales = {k: settings[k] for k in ("bandwidth_scale", "compute_scale", "latency")}
    ranks = []
    for rank in job.ranks:
        graph = job.graphs[rank]
        rows = rank_rows(frame, rank)
        compiled, known = (arrays or {}).get(rank) or rank_arrays(graph, rows)
        oracle = oracles[rank] if oracles is not None else mean_of_runs(graph, rows)
        steps = replayed[rank]
        of_rank = {name: p[rank] for name, p in plans.items() if rank in p}
        seconds = op_seconds(compiled, oracle, **scales)
        channels = int(settings["channels"])
        entries = _compare_rank(
            compiled, rows, known, seconds, of_rank, channels, samples, seed, timelines,
            hooked=job.framework == "pytorch",
        )  # fmt: skip
        umax, lmin = bounds(compiled, seconds, capacities(compiled, channels))
        transfer = float(seconds[compiled.transfer].sum())
        compute = float(seconds[~compiled.transfer].sum())
        for entry in entries:
            entry["replayed"] = replayed_plan(steps, entry["plan"])
        best = min(entries, key=lambda e: (e["predicted"], e["plan"]))
        ranks.append(
            {
                "rank": rank,
                "ops": len(compiled.names),
                "umax": umax,
                "lmin": lmin,
                "transfer_time": transfer,
                "compute_time": compute,
                "rho": transfer / compute if compute > 0 else None,
                "best_plan": best["plan"],
                **_error_summary(steps),
                **_comparison_error(entries, steps, settings),
                "plans": entries,
            }
        )
    return {
        "schema": SCHEMA,
        "kind": "comparison",
        "samples": samples,
        "seed": seed,
        "knobs": settings,
        "accelerated": _simkernel.ACCELERATED,
        "ranks": ranks,
    }
