"""Caramel (all-reduce): the whole plan of one rank.

Stage 1 (`planner.planning.activation`, Caramel §4.1) picks the activation order of
the parameters, Stage 2 (`planner.planning.enforcement`) the control edges that enforce
it. The `caramel` pipeline then batches the parameters (§4.2 Parameter Batcher,
`planner.planning.batching`), packs the groups into the passes (§4.3 Network Transfer
Scheduler, `planner.planning.packing`), orders the transfers as the DAG allows
(`dependency_order`) and picks each group's split depth (§4.4 Adaptive Depth Enforcer,
`planner.planning.depth`). The network model it batches with may come from the trace
itself (`trace_network_model`, checked by `network_problem`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from planner.model.graph import OpGraph
from planner.model.oracle import NetworkModel, TimeOracle, fit_network_model
from planner.model.plan import Plan
from planner.model.trace import concurrent_blocks, dedicated_durations, transfer_part
from planner.planning import batching, packing
from planner.planning.activation import Activation, activation_order, time_map
from planner.planning.depth import depth, depth_table
from planner.planning.enforcement import Enforcement, enforcement_edges
from planner.planning.ticks import TICKS_PER_SECOND

PROPERTIES: tuple[str, ...] = (
    "activation_index",
    "activation_cost",
    "start_boundary_before",
    "start_boundary_after",
    "start_boundary_gain",
    "ready",
    "read",
    "group",
    "depth",
    "start",
    "end",
)
"""The per-transfer properties of a Caramel plan, in the order its document lists them."""


def _phase_time(graph: OpGraph, times: Mapping[str, float], phases: Collection[str]) -> float:
    return float(
        sum(
            times.get(n, 0.0)
            for n, op in graph.ops.items()
            if not op.is_transfer and op.phase in phases
        )
    )


def caramel(
    graph: OpGraph,
    oracle: TimeOracle | Mapping[str, float],
    network: NetworkModel | None = None,
    *,
    rank: str = "",
    params: Sequence[str] | None = None,
    channels: int = 1,
    threshold: int | None = None,
    reads: Mapping[str, float] | None = None,
    baseline: Sequence[str] | None = None,
    batching_on: bool = True,
) -> Plan:
    """The whole Caramel plan for one rank.

    `network` defaults to the oracle's fitted model; `threshold` (bytes) to the
    batching threshold of `network`. `reads[p]`: seconds from the start of the next
    forward pass to the first read of parameter p (default: the mirror estimate of
    `packing.mirror_reads`). Returns a Plan with ``algorithm="caramel"``: `order` = the
    transfers in the order the network starts them, `priority` = group number,
    `control_edges` = Stage 2's edges; `properties` per transfer; `inputs` the
    network model, threshold, groups with placement and depth, and the edge counts.
    `batching_on` False sends every parameter alone (a network model that does not hold).
    """
    times = time_map(oracle)
    if network is None and isinstance(oracle, TimeOracle):
        network = oracle.network
    activation = activation_order(graph, times, params, baseline)
    enforcement = enforcement_edges(graph, activation)
    if threshold is None and network is not None:
        threshold = batching.threshold_bytes(network)
    if not batching_on:  # the network model does not hold: every parameter alone
        threshold = None
    nbytes = {p: graph.ops[p].nbytes for p in activation.order}

    forward = _phase_time(graph, times, ("forward",))
    backward = _phase_time(graph, times, ("backward", "unknown"))
    ready = _backward_ready(activation, forward, backward)
    batches = batching.batch(activation.order, nbytes, ready, network, threshold)
    read_estimate = "given" if reads is not None else "mirror"
    if reads is None:
        reads = packing.mirror_reads(ready, backward, forward)
    groups = _packing_groups(batches, reads, network, times)
    packed = packing.pack(groups, backward, forward, channels)

    by_group = {g.group: g for g in packed.placements}
    sequence, transfer_order, priority = _transfer_schedule(
        graph, activation, batches, by_group, backward
    )
    props: dict[str, dict[str, float]] = {key: {} for key in PROPERTIES}
    group_docs = _group_depths(graph, batches, groups, by_group, sequence, threshold, props)
    _activation_properties(activation, ready, reads, props)
    inputs = {
        "n_ops": len(graph),
        "n_params": len(activation.order),
        "activation_order": list(activation.order),
        "simultaneous": dict(activation.simultaneous),
        "network": _network_dict(network),
        "threshold_bytes": threshold,
        "depth_table": depth_table(threshold),
        "channels": channels,
        "forward_time": forward,
        "backward_time": backward,
        "packing_iteration_time": packed.iteration_time,
        "overhead": packed.overhead,
        "groups": group_docs,
        "edges": _edge_counts(enforcement),
        "read_estimate": read_estimate,
        "time_resolution_s": 1 / TICKS_PER_SECOND,
    }
    return Plan(
        algorithm="caramel",
        rank=rank,
        priority=priority,
        order=tuple(transfer_order),
        control_edges=enforcement.edges,
        properties=props,
        inputs=inputs,
    )


def _backward_ready(activation: Activation, forward: float, backward: float) -> dict[str, float]:
    """Serial compute in the chosen order: forward first, then backward; a parameter's
    ready time in the backward pass is its start boundary after the forward part."""
    return {
        p: min(max(activation.start_boundary_after[p] - forward, 0.0), backward)
        for p in activation.order
    }


def _network_dict(network: NetworkModel | None) -> dict[str, Any] | None:
    if network is None:
        return None
    return {"a": network.a, "b": network.b, "r2": _finite(network.r2), "points": network.points}


def _packing_groups(
    batches: Sequence[batching.Batch],
    reads: Mapping[str, float],
    network: NetworkModel | None,
    times: Mapping[str, float],
) -> list[packing.Group]:
    """§4.2's batches as the groups §4.3 packs: bytes, network time, ready time and the
    first read of any of their parameters in the next forward pass."""
    return [
        packing.Group(
            name=f"group{k}",
            nbytes=b.nbytes,
            duration=network.time(b.nbytes) if network is not None else _group_time(b, times),
            ready=b.ready,
            read=min(reads.get(p, 0.0) for p in b.params),
        )
        for k, b in enumerate(batches)
    ]


def _transfer_schedule(
    graph: OpGraph,
    activation: Activation,
    batches: Sequence[batching.Batch],
    by_group: Mapping[str, packing.Placement],
    backward: float,
) -> tuple[list[int], list[str], dict[str, int]]:
    """§4.3's schedule: the groups in the order their placements start (`sequence`), the
    transfers in that order (within a group, in activation order) made an order the DAG
    allows (`dependency_order`), and each transfer's priority (its group's number; a
    transfer moved after its ancestors takes their priority)."""
    start_key = {k: packing.sort_key(by_group[f"group{k}"], backward) for k in range(len(batches))}
    sequence = sorted(range(len(batches)), key=lambda k: (start_key[k], k))
    transfer_order: list[str] = []
    priority: dict[str, int] = {}
    position = {p: i for i, p in enumerate(activation.order)}
    for number, k in enumerate(sequence):
        for p in sorted(batches[k].params, key=position.__getitem__):
            transfer_order.append(p)
            priority[p] = number
    transfer_order = dependency_order(graph, transfer_order)
    last = -1
    for p in transfer_order:  # a transfer moved after its ancestors takes their priority
        last = priority[p] = max(last, priority[p])
    return sequence, transfer_order, priority


def _group_depths(
    graph: OpGraph,
    batches: Sequence[batching.Batch],
    groups: Sequence[packing.Group],
    by_group: Mapping[str, packing.Placement],
    sequence: Sequence[int],
    threshold: int | None,
    props: dict[str, dict[str, float]],
) -> list[dict[str, Any]]:
    """Each group in schedule order with its §4.4 split depth and its placement; the
    group, depth, start and end of each of its transfers go into `props`."""
    group_docs = []
    for number, k in enumerate(sequence):
        b, place = batches[k], by_group[f"group{k}"]
        d = depth(b.nbytes, threshold)
        group_docs.append(
            {
                "group": number,
                "params": list(b.params),
                "param_names": [graph.ops[p].param or p for p in b.params],
                "nbytes": b.nbytes,
                "depth": d,
                "ready": b.ready,
                "read": groups[k].read,
                "duration": groups[k].duration,
                "pass": place.pass_,
                "start": place.start,
                "end": place.end,
                "overhead": place.overhead,
            }
        )
        for p in b.params:
            props["group"][p] = number
            props["depth"][p] = d
            props["start"][p] = place.start
            props["end"][p] = place.end
    return group_docs


def _activation_properties(
    activation: Activation,
    ready: Mapping[str, float],
    reads: Mapping[str, float],
    props: dict[str, dict[str, float]],
) -> None:
    """Stage 1's figures of each transfer, in activation order, into `props`."""
    for i, p in enumerate(activation.order):
        props["activation_index"][p] = i
        props["activation_cost"][p] = activation.cost[p]
        props["start_boundary_before"][p] = activation.start_boundary_before[p]
        props["start_boundary_after"][p] = activation.start_boundary_after[p]
        props["start_boundary_gain"][p] = (
            activation.start_boundary_before[p] - activation.start_boundary_after[p]
        )
        props["ready"][p] = ready[p]
        props["read"][p] = reads.get(p, 0.0)


