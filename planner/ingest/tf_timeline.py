"""TensorFlow timelines: the chrome traces TF1 and TF2 write of a step's step_stats.

A *timeline* is what ``timeline.Timeline(step_stats).generate_chrome_trace_format()``
writes (TF1 and TF2): one process per device (``/job:.../cpu:0 Compute``) whose events
are the executor's node records, ``args.name`` the node and ``args.inputN`` its inputs;
GPU devices add one process per stream (``/gpu:0/stream:N``) with the kernels and
copies of each node, plus the aggregates ``stream:all`` and ``memcpy`` that repeat them;
``DataFlow`` flow events (ph ``s``/``t``) draw the inputs that cross threads.

Each task (``/job:worker/task:1`` -> ``worker1``) is a rank; parameter-server tasks are
not. A node is the op of its executor record on its device; on a GPU that record is the
node's *launch*, and each of its kernels and copies is an op of its own on the stream
that ran it (``<node>#<k>``, `kernel_name`), after the launch and in the order they
ran (wherever the task's records file the node: a merged file keeps the first run's
process names); a host<->device copy recorded only on a stream has its copy ops alone.
Its inputs and the flow arrows are the DAG's edges: from the producer's launch to the
consumer's (TensorFlow's executor runs a node once its inputs are launched, not run:
the stream keeps the order) and from the producer's last kernel to the consumer's
first (the event a kernel on another stream waits for). One op timed from a node's
first kernel to its last overlapped the kernels other nodes ran between them, and its
consumers' launches ran before it. ``RecvTensor`` RPC records carry no
tensor name in a timeline, so transfers are not modelled: RunMetadata (preferred when
beside) has them.

One file is one step (several files: several steps of one job, the step number from
``step<N>`` in the name); a file that merges several runs is split at each run's
``_SOURCE`` node.

TF2 profiler traces, the other TensorFlow chrome trace, are read by `tf_profiler`.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from itertools import pairwise
from pathlib import Path
from typing import Any

from planner.errors import InputError
from planner.ingest.files import MAX_SPAN_S, MAX_TIME_NS
from planner.ingest.sniffers import (  # noqa: F401 (re-exported)
    XPLANE_ANSWER,
    is_tf_profiler,
    is_timeline,
    looks_like_xplane,
)
from planner.ingest.tf_graphdef import split_input, task_of
from planner.ingest.tf_runmetadata import step_number
from planner.model.graph import GraphError, Op, build_graph
from planner.model.trace import Job, make_trace

_STREAM = re.compile(r"^(?P<device>.*?)/(?:stream:(?P<stream>\w+)|(?P<memcpy>memcpy))$")
_DEVICE_KIND = re.compile(r"/(?:device:)?(?P<kind>[A-Za-z_]+):(?P<index>\d+)$")
_INPUT = re.compile(r"^input\d+$")
# a partition's _Recv node is named after the node it receives from (`<src>/_<k>`), and
# the tensor it receives, which names the copy a stream ran for it, `edge_<id>_<src>`
# (TensorFlow's graph_partition.cc)
_RECV_NODE = re.compile(r"^(?P<src>.+)/_\d+$")
_COPY = re.compile(r"^edge_\d+_(?P<src>.+)$")
KERNEL = "#"  # ``<node>#<k>``: a GPU node's k-th kernel or copy, beside its launch

# ----------------------------------------------------------------------------- events


@dataclass
class _Record:
    """One X event of a timeline: a node record on a device, or a kernel/copy on a stream."""

    name: str
    type: str
    start: int
    end: int
    inputs: tuple[str, ...] = ()


@dataclass
class _Device:
    """A device of one task: its executor records and, for a GPU, its streams' records."""

    task: str
    resource: str
    records: list[_Record] = field(default_factory=list)
    streams: dict[str, list[_Record]] = field(default_factory=dict)
    aggregate: dict[str, list[_Record]] = field(default_factory=dict)


