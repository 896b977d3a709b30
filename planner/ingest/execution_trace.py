"""PyTorch Execution Trace (``ExecutionTraceObserver`` JSON), schema 1.0.1 .. 1.1.1-chakra.0.0.4.

An ET lists every record-function node of one traced step with its control parent
and the tensors it reads and writes, which is what a Kineto trace lacks. Data
dependencies come from tensor ids: a node that reads tensor t depends on the last
node before it (in node id order) that wrote t. Nodes are joined to Kineto ops by
record-function id (``rf_id`` <-> Kineto ``args["Record function id"]``).

Node layouts: 1.0.x has ``parent``, ``rf_id``, ``tid`` at the top and ``inputs`` /
``outputs`` as value lists with ``input_types``; 1.1.x-chakra has ``ctrl_deps``,
``inputs: {values, types, ...}`` and ``rf_id``/``tid`` in ``attrs``. A tensor value is
``[tensor_id, storage_id, offset, numel, itemsize, device]``.

Parameters (DDP): after backward, DDP's reducer copies each bucket back into the
gradients, one ``torch.distributed.ddp.reducer::copy_bucket_to_grad`` node per parameter
whose input is the parameter tensor and whose child ``aten::copy_`` reads a view of the
flat bucket (storage, element offset); the bucket storage is the input of the
collective's ``c10d::allreduce_`` / ``gloo:all_reduce`` / ``record_param_comms`` nodes.
The forward ops that read the parameter's storage give its first read and its name.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from planner.errors import InputError
from planner.ingest.kineto_events import read_document
from planner.model.graph import is_acyclic

TensorKey = tuple[int, int]

_COPY_BUCKET = "copy_bucket_to_grad"
_COMM_NODE = re.compile(
    r"^(?:c10d::|record_param_comms$|(?:nccl|gloo|rccl|hccl|mpi|ucc|xccl):)", re.IGNORECASE
)


@dataclass(frozen=True)
class EtParameter:
    """One parameter as the ET shows it: its tensor, its place in a DDP bucket, its readers.

    `readers` are (rf_id, node name, argument label) of the nodes that read its storage,
    in node order (the reducer's own nodes left out).
    """

    tensor: TensorKey
    shape: tuple[int, ...]
    numel: int
    itemsize: int
    bucket_storage: int
    bucket_offset: int
    readers: tuple[tuple[int, str, str], ...]

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


@dataclass(frozen=True)
class ExecutionTrace:
    """The parsed nodes of one ET: per node its id, name, rf_id, parent, tid and tensors."""

    path: Path
    schema: str
    pid: int | None
    ids: np.ndarray
    names: list[str]
    rf_id: np.ndarray
    parent: np.ndarray
    tid: np.ndarray
    reads: list[list[TensorKey]] = field(repr=False)
    writes: list[list[TensorKey]] = field(repr=False)
    step: int | None = None
    parameters: tuple[EtParameter, ...] = field(default=(), repr=False)
    #: bucket storage id -> rf_ids of the collective nodes that take it, in node order
    comm_inputs: dict[int, tuple[int, ...]] = field(default_factory=dict, repr=False)

    @property
    def nodes(self) -> np.ndarray:
        return self.ids

    def rf_ids(self) -> Iterator[int]:
        return (int(x) for x in self.rf_id if x > 0)

    def data_edges(self) -> list[tuple[int, int]]:
        """(producer node id, consumer node id) from tensor ids, in node order."""
        writer: dict[TensorKey, int] = {}
        edges: list[tuple[int, int]] = []
        for i in np.argsort(self.ids, kind="stable"):
            node = int(self.ids[i])
            for key in self.reads[i]:
                src = writer.get(key)
                if src is not None and src != node:
                    edges.append((src, node))
            for key in self.writes[i]:
                writer[key] = node
        return edges


def _tensors(values: Any, types: Any) -> list[TensorKey]:
    """Tensor keys among a node's input/output values (lists of tensors included)."""
    keys: list[TensorKey] = []
    if not isinstance(values, list):
        return keys
    types = types if isinstance(types, list) else [""] * len(values)
    for value, typ in zip(values, types, strict=False):
        typ = str(typ)
        if typ.startswith("Tensor(") and _is_tensor(value):
            keys.append((int(value[0]), int(value[1])))
        elif typ.startswith("GenericList[Tensor") and isinstance(value, list):
            keys.extend((int(v[0]), int(v[1])) for v in value if _is_tensor(v))
    return keys


def _is_tensor(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) >= 2
        and isinstance(value[0], int)
        and isinstance(value[1], int)
    )


