"""Plan: what a scheduler hands to simulation, metrics and export."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Plan:
    """The output of a scheduler for one rank (one worker partition).

    `priority`: op -> priority number, lower runs first, ties allowed, a missing op
    is unordered (TicTac §3.1). `order`: the total order of the planned transfers that
    a sender counter enforces; a transfer's `order_index` is its position, i.e. the
    number of transfers that complete before it, in [0, n) (TicTac §5.1).
    `properties`: per-op figures the algorithm decided on (e.g. ``M_plus``, ``P``, ``M``),
    kept so a reader can check a decision against the paper.
    """

    algorithm: str
    rank: str
    priority: Mapping[str, int]
    order: tuple[str, ...]
    control_edges: tuple[tuple[str, str], ...] = ()
    properties: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    inputs: Mapping[str, Any] = field(default_factory=dict)

    def order_index(self) -> dict[str, int]:
        """Transfer -> number of transfers handed over before it."""
        return {name: i for i, name in enumerate(self.order)}


def read_of(transfer: str) -> str:
    """The PS-side read a TF transfer comes from: ``recv:^x`` (a control message beside
    the data, e.g. a ``ShapeN`` grappler folded) and ``recv:x`` both leave with read x,
    and the TF module orders the read (`planner.export.tf_graph`). Any other transfer
    (a bucket, a collective) is its own."""
    return transfer.removeprefix("recv:").lstrip("^")


def dense_priorities(keys: Mapping[str, Any]) -> dict[str, int]:
    """Map sortable keys to dense priority numbers 0..k (equal keys share a number)."""
    distinct = sorted(set(keys.values()))
    rank = {k: i for i, k in enumerate(distinct)}
    return {name: rank[k] for name, k in keys.items()}


def from_priorities(document: Mapping[str, Any]) -> dict[str, Plan]:
    """Rank -> Plan of a priorities document (``planner schedule --json``,
    ``priorities_*.json``): a plan as written, taken back to replay it."""
    plans = {}
    for entry in document["ranks"]:
        transfers = sorted(entry["transfers"], key=lambda t: t["order_index"])
        plans[entry["rank"]] = Plan(
            algorithm=entry["algorithm"],
            rank=entry["rank"],
            priority={t["name"]: t["priority"] for t in transfers},
            order=tuple(t["name"] for t in transfers),
            control_edges=tuple(tuple(e) for e in entry.get("control_edges") or ()),
        )
    return plans