def _ns(value: Any, path: Path, what: str) -> int:
    """Microseconds (int, float or string) -> integer ns, exactly: epoch µs times 1000
    do not fit a float's 53 bits."""
    try:
        if isinstance(value, bool):
            raise TypeError
        if isinstance(value, int):
            ns = value * 1000
        else:
            exact = Decimal(str(value))
            if not exact.is_finite():
                raise ValueError
            ns = int((exact * 1000).to_integral_value())
    except (TypeError, ValueError, ArithmeticError):
        raise InputError(path, f"{what}: time {value!r} is not a number") from None
    if not 0 <= ns < MAX_TIME_NS:
        raise InputError(path, f"{what}: time {value!r} µs is out of range")
    return ns


def _record(event: Mapping[str, Any], path: Path) -> _Record:
    args = event.get("args") if isinstance(event.get("args"), dict) else {}
    name = str(args.get("name") or event.get("name") or "")
    what = f"event {name!r}"
    start = _ns(event.get("ts"), path, what)
    duration = _ns(event.get("dur", 0), path, what)
    if duration > MAX_SPAN_S * 1e9:
        raise InputError(path, f"{what}: lasts {duration / 1e9:.3g} s, more than a day")
    inputs = tuple(str(v) for k, v in sorted(args.items(), key=_input_order) if _INPUT.match(k))
    return _Record(
        name, str(args.get("op") or event.get("name") or ""), start, start + duration, inputs
    )


def _input_order(item: tuple[str, Any]) -> tuple[int, str]:
    key = item[0]
    return (int(key[5:]) if _INPUT.match(key) else -1, key)


def _ident(value: Any) -> int | str | None:
    """A pid or tid usable as a key: an int or a string; anything else is no id."""
    return value if isinstance(value, (int, str)) and not isinstance(value, bool) else None


def _short_device(device: str) -> str:
    found = _DEVICE_KIND.search(device)
    return f"{found['kind'].upper()}:{found['index']}" if found else device.strip("/")


def _process_names(events: list[Any]) -> dict[Any, str]:
    names: dict[Any, str] = {}
    for e in events:
        if isinstance(e, dict) and e.get("ph") == "M" and e.get("name") == "process_name":
            args = e.get("args") if isinstance(e.get("args"), dict) else {}
            names[_ident(e.get("pid"))] = str(args.get("name", ""))
    return names


def _devices(
    document: Any, path: Path
) -> tuple[dict[tuple[str, str], _Device], list[tuple[str, str, int]]]:
    """(task, short device) -> its records, and the flow arrows as (producer, consumer,
    time), from one timeline document. An arrow is named by the producer's tensor
    (``node:1``) and ends at the consumer's start on the consumer's thread."""
    events = document.get("traceEvents") if isinstance(document, dict) else None
    if not isinstance(events, list):
        raise InputError(path, "TF timeline has no traceEvents list")
    processes = _process_names(events)
    devices: dict[tuple[str, str], _Device] = {}
    stream_events: list[tuple[str, str, bool, _Record]] = []
    at: dict[tuple[Any, Any, int], str] = {}
    arrows: list[dict[str, Any]] = []
    for e in events:
        if not isinstance(e, dict):
            continue
        if e.get("ph") == "t":
            arrows.append(e)
        if e.get("ph") != "X":
            continue
        process = processes.get(_ident(e.get("pid")), "")
        if not process.endswith(" Compute"):
            continue
        record = _record(e, path)
        device = process.removesuffix(" Compute")
        found = _STREAM.match(device)
        if found:
            stream = f"stream:{found['stream']}" if found["stream"] else "memcpy"
            aggregate = stream in ("stream:all", "memcpy")
            stream_events.append((found["device"], stream, aggregate, record))
            continue
        task = task_of(device)
        if not task:
            continue
        key = (task, _short_device(device))
        if key not in devices:
            devices[key] = _Device(task, f"{task}/{key[1]}")
        devices[key].records.append(record)
        at.setdefault((_ident(e.get("pid")), _ident(e.get("tid")), record.start), record.name)
    for device, stream, aggregate, record in stream_events:
        owner = _stream_owner(devices, device)
        if owner is None:
            raise InputError(path, f"stream {device}/{stream} belongs to no device in the file")
        lanes = owner.aggregate if aggregate else owner.streams
        lanes.setdefault(stream, []).append(record)
    flows = []
    for e in arrows:
        time = _ns(e.get("ts"), path, f"flow {e.get('name')!r}")
        consumer = at.get((_ident(e.get("pid")), _ident(e.get("tid")), time))
        if consumer is not None:
            flows.append((split_input(str(e.get("name", "")))[0], consumer, time))
    return devices, flows


