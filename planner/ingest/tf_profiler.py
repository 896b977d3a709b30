"""TF2 profiler traces: each replica's ops, steps and collectives, with no graph.

A *TF2 profiler trace* (``*.trace.json.gz``: what TensorBoard's trace viewer serves of an
``*.xplane.pb``, written beside it by older TensorFlow, converted by the ``xprof``
package now) has one process per plane. ``/device:GPU:0``: its ``Steps`` line, its
``TensorFlow Ops`` line (``args.long_name`` = ``node:Type``) and the kernels and copies
on its streams. ``/host:CPU``: one thread per host thread, the executor's ops on
``tf_Compute/...`` and ``collective_ops/...`` threads (``args.long_name`` too) and the
step markers (``tf.profiler.experimental.Trace("train", step_num=k, _r=1)``, Keras')
with ``args.step_num``. Every event of a step carries its ``group_id``.

Rank lanes: each device with ops is a rank of its own, with its own steps (replicas on
two GPUs both run a step of group 0: two steps, not one); a trace with no device ops (a
CPU job) is one rank, its host. A file is one task: a multi-worker profile
(``tf.profiler.experimental.client.trace`` of several workers) writes an XPlane per
worker named after its address, ``HOST_PORT``, and TensorBoard names the trace after it.
A rank is named by its file's task (``127.0.0.1:8466``, or the host name whole: a name is
never cut at a dot, which would name a rank after an IP's first octet), and by device
where its file has several (``GPU:1``; ``TASK/GPU:1`` among several files). Steps are
numbered by the markers' ``step_num`` where the host has them (the same number on every
worker), else by ``group_id``.

Collectives (``CollectiveReduceV2``, ``CollectiveGather``, ``NcclAllReduce``, ...) are
``collective`` ops on ``net``: on a device's ops line, or on the host, where each is
given to the device whose step of its group holds it (to the first such device that has
no op of that name in that step: concurrent replicas run the same node). Across ranks
`waits.split_waits` splits each into the wait for the last replica and the transfer. The
trace holds no graph and no tensor sizes: host<->device copies that name their two ops
are the only edges, and transfers have no bytes, which a note says. An *XPlane* protobuf
is refused with what to give (`sniffers.XPLANE_ANSWER`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from planner.errors import InputError
from planner.ingest.tf_timeline import _ident, _ns, _process_names, _Timed
from planner.model import waits
from planner.model.graph import GraphError, Op, build_graph
from planner.model.trace import TIMING_COLUMNS, Job, Trace

_PROFILER_DEVICE = re.compile(r"^/device:(?P<kind>[A-Z_]+):(?P<index>\d+)")
_HOST = re.compile(r"^/host:(?P<kind>[A-Z_]+)")
_STREAM_THREAD = re.compile(r"^Stream #(?P<stream>\d+)")
_TF_OPS_LINE = "TensorFlow Ops"
_STEPS_LINE = "Steps"
COLLECTIVE_TYPES = re.compile(
    r"^(?:Collective(?:Reduce|Gather|ReduceScatter|AllToAll|BcastSend|BcastRecv)"
    r"(?:V\d)?(?:Scatter)?|Nccl(?:AllReduce|Reduce|Broadcast)|CollectivePermute)$"
)
"""TensorFlow op types that are collectives between replicas (not CollectiveAssignGroup
or CollectiveInitializeCommunicator, which move no tensor)."""
_TRACE_SUFFIXES = (".trace.json.gz", ".trace.json", ".json.gz", ".json", ".gz")
_HOST_PORT = re.compile(r"^(?P<host>.+)_(?P<port>\d{1,5})$")


def _thread_names(events: list[Any]) -> dict[tuple[Any, Any], str]:
    names: dict[tuple[Any, Any], str] = {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "thread_name":
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            names[(_ident(e.get("pid")), _ident(e.get("tid")))] = str(args.get("name", ""))
    return names


def task_name(path: Path) -> str:
    """The task a profiler trace file is of, from its name: TensorBoard names it after
    the host (``HOST.trace.json.gz``), a multi-worker capture after the worker's address
    (``HOST_PORT``, here ``HOST:PORT``). Whole: ``10.0.0.2`` is no host ``10``."""
    name = path.name
    for suffix in _TRACE_SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
            break
    found = _HOST_PORT.match(name)
    return f"{found['host']}:{found['port']}" if found else name or "host"


@dataclass
class _Lane:
    """One rank lane of a file: a device, or the host of a trace with no device ops."""

    device: str  # ``GPU:0``; ``CPU`` for the host
    ops: dict[tuple[int, str], _Timed] = field(default_factory=dict)
    steps: dict[int, tuple[int, int]] = field(default_factory=dict)  # group -> span
    copies: list[tuple[int, str, str]] = field(default_factory=list)


@dataclass
class _Host:
    """What a file's ``/host`` plane says: executor ops and step markers by group."""

    ops: list[tuple[int, str, str, int, int]] = field(default_factory=list)  # group, node, type, ns
    steps: dict[int, tuple[int, int]] = field(default_factory=dict)
    numbers: dict[int, int] = field(default_factory=dict)  # group -> step_num


