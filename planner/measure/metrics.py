"""Scheduling-efficiency figures (TicTac §3.2) and transfer-order stability (§2.2).

Per iteration, with that iteration's own dedicated op times:
``umax = sum Time(op)`` (all serial), ``lmin = max_resource sum Time(op on it)``
(every resource always busy), ``efficiency = (umax - m) / (umax - lmin)`` and
``speedup_bound = (umax - lmin) / lmin``.

The makespan ``m`` is the iteration's busy time: its span less the ``idle`` time in
which none of the rank's ops ran (waiting on something outside the DAG — the PS's
own compute, another worker, the client). Idle time is no ordering effect, so it is
reported on its own instead of being charged to the schedule; with it removed,
``lmin <= m <= umax`` holds by construction and E lies in [0, 1].

A wait for the step's input (phase ``input``: the DataLoader's ``__next__``) is no work
of the model: it is in the span, and its time is idle, as any wait on something outside
the DAG.

On a GPU rank the figures count the device work only (GPU streams and collectives): a
CPU op and the kernel it launches are one chain of work, not two serial pieces, and
the CPU issuing ahead is no part of the iteration's makespan. A rank without transfers
has nothing to order: its E and S do not apply and are None.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from planner.model.graph import OpGraph, device_ops, on_gpu  # noqa: F401 (device_ops: this module's API)
from planner.model.trace import Job, busy_time, rank_meta

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class StepMetrics:
    """TicTac's figures for one iteration of one rank; times in seconds."""

    rank: str
    iteration: int
    makespan: float
    idle: float
    busy_makespan: float
    umax: float
    lmin: float
    efficiency: float | None  # None: no transfers, nothing to order
    speedup_bound: float | None
    transfer_order: tuple[str, ...]


def bounds(times: Mapping[str, float], graph: OpGraph) -> tuple[float, float]:
    """(Umax, Lmin) of Equations 1 and 2 for op times in seconds."""
    per_resource: dict[str, float] = {}
    for name, t in times.items():
        resource = graph.ops[name].resource if name in graph.ops else "?"
        per_resource[resource] = per_resource.get(resource, 0.0) + t
    umax = float(sum(per_resource.values()))
    lmin = float(max(per_resource.values(), default=0.0))
    return umax, lmin


def efficiency(umax: float, lmin: float, makespan: float) -> float:
    """Equation 3; 1.0 when the bounds coincide (no ordering can matter)."""
    if umax - lmin <= 0:
        return 1.0
    return float(min(1.0, max(0.0, (umax - makespan) / (umax - lmin))))


def speedup_bound(umax: float, lmin: float) -> float:
    """Equation 4: the most the best schedule can gain over the worst."""
    return float((umax - lmin) / lmin) if lmin > 0 else 0.0


def collectives_alone(job: Job, rank: str) -> bool:
    """Whether `rank` is the only rank of its job (``distributedInfo.world_size`` 1) and
    its transfers are all collectives: NCCL returns from them at once, and no byte
    crosses a network, so there is no transfer to order (HTA's ns trace: 8-32 MB all-reduces of
    20 us each; its E swung from 0.12 to 0.70 over a 0.13-0.17 ms Umax - Lmin)."""
    if rank_meta(job, rank).get("world_size") != 1:
        return False
    kinds = {op.kind for op in job.graphs[rank].ops.values()}
    return "collective" in kinds and not kinds & {"send", "recv"}


def step_metrics(
    graph: OpGraph,
    rank: str,
    iteration: int,
    rows: pd.DataFrame,
    device: frozenset[str] | None = None,
) -> StepMetrics:
    """Figures of one iteration from its rows (with `dedicated` and `resource`).

    `device` (`device_ops`) restricts a GPU rank's rows to its device work.
    """
    columns = {k: rows[k].to_numpy() for k in ("op", "start", "duration", "dedicated")}
    columns["resource"] = rows["resource"].to_numpy(object)
    columns["iteration"] = np.full(len(rows), iteration, dtype=np.int64)
    found = rank_step_metrics(graph, rank, columns, device)
    return found[0] if found else _empty_step(rank, iteration)


def _empty_step(rank: str, iteration: int) -> StepMetrics:
    return StepMetrics(rank, iteration, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, ())


