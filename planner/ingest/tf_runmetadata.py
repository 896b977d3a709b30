"""TensorFlow RunMetadata (`.pb`, one per traced step): partition graphs + step_stats.

The DAG of a rank is its worker partition graph. A `_Recv` whose `send_device` is
another task (a PS) is a transfer on the channel ``worker<-ps``; a `_Send` to another
task is one on ``worker->ps``; the rest are compute ops on the worker's device.

TensorFlow records no node stats for `_Send`/`_Recv`. A transfer's time comes from
the RecvTensor RPC records (``[bytes] [rate] edge_N_x from SRC to DST``), joined to
the `_Recv`/`_Send` node through its `tensor_name` attr. The receiver's gRPC client
logs a record from the time the sender began its answer (`send_start_micros` of the
response, taken once the request was there and the tensor produced; never before the
request left) to the answer's arrival: no record of the generated TF traces starts
before the op producing its tensor ended, though the PS asks for every gradient at
the step's start. A record that starts late is an answer that started late (a request
sent or served late). The transfer is taken to start no earlier than the end of the
sender-side op that produces the tensor (a guard where the hosts' clocks differ).

Each file is parsed and indexed by `tf_step_stats`; this module joins the steps into
the ranks' graphs and timings, and the parameter servers' work the replay joins.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

from google.protobuf import message

from planner.errors import InputError
from planner.ingest.files import MAX_SPAN_S
from planner.ingest.proto import tf_subset_pb2 as tfpb
from planner.ingest.tf_graphdef import device_name, split_input, task_of
from planner.ingest.tf_step_stats import _index_step, _Step, parse_run_metadata
from planner.model.graph import GraphError, Op, OpGraph, build_graph
from planner.model.trace import Job, make_trace

_STEP = re.compile(r"step[_-]?(\d+)", re.IGNORECASE)
_VARIABLE_OPS = {"VarHandleOp", "VariableV2", "Variable", "_VarHandlesOp"}
_READ_OPS = {"ReadVariableOp", "Identity", "_ReadVariablesOp"}
# `_ps_work`: the PS ops, their edges, and (PS op, tensor, sending worker device) per tensor
# a PS op reads from another worker
_PsWork = tuple[list[Op], list[tuple[str, str, str]], list[tuple[str, str, str]]]


def looks_like_run_metadata(data: bytes) -> bool:
    """Whether binary protobuf `data` is a RunMetadata rather than a GraphDef.

    Both may start with a length-delimited field 1 (step_stats / node), so the first
    byte cannot tell them apart: data that parses as a RunMetadata with step stats or
    partition graphs is one; data that does not, but parses as a GraphDef with named
    nodes, is a GraphDef; anything else is left to the RunMetadata reader to word.
    """
    if len(data) <= 2 or data[0] not in (0x0A, 0x1A):
        return False
    run = tfpb.RunMetadata()
    try:
        run.ParseFromString(data)
        if run.partition_graphs or run.step_stats.dev_stats:
            return True
    except message.DecodeError:
        pass
    graph = tfpb.GraphDef()
    try:
        graph.ParseFromString(data)
    except message.DecodeError:
        return True
    return not (graph.node and all(n.name and n.op for n in graph.node))


def step_number(path: Path, fallback: int) -> int:
    found = _STEP.search(path.name)
    return int(found.group(1)) if found else fallback


def _variable_of(nodes: dict[str, tfpb.NodeDef], node_name: str) -> str:
    """The variable a sent tensor reads (through ReadVariableOp/Identity), else the node;
    `nodes`: the sender's partition by name."""
    current = nodes.get(node_name)
    for _ in range(4):
        if current is None or current.op not in _READ_OPS or not current.input:
            break
        src, _kind = split_input(current.input[0])
        current = nodes.get(src)
        if current is not None and current.op in _VARIABLE_OPS:
            return current.name
    return node_name


def transfer_name(kind: str, sent: str | None, source: str, peer: str = "") -> str | None:
    """A transfer's name that survives re-partitioning: ``recv:`` and the tensor
    received (``recv:fc1/read``, ``recv:split:1``), or ``recv:^src`` for the control
    message of a control edge from `source`, which TensorFlow sends as a dummy constant;
    a send also names the task it goes to (``send:grad->ps0``), as a client GraphDef's
    sends do. None when the `_Send` input is unknown. TensorFlow's own `_Recv`/`_Send`
    names (``fc1/read_S7``) number the partition's edges and change whenever the graph
    does, so a plan could not name the same transfer in a run taken after enforcement."""
    if not sent or not source:
        return None
    node, _kind = split_input(sent)
    tensor = sent.removesuffix(":0") if node == source else f"^{source}"
    return f"{kind}:{tensor}" + (f"->{peer}" if kind == "send" and peer else "")


