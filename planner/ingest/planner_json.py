"""The planner JSON trace format (`planner.trace/1`): read and write.

A neutral format any framework can be converted to (docs/formats.md). Times are
seconds: iteration starts relative to the document's `origin_ns` (epoch ns, an
integer), op starts relative to their iteration, so nanosecond resolution survives
the float.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from planner.errors import InputError
from planner.ingest.files import MAX_NBYTES, MAX_SPAN_S, MAX_TIME_NS
from planner.model.graph import OP_KINDS, PHASES, GraphError, Op, OpGraph, build_graph, device_ops
from planner.model.trace import Job, make_trace

SCHEMA = "planner.trace/1"
# what an ingest keeps beside the ops, edges and timings (`Job.meta`, top level or per
# rank) that this format does not carry, and what a reader of it goes without
LEFT_OUT = {
    "replay": "the parameter server's work each worker's replay joins (TF)",
    "queued": "the executor's queue per op (metrics' `queued`, TF)",
    "steps": "each GPU step's CPU range (the replay's CPU-range figures)",
    "queued_before": "the stream work queued before the first step",
    "parameters": "the parameter table (DDP bucket advice)",
    "gradient_ready": "the order the gradients were ready in",
    "horovod_allreduces": "each Horovod all-reduce's ready time (the fusion advice)",
}


def left_out(job: Job) -> str | None:
    """A note naming what of `job` a `planner.trace/1` document does not carry, or None:
    figures that need it differ from the original input's (the generated TF cnn job
    replays at worst 7.66% from its protobufs, -21.13% without the PS work)."""
    meta = job.meta if isinstance(job.meta, Mapping) else {}
    ranks = meta.get("ranks") if isinstance(meta.get("ranks"), Mapping) else {}
    present = set(meta) | {k for r in ranks.values() if isinstance(r, Mapping) for k in r}
    found = [what for key, what in LEFT_OUT.items() if key in present]
    if not found:
        return None
    return (
        f"converted to {SCHEMA}, which does not carry {'; '.join(found)}: the figures that "
        "need them differ from the original input's; analyze the original for those"
    )


def to_document(job: Job) -> dict[str, Any]:
    """The JSON document of a Job (deterministic order)."""
    ranks = []
    spans = job.trace.spans
    # the earliest record: a GPU rank's CPU issues its ops before its (device) step begins
    starts = [int(spans["start"].min())] if len(spans) else []
    if job.trace.rows:
        starts.append(int(job.trace.timings["start"].min()))
    origin = min(starts, default=0)
    for rank in job.ranks:
        graph = job.graphs[rank]
        ops = [
            {
                "name": op.name,
                "kind": op.kind,
                "resource": op.resource,
                "param": op.param,
                "nbytes": op.nbytes,
                "phase": op.phase,
                "type": op.type,
            }
            for op in graph.ops.values()
        ]
        iterations = []
        spans = job.trace.spans[job.trace.spans["rank"] == rank].sort_values("iteration")
        timings = job.trace.of(rank)
        for span in spans.itertuples(index=False):
            rows = timings[timings["iteration"] == span.iteration].sort_values(["start", "op"])
            iterations.append(
                {
                    "iteration": int(span.iteration),
                    "start": (span.start - origin) / 1e9,
                    "duration": (span.end - span.start) / 1e9,
                    "ops": {
                        r.op: [(r.start - span.start) / 1e9, r.duration / 1e9]
                        for r in rows.itertuples(index=False)
                    },
                }
            )
        ranks.append(
            {
                "rank": rank,
                "ops": ops,
                "edges": [list(e) for e in graph.edges()],
                "iterations": iterations,
            }
        )
    lost = left_out(job)
    return {
        "schema": SCHEMA,
        "origin_ns": origin,
        "framework": job.framework,
        "notes": [*job.notes, *([lost] if lost and lost not in job.notes else [])],
        "ranks": ranks,
    }


def _need(value: Any, kind: type | tuple[type, ...], what: str, path: Path) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise InputError(path, f"{what} has the wrong type ({type(value).__name__})")
    return value


def _seconds(value: Any, what: str, path: Path, limit: float = 1e10, least: float = 0.0) -> int:
    _need(value, (int, float), what, path)
    if not math.isfinite(value) or value < least or value > limit:
        raise InputError(path, f"{what} is out of range ({value})")
    return round(value * 1e9)


def _rank_name(value: Any, where: str, path: Path) -> str:
    """A rank name: not empty, printable (it is shown on terminals). Path syntax is fine:
    output file names are made from it by `planner.export.files.file_names`."""
    name = _need(value, str, f"{where}.rank", path)
    if not name or not name.isprintable():
        raise InputError(path, f"{where}.rank {name!r} is empty or holds control characters")
    return name


def from_document(doc: Any, path: Path) -> Job:
    """A Job from a parsed `planner.trace/1` document; InputError on any bad field."""
    _need(doc, dict, "the document", path)
    schema = doc.get("schema")
    if not isinstance(schema, str) or not schema.startswith("planner.trace/"):
        raise InputError(path, "not a planner trace (no 'schema': 'planner.trace/1')")
    if schema != SCHEMA:
        raise InputError(path, f"unsupported planner trace version {schema!r} (reads {SCHEMA})")
    origin = _need(doc.get("origin_ns", 0), int, "'origin_ns'", path)
    if not 0 <= origin < MAX_TIME_NS:
        raise InputError(path, f"'origin_ns' is out of range ({origin})")
    graphs = {}
    rows: list[tuple[str, int, str, int, int]] = []
    spans: list[tuple[str, int, int, int]] = []
    for i, entry in enumerate(_need(doc.get("ranks"), list, "'ranks'", path)):
        where = f"ranks[{i}]"
        _need(entry, dict, where, path)
        rank = _rank_name(entry.get("rank"), where, path)
        if rank in graphs:
            raise InputError(path, f"rank {rank!r} appears twice")
        ops = _ops(entry, where, path)
        edges = _edges(entry, where, path)
        try:
            graphs[rank] = build_graph(ops, edges)
        except GraphError as exc:
            raise InputError(path, f"rank {rank}: {exc}") from None
        _iterations(entry, where, rank, graphs[rank], origin, path, rows, spans)
    if not graphs:
        raise InputError(path, "planner trace has no ranks")
    notes = tuple(str(n) for n in doc.get("notes", []) if isinstance(n, str))
    framework = doc.get("framework") if isinstance(doc.get("framework"), str) else "unknown"
    return Job(framework, graphs, make_trace(rows, spans), sources=(str(path),), notes=notes)


def _ops(entry: dict[str, Any], where: str, path: Path) -> list[Op]:
    """The ops of one rank's entry (`where`: ``ranks[i]``, for the messages)."""
    ops = []
    for j, raw in enumerate(_need(entry.get("ops"), list, f"{where}.ops", path)):
        _need(raw, dict, f"{where}.ops[{j}]", path)
        name = _need(raw.get("name"), str, f"{where}.ops[{j}].name", path)
        kind = raw.get("kind", "compute")
        phase = raw.get("phase", "unknown")
        if kind not in OP_KINDS or phase not in PHASES:
            raise InputError(path, f"op {name!r}: unknown kind or phase ({kind}, {phase})")
        nbytes = _need(raw.get("nbytes", 0), int, f"op {name!r} nbytes", path)
        if nbytes > MAX_NBYTES:
            raise InputError(path, f"op {name!r} nbytes is over 1 PiB ({nbytes})")
        param = raw.get("param")
        ops.append(
            Op(
                name=name,
                kind=kind,
                resource=_need(raw.get("resource", "cpu"), str, f"op {name!r} resource", path),
                param=_need(param, str, f"op {name!r} param", path) if param else None,
                nbytes=nbytes,
                phase=phase,
                type=_need(raw.get("type", ""), str, f"op {name!r} type", path),
            )
        )
    return ops


