"""Discrete-event simulation of an OpGraph under a plan: replay, plan comparison, what-if.

List scheduling (TicTac §3.1): every op runs on its resource for its oracle time; a
resource runs one op at a time per channel, and when a channel frees up the resource
takes a ready op with the lowest priority number, drawing uniformly among those tied
on it and the unprioritized ops. A plan's control edges are extra dependencies. Each
sample is fixed by `seed` and its sample number, so results are deterministic.

- `replay`: each traced step with its own op times and its observed order (priority =
  start order per resource); ``replay_error = predicted / measured - 1`` against the
  step's busy makespan (its span less the idle time in which no op of the rank ran,
  as `planner.metrics` defines the makespan m).
- `compare`: baseline (no priorities: random order), observed and any given plans on
  the same DAG and oracle: predicted iteration time (mean of N samples and
  percentiles), speedup vs the baseline mean and vs observed, efficiency E, overlap
  alpha — beside the replay error of the rank, so no prediction comes without it.
- `sweep`: the comparison over one what-if knob (TicTac Figures 7 and 10).

What-if knobs: ``bandwidth_scale`` divides transfer times, ``compute_scale`` divides
compute times, ``latency`` (s) is added to each transfer, ``channels`` is the number
of concurrent transfers per network resource (each at the op's full oracle time; pair
it with ``bandwidth_scale = 1/channels`` to model one shared link).

All functions return JSON-ready dicts with ``"schema": "planner.simulation/1"``; times
are seconds. The loop itself lives in `planner._simkernel` (numba when installed).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from planner import _simkernel
from planner.errors import InputError
from planner.graph import OpGraph
from planner.metrics import caramel_figures, efficiency
from planner.oracle import TimeOracle, mean_of_runs
from planner.plan import Plan
from planner.schedule.ticks import TICKS_PER_SECOND
from planner.trace import Job, busy_time, with_dedicated

SCHEMA = "planner.simulation/1"

KNOBS: dict[str, float] = {
    "bandwidth_scale": 1.0,
    "compute_scale": 1.0,
    "latency": 0.0,
    "channels": 1,
}
REFERENCE_PLANS = ("baseline", "observed")


@dataclass(frozen=True)
class Compiled:
    """An OpGraph as integer arrays (built once per graph, reused for every plan)."""

    graph: OpGraph
    names: tuple[str, ...]
    index: Mapping[str, int]
    resources: tuple[str, ...]
    res: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    transfer: np.ndarray


@dataclass(frozen=True)
class Run:
    """Samples of one plan: makespans (s) and the recorded sample's start/lane per op."""

    makespan: np.ndarray
    seconds: np.ndarray
    recorded: int | None = None
    start: np.ndarray | None = None
    lane: np.ndarray | None = None


def compile_graph(graph: OpGraph) -> Compiled:
    """Op index, resource id per op and the edge arrays of `graph`."""
    names = tuple(graph.ops)
    index = {name: i for i, name in enumerate(names)}
    resources = tuple(sorted({op.resource for op in graph.ops.values()}))
    rid = {r: i for i, r in enumerate(resources)}
    res = np.fromiter((rid[op.resource] for op in graph.ops.values()), np.int64, len(names))
    src = graph.src.astype(np.int64)
    dst = graph.dst.astype(np.int64)
    transfer = np.fromiter((op.is_transfer for op in graph.ops.values()), bool, len(names))
    return Compiled(graph, names, index, resources, res, src, dst, transfer)


def op_seconds(
    compiled: Compiled,
    times: Mapping[str, float] | TimeOracle,
    *,
    bandwidth_scale: float = 1.0,
    compute_scale: float = 1.0,
    latency: float = 0.0,
) -> np.ndarray:
    """Seconds per op in compiled order, with the what-if knobs applied (missing = 0)."""
    if bandwidth_scale <= 0 or compute_scale <= 0 or latency < 0:
        raise InputError(None, "bandwidth and compute scales must be > 0 and latency >= 0")
    table = times.times if isinstance(times, TimeOracle) else times
    seconds = np.fromiter((float(table.get(n, 0.0)) for n in compiled.names), np.float64)
    if seconds.size and (~np.isfinite(seconds) | (seconds < 0)).any():
        bad = compiled.names[int(np.flatnonzero(~np.isfinite(seconds) | (seconds < 0))[0])]
        raise InputError(None, f"op {bad!r} has time {table.get(bad)}; need a finite time >= 0")
    t = compiled.transfer
    return np.where(t, seconds / bandwidth_scale + latency, seconds / compute_scale)


