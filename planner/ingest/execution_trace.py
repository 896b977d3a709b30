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
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np

from planner.errors import InputError
from planner.ingest.kineto import read_document

TensorKey = tuple[int, int]


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
    )


def match_ranks(et_paths: Sequence[Path], ranked: Sequence[tuple[str, Any]]) -> dict[str, Any]:
    """ET per rank name: by process id (ET ``pid`` = the Kineto pid), else by order."""
    ets = [read_execution_trace(Path(p)) for p in et_paths]
    if len(ets) != len(ranked):
        raise InputError(et_paths[0], f"{len(ets)} Execution Traces for {len(ranked)} ranks")
    by_pid: dict[int, ExecutionTrace] = {et.pid: et for et in ets if et.pid is not None}
    out: dict[str, Any] = {}
    for (name, ev), et in zip(ranked, ets, strict=False):
        match = next((by_pid[p] for p in ev.pids if p in by_pid), None)
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
    dag = nx.DiGraph((u, v) for u, v, _ in edges)
    existing = {(u, v) for u, v, _ in edges}
    trial = dag.copy()
    trial.add_edges_from(data)
    if nx.is_directed_acyclic_graph(trial):
        kept = data
    else:
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
