"""Ops and the op DAG (OpGraph) that every scheduler, metric and simulation reads.

An `OpGraph` is never mutated by an algorithm: schedulers return priorities or new
edges, so one ingested graph can be planned several ways and compared.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import networkx as nx

OpKind = Literal["compute", "recv", "send", "collective"]
Phase = Literal["forward", "backward", "optimizer", "unknown"]
EdgeKind = Literal["data", "control"]

OP_KINDS: tuple[str, ...] = ("compute", "recv", "send", "collective")
TRANSFER_KINDS: frozenset[str] = frozenset({"recv", "send", "collective"})
PHASES: tuple[str, ...] = ("forward", "backward", "optimizer", "unknown")


class GraphError(ValueError):
    """The ops and edges do not form a valid DAG (unknown op, cycle, bad field)."""


@dataclass(frozen=True)
class Op:
    """One node of the DAG: a compute kernel or a network transfer.

    `resource` is where the op runs exclusively: a compute device/stream/thread, a
    channel such as ``worker0<-ps0`` (one per worker/PS pair and direction), or ``net``.
    """

    name: str
    kind: OpKind = "compute"
    resource: str = "cpu"
    param: str | None = None
    nbytes: int = 0
    phase: Phase = "unknown"
    type: str = ""

    @property
    def is_transfer(self) -> bool:
        return self.kind in TRANSFER_KINDS


@dataclass(frozen=True)
class OpGraph:
    """A DAG of ops; edges carry ``kind`` = data or control."""

    ops: Mapping[str, Op]
    dag: nx.DiGraph = field(repr=False)

    def __len__(self) -> int:
        return len(self.ops)

    @property
    def recvs(self) -> list[str]:
        """Names of recv ops (the transfers TicTac orders), in graph order."""
        return [n for n, op in self.ops.items() if op.kind == "recv"]

    @property
    def transfers(self) -> list[str]:
        return [n for n, op in self.ops.items() if op.is_transfer]

    @property
    def resources(self) -> list[str]:
        return sorted({op.resource for op in self.ops.values()})

    def edges(self) -> list[tuple[str, str, str]]:
        """Edges as (src, dst, kind), sorted for deterministic output."""
        return sorted((u, v, d.get("kind", "data")) for u, v, d in self.dag.edges(data=True))

    def topological_order(self) -> list[str]:
        """A deterministic topological order (lexicographic among ready ops)."""
        return list(nx.lexicographical_topological_sort(self.dag))

    def with_edges(self, extra: Iterable[tuple[str, str]], kind: EdgeKind = "control") -> OpGraph:
        """A new graph with `extra` edges added; raises GraphError if it would cycle."""
        return build_graph(self.ops.values(), [*self.edges(), *((u, v, kind) for u, v in extra)])


def build_graph(
    ops: Iterable[Op], edges: Iterable[tuple[str, str, str] | tuple[str, str]]
) -> OpGraph:
    """Validate and assemble an OpGraph: unique names, known endpoints, no cycle."""
    table: dict[str, Op] = {}
    for op in ops:
        if op.name in table:
            raise GraphError(f"duplicate op name {op.name!r}")
        if op.kind not in OP_KINDS:
            raise GraphError(f"op {op.name!r} has unknown kind {op.kind!r}")
        if op.nbytes < 0:
            raise GraphError(f"op {op.name!r} has negative size {op.nbytes}")
        table[op.name] = op
    dag = nx.DiGraph()
    dag.add_nodes_from(table)
    for edge in edges:
        u, v = edge[0], edge[1]
        kind = edge[2] if len(edge) > 2 else "data"
        for end in (u, v):
            if end not in table:
                raise GraphError(f"edge {u!r} -> {v!r} names unknown op {end!r}")
        if u == v:
            raise GraphError(f"op {u!r} depends on itself")
        if dag.has_edge(u, v):
            if kind == "data":
                dag.edges[u, v]["kind"] = "data"
            continue
        dag.add_edge(u, v, kind=kind)
    if not nx.is_directed_acyclic_graph(dag):
        cycle = nx.find_cycle(dag)
        path = " -> ".join([str(cycle[0][0]), *(str(e[1]) for e in cycle)])
        raise GraphError(f"graph has a cycle: {path}")
    return OpGraph(ops=table, dag=dag)