@dataclass
class _Scan:
    """One file's lanes by device (in the order met) and its host plane."""

    devices: dict[str, _Lane] = field(default_factory=dict)
    host: _Host = field(default_factory=_Host)
    ungrouped: int = 0


def _widen(spans: dict[Any, tuple[int, int]], key: Any, start: int, end: int) -> None:
    known = spans.get(key)
    spans[key] = (start, end) if known is None else (min(known[0], start), max(known[1], end))


def _group(args: dict) -> int | None:
    group = args.get("group_id")
    return int(group) if group is not None and str(group).lstrip("-").isdigit() else None


def _node(args: dict, name: Any) -> tuple[str, str]:
    node, _, kind = str(args.get("long_name") or name or "").rpartition(":")
    return node or kind, kind


def _scan(events: list[Any], task: str, path: Path) -> _Scan:
    """One pass: each device's Steps and TensorFlow Ops lines and its streams' kernels
    and copies; the host's executor ops and step markers."""
    processes = _process_names(events)
    threads = _thread_names(events)
    scan = _Scan()
    op_spans: dict[tuple[str, int, str], tuple[int, int]] = {}
    op_types: dict[tuple[str, int, str], str] = {}
    stream_of: dict[tuple[str, int, str], str] = {}
    for e in events:
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        process = processes.get(_ident(e.get("pid")), "")
        device = _PROFILER_DEVICE.match(process)
        if device is None and _HOST.match(process) is None:
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        line = threads.get((_ident(e.get("pid")), _ident(e.get("tid"))), "")
        group = _group(args)
        if group is None:
            scan.ungrouped += line == _TF_OPS_LINE or (device is None and "long_name" in args)
            continue
        what = f"event {e.get('name')!r}"
        start = _ns(e.get("ts"), path, what)
        end = start + _ns(e.get("dur", 0), path, what)
        if device is None:
            _scan_host(scan.host, args, (group, start, end), e.get("name"))
            continue
        short = f"{device['kind']}:{device['index']}"
        lane = scan.devices.setdefault(short, _Lane(short))
        if line == _STEPS_LINE:
            _widen(lane.steps, group, start, end)
        elif line == _TF_OPS_LINE:
            node, kind = _node(args, e.get("name"))
            _widen(op_spans, (short, group, node), start, end)
            op_types.setdefault((short, group, node), kind)
        elif (stream := _STREAM_THREAD.match(line)) is not None:
            node = str(args.get("annotation", "")).split(":", 1)[0]
            stream_of.setdefault((short, group, node), f"{task}/{short}/stream:{stream['stream']}")
            if args.get("from") and args.get("to"):
                lane.copies.append((group, str(args["from"]), str(args["to"])))
    for key, (start, end) in op_spans.items():
        short, group, node = key
        resource = stream_of.get(key, f"{task}/{short}")  # the stream its kernels ran on
        scan.devices[short].ops[(group, node)] = _Timed(op_types[key], resource, start, end, ())
    return scan


def _scan_host(host: _Host, args: dict, timed: tuple[int, int, int], name: Any) -> None:
    """A host event: an executor op (``long_name``) or a step marker (``step_num``)."""
    group, start, end = timed
    if "long_name" in args:
        node, kind = _node(args, name)
        host.ops.append((group, node, kind, start, end))
    elif "step_num" in args or "step_name" in args:
        _widen(host.steps, group, start, end)
        number = str(args.get("step_num", ""))
        if number.isdigit():
            host.numbers.setdefault(group, int(number))


def _host_lane(host: _Host, task: str) -> _Lane:
    """The lane of a trace with no device ops: the host's executor ops, its markers' steps."""
    lane = _Lane("CPU", steps=dict(host.steps))
    spans: dict[tuple[int, str], tuple[int, int]] = {}
    kinds: dict[tuple[int, str], str] = {}
    for group, node, kind, start, end in host.ops:
        _widen(spans, (group, node), start, end)
        kinds.setdefault((group, node), kind)
    for key, (start, end) in spans.items():
        resource = "net" if COLLECTIVE_TYPES.match(kinds[key]) else f"{task}/host:CPU"
        lane.ops[key] = _Timed(kinds[key], resource, start, end, ())
    return lane


