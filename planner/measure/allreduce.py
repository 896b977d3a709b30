"""Job-level figures of an all-reduce (data-parallel) job, per rank and across ranks.

`allreduce_metrics(job)` returns the ``planner.allreduce/1`` document: Caramel §3.1
per step and rank (C, N, T, rho, alpha, utilization), per-collective transfer windows,
straggler time per step across ranks, and per-rank / job summaries. Times in seconds;
times inside a step (``ready``, ``window_end``) are offsets from the step's start.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from planner.errors import InputError
from planner.measure.metrics import OverlapMetrics, overlap_figures
from planner.model.graph import OpGraph, on_gpu
from planner.model.trace import Job, op_flags
from planner.model.waits import with_step_waits

if TYPE_CHECKING:
    import pandas as pd

SCHEMA = "planner.allreduce/1"


def _rank_columns(job: Job, rank: str) -> dict[str, Any]:
    """One rank's timing rows as numpy columns (`Trace.table` order), with ``code``: each
    row's index into ``names`` (`Trace.op_codes`), so that an op's attributes are looked
    up once per name (`_op_flags`)."""
    table = job.trace.table
    rows = job.trace.rows_of(rank)
    names, codes = job.trace.op_codes
    columns = {k: table[k][rows] for k in table if k != "rank"}
    columns.update(code=codes[rows], names=names)
    return columns


def _op_flags(graph: OpGraph, columns: dict[str, Any]) -> dict[str, np.ndarray]:
    """Per row of `columns` (`_rank_columns`): whether its op is a collective, a compute op
    that counts for C (`_compute_mask`) and a forward op (`trace.op_flags`), kept in
    `columns`: the steps' figures and the windows both ask."""
    if "flags" not in columns:
        # GPU compute kernels when the rank has any (memcpy and memset move data, as
        # HTA's memory kernels), else all compute ops but the waits for the step's input
        gpu_rank = any(o.kind == "compute" and on_gpu(o.resource) for o in graph.ops.values())
        found = op_flags(
            graph, columns["names"], columns["code"],
            lambda o: o.kind == "collective",
            lambda o: o.kind == "compute" and o.is_work
            and (not gpu_rank or (on_gpu(o.resource) and not _is_memory(o.type))),
            lambda o: o.phase == "forward",
        )  # fmt: skip
        columns["flags"] = dict(zip(("collective", "compute", "forward"), found, strict=True))
    return columns["flags"]


def _collectives(graph: OpGraph, columns: dict[str, Any]) -> np.ndarray:
    """Per row of `columns`: its op is a collective."""
    return _op_flags(graph, columns)["collective"]


def _compute_mask(graph: OpGraph, columns: dict[str, Any]) -> np.ndarray:
    """Per row of `columns`: its op is a compute op that counts for C."""
    return _op_flags(graph, columns)["compute"]


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
    step's ``wait``, `planner.model.waits`), as HTA counts communication kernel time."""
    return _rank_steps(job, rank, _rank_columns(job, rank))


def _rank_steps(job: Job, rank: str, columns: dict[str, Any]) -> list[OverlapMetrics]:
    """`rank_steps` from the rank's `_rank_columns`."""
    graph = job.graphs[rank]
    spans = job.trace.span_table
    mine = spans["rank"] == rank
    span_of = dict(
        zip(
            spans["iteration"][mine].tolist(),
            (spans["end"][mine] - spans["start"][mine]).tolist(),
            strict=True,
        )
    )
    network = _collectives(graph, columns)
    picked = np.flatnonzero(_compute_mask(graph, columns) | network)
    picked = picked[np.argsort(columns["iteration"][picked], kind="stable")]
    steps, cuts = np.unique(columns["iteration"][picked], return_index=True)
    starts, durations = columns["start"][picked], columns["duration"][picked]
    net = network[picked]
    out = []
    for i, (iteration, lo) in enumerate(zip(steps.tolist(), cuts.tolist(), strict=True)):
        hi = int(cuts[i + 1]) if i + 1 < len(cuts) else len(picked)
        out.append(
            overlap_figures(
                rank,
                int(iteration),
                starts[lo:hi],
                durations[lo:hi],
                net[lo:hi],
                span_of[iteration],
            )  # fmt: skip
        )
    return out