def rank_step_metrics(
    graph: OpGraph,
    rank: str,
    columns: Mapping[str, np.ndarray],
    device: frozenset[str] | None = None,
) -> list[StepMetrics]:
    """`step_metrics` of every iteration of one rank, in iteration order, from its rows
    as numpy columns (`op`, `iteration`, `start`, `duration`, `resource`, `dedicated`).

    (speed) One pass over the rank instead of a pandas group-by per step: the sums per
    step and resource are pandas' (`group_sums`), so the figures are the same to the bit.
    """
    ops = np.asarray(columns["op"], dtype=object)
    iteration = np.asarray(columns["iteration"], dtype=np.int64)
    steps = np.unique(iteration, return_index=True)[0].tolist()
    if device is not None:
        keep = np.fromiter((n in device for n in ops.tolist()), dtype=bool, count=len(ops))
    else:
        keep = np.ones(len(ops), dtype=bool)
    rows = np.flatnonzero(keep)
    rows = rows[np.argsort(iteration[rows], kind="stable")]
    starts = np.asarray(columns["start"], dtype=np.int64)[rows]
    durations = np.asarray(columns["duration"], dtype=np.int64)[rows]
    ends = starts + durations
    kept_steps = iteration[rows]
    names = ops[rows].tolist()
    labels, resource = np.unique(np.asarray(columns["resource"], dtype=object)[rows],
                                 return_inverse=True)  # fmt: skip
    step_of = np.searchsorted(np.array(steps, dtype=np.int64), kept_steps)
    dedicated = np.asarray(columns["dedicated"], dtype=np.float64)[rows]
    inputs = {n for n, op in graph.ops.items() if not op.is_work}
    work = np.ones(len(names), dtype=bool)
    if inputs:  # (speed) most ranks have none: no pass over their rows
        work = np.fromiter((n not in inputs for n in names), dtype=bool, count=len(names))
    present = np.zeros((len(steps), max(len(labels), 1)), dtype=bool)
    present[step_of[work], resource[work]] = True
    ordered = {name for name, op in graph.ops.items() if op.kind in ("recv", "collective")}
    applies = any(op.is_transfer for op in graph.ops.values())
    cuts = np.searchsorted(kept_steps, steps + [steps[-1] + 1] if steps else [])
    out = []
    for i, number in enumerate(steps):
        lo, hi = int(cuts[i]), int(cuts[i + 1])
        mine = lo + np.flatnonzero(work[lo:hi])  # the step's rows but its input waits
        if not len(mine):
            out.append(_empty_step(rank, number))
            continue
        span = float(ends[lo:hi].max() - starts[lo:hi].min())
        busy = float(busy_time(starts[mine], durations[mine]))
        # as pandas' groupby("resource") of the step's rows: each resource's sum (the
        # resources present, in sorted order), in the rows' order
        code = np.cumsum(present[i]) - 1
        per_resource = group_sums(dedicated[mine], code[resource[mine]], int(present[i].sum()))
        umax = float(per_resource.sum()) / 1e9
        lmin = float(per_resource.max()) / 1e9
        m = busy / 1e9
        # by (end, op): rows equal in both name the same op, so any stable order is this one
        pairs = sorted(
            (e, n) for e, n in zip(ends[lo:hi].tolist(), names[lo:hi], strict=True) if n in ordered
        )
        out.append(
            StepMetrics(
                rank=rank,
                iteration=number,
                makespan=span / 1e9,
                idle=(span - busy) / 1e9,
                busy_makespan=m,
                umax=umax,
                lmin=lmin,
                efficiency=efficiency(umax, lmin, m) if applies else None,
                speedup_bound=speedup_bound(umax, lmin) if applies else None,
                transfer_order=tuple(n for _, n in pairs),
            )
        )
    return out


def group_sums(values: np.ndarray, labels: np.ndarray, groups: int) -> np.ndarray:
    """Per label in ``range(groups)``: the sum of its `values` as pandas (3.x)
    ``Series(values).groupby(labels).sum()`` gives it, to the bit: with labels that
    never decrease in row order (and no NaN), ``np.add.reduceat`` over each label's run
    (pandas' fast path); else each label's values added in row order, Kahan-compensated
    (pandas' Cython ``group_sum``).

    (speed) A label whose values are all whole numbers summing below 2**53 adds exactly
    in any order: those are summed at once; only the others are added one by one.
    """
    values = np.asarray(values, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.int64)
    out = np.zeros(groups, dtype=np.float64)
    if not len(values):
        return out
    if not (np.diff(labels) < 0).any() and not np.isnan(values).any():
        starts = np.flatnonzero(np.concatenate([[True], labels[1:] != labels[:-1]]))
        out[labels[starts]] = np.add.reduceat(values, starts)
        return out
    whole = np.isfinite(values) & (values == np.floor(values))
    size = np.bincount(labels[whole], weights=np.abs(values[whole]), minlength=groups)
    inexact = (np.bincount(labels[~whole], minlength=groups) > 0) | (size >= 2.0**53)
    out = np.bincount(labels, weights=np.where(whole, values, 0.0), minlength=groups)
    for label in np.flatnonzero(inexact).tolist():
        total = compensation = 0.0
        for value in values[labels == label].tolist():
            if value != value:  # NaN: skipped, as pandas skips it
                continue
            y = value - compensation
            t = total + y
            compensation = t - total - y
            if compensation != compensation:  # an infinite value: pandas resets it
                compensation = 0.0
            total = t
        out[label] = total
    return out


def distinct_orders(steps: list[StepMetrics]) -> int:
    """How many different transfer completion orders the iterations show (TicTac §2.2).

    The transfers ordered are the recvs of a PS worker or the collectives of a rank.
    """
    return len({s.transfer_order for s in steps if s.transfer_order})


