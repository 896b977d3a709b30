"""TensorFlow GraphDef (`.pb`, `.pbtxt`): the client graph, or a partition graph.

A client GraphDef holds requested devices, not partitions. Each worker task becomes a
rank; an edge from another task into it becomes a recv op (one per source tensor), an
edge out of it a send op, so TIC can order the transfers of a graph with no timings.
Nodes without a device are placed as TensorFlow's placer would: with the node they are
colocated with, or with the variable whose handle they use; else on the client's
target, taken to be the first worker.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from google.protobuf import message, text_format

from planner.errors import InputError
from planner.graph import GraphError, Op, OpGraph, build_graph
from planner.ingest.proto import tf_subset_pb2 as tfpb
from planner.trace import Job, empty_trace

_DEVICE = re.compile(r"/job:(?P<job>[^/]+)(?:/replica:(?P<replica>\d+))?(?:/task:(?P<task>\d+))?")
_KIND_NAME = re.compile(r"/device:(?P<kind>[^:]+):(?P<index>\d+)")


def task_of(device: str) -> str:
    """`/job:worker/replica:0/task:1/device:CPU:0` -> ``worker1``; "" if no job."""
    found = _DEVICE.search(device or "")
    if not found:
        return ""
    return f"{found['job']}{found['task'] or 0}"


def device_name(device: str) -> str:
    """A short resource name: ``worker1/CPU:0``."""
    task = task_of(device) or "local"
    found = _KIND_NAME.search(device or "")
    return f"{task}/{found['kind']}:{found['index']}" if found else f"{task}/CPU:0"


def split_input(name: str) -> tuple[str, str]:
    """A NodeDef input -> (node name, edge kind): ``^a`` is control, ``a:1`` data."""
    if name.startswith("^"):
        return name[1:], "control"
    return name.split(":", 1)[0], "data"


def parse_graphdef(data: bytes, path: Path, text: bool) -> tfpb.GraphDef:
    """Parse binary or text GraphDef bytes; InputError when they are not one."""
    graph = tfpb.GraphDef()
    try:
        if text:
            text_format.Parse(data.decode("utf-8"), graph)
        else:
            graph.ParseFromString(data)
    except (message.DecodeError, text_format.ParseError, UnicodeDecodeError) as exc:
        raise InputError(path, f"not a TensorFlow GraphDef ({_short(exc)})") from None
    except RecursionError:  # the text parser recurses per nested message (AttrValue.func)
        raise InputError(path, "not a TensorFlow GraphDef (messages nested too deeply)") from None
    if not graph.node or not all(n.name and n.op for n in graph.node):
        raise InputError(path, "not a TensorFlow GraphDef (no named nodes with ops)")
    return graph


def _short(exc: Exception) -> str:
    return str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__


def placement(
    nodes: dict[str, tfpb.NodeDef], default: str, task_memo: dict[str, str] | None = None
) -> dict[str, str]:
    """The task of every node, as TensorFlow's placer would put nodes with no device.

    A node colocated by `_class: loc:@x`, or one that uses a resource handle (reads
    and updates of a variable), goes where that node or handle is; the rest go to the
    client's target, `default`.
    """
    placed: dict[str, str] = {}
    memo = task_memo if task_memo is not None else {}

    def task(name: str, depth: int = 0) -> str:
        if name in placed:
            return placed[name]
        node = nodes[name]
        device = node.device
        found = memo.get(device)
        if found is None:
            found = memo[device] = task_of(device)
        if not found and depth < 16:
            colocated = [
                v.decode(errors="replace")
                for v in node.attr["_class"].list.s
                if v.startswith(b"loc:@")
            ]
            anchors = [c[len("loc:@") :] for c in colocated if c[len("loc:@") :] in nodes]
            uses_handle = node.op in _RESOURCE_OPS or node.op.startswith("ResourceApply")
            if not anchors and node.input and uses_handle:
                anchors = [split_input(node.input[0])[0]]
            anchors = [a for a in anchors if a in nodes]
            found = task(anchors[0], depth + 1) if anchors else ""
        placed[name] = found or default
        return placed[name]

    for name in nodes:
        task(name)
    return placed


_RESOURCE_OPS = frozenset(
    {
        "ReadVariableOp",
        "AssignVariableOp",
        "AssignAddVariableOp",
        "AssignSubVariableOp",
        "VarIsInitializedOp",
        "ResourceGather",
        "ResourceScatterAdd",
        "ResourceScatterUpdate",
    }
)


def _input_list(raw: Any) -> list[tuple[str, str]]:
    """A node's inputs as (node name, edge kind) pairs (see `split_input`)."""
    return [(r[1:], "control") if r[:1] == "^" else (r.split(":", 1)[0], "data") for r in raw]