def priority_array(compiled: Compiled, priority: Mapping[str, int] | None) -> np.ndarray:
    """Priority number per op; -1 where the op has none (masked separately)."""
    out = np.full(len(compiled.names), -1, dtype=np.int64)
    for name, p in (priority or {}).items():
        if name not in compiled.index:
            raise InputError(None, f"plan names op {name!r}, which is not in the graph")
        out[compiled.index[name]] = int(p)
    return out


def capacities(compiled: Compiled, channels: int = 1) -> np.ndarray:
    """Channels per resource: `channels` for resources that carry transfers, else 1."""
    if channels < 1:
        raise InputError(None, f"channels must be >= 1, got {channels}")
    cap = np.ones(len(compiled.resources), dtype=np.int64)
    cap[np.unique(compiled.res[compiled.transfer])] = int(channels)
    return cap


def _draws(seed: int, sample_ids: Iterable[int], n: int) -> np.ndarray:
    """One row of uniforms per sample; sample i always gets the same row for a seed."""
    ids = list(sample_ids)
    out = np.empty((len(ids), n), dtype=np.float64)
    for row, i in enumerate(ids):
        out[row] = np.random.default_rng((int(seed), int(i))).random(n)
    return out


def _arrays(
    compiled: Compiled,
    priority: np.ndarray | None,
    control: Sequence[tuple[str, str]],
    cap: np.ndarray,
) -> tuple[np.ndarray, ...]:
    """The kernel's structure arrays: CSR, in-degrees, priority buckets, segments."""
    n, n_res = len(compiled.names), len(compiled.resources)
    src, dst = compiled.src, compiled.dst
    if control:
        try:
            extra = np.array([[compiled.index[u], compiled.index[v]] for u, v in control])
        except KeyError as exc:
            raise InputError(None, f"control edge names unknown op {exc.args[0]!r}") from None
        src, dst = np.concatenate([src, extra[:, 0]]), np.concatenate([dst, extra[:, 1]])
    order = np.argsort(src, kind="stable")
    succ_idx = dst[order].astype(np.int64)
    succ_ptr = np.concatenate([[0], np.cumsum(np.bincount(src, minlength=n))]).astype(np.int64)
    indeg = np.bincount(dst, minlength=n).astype(np.int64)
    res = compiled.res
    bucket = np.full(n, -1, dtype=np.int64)
    has = np.zeros(n, dtype=bool) if priority is None else priority >= 0
    ops = np.flatnonzero(has)
    if len(ops):
        ops = ops[np.lexsort((priority[ops], res[ops]))]
        new = np.ones(len(ops), dtype=bool)
        new[1:] = (res[ops][1:] != res[ops][:-1]) | (priority[ops][1:] != priority[ops][:-1])
        bucket[ops] = np.cumsum(new) - 1
        bucket_res = res[ops][new]
        counts = np.bincount(bucket[ops])
    else:
        bucket_res = np.zeros(0, dtype=np.int64)
        counts = np.zeros(0, dtype=np.int64)
    bstart = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    hstart = np.concatenate([[0], np.cumsum(np.bincount(bucket_res, minlength=n_res))])
    ustart = np.concatenate([[0], np.cumsum(np.bincount(res[~has], minlength=n_res))])
    lstart = np.concatenate([[0], np.cumsum(cap)])
    return (
        succ_ptr,
        succ_idx,
        indeg,
        res,
        cap.astype(np.int64),
        bucket,
        bstart,
        hstart.astype(np.int64),
        ustart.astype(np.int64),
        lstart.astype(np.int64),
    )