def _edges(entry: dict[str, Any], where: str, path: Path) -> list[tuple[str, ...]]:
    """The edges of one rank's entry: ``[src, dst]`` or ``[src, dst, kind]``."""
    edges = []
    for j, raw in enumerate(_need(entry.get("edges", []), list, f"{where}.edges", path)):
        if not isinstance(raw, (list, tuple)) or len(raw) not in (2, 3):
            raise InputError(path, f"{where}.edges[{j}] is not [src, dst, kind]")
        if not all(isinstance(x, str) for x in raw):
            raise InputError(path, f"{where}.edges[{j}] holds a non-string")
        if len(raw) == 3 and raw[2] not in ("data", "control"):
            raise InputError(path, f"{where}.edges[{j}] has unknown kind {raw[2]!r}")
        edges.append(tuple(raw))
    return edges


def _iterations(
    entry: dict[str, Any],
    where: str,
    rank: str,
    graph: OpGraph,
    origin: int,
    path: Path,
    rows: list[tuple[str, int, str, int, int]],
    spans: list[tuple[str, int, int, int]],
) -> None:
    """Add the timed iterations of one rank's entry to `rows` (op timings, epoch ns) and
    `spans`, each checked: in range, every op known and inside its iteration."""
    # the ops that lie within their iteration: all of a CPU rank's; on a GPU rank,
    # whose step is its device's, the device work
    inside = device_ops(graph) or frozenset(graph.ops)
    seen_iterations: set[int] = set()
    for j, it in enumerate(_need(entry.get("iterations", []), list, f"{where}.iterations", path)):
        _need(it, dict, f"{where}.iterations[{j}]", path)
        number = _need(it.get("iteration"), int, f"{where}.iterations[{j}].iteration", path)
        if not -(1 << 62) < number < 1 << 62:  # a step number; past int64 no table holds it
            problem = f"{where}.iterations[{j}].iteration is out of range (-2**62, 2**62)"
            raise InputError(path, f"{problem} ({str(number)[:40]})")
        if number in seen_iterations:
            raise InputError(path, f"rank {rank}: iteration {number} appears twice")
        seen_iterations.add(number)
        start = origin + _seconds(it.get("start"), f"iteration {number} start", path)
        length = _seconds(
            it.get("duration"), f"iteration {number} duration", path, limit=MAX_SPAN_S
        )
        if start + length >= MAX_TIME_NS:
            raise InputError(path, f"iteration {number} ends out of range (origin_ns + start)")
        for name, timing in _need(it.get("ops", {}), dict, f"iteration {number} ops", path).items():
            if name not in graph.ops:
                raise InputError(path, f"iteration {number} times unknown op {name!r}")
            if not isinstance(timing, (list, tuple)) or len(timing) != 2:
                raise InputError(path, f"iteration {number} op {name!r}: want [start, duration]")
            rel = _seconds(timing[0], f"op {name!r} start", path, least=-1e10)
            dur = _seconds(timing[1], f"op {name!r} duration", path)
            if start + rel < origin or start + rel + dur >= MAX_TIME_NS:
                raise InputError(
                    path,
                    f"iteration {number} op {name!r} starts before 'origin_ns' or "
                    "ends out of range",
                )
            # a GPU rank's CPU op may lie outside its (device) step: issued earlier
            if name in inside and (rel < 0 or rel + dur > length + 1000):
                raise InputError(
                    path,
                    f"iteration {number} op {name!r} runs from {rel / 1e9:.6g} s to "
                    f"{(rel + dur) / 1e9:.6g} s, outside the iteration's {length / 1e9:.6g} s "
                    "(times must be seconds)",
                )
            rows.append((rank, number, name, start + rel, dur))
        spans.append((rank, number, start, start + length))