def read_execution_trace(path: Path, document: Any | None = None) -> ExecutionTrace:
    """Parse an ET file; InputError when it is not one or its nodes are malformed."""
    doc = read_document(path) if document is None else document
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise InputError(path, "not a PyTorch Execution Trace: no nodes list")
    schema = str(doc.get("schema", ""))
    if not schema:
        raise InputError(path, "not a PyTorch Execution Trace: no schema")
    nodes = doc["nodes"]
    ids, names, rf, parent, tid = [], [], [], [], []
    reads: list[list[TensorKey]] = []
    writes: list[list[TensorKey]] = []
    step = None
    try:
        for node in nodes:
            attrs = {a["name"]: a.get("value") for a in node.get("attrs", []) if "name" in a}
            ids.append(int(node["id"]))
            name = str(node.get("name", ""))
            names.append(name)
            rf.append(int(node.get("rf_id", attrs.get("rf_id", 0)) or 0))
            parent.append(int(node.get("parent", node.get("ctrl_deps", 0)) or 0))
            tid.append(int(node.get("tid", attrs.get("tid", 0)) or 0))
            inputs, outputs = node.get("inputs"), node.get("outputs")
            if isinstance(inputs, dict):  # 1.1.x
                reads.append(_tensors(inputs.get("values"), inputs.get("types")))
                out = outputs if isinstance(outputs, dict) else {}
                writes.append(_tensors(out.get("values"), out.get("types")))
            else:  # 1.0.x
                reads.append(_tensors(inputs, node.get("input_types")))
                writes.append(_tensors(outputs, node.get("output_types")))
            if name.startswith("ProfilerStep#") and step is None:
                step = int(name.split("#")[1])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InputError(path, f"malformed Execution Trace node ({exc!r})") from None
    if not ids:
        raise InputError(path, "Execution Trace has no nodes")
    pid = doc.get("pid") if isinstance(doc.get("pid"), int) else None
    parameters: tuple[EtParameter, ...] = ()
    comm: dict[int, tuple[int, ...]] = {}
    if any(_COPY_BUCKET in n for n in set(names)):
        try:
            parameters, comm = _ddp_parameters(nodes)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            raise InputError(path, f"malformed DDP reducer nodes ({exc!r})") from None
    return ExecutionTrace(
        path=path,
        schema=schema,
        pid=pid,
        ids=np.asarray(ids, dtype=np.int64),
        names=names,
        rf_id=np.asarray(rf, dtype=np.int64),
        parent=np.asarray(parent, dtype=np.int64),
        tid=np.asarray(tid, dtype=np.int64),
        reads=reads,
        writes=writes,
        step=step,
        parameters=parameters,
        comm_inputs=comm,
    )


def _node_fields(node: dict[str, Any]) -> tuple[int, int, list[Any], list[Any], str]:
    """(id, rf_id, input values, input types, op schema) of a node of either layout."""
    attrs = {a["name"]: a.get("value") for a in node.get("attrs", []) if "name" in a}
    inputs = node.get("inputs")
    if isinstance(inputs, dict):
        values, types = inputs.get("values"), inputs.get("types")
    else:
        values, types = inputs, node.get("input_types")
    rf = int(node.get("rf_id", attrs.get("rf_id", 0)) or 0)
    schema = str(node.get("op_schema", attrs.get("op_schema", "")) or "")
    return (
        int(node["id"]),
        rf,
        values if isinstance(values, list) else [],
        types if isinstance(types, list) else [],
        schema,
    )


def _arg_names(schema: str) -> list[str]:
    """Argument names of an op schema ``ns::op(Tensor input, Tensor? weight=None, ...)``."""
    start = schema.find("(")
    if start < 0:
        return []
    names, depth, piece = [], 0, ""
    for ch in schema[start + 1 :]:
        if ch in "([" and not (ch == "(" and depth == 0 and not piece.strip()):
            depth += 1
        elif ch in ")]":
            if depth == 0:
                break
            depth -= 1
        if ch == "," and depth == 0:
            names.append(piece)
            piece = ""
        else:
            piece += ch
    names.append(piece)
    out = []
    for text in names:
        text = text.split("=", 1)[0].strip()
        if text and text != "*":
            out.append(text.split()[-1])
    return out


def _tensor_values(values: list[Any], types: list[Any]) -> Iterator[tuple[list[Any], int, int]]:
    """(tensor value, argument position, list index or -1) of the tensors among inputs."""
    for pos, (value, typ) in enumerate(zip(values, types, strict=False)):
        typ = str(typ)
        if typ.startswith("Tensor") and _is_tensor(value) and len(value) >= 5:
            yield value, pos, -1
        elif typ.startswith("GenericList[Tensor") and isinstance(value, list):
            for i, v in enumerate(value):
                if _is_tensor(v) and len(v) >= 5:
                    yield v, pos, i


