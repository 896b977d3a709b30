"""The event loop: seeded samples of one plan on a compiled graph (`run`, `simulate`), the
structure arrays and random draws the list-scheduling kernel (`planner.prediction._simkernel`)
takes, and the figures of a run (TicTac's bounds, Caramel's overlap, percentiles, the
recorded sample's timeline). Apart from the replay because it knows nothing of traced
steps: a DAG, op times and a plan in, makespans out."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from planner.errors import InputError
from planner.measure.metrics import caramel_figures
from planner.model.graph import OpGraph
from planner.model.oracle import TimeOracle
from planner.model.plan import Plan
from planner.model.trace import busy_time
from planner.planning.ticks import TICKS_PER_SECOND
from planner.prediction import _simkernel
from planner.prediction.compiled import (
    Compiled,
    _plan_parts,
    capacities,
    compile_graph,
    op_seconds,
    priority_array,
    to_ticks,
)


@dataclass(frozen=True)
class Run:
    """Samples of one plan: makespans (s) and the recorded sample's start/lane per op."""

    makespan: np.ndarray
    seconds: np.ndarray
    recorded: int | None = None
    start: np.ndarray | None = None
    lane: np.ndarray | None = None


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
    compiled: Compiled | None = None,
) -> Run:
    """One-call form of `run` for a graph, its op times and a plan (or bare priorities);
    `compiled`: `compile_graph(graph)`, where the caller runs several plans on it."""
    compiled = compile_graph(graph) if compiled is None else compiled
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