def rank_windows(job: Job, rank: str) -> pd.DataFrame:
    """Transfer windows of one rank's collectives (ns, absolute): per collective, the
    window from its gradient being ready (its launch, never after its start) to the first
    read of its parameters in the next step (else the next step's first forward read, or
    its start); `slack` is the window less the time from ready to the transfer's end.
    The last step's windows are NaN."""
    import pandas as pd

    windows = _rank_windows(job, rank, _rank_columns(job, rank))
    frame = pd.DataFrame(
        {k: windows[k] for k in ("iteration", "op", "start", "duration", "wait", "ready")}
    )
    frame["window_end"] = windows["window_end"]
    frame["window"] = windows["window"]
    frame["slack"] = windows["slack"]
    return frame


def _rank_windows(job: Job, rank: str, columns: dict[str, Any]) -> dict[str, np.ndarray]:
    """`rank_windows` as numpy columns, from the rank's `_rank_columns`: the collectives'
    rows (``iteration``, ``op`` (object), ``start``, ``duration``, ``wait``) with
    ``ready``, ``window_end``, ``window`` and ``slack`` (float64, NaN without an end;
    ``window_end`` int64 when every row has one)."""
    graph = job.graphs[rank]
    iteration, start = columns["iteration"], columns["start"]
    is_coll = np.flatnonzero(_collectives(graph, columns))
    coll = {k: columns[k][is_coll] for k in ("iteration", "op", "start", "duration")}
    wait = columns.get("wait")
    coll["wait"] = wait[is_coll] if wait is not None else np.zeros(len(is_coll), np.int64)
    c_ops = coll["op"].tolist()
    launchers = _launchers(graph, list(dict.fromkeys(c_ops)))
    wanted = set(launchers.values())
    starts: dict[tuple[int, str], int] = {}  # (step, launcher) -> its first row's start
    hit = np.flatnonzero([n in wanted for n in columns["names"]])
    launching = np.flatnonzero(np.isin(columns["code"], hit))
    names = columns["names"]
    for it, code, first in zip(
        iteration[launching].tolist(),
        columns["code"][launching].tolist(),
        start[launching].tolist(),
        strict=True,
    ):
        starts.setdefault((it, names[code]), first)
    ready = np.array(
        [
            starts.get((it, launchers[op]), first) if launchers[op] else first
            for it, op, first in zip(
                coll["iteration"].tolist(), c_ops, coll["start"].tolist(), strict=True
            )
        ],
        dtype=np.float64,
    )
    forward = np.flatnonzero(_op_flags(graph, columns)["forward"])
    first_read = _first_starts(iteration[forward], start[forward])
    if not first_read:  # no phase ranges: the next step's start is the earliest read
        spans = job.trace.span_table
        mine = spans["rank"] == rank
        first_read = dict(
            zip(spans["iteration"][mine].tolist(), spans["start"][mine].tolist(), strict=False)
        )
    own = _first_reads(job, rank, columns)
    ends = [
        own[op].get(s + 1, np.nan) if op in own else first_read.get(s + 1, np.nan)
        for s, op in zip(coll["iteration"].tolist(), c_ops, strict=True)
    ]
    # int64 when every row has an end, as pandas makes the column: ns since the epoch
    # pass 2**53, so an end less its step's start is exact only in integers
    whole = bool(ends) and not any(type(e) is float for e in ends)
    window_end = np.array(ends, dtype=np.int64 if whole else np.float64)
    coll["ready"] = np.minimum(ready, coll["start"])
    coll["window_end"] = window_end
    coll["window"] = window_end - coll["ready"]
    coll["slack"] = coll["window"] - (coll["start"] + coll["duration"] - coll["ready"])
    return coll