def _ddp_parameters(
    nodes: list[dict[str, Any]],
) -> tuple[tuple[EtParameter, ...], dict[int, tuple[int, ...]]]:
    """Parameters from DDP's ``copy_bucket_to_grad`` nodes, their readers and collectives."""
    fields = sorted(((_node_fields(n), n) for n in nodes), key=lambda f: f[0][0])
    found: list[tuple[list[Any], tuple[int, ...], int, int]] = []  # value, shape, storage, off
    reducer_nodes: set[int] = set()
    # The copy out of the bucket is the next aten::copy_ after a copy_bucket_to_grad node
    # (by id, not by parent: the gloo thread's records can corrupt the ET's parent links).
    pending: tuple[list[Any], tuple[int, ...]] | None = None
    for (nid, _, values, types, _), node in fields:
        name = str(node.get("name", ""))
        if _COPY_BUCKET in name:
            params = list(_tensor_values(values, types))
            pending = None
            if len(params) == 1:
                shapes = node["inputs"].get("shapes") if isinstance(node["inputs"], dict) else None
                shape = tuple(shapes[0]) if isinstance(shapes, list) and shapes else ()
                pending = (params[0][0], shape)
                reducer_nodes.add(nid)
            continue
        if pending is None or name != "aten::copy_":
            continue
        value, shape = pending
        srcs = [
            v
            for v, _, _ in _tensor_values(values, types)
            if int(v[1]) != int(value[1]) and int(v[3]) == int(value[3])
        ]
        if len(srcs) >= 2:  # (gradient, bucket view): the bucket is the source
            reducer_nodes.add(nid)
            found.append((value, shape, int(srcs[-1][1]), int(srcs[-1][2])))
            pending = None
    if not found:
        return (), {}
    storages = {int(v[1]) for v, _, _, _ in found}
    buckets = {b for _, _, b, _ in found}
    readers: dict[int, list[tuple[int, str, str]]] = {s: [] for s in storages}
    comm: dict[int, list[int]] = {b: [] for b in buckets}
    for (nid, rf, values, types, schema), node in fields:
        if nid in reducer_nodes:
            continue
        name = str(node.get("name", ""))
        arg_names: list[str] | None = None
        seen: set[int] = set()
        for v, pos, index in _tensor_values(values, types):
            storage = int(v[1])
            if storage in buckets and _COMM_NODE.match(name) and rf not in comm[storage]:
                comm[storage].append(rf)
            if storage in readers and storage not in seen:
                seen.add(storage)
                if arg_names is None:
                    arg_names = _arg_names(schema)
                label = arg_names[pos] if pos < len(arg_names) else f"arg{pos}"
                label = label if index < 0 else f"{label}[{index}]"
                readers[storage].append((rf, name, label))
    params = tuple(
        EtParameter(
            tensor=(int(v[0]), int(v[1])),
            shape=shape,
            numel=int(v[3]),
            itemsize=int(v[4]),
            bucket_storage=bucket,
            bucket_offset=offset,
            readers=tuple(readers[int(v[1])]),
        )
        for v, shape, bucket, offset in found
    )
    return params, {b: tuple(r) for b, r in comm.items()}


