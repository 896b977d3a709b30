"""PyTorch profiler (Kineto) chrome traces of data-parallel jobs: one `Job` for all ranks.

The work is split by concern, one module each: `kineto_events` holds the columns a
file is read into (`kineto_stream` streams Kineto's own layout, `kineto_generic` parses
any other whole), `kineto_steps` finds steps, lanes, phases and op nesting, `kineto_gpu`
joins GPU work to its launches, `kineto_comms` finds the collectives with their kernels
and GPU spans, `kineto_ops` turns one rank's events into ops and occurrences,
`kineto_build` makes the rank's model of them (`kineto_dag` builds the edges and
`kineto_params` the parameters), and `kineto_job` joins the ranks into a `Job`. This
module reads the files, one rank's events in memory at a time.

What becomes an op (per rank):

- CPU: the *outermost* `cpu_op` / `cuda_runtime` / `cuda_driver` event on each thread
  (nested events are the op's own internals; `user_annotation` ranges give steps and
  phases, `python_function` frames are ignored). Resource: the thread lane (``main``
  is the thread holding the steps; others ``<thread name>.<i>``).
- GPU: kernels, memcpy and memset on ``gpu<device>/stream<stream>``, in the step that
  launched them; communication kernels are never compute.
- Collectives and p2p (kind ``collective``): see `kineto_comms`; what each does (its
  kind and bytes) is its c10d op's (`kineto_calls`), the backend's record times it.
  Resource ``net`` for the default process group, ``net:<pg>`` for others; the rank's
  meta keeps each collective's kind, c10d op, backend record and group
  (``collectives``) and each group as the trace describes it (``process_groups``).

Op identity: ``<lane>/<event name>#<k>`` with k the occurrence in the step on that
lane, aligned across steps where a step makes a call more or fewer than the others
(`kineto_identity`: ``<event name>@<op>#<k>`` names a call the lane's reference step
lacks by the op it follows), and ``<net>/<collective kind>#<k>`` for collectives (k in
launch order within the process group, which NCCL and gloo require to match on every
rank), so the same op has the same name in every step and on every rank. All-reduces
in the backward pass carry ``param = bucket<k>`` (DDP launches one per bucket, in
bucket order), unless the rank reduce-scatters its gradients (FSDP, ZeRO: no buckets).

A step's span is its CPU range extended to its last op on a CPU trace; on a GPU trace
it is the GPU span of the work the step launched (its iteration time is the GPU
period), and the CPU range and the CPU-to-GPU lag are kept in the rank's ``steps``.
"""

from __future__ import annotations

import gc
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from planner.errors import InputError
from planner.ingest import kineto_windows, limits
from planner.ingest.kineto_build import build_rank
from planner.ingest.kineto_comms import (
    DTYPE_BYTES,
    CommPattern,
    collective_kind,
    keep_args_pattern,
    load_patterns,
)
from planner.ingest.kineto_events import (
    ArgFlags,
    RankEvents,
    is_execution_trace,
    is_kineto,
    read_document,
)
from planner.ingest.kineto_generic import read_rank_generic
from planner.ingest.kineto_job import Options, _add_rank, _add_waits, _JobParts, _spans, _timings
from planner.ingest.kineto_ops import OpMemo
from planner.ingest.kineto_params import parameters_from_sizes
from planner.ingest.kineto_rank import Occurrences, RankModel
from planner.ingest.kineto_stream import read_rank
from planner.model.trace import Job, Trace

__all__ = [
    "DTYPE_BYTES", "CommPattern", "Occurrences", "RankEvents", "RankModel", "build_rank",
    "collective_kind", "expand_paths", "is_execution_trace", "is_kineto", "load_kineto",
    "load_patterns", "parameters_from_sizes", "read_document", "read_rank",
    "read_rank_generic",
]  # fmt: skip


