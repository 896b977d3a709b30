"""Trace: observed op timings per rank and iteration, and the job they belong to.

Times are integer nanoseconds here (profilers record ns or µs since the epoch, which
a float second cannot hold exactly); JSON outputs convert to seconds.

The timings are held as numpy columns (`Trace.table`): ingest and `planner inspect`
read only those, so they load no pandas (issue #18: a command's fixed cost). The
pandas view (`Trace.timings`, `Trace.spans`) is built from them on first use.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

from planner.model.arrays import unique
from planner.model.graph import Op, OpGraph

if TYPE_CHECKING:
    import pandas as pd

TIMING_COLUMNS = ("rank", "iteration", "op", "start", "duration")
SPAN_COLUMNS = ("rank", "iteration", "start", "end")

Columns = Mapping[str, np.ndarray]


class Trace:
    """Observed timings.

    `timings`: one row per (rank, iteration, op) with `start` and `duration` in ns, and
    for multi-rank Kineto jobs `wait` (ns of a collective spent waiting for the last
    rank to join; `planner.model.waits`).
    `spans`: one row per (rank, iteration) with the iteration's `start` and `end` in ns.

    Built from DataFrames (``Trace(timings, spans)``) or from numpy columns
    (``Trace(table=..., span_table=...)``: `rank` and `op` as object arrays of str);
    either view is derived from the other on first use. Never mutated.
    """

    def __init__(
        self,
        timings: pd.DataFrame | None = None,
        spans: pd.DataFrame | None = None,
        *,
        table: Columns | None = None,
        span_table: Columns | None = None,
    ) -> None:
        if (timings is None) == (table is None) or (spans is None) == (span_table is None):
            raise TypeError("Trace takes timings and spans as DataFrames or as column tables")
        for name, value in (("timings", timings), ("spans", spans)):
            if value is not None:
                self.__dict__[name] = value
        for name, value in (("table", table), ("span_table", span_table)):
            if value is not None:
                self.__dict__[name] = dict(value)

    @cached_property
    def timings(self) -> pd.DataFrame:
        return _frame(self.table, "rank", "op")

    @cached_property
    def spans(self) -> pd.DataFrame:
        return _frame(self.span_table, "rank")

    @cached_property
    def table(self) -> dict[str, np.ndarray]:
        """The timings as numpy columns (`rank`, `op`: object arrays of str)."""
        return _columns(self.timings)

    @cached_property
    def span_table(self) -> dict[str, np.ndarray]:
        return _columns(self.spans)

    @property
    def rows(self) -> int:
        """The number of timing rows."""
        return len(self.table["op"])

    @property
    def ranks(self) -> list[str]:
        return sorted(set(self.span_table["rank"].tolist()))

    def iterations(self, rank: str) -> list[int]:
        spans = self.span_table
        return sorted(spans["iteration"][spans["rank"] == rank].tolist())

    @property
    def op_codes(self) -> tuple[list[str], np.ndarray]:
        """(the distinct op names, in order of first row; each row's index into them):
        (speed) an op's attributes are looked up once per name, not once per row."""
        return self.codes_of("op")

    def codes_of(self, column: str) -> tuple[list[str], np.ndarray]:
        """(the distinct values of a text column of `table`, in order of first row; each
        row's index into them), numbered once per trace."""
        kept = self.__dict__.setdefault("_codes", {})
        if column not in kept:
            kept[column] = text_codes(self.table[column])
        return kept[column]

    @cached_property
    def _rank_rows(self) -> dict[str, np.ndarray]:
        return rows_by_value(*self.codes_of("rank"))

    @cached_property
    def _rank_spans(self) -> dict[str, np.ndarray]:
        return rows_by_value(*text_codes(self.span_table["rank"]))

    def rows_of(self, rank: str) -> np.ndarray:
        """The indices of one rank's rows in `table`, in table order."""
        return self._rank_rows.get(rank, np.zeros(0, dtype=np.int64))

    def of_rank(self, rank: str) -> Trace:
        """The trace of one rank alone: its rows of both tables, in table order (what
        reading that rank's files alone gives, with the job's ``wait`` column)."""
        rows = self.rows_of(rank)
        spans = self._rank_spans.get(rank, np.zeros(0, dtype=np.int64))
        trace = Trace(
            table={k: v[rows] for k, v in self.table.items()},
            span_table={k: v[spans] for k, v in self.span_table.items()},
        )
        # (speed) its text codes from this trace's, renumbered in its own order of first
        # row (as `text_codes` would number them): no string hashed again per rank
        names, codes = self.op_codes
        trace.__dict__["_codes"] = {
            "op": _renumbered(names, codes[rows]),
            "rank": ([rank], np.zeros(len(rows), dtype=np.int64)) if len(rows) else ([], rows),
        }
        partial = self.__dict__.get("_partial", {})
        if rank in partial:  # its partial steps, found already (`rank_partial_steps`)
            trace.__dict__["_partial"] = {rank: partial[rank]}
        return trace

    def of(self, rank: str, iteration: int | None = None) -> pd.DataFrame:
        """The timings of one rank (and one iteration)."""
        mask = self.timings["rank"] == rank
        if iteration is not None:
            mask &= self.timings["iteration"] == iteration
        return self.timings.loc[mask]


def _renumbered(names: list[str], codes: np.ndarray) -> tuple[list[str], np.ndarray]:
    """(`names` that `codes` use, in order of first use; `codes` renumbered to them):
    what `text_codes` gives of the rows' values, from their codes."""
    used, first = np.unique(codes, return_index=True)
    order = used[np.argsort(first, kind="stable")]
    number = np.zeros(len(names), dtype=np.int64)
    number[order] = np.arange(len(order), dtype=np.int64)
    return [names[c] for c in order.tolist()], number[codes]


def op_flags(
    graph: OpGraph, names: Sequence[str], codes: np.ndarray, *tests: Callable[[Op], bool]
) -> list[np.ndarray]:
    """Per entry of `codes` (rows' indices into `names`, `Trace.op_codes`): whether each of
    `tests` holds for its op in `graph` (False for an op the graph lacks). (speed) Each op
    is looked up and tested once per name, all tests in one walk, not once per row."""
    found = [graph.ops.get(name) for name in names]
    table = np.array(
        [[op is not None and bool(test(op)) for test in tests] for op in found], dtype=bool
    ).reshape(len(found), len(tests))
    return [table[codes, k] for k in range(len(tests))]


def rows_by_value(names: list[str], codes: np.ndarray) -> dict[str, np.ndarray]:
    """Value -> the indices of its rows, in table order (`text_codes`' output grouped)."""
    order = np.argsort(codes, kind="stable")
    cuts = np.flatnonzero(np.diff(codes[order])) + 1
    return dict(zip(names, np.split(order, cuts), strict=True)) if len(order) else {}


def text_codes(values: np.ndarray) -> tuple[list[str], np.ndarray]:
    """(the distinct values in order of first appearance, each value's index into them),
    numbered with a dict: sorting an object array (`np.unique`) is several times slower."""
    listed = values.tolist()
    number = {v: i for i, v in enumerate(dict.fromkeys(listed))}
    codes = np.fromiter(map(number.__getitem__, listed), np.int64, len(listed))
    return list(number), codes


def _frame(table: Columns, *text: str) -> pd.DataFrame:
    """A DataFrame of `table`, the `text` columns as pandas strings (as ingest made them)."""
    import pandas as pd

    return pd.DataFrame({k: pd.array(v, dtype="str") if k in text else v for k, v in table.items()})


def _columns(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    return {
        str(k): frame[k].to_numpy(object if frame[k].dtype.kind not in "biuf" else None)
        for k in frame.columns
    }


@dataclass(frozen=True)
class Job:
    """Everything ingested from one set of input files.

    `graphs`: one OpGraph per rank (a TF worker partition or a PyTorch rank).
    `notes`: facts a user should know about the input (e.g. records missing in
    some steps), shown by `planner inspect`.
    """

    framework: str
    graphs: Mapping[str, OpGraph]
    trace: Trace
    sources: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    meta: Mapping[str, object] = field(default_factory=dict)

    @property
    def ranks(self) -> list[str]:
        return sorted(self.graphs)


def make_trace(rows: list[tuple[str, int, str, int, int]], spans: list[tuple]) -> Trace:
    """Build a Trace from (rank, iteration, op, start_ns, duration_ns) rows and spans."""
    import pandas as pd

    timings = pd.DataFrame(rows, columns=list(TIMING_COLUMNS))
    timings = timings.astype({"iteration": "int64", "start": "int64", "duration": "int64"})
    span_frame = pd.DataFrame(spans, columns=list(SPAN_COLUMNS))
    span_frame = span_frame.astype({"iteration": "int64", "start": "int64", "end": "int64"})
    return Trace(timings=timings, spans=span_frame)


def empty_trace() -> Trace:
    return make_trace([], [])


def dedicated_durations(starts: np.ndarray, durations: np.ndarray) -> np.ndarray:
    """Split the busy time of one resource among the ops that overlap on it.

    Each instant is shared equally by the ops active then (processor sharing), so
    the result estimates the time each op would take with the resource to itself —
    the quantity TicTac's time oracle stands for (§3.1). The results sum to the
    resource's busy time (the union of the intervals), never more.
    """
    n = len(starts)
    if n == 0:
        return np.zeros(0, dtype=np.float64)
    starts = np.asarray(starts, dtype=np.int64)
    ends = starts + np.asarray(durations, dtype=np.int64)
    points = unique(np.concatenate([starts, ends]))
    delta = np.zeros(len(points), dtype=np.int64)
    np.add.at(delta, np.searchsorted(points, starts), 1)
    np.add.at(delta, np.searchsorted(points, ends), -1)
    active = np.cumsum(delta)[:-1]
    width = np.diff(points).astype(np.float64)
    share = np.divide(width, active, out=np.zeros_like(width), where=active > 0)
    prefix = np.concatenate([[0.0], np.cumsum(share)])
    return prefix[np.searchsorted(points, ends)] - prefix[np.searchsorted(points, starts)]


def _blocks(
    starts: np.ndarray, durations: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(order, sorted starts, their ends, index of each overlap block's first interval)."""
    order = np.argsort(starts, kind="stable")
    s = np.asarray(starts, dtype=np.int64)[order]
    e = s + np.asarray(durations, dtype=np.int64)[order]
    reach = np.maximum.accumulate(e)
    first = np.flatnonzero(np.concatenate([[True], s[1:] > reach[:-1]]))
    return order, s, e, first


def busy_time(starts: np.ndarray, durations: np.ndarray) -> int:
    """Length of the union of the intervals [start, start + duration)."""
    if len(starts) == 0:
        return 0
    _, s, e, first = _blocks(starts, durations)
    return int((np.maximum.reduceat(e, first) - s[first]).sum())


def concurrent_blocks(
    starts: np.ndarray, durations: np.ndarray, amounts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(summed `amounts`, union length) of each block of intervals that overlap one
    another (or touch): transfers in flight together on one link, as one transfer of
    their bytes over the time they held it."""
    if len(starts) == 0:
        return np.zeros(0, dtype=np.float64), np.zeros(0, dtype=np.int64)
    order, s, e, first = _blocks(starts, durations)
    summed = np.add.reduceat(np.asarray(amounts, dtype=np.float64)[order], first)
    return summed, np.maximum.reduceat(e, first) - s[first]


def dedicated_columns(
    trace: Trace, graphs: Mapping[str, OpGraph], transfer_only: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """Per timing row: the op's `resource` and its `dedicated` ns (`dedicated_durations`
    within each rank, iteration and resource); rows of ranks not in `graphs` get None
    and 0. See `with_dedicated` for `transfer_only`.

    (speed) Kept on the trace for the same `graphs`, both views at once: the oracle's
    (transfer_only: a collective without its wait for peers) and the metrics' (its whole
    span) differ only in the groups that hold a collective that waited."""
    kept = trace.__dict__.setdefault("_dedicated", {})
    if kept.get("graphs") is not graphs:
        kept.clear()
        kept["graphs"] = graphs
        kept["resource"], kept[False], kept[True] = _dedicated_columns(trace, graphs)
    return kept["resource"].copy(), kept[transfer_only].copy()


def _dedicated_columns(
    trace: Trace, graphs: Mapping[str, OpGraph]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`dedicated_columns`, computed: (resource, dedicated of whole spans, dedicated with
    each collective's wait left out: `transfer_part`)."""
    table = trace.table
    iteration = table["iteration"]
    resource = np.empty(len(iteration), dtype=object)
    whole = np.zeros(len(iteration), dtype=np.float64)
    starts = np.asarray(table["start"], dtype=np.int64)
    durations = np.asarray(table["duration"], dtype=np.int64)
    own_starts, own_durations = transfer_part(table)
    waited = np.asarray(table["wait"]) != 0 if "wait" in table else np.zeros(len(starts), bool)
    parts: list[tuple[np.ndarray, np.ndarray]] = []  # (rows, dedicated) where they differ
    names, codes = trace.op_codes
    for name, graph in graphs.items():
        rows = trace.rows_of(name)
        if not len(rows):
            continue
        found = [graph.ops.get(n) for n in names]
        labels = sorted({"?" if o is None else o.resource for o in found})
        place = {label: i for i, label in enumerate(labels)}
        label = np.array([place["?" if o is None else o.resource] for o in found], np.int64)
        code = label[codes[rows]]
        resource[rows] = np.array(labels, dtype=object)[code]
        key = np.asarray(iteration[rows], dtype=np.int64) * len(labels) + code
        order = np.argsort(key, kind="stable")
        bounds = np.flatnonzero(np.diff(key[order])) + 1
        for group in np.split(rows[order], bounds):
            whole[group] = dedicated_durations(starts[group], durations[group])
            if waited[group].any():
                own = dedicated_durations(own_starts[group], own_durations[group])
                parts.append((group, own))
    without_waits = whole.copy()
    for group, own in parts:
        without_waits[group] = own
    return resource, whole, without_waits


def rank_partial_steps(trace: Trace, rank: str, graph: OpGraph) -> dict[int, tuple[str, ...]]:
    """`records.partial_steps` of one rank's rows of `trace` and its `graph`'s ops. (speed)
    Kept on the trace for that graph: the oracle, the metrics and the bound terms of a
    rank all leave the same steps out."""
    from planner.model.records import partial_steps

    kept = trace.__dict__.setdefault("_partial", {})
    if rank not in kept or kept[rank][0] is not graph:
        rows = trace.rows_of(rank)
        table = trace.table
        found = partial_steps({"op": table["op"][rows], "iteration": table["iteration"][rows],
                               "duration": table["duration"][rows]},
                              graph.ops) if len(rows) else {}  # fmt: skip
        kept[rank] = (graph, found)
    return dict(kept[rank][1])


def with_dedicated(
    trace: Trace, graphs: Mapping[str, OpGraph], transfer_only: bool = True
) -> pd.DataFrame:
    """Timings with a `dedicated` column (ns, float) and the op's `resource`.

    `transfer_only`: a collective's dedicated time leaves out its ``wait`` for the
    peers (the time oracle's view); False keeps the span the rank saw (its own view,
    which the per-rank metrics use, so that a rank reads the same alone or in its job).
    """
    frame = trace.timings.copy()
    frame["resource"], frame["dedicated"] = dedicated_columns(trace, graphs, transfer_only)
    return frame


def transfer_part(frame: pd.DataFrame | Columns) -> tuple[np.ndarray, np.ndarray]:
    """(start, duration) ns of each row without its ``wait`` for peers (collectives of a
    multi-rank job, `planner.model.waits`): the time the op itself ran."""
    start = np.asarray(frame["start"], dtype=np.int64)
    duration = np.asarray(frame["duration"], dtype=np.int64)
    if "wait" not in frame:
        return start, duration
    wait = np.asarray(frame["wait"], dtype=np.int64)
    return start + wait, duration - wait


def rank_meta(job: Job, rank: str) -> Mapping[str, Any]:
    """What the ingest recorded of one rank (``Job.meta["ranks"][rank]``: its source,
    world size, steps, gradient-ready events, ...; empty where it recorded nothing)."""
    ranks = job.meta.get("ranks") if isinstance(job.meta, Mapping) else None
    meta = ranks.get(rank) if isinstance(ranks, Mapping) else None
    return meta if isinstance(meta, Mapping) else {}


def queued_before(job: Job, rank: str) -> dict[str, int]:
    """GPU stream (and ``net``, the collectives) -> end (ns) of the work the rank's trace
    recorded as issued before profiling began (the Kineto ingest's ``queued_before`` in
    ``Job.meta["ranks"]``; empty where there is none)."""
    queued = rank_meta(job, rank).get("queued_before")
    return {str(k): int(v) for k, v in (queued or {}).items()}


def job_parameters(job: Job, rank: str) -> list[dict[str, Any]]:
    """The rank's parameters (``Job.meta["parameters"]``): name, nbytes, collective, ..."""
    table = job.meta.get("parameters")
    rows = table.get(rank) if isinstance(table, dict) else None
    return list(rows) if isinstance(rows, list) else []
