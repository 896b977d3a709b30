"""Discrete-event simulation of an OpGraph under a plan: replay, plan comparison, what-if.

List scheduling (TicTac §3.1): every op runs on its resource for its oracle time; a
resource runs one op at a time per channel, and when a channel frees up the resource
takes a ready op with the lowest priority number, drawing uniformly among those tied
on it and the unprioritized ops. A plan's control edges are extra dependencies. Each
sample is fixed by `seed` and its sample number, so results are deterministic.

- `replay`: each traced step with its own op times and its observed order (priority =
  start order per resource); ``replay_error = predicted / measured - 1`` against the
  step's busy makespan (its span less the idle time in which no op of the rank ran,
  as `planner.measure.metrics` defines the makespan m).
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
are seconds. The loop itself lives in `planner.prediction._simkernel` (numba when installed).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import repeat
from typing import Any

import numpy as np
import pandas as pd

from planner.errors import InputError
from planner.measure.metrics import caramel_figures, efficiency
from planner.model import records
from planner.model.arrays import lanes
from planner.model.graph import OpGraph, on_gpu
from planner.model.oracle import TimeOracle, mean_of_runs
from planner.model.plan import Plan
from planner.model.records import missing_ops
from planner.model.trace import Job, busy_time, queued_before, rank_meta, with_dedicated
from planner.planning.ticks import TICKS_PER_SECOND
from planner.prediction import _simkernel, enforced, host

SCHEMA = "planner.simulation/1"

KNOBS: dict[str, float] = {
    "bandwidth_scale": 1.0,
    "compute_scale": 1.0,
    "latency": 0.0,
    "channels": 1,
}
REFERENCE_PLANS = ("baseline", "observed")
RELIABLE = 0.05  # largest replay error (fraction) at which a prediction is shown unflagged


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
    """Op index, resource id per op and the edge arrays of `graph`. (speed) The last
    graph's is kept: a rank's replay, its comparison and its ready times ask for it
    again (a graph is not changed once built; the arrays are only read)."""
    held = _COMPILED.get(id(graph))
    if held is not None and held.graph is graph:
        return held
    compiled = _compile(graph)
    _COMPILED.clear()
    _COMPILED[id(graph)] = compiled
    return compiled


_COMPILED: dict[int, Compiled] = {}


def _compile(graph: OpGraph) -> Compiled:
    """The arrays of `compile_graph`, built."""
    names = tuple(graph.ops)
    index = {name: i for i, name in enumerate(names)}
    resources = tuple(sorted({op.resource for op in graph.ops.values()}))
    rid = {r: i for i, r in enumerate(resources)}
    res = np.fromiter((rid[op.resource] for op in graph.ops.values()), np.int64, len(names))
    src = graph.src.astype(np.int64)
    dst = graph.dst.astype(np.int64)
    transfer = np.fromiter((op.is_transfer for op in graph.ops.values()), bool, len(names))
    return Compiled(graph, names, index, resources, res, src, dst, transfer)


def op_rows(compiled: Compiled, rows: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """(the rows of `rows` whose op `compiled` holds, in order; their op indices).

    (speed) One dict look-up per row: pandas' ``isin`` and ``map`` over the op names
    cost about a millisecond per call. The last answer is kept: a rank's replay, its
    queues carried over and its comparison ask for the same rows (the same object,
    `rank_rows`; rows are only read once made)."""
    held = _OP_ROWS.get("last")
    if held is not None and held[0] is compiled and held[1] is rows:
        return held[2]
    ops = rows["op"].tolist()
    idx = np.fromiter(map(compiled.index.get, ops, repeat(-1)), dtype=np.int64, count=len(ops))
    keep = idx >= 0
    found = (rows, idx) if keep.all() else (rows[keep], idx[keep])
    _OP_ROWS["last"] = (compiled, rows, found)
    return found


_OP_ROWS: dict[str, tuple[Compiled, pd.DataFrame, tuple[pd.DataFrame, np.ndarray]]] = {}


def rank_rows(frame: pd.DataFrame, rank: str) -> pd.DataFrame:
    """The rows of `rank` in `frame`: `frame` itself where it holds that rank alone (a
    one-rank job: no copy, and `op_rows` answers its callers from the one look-up)."""
    mask = frame["rank"] == rank
    return frame if mask.all() else frame[mask]


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
    seconds = np.array([table.get(n, 0.0) for n in compiled.names], dtype=np.float64)
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
    cap[sorted_unique(compiled.res[compiled.transfer])] = int(channels)
    return cap


def _draws(seed: int, sample_ids: Iterable[int], n: int) -> np.ndarray:
    """One row of uniforms per sample; sample i always gets the same row for a seed.

    (speed) The last few blocks of several rows are kept: every rank of a job, and a
    plan and its baseline, draw the same rows; the kernel only reads them. A single row
    (a replayed step, a plan's median sample run again) is taken from a kept block that
    holds it, else drawn and not kept, so that it never pushes a block out."""
    ids = tuple(int(i) for i in sample_ids)
    key = (int(seed), ids, int(n))
    out = _DRAWN.get(key)
    if out is not None:
        return out
    if len(ids) == 1:
        for (s, held, m), block in _DRAWN.items():
            if s == key[0] and m == key[2] and ids[0] in held:
                row = held.index(ids[0])
                return block[row : row + 1]
    out = np.empty((len(ids), n), dtype=np.float64)
    for row, i in enumerate(ids):
        out[row] = np.random.default_rng((int(seed), i)).random(n)
    out.flags.writeable = False  # shared by the callers: a write would fail loudly
    if len(ids) > 1:
        if len(_DRAWN) >= 4:
            _DRAWN.pop(next(iter(_DRAWN)))
        _DRAWN[key] = out
    return out


_DRAWN: dict[tuple[int, tuple[int, ...], int], np.ndarray] = {}


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
    frame = with_dedicated(job.trace, job.graphs)
    if "wait" in frame:
        # A rank's collective lasts its transfer plus its wait for the later peers: the
        # peers' lateness is no order of this rank's, so the simulation keeps it as seen
        # (the schedulers' oracle counts the transfer part only, `planner.model.waits`).
        frame["dedicated"] = frame["dedicated"] + frame["wait"]
    return frame


def observed_priority(compiled: Compiled, rows: pd.DataFrame) -> np.ndarray:
    """Priority = observed start order per resource (ties by name); -1 for unseen ops."""
    rows, idx = op_rows(compiled, rows)
    res = compiled.res[idx]
    order = np.lexsort((rows["op"].to_numpy(), rows["start"].to_numpy(), res))
    res_sorted = res[order]
    first = np.searchsorted(res_sorted, res_sorted, side="left")
    out = np.full(len(compiled.names), -1, dtype=np.int64)
    out[idx[order]] = np.arange(len(order)) - first
    return out


def observed_priorities(compiled: Compiled, rows: pd.DataFrame) -> list[tuple[int, np.ndarray]]:
    """(step, `observed_priority` of its rows) for each step of one rank's `rows`, in
    step order. (speed) The ops are looked up and their names ordered once for the
    rank, and the steps split with numpy, not a pandas group-by: the same priorities."""
    steps = sorted_unique(rows["iteration"].to_numpy(dtype=np.int64))
    known, idx = op_rows(compiled, rows)
    iteration = known["iteration"].to_numpy(dtype=np.int64)
    start = known["start"].to_numpy()
    # ties in start time go by name: the names' sorted positions order them alike
    by_name = np.empty(len(compiled.names), dtype=np.int64)
    by_name[sorted(range(len(compiled.names)), key=compiled.names.__getitem__)] = np.arange(
        len(compiled.names)
    )
    name_key, res = by_name[idx], compiled.res[idx]
    out = []
    for it in steps.tolist():
        of = np.flatnonzero(iteration == it)
        order = of[np.lexsort((name_key[of], start[of], res[of]))]
        res_sorted = res[order]
        first = np.searchsorted(res_sorted, res_sorted, side="left")
        priority = np.full(len(compiled.names), -1, dtype=np.int64)
        priority[idx[order]] = np.arange(len(order)) - first
        out.append((int(it), priority))
    return out


def step_seconds(compiled: Compiled, rows: pd.DataFrame, fallback: np.ndarray) -> np.ndarray:
    """Op times of one step: its dedicated times, the oracle's for ops it did not run."""
    seconds = fallback.copy()
    rows, idx = op_rows(compiled, rows)
    seconds[idx] = rows["dedicated"].to_numpy() / 1e9
    return seconds


def measured(rows: pd.DataFrame | Mapping[str, np.ndarray]) -> tuple[float, float]:
    """(busy makespan, span) of one step in seconds, from its op intervals (`rows`: a
    DataFrame or numpy columns with ``start`` and ``duration``)."""
    starts, durations = np.asarray(rows["start"]), np.asarray(rows["duration"])
    span = float((starts + durations).max() - starts.min()) / 1e9
    return busy_time(starts, durations) / 1e9, span


@dataclass(frozen=True)
class PlanArrays:
    """A plan on a compiled graph: per op its position in the plan's order (-1: not
    planned) and its control edges as op indices."""

    position: np.ndarray
    src: np.ndarray
    dst: np.ndarray


def plan_arrays(compiled: Compiled, plan: Plan) -> PlanArrays:
    """`plan` on `compiled`: its order (priorities, else its order's index) and control
    edges; InputError naming an op the graph does not hold."""
    priority, control = _plan_parts(plan)
    position = np.full(len(compiled.names), -1, dtype=np.int64)
    for name, p in (priority or {}).items():
        if name not in compiled.index:
            raise InputError(None, f"plan {plan.algorithm!r} orders unknown op {name!r}")
        position[compiled.index[name]] = int(p)
    ends = [(compiled.index.get(u), compiled.index.get(v)) for u, v in control]
    if any(u is None or v is None for u, v in ends):
        raise InputError(None, f"plan {plan.algorithm!r} has a control edge to an unknown op")
    pairs = np.array(ends, dtype=np.int64).reshape(-1, 2)
    return PlanArrays(position, pairs[:, 0].copy(), pairs[:, 1].copy())


@dataclass(frozen=True)
class StepModel:
    """One traced step as the replay runs it (see `step_model`).

    `compiled`: the rank's n ops followed by n overhead ops (op i waits for overhead op
    n + i, which waits for op i's predecessors and lane predecessor), with `cap` threads
    or channels per resource; `seconds`: per op the observed duration, per overhead op
    the overhead; `overhead`: the overhead per op (s); `observed`: ops with a record
    this step; `tail`: the step's closing time after its last op (s); `missing`: ops
    recorded in every other step of the rank but not in this one; `violated`: the DAG
    edge (u, v, seconds) the trace contradicts most (v started before u did), if any;
    `ready`: per op when its predecessors let it start (ns from `t0`, the step's start);
    `start_of`: per op its observed start (ns from `t0`, 0 without a record).
    """

    compiled: Compiled
    cap: np.ndarray
    priority: np.ndarray
    seconds: np.ndarray
    overhead: np.ndarray
    observed: np.ndarray
    tail: float
    missing: tuple[str, ...]
    violated: tuple[str, str, float] | None
    ready: np.ndarray
    t0: int
    start_of: np.ndarray


def step_model(
    compiled: Compiled,
    rows: pd.DataFrame,
    span: tuple[int, int],
    fallback: np.ndarray,
    missing: Sequence[str] = (),
    release: np.ndarray | None = None,
    own: int | None = None,
    shape: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    idx: np.ndarray | None = None,
    plan: PlanArrays | None = None,
    usual: np.ndarray | None = None,
) -> StepModel:
    """The replay model of one step: what plain list scheduling misses, taken from it.

    - Concurrency: a resource runs as many ops at once as the step ever ran on it (TF's
      inter-op thread pool, gRPC serving 12-14 transfers on one channel, one thread or
      stream: 1), each at its observed duration, not the processor-shared `dedicated`
      one; ops start in observed order (priority), and a resource that ran one op at a
      time (a Python thread, a GPU stream) keeps its exact order (chain edges).
    - Overhead: the time between an op being ready (its DAG and chain predecessors done,
      the step begun) and its start: framework and Python overhead, launch latency and
      CPU-ahead queues, PS-side and peer waits the DAG has no edge for. An overhead op
      before each op carries it without holding the op's resource.
    - Peers: `release` (ns from the step's start per op, -1 for none) is the time the
      other ranks were ready for the same collective or transfer in the same step (from
      their traces): it cannot start before, as a collective waits for the slowest rank.
    - Tail: the step's span after its last op (closing overhead), kept as observed.
    - The rank's shape: `shape` = (edges the trace contradicts in some step of the rank,
      the widths of its thread pools, edges it contradicts in every step), from
      `rank_shape`: those edges are dropped as the ones this step contradicts are, and a
      pool runs as many ops as it ever did. `violated`, the contradicted edge the cause
      names, is one this step contradicts that some other step does not: an edge every
      step contradicts (a CPU running ahead of the collective its optimizer is given to
      wait for) is the rank's shape, no gap of the step.
    Ops without a record this step run at their `fallback` time, unconstrained (their
    edges dropped), so a partial step still replays (and is flagged). `idx`: the op
    index of each of `rows` (`op_rows`), when the caller has them; `rows` may then be
    numpy columns (``start``, ``duration``) rather than a DataFrame. A ``work`` column
    (`planner.prediction.host`: an op's share of a core the job's processes shared) is what the op
    needs of its resource in the replay; its waits still run from its observed end.
    `plan` (`plan_arrays`): the step as a plan would run it: the planned ops take the
    places their resource gave planned ops in the observed order, in the plan's order,
    and the plan's control edges join the DAG; everything else as observed.
    `usual` (`usual_predecessors`): per op the op that precedes it on its one-at-a-time
    resource in most steps of the rank (-1 none). Where another op came between them in
    this step, the op's overhead runs from (and is measured from) its usual
    predecessor's end, and the op follows the one before it in this step with no
    overhead: an op slotted into the gap (a kernel of another thread run while the
    stream waited) fills the gap rather than pushing the op's wait behind it.
    """
    n = len(compiled.names)
    if idx is None:
        rows, idx = op_rows(compiled, rows)
    t0, t1 = span
    start = np.asarray(rows["start"], dtype=np.int64) - t0
    dur = np.asarray(rows["duration"], dtype=np.int64)
    lane = lanes(compiled.res[idx], start.astype(np.float64), dur.astype(np.float64))
    observed_end = start + dur
    if "work" in rows:  # on one shared core an op holds it for its share, not its span
        dur = np.asarray(rows["work"], dtype=np.int64)
    observed = np.zeros(n, dtype=bool)
    observed[idx] = True
    n_res = len(compiled.resources)
    width = np.ones(n_res, dtype=np.int64)
    np.maximum.at(width, compiled.res[idx], lane + 1)
    dropped = always = None
    if shape is not None:
        dropped, rank_width, always = shape
        width = np.maximum(width, rank_width)
    width[[host.is_shared(r) for r in compiled.resources]] = max(1, n)  # shared, no lanes
    res = compiled.res.copy()
    res[~observed] = n_res
    # observed start order per resource -> priorities, and chains on one-at-a-time ones
    # ties in start time go by the DAG's topological order, so that a chain never runs
    # against an edge (zero-length ops at one instant)
    order = np.lexsort((topological_positions(compiled)[idx], start, res[idx]))
    o_idx, o_res = idx[order], res[idx][order]
    if plan is not None:  # the planned ops in the plan's order, in the planned ops' places
        slots = np.flatnonzero(plan.position[o_idx] >= 0)
        o_idx[slots] = o_idx[slots][np.lexsort((plan.position[o_idx[slots]], o_res[slots]))]
    first = np.searchsorted(o_res, o_res, side="left")
    priority = np.full(2 * n, -1, dtype=np.int64)
    priority[o_idx] = np.arange(len(o_idx)) - first
    same = (o_res[1:] == o_res[:-1]) & (width[o_res[1:]] == 1)
    chain_src, chain_dst = o_idx[:-1][same], o_idx[1:][same]
    anchor_src = direct_src = direct_dst = np.zeros(0, dtype=np.int64)
    if usual is not None and len(chain_dst):
        position = np.full(n, -1, dtype=np.int64)
        position[o_idx] = np.arange(len(o_idx))
        u = usual[chain_dst]
        slotted = (u >= 0) & (u != chain_src)
        slotted[slotted] = (
            observed[u[slotted]]
            & (res[u[slotted]] == res[chain_dst[slotted]])
            & (position[u[slotted]] < position[chain_dst[slotted]])
        )
        anchor_src, direct_src, direct_dst = u[slotted], chain_src[slotted], chain_dst[slotted]
        chain_src, chain_dst = chain_src[~slotted], chain_dst[~slotted]
    end_of = np.zeros(n, dtype=np.int64)
    end_of[idx] = observed_end
    start_of = np.zeros(n, dtype=np.int64)
    start_of[idx] = start
    # an edge u -> v whose v started before u ended was issued from inside u (a kernel
    # launched, a collective started by a hook, mid-op): v waits for that point, u's
    # start plus the observed offset, not for u's end; one whose v started even before
    # u did is contradicted by the trace and dropped
    g_src, g_dst = compiled.src, compiled.dst
    inside = observed[g_src] & observed[g_dst] & (end_of[g_src] > start_of[g_dst])
    launch = inside & (start_of[g_dst] >= start_of[g_src])
    named = inside & ~launch if always is None else inside & ~launch & ~always
    contradicted = np.flatnonzero(named)
    violated = None
    if len(contradicted):
        late = start_of[g_src[contradicted]] - start_of[g_dst[contradicted]]
        j = contradicted[int(np.argmax(late))]
        violated = (compiled.names[g_src[j]], compiled.names[g_dst[j]], float(late.max()) / 1e9)
    if dropped is not None:  # contradicted in another step of the rank
        launch &= ~dropped
        inside |= dropped
    l_src, l_dst = g_src[launch], g_dst[launch]
    # edges to or from an op without a record this step are dropped: through it, a path
    # could run against the observed order (and close a cycle with the lane chains)
    kept = ~inside & observed[g_src] & observed[g_dst]
    src = np.concatenate([g_src[kept], chain_src])
    dst = np.concatenate([g_dst[kept], chain_dst])
    if plan is not None and len(plan.src):
        mine = observed[plan.src] & observed[plan.dst]
        src = np.concatenate([src, plan.src[mine]])
        dst = np.concatenate([dst, plan.dst[mine]])
    ready = np.zeros(n, dtype=np.int64)
    both = observed[src] & observed[dst]
    np.maximum.at(ready, dst[both], end_of[src[both]])
    np.maximum.at(ready, direct_dst, end_of[anchor_src])  # a slotted op's wait: from u*
    np.maximum.at(ready, l_dst, start_of[l_dst])
    own_ready = ready.copy()
    held = np.zeros(0, dtype=np.int64)
    if release is not None:
        # a collective that started before its peers were ready waited inside its
        # observed duration (gloo, NCCL kernels): no release for it
        held = np.flatnonzero(observed & (release > 0) & (release <= start_of))
        ready[held] = np.maximum(ready[held], release[held])
    gap = np.where(observed, np.maximum(start_of - ready, 0), 0)
    k, m = len(held), len(l_src)
    seconds = np.concatenate([fallback, np.zeros(n), np.zeros(k), np.zeros(m)])
    seconds[idx] = dur / 1e9
    seconds[n + idx] = gap[idx] / 1e9
    if k:
        seconds[2 * n : 2 * n + k] = release[held] / 1e9
    if m:
        seconds[2 * n + k :] = (start_of[l_dst] - start_of[l_src]) / 1e9
    every = np.arange(n, dtype=np.int64)
    lag = 2 * n + k + np.arange(m)
    expanded = Compiled(
        compiled.graph,
        (
            *_with_overheads(compiled),
            *(f"(peers) {compiled.names[i]}" for i in held),
            *(
                f"(issued) {compiled.names[u]} -> {compiled.names[v]}"
                for u, v in zip(l_src, l_dst, strict=True)
            ),
        ),
        compiled.index,
        (*compiled.resources, "(unrecorded)", "(overhead)"),
        np.concatenate([res, np.full(n + k + m, n_res + 1, dtype=np.int64)]),
        np.concatenate(
            [src, n + every, 2 * n + np.arange(k), n + l_src, lag, direct_src, anchor_src]
        ),
        np.concatenate([n + dst, every, n + held, lag, n + l_dst, direct_dst, n + direct_dst]),
        np.concatenate([compiled.transfer, np.zeros(n + k + m, dtype=bool)]),
    )
    priority = np.concatenate([priority, np.full(k + m, -1, dtype=np.int64)])
    cap = np.concatenate([width, [max(1, n), max(1, n + k + m)]]).astype(np.int64)
    tail = max(0, t1 - t0 - int(end_of[:own][observed[:own]].max(initial=0))) / 1e9
    return StepModel(
        expanded, cap, priority, seconds, gap / 1e9, observed, tail, tuple(missing), violated,
        own_ready, t0, start_of,
    )  # fmt: skip


def _with_overheads(compiled: Compiled) -> tuple[str, ...]:
    """The op names of `compiled` followed by their overhead ops' (``(overhead) op``),
    named once per graph: (speed) every step of the rank has them."""
    held = _NAMED.get(id(compiled))
    if held is not None and held[0] is compiled:
        return held[1]
    names = (*compiled.names, *(f"(overhead) {name}" for name in compiled.names))
    _NAMED.clear()
    _NAMED[id(compiled)] = (compiled, names)
    return names


_NAMED: dict[int, tuple[Compiled, tuple[str, ...]]] = {}


MIN_COVER = 0.5  # a step whose records cover less of its wall-clock time is untypical
MAX_SLOWDOWN = 2.0  # a CPU thread's gaps slow down with its ops up to this factor


def _others(lending: np.ndarray, row: int) -> np.ndarray:
    """The rows a step's replay takes typical values from: the lending steps other than
    `row`, or every other step when none of them lends (leave one out)."""
    mask = lending.copy()
    mask[row] = False
    if not mask.any():
        mask = np.ones(len(lending), dtype=bool)
        mask[row] = False
    return mask


def nan_medians(table: np.ndarray) -> np.ndarray:
    """`np.nanmedian(table, axis=0)` for a 2-d `table` whose every column holds a
    number: the same values bit for bit (the mean of the two middle numbers is their sum
    halved, as numpy's masked median takes it), without the masked arrays numpy goes
    through for short columns (the replay asks once per step and rank)."""
    ordered = np.sort(table, axis=0)  # NaN last
    count = (~np.isnan(table)).sum(axis=0)
    cols = np.arange(table.shape[1])
    low, high = ordered[(count - 1) // 2, cols], ordered[count // 2, cols]
    return (low + high) / 2.0


def typical_overheads(
    models: Mapping[int, StepModel], lenders: Collection[int] | None = None
) -> dict[int, np.ndarray]:
    """Step -> the overhead per op the replay of that step uses: the median of the op's
    overhead over the *other* steps of the rank (leave one out) among `lenders` (all
    steps when None or when no other step lends).

    The replay must not be handed the step's own waits, or it reproduces the step by
    construction and its error says nothing: with the overhead of the other steps it
    predicts the step from what is typical of each op, as a plan's prediction must. An op
    seen in no other step (or a rank with one step) keeps its own overhead.
    """
    items = sorted(models)
    if not items:
        return {}
    table = np.stack([np.where(models[i].observed, models[i].overhead, np.nan) for i in items])
    lending = np.array([lenders is None or i in lenders for i in items])
    out = {}
    for row, it in enumerate(items):
        others = table[_others(lending, row)]
        typical = np.full(table.shape[1], np.nan)
        seen = (~np.isnan(others)).any(axis=0) if len(others) else np.zeros(len(typical), bool)
        if seen.any():
            typical[seen] = nan_medians(others[:, seen])
        out[it] = np.where(np.isnan(typical), models[it].overhead, typical)
    return out


def orphan_overheads(
    compiled: Compiled,
    models: Mapping[int, StepModel],
    overheads: Mapping[int, np.ndarray],
    own: int | None,
    lenders: Collection[int] | None = None,
) -> dict[int, np.ndarray]:
    """`overheads` (as `typical_overheads` gives them) with the orphans of each step
    waiting until their typical start: an orphan is an op with a record none of whose
    predecessors has one in this step, one of them recorded in another step.

    An op's typical overhead is its wait after its predecessors, but an orphan's ready
    time in this step is taken without the predecessor, so that wait would start it
    from a point it never started from: `generated/tf/cnn_ps_ingraph` worker0 step 3's
    PS read of `add` ended before the worker's first record (not in the step), and its
    recv, answered 10.2 ms into the step and 10.3 ms long, replayed from the step's
    start (its wait after the read is 2 us in the other steps); its busy time +12.6%.
    Its start in the step (the median over the other lending steps, as
    `typical_overheads` takes them) is what the other steps say of it. Only a
    predecessor among the joined PS work (numbered from `own` on) makes an orphan: an
    op of the rank's own missing from one step (a Kineto call named differently) leaves
    its successors' waits as they are, and a kernel's ready time holds its launch's
    offset, which a typical start would not. An op with another predecessor in the
    step waits after that one as usual: in the small CNN's between-graph run1
    (traces/tf) the PS's `global_step` read ended before worker1's step 3 began, but
    `Read/ReadVariableOp` ran 5 us after its other predecessor, 5.4 ms before its
    typical start.
    """
    items = sorted(models)
    if len(items) < 2 or own is None:
        return dict(overheads)
    g_src, g_dst = compiled.src, compiled.dst
    starts = np.stack([np.where(models[i].observed, models[i].start_of, np.nan) for i in items])
    lending = np.array([lenders is None or i in lenders for i in items])
    out = dict(overheads)
    for row, it in enumerate(items):
        model = models[it]
        elsewhere = ~np.isnan(np.delete(starts, row, axis=0)).all(axis=0)
        cut = model.observed[g_dst] & ~model.observed[g_src] & elsewhere[g_src] & (g_src >= own)
        held = sorted_unique(g_dst[model.observed[g_dst] & model.observed[g_src]])
        orphans = np.setdiff1d(sorted_unique(g_dst[cut]), held)  # no predecessor left
        others = starts[_others(lending, row)][:, orphans]
        seen = (~np.isnan(others)).any(axis=0)
        orphans, others = orphans[seen], others[:, seen]
        if not len(orphans):
            continue
        typical = nan_medians(others)
        waits = out[it].copy()
        waits[orphans] = np.maximum(typical - model.ready[orphans], 0) / 1e9
        out[it] = waits
    return out


def thread_speeds(
    compiled: Compiled, models: Mapping[int, StepModel], lenders: Collection[int] | None = None
) -> dict[int, np.ndarray]:
    """Step -> per op the factor the step's replay scales the op's typical overhead by:
    on a CPU thread (not a GPU stream, a network lane or a transfer), the median over
    the thread's ops of their duration in this step over their median duration in the
    other steps among `lenders` (as `typical_overheads` takes them), at most
    `MAX_SLOWDOWN` (at most 1 on a GPU rank); 1 elsewhere.

    The gaps between the ops of a Python thread are that thread's own work (the
    interpreter, the dispatcher), so they run as fast as its ops: `param/linear_kineto`
    step 1, its ops at 0.64 of their typical time, spent 0.31 ms between them against
    0.45 ms typically; the CPU loader loop's step 7, its ops at 1.27, spent 1.38x its
    typical gaps (a host stall). An op that ran far slower waited inside it (a blocking
    call, a contended lock) and the gaps share less of that: resnet DDP step 5, ops
    5.5-6.3x, gaps 1.5-2.3x; uncapped, its worst step replayed 4.6% off. On a GPU rank a
    CPU op also waits inside for the device (a sync, a pageable copy), so a slower step
    is not scaled: `param/resnet_kineto`'s main thread ran its ops at 2.2x their typical
    time in iteration 20 and its gaps at 0.68x; scaled up, its CPU range replayed 13.6%
    long (5.1% unscaled).
    """
    items = sorted(models)
    n = len(compiled.names)
    factors = {it: np.ones(n) for it in items}
    if len(items) < 2:
        return factors
    limit = 1.0 if _device_ops(compiled)[:n].any() else MAX_SLOWDOWN
    table = np.stack([np.where(models[i].observed, models[i].seconds[:n], np.nan) for i in items])
    table[table <= 0] = np.nan
    lending = np.array([lenders is None or i in lenders for i in items])
    thread = np.array([not r.startswith(("gpu", "net")) for r in compiled.resources])
    on_thread = thread[compiled.res[:n]] & ~compiled.transfer[:n]
    for row, it in enumerate(items):
        others = table[_others(lending, row)]
        seen = on_thread & ~np.isnan(table[row]) & (~np.isnan(others)).any(axis=0)
        if not seen.any():
            continue
        typical = np.full(n, np.nan)
        typical[seen] = nan_medians(others[:, seen])
        ratio = table[row] / typical
        for r in sorted_unique(compiled.res[:n][seen]):
            of_r = seen & (compiled.res[:n] == r)
            factors[it][compiled.res[:n] == r] = min(float(np.median(ratio[of_r])), limit)
    return factors


def covered_steps(
    models: Mapping[int, tuple[Mapping[str, np.ndarray], tuple[int, int], StepModel]],
    own: int | None = None,
) -> set[int]:
    """The steps whose records of the rank's own ops (the first `own` of the compiled
    graph, all when None) cover at least `MIN_COVER` of their wall-clock span (`models`:
    as `_step_models` gives them). A step covered less (a warm-up spent in what the
    trace does not record: TF1's first run of the merged timeline, 114 ms with 1%
    covered) is not judged by the bench and lends no overheads: its waits are not
    typical."""
    out = set()
    for it, (known, span, _) in models.items():
        rows = own_rows(known, own)
        wall = (span[1] - span[0]) / 1e9
        if len(rows["idx"]) and wall > 0 and measured(rows)[0] >= MIN_COVER * wall:
            out.add(it)
    return out


def own_rows(rows: Mapping[str, np.ndarray], own: int | None) -> dict[str, np.ndarray]:
    """The numpy columns `rows` (with ``idx``, the op index of each) of the rank's own
    ops: those numbered below `own` (all when None)."""
    if own is None:
        return dict(rows)
    keep = rows["idx"] < own
    return {k: v[keep] for k, v in rows.items()}


def with_overhead(model: StepModel, overhead: np.ndarray) -> StepModel:
    """`model` with `overhead` (s per op) in place of its own, on its observed ops."""
    n = len(new := np.where(model.observed, overhead, 0.0))
    seconds = model.seconds.copy()
    seconds[n : 2 * n] = new
    return replace(model, seconds=seconds, overhead=new)


def critical_waits(model: StepModel, start: np.ndarray, end: np.ndarray, last: int) -> np.ndarray:
    """Per op of the step's n ops: whether its wait (overhead op n + i) lies on the
    critical path that ends at op `last`, given `start`/`end` (ticks or ns, -1 unknown)
    of every op of `model.compiled`. Walked back from `last`: at each op, the
    predecessor that ended exactly when it started (an edge that held it), else the op
    of the same resource that did (a busy thread or channel); the walk stops where
    neither exists (the step's start, an op whose time is unknown)."""
    return _waits_on_path(held_by(model, start, end), start, last, len(model.overhead))


def held_by(model: StepModel, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per op of `model.compiled`, the op that held it (`critical_waits`' step back;
    -1: none). (speed) Fixed by the times alone: found once for every op, and shared by
    the walks from different ends (a GPU rank's device step and its CPU range)."""
    c = model.compiled
    # the held predecessor: the first edge into the op, in the graph's edge order, whose
    # source ended as the op started
    after = np.full(len(c.names), -1, dtype=np.int64)
    held = np.flatnonzero(end[c.src] == start[c.dst])
    took, first = np.unique(c.dst[held], return_index=True)
    after[took] = c.src[held[first]]
    # else the op of the same resource that ended as it started: the last of its run, by
    # (resource, end, index) as a dict would keep; (resource, end) as one sortable key
    known = np.flatnonzero(end >= 0)
    ends = sorted_unique(end[known])
    key_of = np.int64(len(ends) + 1)
    by_end = known[np.lexsort((known, end[known], c.res[known]))]
    keys = c.res[by_end] * key_of + np.searchsorted(ends, end[by_end])
    free = np.flatnonzero(after < 0)
    at = np.searchsorted(ends, start[free])
    exact = at < len(ends)
    exact[exact] = ends[at[exact]] == start[free[exact]]
    free, at = free[exact], at[exact]
    query = c.res[free] * key_of + at
    k = np.searchsorted(keys, query, "right") - 1
    hit = (k >= 0) & (keys[np.maximum(k, 0)] == query)
    after[free[hit]] = by_end[k[hit]]
    return after


def _waits_on_path(after: np.ndarray, start: np.ndarray, last: int, n: int) -> np.ndarray:
    """Per op of the step's n ops: whether its wait is on the walk from `last`."""
    waits = _walk(after, start > 0, last)
    on = np.zeros(n, dtype=bool)
    on[waits[(waits >= n) & (waits < 2 * n)] - n] = True
    return on


def _walk(after: np.ndarray, open_: np.ndarray, last: int) -> np.ndarray:
    """The ops from `last` on, each followed by ``after[op]``, up to (not with) the first
    that is -1 or not `open_`, and at most ``len(after)`` of them (a walk that comes back
    to an op would only go round again). (speed) By pointer doubling: a few numpy
    steps, not one Python step per op of the path."""
    m = len(after)
    jump = np.append(np.where(after >= 0, after, m), m)  # m: the end, where it stays
    valid = np.append(open_, False)
    path = np.array([last if last >= 0 else m], dtype=np.int64)
    while True:
        stop = np.flatnonzero(~valid[path])
        if len(stop):
            return path[: stop[0]]
        if len(path) >= m:
            return path[:m]
        path = np.concatenate([path, jump[path]])  # ops 0..2k-1 of the walk from 0..k-1
        jump = jump[jump]


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """`np.unique(values)` of a 1-d integer array by one sort: (speed) numpy 2's
    `unique` hashes first and costs ~15x a sort on the few thousand ends of a step."""
    ordered = np.sort(values, kind="stable")
    keep = np.ones(len(ordered), dtype=bool)
    keep[1:] = ordered[1:] != ordered[:-1]
    return ordered[keep]


def observed_times(model: StepModel, start_of: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (ns from the step's start, -1 unknown) of every op of
    `model.compiled` as the step ran them: each observed op at its record, its overhead
    op over the wait before it; the rest unknown."""
    n = len(model.overhead)
    start = np.full(len(model.compiled.names), -1, dtype=np.int64)
    end = start.copy()
    seen = np.flatnonzero(model.observed)
    wait = np.rint(model.overhead[seen] * 1e9).astype(np.int64)
    start[seen] = start_of[seen]
    end[seen] = start_of[seen] + np.rint(model.seconds[seen] * 1e9).astype(np.int64)
    start[n + seen] = start_of[seen] - wait
    end[n + seen] = start_of[seen]
    return start, end


def per_op(compiled: Compiled, values: Mapping[str, float]) -> np.ndarray:
    """`values` (op name -> number) as an array over `compiled`'s ops, NaN for the rest."""
    out = np.full(len(compiled.names), np.nan)
    for name, value in values.items():
        i = compiled.index.get(name)
        if i is not None:
            out[i] = value
    return out


def _cause(
    own: StepModel,
    used: StepModel,
    path: np.ndarray | None = None,
    queued: np.ndarray | None = None,
) -> str:
    """The largest unmodelled gap of a step, in words: missing records, the DAG edge the
    trace contradicts most, and the op whose wait in this step differs most from the
    typical one the replay used (a PS-side or peer wait, a slow input batch), among the
    waits of the `path` ops where any is: for the step's wall-clock time the waits on
    the step's or the replay's critical path (`critical_waits`; a wait off both paths
    moved no step end: a recv asked for late while the step waited for other tensors),
    for its busy time the rank's own ops (that recv spread the step's work).

    `queued` (ns per op, NaN unknown): how long TensorFlow's executor held the op queued
    with its inputs done before a thread ran it (`scheduled_micros`). The part of the
    wait it covers was a wait for a core or a thread, which no record of the step
    shows (mlp worker1 step 7: 12.3 ms, while worker1's executor ran nothing), and the
    cause says so: what a user can act on (cores per process, pinning)."""
    parts = []
    if own.missing:
        parts.append(
            f"{len(own.missing)} op(s) without a record in this step "
            f"(e.g. {own.missing[0]}), run at the oracle's time"
        )
    if own.violated is not None and own.violated[2] > 1e-4:
        u, v, late = own.violated
        parts.append(
            f"DAG edge {u} -> {v} contradicted by the trace ({v} started {late * 1e3:.3g} "
            f"ms before {u} started): dropped"
        )
    if len(own.overhead):
        diff = own.overhead - used.overhead
        if path is not None and path.any():
            diff = np.where(path, diff, 0.0)
        k = int(np.argmax(np.abs(diff)))
        if diff[k] != 0:
            parts.append(
                f"{own.compiled.names[k]} waited {own.overhead[k] * 1e3:.3g} ms before it "
                f"started in this step, {used.overhead[k] * 1e3:.3g} ms in the other steps "
                "(median)"
            )
            held = queued[k] / 1e9 if queued is not None and k < len(queued) else np.nan
            if held > 0:
                parts[-1] += (
                    f", {min(held, own.overhead[k]) * 1e3:.3g} ms of it queued in TensorFlow's "
                    "executor with its inputs done: a wait for a core or a thread"
                )
    return "; ".join(parts)


def topological_positions(compiled: Compiled) -> np.ndarray:
    """Position of each op in one topological order of the graph (cached per graph)."""
    cached = _TOPO.get(id(compiled.graph))
    if cached is not None and cached[0] is compiled.graph:
        return cached[1]
    n = len(compiled.names)
    indeg = np.bincount(compiled.dst, minlength=n)
    order = np.argsort(compiled.src, kind="stable")
    succ, ptr = (
        compiled.dst[order],
        np.concatenate([[0], np.cumsum(np.bincount(compiled.src, minlength=n))]),
    )
    # (speed) the walk over plain lists, not numpy scalars
    position_of = [0] * n
    frontier = np.flatnonzero(indeg == 0)[::-1].tolist()
    succ_of, ptr_of, need = succ.tolist(), ptr.tolist(), indeg.tolist()
    k = 0
    while frontier:
        i = frontier.pop()
        position_of[i] = k
        k += 1
        for j in succ_of[ptr_of[i] : ptr_of[i + 1]]:
            need[j] -= 1
            if need[j] == 0:
                frontier.append(j)
    position = np.array(position_of, dtype=np.int64)
    _TOPO.clear()
    _TOPO[id(compiled.graph)] = (compiled.graph, position)
    return position


_TOPO: dict[int, tuple[OpGraph, np.ndarray]] = {}


def rank_shape(
    compiled: Compiled, steps: Iterable[pd.DataFrame | tuple[pd.DataFrame, np.ndarray]]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dropped, width, always) over the complete steps of one rank: per edge of
    `compiled`, whether the trace contradicts it (its v started before its u did) in
    any step; per resource, the most ops it ever ran at once; per edge, whether every
    step that ran both its ops contradicts it.

    An edge the trace contradicts is not a wait of v for u but an order after u's
    *issue*, which the op table does not hold (TensorFlow runs an executor node once its
    GPU inputs' kernels are launched, not done: a DAG whose GPU node was timed by its
    kernels alone was contradicted so in every step of the TF1 GPU timeline).
    Dropped only in the steps that contradict it and kept in the others, it would make
    v's wait swing between steps with the GPU queue, and the typical wait of the other
    steps would miss by as much: it is dropped in every step of the rank. A step is its
    rows, or (its rows of `compiled`'s ops, their `op_rows` indices), those rows a
    DataFrame or numpy columns (``start``, ``duration``).
    """
    g_src, g_dst = compiled.src, compiled.dst
    dropped = np.zeros(len(g_src), dtype=bool)
    agreed = np.zeros(len(g_src), dtype=bool)  # some step ran u no later than v
    width = np.ones(len(compiled.resources), dtype=np.int64)
    for step in steps:
        rows, idx = step if isinstance(step, tuple) else op_rows(compiled, step)
        start = np.full(len(compiled.names), -1, dtype=np.int64)
        start[idx] = np.asarray(rows["start"], dtype=np.int64)
        seen = (start[g_src] >= 0) & (start[g_dst] >= 0)
        dropped |= seen & (start[g_dst] < start[g_src])
        agreed |= seen & (start[g_dst] >= start[g_src])
        lane = lanes(
            compiled.res[idx],
            np.asarray(rows["start"], dtype=np.float64),
            np.asarray(rows["duration"], dtype=np.float64),
        )
        np.maximum.at(width, compiled.res[idx], lane + 1)
    return dropped, width, dropped & ~agreed


def _step_models(
    compiled: Compiled,
    rows_of_rank: pd.DataFrame,
    oracle: TimeOracle,
    spans: Mapping[int, tuple[int, int]] | None,
    releases: Mapping[int, np.ndarray] | None = None,
    own: int | None = None,
    pools: bool = False,
    plan: PlanArrays | None = None,
) -> dict[int, tuple[dict[str, np.ndarray], tuple[int, int], StepModel]]:
    """Step -> (its rows, its span, its `step_model`) for each step of one rank; `own`:
    the rank's ops are the first `own` of `compiled` (the rest, PS work joined for the
    replay, count neither in the step's span nor in its missing records).
    `pools`: the rank's resources are pools (TensorFlow's inter-op thread pool, gRPC
    serving several transfers on one channel): one runs as many ops at once in every
    step as it ever did in one (`rank_shape`), not only as many as this step did;
    elsewhere (a Python thread, a GPU stream: one op at a time, a rare overlap in one
    step being that step's) each step keeps its own width.
    The edges the trace contradicts are dropped rank-wide either way. Partial steps do
    not shape the rank. A step's rows are numpy columns of its records of `compiled`'s
    ops: ``start``, ``duration`` (ns) and ``idx`` (the op index, `op_rows`). `plan`: the
    steps as the plan would run them (`step_model`)."""
    fallback = op_seconds(compiled, oracle)
    # (speed) the op indices looked up once for the rank and the columns taken as numpy,
    # then split by step (a step without a record of `compiled`'s ops has no model and
    # does not shape the rank); no pandas per step
    rows_known, idx_known = op_rows(compiled, rows_of_rank)
    iteration = rows_known["iteration"].to_numpy(dtype=np.int64)
    columns = {
        "start": rows_known["start"].to_numpy(dtype=np.int64),
        "duration": rows_known["duration"].to_numpy(dtype=np.int64),
        "idx": idx_known,
    }
    if "work" in rows_known:
        columns["work"] = rows_known["work"].to_numpy(dtype=np.int64)
    mine = idx_known < own if own is not None else np.ones(len(idx_known), dtype=bool)
    gone = missing_ops(idx_known[mine], iteration[mine], compiled.names, columns["duration"][mine])
    order = np.argsort(iteration, kind="stable")
    ordered = iteration[order]
    at = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if len(order) else order
    its = ordered[at]
    cuts = [*at.tolist(), len(order)]
    steps = []
    for k, it in enumerate(its.tolist()):
        take = order[cuts[k] : cuts[k + 1]]
        steps.append((int(it), {name: c[take] for name, c in columns.items()}))
    dropped, width, always = rank_shape(
        compiled, ((known, known["idx"]) for it, known in steps if it not in gone)
    )
    shape = (dropped, width if pools else np.ones_like(width), always)
    usual = usual_predecessors(compiled, (known for it, known in steps if it not in gone))
    models = {}
    for it, known in steps:
        of_rank = own_rows(known, own)  # the first own are mine
        if not len(of_rank["idx"]):
            continue
        first = int(of_rank["start"].min())
        last = int((of_rank["start"] + of_rank["duration"]).max())
        span = (spans or {}).get(it, (first, last))
        span = (min(span[0], first), max(span[1], last))
        release = None
        if releases is not None and it in releases:
            release = releases[it] - span[0]
            release[releases[it] < 0] = -1
        models[it] = (
            known,
            span,
            step_model(
                compiled, known, span, fallback, gone.get(it, ()), release, own, shape,
                known["idx"], plan, usual,
            ),
        )  # fmt: skip
    return models


def usual_predecessors(compiled: Compiled, steps: Iterable[Mapping[str, np.ndarray]]) -> np.ndarray:
    """Per op the op that ran just before it on its resource in more than half of the
    `steps` that recorded it (numpy columns ``start``, ``idx``; ties in start by the
    DAG's topological order, as `step_model` chains them), -1 where none did, or where
    it was first on its resource."""
    n = len(compiled.names)
    topo = topological_positions(compiled)
    candidate = np.full(n, -3, dtype=np.int64)
    lead = np.zeros(n, dtype=np.int64)
    preds = []
    for known in steps:
        idx = known["idx"]
        order = np.lexsort((topo[idx], known["start"], compiled.res[idx]))
        o_idx = idx[order]
        pred = np.full(n, -2, dtype=np.int64)  # -2: no record in the step
        pred[o_idx] = -1
        same = compiled.res[o_idx[1:]] == compiled.res[o_idx[:-1]]
        pred[o_idx[1:][same]] = o_idx[:-1][same]
        preds.append(pred)
        # majority vote (Boyer-Moore), op by op
        seen = pred != -2
        agree = seen & (pred == candidate)
        lead[agree] += 1
        fresh = seen & ~agree & (lead == 0)
        candidate[fresh], lead[fresh] = pred[fresh], 1
        lead[seen & ~agree & ~fresh] -= 1
    if not preds:
        return np.full(n, -1, dtype=np.int64)
    table = np.stack(preds)
    votes = (table == candidate).sum(axis=0)
    recorded = (table != -2).sum(axis=0)
    return np.where((2 * votes > recorded) & (candidate >= 0), candidate, -1)


def peer_releases(
    compiled: Mapping[str, Compiled],
    models: Mapping[str, Mapping[int, tuple[Any, tuple[int, int], StepModel]]],
) -> dict[str, dict[int, np.ndarray]]:
    """Rank -> step -> per op the latest time (epoch ns, -1 none) another rank was ready
    for the same collective or transfer (same name) in the same step.

    A collective starts when the slowest rank joins it; one rank's trace shows that
    wait only as a late start. With the peers' traces of the step the replay starts it
    no earlier than they were ready (hosts' clocks are taken as synchronised).
    """
    ready: dict[str, dict[int, dict[str, int]]] = {}
    for rank, steps in models.items():
        c = compiled[rank]
        shared = c.transfer
        for it, (_, _, model) in steps.items():
            keep = np.flatnonzero(shared & model.observed)
            ready.setdefault(rank, {})[it] = {
                c.names[i]: int(model.ready[i]) + model.t0 for i in keep
            }
    out: dict[str, dict[int, np.ndarray]] = {}
    for rank, steps in models.items():
        c = compiled[rank]
        for it in steps:
            latest = np.full(len(c.names), -1, dtype=np.int64)
            for peer, of_peer in ready.items():
                if peer == rank or it not in of_peer:
                    continue
                for name, t in of_peer[it].items():
                    i = c.index.get(name)
                    if i is not None and c.transfer[i]:
                        latest[i] = max(latest[i], t)
            out.setdefault(rank, {})[it] = latest
    return out


def _replay_rank(
    compiled: Compiled,
    rows_of_rank: pd.DataFrame,
    oracle: TimeOracle,
    seed: int,
    spans: Mapping[int, tuple[int, int]] | None = None,
    releases: Mapping[int, np.ndarray] | None = None,
    own: int | None = None,
    pools: bool = False,
    plans: Mapping[str, Plan] | None = None,
    cpu_spans: Mapping[int, tuple[int, int]] | None = None,
    queued: Mapping[int, Mapping[str, int]] | None = None,
    in_trace: int | None = None,
    enforce: str | None = "arrival",
) -> list[dict[str, Any]]:
    """The replayed steps of one rank (see `replay`); `own`, `pools`: as in `_step_models`;
    `plans`: each replayed on every step too (`_replay_plans`, TF plans as `enforce`
    applies them); `cpu_spans`: a GPU rank's steps as its CPU ran them (`cpu_spans_of`),
    timed beside the device's steps;
    `queued`: step -> op -> ns TensorFlow's executor held the op queued (`_cause`);
    `in_trace`: the first `in_trace` ops of `compiled` are the rank's trace (its own ops and
    the PS work its RunMetadata recorded, `own` when None): what covers its steps."""
    models = _step_models(compiled, rows_of_rank, oracle, spans, releases, own, pools)
    in_trace = own if in_trace is None else in_trace
    lenders = covered_steps(models, in_trace)
    traced_models = {it: m for it, (_, _, m) in models.items()}
    overheads = typical_overheads(traced_models, lenders)
    overheads = orphan_overheads(compiled, traced_models, overheads, own, lenders)
    if not pools:
        speed = thread_speeds(compiled, traced_models, lenders)
        overheads = {it: o * speed[it] for it, o in overheads.items()}
    device = _device_ops(compiled)[: len(compiled.names[:own])]
    steps = []
    for it, (known, span, traced) in models.items():
        model = with_overhead(traced, overheads[it])
        start, ticks = replay_step(model, seed)
        n = len(compiled.names[:own])
        begin, took = start[:n], ticks[:n]
        keep = model.observed[:n]
        recorded = (spans or {}).get(it)
        predicted_wall, ahead = timed_wall(model, start, ticks, span, recorded, device)
        timed = keep & device if (keep & device).any() else keep  # a GPU rank: its device
        predicted = busy_time(begin[timed], took[timed]) / TICKS_PER_SECOND
        holders = _holders(traced, start, ticks)
        path = _critical(traced, start, ticks, n, holders=holders)
        in_queue = per_op(compiled, (queued or {}).get(it, {}))
        cover = covered(own_rows(known, in_trace), (span[0] + ahead, span[1]))
        known = own_rows(known, n)
        busy, op_span = measured({k: v[timed[known["idx"]]] for k, v in known.items()})
        wall = (span[1] - span[0] - ahead) / 1e9
        error = predicted / busy - 1.0 if busy > 0 else None
        wall_error = predicted_wall / wall - 1.0 if wall > 0 else None
        step: dict[str, Any] = {
            "iteration": it,
            "predicted": predicted,
            "measured": busy,
            "span": op_span,
            "idle": op_span - busy,
            "replay_error": error,
            "wall": wall,
            "predicted_wall": predicted_wall,
            "wall_error": wall_error,
            "overhead": float(model.overhead[:n][keep].sum()),
            "overhead_from": "other steps" if len(models) > 1 else "own step",
            "ops_observed": int(len(known["idx"])),
            "cover": cover,
            "cause": _cause(traced, model, path, in_queue),
            "busy_cause": _cause(traced, model, np.arange(len(model.overhead)) < n, in_queue),
        }
        cpu_timed = timed_cpu(model, known, start, ticks, (cpu_spans or {}).get(it), device)
        if cpu_timed is not None:
            step["cpu_wall"], step["predicted_cpu_wall"] = cpu_timed
            step["cpu_wall_error"] = cpu_timed[1] / cpu_timed[0] - 1.0
            cpu_path = _critical(traced, start, ticks, n, ~device, holders)
            step["cpu_cause"] = _cause(traced, model, cpu_path)
        if model.missing:
            step["partial"] = records.note(str(rows_of_rank["rank"].iloc[0]), it, model.missing)
        steps.append(step)
    if plans:
        observed = {s["iteration"]: s["predicted_wall"] for s in steps}
        judged = _replay_plans(
            compiled, rows_of_rank, oracle, seed, spans, releases, own, pools, plans,
            overheads, observed, enforce,
        )  # fmt: skip
        for step in steps:
            step["plans"] = judged[step["iteration"]]
    return steps


def _replay_plans(
    compiled: Compiled,
    rows_of_rank: pd.DataFrame,
    oracle: TimeOracle,
    seed: int,
    spans: Mapping[int, tuple[int, int]] | None,
    releases: Mapping[int, np.ndarray] | None,
    own: int | None,
    pools: bool,
    plans: Mapping[str, Plan],
    overheads: Mapping[int, np.ndarray],
    observed: Mapping[int, float],
    enforce: str | None = "arrival",
) -> dict[int, dict[str, dict[str, Any]]]:
    """Step -> plan -> the step replayed as the plan would run it: the step's own op
    times, the typical waits the observed order's replay used, the planned ops in the
    plan's order and its control edges (`step_model`). ``predicted_wall`` (s, timed as
    `_replay_rank` times the step) and ``gain`` over the observed order's replay of the
    same step; ``error`` instead where the plan cannot run on the step (its order or
    edges close a cycle with what the step observed). On a TF job (`pools`) an ordered
    plan runs with the chain the TF module adds in mode `enforce` (`_enforced`; None:
    its priorities alone), and each entry names the mode it ran as (``enforce``)."""
    out: dict[int, dict[str, dict[str, Any]]] = {it: {} for it in observed}
    link: tuple[float, float] | None = None  # (message s, bytes/s), found once per rank
    op_bytes = _op_bytes(compiled) if pools else np.zeros(0)
    for name, plan in plans.items():
        try:
            arrays = plan_arrays(compiled, plan)
        except InputError as exc:
            for it in out:
                out[it][name] = {"error": exc.problem}
            continue
        waits = alone = np.zeros(0, dtype=np.int64)
        latency, least = 0.0, np.zeros(0)
        mode = enforce if pools and plan.order else None
        if mode is not None:  # as the TF module applies it (`enforced`)
            arrays, waits, alone = _enforced(compiled, own, plan, arrays, mode)
            link = link if link is not None else _link(compiled, rows_of_rank, own, op_bytes)
            latency = link[0]
            nbytes = np.nan_to_num(op_bytes[alone], nan=0.0)
            least = latency + (nbytes / link[1] if link[1] > 0 else 0.0)
        models = _step_models(compiled, rows_of_rank, oracle, spans, releases, own, pools, arrays)
        device = _device_ops(compiled)[: len(compiled.names[:own])]
        for it, (_, span, traced) in models.items():
            overhead = overheads[it]
            if len(waits):
                overhead = overhead.copy()
                overhead[waits] = np.maximum(overhead[waits], latency)
            model = with_overhead(traced, overhead)
            if len(alone):  # alone on its link: a message, then its bytes at the link's rate
                seconds = model.seconds.copy()
                seconds[alone] = np.maximum(seconds[alone], least)
                model = replace(model, seconds=seconds)
            try:
                start, ticks = replay_step(model, seed)
            except InputError:
                out[it][name] = {"error": "the plan's order closes a cycle with the step's"}
                continue
            wall, _ = timed_wall(traced, start, ticks, span, (spans or {}).get(it), device)
            gain = observed[it] / wall - 1.0 if wall > 0 else None
            out[it][name] = {"predicted_wall": wall, "gain": gain, "enforce": mode}
    return out


def _op_bytes(compiled: Compiled) -> np.ndarray:
    """Per op of `compiled`, the bytes it carries (NaN: unknown, e.g. a control message)."""
    return np.array([op.nbytes or np.nan for op in compiled.graph.ops.values()], dtype=float)


def _link(
    compiled: Compiled, rows: pd.DataFrame, own: int | None, op_bytes: np.ndarray
) -> tuple[float, float]:
    """(`enforced.control_message`, `enforced.link_throughput`) on the records of the
    replay's transfers: the rank's own (its first `own` ops) and, on a shared link, its
    peers'; `op_bytes`: `_op_bytes` of `compiled`."""
    idx = rows["op"].map(compiled.index).to_numpy(dtype=np.int64)
    transfer = compiled.transfer[idx]
    idx = idx[transfer]
    start = rows["start"].to_numpy(dtype=np.float64)[transfer]
    duration = rows["duration"].to_numpy(dtype=np.float64)[transfer]
    nbytes = op_bytes[idx]
    mine = idx < len(compiled.names[:own])
    return (
        enforced.control_message(start, duration, nbytes, mine),
        enforced.link_throughput(start, duration, nbytes),
    )


def _enforced(
    compiled: Compiled,
    own: int | None,
    plan: Plan,
    arrays: PlanArrays,
    mode: str,
) -> tuple[PlanArrays, np.ndarray, np.ndarray]:
    """`arrays` with the control edges the TF module adds for `plan` in `mode`, the ops
    that then wait for a control message and the transfers alone on their link
    (`enforced.chain`)."""
    n = len(compiled.names[:own])
    is_transfer = compiled.transfer[compiled.dst]
    joined = (compiled.src >= n) & (compiled.dst < n) & is_transfer
    feeder = dict(zip(compiled.dst[joined].tolist(), compiled.src[joined].tolist(), strict=True))
    index = {name: i for name, i in compiled.index.items() if i < n}
    ops = compiled.graph.ops
    reads = [
        t
        for t in plan.order
        if t in index
        and enforced.is_read(
            t, ops[compiled.names[feeder[index[t]]]].type if index[t] in feeder else None
        )
    ]
    src, dst, waits, alone = enforced.chain(reads, index, feeder, mode)
    return (
        PlanArrays(
            arrays.position, np.concatenate([arrays.src, src]), np.concatenate([arrays.dst, dst])
        ),
        waits,
        alone,
    )


def timed_wall(
    model: StepModel,
    start: np.ndarray,
    ticks: np.ndarray,
    span: tuple[int, int],
    recorded: tuple[int, int] | None,
    device: np.ndarray,
) -> tuple[float, int]:
    """(the replayed step's wall-clock time in s, how many ns its records began before
    its recorded start): from the end of the rank's n ops as replayed (`device`: per op
    of the n, whether it is device work, `_device_ops`; computed once per rank), plus the
    close after them as observed. The step's clock starts at its recorded start: on a
    GPU rank (the device's step) the CPU issued its records earlier, a step or two
    ahead (30 ms before a 19 ms step on the MI300 DDP trace); they are replayed, not
    timed. `span`: the step's span as the replay ran it (`_step_models`).

    A device step is timed in the replay as it is in the trace: from its first device
    op (a kernel, a copy, a collective) *as replayed*. Timed from the recorded start,
    any error in when the CPU got to the step's first launch counted as device time:
    `param/resnet_kineto`'s main thread runs nothing the trace records for 12-35 ms
    before each batch copy, and a replay that took 24 ms there read 12 ms longer a
    158 ms device step that the same kernels, launched 12 ms later, run as long."""
    n = len(device)
    keep = model.observed[:n]
    end = float((start[:n][keep] + ticks[:n][keep]).max(initial=0)) / TICKS_PER_SECOND
    ahead = max(0, recorded[0] - span[0]) if recorded is not None else 0
    on_device = keep & device
    if recorded is not None and on_device.any():
        return end + model.tail - float(start[:n][on_device].min()) / TICKS_PER_SECOND, ahead
    return end + model.tail - ahead / 1e9, ahead


def timed_cpu(
    model: StepModel,
    known: Mapping[str, np.ndarray],
    start: np.ndarray,
    ticks: np.ndarray,
    cpu_span: tuple[int, int] | None,
    device: np.ndarray,
) -> tuple[float, float] | None:
    """(the step's CPU range in s, as recorded and as replayed) on a GPU rank: what the
    training loop's own clock reads. The device's step leaves out what the CPU did before
    its first launch, the wait for a batch included (`param/resnet_kineto`: device steps
    of 150-171 ms in iterations of 124-829 ms). Replayed: from the recorded range start
    to the end of the rank's CPU ops as replayed, plus the close after them as observed.
    `known`: the rank's records of the step (``start``, ``duration``, ``idx``);
    `device`: as in `timed_wall`. None without a CPU range or a CPU record in it."""
    n = len(device)
    on_cpu = ~device
    cpu = model.observed[:n] & on_cpu
    if cpu_span is None or not cpu.any() or cpu_span[1] <= cpu_span[0]:
        return None
    begin, end = cpu_span
    mine = on_cpu[known["idx"]]
    last = int((known["start"][mine] + known["duration"][mine]).max())
    replayed = float((start[:n][cpu] + ticks[:n][cpu]).max()) / TICKS_PER_SECOND
    close = max(0, end - last) / 1e9
    return (end - begin) / 1e9, replayed + close + (model.t0 - begin) / 1e9


def cpu_spans_of(job: Job, rank: str) -> dict[int, tuple[int, int]]:
    """Iteration -> (start, end) ns of a GPU rank's steps as its CPU ran them (the
    ingest's record of each step's CPU range beside its device span; empty on a CPU
    rank, whose step spans are these)."""
    steps = rank_meta(job, rank).get("steps") or []
    return {int(s["step"]): (int(s["cpu_start"]), int(s["cpu_end"])) for s in steps}


def _device_ops(compiled: Compiled) -> np.ndarray:
    """Per op of `compiled`: device work of a GPU rank (an op on a GPU stream, or a
    transfer where the rank has GPU streams), as the ingest spans a GPU step and
    `graph.device_ops` counts it."""
    stream = np.array([on_gpu(r) for r in compiled.resources], dtype=bool)[compiled.res]
    return stream | compiled.transfer if stream.any() else stream


def covered(rows: Mapping[str, np.ndarray], window: tuple[int, int]) -> float:
    """Share of `window` (epoch ns) in which some of `rows` (``start``, ``duration``)
    runs: how much of the step the trace accounts for."""
    lo, hi = window
    if hi <= lo:
        return 0.0
    start = np.clip(np.asarray(rows["start"], dtype=np.int64), lo, hi)
    end = np.clip(np.asarray(rows["start"]) + np.asarray(rows["duration"]), lo, hi)
    return busy_time(start, end - start) / (hi - lo)


def replay_step(model: StepModel, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(start, duration) in ticks of every op of `model.compiled` as the replay runs the
    step: list scheduling, with each shared processor of `planner.prediction.host` (the host core
    a job's processes shared, a PS's links) shared evenly by the ops on it."""
    ticks = to_ticks(model.seconds)
    c = model.compiled
    cores = np.array([host.is_shared(r) for r in c.resources])
    if cores.any():
        begin, end = host.shared_schedule(
            ticks, c.src, c.dst, c.res, model.cap, model.priority, cores
        )
        if (end < 0).any():
            raise InputError(None, "the replay's edges make the graph cyclic: ops never run")
        start = np.rint(begin).astype(np.int64)
        return start, np.rint(end).astype(np.int64) - start
    arrays = _arrays(c, model.priority, (), model.cap)
    _, start, _ = _kernel(arrays, ticks, _draws(seed, [0], len(ticks)), True)
    return start[0], ticks


Holders = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _holders(traced: StepModel, begin: np.ndarray, ticks: np.ndarray) -> Holders:
    """The step's start, end and `held_by` as it ran, and `held_by` of its replay from
    `begin`/`ticks`: what every walk of `_critical` over the step reads."""
    start, end = observed_times(traced, traced.start_of)
    replayed_end = begin + ticks
    return (
        start,
        end,
        held_by(traced, start, end),
        held_by(traced, begin, replayed_end),
    )


def _critical(
    traced: StepModel,
    begin: np.ndarray,
    ticks: np.ndarray,
    own: int,
    among: np.ndarray | None = None,
    holders: Holders | None = None,
) -> np.ndarray:
    """Per op whether its wait lies on the critical path of the step as it ran or of
    its replay (`critical_waits`), each walked back from the rank's op that ended last
    (of the `among` ops, per op of the rank's `own`, where given: a GPU rank's CPU ops
    for its CPU range). `holders`: `_holders` of the step, when the caller walks from
    several ends (found once, not per walk)."""
    chosen = traced.observed[:own] if among is None else traced.observed[:own] & among
    mine = np.flatnonzero(chosen)
    n = len(traced.overhead)
    if not len(mine):
        return np.zeros(n, dtype=bool)
    start, end, ran, replayed = holders or _holders(traced, begin, ticks)
    replayed_end = begin + ticks
    on = _waits_on_path(ran, start, int(mine[np.argmax(end[mine])]), n)
    last = int(mine[np.argmax(replayed_end[mine])])
    return on | _waits_on_path(replayed, begin, last, n)


def _error_summary(steps: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median and largest-magnitude (signed) error against busy and wall-clock time, over
    the complete steps (partial ones are left out and counted), and the cause of the worst."""
    complete = [s for s in steps if not s.get("partial")]
    out: dict[str, Any] = {"partial_steps": len(steps) - len(complete)}
    for key, name in (("replay_error", "replay_error"), ("wall_error", "wall_error")):
        errors = np.array([s[key] for s in complete if s.get(key) is not None])
        if not len(errors):
            out[f"{name}_median"] = out[f"{name}_max"] = None
            continue
        out[f"{name}_median"] = float(np.median(errors))
        out[f"{name}_max"] = float(errors[np.argmax(np.abs(errors))])
    misses = [
        (abs(s[key]), s[key], label, s)
        for s in complete
        for key, label in (("wall_error", "wall-clock time"), ("replay_error", "busy time"))
        if s.get(key) is not None
    ]
    worst = max(misses, key=lambda m: m[0], default=None)
    miss = worst[1:] if worst is not None else None  # (error, figure, step)
    out["cause"] = _cause_of(miss[2], miss[1]) if miss is not None else ""
    out["warning"] = reliability_warning(miss)
    out.update(_cpu_range_summary(complete))
    if complete and all(s.get("overhead_from") == "own step" for s in complete):
        out["warning"] = (
            "one traced step per rank: its replay takes the overheads from the step itself "
            "and reproduces it by construction, so the predictions have no measured error "
            "(trace several steps)"
        )
    return out


def _cpu_range_summary(complete: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A GPU rank's CPU range (the training loop's clock, `timed_cpu`) over its complete
    steps: median and largest-magnitude (signed) ``cpu_wall_error``, and above
    `RELIABLE` a warning that its ``predicted_cpu_wall`` is unreliable, naming the worst
    step and its ``cpu_cause`` (the device's step, which the plans are judged on, has
    its own warning). None where no step has a CPU range (a CPU rank, whose step spans
    are its CPU's)."""
    scored = [s for s in complete if s.get("cpu_wall_error") is not None]
    if not scored:
        return {"cpu_wall_error_median": None, "cpu_wall_error_max": None, "cpu_warning": None}
    worst = max(scored, key=lambda s: abs(s["cpu_wall_error"]))
    error = float(worst["cpu_wall_error"])
    warning = None
    if abs(error) > RELIABLE:
        warning = (
            f"the step's CPU range (the training loop's clock, replayed beside the device's "
            f"step) misses step {worst['iteration']} by {error * 100:+.1f}% "
            f"(> {RELIABLE * 100:g}%): its predicted_cpu_wall is unreliable; largest "
            f"unmodelled gap: {worst.get('cpu_cause') or 'unknown'}"
        )
    return {
        "cpu_wall_error_median": float(np.median([s["cpu_wall_error"] for s in scored])),
        "cpu_wall_error_max": error,
        "cpu_warning": warning,
    }


def _comparison_error(
    entries: Sequence[dict[str, Any]], steps: Sequence[dict[str, Any]], knobs: Mapping[str, float]
) -> dict[str, Any]:
    """The comparison's own error: its prediction for the observed order (mean op times,
    one op at a time per resource) against the mean measured busy time of the complete
    steps. Meaningful only without what-if knobs; a warning above `RELIABLE`."""
    observed = next((e for e in entries if e["plan"] == "observed"), None)
    busy = [s["measured"] for s in steps if not s.get("partial") and s["measured"] > 0]
    if observed is None or not busy or any(knobs[k] != v for k, v in KNOBS.items()):
        return {"comparison_error": None, "comparison_warning": None}
    error = observed["predicted"] / float(np.mean(busy)) - 1.0
    warning = None
    if abs(error) > RELIABLE:
        warning = (
            f"the plan comparison predicts the observed order {error * 100:+.1f}% off the "
            "measured busy time (mean op times, one op at a time per resource): its plan "
            "gains are uncertain by as much; each plan's replayed gain (the traced steps "
            "replayed with the plan, the replay error above being its error) is the one to "
            "go by"
        )
    return {"comparison_error": error, "comparison_warning": warning}


def reliability_warning(worst: tuple[float, str, Mapping[str, Any]] | None) -> str | None:
    """A warning when the replay of the observed order misses a complete step by more
    than `RELIABLE`: `worst` = (its largest error, signed; the figure it is of,
    wall-clock or busy time; the step), the warning naming that step, the figure and
    the step's largest unmodelled gap; None when every prediction beside it can be
    trusted to that error."""
    if worst is None:
        return "no complete step to replay: predictions have no measured error"
    error, figure, step = worst
    if abs(error) <= RELIABLE:
        return None
    return (
        f"predictions unreliable: the replay of the observed order misses the {figure} "
        f"of step {step['iteration']} by {error * 100:+.1f}% (> {RELIABLE * 100:g}%); "
        f"largest unmodelled gap: {_cause_of(step, figure) or 'unknown'}"
    )


def _cause_of(step: Mapping[str, Any], figure: str) -> str:
    """The step's cause for a miss of `figure`: of its wall-clock time, the gap on the
    critical path (``cause``); of its busy time, the largest anywhere among the rank's
    ops (``busy_cause``): a recv answered late while the step waited for other tensors
    moves no step end but spreads the step's work (TF cnn worker0 step 3)."""
    key = "busy_cause" if figure == "busy time" else "cause"
    return str(step.get(key) or step.get("cause") or "")


def replay(
    job: Job,
    *,
    seed: int = 0,
    frame: pd.DataFrame | None = None,
    plans: Mapping[str, Mapping[str, Plan]] | None = None,
    enforce: str | None = "arrival",
) -> dict[str, Any]:
    """Each traced step of each rank with its own op times and observed order.

    Per step: predicted and measured (busy makespan) iteration time, span, idle and
    ``replay_error``; per rank the median and the largest-magnitude error (signed).
    `frame`: the job's `with_dedicated` timings, when the caller has them already.
    `plans` ({name: {rank: Plan}}): each step also replayed as each plan would run it
    (``plans`` per step, `_replay_plans`): the same model, so the replay error of the
    observed order is the error beside each plan's prediction. On a TF job an ordered
    plan runs as ``planner export --enforce`` `enforce` applies it (`planner.prediction.enforced`;
    None: its priorities alone, which no TF runtime module applies).
    A TF job runs its compute on one shared host core where its records say its
    processes had one (`host.on_one_core`), else its transfers on its PS's shared links
    (`host.on_links`).
    """
    frame = _frame(job) if frame is None else frame
    releases = job_releases(job, frame)
    pools = job.framework == "tensorflow"
    shared_core = host.one_core(job, frame)
    ranks = []
    for rank in job.ranks:
        own = len(job.graphs[rank].ops)
        graph, rows, release = joint_work(
            job, rank, frame[frame["rank"] == rank], releases.get(rank)
        )
        in_trace = len(graph.ops)  # the rank's ops and the PS work of its RunMetadata
        spans = spans_of(job, rank)
        if shared_core is not None:
            graph, rows, release = host.on_one_core(job, rank, graph, rows, release, frame, spans)
        elif pools:
            graph, rows, release = host.on_links(job, rank, graph, rows, release, frame, spans)
        compiled = compile_graph(graph)
        oracle = mean_of_runs(graph, rows)
        release = _latest(release, carried_over(compiled, rows, spans, queued_before(job, rank)))
        of_rank = {name: p[rank] for name, p in (plans or {}).items() if rank in p}
        steps = _replay_rank(
            compiled, rows, oracle, seed, spans, release, own, pools, of_rank,
            cpu_spans_of(job, rank), rank_meta(job, rank).get("queued"), in_trace, enforce,
        )  # fmt: skip
        ranks.append({"rank": rank, **_error_summary(steps), "steps": steps})
    document = {"schema": SCHEMA, "kind": "replay", "ranks": ranks, **_all_errors(ranks)}
    if shared_core is not None:
        document["shared_core"] = shared_core
    return document


def carried_over(
    compiled: Compiled,
    rows: pd.DataFrame,
    spans: Mapping[int, tuple[int, int]] | None = None,
    queued: Mapping[str, int] | None = None,
) -> dict[int, np.ndarray]:
    """Step -> per op the end (epoch ns, -1 none) of the previous traced step's last op
    on the op's resource: a GPU stream still running the kernels the CPU queued a step
    ahead cannot start this step's before (the queue a step begins with). On resources
    whose previous step ended before this one began it releases nothing. The first
    traced step, whose previous step is not in the trace, begins on each GPU stream and
    on the collectives' resources with the queue the trace recorded before it
    (`queued`: the end of the work issued before profiling began, `queued_before`; none
    where it recorded none) and elsewhere, or where the trace recorded no such work at
    all, with the typical queue: per resource the median over the other steps of that
    end less the step's start (its recorded span's, else its first record's)."""
    rows, idx = op_rows(compiled, rows)
    if not len(rows):
        return {}
    # (speed) per step its first start and per (step, resource) its last end, by one
    # sort and numpy reductions rather than pandas group-bys
    res = compiled.res[idx]
    start = rows["start"].to_numpy()
    end = (rows["start"] + rows["duration"]).to_numpy()
    steps, step_of = np.unique(rows["iteration"].to_numpy(), return_inverse=True)
    order = np.lexsort((res, step_of))
    step_sorted, res_sorted = step_of[order], res[order]
    at_step = np.flatnonzero(np.r_[True, step_sorted[1:] != step_sorted[:-1]])
    at_pair = np.flatnonzero(
        np.r_[True, (step_sorted[1:] != step_sorted[:-1]) | (res_sorted[1:] != res_sorted[:-1])]
    )
    first = np.minimum.reduceat(start[order], at_step)
    last_end = np.maximum.reduceat(end[order], at_pair)
    pair_step, pair_res = step_sorted[at_pair], res_sorted[at_pair]
    position = {int(it): k for k, it in enumerate(steps.tolist())}
    for it, (begin, _end) in (spans or {}).items():
        if it in position:
            first[position[it]] = begin
    n_res = len(compiled.resources)
    queue: dict[int, np.ndarray] = {}  # step -> per resource previous end - step start
    for k in range(1, len(steps)):
        q = np.full(n_res, np.nan)
        previous = pair_step == k - 1
        q[pair_res[previous]] = last_end[previous] - first[k]
        queue[int(steps[k])] = q
    head = np.full(n_res, np.nan)
    if len(queue) > 1:
        table = np.stack(list(queue.values()))
        seen = (~np.isnan(table)).any(axis=0)
        head[seen] = nan_medians(table[:, seen])
    if queued:  # the recorded queue on the streams and the collectives' resources
        for r, name in enumerate(compiled.resources):
            key = "net" if name.split(":")[0] == "net" else name
            if on_gpu(name) or key == "net":
                head[r] = queued[key] - first[0] if key in queued else np.nan
    if len(queue) > 1 or queued:
        queue[int(steps[0])] = head
    out = {}
    for it, q in queue.items():
        offset = np.nan_to_num(q).round().astype(np.int64)  # ns; epochs stay integers
        last = np.where(np.isnan(q), -1, offset + int(first[position[it]]))
        out[it] = last[compiled.res]
    return out


def _latest(
    a: Mapping[int, np.ndarray] | None, b: Mapping[int, np.ndarray]
) -> dict[int, np.ndarray]:
    """Per step the later of two release arrays (-1: none)."""
    out = {it: r.copy() for it, r in (a or {}).items()}
    for it, r in b.items():
        out[it] = np.maximum(out[it], r) if it in out else r.copy()
    return out


def job_releases(job: Job, frame: pd.DataFrame) -> dict[str, dict[int, np.ndarray]]:
    """`peer_releases` of a job (empty with one rank)."""
    if len(job.ranks) < 2:
        return {}
    compiled, models = {}, {}
    for rank in job.ranks:
        graph = job.graphs[rank]
        compiled[rank] = compile_graph(graph)
        rows = frame[frame["rank"] == rank]
        models[rank] = _step_models(
            compiled[rank],
            rows,
            mean_of_runs(graph, rows),
            spans_of(job, rank),
            pools=job.framework == "tensorflow",
        )
    return peer_releases(compiled, models)


def joint_work(
    job: Job,
    rank: str,
    rows: pd.DataFrame,
    releases: Mapping[int, np.ndarray] | None,
) -> tuple[OpGraph, pd.DataFrame, dict[int, np.ndarray] | None]:
    """The graph, records and releases the replay runs for `rank`: its own, or, for a
    TF worker, its partition joined with the parameter servers' work it exchanges
    tensors with (``Job.meta["replay"]``, `planner.ingest.tf_runmetadata._ps_work`).

    The recvs at a TF step's start wait for the PS to read the variables, and a
    SyncReplicas token waits for the PS to apply the gradients, differently in every
    step; replayed with the worker, the PS ops run at their observed durations with
    their typical overheads, and the worker's recvs wait for them. PS work that waits
    for no worker is released at its traced start (a peer's trace, as for collectives);
    a PS op that reads another worker's tensor, at that tensor's arrival.
    """
    joint = (job.meta.get("replay") or {}) if isinstance(job.meta, Mapping) else {}
    graph = (joint.get("graphs") or {}).get(rank)
    if graph is None:
        return job.graphs[rank], rows, releases
    extra = pd.DataFrame(
        [r for r in joint.get("rows", ()) if r[0] == rank],
        columns=["rank", "iteration", "op", "start", "duration"],
    )
    extra["dedicated"] = extra["duration"]
    joined = pd.concat([rows, extra.astype({"start": "int64", "duration": "int64"})])
    index = compile_graph(graph).index
    n_own = len(job.graphs[rank].ops)
    out: dict[int, np.ndarray] = {}
    steps = set(rows["iteration"].unique().tolist())
    for it in steps:
        latest = np.full(len(index), -1, dtype=np.int64)
        if releases is not None and it in releases:
            latest[:n_own] = releases[it]
        for name, t in ((joint.get("release") or {}).get(rank, {}).get(it) or {}).items():
            if name in index:
                latest[index[name]] = max(latest[index[name]], t)
        out[int(it)] = latest
    return graph, joined, out


def spans_of(job: Job, rank: str) -> dict[int, tuple[int, int]]:
    """Iteration -> (start, end) ns of the rank's recorded step spans (wall-clock).
    (speed) From the trace's numpy columns: no DataFrame view is built for them."""
    spans = job.trace.span_table
    mine = np.asarray(spans["rank"], dtype=object) == rank
    columns = (np.asarray(spans[k])[mine].tolist() for k in ("iteration", "start", "end"))
    return {int(i): (int(a), int(b)) for i, a, b in zip(*columns, strict=True)}


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
    steps = observed_priorities(compiled, rows)
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
    if replayed is None or any(rank not in replayed for rank in job.ranks):
        replayed = {**replayed_steps(replay(job, seed=seed, frame=frame)), **(replayed or {})}
    ranks = []
    for rank in job.ranks:
        graph = job.graphs[rank]
        compiled = compile_graph(graph)
        rows = rank_rows(frame, rank)
        oracle = oracles[rank] if oracles is not None else mean_of_runs(graph, rows)
        steps = replayed[rank]
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
    replayed = replay(job, seed=seed, frame=frame, plans=plans, enforce=enforce)
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
