"""One TensorFlow RunMetadata file parsed and indexed for the joins (`_Step`).

`parse_run_metadata` checks that the bytes are a RunMetadata with partition graphs and
step_stats; `_index_step` indexes what one file says by device and node: each node
record's time and queue (`scheduled_micros`), and the RecvTensor RPC records
(``[bytes] [rate] edge_N_x from SRC to DST``) by tensor, sender and receiver; a `_Step`
also works out, once per step, which partition nodes wait for tensors received from
another device (`_waits`, `_peer_waits`). `tf_runmetadata` builds the ranks' graphs and
timings from these.
"""

from __future__ import annotations

import graphlib
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from google.protobuf import message

from planner.errors import InputError
from planner.ingest.files import MAX_NBYTES, MAX_SPAN_S, MAX_TIME_NS
from planner.ingest.proto import tf_subset_pb2 as tfpb
from planner.ingest.tf_graphdef import split_input, task_of

_LABEL = re.compile(
    r"^\[(?P<size>[^\]]*)\] \[[^\]]*\] (?P<edge>\S+) from (?P<src>\S+) to (?P<dst>\S+)"
)


def parse_run_metadata(data: bytes, path: Path) -> tfpb.RunMetadata:
    """Parse RunMetadata bytes; InputError when they are not one (truncated, text...)."""
    run = tfpb.RunMetadata()
    try:
        run.ParseFromString(data)
    except message.DecodeError as exc:
        raise InputError(path, f"not a TensorFlow RunMetadata ({exc})") from None
    if not run.partition_graphs:
        raise InputError(
            path,
            "RunMetadata has no partition graphs: trace with "
            "RunOptions(trace_level=FULL_TRACE, output_partition_graphs=True)",
        )
    if not run.step_stats.dev_stats:
        raise InputError(path, "RunMetadata has no step_stats: trace with FULL_TRACE")
    return run


def _start_ns(stats: tfpb.NodeExecStats) -> int:
    return stats.all_start_nanos or stats.all_start_micros * 1000


def _duration_ns(stats: tfpb.NodeExecStats) -> int:
    return stats.all_end_rel_nanos or stats.all_end_rel_micros * 1000


def _partition_device(graph: tfpb.GraphDef) -> str:
    devices = Counter(n.device for n in graph.node if n.device)
    return devices.most_common(1)[0][0] if devices else ""


@dataclass
class _Record:
    start: int
    end: int
    nbytes: int


@dataclass
class _Step:
    """What one RunMetadata file says, indexed for the joins."""

    number: int
    partitions: dict[str, tfpb.GraphDef]
    op_end: dict[tuple[str, str], int] = field(default_factory=dict)
    op_time: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    records: dict[tuple[str, str, str], _Record] = field(default_factory=dict)
    queued: dict[tuple[str, str], int] = field(default_factory=dict)  # ns, see _queued_ns

    @cached_property
    def nodes(self) -> dict[str, dict[str, tfpb.NodeDef]]:
        """Device -> its partition's nodes by name."""
        return {d: {n.name: n for n in g.node} for d, g in self.partitions.items()}

    @cached_property
    def sent(self) -> dict[tuple[str, str], str]:
        """(device, tensor_name) -> the input of that device's `_Send` of the tensor."""
        return {
            (d, n.attr["tensor_name"].s.decode(errors="replace")): n.input[0]
            for d, g in self.partitions.items()
            for n in g.node
            if n.op == "_Send" and n.input
        }

    @cached_property
    def unprompted(self) -> set[tuple[str, str]]:
        """(device, node) of the parameter-server nodes that wait for no tensor from
        another device in the step (variable reads, the PS's own constants): their
        record times are the PS's own, not a replay of the workers' by another name."""
        out: set[tuple[str, str]] = set()
        for device, graph in self.partitions.items():
            if not task_of(device).startswith("ps"):
                continue
            bit = {n.name: 1 for n in graph.node if n.op == "_Recv"}
            waits = _waits(graph, bit) if bit else {n.name: 0 for n in graph.node}
            out.update((device, name) for name, mask in waits.items() if not mask)
        return out

    @cached_property
    def peer_waits(self) -> dict[str, list[tuple[str, str]]]:
        """Device -> `_peer_waits` pairs of every partition, computed once per step."""
        out: dict[str, list[tuple[str, str]]] = {}
        for peer, graph in self.partitions.items():
            for device, pairs in _peer_waits(graph, peer).items():
                out.setdefault(device, []).extend(pairs)
        return out


