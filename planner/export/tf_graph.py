"""TensorFlow: apply a plan's control edges to a GraphDef as ``^name`` inputs.

An edge (src, dst) becomes the control input ``^src`` of node ``dst``. The rewrite keeps
the graph valid: every node with its inputs, no cycle (an edge that would close one is
refused with its path), and an edge the graph already implies is dropped. Uses the
project's TF protobuf subset; no TensorFlow.

Which client-graph nodes order a transfer (`transfer_nodes`). A PS worker's recv of
variable v is the value of a PS-side read of v (``ReadVariableOp``, or ``Identity`` of a
ref variable; placed with v) that a node of that worker consumes: TensorFlow runs the
read on the PS, and the PS's ``_Send`` hands the tensor to the worker's pending
``RecvTensor`` request as soon as the read is done. An ordered plan is applied per rank
to those reads, each at its first place in the plan, in one of two modes (`MODES`):

- ``arrival`` (default): TicTac §5.1's "direct dependency in the DAG". Read k+1 waits
  for an `Identity` of read k placed on the receiving rank, which TensorFlow feeds from
  that rank's one `_Recv` of the tensor; its control edge back to the PS is a tiny
  control message. Transfer k+1 therefore leaves only after transfer k has arrived: the
  worker sees the plan's recv order exactly, at one round trip per transfer (the paper's
  "conservative" choice: no two transfers of a rank overlap). Adds one node per
  transfer but the last, under `MARKER_SCOPE`.
- ``sender``: the reads chained directly (``^prev_read``): the PS produces and sends
  the tensors in plan order, pipelined, with no new node; but the receiver pulls them
  over concurrent RPCs, so their arrival order is not enforced.

A plan names a transfer as `planner` ingested it:

- a RunMetadata transfer ``recv:<tensor>`` / ``recv:^<node>``
  (`planner.ingest.tf_runmetadata`) or a client-GraphDef recv ``recv:<node>``
  (`planner.ingest.tf_graphdef`): the node; when it is a variable (handle), the reads
  of it whose consumers run on the plan's rank, or nothing: an edge on the handle would
  order no transfer and would make the variable's initializer wait for the chain;
- a partition ``_Recv`` name of older plans (``tower0/MatMul/ReadVariableOp_S3``):
  TensorFlow names it after its source node plus ``_S<n>``; the source is the read;
- any other name: the node of that name.

Several transfers can map to one read (grappler turns a static ``ShapeN`` of a read into
a control message beside the data): they leave the PS together, so a rank's chain keeps
each read at the first place any of them has in the plan (`Rewrite.together`).
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
from planner.ingest.files import read_bytes
from planner.ingest.proto import tf_subset_pb2 as tfpb
from planner.ingest.tf_graphdef import parse_graphdef, split_input, task_of

_VARIABLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable", "_VarHandlesOp"})
_READ_OPS = frozenset({"ReadVariableOp", "Identity"})
_PARTITION_NAME = re.compile(r"^(?P<src>.+)_S\d+$")
_RANK = re.compile(r"^(?P<job>[A-Za-z_]+?)(?P<task>\d+)$")
MARKER_SCOPE = "planner/arrived"
MODES = ("arrival", "sender")


@dataclass
class Rewrite:
    """What a rewrite did: edges added as ``^src`` inputs, edges already implied."""

    added: list[tuple[str, str]] = field(default_factory=list)
    implied: list[tuple[str, str]] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)  # would close a cycle
    markers: list[str] = field(default_factory=list)  # arrival nodes added (mode arrival)
    together: dict[str, list[list[str]]] = field(default_factory=dict)  # rank: [t, leaves with]
    nodes: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # rank: transfer: nodes

    def as_dict(self) -> dict[str, object]:
        return {
            "schema": "planner.graphdef_rewrite/1",
            "nodes": self.nodes,
            "added": [list(e) for e in self.added],
            "implied": [list(e) for e in self.implied],
            "dropped": [list(e) for e in self.dropped],
            "markers": self.markers,
            "together": self.together,
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
        bare = name.removeprefix("recv:").removeprefix("send:").removeprefix("^")
        bare = bare.rsplit("->", 1)[0] if name.startswith("send:") else bare  # send:t->ps0
        candidates = (name, name.removeprefix("^"), bare)
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
    if index.nodes[node].op in _VARIABLE_OPS:  # the handle moves no data; its reads do
        return tuple(index.reads(node, rank))
    return (node,)


@dataclass
class _Chains:
    """Per rank: the sender-side nodes in plan order, the nodes of every transfer, and
    the transfers that leave with an earlier one ([transfer, earlier transfer])."""

    reads: dict[str, list[str]] = field(default_factory=dict)
    found: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    together: dict[str, list[list[str]]] = field(default_factory=dict)


def _chains(index: _Index, orders: Mapping[str, Sequence[str]], where: str) -> _Chains:
    out = _Chains()
    for rank, names in orders.items():
        task = rank if rank and rank != "*" else None
        chain: list[str] = []
        owner: dict[str, str] = {}
        out.found[rank], out.together[rank] = {}, []
        for name in names:
            nodes = _transfer_nodes(index, name, task, where)
            out.found[rank][name] = list(nodes)
            new = [n for n in nodes if n not in owner]
            if nodes and not new:
                out.together[rank].append([name, owner[nodes[0]]])
            for n in new:
                owner[n] = name
                chain.append(n)
        out.reads[rank] = chain
    return out


def chain_edges(
    graph: tfpb.GraphDef, orders: Mapping[str, Sequence[str]], where: str = "<plan>"
) -> tuple[list[tuple[str, str]], _Chains]:
    """Mode ``sender``: control edges that make each rank's transfers (rank -> names in
    plan order) leave the sender in that order: the chain of their reads."""
    chains = _chains(_Index(graph), orders, where)
    edges = [e for chain in chains.reads.values() for e in zip(chain[:-1], chain[1:], strict=True)]
    return edges, chains


def _rank_device(index: _Index, read: str, rank: str) -> str:
    """The device to place a marker on: that of a consumer of `read` on `rank`, else the
    rank's task (``worker1`` -> ``/job:worker/task:1``)."""
    for user in index.consumers.get(read, []):
        device = index.nodes[user].device
        if device and task_of(device) == rank:
            return device
    found = _RANK.match(rank)
    return f"/job:{found['job']}/task:{found['task']}" if found else ""