def _edge_counts(enforcement: Enforcement) -> dict[str, int]:
    return {
        "added": len(enforcement.edges),
        "candidates": enforcement.candidates,
        "dropped_end_set": enforcement.dropped_end,
        "implied": enforcement.implied,
        "stages_with_edges": enforcement.stages,
    }


def dependency_order(graph: OpGraph, order: Sequence[str]) -> list[str]:
    """`order` (transfers of `graph`) as an order the DAG allows: a transfer that
    depends on another one (a path from it) goes after it, and otherwise the order is
    kept (of the transfers whose transfer ancestors are all placed, the first in
    `order` goes next). Packing places groups by their estimated ready and read times,
    which do not see such paths: on DLRM (HTA ``trace_diff``) the forward pass's
    all-to-alls feed one another through the compute stream (inferred stream syncs),
    and packing put ``all_to_all#4`` before the ``all_to_all#3`` it waits for, an
    order a runtime that launches collectives in plan order would deadlock on."""
    index = {p: k for k, p in enumerate(order)}
    names = graph.names
    n = len(names)
    own = [1 << index[name] if name in index else 0 for name in names]
    above = [0] * n  # per op: the transfers of `order` it depends on, as bits
    indegree = np.bincount(graph.dst, minlength=n).tolist()
    by_src = np.argsort(graph.src, kind="stable")
    bounds = np.searchsorted(graph.src[by_src], np.arange(n + 1)).tolist()
    successors = graph.dst[by_src].tolist()
    ready = deque(i for i in range(n) if indegree[i] == 0)
    while ready:
        u = ready.popleft()
        carried = above[u] | own[u]
        for v in successors[bounds[u] : bounds[u + 1]]:
            above[v] |= carried
            indegree[v] -= 1
            if not indegree[v]:
                ready.append(v)
    position = {name: i for i, name in enumerate(names)}
    needs = [above[position[p]] for p in order]
    if not any(needs):
        return list(order)
    out: list[str] = []
    placed = 0
    left = list(range(len(order)))
    while left:
        k = next(k for k in left if not needs[k] & ~placed)
        left.remove(k)
        out.append(order[k])
        placed |= 1 << k
    return out


