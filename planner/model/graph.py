"""Ops and the op DAG (OpGraph) that every scheduler, metric and simulation reads.

An `OpGraph` is never mutated by an algorithm: schedulers return priorities or new
edges, so one ingested graph can be planned several ways and compared. Edges are kept
as integer arrays over the op table; the adjacency the planners walk (`pred`, `succ`,
`topological_sort`, in networkx's order) is built on first use, so ingesting many ranks
costs no per-edge Python objects until an algorithm walks one, and no command imports
networkx (0.2 s) to plan; the networkx view (`dag`) is there for the rest.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    import networkx as nx

OpKind = Literal["compute", "recv", "send", "collective"]
Phase = Literal["forward", "backward", "optimizer", "unknown", "input"]
EdgeKind = Literal["data", "control"]

OP_KINDS: tuple[str, ...] = ("compute", "recv", "send", "collective")
TRANSFER_KINDS: frozenset[str] = frozenset({"recv", "send", "collective"})
PHASES: tuple[str, ...] = ("forward", "backward", "optimizer", "unknown", "input")
"""``input``: the step waiting for its batch (the DataLoader's ``__next__``): timed and
replayed as an op of its thread, but no work of the model (no compute, no transfer)."""


class GraphError(ValueError):
    """The ops and edges do not form a valid DAG (unknown op, cycle, bad field)."""


@dataclass(frozen=True, slots=True)
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

    @property
    def is_work(self) -> bool:
        """Compute or transfer of the model: not a wait for the step's input."""
        return self.phase != "input"


def on_gpu(resource: str) -> bool:
    """Whether `resource` is a GPU stream as the Kineto ingest names them (``gpu0/...``):
    the device work of a GPU rank, which its metrics and its replayed steps count."""
    return resource.startswith("gpu")


def device_ops(graph: OpGraph) -> frozenset[str] | None:
    """The ops of a GPU rank's device work (GPU streams and transfers), which its steps
    span and its metrics count; None on a CPU rank."""
    return graph._device_ops


@dataclass(frozen=True, eq=False)
class OpGraph:
    """A DAG of ops. Edge i runs from op ``src[i]`` to op ``dst[i]`` (positions in
    `ops`); ``control[i]`` tells a control edge from a data edge."""

    ops: Mapping[str, Op]
    src: np.ndarray
    dst: np.ndarray
    control: np.ndarray

    def __len__(self) -> int:
        return len(self.ops)

    @cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(self.ops)

    @cached_property
    def dag(self) -> nx.DiGraph:
        """The networkx view (edge attribute ``kind``), built once on first use."""
        import networkx as nx

        dag = nx.DiGraph()
        dag.add_nodes_from(self.ops)
        names = self.names
        dag.add_edges_from(
            (names[u], names[v], {"kind": "control" if c else "data"})
            for u, v, c in zip(
                self.src.tolist(), self.dst.tolist(), self.control.tolist(), strict=True
            )
        )
        return dag

    @property
    def pred(self) -> dict[str, dict[str, None]]:
        """Op -> its predecessors, in the order the networkx view (`dag`) holds them (by
        edge, a repeated edge once), built without networkx (its import is 0.2 s)."""
        return self._adjacency[0]

    @property
    def succ(self) -> dict[str, dict[str, None]]:
        """Op -> its successors, in the order the networkx view (`dag`) holds them."""
        return self._adjacency[1]

    @cached_property
    def _adjacency(self) -> tuple[dict[str, dict[str, None]], dict[str, dict[str, None]]]:
        names = self.names
        pred: dict[str, dict[str, None]] = {name: {} for name in names}
        succ: dict[str, dict[str, None]] = {name: {} for name in names}
        for u, v in zip(self.src.tolist(), self.dst.tolist(), strict=True):
            succ[names[u]][names[v]] = None
            pred[names[v]][names[u]] = None
        return pred, succ

    @property
    def edge_count(self) -> int:
        return len(self.src)

    @property
    def recvs(self) -> list[str]:
        """Names of recv ops (the transfers TicTac orders), in graph order."""
        return [n for n, op in self.ops.items() if op.kind == "recv"]

    @property
    def transfers(self) -> list[str]:
        return list(self._transfers)

    @cached_property
    def _device_ops(self) -> frozenset[str] | None:
        """`device_ops`, found once (speed: a rank's metrics and bound terms both ask)."""
        if not any(on_gpu(op.resource) for op in self.ops.values()):
            return None
        return frozenset(n for n, op in self.ops.items() if op.is_transfer or on_gpu(op.resource))

    @cached_property
    def _transfers(self) -> tuple[str, ...]:
        """(speed) the transfers' names, found once: every stage of a rank asks for them."""
        return tuple(n for n, op in self.ops.items() if op.is_transfer)

    @property
    def resources(self) -> list[str]:
        return sorted({op.resource for op in self.ops.values()})

    def edges(self) -> list[tuple[str, str, str]]:
        """Edges as (src, dst, kind), sorted for deterministic output."""
        names = self.names
        return sorted(
            (names[u], names[v], "control" if c else "data")
            for u, v, c in zip(
                self.src.tolist(), self.dst.tolist(), self.control.tolist(), strict=True
            )
        )

    def topological_order(self) -> list[str]:
        """A deterministic topological order (lexicographic among ready ops)."""
        import networkx as nx

        return list(nx.lexicographical_topological_sort(self.dag))

    def with_edges(self, extra: Iterable[tuple[str, str]], kind: EdgeKind = "control") -> OpGraph:
        """A new graph with `extra` edges added; raises GraphError if it would cycle."""
        return build_graph(self.ops.values(), [*self.edges(), *((u, v, kind) for u, v in extra)])


Edge = tuple[str, str, str] | tuple[str, str]


def build_graph(ops: Iterable[Op], edges: Iterable[Edge]) -> OpGraph:
    """Validate and assemble an OpGraph: unique names, known endpoints, no cycle.

    A repeated edge is kept once, as a data edge if any copy is one.
    """
    table: dict[str, Op] = {}
    for op in ops:
        if op.name in table:
            raise GraphError(f"duplicate op name {op.name!r}")
        if op.kind not in OP_KINDS:
            raise GraphError(f"op {op.name!r} has unknown kind {op.kind!r}")
        if op.nbytes < 0:
            raise GraphError(f"op {op.name!r} has negative size {op.nbytes}")
        table[op.name] = op
    index = {name: i for i, name in enumerate(table)}
    kinds: dict[tuple[int, int], bool] = {}
    for edge in edges:
        u, v = edge[0], edge[1]
        kind = edge[2] if len(edge) > 2 else "data"
        for end in (u, v):
            if end not in index:
                raise GraphError(f"edge {u!r} -> {v!r} names unknown op {end!r}")
        if u == v:
            raise GraphError(f"op {u!r} depends on itself")
        key = (index[u], index[v])
        kinds[key] = kinds.get(key, True) and kind == "control"
    count = len(kinds)
    src = np.fromiter((k[0] for k in kinds), np.int32, count)
    dst = np.fromiter((k[1] for k in kinds), np.int32, count)
    control = np.fromiter(kinds.values(), bool, count)
    graph = OpGraph(ops=table, src=src, dst=dst, control=control)
    _check_acyclic(graph)
    return graph


def is_acyclic(src: np.ndarray, dst: np.ndarray, n: int) -> bool:
    """Kahn's algorithm over edge arrays between nodes 0..n-1: no cycle among them."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    order = np.argsort(src, kind="stable")
    targets = dst[order].tolist()
    start = np.searchsorted(src[order], np.arange(n + 1)).tolist()
    indegree = np.bincount(dst, minlength=n).tolist()
    ready = deque(i for i in range(n) if indegree[i] == 0)
    seen = 0
    while ready:
        u = ready.popleft()
        seen += 1
        for v in targets[start[u] : start[u + 1]]:
            indegree[v] -= 1
            if indegree[v] == 0:
                ready.append(v)
    return seen == n


def topological_sort(graph: OpGraph) -> list[str]:
    """The ops in networkx's `topological_sort` order of the graph's view (`dag`), without
    networkx: Kahn's generations, the roots in op order, then each generation in the
    order its ops became ready (the order the planners' ties follow)."""
    pred, succ = graph.pred, graph.succ
    waiting = {v: len(p) for v, p in pred.items() if p}
    generation = [v for v, p in pred.items() if not p]
    order: list[str] = []
    while generation:
        order += generation
        following = []
        for node in generation:
            for child in succ[node]:
                waiting[child] -= 1
                if waiting[child] == 0:
                    following.append(child)
                    del waiting[child]
        generation = following
    if waiting:
        _check_acyclic(graph)
    return order


def _check_acyclic(graph: OpGraph) -> None:
    """GraphError naming a cycle if the graph has one (networkx only to name it)."""
    if is_acyclic(graph.src, graph.dst, len(graph.ops)):
        return
    import networkx as nx

    cycle = nx.find_cycle(graph.dag)
    path = " -> ".join([str(cycle[0][0]), *(str(e[1]) for e in cycle)])
    raise GraphError(f"graph has a cycle: {path}")