def _rank_graph(step: _Step, device: str, path: Path) -> tuple[OpGraph, dict[str, tuple]]:
    """The worker partition as an OpGraph, and each transfer's record key + producer.
    Transfers are named by `transfer_name` (TensorFlow's node name when that fails or
    repeats)."""
    graph = step.partitions[device]
    rank = task_of(device)
    ops: list[Op] = []
    edges: list[tuple[str, str, str]] = []
    links: dict[str, tuple] = {}
    renamed: dict[str, str] = {}
    taken: set[str] = set()
    for node in graph.node:
        attr = node.attr
        peer_device = ""
        kind = "compute"
        if node.op == "_Recv":
            peer_device = attr["send_device"].s.decode(errors="replace")
            kind = "recv"
        elif node.op == "_Send":
            peer_device = attr["recv_device"].s.decode(errors="replace")
            kind = "send"
        peer = task_of(peer_device)
        if kind != "compute" and (not peer or peer == rank or attr["client_terminated"].b):
            kind = "compute"
        if kind == "compute":
            ops.append(Op(node.name, "compute", device_name(device), type=node.op))
            continue
        edge = attr["tensor_name"].s.decode(errors="replace")
        if kind == "recv":
            source = attr["_src"].s.decode(errors="replace")
            sent = step.sent.get((peer_device, edge))
            resource = f"{rank}<-{peer}"
            key = (edge, peer_device, device)
            data = sent is not None and split_input(sent)[0] == source
            producer = (peer_device, split_input(sent)[0] if sent and data else None)
            sender = step.nodes.get(peer_device, {})
            param = _variable_of(sender, source) if data else ""
        else:
            sent = node.input[0] if node.input else None
            source = attr["_src"].s.decode(errors="replace") or (
                split_input(sent)[0] if sent else ""
            )
            resource = f"{rank}->{peer}"
            key = (edge, device, peer_device)
            producer = (device, split_input(sent)[0] if sent else None)
            param = source if sent and split_input(sent)[0] == source else ""
        name = transfer_name(kind, sent, source, peer)
        if name is None or name in taken:
            name = node.name
        renamed[node.name] = name
        taken.add(name)
        ops.append(Op(name, kind, resource, param=param, type=node.op))
        links[name] = (key, producer)
    for node in graph.node:
        dst = renamed.get(node.name, node.name)
        for raw in node.input:
            src, edge_kind = split_input(raw)
            edges.append((renamed.get(src, src), dst, edge_kind))
    by_edge = {key[0]: name for name, (key, _producer) in links.items()}
    for sent, received in step.peer_waits.get(device, []):
        if sent in by_edge and received in by_edge:
            edges.append((by_edge[sent], by_edge[received], "control"))
    try:
        return build_graph(ops, edges), links
    except GraphError as exc:
        raise InputError(path, f"partition {device}: {exc}") from None