def _group_time(b: batching.Batch, times: Mapping[str, float]) -> float:
    """Without a network model: the summed oracle times of the group's transfers."""
    return float(sum(times.get(p, 0.0) for p in b.params))


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


MIN_R2 = 0.9
"""A network fit below this R² does not hold: its batching threshold would be noise."""
MIN_SIZES = 3


def trace_network_model(graph: OpGraph, timings: pd.DataFrame) -> NetworkModel | None:
    """f(d) = a + b*d fitted to the transfers of a job's ranks, one point per size.

    `timings`: rows of `Trace.timings` (``op``, ``duration`` and ``wait`` in ns). Each
    point is the fastest transfer part (duration less the wait for peers) seen for that
    size over the ranks and steps, shared out among the transfers in flight with it on
    the rank (processor sharing, as the time oracle's `dedicated` times: gloo runs two
    all-reduces at once, each at about half the bandwidth): the uncontended transfer, as
    the time oracle takes the minimum of the runs. None with fewer than two distinct
    sizes.

    Where every step's transfers on every rank are in flight back to back, one block
    of several (`link_bound_throughput`), the link was busy throughout and how it split
    among them cannot be told: the fastest block's throughput, no latency, one point.
    Lets Caramel run without a benchmark; check it with `network_problem`.
    """
    sizes = {n: graph.ops[n].nbytes for n in graph.transfers if graph.ops[n].nbytes > 0}
    rows = timings[timings["op"].isin(sizes)]
    start, span = transfer_part(rows)  # a collective's wait for its peers is no network time
    nbytes = rows["op"].map(sizes).to_numpy(dtype=np.float64)
    groups = (
        list(rows.groupby(["rank", "iteration"], sort=False).indices.values())
        if {"rank", "iteration"} <= set(rows.columns)
        else []  # no step to share out within
    )
    throughput = link_bound_throughput(start, span, nbytes, groups)
    if throughput is not None:
        return NetworkModel(a=0.0, b=1.0 / throughput, r2=float("nan"), points=1)
    transfer = span.astype(np.float64)
    for idx in groups:
        transfer[idx] = dedicated_durations(start[idx], span[idx])
    fastest = pd.Series(transfer, index=nbytes).groupby(level=0).min()
    return fit_network_model(
        fastest.index.to_numpy(dtype=np.float64), fastest.to_numpy(dtype=np.float64) / 1e9
    )