def queued_times(
    queued: Mapping[int, Mapping[str, int]], columns: Mapping[str, np.ndarray]
) -> dict[int, float]:
    """Iteration -> seconds of the step in which some op of the rank had its inputs
    done and sat queued in TensorFlow's executor, waiting for a thread or a core: the
    union of [start - queued, start] over its ops, from the step's first record on.
    `queued`: per iteration and op, the ns TensorFlow recorded (`scheduled_micros` to
    the start; the RunMetadata ingest's ``Job.meta["ranks"][rank]["queued"]``);
    `columns`: the rank's rows (``op``, ``iteration``, ``start``). It is part of the
    busy time when other ops of the rank ran meanwhile, of the idle time when none did:
    a job short of cores shows it (the generated TF cnn job: 20-41% of each step, its
    three processes on one core; the generated mlp job, on two: 7-12%)."""
    ops = np.asarray(columns["op"], dtype=object)
    iteration = np.asarray(columns["iteration"], dtype=np.int64)
    start = np.asarray(columns["start"], dtype=np.int64)
    found: dict[int, float] = {}
    for step, of_step in queued.items():
        rows = np.flatnonzero(iteration == int(step))
        if not len(rows):
            continue
        wait = np.fromiter((of_step.get(o, 0) for o in ops[rows]), np.int64, len(rows))
        held = wait > 0
        begin = start[rows][held]
        since = np.maximum(begin - wait[held], start[rows].min())  # within the step's span
        found[int(step)] = busy_time(since, begin - since) / 1e9
    return found


def summarize(steps: list[StepMetrics]) -> dict[str, float | None]:
    """Mean/min of efficiency and mean makespan over iterations (None where E and S
    do not apply)."""
    if not steps:
        return {}
    eff = np.array([s.efficiency for s in steps if s.efficiency is not None])
    bound = [s.speedup_bound for s in steps if s.speedup_bound is not None]
    return {
        "efficiency_mean": float(eff.mean()) if len(eff) else None,
        "efficiency_min": float(eff.min()) if len(eff) else None,
        "makespan_mean": float(np.mean([s.makespan for s in steps])),
        "busy_makespan_mean": float(np.mean([s.busy_makespan for s in steps])),
        "speedup_bound_mean": float(np.mean(bound)) if bound else None,
        "distinct_transfer_orders": distinct_orders(steps),
    }


# --------------------------------------------------------------------------------------
# All-reduce jobs (Caramel §3.1): overlap, ratio, utilization; transfer windows; stragglers


@dataclass(frozen=True)
class OverlapMetrics:
    """Caramel's figures for one iteration of one rank; times in seconds.

    ``compute`` C and ``network`` N are the lengths of the unions of the compute and
    of the collective intervals; ``iteration_time`` T is the iteration's span and
    ``busy_time`` the union of both (T less ``idle``, the time in which neither ran).
    ``alpha`` uses the busy time in place of T, as `efficiency` uses the busy makespan:
    idle time is no overlap effect, and with it removed ``alpha`` lies in [0, 1] and
    ``utilization`` = C / busy_time in (0, 1].
    """

    rank: str
    iteration: int
    compute: float
    network: float
    iteration_time: float
    busy_time: float
    idle: float
    rho: float
    alpha: float
    utilization: float


def caramel_figures(compute: float, network: float, iteration: float) -> tuple[float, float, float]:
    """(rho, alpha, utilization) of Caramel §3.1 for C, N and iteration time T.

    ``rho = N / C``, ``alpha = (N + C - T) / min(N, C)``,
    ``utilization = 1 / (1 + rho - alpha * min(rho, 1))``. Without network time
    alpha is 1 and utilization 1; without compute, rho is inf and utilization 0.
    """
    if compute <= 0:
        return float("inf") if network > 0 else 0.0, 0.0, 0.0
    rho = network / compute
    if network <= 0:
        return 0.0, 1.0, 1.0
    # in [0, 1] for a busy time that is the union of C and N; clamp float rounding
    alpha = min(1.0, max(0.0, (network + compute - iteration) / min(network, compute)))
    utilization = 1.0 / (1.0 + rho - alpha * min(rho, 1.0))
    return float(rho), float(alpha), float(utilization)


def overlap_figures(
    rank: str,
    iteration: int,
    starts: np.ndarray,
    durations: np.ndarray,
    is_network: np.ndarray,
    span: float,
) -> OverlapMetrics:
    """Figures of one iteration from its compute rows and collective rows.

    `starts`/`durations` (ns) of the ops that count as compute or network (the caller
    picks the compute device: GPU kernels when there are any); `is_network` marks the
    collectives; `span` is the iteration time T in ns.
    """
    net = np.asarray(is_network, dtype=bool)
    c = busy_time(starts[~net], durations[~net]) / 1e9
    n = busy_time(starts[net], durations[net]) / 1e9
    busy = busy_time(starts, durations) / 1e9
    rho, alpha, utilization = caramel_figures(c, n, busy)
    t = max(float(span) / 1e9, busy)
    return OverlapMetrics(rank, iteration, c, n, t, busy, t - busy, rho, alpha, utilization)