def load_run_metadata(files: list[tuple[Path, bytes]]) -> Job:
    """A Job from RunMetadata files (any order; steps from the file names).

    A file with the same bytes as an earlier one (a step copied under another name) is
    one step, not two: it is left out with a note, so it cannot weigh twice in the
    timings.
    """
    steps, duplicates = _read_steps(files)
    graphs: dict[str, OpGraph] = {}
    links: dict[str, dict[str, tuple]] = {}
    devices: dict[str, str] = {}
    partition_nodes: dict[str, set[str]] = {}
    rows: list[tuple[str, int, str, int, int]] = []
    spans: list[tuple[str, int, int, int]] = []
    nbytes: dict[tuple[str, str], int] = {}
    missing: Counter[tuple[str, int]] = Counter()
    seen: set[tuple[str, int]] = set()
    ps_work: dict[str, _PsWork] = {}
    replay_rows: list[tuple[str, int, str, int, int]] = []
    replay_release: dict[str, dict[int, dict[str, int]]] = {}
    queued: dict[str, dict[int, dict[str, int]]] = {}
    for path, step in steps:
        for device in step.partitions:
            rank = task_of(device)
            if not rank or rank.startswith("ps"):
                continue
            node_names = {n.name for n in step.partitions[device].node}
            if rank not in graphs:
                graphs[rank], links[rank] = _rank_graph(step, device, path)
                devices[rank] = device
                partition_nodes[rank] = node_names
            elif node_names != partition_nodes[rank]:
                raise InputError(path, f"partition graph of {rank} differs from the other steps")
            if (rank, step.number) in seen:
                raise InputError(path, f"step {step.number} of {rank} is given twice")
            seen.add((rank, step.number))
            step_rows = _step_rows(step, device, graphs[rank], links[rank], nbytes, rank)
            expected = len(links[rank])
            got = sum(1 for r in step_rows if r[2] in links[rank])
            if got < expected:
                missing[(rank, step.number)] = expected - got
            start, end = _step_span(path, step.number, rank, step_rows, links[rank])
            rows.extend((rank, step.number, op, s, d) for _, _, op, s, d in step_rows)
            queued.setdefault(rank, {})[step.number] = {
                name: step.queued[(device, name)]
                for name in graphs[rank].ops
                if (device, name) in step.queued
            }
            spans.append((rank, step.number, start, end))
            if rank not in ps_work:
                ps_work[rank] = _ps_work(step, device, links[rank])
            ps_rows, ps_release = _ps_rows(step, ps_work[rank][0], ps_work[rank][2])
            replay_rows.extend((rank, step.number, op, s, d) for op, s, d in ps_rows)
            replay_release.setdefault(rank, {})[step.number] = ps_release
    if not graphs:
        raise InputError(files[0][0], "RunMetadata has no worker partition graph")
    graphs = {rank: _with_sizes(graph, rank, nbytes) for rank, graph in graphs.items()}
    notes = [
        f"{rank} step {number}: {count} transfer(s) have no RecvTensor record; "
        "the time oracle uses the steps that have them"
        for (rank, number), count in sorted(missing.items())
    ] + duplicates
    return Job(
        framework="tensorflow",
        graphs=graphs,
        trace=make_trace(rows, spans),
        sources=tuple(str(p) for p, _ in files),
        notes=tuple(notes),
        meta={
            "devices": devices,
            "replay": _replay_meta(graphs, ps_work, replay_rows, replay_release),
            "ranks": {rank: {"queued": of_rank} for rank, of_rank in queued.items()},
        },
    )


def _read_steps(files: list[tuple[Path, bytes]]) -> tuple[list[tuple[Path, _Step]], list[str]]:
    """The steps of `files` (path and indexed RunMetadata) in step order, and a note for
    each file left out as a byte-for-byte copy of an earlier one."""
    steps: list[tuple[Path, _Step]] = []
    first_of: dict[bytes, Path] = {}
    duplicates: list[str] = []
    for index, (path, data) in enumerate(files):
        digest = hashlib.sha256(data).digest()
        if digest in first_of:
            duplicates.append(f"ignored {path}: the same RunMetadata as {first_of[digest]}")
            continue
        first_of[digest] = path
        run = parse_run_metadata(data, path)
        steps.append((path, _index_step(run, step_number(path, index), path)))
    steps.sort(key=lambda item: item[1].number)
    return steps, duplicates


def _step_span(
    path: Path,
    number: int,
    rank: str,
    step_rows: list[tuple[str, int, str, int, int]],
    links: dict[str, tuple],
) -> tuple[int, int]:
    """(start, end) ns of one rank's step from its rows; InputError where only its
    transfers have records or the records span more than a day."""
    if all(r[2] in links for r in step_rows):
        raise InputError(path, f"no node stats for {rank}'s kernels in step {number}")
    start = min(r[3] for r in step_rows)
    end = max(r[3] + r[4] for r in step_rows)
    if end - start > MAX_SPAN_S * 1e9:
        raise InputError(
            path,
            f"step {number} of {rank} spans {(end - start) / 1e9:.3g} s, more than "
            "a day: its node stats disagree on the clock",
        )
    return start, end


