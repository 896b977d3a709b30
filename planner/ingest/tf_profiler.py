"""TF2 profiler traces: op timings on the GPU and steps, with no graph.

A *TF2 profiler trace* (``*.trace.json.gz`` beside an ``*.xplane.pb``, written by
``tf.profiler``/TensorBoard) has op timings on the GPU (the ``TensorFlow Ops`` line,
kernels on streams) and steps, but no graph: the ops are ingested without
dependencies, which a note says. An *XPlane* protobuf is refused with what to give
(`sniffers.XPLANE_ANSWER`). The chrome-trace helpers it shares with the timeline reader
(times, ids, process names) are `tf_timeline`'s.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from planner.errors import InputError
from planner.ingest.tf_timeline import _ident, _ns, _process_names, _Timed
from planner.model.graph import GraphError, Op, build_graph
from planner.model.trace import Job, make_trace

_PROFILER_DEVICE = re.compile(r"^/device:(?P<kind>[A-Z_]+):(?P<index>\d+)")
_STREAM_THREAD = re.compile(r"^Stream #(?P<stream>\d+)")
_TF_OPS_LINE = "TensorFlow Ops"
_STEPS_LINE = "Steps"


def _thread_names(events: list[Any]) -> dict[tuple[Any, Any], str]:
    names: dict[tuple[Any, Any], str] = {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "thread_name":
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            names[(_ident(e.get("pid")), _ident(e.get("tid")))] = str(args.get("name", ""))
    return names


def _profiler_rank(path: Path) -> str:
    """TensorBoard names the files after the host (``HOST.trace.json.gz``)."""
    host = path.name.split(".", 1)[0]
    return host or "host"


@dataclass
class _ProfilerScan:
    """What a TF2 profiler trace says, keyed by (step, node)."""

    ops: dict[tuple[int, str], _Timed] = field(default_factory=dict)
    stream_of: dict[tuple[int, str], str] = field(default_factory=dict)
    copies: list[tuple[int, str, str]] = field(default_factory=list)
    step_spans: dict[int, tuple[int, int]] = field(default_factory=dict)
    ungrouped: int = 0


def _widen(spans: dict[Any, tuple[int, int]], key: Any, start: int, end: int) -> None:
    known = spans.get(key)
    spans[key] = (start, end) if known is None else (min(known[0], start), max(known[1], end))


def _scan_profiler(events: list[Any], rank: str, path: Path) -> _ProfilerScan:
    """One pass over the device processes: the Steps line, the TensorFlow Ops line, and
    the kernels and copies on the streams."""
    processes = _process_names(events)
    threads = _thread_names(events)
    scan = _ProfilerScan()
    op_spans: dict[tuple[int, str], tuple[int, int]] = {}
    op_types: dict[tuple[int, str], str] = {}
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        device = _PROFILER_DEVICE.match(processes.get(_ident(e.get("pid")), ""))
        if device is None:
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        line = threads.get((_ident(e.get("pid")), _ident(e.get("tid"))), "")
        group = args.get("group_id")
        if group is None or not str(group).lstrip("-").isdigit():
            scan.ungrouped += line == _TF_OPS_LINE
            continue
        step = int(group)
        what = f"event {e.get('name')!r}"
        start = _ns(e.get("ts"), path, what)
        end = start + _ns(e.get("dur", 0), path, what)
        resource = f"{rank}/{device['kind']}:{device['index']}"
        if line == _STEPS_LINE:
            _widen(scan.step_spans, step, start, end)
        elif line == _TF_OPS_LINE:
            node, _, kind = str(args.get("long_name") or e.get("name", "")).rpartition(":")
            key = (step, node or kind)
            _widen(op_spans, key, start, end)
            op_types.setdefault(key, kind)
            scan.stream_of.setdefault(key, resource)  # until a kernel names its stream
        elif (stream := _STREAM_THREAD.match(line)) is not None:
            node = str(args.get("annotation", "")).split(":", 1)[0]
            if scan.stream_of.get((step, node), "").count("/stream:") == 0:
                scan.stream_of[(step, node)] = f"{resource}/stream:{stream['stream']}"
            if args.get("from") and args.get("to"):
                scan.copies.append((step, str(args["from"]), str(args["to"])))
    for key, (start, end) in op_spans.items():
        scan.ops[key] = _Timed(op_types[key], scan.stream_of[key], start, end, ())
    return scan


def load_profiler_trace(path: Path, document: Any) -> Job:
    """A Job from a TF2 profiler trace: each device's ``TensorFlow Ops`` line is its ops
    (``args.long_name`` = ``node:Type``, step = ``group_id``), on the stream whose
    kernels carry the op's annotation; host<->device copies that name their two ops
    (``from``/``to``) are the only edges."""
    events = document.get("traceEvents") if isinstance(document, dict) else None
    if not isinstance(events, list):
        raise InputError(path, "TF profiler trace has no traceEvents list")
    rank = _profiler_rank(path)
    scan = _scan_profiler(events, rank, path)
    if not scan.ops:
        raise InputError(
            path,
            "TF2 profiler trace has no ops on a device's 'TensorFlow Ops' line: give RunMetadata"
            " .pb files traced with RunOptions(trace_level=FULL_TRACE, "
            "output_partition_graphs=True)",
        )
    table: dict[str, Op] = {}
    rows = []
    spans: dict[int, tuple[int, int]] = {}
    for (step, node), timed in sorted(scan.ops.items(), key=lambda kv: (kv[0][0], kv[1].start)):
        table.setdefault(node, Op(node, "compute", timed.resource, type=timed.type))
        rows.append((rank, step, node, timed.start, timed.end - timed.start))
        _widen(spans, step, timed.start, timed.end)
    for step, (start, end) in scan.step_spans.items():
        if step in spans:
            _widen(spans, step, start, end)
    edges = sorted(
        {
            (u, v)
            for step, u, v in scan.copies
            if u != v and {(step, u), (step, v)} <= scan.ops.keys()
        }
    )
    try:
        graph = build_graph(table.values(), [(u, v, "data") for u, v in edges])
    except GraphError as exc:
        raise InputError(path, str(exc)) from None
    notes = [
        f"TF2 profiler trace: {len(table)} ops timed on the GPU and {len(spans)} step(s); it "
        f"holds no graph, so the DAG has only the {len(edges)} edge(s) of host<->device "
        "copies and no transfers: simulations and plans are not meaningful. For the "
        "dependencies give the RunMetadata .pb (RunOptions FULL_TRACE, "
        "output_partition_graphs) or a TF timeline of the same steps"
    ]
    if scan.ungrouped:
        notes.append(f"{scan.ungrouped} op(s) outside any step skipped")
    return Job(
        framework="tensorflow",
        graphs={rank: graph},
        trace=make_trace(rows, [(rank, k, a, b) for k, (a, b) in sorted(spans.items())]),
        sources=(str(path),),
        notes=tuple(notes),
        meta={"input": "tf_profiler"},
    )