def _stream_owner(devices: Mapping[tuple[str, str], _Device], device: str) -> _Device | None:
    """The device a stream process belongs to: ``/gpu:0`` names no task, so it is the
    task's GPU 0 when one task has a GPU 0."""
    short = _short_device(device)
    task = task_of(device)
    matches = [d for (t, s), d in devices.items() if s == short and (not task or t == task)]
    return matches[0] if len(matches) == 1 else None


# ----------------------------------------------------------------------------- runs


def _run_starts(devices: Iterable[_Device]) -> list[int]:
    """Start of each run in a file: runs are told apart by the ``_SOURCE`` node that
    each run executes once per device. One run when no device repeats it."""
    per_device = [sorted(r.start for r in d.records if r.name == "_SOURCE") for d in devices]
    runs = max((len(s) for s in per_device), default=0)
    if runs <= 1:
        return [0]
    full = [s for s in per_device if len(s) == runs]
    return [min(s[k] for s in full) for k in range(runs)]


def _run_of(starts: list[int], time: int) -> int:
    return max(bisect.bisect_right(starts, time) - 1, 0)


# ----------------------------------------------------------------------------- one step


@dataclass
class _Timed:
    """An op as seen in one step: where it ran and when."""

    type: str
    resource: str
    start: int
    end: int
    inputs: tuple[str, ...]


@dataclass
class _StepOps:
    """A task's ops in one run (executor records by node, kernels by `kernel_name`) and
    the kernel ops of each GPU node, in start order."""

    ops: dict[str, _Timed]
    kernels: dict[str, list[str]] = field(default_factory=dict)


def _executor_ops(device: _Device, run: int, starts: list[int]) -> dict[str, _Timed]:
    """Executor records of one device in one run, one op per node."""
    ops: dict[str, _Timed] = {}
    for r in device.records:
        if _run_of(starts, r.start) != run:
            continue
        known = ops.get(r.name)
        if known is None:
            ops[r.name] = _Timed(r.type, device.resource, r.start, r.end, r.inputs)
        else:  # a node in a loop runs several times: one op over its whole span
            known.start, known.end = min(known.start, r.start), max(known.end, r.end)
    return ops


def _kernel_ops(device: _Device, run: int, starts: list[int]) -> dict[str, list[_Timed]]:
    """Kernels and copies of one GPU device in one run, per node, in start order: each
    on its stream."""
    lanes = device.streams or device.aggregate
    kernels: dict[str, list[_Timed]] = defaultdict(list)
    for stream, records in sorted(lanes.items()):
        for r in records:
            if _run_of(starts, r.start) == run:
                resource = f"{device.resource}/{stream}"
                kernels[r.name].append(_Timed(r.type, resource, r.start, r.end, ()))
    for timed in kernels.values():
        timed.sort(key=lambda t: (t.start, t.end, t.resource))
    return kernels


def kernel_name(node: str, k: int) -> str:
    """The op of a node's `k`-th kernel or copy (in start order)."""
    return f"{node}{KERNEL}{k}"


# ----------------------------------------------------------------------------- job


@dataclass
class _RankBuild:
    """The union of one rank's ops and edges over the steps."""

    ops: dict[str, Op] = field(default_factory=dict)
    edges: dict[tuple[str, str], str] = field(default_factory=dict)
    unresolved: set[tuple[str, str]] = field(default_factory=set)


def _step_numbers(files: list[tuple[int, list[int]]]) -> list[list[int]]:
    """Step numbers per file and run: from the file names when each file is one run,
    else consecutive from 0 in file order."""
    if all(len(starts) == 1 for _, starts in files):
        return [[number] for number, _ in files]
    out, step = [], 0
    for _, starts in files:
        out.append(list(range(step, step + len(starts))))
        step += len(starts)
    return out