def _first_starts(iteration: np.ndarray, start: np.ndarray) -> dict[int, int]:
    """Iteration -> the earliest `start` of its rows, in iteration order."""
    if not len(iteration):
        return {}
    order = np.lexsort((start, iteration))
    steps, first = np.unique(iteration[order], return_index=True)
    return dict(zip(steps.tolist(), start[order][first].tolist(), strict=True))


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
    return _first_reads(job, rank, _rank_columns(job, rank))


def _first_reads(job: Job, rank: str, columns: Mapping[str, Any]) -> dict[str, dict[int, int]]:
    """`collective_first_reads` from the rank's `_rank_columns`."""
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
    code = {name: i for i, name in enumerate(columns["names"])}
    out: dict[str, dict[int, int]] = {}
    for coll, ops in readers.items():
        if coll in unknown:
            continue
        rows = np.flatnonzero(np.isin(columns["code"], [code[o] for o in ops if o in code]))
        found = _first_starts(columns["iteration"][rows], columns["start"][rows])
        out[coll] = {int(k): int(v) for k, v in found.items()}
    return out


def transfer_orders(job: Job, rank: str) -> int:
    """How many distinct collective orders (by start) the steps of a rank show."""
    return _transfer_orders(_rank_windows_rows(job, rank))


def _rank_windows_rows(job: Job, rank: str) -> Mapping[str, np.ndarray]:
    columns = _rank_columns(job, rank)
    rows = _collectives(job.graphs[rank], columns)
    return {k: columns[k][rows] for k in ("iteration", "start", "op")}


def _transfer_orders(coll: Mapping[str, np.ndarray]) -> int:
    """`transfer_orders` from the rank's collective rows (``iteration``, ``start``,
    ``op``, in table order)."""
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
    if not job.trace.rows:
        raise InputError(job.sources[0] if job.sources else None, "metrics need timings; none")
    steps: list[dict[str, Any]] = []
    ranks: list[dict[str, Any]] = []
    transfers: list[dict[str, Any]] = []
    collective_rows: dict[str, list[Any]] = {
        k: [] for k in ("iteration", "op", "start", "duration", "wait", "rank")
    }
    spans = job.trace.span_table
    for rank in job.ranks:
        graph = job.graphs[rank]
        columns = _rank_columns(job, rank)
        per_step = _rank_steps(job, rank, columns)
        steps.extend(_step_dict(s) for s in per_step)
        mine = spans["rank"] == rank
        base_of = dict(zip(spans["iteration"][mine].tolist(), spans["start"][mine].tolist(),
                           strict=False))  # fmt: skip
        windows = _rank_windows(job, rank, columns)
        counts = Counter(p.get("collective") for p in rank_parameters(job, rank))
        listed = {k: v.tolist() for k, v in windows.items()}
        for it, name, start, duration, wait, ready, end, window, slack in zip(
            *(listed[k] for k in ("iteration", "op", "start", "duration", "wait")),
            *(listed[k] for k in ("ready", "window_end", "window", "slack")),
            strict=True,
        ):
            base = base_of.get(it, start)
            op = graph.ops[name]
            transfers.append(
                {
                    "rank": rank,
                    "iteration": int(it),
                    "name": name,
                    "param": op.param,
                    "collective": op.type,
                    "resource": op.resource,
                    "nbytes": op.nbytes,
                    "parameters": counts.get(name),
                    "ready": float(ready - base) / 1e9,
                    "start": float(start - base) / 1e9,
                    "duration": float(duration) / 1e9,
                    "wait": float(wait) / 1e9,
                    "transfer": float(duration - wait) / 1e9,
                    "window_end": _seconds(end - base),
                    "window": _seconds(window),
                    "slack": _seconds(slack),
                }
            )
        for k in ("iteration", "op", "start", "duration", "wait"):
            collective_rows[k].extend(listed[k])
        collective_rows["rank"].extend([rank] * len(listed["op"]))
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
                "collectives_per_step": int(len(listed["op"]) / max(len(per_step), 1)),
                "distinct_transfer_orders": _transfer_orders(windows),
            }
        )
    straggler_list = with_step_waits(collective_rows, steps)
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