def _kernel(
    arrays: tuple[np.ndarray, ...], ticks: np.ndarray, rand: np.ndarray, record: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n, s = len(ticks), rand.shape[0]
    shape = (s, n) if record else (1, 1)
    start = np.zeros(shape, dtype=np.int64)
    lane = np.zeros(shape, dtype=np.int64)
    makespan = np.zeros(s, dtype=np.int64)
    done = np.zeros(s, dtype=np.int64)
    succ_ptr, succ_idx, indeg, res, cap, bucket, bstart, hstart, ustart, lstart = arrays
    _simkernel.list_schedule(
        ticks, succ_ptr, succ_idx, indeg, res, cap, bucket, bstart, hstart, ustart, lstart,
        rand, record, start, lane, makespan, done,
    )  # fmt: skip
    if (done < n).any():
        raise InputError(None, "the plan's control edges make the graph cyclic: ops never run")
    return makespan, start, lane


def to_ticks(seconds: np.ndarray) -> np.ndarray:
    return np.rint(np.asarray(seconds, dtype=np.float64) * TICKS_PER_SECOND).astype(np.int64)


def run(
    compiled: Compiled,
    seconds: np.ndarray,
    priority: Mapping[str, int] | np.ndarray | None = None,
    control_edges: Sequence[tuple[str, str]] = (),
    *,
    channels: int = 1,
    samples: int = 1,
    seed: int = 0,
    record: bool = False,
    batch: int = 256,
) -> Run:
    """Simulate `samples` seeded samples of one plan on `compiled` with op `seconds`.

    `priority`: op -> number (lower first; missing = unprioritized) or a per-op array
    with -1 for none. With `record`, the sample with the median makespan (the lower
    one for an even count) is run again and its start and lane per op kept.
    """
    if samples < 1:
        raise InputError(None, f"samples must be >= 1, got {samples}")
    prio = priority if isinstance(priority, np.ndarray) else priority_array(compiled, priority)
    arrays = _arrays(compiled, prio, control_edges, capacities(compiled, channels))
    ticks = to_ticks(seconds)
    n = len(ticks)
    spans = []
    for first in range(0, samples, batch):
        ids = range(first, min(samples, first + batch))
        spans.append(_kernel(arrays, ticks, _draws(seed, ids, n), False)[0])
    makespan = np.concatenate(spans) / TICKS_PER_SECOND
    if not record:
        return Run(makespan, np.asarray(seconds, dtype=np.float64))
    median = int(np.argsort(makespan, kind="stable")[(samples - 1) // 2])
    _, start, lane = _kernel(arrays, ticks, _draws(seed, [median], n), True)
    return Run(
        makespan,
        np.asarray(seconds, dtype=np.float64),
        recorded=median,
        start=start[0] / TICKS_PER_SECOND,
        lane=lane[0],
    )


def simulate(
    graph: OpGraph,
    times: Mapping[str, float] | TimeOracle,
    plan: Plan | Mapping[str, int] | None = None,
    *,
    channels: int = 1,
    samples: int = 1,
    seed: int = 0,
    record: bool = True,
) -> Run:
    """One-call form of `run` for a graph, its op times and a plan (or bare priorities)."""
    compiled = compile_graph(graph)
    priority, control = _plan_parts(plan)
    return run(
        compiled,
        op_seconds(compiled, times),
        priority,
        control,
        channels=channels,
        samples=samples,
        seed=seed,
        record=record,
    )


def _plan_parts(
    plan: Plan | Mapping[str, int] | None,
) -> tuple[Mapping[str, int] | None, tuple[tuple[str, str], ...]]:
    """Priorities and control edges of a plan; a plan with only an order gets its index."""
    if plan is None:
        return None, ()
    if isinstance(plan, Plan):
        priority = plan.priority or plan.order_index()
        return priority, tuple(plan.control_edges)
    return plan, ()


# ------------------------------------------------------------------------ figures


def bounds(compiled: Compiled, seconds: np.ndarray, cap: np.ndarray) -> tuple[float, float]:
    """(Umax, Lmin) of TicTac Eqs. 1-2; a resource with c channels counts its sum / c."""
    per_resource = np.bincount(compiled.res, weights=seconds, minlength=len(compiled.resources))
    return float(per_resource.sum()), float((per_resource / cap).max(initial=0.0))


def overlap(compiled: Compiled, run_: Run) -> dict[str, float]:
    """Caramel's C, N, rho, alpha, utilization of the recorded sample (§3.1)."""
    assert run_.start is not None
    start = to_ticks(run_.start)
    dur = to_ticks(run_.seconds)
    t = compiled.transfer
    c = busy_time(start[~t], dur[~t]) / TICKS_PER_SECOND
    n = busy_time(start[t], dur[t]) / TICKS_PER_SECOND
    makespan = float(run_.makespan[run_.recorded])
    rho, alpha, utilization = caramel_figures(c, n, makespan)
    return {
        "compute": c,
        "network": n,
        "rho": _finite(rho),
        "alpha": _finite(alpha),
        "utilization": _finite(utilization),
    }


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _stats(makespan: np.ndarray) -> dict[str, float]:
    p5, p50, p95 = np.percentile(makespan, [5, 50, 95])
    return {
        "predicted": float(makespan.mean()),
        "p5": float(p5),
        "p50": float(p50),
        "p95": float(p95),
        "min": float(makespan.min()),
        "max": float(makespan.max()),
        "std": float(makespan.std()),
        "samples": len(makespan),
    }


def timeline(compiled: Compiled, run_: Run) -> dict[str, list]:
    """The recorded sample as columns: op, resource, lane, start, duration (s)."""
    assert run_.start is not None and run_.lane is not None
    return {
        "op": list(compiled.names),
        "resource": [compiled.resources[r] for r in compiled.res],
        "lane": run_.lane.tolist(),
        "start": run_.start.tolist(),
        "duration": run_.seconds.tolist(),
    }


# ------------------------------------------------------------------------ replay


def require_timings(job: Job) -> None:
    """InputError unless `job` has timings; callers check before building any plan."""
    if not len(job.trace.timings):
        where = job.sources[0] if job.sources else None
        raise InputError(where, "simulation needs timings; input has none")


def _frame(job: Job) -> pd.DataFrame:
    require_timings(job)
    return with_dedicated(job.trace, job.graphs)


def observed_priority(compiled: Compiled, rows: pd.DataFrame) -> np.ndarray:
    """Priority = observed start order per resource (ties by name); -1 for unseen ops."""
    rows = rows[rows["op"].isin(compiled.index)]
    idx = rows["op"].map(compiled.index).to_numpy(dtype=np.int64)
    res = compiled.res[idx]
    order = np.lexsort((rows["op"].to_numpy(), rows["start"].to_numpy(), res))
    res_sorted = res[order]
    first = np.searchsorted(res_sorted, res_sorted, side="left")
    out = np.full(len(compiled.names), -1, dtype=np.int64)
    out[idx[order]] = np.arange(len(order)) - first
    return out


def step_seconds(compiled: Compiled, rows: pd.DataFrame, fallback: np.ndarray) -> np.ndarray:
    """Op times of one step: its dedicated times, the oracle's for ops it did not run."""
    seconds = fallback.copy()
    rows = rows[rows["op"].isin(compiled.index)]
    seconds[rows["op"].map(compiled.index).to_numpy(dtype=np.int64)] = (
        rows["dedicated"].to_numpy() / 1e9
    )
    return seconds


def measured(rows: pd.DataFrame) -> tuple[float, float]:
    """(busy makespan, span) of one step in seconds, from its op intervals."""
    starts, durations = rows["start"].to_numpy(), rows["duration"].to_numpy()
    span = float((starts + durations).max() - starts.min()) / 1e9
    return busy_time(starts, durations) / 1e9, span


def _replay_rank(
    compiled: Compiled, rows_of_rank: pd.DataFrame, oracle: TimeOracle, seed: int
) -> list[dict[str, Any]]:
    fallback = op_seconds(compiled, oracle)
    steps = []
    for iteration, rows in rows_of_rank.groupby("iteration", sort=True):
        seconds = step_seconds(compiled, rows, fallback)
        result = run(compiled, seconds, observed_priority(compiled, rows), seed=seed)
        busy, span = measured(rows)
        predicted = float(result.makespan[0])
        steps.append(
            {
                "iteration": int(iteration),
                "predicted": predicted,
                "measured": busy,
                "span": span,
                "idle": span - busy,
                "replay_error": predicted / busy - 1.0 if busy > 0 else None,
                "ops_observed": int(rows["op"].isin(compiled.index).sum()),
            }
        )
    return steps


def _error_summary(steps: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    errors = np.array([s["replay_error"] for s in steps if s["replay_error"] is not None])
    if not len(errors):
        return {"replay_error_median": None, "replay_error_max": None}
    worst = errors[np.argmax(np.abs(errors))]
    return {"replay_error_median": float(np.median(errors)), "replay_error_max": float(worst)}


def replay(job: Job, *, seed: int = 0, frame: pd.DataFrame | None = None) -> dict[str, Any]:
    """Each traced step of each rank with its own op times and observed order.

    Per step: predicted and measured (busy makespan) iteration time, span, idle and
    ``replay_error``; per rank the median and the largest-magnitude error (signed).
    `frame`: the job's `with_dedicated` timings, when the caller has them already.
    """
    frame = _frame(job) if frame is None else frame
    ranks = []
    for rank in job.ranks:
        graph = job.graphs[rank]
        compiled = compile_graph(graph)
        rows = frame[frame["rank"] == rank]
        steps = _replay_rank(compiled, rows, mean_of_runs(graph, rows), seed)
        ranks.append({"rank": rank, **_error_summary(steps), "steps": steps})
    return {"schema": SCHEMA, "kind": "replay", "ranks": ranks, **_all_errors(ranks)}


def replayed_steps(document: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Rank -> steps of a `replay` document, for `compare`/`sweep` to reuse."""
    return {r["rank"]: r["steps"] for r in document["ranks"]}


def _all_errors(ranks: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    return _error_summary([s for r in ranks for s in r["steps"]])


# ------------------------------------------------------------------------ compare


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
    pred = compiled.graph.dag.pred
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
            edges.extend((p, first) for p in pred[member] if p != first)
    return adjusted, tuple(dict.fromkeys(edges)), len(groups)


def _compare_rank(
    compiled: Compiled,
    rows: pd.DataFrame,
    seconds: np.ndarray,
    plans: Mapping[str, Plan],
    channels: int,
    samples: int,
    seed: int,
    timelines: bool,
) -> list[dict[str, Any]]:
    """Entries of baseline, observed and `plans` for one rank (same DAG and op times)."""
    umax, lmin = bounds(compiled, seconds, capacities(compiled, channels))
    runs: dict[str, Run] = {}
    extra: dict[str, dict[str, Any]] = {}
    runs["baseline"] = run(
        compiled, seconds, None, channels=channels, samples=samples, seed=seed, record=True
    )
    steps = [(int(i), r) for i, r in rows.groupby("iteration", sort=True)]
    if steps:
        per_step = max(1, -(-samples // len(steps)))
        step_runs = [
            run(
                compiled,
                seconds,
                observed_priority(compiled, r),
                channels=channels,
                samples=per_step,
                seed=seed,
                record=True,
            )
            for _, r in steps
        ]
        means = np.array([r.makespan.mean() for r in step_runs])
        pick = int(np.argsort(means, kind="stable")[(len(means) - 1) // 2])
        chosen = step_runs[pick]
        runs["observed"] = Run(
            np.concatenate([r.makespan for r in step_runs]),
            chosen.seconds,
            chosen.recorded,
            chosen.start,
            chosen.lane,
        )
        extra["observed"] = {"iteration": steps[pick][0]}
    for name, plan in plans.items():
        priority, control = _plan_parts(plan)
        plan_seconds, batch_edges, batched = batching(compiled, seconds, plan)
        if batched:
            extra[name] = {"batched_groups": batched}
        runs[name] = run(
            compiled,
            plan_seconds,
            priority,
            (*control, *batch_edges),
            channels=channels,
            samples=samples,
            seed=seed,
            record=True,
        )
        if not priority and not control:
            extra[name] = {"note": "plan orders nothing: same as baseline"}
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
    **knobs: float,
) -> dict[str, Any]:
    """Baseline, observed and the given plans ({name: {rank: Plan}}) on each rank.

    Every rank entry carries its oracle bounds, its replay errors and one entry per
    plan: predicted iteration time (mean of `samples`), p5/p50/p95/min/max, speedups
    vs the baseline mean and vs observed, efficiency E (TicTac §3.2) and Caramel's
    overlap alpha (of the median sample). `timelines` adds that sample's schedule per
    plan (see `planner.export.chrome_trace`). `knobs`: see `KNOBS`. `oracles` and
    `frame` (`with_dedicated` timings) default to the mean-of-runs oracle of the trace;
    `replayed` (rank -> the steps of a `replay`) saves replaying the traced steps again.
    """
    plans = plans or {}
    for name in plans:
        if name in REFERENCE_PLANS:
            raise InputError(None, f"plan name {name!r} is reserved")
    settings = _knobs(**knobs)
    frame = _frame(job) if frame is None else frame
    ranks = []
    for rank in job.ranks:
        graph = job.graphs[rank]
        compiled = compile_graph(graph)
        rows = frame[frame["rank"] == rank]
        oracle = oracles[rank] if oracles is not None else mean_of_runs(graph, rows)
        if replayed is not None and rank in replayed:
            steps = replayed[rank]
        else:
            steps = _replay_rank(compiled, rows, oracle, seed)
        of_rank = {name: p[rank] for name, p in plans.items() if rank in p}
        seconds = op_seconds(
            compiled,
            oracle,
            bandwidth_scale=settings["bandwidth_scale"],
            compute_scale=settings["compute_scale"],
            latency=settings["latency"],
        )
        channels = int(settings["channels"])
        entries = _compare_rank(
            compiled, rows, seconds, of_rank, channels, samples, seed, timelines
        )
        umax, lmin = bounds(compiled, seconds, capacities(compiled, channels))
        transfer = float(seconds[compiled.transfer].sum())
        compute = float(seconds[~compiled.transfer].sum())
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


def sweep(
    job: Job,
    knob: str,
    values: Sequence[float],
    plans: Mapping[str, Mapping[str, Plan]] | None = None,
    *,
    samples: int = 100,
    seed: int = 0,
    oracles: Mapping[str, TimeOracle] | None = None,
    frame: pd.DataFrame | None = None,
    replayed: Mapping[str, Sequence[dict[str, Any]]] | None = None,
    **knobs: float,
) -> dict[str, Any]:
    """`compare` at each value of one knob: the gain curve per rank and plan.

    Each point carries rho = total transfer time / total compute time of the oracle
    after the knobs, the x-axis of TicTac's Figures 7 and 10.
    """
    if knob not in KNOBS:
        raise InputError(None, f"unknown knob {knob!r} (choose from {', '.join(KNOBS)})")
    if not len(values):
        raise InputError(None, "a sweep needs at least one value")
    frame = _frame(job) if frame is None else frame
    if replayed is None:
        replayed = replayed_steps(replay(job, seed=seed, frame=frame))
    points: dict[str, list[dict[str, Any]]] = {}
    for value in values:
        v = int(round(value)) if knob == "channels" else float(value)
        doc = compare(
            job, plans, samples=samples, seed=seed, oracles=oracles, frame=frame,
            replayed=replayed, **{**knobs, knob: v},
        )  # fmt: skip
        for entry in doc["ranks"]:
            points.setdefault(entry["rank"], []).append(
                {
                    "value": v,
                    "rho": entry["rho"],
                    "best_plan": entry["best_plan"],
                    "plans": {
                        p["plan"]: {
                            "predicted": p["predicted"],
                            "speedup_vs_baseline": p["speedup_vs_baseline"],
                            "efficiency": p["efficiency"],
                        }
                        for p in entry["plans"]
                    },
                }
            )
    return {
        "schema": SCHEMA,
        "kind": "sweep",
        "knob": knob,
        "values": [int(round(v)) if knob == "channels" else float(v) for v in values],
        "samples": samples,
        "seed": seed,
        "knobs": _knobs(**knobs),
        "ranks": [{"rank": r, "points": p} for r, p in points.items()],
    }


# ------------------------------------------------------------------------ timelines


def lanes(resource: np.ndarray, start: np.ndarray, duration: np.ndarray) -> np.ndarray:
    """Lane per interval so that intervals on one (resource, lane) never overlap.

    Observed ops overlap on a resource (TF runs a device's ops on a thread pool);
    a trace viewer needs them on separate tracks. Greedy interval partitioning in
    start order: the lowest lane whose last op has ended.
    """
    out = np.zeros(len(start), dtype=np.int64)
    ends: dict[Any, list[float]] = {}
    for i in np.lexsort((start, resource)):
        free = ends.setdefault(resource[i], [])
        end = start[i] + duration[i]
        for k, last in enumerate(free):
            if last <= start[i]:
                free[k], out[i] = end, k
                break
        else:
            out[i] = len(free)
            free.append(end)
    return out


def observed_timeline(job: Job, rank: str, iteration: int) -> dict[str, list]:
    """The traced schedule of one step in `timeline` form (starts from the step's first op)."""
    graph = job.graphs[rank]
    rows = job.trace.of(rank, iteration)
    rows = rows[rows["op"].isin(graph.ops)]
    if not len(rows):
        raise InputError(None, f"{rank} has no timed ops in step {iteration}")
    resource = np.array([graph.ops[n].resource for n in rows["op"]], dtype=object)
    start = (rows["start"].to_numpy() - rows["start"].min()) / 1e9
    duration = rows["duration"].to_numpy() / 1e9
    return {
        "op": rows["op"].tolist(),
        "resource": resource.tolist(),
        "lane": lanes(resource, start, duration).tolist(),
        "start": start.tolist(),
        "duration": duration.tolist(),
    }


def median_step(job: Job, rank: str) -> int:
    """The traced step of `rank` with the median busy makespan (lower median)."""
    frame = job.trace.of(rank)
    if not len(frame):
        raise InputError(None, f"{rank} has no timed steps")
    busy = [(measured(rows)[0], int(i)) for i, rows in frame.groupby("iteration", sort=True)]
    return sorted(busy)[(len(busy) - 1) // 2][1]


# ------------------------------------------------------------------------ all together


def simulation(
    job: Job,
    plans: Mapping[str, Mapping[str, Plan]] | None = None,
    *,
    samples: int = 100,
    seed: int = 0,
    sweep_knob: str | None = None,
    sweep_values: Sequence[float] = (),
    timelines: bool = False,
    **knobs: float,
) -> dict[str, Any]:
    """Replay, comparison (and a sweep when `sweep_knob` is given) of one job.

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
    replayed = replay(job, seed=seed, frame=frame)
    steps = replayed_steps(replayed)
    comparison = compare(
        job, plans, samples=samples, seed=seed, timelines=timelines, oracles=oracles,
        frame=frame, replayed=steps, **knobs,
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
            frame=frame, replayed=steps, **knobs,
        )  # fmt: skip
    if timelines:
        document["timelines"] = timelines_of(job, comparison)
    return document


def timelines_of(job: Job, comparison: dict[str, Any]) -> list[dict[str, Any]]:
    """Moves the per-plan timelines out of `comparison` into a list of schedules.

    Adds, per rank, the traced step with the median busy makespan as plan ``measured``.
    """
    out = []
    for entry in comparison["ranks"]:
        rank = entry["rank"]
        step = median_step(job, rank)
        out.append(
            {
                "plan": "measured",
                "rank": rank,
                "iteration": step,
                "timeline": observed_timeline(job, rank, step),
            }
        )
        for plan in entry["plans"]:
            if "timeline" in plan:
                out.append(
                    {
                        "plan": plan["plan"],
                        "rank": rank,
                        "predicted": plan["predicted"],
                        "timeline": plan.pop("timeline"),
                    }
                )
    return out
