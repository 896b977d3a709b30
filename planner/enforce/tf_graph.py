"""TensorFlow: apply a plan's control edges to a GraphDef as ``^name`` inputs.

TicTac §5.1 notes that a DAG dependency is the conservative way to enforce an order;
Caramel (Stage 2) enforces its activation order exactly so. An edge (src, dst) becomes
the control input ``^src`` of node ``dst``. The rewrite keeps the graph valid: the same
nodes, no cycle (an edge that would close one is refused with its path), and an edge the
graph already implies is dropped. Uses the project's TF protobuf subset; no TensorFlow.

Names: a plan names ops as `planner` ingested them. A GraphDef node name is used as is;
a client-graph transfer ``recv:<node>`` (`planner.ingest.tf_graphdef`) stands for the
node whose output crosses tasks, so ``recv:A -> recv:B`` orders B's producer after A's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import networkx as nx
from google.protobuf import text_format

from planner.errors import InputError
from planner.ingest.proto import tf_subset_pb2 as tfpb
from planner.ingest.tf_graphdef import parse_graphdef, split_input


@dataclass
class Rewrite:
    """What a rewrite did: edges added as ``^src`` inputs, edges already implied."""

    added: list[tuple[str, str]] = field(default_factory=list)
    implied: list[tuple[str, str]] = field(default_factory=list)
    dropped: list[tuple[str, str]] = field(default_factory=list)  # would close a cycle

    def as_dict(self) -> dict[str, object]:
        return {
            "schema": "planner.graphdef_rewrite/1",
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
    edges: Iterable[tuple[str, str]],
    where: str = "<plan>",
    drop_cyclic: bool = False,
) -> tuple[bytes, Rewrite]:
    """Rewrite a GraphDef file with `edges`; the serialized result (same text/binary form)."""
    graph, text = read_graphdef(graphdef)
    out, rewrite = add_control_edges(graph, edges, where, drop_cyclic)
    data = text_format.MessageToString(out).encode() if text else out.SerializeToString()
    return data, rewrite