@contextmanager
def _cycle_gc_paused() -> Iterator[None]:
    """Pause Python's cycle collector, restoring its state afterwards.

    Ingest allocates millions of short-lived containers that cannot form cycles (JSON
    trees, the DAG's dicts); the collector would scan them again and again, which
    costs about half the load time. Reference counting still frees them.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


STEP_MARKER_ENV = "PLANNER_STEP_MARKER"
"""Environment variable naming the step marker, read when none is given."""


def load_kineto(
    paths: Sequence[Path],
    et_paths: Sequence[Path] | None = None,
    step_marker: str | None = None,
    patterns: tuple[CommPattern, ...] | None = None,
) -> Job:
    """One Job from Kineto traces (files or directories), one file per rank.

    Ranks are named ``rank<distributedInfo.rank>``, else by file order. With
    `et_paths` (one Execution Trace per rank, matched by their `pid`/order), the DAG
    of each rank is the ET's data dependencies plus the thread/stream/launch order
    (see `planner.ingest.execution_trace`). `step_marker` names the step ranges of a
    trace without ``ProfilerStep#N`` (default ``$PLANNER_STEP_MARKER``); `patterns`
    (default: the built-in table plus ``$PLANNER_COMM_PATTERNS``) say which GPU events
    are communication.
    """
    marker = step_marker or os.environ.get(STEP_MARKER_ENV) or None
    options = Options(marker, load_patterns() if patterns is None else patterns)
    with _cycle_gc_paused():
        return _load_kineto(paths, et_paths, options)


def _load_kineto(paths: Sequence[Path], et_paths: Sequence[Path] | None, options: Options) -> Job:
    files = expand_paths(paths)
    arg_memo: ArgFlags = {}
    used: set[str] = set()
    keep = keep_args_pattern(options.patterns)

    processes: dict[frozenset[int], int] = {}  # a file without distributedInfo: its process

    def read(order: int, path: Path) -> tuple[str, RankEvents]:
        ev = read_rank(path, memo=arg_memo, keep=keep)
        if ev.rank is not None:
            return f"rank{ev.rank}", ev
        # no rank in the file: one rank per process, in order of first appearance, so
        # that the windows of a one-process job (a schedule with repeat) are joined
        number = processes.setdefault(frozenset(ev.pids), len(processes))
        return f"rank{number}", ev

    def once(ranks: Iterator[tuple[str, RankEvents, int]]) -> Iterator[tuple[str, RankEvents]]:
        for name, ev, count in ranks:
            if name in used:
                why = (
                    "distributedInfo.rank repeats"
                    if ev.rank is not None
                    else "no distributedInfo, and another file of its process is not next to it"
                )
                raise InputError(ev.path, f"{name} is given twice ({why})")
            used.add(name)
            if count > 1:
                windows.append(f"{name}: {count} windows of one profiling session joined")
            yield name, ev

    windows: list[str] = []
    ets: dict[str, Any] = {}
    ranks: Iterator[tuple[str, RankEvents]]
    # a rank's adjacent files from one process are windows of one session: joined
    read_all = kineto_windows.grouped(read(order, path) for order, path in enumerate(files))
    if et_paths:  # an ET is matched to its rank among all of them: read them all first
        from planner.ingest import execution_trace

        ranked = list(once(read_all))
        ets = execution_trace.match_ranks(et_paths, ranked)
        ranks = iter(ranked)
    else:  # one rank's events in memory at a time
        ranks = once(read_all)
    parts = _JobParts()
    op_memo: OpMemo = {}
    failed: InputError | None = None
    for name, ev in ranks:
        if failed is None:
            try:
                _add_rank(parts, name, ev, ets.get(name), op_memo, options)
            except InputError as exc:
                failed = exc  # raised once every file is read: a bad file is reported first
        del ev
    if failed is not None:
        raise failed
    parts.notes.extend(windows)
    limits.check_same_job(parts.graphs, parts.meta["ranks"])
    timings = _timings(parts.occurrences)
    _add_waits(timings, parts)
    return Job(
        framework="pytorch",
        graphs=parts.graphs,
        trace=Trace(table=timings, span_table=_spans(parts.spans)),
        sources=tuple(str(p) for p in files) + tuple(str(p) for p in (et_paths or ())),
        notes=tuple(parts.notes),
        meta=parts.meta,
    )


def expand_paths(paths: Sequence[Path]) -> list[Path]:
    """Files as given; a directory yields its ``*.pt.trace.json[.gz]`` / ``rank*.json[.gz]``."""
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found = sorted(
                p
                for p in path.iterdir()
                if p.is_file()
                and (
                    re.search(r"\.pt\.trace\.json(\.gz)?$", p.name)
                    or re.match(r"^rank[^/]*\.json(\.gz)?$", p.name)
                )
            )
            if not found:
                raise InputError(path, "directory holds no Kineto traces (*.pt.trace.json[.gz])")
            files.extend(found)
        elif path.exists():
            files.append(path)
        else:
            raise InputError(path, "no such file or directory")
    if not files:
        raise InputError(None, "no Kineto trace given")
    return files