def worker_graphs(graph: tfpb.GraphDef, path: Path) -> dict[str, OpGraph]:
    """One OpGraph per worker task of a client GraphDef (see module docstring).

    The nodes are read out of the protobuf once, into plain tuples, and each distinct
    device string is parsed once: a 300k-node graph is then a few passes over lists.
    """
    rows = [(n.name, n.op, n.device, n.input) for n in graph.node]
    task_memo = {d: task_of(d) for d in {row[2] for row in rows}}
    resource_memo = {d: device_name(d) for d in task_memo if d}
    tasks = sorted(set(task_memo.values()) - {""})
    workers = [t for t in tasks if not t.startswith("ps")] or ["worker0"]
    if all(task_memo.values()):  # every node names its task: no placer needed
        placed = {row[0]: task_memo[row[2]] for row in rows}
    else:
        nodes = {n.name: n for n in graph.node}
        placed = placement(nodes, default=workers[0], task_memo=task_memo)
    inputs = [_input_list(row[3]) for row in rows]
    for (name, _, _, raw), node_inputs in zip(rows, inputs, strict=True):
        for i, (src, _) in enumerate(node_inputs):
            if src not in placed:
                raise InputError(path, f"node {name!r} reads unknown node {raw[i]!r}")
    result: dict[str, OpGraph] = {}
    for rank in workers:
        ops: list[Op] = []
        edges: list[tuple[str, str, str]] = []
        synthetic: set[str] = set()
        for (name, op, device, _), node_inputs in zip(rows, inputs, strict=True):
            if placed[name] != rank:
                continue
            resource = resource_memo[device] if device else f"{rank}/CPU:0"
            ops.append(Op(name, "compute", resource, type=op))
            for src, kind in node_inputs:
                peer = placed[src]
                if peer == rank:
                    edges.append((src, name, kind))
                    continue
                recv = f"recv:{src}"
                if recv not in synthetic:
                    synthetic.add(recv)
                    ops.append(Op(recv, "recv", f"{rank}<-{peer}", param=src, type="_Recv"))
                edges.append((recv, name, kind))
        for (name, _, _, _), node_inputs in zip(rows, inputs, strict=True):
            if placed[name] == rank:
                continue
            for src, _ in node_inputs:
                if placed.get(src) == rank:
                    send = f"send:{src}->{placed[name]}"
                    if send not in synthetic:
                        synthetic.add(send)
                        resource = f"{rank}->{placed[name]}"
                        ops.append(Op(send, "send", resource, param=src, type="_Send"))
                        edges.append((src, send, "data"))
        try:
            result[rank] = build_graph(ops, edges)
        except GraphError as exc:
            raise InputError(path, f"worker {rank}: {exc}") from None
    return result


def load_graphdef(path: Path, data: bytes, text: bool) -> Job:
    """A Job with the worker graphs of a GraphDef and no timings."""
    graph = parse_graphdef(data, path, text)
    graphs = worker_graphs(graph, path)
    note = "GraphDef only: no timings (TIC works; TAC and metrics need RunMetadata)"
    return Job("tensorflow", graphs, empty_trace(), sources=(str(path),), notes=(note,))
