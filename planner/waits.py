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

import numpy as np
import pandas as pd

from planner.graph import OpGraph
from planner.trace import busy_time


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


def collective_rows(timings: pd.DataFrame, graphs: Mapping[str, OpGraph]) -> np.ndarray:
    """Per row of `timings`: the op is a collective of its rank."""
    mask = np.zeros(len(timings), dtype=bool)
    for rank, graph in graphs.items():
        names = [n for n, op in graph.ops.items() if op.kind == "collective"]
        if names:
            mask |= ((timings["rank"] == rank) & timings["op"].isin(names)).to_numpy()
    return mask


def split_waits(rows: pd.DataFrame) -> tuple[np.ndarray, ClockAlignment | None]:
    """The wait (ns) of each collective row (rank, iteration, op, start, duration).

    Returns zeros and None with fewer than two ranks or no occurrence they share.
    """
    wait = np.zeros(len(rows), dtype=np.int64)
    ranks = sorted(rows["rank"].unique().tolist())
    if len(ranks) < 2:
        return wait, None
    frame = rows[["rank", "iteration", "op"]].assign(
        end=(rows["start"] + rows["duration"]).to_numpy(np.int64)
    )
    ends = frame.pivot_table(
        index=["iteration", "op"], columns="rank", values="end", aggfunc="first"
    )
    shared = ends.dropna()
    if shared.empty:
        return wait, None
    ref = ranks[0]
    delta = shared.sub(shared[ref], axis=0)
    offsets = delta.median().round().astype(np.int64).to_dict()
    residual = (delta - pd.Series(offsets)).abs().to_numpy()
    alignment = ClockAlignment(
        reference=ref,
        offsets={str(r): int(o) for r, o in offsets.items()},
        occurrences=len(shared),
        residual_median=float(np.median(residual)) / 1e9,
        residual_max=float(residual.max()) / 1e9,
    )
    offset = rows["rank"].map(offsets).fillna(0).to_numpy(np.int64)
    start = rows["start"].to_numpy(np.int64) - offset
    group = pd.Series(start).groupby([rows["iteration"].to_numpy(), rows["op"].to_numpy()])
    last = group.transform("max").to_numpy()
    seen = group.transform("size").to_numpy()
    wait = np.where(seen > 1, np.clip(last - start, 0, rows["duration"].to_numpy()), 0)
    return wait.astype(np.int64), alignment


def straggler_times(rows: pd.DataFrame) -> pd.DataFrame:
    """Per iteration: each rank's time waiting in collectives, the largest, who waits
    it and the rank the others waited for.

    `rows`: collective rows (rank, iteration, op, start, duration, wait). Returns one
    row per iteration with ``straggler_time`` (s), ``fastest_rank`` (who waits most),
    ``slowest_rank`` (who waits least), ``collectives`` and ``waits`` {rank: s}.
    """
    out = []
    if rows.empty or rows["rank"].nunique() < 2:
        return pd.DataFrame(out)
    for iteration, group in rows.groupby("iteration", sort=True):
        waits = {
            str(rank): busy_time(g["start"].to_numpy(), g["wait"].to_numpy()) / 1e9
            for rank, g in group.groupby("rank", sort=True)
        }
        # the rank the others waited for: the one that waited least itself
        last = min(waits, key=lambda r: (waits[r], r))
        most = max(waits, key=lambda r: (waits[r], r))
        out.append(
            {
                "iteration": int(iteration),
                "straggler_time": waits[most],
                "fastest_rank": most,
                "slowest_rank": last,
                "collectives": int(group["op"].nunique()),
                "waits": waits,
            }
        )
    return pd.DataFrame(out)


def with_step_waits(rows: pd.DataFrame, steps: list[dict]) -> list[dict]:
    """`straggler_times` of the collective `rows` as records; sets each step document's
    ``wait`` (`steps`: rank, iteration) to its rank's time waiting in that step."""
    stragglers = straggler_times(rows)
    records = stragglers.to_dict("records") if len(stragglers) else []
    waited = {s["iteration"]: s["waits"] for s in records}
    for step in steps:
        step["wait"] = waited.get(step["iteration"], {}).get(step["rank"], 0.0)
    return records