def load_timelines(files: list[tuple[Path, Any]]) -> Job:
    """A Job from TF timeline documents: one step per file (or per run of a merged file)."""
    parsed = []
    for index, (path, document) in enumerate(files):
        devices, flows = _devices(document, path)
        if not any(d.records for d in devices.values()):
            raise InputError(path, "TF timeline has no op records")
        starts = _run_starts(devices.values())
        parsed.append((step_number(path, index), path, devices, flows, starts))
    parsed.sort(key=lambda item: (item[0], str(item[1])))
    numbers = _step_numbers([(item[0], item[4]) for item in parsed])
    builds: dict[str, _RankBuild] = {}
    rows: list[tuple[str, int, str, int, int]] = []
    spans: list[tuple[str, int, int, int]] = []
    seen: dict[tuple[str, int], Path] = {}
    skipped: Counter[str] = Counter()
    for (_, path, devices, flows, starts), steps in zip(parsed, numbers, strict=True):
        for run, number in enumerate(steps):
            for task, step in sorted(_run_ops(devices, run, starts, skipped).items()):
                ops = step.ops
                if (task, number) in seen:
                    raise InputError(path, f"step {number} of {task} is given twice")
                seen[(task, number)] = path
                build = builds.setdefault(task, _RankBuild())
                _add_step(build, step, flows, starts, run)
                rows.extend((task, number, n, t.start, t.end - t.start) for n, t in ops.items())
                start = min(t.start for t in ops.values())
                end = max(t.end for t in ops.values())
                if end - start > MAX_SPAN_S * 1e9:
                    raise InputError(path, f"step {number} of {task} spans more than a day")
                spans.append((task, number, start, end))
    if not builds:
        raise InputError(
            parsed[0][1], "TF timeline holds only parameter-server devices: no worker to analyse"
        )
    graphs = {}
    for task, build in builds.items():
        try:
            graphs[task] = build_graph(
                build.ops.values(), [(u, v, k) for (u, v), k in build.edges.items()]
            )
        except GraphError as exc:
            raise InputError(parsed[0][1], f"{task}: {exc}") from None
    unresolved = sum(len(b.unresolved) for b in builds.values())
    return Job(
        framework="tensorflow",
        graphs=graphs,
        trace=make_trace(rows, spans),
        sources=tuple(str(p) for p, _ in files),
        notes=tuple(_timeline_notes(skipped, unresolved)),
        meta={"input": "tf_timeline"},
    )


def _run_ops(
    devices: Mapping[tuple[str, str], _Device],
    run: int,
    starts: list[int],
    skipped: Counter[str],
) -> dict[str, _StepOps]:
    """Task -> its ops in one run (parameter servers and RecvTensor records counted out).

    A GPU node's kernels are its own wherever the task's executor records file it: a file
    merging several runs keeps the first run's process names, so a later run whose
    devices TensorFlow listed in another order has its GPU nodes' records under the CPU's
    process (``timeline_03_merged_5_runs``, the last run); they are still the GPU
    executor's launches, and their kernels still ran on the GPU's streams. Such nodes
    are counted in ``skipped["misfiled"]``."""
    by_task: dict[str, dict[str, _Timed]] = defaultdict(dict)
    kernels: dict[str, dict[str, list[_Timed]]] = defaultdict(dict)
    for device in devices.values():
        if device.task.startswith("ps"):
            skipped["ps"] += 1
            continue
        skipped["RecvTensor"] += sum(
            1 for r in device.records if r.type == "RecvTensor" and _run_of(starts, r.start) == run
        )
        for name, timed in _executor_ops(device, run, starts).items():
            if timed.type != "RecvTensor":
                by_task[device.task].setdefault(name, timed)
        for name, timed_kernels in _kernel_ops(device, run, starts).items():
            kernels[device.task].setdefault(name, timed_kernels)
    out: dict[str, _StepOps] = {}
    for task, ops in by_task.items():
        step = _StepOps(dict(ops))
        for node, timed_kernels in kernels.get(task, {}).items():
            op = ops.get(node)
            if op is not None and not timed_kernels[0].resource.startswith(f"{op.resource}/"):
                skipped["misfiled"] += 1
            names = [kernel_name(node, k) for k in range(len(timed_kernels))]
            step.kernels[node] = names
            for name, timed in zip(names, timed_kernels, strict=True):
                if op is not None:  # a kernel is of its node's type; a copy keeps its own
                    timed.type = op.type
                step.ops[name] = timed
        if step.ops:
            out[task] = step
    return out


