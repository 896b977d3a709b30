"""TensorFlow GraphDef (`.pb`, `.pbtxt`): the client graph, or a partition graph.

A client GraphDef holds requested devices, not partitions. Each worker task becomes a
rank; an edge from another task into it becomes a recv op (one per source tensor), an
edge out of it a send op, so TIC can order the transfers of a graph with no timings.
Nodes are placed as TensorFlow's placer would: an op on a resource handle (a variable's
reads and updates) with the handle's variable, whatever device it requested (TensorFlow
colocates them); a node without a device with the node it is colocated with; else on
the client's target, taken to be the first worker.

A client GraphDef also holds what a training step never runs: variable initializers,
`IsInitialized` checks, the saver, the chief's token queue set-up. Only the training
step is kept (`step_nodes`): the ancestry of its fetches, the train ops (the sinks that
apply gradients) and the global step's value, as `session.run(train_op)` with a
`MonitoredTrainingSession` fetches them. So the recvs are those of the traced step's
RunMetadata.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from google.protobuf import message, text_format

from planner.errors import InputError
from planner.ingest.proto import tf_subset_pb2 as tfpb
from planner.model.graph import GraphError, Op, OpGraph, build_graph
from planner.model.trace import Job, empty_trace

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
        found = memo.get(node.device)
        if found is None:
            found = memo[node.device] = task_of(node.device)
        uses_handle = _uses_handle(node.op)
        handle = split_input(node.input[0])[0] if node.input and uses_handle else ""
        if handle in nodes and nodes[handle].op in _HANDLE_OPS and depth < 16:
            found = task(handle, depth + 1) or found  # colocated with its variable
        elif not found and depth < 16:
            colocated = [
                v.decode(errors="replace")
                for v in node.attr["_class"].list.s
                if v.startswith(b"loc:@")
            ]
            anchors = [c[len("loc:@") :] for c in colocated if c[len("loc:@") :] in nodes]
            if not anchors and handle:
                anchors = [handle]
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


_HANDLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable"})

_APPLY = re.compile(r"Apply|AccumulatorApplyGradient")
"""Op types that apply gradients: ResourceApplyMomentum, ApplyAdam, SparseApply...,
(Resource)AccumulatorApplyGradient (SyncReplicasOptimizer's workers)."""

_GLOBAL_STEP_READS = ("global_step/Read/ReadVariableOp", "global_step/read")


def step_nodes(nodes: dict[str, tfpb.NodeDef]) -> tuple[set[str], list[str]]:
    """(the nodes a training step runs, its fetches): the ancestry of every sink that
    applies gradients (the train ops) and of the global step's value. Empty fetches
    (no train op: an inference graph) keep every node."""
    inputs = {name: [split_input(raw)[0] for raw in node.input] for name, node in nodes.items()}
    consumed = {src for srcs in inputs.values() for src in srcs}

    def ancestry(roots: list[str]) -> set[str]:
        seen: set[str] = set()
        stack = [r for r in roots if r in nodes]
        while stack:
            name = stack.pop()
            if name not in seen:
                seen.add(name)
                stack.extend(s for s in inputs[name] if s in nodes and s not in seen)
        return seen

    fetches = []
    for name in nodes:
        if name in consumed:
            continue
        if any(_APPLY.search(nodes[a].op) for a in ancestry([name])):
            fetches.append(name)
    if not fetches:
        return set(nodes), []
    fetches += [r for r in _GLOBAL_STEP_READS if r in nodes]
    return ancestry(fetches), fetches


def _input_list(raw: Any) -> list[tuple[str, str]]:
    """A node's inputs as (node name, edge kind) pairs (see `split_input`)."""
    return [(r[1:], "control") if r[:1] == "^" else (r.split(":", 1)[0], "data") for r in raw]


def _uses_handle(op: str) -> bool:
    return op in _RESOURCE_OPS or op.startswith("ResourceApply")


def worker_graphs(graph: tfpb.GraphDef, path: Path) -> dict[str, OpGraph]:
    """One OpGraph per worker task of a client GraphDef: the nodes of the training step
    (`step_nodes`), each placed as TensorFlow would (see module docstring).

    The nodes are read out of the protobuf once, into plain tuples, and each distinct
    device string is parsed once: a 300k-node graph is then a few passes over lists.
    """
    rows = [(n.name, n.op, n.device, n.input) for n in graph.node]
    task_memo = {d: task_of(d) for d in {row[2] for row in rows}}
    resource_memo = {d: device_name(d) for d in task_memo if d}
    tasks = sorted(set(task_memo.values()) - {""})
    workers = [t for t in tasks if not t.startswith("ps")] or ["worker0"]
    nodes = {n.name: n for n in graph.node}
    if all(task_memo.values()) and not any(_uses_handle(row[1]) for row in rows):
        placed = {row[0]: task_memo[row[2]] for row in rows}  # no placer decision left
    else:
        placed = placement(nodes, default=workers[0], task_memo=task_memo)
    inputs = [_input_list(row[3]) for row in rows]
    for (name, _, _, raw), node_inputs in zip(rows, inputs, strict=True):
        for i, (src, _) in enumerate(node_inputs):
            if src not in placed:
                raise InputError(path, f"node {name!r} reads unknown node {raw[i]!r}")
    step, fetches = step_nodes(nodes)
    result: dict[str, OpGraph] = {}
    for rank in workers:
        ops: list[Op] = []
        edges: list[tuple[str, str, str]] = []
        synthetic: set[str] = set()
        for (name, op, device, _), node_inputs in zip(rows, inputs, strict=True):
            if placed[name] != rank or name not in step:
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
        if rank == workers[0]:  # the client's target receives the fetched values
            for fetch in fetches:  # train ops are fetched as operations: no value
                recv = f"recv:{fetch}"
                if fetch in _GLOBAL_STEP_READS and placed[fetch] != rank:
                    synthetic.add(recv)
                    ops.append(Op(recv, "recv", f"{rank}<-{placed[fetch]}", param=fetch,
                                  type="_Recv"))  # fmt: skip
        for (name, _, _, _), node_inputs in zip(rows, inputs, strict=True):
            if placed[name] == rank or name not in step:
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
    notes = ["GraphDef only: no timings (TIC works; TAC and metrics need RunMetadata)"]
    _, fetches = step_nodes({n.name: n for n in graph.node})
    if fetches:
        notes.append(f"training step: the ancestry of {', '.join(fetches)}")
    else:
        notes.append("no train op (no node applies gradients): every node is kept")
    return Job("tensorflow", graphs, empty_trace(), sources=(str(path),), notes=tuple(notes))
