"""Kineto ranks joined into one `Job`: each rank modelled (`kineto_build.build_rank`),
joined to its Execution Trace where one is given, its DAG and parameter table made, and
the tables of all ranks built (timings with each collective's wait for its peers, and
spans). `kineto` reads the files and hands the ranks here one at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner.errors import InputError
from planner.ingest import kineto_dag
from planner.ingest.kineto_build import build_rank
from planner.ingest.kineto_comms import (
    BUILTIN_PATTERNS,
    CommPattern,
)
from planner.ingest.kineto_events import (
    STEP_NAME,
    RankEvents,
)
from planner.ingest.kineto_ops import OpMemo
from planner.ingest.kineto_params import parameters_from_sizes
from planner.ingest.kineto_rank import Occurrences
from planner.model import waits
from planner.model.graph import GraphError, OpGraph, build_graph
from planner.model.trace import SPAN_COLUMNS, TIMING_COLUMNS


@dataclass(frozen=True)
class Options:
    """How to read a job: the step marker of traces without ``ProfilerStep#N`` and the
    communication pattern table (`kineto_comms.load_patterns`)."""

    step_marker: str | None = None
    patterns: tuple[CommPattern, ...] = BUILTIN_PATTERNS


@dataclass
class _JobParts:
    """What the ranks add to their Job, gathered rank by rank."""

    graphs: dict[str, OpGraph] = field(default_factory=dict)
    occurrences: list[tuple[str, Occurrences, list[str]]] = field(default_factory=list)
    spans: list[tuple[str, int, int, int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(
        default_factory=lambda: {"ranks": {}, "parameters": {}, "parameter_source": {}}
    )


def _add_rank(
    parts: _JobParts,
    name: str,
    ev: RankEvents,
    et: Any | None,
    op_memo: OpMemo,
    options: Options = Options(),
) -> None:
    """Model one rank (joined to its Execution Trace `et`, if any) into `parts`."""
    notes, meta = parts.notes, parts.meta
    step = None
    if et is not None:
        step = et.step if et.step is not None else _guess_et_step(ev, et)
        if step is None:
            raise InputError(et.path, f"no record-function id joins it to {ev.path.name}")
    model = build_rank(ev, name, step, op_memo, options.step_marker, options.patterns)
    ref = kineto_dag.reference_step(model, step)
    edges = kineto_dag.merge_edges(model, ref)
    params: list[dict[str, Any]] = []
    p_notes: list[str] = []
    source = "bucket"
    if et is not None:
        from planner.ingest import execution_trace

        edges, et_notes = execution_trace.dag_edges(et, model, edges, ref)
        notes.extend(et_notes)
        if et.parameters:
            params, p_notes = execution_trace.resolve_parameters(et, model)
            source = "execution_trace"
        else:
            p_notes = [f"{name}: the Execution Trace has no DDP bucket copies"]
    if not params:
        params, size_notes = parameters_from_sizes(model, ref)
        p_notes += size_notes
        source = "bucket_sizes" if params else "bucket"
    notes.extend(p_notes)
    meta["parameters"][name] = params
    meta["parameter_source"][name] = source
    try:
        parts.graphs[name] = build_graph(model.ops.values(), edges)
    except GraphError as exc:  # a cycle means the trace contradicts itself
        text = str(exc)
        text = text if len(text) < 300 else text[:300] + " ..."
        raise InputError(ev.path, f"cannot build the op DAG ({text})") from None
    if (ev.world_size or 0) > 1 and not any(op.is_transfer for op in model.ops.values()):
        notes.append(
            f"{name}: world size {ev.world_size} but no communication found in its steps "
            "(a backend the pattern table does not know? see --comm-patterns)"
        )
    parts.occurrences.append((name, model.occurrences, model.op_names))
    parts.spans.extend((name, s, a, b) for s, a, b in model.spans)
    notes.extend(model.notes)
    meta["ranks"][name] = {
        "source": str(ev.path),
        "reference_step": ref,
        "world_size": ev.world_size,
        **model.meta,
    }


def _groups_of(rows: dict[str, np.ndarray], ranks: dict[str, Any]) -> np.ndarray:
    """Per collective row, its rank's process group that ran it (rank meta
    ``collectives``; ``0`` where the meta names none)."""
    called = {rank: meta.get("collectives") or {} for rank, meta in ranks.items()}
    return np.array(
        [str((called.get(r, {}).get(op) or {}).get("group", "0"))
         for r, op in zip(rows["rank"].tolist(), rows["op"].tolist(), strict=True)],
        dtype=object,
    )  # fmt: skip


def _add_waits(timings: dict[str, np.ndarray], parts: _JobParts) -> None:
    """The ``wait`` column (ns): each collective's time waiting for the last rank."""
    mask = waits.collective_rows(timings, parts.graphs)
    wait = np.zeros(len(mask), dtype=np.int64)
    rows = {k: v[mask] for k, v in timings.items()}
    rows["group"] = _groups_of(rows, parts.meta["ranks"])
    wait[mask], alignment = waits.split_waits(rows)
    timings["wait"] = wait
    if alignment is not None:
        parts.meta["clock_alignment"] = alignment.to_dict()
    elif mask.any():
        parts.notes.append(
            "one rank: a collective's wait for its peers cannot be told from its transfer; "
            "its whole span counts as transfer (the time oracle takes the minimum over steps)"
        )


# The two tables are numpy columns (`Trace.table`): pandas is loaded only by the commands
# that need a DataFrame, which `Trace.timings` builds from them.


def _timings(rows: Sequence[tuple[str, Occurrences, list[str]]]) -> dict[str, np.ndarray]:
    """The timings table (`TIMING_COLUMNS`) of every rank's op occurrences, in rank order."""
    rank = np.repeat(np.array([name for name, _, _ in rows], dtype=object),
                     [len(occ) for _, occ, _ in rows])  # fmt: skip
    op = np.concatenate([np.array(names, dtype=object)[occ.op] for _, occ, names in rows])
    columns = (
        rank,
        np.concatenate([occ.iteration for _, occ, _ in rows]),
        op,
        np.concatenate([occ.start for _, occ, _ in rows]),
        np.concatenate([occ.duration for _, occ, _ in rows]),
    )
    return dict(zip(TIMING_COLUMNS, columns, strict=True))


def _spans(spans: Sequence[tuple[str, int, int, int]]) -> dict[str, np.ndarray]:
    """The spans table (`SPAN_COLUMNS`): one row per (rank, iteration)."""
    rank, iteration, start, end = zip(*spans, strict=True) if spans else ((), (), (), ())
    columns = (
        np.array(rank, dtype=object),
        np.array(iteration, dtype=np.int64),
        np.array(start, dtype=np.int64),
        np.array(end, dtype=np.int64),
    )
    return dict(zip(SPAN_COLUMNS, columns, strict=True))


def _guess_et_step(ev: RankEvents, et: Any) -> int | None:
    """The step whose Kineto events carry the ET's record-function ids."""
    ids = np.fromiter(et.rf_ids(), dtype=np.int64)
    hit = np.isin(ev.rf, ids[ids > 0])
    if not hit.any():
        return None
    starts = ev.ts[hit]
    step_rows = np.flatnonzero(ev.name_flags(STEP_NAME.match))
    for r in step_rows.tolist():
        number = int(ev.names[ev.name_code[r]].split("#")[1])
        if ((starts >= ev.ts[r]) & (starts < ev.end[r])).sum() * 2 >= len(starts):
            return number
    return None