def _give_host_collectives(host: _Host, lanes: list[_Lane]) -> int:
    """Host collectives onto the device lanes (module docstring); how many found none."""
    lost = 0
    for group, node, kind, start, end in sorted(host.ops, key=lambda o: o[3]):
        if not COLLECTIVE_TYPES.match(kind):
            continue
        holding = [ln for ln in lanes if ln.steps.get(group, (1, 0))[0] <= start
                   <= ln.steps.get(group, (1, 0))[1]]  # fmt: skip
        candidates = holding or [ln for ln in lanes if group in ln.steps]
        free = [ln for ln in candidates if (group, node) not in ln.ops]
        if not free:
            lost += 1
            continue
        free[0].ops[(group, node)] = _Timed(kind, "net", start, end, ())
    return lost


def _lanes(scan: _Scan, task: str) -> tuple[list[_Lane], list[str]]:
    """A file's rank lanes (its devices with ops, else its host) and what to note."""
    devices = [lane for lane in scan.devices.values() if lane.ops]
    if not devices:
        host = _host_lane(scan.host, task)
        return ([host] if host.ops else []), []
    lost = _give_host_collectives(scan.host, devices)
    notes = [f"{task}: {lost} host collective(s) in no device's step skipped"] if lost else []
    return devices, notes


def _tasks(paths: Sequence[Path]) -> list[str]:
    """Each file's task name (`task_name`), its folder's name before it where two files
    name the same task (two workers' ``HOST.trace.json.gz`` of one host)."""
    tasks = [task_name(p) for p in paths]
    if len(set(tasks)) < len(tasks):
        tasks = [f"{p.parent.name}/{t}" for p, t in zip(paths, tasks, strict=True)]
    for k, task in enumerate(tasks):
        if task in tasks[:k]:
            raise InputError(paths[k], f"a second TF2 profiler trace of task {task!r}")
    return tasks


def _numbering(lane: _Lane, numbers: dict[int, int]) -> dict[int, int]:
    """group -> iteration: the host markers' ``step_num`` where they number every step
    of the lane (the same on every worker), else the group."""
    groups = {g for g, _ in lane.ops} | set(lane.steps)
    if groups and groups <= numbers.keys() and len({numbers[g] for g in groups}) == len(groups):
        return {g: numbers[g] for g in groups}
    return {g: g for g in groups}


@dataclass
class _Rank:
    """One rank's graph, timing rows and step spans, as the Job takes them."""

    name: str
    graph: Any
    rows: list[tuple[str, int, str, int, int]]
    spans: list[tuple[str, int, int, int]]
    edges: int


def _rank(name: str, lane: _Lane, numbers: dict[int, int], path: Path) -> _Rank:
    """A lane's graph (its ops, the copies' edges), rows and spans: a step spans its
    marker (the device's Steps line, the host's step marker), else its ops."""
    number = _numbering(lane, numbers)
    table: dict[str, Op] = {}
    rows = []
    extent: dict[int, tuple[int, int]] = {}
    for (group, node), timed in sorted(lane.ops.items(), key=lambda kv: (kv[0][0], kv[1].start)):
        kind = "collective" if COLLECTIVE_TYPES.match(timed.type) else "compute"
        table.setdefault(node, Op(node, kind, timed.resource, type=timed.type))
        rows.append((name, number[group], node, timed.start, timed.end - timed.start))
        _widen(extent, group, timed.start, timed.end)
    spans = [(name, number[g], *lane.steps.get(g, span)) for g, span in sorted(extent.items())]
    edges = sorted(
        {
            (u, v)
            for group, u, v in lane.copies
            if u != v and {(group, u), (group, v)} <= lane.ops.keys()
        }
    )
    try:
        graph = build_graph(table.values(), [(u, v, "data") for u, v in edges])
    except GraphError as exc:
        raise InputError(path, str(exc)) from None
    return _Rank(name, graph, rows, spans, len(edges))


