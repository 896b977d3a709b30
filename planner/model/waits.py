"""Waiting vs transferring inside the collectives of a multi-rank job.

A collective cannot finish on any rank before the last rank has joined it, and it
finishes on all ranks at about the same moment. So a rank's span of a collective is
``wait`` (from its own start until the last rank started) plus ``transfer`` (the
rest). Only the transfer is the network's time; the wait belongs to the slower peer.

Clocks: each rank's profiler has its own clock. The ends of one collective are
near-simultaneous on every rank, so the offset of rank r is the median, over the
collective occurrences it shares with the reference (first) rank, of
``end_r - end_ref``; the residual of each occurrence after removing the offset is the
skew left (`ClockAlignment.residual_median`, `residual_max`). With one rank there is
no peer to wait for: every wait is 0 and a note says the spans are transfer plus
whatever waiting they hold.

Straggler time (one definition for `metrics`, `analyze-ranks` and the report): per
step, the time each rank spends waiting in collectives for a later rank (the union
of its wait intervals, so it never exceeds the step), the largest of those, and the
rank that arrived last most often.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from planner.model.arrays import median
from planner.model.graph import OpGraph
from planner.model.trace import Columns, busy_time, rows_by_value, text_codes

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class ClockAlignment:
    """Per-rank clock offsets (ns, subtracted from the rank's times) and the skew left."""

    reference: str
    offsets: dict[str, int]
    occurrences: int  # collective occurrences seen on every rank
    residual_median: float  # seconds
    residual_max: float  # seconds

    def to_dict(self) -> dict[str, object]:
        return {
            "method": "median end offset of shared collectives",
            "reference": self.reference,
            "offsets": {r: o / 1e9 for r, o in self.offsets.items()},
            "occurrences": self.occurrences,
            "residual_median": self.residual_median,
            "residual_max": self.residual_max,
        }


def collective_rows(timings: pd.DataFrame | Columns, graphs: Mapping[str, OpGraph]) -> np.ndarray:
    """Per row of `timings` (a DataFrame or `Trace.table`): the op is a collective of its
    rank."""
    rank, op = np.asarray(timings["rank"], dtype=object), np.asarray(timings["op"], dtype=object)
    mask = np.zeros(len(op), dtype=bool)
    by_rank = rows_by_value(*text_codes(rank))  # (speed) not `rank == name` per rank
    for name, graph in graphs.items():
        names = {n for n, o in graph.ops.items() if o.kind == "collective"}
        rows = by_rank.get(name)
        if names and rows is not None:
            mask[rows] = [o in names for o in op[rows].tolist()]
    return mask


def split_waits(rows: pd.DataFrame | Columns) -> tuple[np.ndarray, ClockAlignment | None]:
    """The wait (ns) of each collective row (rank, iteration, op, start, duration), from a
    DataFrame or numpy columns (`Trace.table`; no pandas needed). With a ``group`` column
    (the process group that ran each row), a row waits only for the ranks of its own group:
    ranks of two tensor-parallel groups run the same op (``net:tp/all_reduce#0``) apart.
    The clocks are aligned on the occurrences of an op every rank runs, whatever its group.

    Returns zeros and None with fewer than two ranks or no occurrence they share.
    """
    rank = np.asarray(rows["rank"], dtype=object)
    wait = np.zeros(len(rank), dtype=np.int64)
    ranks = sorted(set(rank.tolist()))
    if len(ranks) < 2:
        return wait, None
    iteration = np.asarray(rows["iteration"], dtype=np.int64)
    op = np.asarray(rows["op"], dtype=object)
    start = np.asarray(rows["start"], dtype=np.int64)
    duration = np.asarray(rows["duration"], dtype=np.int64)
    # one key per (iteration, op) occurrence, in sorted order as a pivot table's index
    op_names, op_code = np.unique(op, return_inverse=True)
    _, occurrence = np.unique(iteration * len(op_names) + op_code, return_inverse=True)
    rank_code = np.searchsorted(np.array(ranks, dtype=object), rank)
    ends = np.zeros((occurrence.max() + 1, len(ranks)), dtype=np.int64)
    have = np.zeros(ends.shape, dtype=bool)
    first = np.unique(occurrence * len(ranks) + rank_code, return_index=True)[1]  # 'first'
    ends[occurrence[first], rank_code[first]] = (start + duration)[first]
    have[occurrence[first], rank_code[first]] = True
    shared = ends[have.all(axis=1)]
    if not len(shared):
        return wait, None
    if not have.all():  # a pivot with holes holds float64 (NaN), as pandas' pivot_table
        shared = shared.astype(np.float64)
    delta = shared - shared[:, :1]
    medians = np.array([median(delta[:, j]) for j in range(len(ranks))])
    offsets = np.round(medians).astype(np.int64)
    residual = np.abs(delta - offsets)
    alignment = ClockAlignment(
        reference=ranks[0],
        offsets={str(r): int(o) for r, o in zip(ranks, offsets.tolist(), strict=True)},
        occurrences=len(shared),
        residual_median=median(residual) / 1e9,
        residual_max=float(residual.max()) / 1e9,
    )
    start = start - offsets[rank_code]
    if "group" in rows:  # the occurrence of an op within each group
        groups = np.unique(np.asarray(rows["group"], dtype=object).astype(str),
                           return_inverse=True)[1]  # fmt: skip
        occurrence = np.unique(occurrence * (groups.max() + 1) + groups, return_inverse=True)[1]
    last = np.full(occurrence.max() + 1, np.iinfo(np.int64).min, dtype=np.int64)
    np.maximum.at(last, occurrence, start)
    seen = np.bincount(occurrence)
    wait = np.where(seen[occurrence] > 1, np.clip(last[occurrence] - start, 0, duration), 0)
    return wait.astype(np.int64), alignment


def straggler_times(rows: pd.DataFrame | Mapping[str, Any]) -> pd.DataFrame:
    """Per iteration: each rank's time waiting in collectives, the largest, who waits
    it and the rank the others waited for.

    `rows`: collective rows (rank, iteration, op, start, duration, wait), a DataFrame or
    columns. Returns one row per iteration with ``straggler_time`` (s), ``fastest_rank``
    (who waits most), ``slowest_rank`` (who waits least), ``collectives`` and ``waits``
    {rank: s}.
    """
    import pandas as pd

    return pd.DataFrame(_straggler_records(rows))


def _straggler_records(rows: pd.DataFrame | Mapping[str, Any]) -> list[dict[str, Any]]:
    """`straggler_times` as records, grouped with numpy (a pandas group-by per step and
    rank cost 1 ms a step at 64 ranks)."""
    rank = np.asarray(rows["rank"], dtype=object)
    names = sorted(set(rank.tolist()))
    if len(names) < 2:
        return []
    code = np.searchsorted(np.array(names, dtype=object), rank)
    iteration = np.asarray(rows["iteration"], dtype=np.int64)
    start = np.asarray(rows["start"], dtype=np.int64)
    wait = np.asarray(rows["wait"], dtype=np.int64)
    ops = np.asarray(rows["op"], dtype=object)
    order = np.lexsort((code, iteration))
    steps, first = np.unique(iteration[order], return_index=True)
    out = []
    for step, rows_of_step in zip(steps.tolist(), np.split(order, first[1:]), strict=True):
        held = code[rows_of_step]
        cut = np.flatnonzero(np.diff(held)) + 1
        waits: dict[str, float] = {}
        for group in np.split(rows_of_step, cut):
            waits[names[code[group[0]]]] = busy_time(start[group], wait[group]) / 1e9
        # the rank the others waited for: the one that waited least itself
        last = min(waits, key=lambda r: (waits[r], r))
        most = max(waits, key=lambda r: (waits[r], r))
        out.append(
            {
                "iteration": int(step),
                "straggler_time": waits[most],
                "fastest_rank": most,
                "slowest_rank": last,
                "collectives": len(set(ops[rows_of_step].tolist())),
                "waits": waits,
            }
        )
    return out


def with_step_waits(rows: pd.DataFrame | Mapping[str, Any], steps: list[dict]) -> list[dict]:
    """`straggler_times` of the collective `rows` (a DataFrame or columns) as records; sets
    each step document's ``wait`` (`steps`: rank, iteration) to its rank's time waiting in
    that step."""
    records = _straggler_records(rows)
    waited = {s["iteration"]: s["waits"] for s in records}
    for step in steps:
        step["wait"] = waited.get(step["iteration"], {}).get(step["rank"], 0.0)
    return records
