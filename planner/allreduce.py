"""Job-level figures of an all-reduce (data-parallel) job, per rank and across ranks.

`allreduce_metrics(job)` returns the ``planner.allreduce/1`` document: Caramel §3.1
per step and rank (C, N, T, rho, alpha, utilization), per-collective transfer windows,
straggler time per step across ranks, and per-rank / job summaries. Times in seconds;
times inside a step (``ready``, ``window_end``) are offsets from the step's start.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pandas as pd

from planner.errors import InputError
from planner.graph import OpGraph
from planner.metrics import OverlapMetrics, overlap_metrics, transfer_windows
from planner.trace import Job
from planner.waits import with_step_waits

SCHEMA = "planner.allreduce/1"


def _compute_mask(graph: OpGraph, ops: pd.Series) -> np.ndarray:
    """Compute ops that count for C: GPU compute kernels when the rank has any (memcpy
    and memset move data, as HTA's memory kernels), else all compute ops."""
    on_gpu = any(o.kind == "compute" and o.resource.startswith("gpu") for o in graph.ops.values())
    counted = {
        n
        for n, o in graph.ops.items()
        if o.kind == "compute"
        and (not on_gpu or (o.resource.startswith("gpu") and not _is_memory(o.type)))
    }
    return np.fromiter((n in counted for n in ops.tolist()), dtype=bool, count=len(ops))


def _of_rows(graph: OpGraph, ops: pd.Series, field: str, value: str) -> np.ndarray:
    """Per row of `ops` (op names): whether the op's `field` is `value` (as plain Python
    strings: iterating a pandas string column element by element is ~20x slower)."""
    hits = {n for n, o in graph.ops.items() if getattr(o, field) == value}
    return np.fromiter((n in hits for n in ops.tolist()), dtype=bool, count=len(ops))


def _is_memory(event: str) -> bool:
    """A GPU memcpy or memset (Kineto names them ``Memcpy ...`` / ``Memset ...``)."""
    return event[:6].lower() in ("memcpy", "memset")


def _launchers(graph: OpGraph, ops: list[str]) -> dict[str, str | None]:
    """Op -> the CPU op that launched it (its first compute predecessor off the GPU, in
    the graph's edge order), for each collective of `ops`. (speed) From the edge arrays:
    the networkx view costs a few ms per rank to build, for a few dozen look-ups."""
    names = graph.names
    index = {name: i for i, name in enumerate(names)}
    wanted = np.array([index[op] for op in ops], dtype=np.int64)
    edges = np.flatnonzero(np.isin(graph.dst, wanted))
    preds: dict[str, list[str]] = {op: [] for op in ops}
    for u, v in zip(graph.src[edges].tolist(), graph.dst[edges].tolist(), strict=True):
        preds[names[v]].append(names[u])
    out: dict[str, str | None] = {}
    for op in ops:
        out[op] = next(
            (
                p
                for p in preds[op]
                if graph.ops[p].kind == "compute" and not graph.ops[p].resource.startswith("gpu")
            ),
            None,
        )
    return out


def rank_steps(job: Job, rank: str) -> list[OverlapMetrics]:
    """Caramel's figures for every step of one rank, from what the rank saw: N holds a
    collective's whole span, its wait for later peers included (reported apart as the
    step's ``wait``, `planner.waits`), as HTA counts communication kernel time."""
    graph = job.graphs[rank]
    rows = job.trace.of(rank)
    spans = job.trace.spans[job.trace.spans["rank"] == rank].set_index("iteration")
    compute = _compute_mask(graph, rows["op"])
    network = _of_rows(graph, rows["op"], "kind", "collective")
    picked = rows[compute | network]
    net = network[compute | network]
    out = []
    for iteration, idx in picked.groupby("iteration", sort=True).indices.items():
        span = spans.loc[iteration]
        out.append(
            overlap_metrics(
                rank, int(iteration), picked.iloc[idx], net[idx], span["end"] - span["start"]
            )
        )
    return out


def rank_windows(job: Job, rank: str) -> pd.DataFrame:
    """Transfer windows of one rank's collectives (ns, absolute)."""
    graph = job.graphs[rank]
    rows = job.trace.of(rank)
    is_coll = _of_rows(graph, rows["op"], "kind", "collective")
    coll = rows[is_coll].reset_index(drop=True)
    if "wait" not in coll:  # a job without multi-rank waits (planner JSON, one rank)
        coll = coll.assign(wait=0)
    c_ops = coll["op"].tolist()
    launchers = _launchers(graph, list(dict.fromkeys(c_ops)))
    wanted = set(launchers.values())
    starts: dict[tuple[int, str], int] = {}  # (step, launcher) -> its first row's start
    columns = (rows["iteration"].tolist(), rows["op"].tolist(), rows["start"].tolist())
    for it, op, start in zip(*columns, strict=True):
        if op in wanted:
            starts.setdefault((it, op), start)
    ready = pd.Series(
        [
            starts.get((it, launchers[op]), start) if launchers[op] else start
            for it, op, start in zip(
                coll["iteration"].tolist(), c_ops, coll["start"].tolist(), strict=False
            )
        ],
        dtype="float64",
    )
    forward = _of_rows(graph, rows["op"], "phase", "forward")
    first_read = rows[forward].groupby("iteration")["start"].min().to_dict()
    if not first_read:  # no phase ranges: the next step's start is the earliest read
        spans = job.trace.spans[job.trace.spans["rank"] == rank]
        first_read = dict(zip(spans["iteration"], spans["start"], strict=False))
    return transfer_windows(coll, ready, first_read, collective_first_reads(job, rank))


def rank_parameters(job: Job, rank: str) -> list[dict[str, Any]]:
    """The rank's parameters (``Job.meta["parameters"]``): name, nbytes, collective, ..."""
    table = job.meta.get("parameters")
    rows = table.get(rank) if isinstance(table, dict) else None
    return list(rows) if isinstance(rows, list) else []


def collective_first_reads(job: Job, rank: str) -> dict[str, dict[int, int]]:
    """Collective -> iteration -> ns of the earliest first read among its parameters.

    Only collectives whose parameters are known (`rank_parameters`) and all have a
    first-read op appear; the others keep the conservative end (first forward op).
    """
    params = rank_parameters(job, rank)
    if not params:
        return {}
    readers: dict[str, set[str]] = {}
    unknown: set[str] = set()
    for p in params:
        coll, op = p.get("collective"), p.get("first_read_op")
        if coll is None:
            continue
        if op is None:
            unknown.add(coll)
        else:
            readers.setdefault(coll, set()).add(op)
    rows = job.trace.of(rank)
    starts = rows.groupby(["op", "iteration"])["start"].min()
    out: dict[str, dict[int, int]] = {}
    for coll, ops in readers.items():
        if coll in unknown:
            continue
        picked = starts[starts.index.get_level_values("op").isin(list(ops))]
        per_step = picked.groupby(level="iteration").min()
        out[coll] = {int(k): int(v) for k, v in per_step.items()}
    return out


def transfer_orders(job: Job, rank: str) -> int:
    """How many distinct collective orders (by start) the steps of a rank show."""
    graph = job.graphs[rank]
    rows = job.trace.of(rank)
    coll = rows[_of_rows(graph, rows["op"], "kind", "collective")]
    steps: dict[int, list[tuple[int, str]]] = {}
    for it, start, op in zip(
        coll["iteration"].tolist(), coll["start"].tolist(), coll["op"].tolist(), strict=True
    ):
        steps.setdefault(it, []).append((start, op))
    # by (start, op) as a stable sort on both: rows equal in both name the same op
    return len({tuple(op for _, op in sorted(pairs)) for pairs in steps.values()})


def _mean(values: list[float | None]) -> float | None:
    """The mean of the values given (None: a figure that does not apply to that step)."""
    finite = [v for v in values if v is not None and np.isfinite(v)]
    return float(np.mean(finite)) if finite else None


def allreduce_metrics(job: Job) -> dict[str, Any]:
    """`planner.allreduce/1`: per step and rank, per rank, per collective, per job."""
    if not len(job.trace.timings):
        raise InputError(job.sources[0] if job.sources else None, "metrics need timings; none")
    steps: list[dict[str, Any]] = []
    ranks: list[dict[str, Any]] = []
    transfers: list[dict[str, Any]] = []
    collective_rows = []
    for rank in job.ranks:
        graph = job.graphs[rank]
        per_step = rank_steps(job, rank)
        steps.extend(_step_dict(s) for s in per_step)
        spans = job.trace.spans[job.trace.spans["rank"] == rank].set_index("iteration")["start"]
        windows = rank_windows(job, rank)
        counts = Counter(p.get("collective") for p in rank_parameters(job, rank))
        for row in windows.itertuples(index=False):
            base = spans.get(row.iteration, row.start)
            op = graph.ops[row.op]
            transfers.append(
                {
                    "rank": rank,
                    "iteration": int(row.iteration),
                    "name": row.op,
                    "param": op.param,
                    "collective": op.type,
                    "resource": op.resource,
                    "nbytes": op.nbytes,
                    "parameters": counts.get(row.op),
                    "ready": float(row.ready - base) / 1e9,
                    "start": float(row.start - base) / 1e9,
                    "duration": float(row.duration) / 1e9,
                    "wait": float(row.wait) / 1e9,
                    "transfer": float(row.duration - row.wait) / 1e9,
                    "window_end": _seconds(row.window_end - base),
                    "window": _seconds(row.window),
                    "slack": _seconds(row.slack),
                }
            )
        collective_rows.append(
            windows[["iteration", "op", "start", "duration", "wait"]].assign(rank=rank)
        )
        ranks.append(
            {
                "rank": rank,
                "steps": len(per_step),
                "compute_mean": _mean([s.compute for s in per_step]),
                "network_mean": _mean([s.network for s in per_step]),
                "iteration_time_mean": _mean([s.iteration_time for s in per_step]),
                "idle_mean": _mean([s.idle for s in per_step]),
                "rho_mean": _mean([s.rho for s in per_step]),
                "alpha_mean": _mean([s.alpha for s in per_step]),
                "utilization_mean": _mean([s.utilization for s in per_step]),
                "collectives_per_step": int(len(windows) / max(len(per_step), 1)),
                "distinct_transfer_orders": transfer_orders(job, rank),
            }
        )
    straggler_list = with_step_waits(pd.concat(collective_rows, ignore_index=True), steps)
    return {
        "schema": SCHEMA,
        "framework": job.framework,
        "steps": steps,
        "ranks": ranks,
        "transfers": transfers,
        "stragglers": straggler_list,
        "job": job_summary(len(job.ranks), steps, straggler_list),
        "clock_alignment": job.meta.get("clock_alignment"),
    }


def job_summary(
    ranks: int, steps: list[dict[str, Any]], stragglers: list[dict[str, Any]]
) -> dict[str, Any]:
    """The ``job`` block of ``planner.allreduce/1`` from its steps and stragglers."""
    return {
        "ranks": ranks,
        "iteration_time_mean": _mean([s["iteration_time"] for s in steps]),
        "utilization_mean": _mean([s["utilization"] for s in steps]),
        "alpha_mean": _mean([s["alpha"] for s in steps]),
        "rho_mean": _mean([s["rho"] for s in steps]),
        "straggler_time_mean": _mean([s["straggler_time"] for s in stragglers]),
        "straggler_time_max": max((s["straggler_time"] for s in stragglers), default=None),
    }


def _seconds(ns: float) -> float | None:
    return None if ns is None or not np.isfinite(ns) else float(ns) / 1e9


def _step_dict(s: OverlapMetrics) -> dict[str, Any]:
    return {
        "rank": s.rank,
        "iteration": s.iteration,
        "compute": s.compute,
        "network": s.network,
        "iteration_time": s.iteration_time,
        "busy_time": s.busy_time,
        "idle": s.idle,
        "rho": s.rho if np.isfinite(s.rho) else None,
        "alpha": s.alpha,
        "utilization": s.utilization,
    }
