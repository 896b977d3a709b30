"""An FSDP rank's traced steps as the FSDP what-if replays them (`rank_programs`): per
step, the rank's compute as one thread that progresses, and each collective as a
transfer on its lane released at a point of that progress and waited for at another.

A traced step spans ``[t0, t1)``. The rank waits for a collective while the collective
runs and the rank computes nothing: its exposed time (rank meta ``exposed``, counted
from the innermost ops where the trace is read), taken as the last ``exposed`` ns
before the collective's end. Progress ``p(t)`` is the time since ``t0`` less the waits
before ``t``. A collective is released (issued) at ``p(start)`` and needed at
``p(end - exposed)``: the rank could not go on past that point without it. A fully
hidden collective is taken as needed where it ended (the earliest point the trace
cannot rule out). The step's compute is ``p(t1)``.

Apart from `planner.prediction.fsdp_whatif` because it reads the trace; the what-if only
moves release and need points and durations.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from planner.measure.communication import exposed_ns
from planner.model.arrays import covered, merged
from planner.model.trace import Job, op_flags, rank_meta
from planner.prediction.releases import spans_of

FSDP_KINDS = ("all_gather", "reduce_scatter")


def is_fsdp(job: Job, rank: str) -> bool:
    """Whether `rank` of `job` reduce-scatters (FSDP, ZeRO): what the what-if needs."""
    called = rank_meta(job, rank).get("collectives") or {}
    return any((c or {}).get("kind") == "reduce_scatter" for c in called.values())


def rank_programs(job: Job, rank: str) -> dict[int, dict[str, Any]]:
    """Step -> its program: ``measured`` (s, the step's wall span), ``compute`` (s, the
    progress at its end), ``backward_at`` (s, the progress where its first backward op
    started; None without one) and ``collectives``: per collective of the step in start
    order ``op``, ``kind``, ``unit`` (the FSDP unit, else its bytes), ``phase``, ``bytes``,
    ``lane``, ``seconds`` (traced), ``release`` and ``need`` (s of progress), ``beside``
    (s the rank computed while it was in flight, from its issue) and ``ahead`` (issued
    in a prefetch). Steps without a traced span are left out."""
    graph = job.graphs[rank]
    meta = rank_meta(job, rank)
    called = meta.get("collectives") or {}
    shown = meta.get("exposed") or {}
    flight = meta.get("in_flight") or {}
    table, rows = job.trace.table, job.trace.rows_of(rank)
    ops = np.asarray(table["op"])[rows]
    steps = np.asarray(table["iteration"])[rows].astype(np.int64)
    start = np.asarray(table["start"])[rows].astype(np.int64)
    took = np.asarray(table["duration"])[rows].astype(np.int64)
    names, codes = job.trace.op_codes
    is_coll, is_back = op_flags(graph, names, codes[rows], lambda o: o.kind == "collective",
                                lambda o: o.phase == "backward")  # fmt: skip
    out: dict[int, dict[str, Any]] = {}
    for it, (t0, t1) in sorted(spans_of(job, rank).items()):
        in_step = steps == it
        mine = np.flatnonzero(in_step)
        if not len(mine):
            continue
        coll_rows = np.flatnonzero(in_step & is_coll)
        coll = coll_rows[np.lexsort((coll_rows, start[coll_rows]))].tolist()
        ends = np.array([start[i] + took[i] for i in coll], dtype=np.int64)
        x = np.array([exposed_ns(shown, it, ops[i], int(took[i])) for i in coll], dtype=np.int64)
        waits = merged(ends - x, ends) if len(coll) else (ends, ends)
        seen = [_in_flight(flight, it, ops[i], int(took[i] - x[k])) for k, i in enumerate(coll)]

        def progress(t: np.ndarray, t0: int = t0, waits: Any = waits) -> np.ndarray:
            t = np.asarray(t, dtype=np.int64)
            return ((t - t0) - covered(np.full(len(t), t0), t, waits)) / 1e9

        back = start[in_step & is_back].tolist()
        out[it] = {
            "measured": (t1 - t0) / 1e9,
            "compute": float(progress(np.array([t1]))[0]),
            "backward_at": float(progress(np.array([min(back)]))[0]) if back else None,
            "collectives": [
                {**c, "beside": b, "ahead": a}
                for c, (b, a) in zip(
                    _collectives(graph, called, ops, coll, start, took, x, progress),
                    seen,
                    strict=True,
                )
            ],
        }
    return out


def _in_flight(flight: Any, step: int, op: str, hidden: int) -> tuple[float, bool]:
    """One occurrence's compute while in flight (s) and whether it was issued ahead, as
    the ingest found them (rank meta ``in_flight``, keyed by step as ``exposed`` is);
    without them its hidden time (`hidden`, ns) and not ahead."""
    of_step = flight.get(step, flight.get(str(step))) or {}
    found = of_step.get(op)
    if not found:
        return hidden / 1e9, False
    return int(found[0]) / 1e9, bool(found[1])


def _collectives(
    graph: Any,
    called: Any,
    ops: np.ndarray,
    rows: list[int],
    start: np.ndarray,
    took: np.ndarray,
    exposed: np.ndarray,
    progress: Any,
) -> list[dict[str, Any]]:
    """The collectives of `rows` (one step's, in start order) as `rank_programs` lists
    them; `progress` maps ns to the step's progress (s)."""
    if not rows:
        return []
    begin = np.array([start[i] for i in rows], dtype=np.int64)
    end = begin + np.array([took[i] for i in rows], dtype=np.int64)
    release = progress(begin)
    need = progress(np.where(exposed > 0, end - exposed, end))
    out = []
    for k, i in enumerate(rows):
        op = graph.ops[ops[i]]
        c = called.get(ops[i]) or {}
        unit = c.get("unit")
        out.append(
            {
                "op": str(ops[i]),
                "kind": c.get("kind") or "other",
                "unit": str(unit) if unit is not None else f"{op.nbytes} B",
                "phase": op.phase,
                "bytes": int(op.nbytes),
                "lane": op.resource,
                "seconds": int(took[i]) / 1e9,
                "release": float(release[k]),
                "need": float(max(need[k], release[k])),
            }
        )
    return out