def match_ranks(et_paths: Sequence[Path], ranked: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """ET per rank name: by process id (ET ``pid`` = the Kineto pid), else by order.

    The profiler and the ET observer run in one process, so an ET whose ``pid`` is no
    process of the Kineto trace it would join belongs to another rank or run: refused
    (its record-function ids would still coincide, joining the wrong dependencies).
    """
    ets = [read_execution_trace(Path(p)) for p in et_paths]
    if len(ets) != len(ranked):
        raise InputError(et_paths[0], f"{len(ets)} Execution Traces for {len(ranked)} ranks")
    by_pid: dict[int, ExecutionTrace] = {}
    for et in ets:
        if et.pid is not None:
            if et.pid in by_pid:
                raise InputError(
                    et.path, f"process {et.pid} also has {by_pid[et.pid].path.name}: give one "
                    "Execution Trace per rank"
                )  # fmt: skip
            by_pid[et.pid] = et
    out: dict[str, Any] = {}
    for (name, ev), et in zip(ranked, ets, strict=False):
        match = next((by_pid[p] for p in sorted(ev.pids) if p in by_pid), None)
        if match is None and et.pid is not None and ev.pids:
            pids = ", ".join(map(str, sorted(ev.pids)[:4]))
            raise InputError(
                et.path, f"Execution Trace of process {et.pid} does not belong to {ev.path.name} "
                f"(processes {pids}): give the ET of the same run and rank"
            )  # fmt: skip
        out[name] = match or et
    return out


def dag_edges(
    et: ExecutionTrace, model: Any, edges: list[tuple[str, str, str]], reference: int
) -> tuple[list[tuple[str, str, str]], list[str]]:
    """Conservative edges plus the ET's data edges between the Kineto ops they join to.

    A data edge between two ET nodes becomes an edge between the ops holding them
    (outermost op of each node's Kineto event); edges within one op are dropped, and
    one that would close a cycle with the thread/stream order is dropped with a note.
    """
    notes: list[str] = []
    rf_to_op: dict[int, str] = model.rf_to_op
    node_op = {
        int(i): rf_to_op[int(r)]
        for i, r in zip(et.ids, et.rf_id, strict=False)
        if int(r) in rf_to_op
    }
    joined = len(node_op)
    with_rf = int((et.rf_id > 0).sum())
    notes.append(
        f"{model.rank}: Execution Trace {et.path.name}: {joined} of {with_rf} nodes joined to "
        f"Kineto ops of step {reference}"
    )
    data = {
        (node_op[a], node_op[b])
        for a, b in et.data_edges()
        if a in node_op and b in node_op and node_op[a] != node_op[b]
    }
    existing = {(u, v) for u, v, _ in edges}
    if _acyclic([*existing, *data]):
        kept = data
    else:  # rare: networkx finds which edges contradict the order
        import networkx as nx

        dag = nx.DiGraph((u, v) for u, v, _ in edges)
        kept = set()
        for u, v in sorted(data):
            if dag.has_node(v) and dag.has_node(u) and nx.has_path(dag, v, u):
                continue
            dag.add_edge(u, v)
            kept.add((u, v))
        notes.append(f"{model.rank}: {len(data) - len(kept)} ET data edges contradict the order")
    out = [(u, v, "data" if (u, v) in kept else k) for u, v, k in edges]
    out.extend((u, v, "data") for u, v in sorted(kept - existing))
    return out, notes


def _acyclic(edges: list[tuple[str, str]]) -> bool:
    """The named edges form no cycle."""
    index: dict[str, int] = {}
    src = [index.setdefault(u, len(index)) for u, _ in edges]
    dst = [index.setdefault(v, len(index)) for _, v in edges]
    return is_acyclic(np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64), len(index))


def resolve_parameters(et: ExecutionTrace, model: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """Per parameter of the ET: name, bytes, its collective and the first forward op to read it.

    `model` is the rank's `RankModel` (``ops``, ``rf_to_op``). The collective is the op
    that a collective node taking the parameter's bucket joins to; the first read is the
    op of the earliest forward-phase reader. The name is that op (lane dropped) and the
    argument, e.g. ``aten::conv2d#3:weight``, since the ET carries no module names.
    Rows are JSON-friendly, ordered by collective, then place in the bucket.
    """
    ops, rf_to_op = model.ops, model.rf_to_op
    notes: list[str] = []
    bucket_op: dict[int, str | None] = {}
    for storage, rfs in et.comm_inputs.items():
        joined = (rf_to_op.get(rf) for rf in rfs)
        bucket_op[storage] = next((o for o in joined if o and ops[o].kind == "collective"), None)
    rows: list[dict[str, Any]] = []
    used: dict[str, int] = {}
    for param in et.parameters:
        first: tuple[str, str, str] | None = None
        for rf, node, label in param.readers:
            op = rf_to_op.get(rf)
            if op is not None and ops[op].phase == "forward":
                first = (op, node, label)
                break
        if first is None:
            base = f"tensor{param.tensor[0]}"
        else:
            op, node, label = first
            short = op.split("/", 1)[-1]
            base = f"{short}:{label}" if node == ops[op].type else f"{short}/{node}:{label}"
        used[base] = used.get(base, 0) + 1
        rows.append(
            {
                "name": base if used[base] == 1 else f"{base}~{used[base]}",
                "shape": list(param.shape),
                "nbytes": param.nbytes,
                "collective": bucket_op.get(param.bucket_storage),
                "bucket_offset": param.bucket_offset * param.itemsize,
                "first_read_op": first[0] if first else None,
            }
        )
    rows.sort(key=lambda r: (r["collective"] or "~", r["bucket_offset"], r["name"]))
    lost = sum(r["collective"] is None for r in rows)
    unread = sum(r["first_read_op"] is None for r in rows)
    notes.append(
        f"{model.rank}: {len(rows)} parameters from the Execution Trace's DDP bucket copies"
        + (f"; {lost} not joined to a collective" if lost else "")
        + (
            f"; {unread} with no forward read (window end: step's first forward op)"
            if unread
            else ""
        )  # fmt: skip
    )
    return rows, notes