def _columns(ranks: list[_Rank]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The timings and spans tables (`TIMING_COLUMNS`, `SPAN_COLUMNS`) of the ranks."""
    rows = [row for r in ranks for row in r.rows]
    spans = [span for r in ranks for span in r.spans]
    timings = {
        "rank": np.array([r[0] for r in rows], dtype=object),
        "iteration": np.array([r[1] for r in rows], dtype=np.int64),
        "op": np.array([r[2] for r in rows], dtype=object),
        "start": np.array([r[3] for r in rows], dtype=np.int64),
        "duration": np.array([r[4] for r in rows], dtype=np.int64),
    }
    table = {
        "rank": np.array([s[0] for s in spans], dtype=object),
        "iteration": np.array([s[1] for s in spans], dtype=np.int64),
        "start": np.array([s[2] for s in spans], dtype=np.int64),
        "end": np.array([s[3] for s in spans], dtype=np.int64),
    }
    return dict(zip(TIMING_COLUMNS, timings.values(), strict=True)), table


def load_profiler_trace(path: Path, document: Any) -> Job:
    """A Job from one TF2 profiler trace (`load_profiler_traces`)."""
    return load_profiler_traces([(path, document)])


def load_profiler_traces(items: Sequence[tuple[Path, Any]]) -> Job:
    """A Job from TF2 profiler traces, one file per task (module docstring): each
    device with ops (or a CPU job's host) a rank with its own steps; collectives as
    transfers, split into wait and transfer across ranks."""
    tasks = _tasks([path for path, _ in items])
    found: list[tuple[Path, str, _Lane, _Host]] = []
    notes: list[str] = []
    ungrouped = 0
    for (path, document), task in zip(items, tasks, strict=True):
        events = document.get("traceEvents") if isinstance(document, dict) else None
        if not isinstance(events, list):
            raise InputError(path, "TF profiler trace has no traceEvents list")
        scan = _scan(events, task, path)
        lanes, lane_notes = _lanes(scan, task)
        if not lanes:
            raise InputError(
                path,
                "TF2 profiler trace has no ops (a device's 'TensorFlow Ops' line or the "
                "host's executor ops in a step): give RunMetadata .pb files traced with "
                "RunOptions(trace_level=FULL_TRACE, output_partition_graphs=True)",
            )
        notes.extend(lane_notes)
        ungrouped += scan.ungrouped
        found.extend((path, task, lane, scan.host) for lane in lanes)
    names = _rank_names(found)
    ranks = [
        _rank(name, lane, host.numbers, path)
        for name, (path, _, lane, host) in zip(names, found, strict=True)
    ]
    return _job(ranks, found, notes, ungrouped)


def _rank_names(found: Sequence[tuple[Path, str, _Lane, Any]]) -> list[str]:
    """By task where a file is one lane; by device where it has several (``GPU:1``
    alone when there is one file, ``TASK/GPU:1`` among several)."""
    per_file: dict[str, int] = {}
    for _, task, _, _ in found:
        per_file[task] = per_file.get(task, 0) + 1
    several = len(per_file) > 1
    return [
        task if per_file[task] == 1 else (f"{task}/{lane.device}" if several else lane.device)
        for _, task, lane, _ in found
    ]


def _device_steps(lane: _Lane, host: _Host) -> list[dict[str, int]]:
    """Per step of a device lane that the host marks too: its host (CPU) span and its
    device (GPU) span, ns (`inspection.gpu_steps`)."""
    number = _numbering(lane, host.numbers)
    return [
        {
            "step": number[g],
            "cpu_start": host.steps[g][0],
            "cpu_end": host.steps[g][1],
            "gpu_start": start,
            "gpu_end": end,
        }  # fmt: skip
        for g, (start, end) in sorted(lane.steps.items())
        if g in host.steps
    ]


def _job(ranks: list[_Rank], found: Sequence, notes: list[str], ungrouped: int) -> Job:
    timings, spans = _columns(ranks)
    graphs = {r.name: r.graph for r in ranks}
    meta: dict[str, Any] = {"input": "tf_profiler", "ranks": {}}
    for r, (path, task, lane, host) in zip(ranks, found, strict=True):
        meta["ranks"][r.name] = {"source": str(path), "task": task, "device": lane.device}
        if lane.device != "CPU":
            meta["ranks"][r.name]["steps"] = _device_steps(lane, host)
    mask = waits.collective_rows(timings, graphs)
    wait = np.zeros(len(mask), dtype=np.int64)
    wait[mask], alignment = waits.split_waits({k: v[mask] for k, v in timings.items()})
    timings["wait"] = wait
    if alignment is not None:
        meta["clock_alignment"] = alignment.to_dict()
    ops = sum(len(r.graph.ops) for r in ranks)
    collectives = sum(len(r.graph.transfers) for r in ranks)
    head = [
        f"TF2 profiler trace: {ops} ops of {len(ranks)} rank(s) ({', '.join(graphs)}), "
        f"{collectives} of them collectives (transfers, with no bytes: the trace gives no "
        "tensor sizes); it holds no graph, so the DAG has only the "
        f"{sum(r.edges for r in ranks)} edge(s) of host<->device copies: simulations and "
        "plans are not meaningful. For the dependencies give the RunMetadata .pb "
        "(RunOptions FULL_TRACE, output_partition_graphs) or a TF timeline of the same steps"
    ]
    if ungrouped:
        notes.append(f"{ungrouped} op(s) outside any step skipped")
    return Job(
        framework="tensorflow",
        graphs=graphs,
        trace=Trace(table=timings, span_table=spans),
        sources=tuple(dict.fromkeys(str(path) for path, *_ in found)),
        notes=(*head, *notes),
        meta=meta,
    )
