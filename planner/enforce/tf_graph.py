"""TensorFlow: apply a plan's control edges to a GraphDef as ``^name`` inputs.

TicTac §5.1 notes that a DAG dependency is the conservative way to enforce an order;
Caramel (Stage 2) enforces its activation order exactly so. An edge (src, dst) becomes
the control input ``^src`` of node ``dst``. The rewrite keeps the graph valid: the same
nodes, no cycle (an edge that would close one is refused with its path), and an edge the
graph already implies is dropped. Uses the project's TF protobuf subset; no TensorFlow.

Which client-graph nodes order a transfer (`transfer_nodes`). A PS worker's recv of
variable v is the value of a PS-side read of v (``ReadVariableOp``, or ``Identity`` of a
ref variable; placed with v) that a node of that worker consumes: TensorFlow runs the
read on the PS, and the PS's ``_Send`` hands the tensor to the worker's pending
``RecvTensor`` request as soon as the read is done. Chaining those reads with control
edges in plan order (``^prev_read``) therefore makes the PS produce, and send, the
worker's tensors in plan order: TicTac's enforcement at the sender. A plan names a
transfer as `planner` ingested it:

- a worker-partition ``_Recv`` from RunMetadata (``tower0/MatMul/ReadVariableOp_S3``):
  TensorFlow names it after its source node plus ``_S<n>``; the source is the read;
- a client-GraphDef recv ``recv:<node>`` (`planner.ingest.tf_graphdef`): when the node
  is a variable (handle), the reads of it whose consumers run on the plan's rank; an
  edge on the handle itself would only order when handles are produced;
- any other name: the node of that name.

Several transfers can map to one read (a grappler control recv and the data recv of the
same read): a rank's chain keeps each read at its first place in the plan.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import networkx as nx
from google.protobuf import text_format

from planner.enforce.plan_file import (
    is_control_deps,
    load_control_edges,
    load_plan,
    read_plan_file,
)
from planner.errors import InputError
from planner.ingest.proto import tf_subset_pb2 as tfpb
from planner.ingest.tf_graphdef import parse_graphdef, split_input, task_of

_VARIABLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable", "_VarHandlesOp"})
_READ_OPS = frozenset({"ReadVariableOp", "Identity"})
_PARTITION_NAME = re.compile(r"^(?P<src>.+)_S\d+$")


@dataclass
class Rewrite:
    """What a rewrite did: edges added as ``^src`` inputs, edges already implied."""

    added: list[tuple[str, str]] = field(default_factory=list)
    implied: list[tuple[str, str]] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)  # would close a cycle
    nodes: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # rank: transfer: nodes

    def as_dict(self) -> dict[str, object]:
        return {
            "schema": "planner.graphdef_rewrite/1",
            "nodes": self.nodes,
            "added": [list(e) for e in self.added],
            "implied": [list(e) for e in self.implied],
            "dropped": [list(e) for e in self.dropped],
        }


def _resolve(name: str, nodes: set[str]) -> str | None:
    for candidate in (name, name.removeprefix("^"), name.removeprefix("recv:")):
        base = candidate.split(":", 1)[0] if candidate not in nodes else candidate
        if base in nodes:
            return base
    return None


def node_dag(graph: tfpb.GraphDef) -> nx.DiGraph:
    """The nodes of `graph` with an edge for every data and control input."""
    dag = nx.DiGraph()
    dag.add_nodes_from(n.name for n in graph.node)
    for node in graph.node:
        for raw in node.input:
            src, _ = split_input(raw)
            if src in dag:
                dag.add_edge(src, node.name)
    return dag


def add_control_edges(
    graph: tfpb.GraphDef,
    edges: Iterable[tuple[str, str]],
    where: str = "<plan>",
    drop_cyclic: bool = False,
) -> tuple[tfpb.GraphDef, Rewrite]:
    """A copy of `graph` with each plan edge as a control input; InputError for an edge
    naming no node, or one that would make a cycle (with `drop_cyclic`: left out and
    listed in `Rewrite.dropped`)."""
    out = tfpb.GraphDef()
    out.CopyFrom(graph)
    names = {n.name for n in out.node}
    by_name = {n.name: n for n in out.node}
    dag = node_dag(out)
    rewrite = Rewrite()
    for u_raw, v_raw in edges:
        u, v = _resolve(u_raw, names), _resolve(v_raw, names)
        for raw, found in ((u_raw, u), (v_raw, v)):
            if found is None:
                raise InputError(where, f"control edge {u_raw!r} -> {v_raw!r}: no node {raw!r}")
        assert u is not None and v is not None
        if u == v or nx.has_path(dag, u, v):
            rewrite.implied.append((u, v))
            continue
        if nx.has_path(dag, v, u):
            if drop_cyclic:
                rewrite.dropped.append((u, v))
                continue
            path = " -> ".join(nx.shortest_path(dag, v, u))
            raise InputError(where, f"control edge {u} -> {v} would close a cycle ({path})")
        by_name[v].input.append(f"^{u}")
        dag.add_edge(u, v)
        rewrite.added.append((u, v))
    return out, rewrite


class _Index:
    """Name lookups over a GraphDef: nodes, data consumers, task placement."""

    def __init__(self, graph: tfpb.GraphDef) -> None:
        self.nodes = {n.name: n for n in graph.node}
        self.consumers: dict[str, list[str]] = {}
        for node in graph.node:
            for raw in node.input:
                src, kind = split_input(raw)
                if kind == "data":
                    self.consumers.setdefault(src, []).append(node.name)
        tasks = sorted({task_of(n.device) for n in graph.node} - {""})
        self.default_task = next((t for t in tasks if not t.startswith("ps")), "worker0")

    def task(self, name: str) -> str:
        """The task a node runs on (no device: the client's target, the first worker)."""
        return task_of(self.nodes[name].device) or self.default_task

    def node_of(self, name: str) -> str | None:
        """The GraphDef node a plan name stands for (see the module docstring)."""
        candidates = (name, name.removeprefix("^"), name.removeprefix("recv:"))
        for candidate in candidates:
            if candidate in self.nodes:
                return candidate
        for candidate in candidates:
            found = _PARTITION_NAME.match(candidate)
            if found and found["src"] in self.nodes:
                return found["src"]
            if candidate.split(":", 1)[0] in self.nodes:  # a tensor name, node:output
                return candidate.split(":", 1)[0]
        return None

    def reads(self, variable: str, rank: str | None) -> list[str]:
        """Reads of `variable` consumed on `rank` (any rank when None), in graph order."""
        out = []
        for name in self.consumers.get(variable, []):
            if self.nodes[name].op not in _READ_OPS:
                continue
            users = self.consumers.get(name, [])
            if rank is None or any(
                task_of(self.nodes[u].device) == rank for u in users if self.nodes[u].device
            ):
                out.append(name)
        if not out and rank is not None:  # consumers without a device: the placement rule
            out = [
                n
                for n in self.reads(variable, None)
                if any(self.task(u) == rank for u in self.consumers.get(n, []))
            ]
        return out


def transfer_nodes(
    graph: tfpb.GraphDef, name: str, rank: str | None = None, where: str = "<plan>"
) -> tuple[str, ...]:
    """The nodes of `graph` whose order orders the transfer `name` to `rank` (see the
    module docstring); InputError when it names no node."""
    return _transfer_nodes(_Index(graph), name, rank, where)


def _transfer_nodes(index: _Index, name: str, rank: str | None, where: str) -> tuple[str, ...]:
    node = index.node_of(name)
    if node is None:
        raise InputError(where, f"transfer {name!r}: no node {name!r} in the GraphDef")
    if index.nodes[node].op in _VARIABLE_OPS:
        reads = index.reads(node, rank)
        if reads:
            return tuple(reads)
    return (node,)


def chain_edges(
    graph: tfpb.GraphDef, orders: Mapping[str, Sequence[str]], where: str = "<plan>"
) -> tuple[list[tuple[str, str]], dict[str, dict[str, list[str]]]]:
    """Control edges that make each rank's transfers (rank -> names in plan order) leave
    the sender in that order: the chain of their nodes, each at its first place; and the
    nodes found for every transfer."""
    index = _Index(graph)
    edges: list[tuple[str, str]] = []
    found: dict[str, dict[str, list[str]]] = {}
    for rank, names in orders.items():
        task = rank if rank and rank != "*" else None
        chain: list[str] = []
        found[rank] = {}
        for name in names:
            nodes = _transfer_nodes(index, name, task, where)
            found[rank][name] = list(nodes)
            chain.extend(n for n in nodes if n not in chain)
        edges.extend(zip(chain[:-1], chain[1:], strict=True))
    return edges, found


def plan_orders(path: str | Path, rank: str | None = None) -> dict[str, list[str]] | None:
    """Rank -> transfer names in plan order from an ordered plan file (``*`` for a plan
    that names no rank); None for a ``planner.control_deps`` file of explicit edges."""
    _text, doc = read_plan_file(path)
    ranks: list[str | None] = [rank]
    if doc is not None:
        if is_control_deps(doc):
            return None
        entries = doc.get("ranks") if isinstance(doc, dict) else None
        if rank is None and isinstance(entries, list) and len(entries) > 1:
            ranks = [str(e.get("rank")) for e in entries if isinstance(e, dict)]
    out: dict[str, list[str]] = {}
    for r in ranks:
        plan = load_plan(path, r)
        out[r or plan.rank or "*"] = list(plan.order)
    return out


def rewrite_with_plan(
    graph: tfpb.GraphDef, plan: str | Path, rank: str | None = None, drop_cyclic: bool = False
) -> tuple[tfpb.GraphDef, Rewrite]:
    """`graph` with a plan applied: an ordered plan as each rank's chain of sender-side
    nodes (`chain_edges`); a control_deps file's edges between the nodes of their ends."""
    where = str(plan)
    orders = plan_orders(plan, rank)
    if orders is not None:
        edges, found = chain_edges(graph, orders, where)
    else:
        index = _Index(graph)
        edges, found = [], {}
        for u, v in load_control_edges(plan, rank):
            us = _transfer_nodes(index, u, rank, where)
            vs = _transfer_nodes(index, v, rank, where)
            edges.extend((a, b) for a in us for b in vs)
    out, rewrite = add_control_edges(graph, edges, where, drop_cyclic)
    rewrite.nodes = found
    return out, rewrite


def read_graphdef(path: str | Path) -> tuple[tfpb.GraphDef, bool]:
    """A GraphDef file (binary, or text when ``.pbtxt``/text content) and whether text."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise InputError(p, f"cannot read ({exc.strerror or exc})") from None
    text = p.suffix in (".pbtxt", ".txt") or data[:4096].lstrip().startswith(b"node")
    return parse_graphdef(data, p, text), text


def rewrite_file(
    graphdef: str | Path,
    plan: str | Path,
    rank: str | None = None,
    drop_cyclic: bool = False,
) -> tuple[bytes, Rewrite]:
    """Rewrite a GraphDef file with a plan file (`rewrite_with_plan`); the serialized
    result, in the input's text or binary form."""
    graph, text = read_graphdef(graphdef)
    out, rewrite = rewrite_with_plan(graph, plan, rank, drop_cyclic)
    data = text_format.MessageToString(out).encode() if text else out.SerializeToString()
    return data, rewrite