def _add_step(
    build: _RankBuild,
    step: _StepOps,
    flows: list[tuple[str, str, int]],
    starts: list[int],
    run: int,
) -> None:
    """Add one step's ops and their edges: ``args.inputN`` and the flow arrows, each
    from the producer's launch (or, a copy with no executor record, its last copy) to
    the consumer's launch (or its first copy), and from the producer's last kernel to
    the consumer's first where both have kernels (the stream event a GPU consumer
    waits for); each GPU node's launch leads to its kernels, in order. An input from a
    partition's _Recv node (``<src>/_<k>``, which TensorFlow does not time) comes from
    the one copy a stream ran of ``<src>``'s tensor (``edge_<id>_<src>``), and that
    copy from ``<src>``."""
    ops, kernels = step.ops, step.kernels
    for name, timed in ops.items():
        build.ops.setdefault(name, Op(name, "compute", timed.resource, type=timed.type))

    def add(src: str, dst: str, kind: str, arrow: bool = False) -> None:
        if src == dst:
            return
        if arrow:  # an arrow draws a dependency of either kind: it keeps the input's
            build.edges.setdefault((src, dst), kind)
        elif build.edges.get((src, dst)) != "data":
            build.edges[(src, dst)] = kind

    def head(node: str) -> str | None:
        return node if node in ops else (kernels[node][0] if node in kernels else None)

    def tail(node: str) -> str | None:
        return node if node in ops else (kernels[node][-1] if node in kernels else None)

    def link(src: str, dst: str, kind: str, arrow: bool = False) -> None:
        u, v = tail(src), head(dst)
        if u is None or v is None:
            build.unresolved.add((src, dst))
            return
        add(u, v, kind, arrow)
        if src in kernels and dst in kernels:
            add(kernels[src][-1], kernels[dst][0], kind, arrow)

    for node, names in kernels.items():
        chain = ([node] if node in ops else []) + names
        for u, v in pairwise(chain):
            add(u, v, "data")
    copies = defaultdict(list)  # src node -> the copies (no executor record) of its tensors
    for node in kernels:
        found = _COPY.match(node)
        if found and node not in ops:
            copies[found["src"]].append(node)
    for name, timed in ops.items():
        for raw in timed.inputs:
            src, kind = split_input(raw)
            recv = _RECV_NODE.match(src) if head(src) is None else None
            if recv and len(copies.get(recv["src"], ())) == 1:
                # an input from a _Recv node (untimed): the copy it waited for, after
                # the tensor's producer where that has a record
                (copy,) = copies[recv["src"]]
                if head(recv["src"]) is not None:
                    link(recv["src"], copy, "data")
                src = copy
            if src != name:
                link(src, name, kind)
    for src, dst, time in flows:
        if _run_of(starts, time) == run and head(src) and head(dst) and src != dst:
            link(src, dst, "data", arrow=True)


def _timeline_notes(skipped: Counter[str], unresolved: int) -> list[str]:
    notes = [
        "TF timeline: ops and their inputs (args.inputN, flow arrows) on their devices and "
        "GPU streams; no transfers (give the RunMetadata .pb of the same steps for those)"
    ]
    if skipped["RecvTensor"]:
        notes.append(
            f"{skipped['RecvTensor']} RecvTensor records skipped: a timeline does not name "
            "the tensor a transfer carries"
        )
    if skipped["ps"]:
        notes.append("parameter-server devices skipped: a PS is not a rank")
    if skipped["misfiled"]:
        notes.append(
            f"{skipped['misfiled']} node record(s) filed under another device's process than "
            "their kernels (a merged file keeps the first run's process names): taken as "
            "the launches of their kernels' device"
        )
    if unresolved:
        notes.append(
            f"{unresolved} input(s) name nodes with no record in the timeline (_Recv/_Send, "
            "nodes TensorFlow does not time): those edges are left out"
        )
    return notes