def _ps_work(step: _Step, device: str, links: dict[str, tuple]) -> _PsWork:
    """The parameter servers' work for the worker partition on `device`, for the replay
    (`planner.prediction.replay.replay`): the PS nodes with node stats as ops (``ps0:<node>`` on
    resource ``ps0/CPU:0``), the edges among them and to and from the worker's transfers
    (a PS node that reads a tensor the worker sends waits for that send; the worker's
    recv waits for the PS node it receives from; `_Send`/`_Recv` nodes, which TensorFlow
    records no stats for, are collapsed), and (PS op, tensor, sending device) for each
    tensor a PS op receives from another worker, whose record the replay releases it at.
    """
    by_tensor = {key[0]: name for name, (key, _producer) in links.items()}
    ops: list[Op] = []
    edges: list[tuple[str, str, str]] = []
    foreign: list[tuple[str, str, str]] = []
    for ps_device, graph in step.partitions.items():
        task = task_of(ps_device)
        if not task.startswith("ps"):
            continue
        nodes = step.nodes[ps_device]
        timed = {name for (d, name) in step.op_time if d == ps_device}
        resource = device_name(ps_device)
        for node in graph.node:
            if node.name in timed and node.op not in ("_Send", "_Recv"):
                ops.append(Op(f"{task}:{node.name}", "compute", resource, type=node.op))
        for node in graph.node:
            if node.op == "_Send":
                peer = node.attr["recv_device"].s.decode(errors="replace")
                tensor = node.attr["tensor_name"].s.decode(errors="replace")
                if peer != device or tensor not in by_tensor or not node.input:
                    continue
                targets = [by_tensor[tensor]]
            elif node.name in timed:
                targets = [f"{task}:{node.name}"]
            else:
                continue
            for raw in node.input:
                src, kind = split_input(raw)
                source = nodes.get(src)
                if source is None:
                    continue
                if source.op == "_Recv":
                    sender = source.attr["send_device"].s.decode(errors="replace")
                    tensor = source.attr["tensor_name"].s.decode(errors="replace")
                    if sender == device and tensor in by_tensor:
                        edges.extend((by_tensor[tensor], t, kind) for t in targets)
                    elif sender != ps_device and node.op != "_Send":
                        foreign.append((targets[0], tensor, sender))
                elif src in timed and source.op != "_Send":
                    edges.extend((f"{task}:{src}", t, kind) for t in targets)
    return ops, edges, foreign


def _ps_rows(
    step: _Step, ops: list[Op], foreign: list[tuple[str, str, str]]
) -> tuple[list[tuple[str, int, int]], dict[str, int]]:
    """The PS ops' records in `step` as (op, start, duration) ns, and per PS op the time
    (epoch ns) it is released: its own start where it waits for no worker
    (`_Step.unprompted`: the PS's own work, taken as traced, as a peer's is), else the
    end of the latest tensor it received from another worker (that worker's record)."""
    rows = []
    release: dict[str, int] = {}
    devices = {task_of(d): d for d in step.partitions}
    for op in ops:
        task, _, node = op.name.partition(":")
        key = (devices.get(task, ""), node)
        if key not in step.op_time:
            continue
        start, duration = step.op_time[key]
        rows.append((op.name, start, duration))
        if key in step.unprompted:
            release[op.name] = start
    received: dict[str, int] = {}
    for name, tensor, sender in foreign:
        task = name.partition(":")[0]
        record = step.records.get((tensor, sender, devices.get(task, "")))
        if record is not None:
            received[name] = max(received.get(name, -1), record.end)
    return rows, {**received, **release}


def _replay_meta(
    graphs: dict[str, OpGraph],
    ps_work: dict[str, _PsWork],
    rows: list[tuple[str, int, str, int, int]],
    release: dict[str, dict[int, dict[str, int]]],
) -> dict[str, object]:
    """What `planner.prediction.replay.replay` runs in place of the worker graphs: per rank the
    worker partition followed by the PS work it exchanges tensors with (`_ps_work`),
    the PS ops' records and their releases. A PS graph that cannot join (a cycle) is
    left out: the worker is replayed alone."""
    out: dict[str, object] = {"graphs": {}, "rows": [], "release": {}}
    for rank, graph in graphs.items():
        ops, edges, _foreign = ps_work.get(rank, ([], [], []))
        if not ops:
            continue
        try:
            joint = build_graph([*graph.ops.values(), *ops], [*graph.edges(), *edges])
        except GraphError:
            continue
        out["graphs"][rank] = joint
        out["rows"].extend(r for r in rows if r[0] == rank)
        out["release"][rank] = release.get(rank, {})
    return out


def _step_rows(
    step: _Step,
    device: str,
    graph: OpGraph,
    links: dict[str, tuple],
    nbytes: dict[tuple[str, str], int],
    rank: str,
) -> list[tuple[str, int, str, int, int]]:
    rows = []
    for name in graph.ops:
        if name in links:
            key, (producer_device, producer) = links[name]
            record = step.records.get(key)
            if record is None:
                continue
            start = record.start
            ready = step.op_end.get((producer_device, producer)) if producer else None
            if ready is not None and start < ready < record.end:
                start = ready
            rows.append((rank, step.number, name, start, record.end - start))
            size_key = (rank, name)
            nbytes[size_key] = max(nbytes.get(size_key, 0), record.nbytes)
        elif (device, name) in step.op_time:
            start, duration = step.op_time[(device, name)]
            rows.append((rank, step.number, name, start, duration))
    return rows


def _with_sizes(graph: OpGraph, rank: str, nbytes: dict[tuple[str, str], int]) -> OpGraph:
    ops = [
        replace(op, nbytes=nbytes.get((rank, name), 0)) if op.is_transfer else op
        for name, op in graph.ops.items()
    ]
    return build_graph(ops, graph.edges())