def link_bound_throughput(
    start: np.ndarray, span: np.ndarray, nbytes: np.ndarray, groups: Sequence[np.ndarray]
) -> float | None:
    """Bytes/s of the fastest step where every step (`groups`: row indices of a rank's
    step) has all its transfers in one block of overlapping spans and several of them
    (`trace.concurrent_blocks`): a gloo DDP step on a slow link, its first bucket still
    in flight when the last starts. None otherwise.

    Sharing such a block out per transfer tilts the line: on the lab's shaped links the
    equal share gave the last bucket half the link while the first was mostly done, and
    the fit read 14-31% fast with a 13-71 ms intercept at 130-600 Mbit/s; the block's
    bytes over its span read within 8%. Where the blocks are partial, as when the
    all-reduces are CPU work on a loopback, the shares fit a benchmark better."""
    if not groups:
        return None
    rates = []
    for idx in groups:
        moved, busy = concurrent_blocks(start[idx], span[idx], nbytes[idx])
        if len(idx) < 2 or len(busy) != 1 or busy[0] <= 0:
            return None
        rates.append(float(moved[0]) / (float(busy[0]) / 1e9))
    return max(rates)


def network_problem(network: NetworkModel | None) -> str | None:
    """Why a fitted network model cannot be trusted for batching, or None when it holds
    (R² >= `MIN_R2` over at least `MIN_SIZES` sizes, b > 0)."""
    if network is None:
        return "fewer than two transfer sizes: no network model can be fitted"
    if network.points < MIN_SIZES:
        plural = "" if network.points == 1 else "s"
        return f"only {network.points} transfer size{plural} (a fit needs {MIN_SIZES})"
    if not math.isfinite(network.r2) or network.r2 < MIN_R2:
        return f"the fit does not hold (R² {network.r2:.2f} < {MIN_R2})"
    if network.b <= 0:
        return "the fit has no per-byte cost (b = 0)"
    return None