def _dtype_attr(node: tfpb.NodeDef) -> tfpb.AttrValue | None:
    for key in ("dtype", "T"):
        if key in node.attr and node.attr[key].type:
            return node.attr[key]
    return None


def arrival_markers(
    graph: tfpb.GraphDef, orders: Mapping[str, Sequence[str]], where: str = "<plan>"
) -> tuple[list[tfpb.NodeDef], list[tuple[str, str]], _Chains]:
    """Mode ``arrival``: per rank, the read of each transfer waits until the previous
    transfer has arrived (see the module docstring). The marker nodes, the control
    edges (marker -> next read), and the chains."""
    index = _Index(graph)
    chains = _chains(index, orders, where)
    taken = set(index.nodes)
    markers: list[tfpb.NodeDef] = []
    edges: list[tuple[str, str]] = []
    for rank, chain in chains.reads.items():
        task = rank if rank and rank != "*" else index.default_task
        for position, (read, following) in enumerate(zip(chain[:-1], chain[1:], strict=True)):
            dtype = _dtype_attr(index.nodes[read])
            if dtype is None:  # no typed output to receive: order the reads themselves
                edges.append((read, following))
                continue
            marker = tfpb.NodeDef(
                name=_unique(f"{MARKER_SCOPE}/{task}/{position}", taken),
                op="Identity",
                input=[read],
                device=_rank_device(index, read, task),
            )
            marker.attr["T"].CopyFrom(dtype)
            markers.append(marker)
            edges.append((marker.name, following))
    return markers, edges, chains


def _unique(name: str, taken: set[str]) -> str:
    out, n = name, 1
    while out in taken:
        out, n = f"{name}_{n}", n + 1
    taken.add(out)
    return out


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
    graph: tfpb.GraphDef,
    plan: str | Path,
    rank: str | None = None,
    drop_cyclic: bool = False,
    mode: str = "arrival",
) -> tuple[tfpb.GraphDef, Rewrite]:
    """`graph` with a plan applied. An ordered plan, per rank: with mode ``arrival``,
    each transfer's read waits for the previous transfer's arrival on the rank
    (`arrival_markers`; the plan's recv order, at one round trip per transfer); with
    ``sender``, the chain of sender-side reads (`chain_edges`; the PS's send order, no
    new nodes, pipelined). A control_deps file: its edges between the nodes of their
    ends."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    where = str(plan)
    orders = plan_orders(plan, rank)
    markers: list[tfpb.NodeDef] = []
    chains = _Chains()
    if orders is not None and mode == "arrival":
        markers, edges, chains = arrival_markers(graph, orders, where)
    elif orders is not None:
        edges, chains = chain_edges(graph, orders, where)
    else:
        index = _Index(graph)
        edges = []
        for u, v in load_control_edges(plan, rank):
            us = _transfer_nodes(index, u, rank, where)
            vs = _transfer_nodes(index, v, rank, where)
            edges.extend((a, b) for a in us for b in vs)
    if markers:
        graph = _with_nodes(graph, markers)
    out, rewrite = add_control_edges(graph, edges, where, drop_cyclic)
    used = {u for u, _ in rewrite.added}
    rewrite.markers = [m.name for m in markers if m.name in used]
    if len(rewrite.markers) < len(markers):  # a marker whose edge was dropped (cycle)
        keep = set(rewrite.markers) | {n.name for n in graph.node} - {m.name for m in markers}
        kept = [n for n in out.node if n.name in keep]
        del out.node[:]
        out.node.extend(kept)
    rewrite.nodes = chains.found
    rewrite.together = {r: pairs for r, pairs in chains.together.items() if pairs}
    return out, rewrite


def _with_nodes(graph: tfpb.GraphDef, nodes: Sequence[tfpb.NodeDef]) -> tfpb.GraphDef:
    out = tfpb.GraphDef()
    out.CopyFrom(graph)
    out.node.extend(nodes)
    return out


def read_graphdef(path: str | Path) -> tuple[tfpb.GraphDef, bool]:
    """A GraphDef file (binary, or text when ``.pbtxt``/text content) and whether text."""
    p = Path(path)
    data = read_bytes(p)  # within the input limits; FIFOs and devices refused
    text = p.suffix in (".pbtxt", ".txt") or data[:4096].lstrip().startswith(b"node")
    return parse_graphdef(data, p, text), text


def rewrite_file(
    graphdef: str | Path,
    plan: str | Path,
    rank: str | None = None,
    drop_cyclic: bool = False,
    mode: str = "arrival",
) -> tuple[bytes, Rewrite]:
    """Rewrite a GraphDef file with a plan file (`rewrite_with_plan`); the serialized
    result, in the input's text or binary form."""
    graph, text = read_graphdef(graphdef)
    out, rewrite = rewrite_with_plan(graph, plan, rank, drop_cyclic, mode)
    if text:
        return text_format.MessageToString(out).encode(), rewrite
    return out.SerializeToString(deterministic=True), rewrite  # byte-identical across runs