def _check_stats(stats: tfpb.NodeExecStats, device: str, path: Path) -> tuple[int, int]:
    """(start, duration) in ns of one node record; InputError when out of range."""
    start, duration = _start_ns(stats), _duration_ns(stats)
    what = f"node stats of {stats.node_name!r} on {device}"
    if not 0 <= start < MAX_TIME_NS:
        raise InputError(path, f"{what}: start time {start} ns is out of range")
    if duration < 0:
        raise InputError(path, f"{what}: negative duration ({duration} ns)")
    if duration > MAX_SPAN_S * 1e9:
        raise InputError(path, f"{what}: lasts {duration / 1e9:.3g} s, more than a day")
    return start, duration


def _index_step(run: tfpb.RunMetadata, number: int, path: Path) -> _Step:
    partitions = {_partition_device(g): g for g in run.partition_graphs}
    step = _Step(number=number, partitions=partitions)
    for dev in run.step_stats.dev_stats:
        for stats in dev.node_stats:
            start, duration = _check_stats(stats, dev.device, path)
            if stats.node_name == "RecvTensor":
                found = _LABEL.match(stats.timeline_label)
                if not found:
                    continue
                nbytes = (
                    stats.output[0].tensor_description.allocation_description.requested_bytes
                    if stats.output
                    else 0
                )
                if not 0 <= nbytes <= MAX_NBYTES:
                    raise InputError(
                        path, f"RecvTensor record of {found['edge']}: size {nbytes} B out of range"
                    )
                key = (found["edge"], found["src"], found["dst"])
                step.records.setdefault(key, _Record(start, start + duration, nbytes))
                continue
            key2 = (dev.device, stats.node_name)
            if key2 not in step.op_time:
                step.op_time[key2] = (start, duration)
                step.op_end[key2] = start + duration
                queued = _queued_ns(stats, start)
                if queued is not None:
                    step.queued[key2] = queued
    return step


def _queued_ns(stats: tfpb.NodeExecStats, start: int) -> int | None:
    """How long the executor held the op queued, its inputs done, before a thread ran it
    (`scheduled_micros`, which TensorFlow records for executed ops); None unrecorded."""
    scheduled = stats.scheduled_nanos or stats.scheduled_micros * 1000
    if not scheduled or scheduled > start:
        return None
    return start - scheduled


def _waits(graph: tfpb.GraphDef, bit: dict[str, int]) -> dict[str, int]:
    """Node -> the OR of the `bit`s of the nodes it transitively waits for (inputs,
    data and control). A partition graph is acyclic; one that is not gets no waits."""
    inputs = {n.name: [split_input(raw)[0] for raw in n.input] for n in graph.node}
    order = graphlib.TopologicalSorter(inputs)
    waits: dict[str, int] = {}
    try:
        for name in order.static_order():
            mask = bit.get(name, 0)
            for src in inputs.get(name, ()):
                mask |= waits.get(src, 0)
            waits[name] = mask
    except graphlib.CycleError:
        return {}
    return waits


def _peer_waits(graph: tfpb.GraphDef, peer: str) -> dict[str, list[tuple[str, str]]]:
    """Device -> (tensor it sends to `peer`, tensor `peer` sends back) pairs where, on
    `peer`, the producer of the second waits for the first: the PS applies a worker's
    gradient before sending a value computed from it, or (with ``planner export`` arrival
    enforcement) reads the next variable only after the worker's control message. Edges
    the worker partition alone cannot show."""
    bit: dict[str, int] = {}  # a _Recv from another device -> its bit
    received: list[tuple[str, str]] = []  # per bit: (sending device, tensor_name)
    for n in graph.node:
        if n.op == "_Recv":
            bit[n.name] = 1 << len(received)
            received.append((n.attr["send_device"].s.decode(errors="replace"),
                             n.attr["tensor_name"].s.decode(errors="replace")))  # fmt: skip
    out: dict[str, list[tuple[str, str]]] = {}
    if not bit:
        return out
    waits = _waits(graph, bit)
    for n in graph.node:
        if n.op != "_Send" or not n.input:
            continue
        device = n.attr["recv_device"].s.decode(errors="replace")
        mask = waits.get(split_input(n.input[0])[0], 0)
        back = n.attr["tensor_name"].s.decode(errors="replace")
        while mask:
            low = mask & -mask
            sender, sent = received[low.bit_length() - 1]
            if sender == device and device != peer:
                out.setdefault(device, []).append((sent, back))
            mask ^= low
    return out
