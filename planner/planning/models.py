"""Analytic what-if models: PS / P2P / ring all-reduce, and Omnivore's compute groups.

Calibrated from a trace (`calibrate`), then evaluated over worker counts (`sweep`) to
answer "parameter servers or all-reduce, how many workers, how many PS, sync or
async groups?" before a job is re-architected.

Sources (see docs/models.md for each formula, its interpretation and its limits):

- the PS / P2P / ring performance model, Section III: Equations 7-21;
- Omnivore, Sections IV-V (and Appendix D-E): the hardware-efficiency model
  ``HE(g) = max{t_fc, (t_conv(k) + t_fc) / g}``, implicit momentum ``1 - 1/g`` and the
  optimizer's starting point, the smallest g that saturates the FC phase.

Per iteration, every architecture is ``T = T_processing + T_update + T_network -
alpha * min(T_processing, T_network)``; ``alpha = 0`` is the formulas as printed (no
overlap), the trace's measured alpha (Caramel §3.1) is the default. Times are
seconds, sizes bytes; `model_document` returns the ``planner.model/1`` JSON.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from planner.errors import InputError
from planner.ingest.files import read_bytes
from planner.measure import allreduce
from planner.measure.metrics import caramel_figures, collectives_alone
from planner.model.graph import OpGraph
from planner.model.oracle import NetworkModel, fit_network_model
from planner.model.records import partial_steps
from planner.model.trace import Job, busy_time, with_dedicated
from planner.planning.caramel import network_problem

SCHEMA = "planner.model/1"
ARCHITECTURES: tuple[str, ...] = ("ps", "p2p", "ring")
#: Tie-break between equal iteration times: fewer machines, then the bandwidth-optimal one.
PREFERENCE: tuple[str, ...] = ("ring", "p2p", "ps")
TIE_TOLERANCE = 1e-9
#: The model must predict the traced configuration within this fraction to recommend.
CALIBRATION_TOLERANCE = 0.10

_UPDATE_TYPES = re.compile(r"apply|optimizer|\.step\b|adam|sgd", re.IGNORECASE)
_CONV_TYPES = re.compile(r"conv", re.IGNORECASE)
_ALLREDUCE = re.compile(r"all_?reduce", re.IGNORECASE)
_FC_TYPES = re.compile(r"matmul|gemm|addmm|linear|\bmm\b|bmm", re.IGNORECASE)


# --------------------------------------------------------------------------------------
# Calibration


@dataclass(frozen=True)
class Calibration:
    """The model inputs measured from one trace (or given).

    `processing_time`: T(processing) of Eq. 7, one worker's forward + loss + backward
    per iteration (union of its compute intervals, median over ranks and steps).
    `update_time`: the "PS time" / "update time" of Eqs. 11, 15, 19 per iteration.
    `model_bytes`: W; `param_bytes`: W per parameter (or per bucket for all-reduce).
    `network`: f(d) = a + b*d; the bandwidth is 1/b bytes/s, the latency a seconds.
    `alpha`: the measured compute/communication overlap (None: no transfers traced).
    `conv_fraction`: share of the layer compute in convolutions (Omnivore's conv phase;
    None when no conv/FC op types are recognised); `conv_bytes`: the conv model size.
    Calibration on the traced configuration (`calibrate`): `network_time` is the measured
    N (union of the transfer intervals, median over steps), `network_scale` the measured
    N over the formula's network time at the traced configuration (gRPC's concurrent
    transfers, PS-side waits, protocol cost: what f(d) per link misses), applied to every
    configuration; `overhead_time` is the median time per step in which no traced op
    runs (framework, Python, input pipeline), added to every configuration.
    """

    processing_time: float
    update_time: float
    model_bytes: int
    param_bytes: Mapping[str, int]
    network: NetworkModel
    network_source: str
    alpha: float | None
    workers: int
    ps: int
    measured_iteration_time: float | None
    batch_size: int | None = None
    conv_fraction: float | None = None
    conv_bytes: int = 0
    notes: tuple[str, ...] = ()
    network_time: float | None = None
    overhead_time: float = 0.0
    network_scale: float = 1.0

    @property
    def bandwidth(self) -> float:
        """Bytes per second of one link (TotalBandwidth / Bandwidth in the paper)."""
        return 1.0 / self.network.b if self.network.b > 0 else math.inf

    @property
    def latency(self) -> float:
        return self.network.a


TRACE_FIT = "fitted to the trace's transfers"
TRACE_MEAN = "mean throughput of the trace's transfers (sizes too alike to fit)"
"""`Calibration.network_source` of a network model taken from the trace itself."""


def _is_gpu(resource: str) -> bool:
    return resource.startswith(("gpu", "cuda")) or "GPU" in resource


def _compute_ops(graph: OpGraph) -> tuple[set[str], set[str]]:
    """(layer compute ops, update ops); on a rank with GPU ops only those count."""
    compute = {n: o for n, o in graph.ops.items() if o.kind == "compute" and o.is_work}
    if any(_is_gpu(o.resource) for o in compute.values()):
        compute = {n: o for n, o in compute.items() if _is_gpu(o.resource)}
    update = {
        n for n, o in compute.items() if o.phase == "optimizer" or _UPDATE_TYPES.search(o.type)
    }
    return set(compute) - update, update


def _param_bytes(graph: OpGraph) -> dict[str, int]:
    """Bytes per parameter: its largest pull (recv) or, for all-reduce, its collective."""
    sizes: dict[str, int] = {}
    kinds = ("recv",) if graph.recvs else ("collective",)
    ops = [o for o in graph.ops.values() if o.kind in kinds and o.nbytes > 0]
    reduces = [o for o in ops if _ALLREDUCE.search(o.name)]
    for op in reduces or ops:
        key = op.param or op.name
        sizes[key] = max(sizes.get(key, 0), op.nbytes)
    return sizes


def _layer_kind(text: str) -> str | None:
    if _CONV_TYPES.search(text):
        return "conv"
    if _FC_TYPES.search(text):
        return "fc"
    return None


def _param_layer(graph: OpGraph, param: str, depth: int = 3) -> str | None:
    """conv or fc: the first layer op a parameter's pull feeds (within `depth` hops)."""
    starts = [n for n, o in graph.ops.items() if o.kind == "recv" and o.param == param]
    frontier, seen = list(starts), set(starts)
    for _ in range(depth):
        nxt = []
        for name in frontier:
            for succ in graph.dag.successors(name):
                kind = _layer_kind(graph.ops[succ].type)
                if kind is not None:
                    return kind
                if succ not in seen:
                    seen.add(succ)
                    nxt.append(succ)
        frontier = nxt
    return _layer_kind(param)


def measured_alpha(job: Job) -> float | None:
    """Median over ranks and steps of Caramel's overlap alpha between compute and transfers.

    C and N are the unions of the compute and of the transfer intervals, T their union
    (idle time removed, as `planner.measure.metrics.OverlapMetrics` does). None without transfers.
    """
    if any(o.kind == "collective" for g in job.graphs.values() for o in g.ops.values()):
        steps = [s.alpha for rank in job.ranks for s in allreduce.rank_steps(job, rank)]
        finite = [a for a in steps if math.isfinite(a)]
        return float(statistics.median(finite)) if finite else None
    values = []
    for rank in job.ranks:
        graph = job.graphs[rank]
        layer, update = _compute_ops(graph)
        compute = layer | update
        rows = job.trace.of(rank)
        is_net = rows["op"].isin(graph.transfers).to_numpy()
        is_cpu = rows["op"].isin(compute).to_numpy()
        for _, idx in rows.groupby("iteration").indices.items():
            starts = rows["start"].to_numpy()[idx]
            durations = rows["duration"].to_numpy()[idx]
            net, cpu = is_net[idx].astype(bool), is_cpu[idx].astype(bool)
            n = busy_time(starts[net], durations[net]) / 1e9
            if n <= 0:
                continue
            c = busy_time(starts[cpu], durations[cpu]) / 1e9
            both = net | cpu
            t = busy_time(starts[both], durations[both]) / 1e9
            values.append(caramel_figures(c, n, t)[1])
    return float(statistics.median(values)) if values else None


def _network_from_transfers(job: Job) -> NetworkModel | None:
    """f(d) fitted to every rank's transfers at their min-of-runs dedicated time.

    When the sizes are too alike for a slope (e.g. equal DDP buckets), falls back to
    f(d) = d * (total seconds / total bytes): the mean throughput, no latency. The
    collectives of a one-rank job (``distributedInfo.world_size`` 1) are left out: NCCL
    returns at once, and HTA's ns trace read 35 TB/s from its 8-32 MB all-reduces.
    """
    frame = with_dedicated(job.trace, job.graphs)
    alone = world_size(job) == 1  # a collective among one rank moves nothing
    sizes, seconds = [], []
    for rank, graph in job.graphs.items():
        rows = frame[frame["rank"] == rank]
        minimum = rows.groupby("op")["dedicated"].min() / 1e9
        for name, t in minimum.items():
            op = graph.ops.get(str(name))
            if op is None or (alone and op.kind == "collective"):
                continue
            if op.is_transfer and op.nbytes > 0:
                sizes.append(op.nbytes)
                seconds.append(float(t))
    fitted = fit_network_model(np.array(sizes), np.array(seconds))
    if (fitted is None or fitted.b <= 0) and sum(sizes) > 0 and sum(seconds) > 0:
        return NetworkModel(a=0.0, b=sum(seconds) / sum(sizes), points=len(sizes))
    return fitted


def calibrate(
    job: Job,
    *,
    network: NetworkModel | None = None,
    bandwidth: float | None = None,
    update_time: float | None = None,
    batch_size: int | None = None,
) -> Calibration:
    """Measure the model inputs from a traced job.

    `network` (e.g. from a microbenchmark) replaces the fit to the trace's transfers;
    `bandwidth` (bytes/s) replaces its slope (1/b) and keeps its latency. `update_time`
    replaces the measured update ops (a PS trace has none: the update runs on the PS).
    `batch_size` (per worker) turns throughput into samples/s; it defaults to the
    trace metadata's ``per_worker_input_shape[0]`` or ``batch_size`` when present.
    """
    source = job.sources[0] if job.sources else None
    if not len(job.trace.timings):
        raise InputError(source, "the models need timings; input has none")
    notes: list[str] = []
    processing: list[float] = []
    updates: list[float] = []
    net: list[float] = []
    idle: list[float] = []
    walls: list[float] = []
    ps_names: set[str] = set()
    conv_time = fc_time = 0.0
    for rank in job.ranks:
        graph = job.graphs[rank]
        layer, update = _compute_ops(graph)
        for op in graph.ops.values():
            if op.is_transfer:
                ps_names.update(re.findall(r"ps\d+", op.resource))
        rows = job.trace.of(rank)
        partial = partial_steps(rows, graph.ops)  # left out of the fits
        if partial and rows["iteration"].nunique() > len(partial):
            rows = rows[~rows["iteration"].isin(list(partial))]
        in_layer = rows["op"].isin(layer).to_numpy()
        in_update = rows["op"].isin(update).to_numpy()
        in_net = rows["op"].isin(graph.transfers).to_numpy()
        span_of = _spans(job, rank)
        for step, idx in rows.groupby("iteration").indices.items():
            starts = rows["start"].to_numpy()[idx]
            durations = rows["duration"].to_numpy()[idx]
            processing.append(busy_time(starts[in_layer[idx]], durations[in_layer[idx]]) / 1e9)
            updates.append(busy_time(starts[in_update[idx]], durations[in_update[idx]]) / 1e9)
            if in_net[idx].any():
                net.append(busy_time(starts[in_net[idx]], durations[in_net[idx]]) / 1e9)
            # the time the model accounts for: its processing, update and network ops
            # (on a GPU rank the device's); the rest of the step (the device waiting for
            # the CPU's launches, Python, the input pipeline) is its overhead
            modelled = (in_layer | in_update | in_net)[idx]
            busy = busy_time(starts[modelled], durations[modelled]) / 1e9
            # the step as the profiler marked it (ProfilerStep#N, on a GPU rank the
            # device's): with the CPU a step or two ahead, the step's own records run
            # well past it, and the iteration is still the span; only a trace without
            # spans (TF) is timed from its first to its last record
            first, last = int(starts.min()), int((starts + durations).max())
            begin, end = span_of.get(int(step), (first, last))
            wall = (end - begin) / 1e9
            idle.append(max(0.0, wall - busy))
            walls.append(wall)
        layer_of = {n: _layer_kind(o.type) for n, o in graph.ops.items() if o.kind == "compute"}
        kinds = rows["op"].map(layer_of)
        conv_time += float(rows.loc[kinds == "conv", "duration"].sum()) / 1e9
        fc_time += float(rows.loc[kinds == "fc", "duration"].sum()) / 1e9

    params: dict[str, int] = {}
    for graph in job.graphs.values():
        for key, size in _param_bytes(graph).items():
            params[key] = max(params.get(key, 0), size)
    if not params:
        notes.append("no transfers with sizes in the trace: W = 0 (give the model size)")

    network_source = "given"
    if network is None:
        network = _network_from_transfers(job)
        network_source = TRACE_FIT
        if network is not None and math.isnan(network.r2):
            network_source = TRACE_MEAN
        peers = world_size(job) - len(job.ranks)
        if network is not None and peers > 0 and _collectives(job):
            notes.append(
                f"{peers} of the job's ranks untraced: each collective's span holds its wait "
                "for them, so the fitted bandwidth is a lower bound (give --network or "
                "--bandwidth for the link's)"
            )
    if bandwidth is not None:
        if bandwidth <= 0:
            raise InputError(None, f"bandwidth must be positive, got {bandwidth}")
        base = network if network is not None else NetworkModel(a=0.0, b=0.0)
        network = NetworkModel(a=base.a, b=1.0 / bandwidth, r2=base.r2, points=base.points)
        network_source = "bandwidth given" + (
            f", latency {network_source}" if base.points else ", no latency"
        )
    if network is None or network.b <= 0:
        if workers_alone(job):
            raise InputError(
                source,
                "cannot fit a bandwidth: the trace's collectives ran among 1 rank "
                "(distributedInfo.world_size), so no byte crossed a network; "
                "give --bandwidth or --network",
            )
        raise InputError(
            source, "cannot fit a bandwidth from the trace's transfers; give --bandwidth"
        )

    measured_update = float(statistics.median(updates)) if updates else 0.0
    if update_time is None:
        update_time = measured_update
        if measured_update == 0.0:
            notes.append("no update ops on the traced ranks (a PS applies them): update time 0")
    workers = world_size(job)
    if workers > len(job.ranks):
        notes.append(
            f"{len(job.ranks)} of the job's {workers} ranks traced (distributedInfo."
            f"world_size): the traced configuration is priced at {workers} workers"
        )
    meta = _metadata(job)
    if batch_size is None:
        batch_size = _meta_batch_size(meta)

    conv_fraction = conv_time / (conv_time + fc_time) if conv_time + fc_time > 0 else None
    conv_bytes = 0
    for key, size in params.items():
        graph_kind = next(
            (k for g in job.graphs.values() if (k := _param_layer(g, key)) is not None), None
        )
        if graph_kind == "conv":
            conv_bytes += size
    if not any(g.recvs for g in job.graphs.values()):
        conv_bytes = _meta_conv_bytes(meta) or conv_bytes
    cal = Calibration(
        processing_time=float(statistics.median(processing)) if processing else 0.0,
        update_time=float(update_time),
        model_bytes=int(sum(params.values())),
        param_bytes=dict(sorted(params.items())),
        network=network,
        network_source=network_source,
        alpha=measured_alpha(job),
        workers=workers,
        ps=len(ps_names),
        measured_iteration_time=float(statistics.median(walls)) if walls else None,
        batch_size=batch_size,
        conv_fraction=conv_fraction,
        conv_bytes=conv_bytes,
        notes=tuple(notes),
        network_time=float(statistics.median(net)) if net else None,
        overhead_time=float(statistics.median(idle)) if idle else 0.0,
    )
    return on_traced_configuration(cal)


def network_warning(cal: Calibration) -> str | None:
    """Why the curves over worker counts rest on a network model that does not hold, or
    None: the calibration fixes the traced configuration, but every other worker count
    is priced by f(d) = a + b*d, here fitted to the trace's transfers (a transfer's span
    also holds its waits for peers and the PS). Given a model (``--network``,
    ``--bandwidth``), None."""
    if cal.network_source not in (TRACE_FIT, TRACE_MEAN):
        return None
    problem = network_problem(cal.network)
    if problem is None:
        return None
    return (
        f"the network model behind every other worker count is the trace's fit, and {problem}: "
        "the curves' shape over worker counts is uncertain; give a measured model "
        "(--network from planner bench-network, or --bandwidth)"
    )


def _collectives(job: Job) -> bool:
    return any(op.kind == "collective" for g in job.graphs.values() for op in g.ops.values())


def workers_alone(job: Job) -> bool:
    """A one-rank job whose only transfers are collectives: no network to fit."""
    return world_size(job) == 1 and all(collectives_alone(job, rank) for rank in job.ranks)


def gradient_exchange(job: Job) -> bool:
    """Whether the traced transfers can be a data-parallel gradient exchange: PS
    transfers, or collectives beside a backward pass or an optimizer step (their phases,
    or, where the trace marks none, autograd's ops: ``autograd::engine``, ``*Backward0``). vLLM's
    tensor-parallel all-reduces (B200 trace) are an inference step's activations."""
    named = [(name, op) for graph in job.graphs.values() for name, op in graph.ops.items()]
    if any(op.kind in ("send", "recv") for _, op in named):
        return True
    if not any(op.kind == "collective" for _, op in named):
        return True  # nothing to judge: the network comes from --bandwidth / --network
    return any(
        op.phase in ("backward", "optimizer") or "autograd::engine" in name or "Backward" in name
        for name, op in named
    )


def world_size(job: Job) -> int:
    """The workers of the traced job: its ranks, or, where the trace says the job was
    larger (Kineto's ``distributedInfo.world_size``: often only rank 0 is published),
    that size. The model prices the traced configuration at the job's size, not at the
    number of files it was given."""
    ranks = job.meta.get("ranks") if isinstance(job.meta, Mapping) else None
    sizes = [
        int(info["world_size"])
        for info in (ranks.values() if isinstance(ranks, Mapping) else ())
        if isinstance(info, Mapping)
        and isinstance(info.get("world_size"), int)
        and not isinstance(info.get("world_size"), bool)
    ]
    return max([len(job.ranks), *sizes])


def _spans(job: Job, rank: str) -> dict[int, tuple[int, int]]:
    spans = job.trace.spans
    mine = spans[spans["rank"] == rank]
    return {
        int(i): (int(a), int(b))
        for i, a, b in zip(mine["iteration"], mine["start"], mine["end"], strict=True)
    }


def traced_network(cal: Calibration) -> float:
    """The formulas' network time per iteration at the traced configuration (PS with the
    traced number of servers, else ring), before any calibration scale."""
    if cal.ps > 0:
        available = ps_available_bandwidth(cal.bandwidth, cal.workers, cal.ps)
        return ps_pull(cal.model_bytes, available, cal.latency) + ps_push(
            cal.model_bytes, cal.workers, available, cal.latency
        )
    return ring_network(cal.model_bytes, cal.workers, cal.bandwidth, cal.latency)


def on_traced_configuration(cal: Calibration) -> Calibration:
    """`cal` with `network_scale` = measured N / the formulas' network time at the traced
    configuration (1 when either is unknown), so the model starts from the job it saw."""
    if not cal.network_time or cal.model_bytes <= 0 or not math.isfinite(cal.bandwidth):
        return cal
    formula = traced_network(cal)
    if formula <= 0:
        return cal
    return replace(cal, network_scale=cal.network_time / formula)


def _metadata(job: Job) -> dict[str, object]:
    """The job's metadata merged over the first ``meta*.json`` beside each input."""
    merged: dict[str, object] = {}
    for source in job.sources:
        path = Path(source)
        folder = path if path.is_dir() else path.parent
        for candidate in sorted(folder.glob("meta*.json"))[:1]:
            try:  # within the input limits: a FIFO or a bomb named meta.json is skipped
                loaded = json.loads(read_bytes(candidate))
            except (InputError, ValueError, RecursionError):
                continue
            if isinstance(loaded, dict):
                merged = {**loaded, **merged}
    return {**merged, **dict(job.meta)}


def _meta_batch_size(meta: Mapping[str, object]) -> int | None:
    """Per-worker batch: TF ``per_worker_input_shape[0]``, torch ``input_shape[0]``."""
    for key in ("per_worker_input_shape", "input_shape"):
        shape = meta.get(key)
        if isinstance(shape, list) and shape and isinstance(shape[0], int):
            return int(shape[0])
    value = meta.get("batch_size")
    return int(value) if isinstance(value, int) else None


def _meta_conv_bytes(meta: Mapping[str, object]) -> int | None:
    """Bytes of the conv parameters (4-D shapes), if any are listed.

    From the parameters the ingest found in the trace (`Job.meta["parameters"]`, per
    rank), or from a torch metadata file's parameter table.
    """
    params = meta.get("parameters")
    if isinstance(params, dict):  # per rank, from the ingest: all ranks hold the model
        params = next((v for _, v in sorted(params.items()) if isinstance(v, list)), None)
    if not isinstance(params, list) or not params:
        return None
    total = 0
    for p in params:
        if isinstance(p, dict) and len(p.get("shape") or ()) == 4:
            size = p.get("nbytes") or p.get("bytes") or 4 * int(p.get("numel") or 0)
            total += int(size)
    return total


# --------------------------------------------------------------------------------------
# Section III: PS, P2P and ring all-reduce


def ps_available_bandwidth(total_bandwidth: float, workers: int, ps: int) -> float:
    """Eq. 8: availableB = (TotalBandwidth / w) * ps, bandwidth between a worker and the PS."""
    return total_bandwidth / workers * ps


def ps_pull(model_bytes: float, available: float, latency: float = 0.0) -> float:
    """Eq. 9 per iteration: pull the whole model W at availableB (+ one latency a)."""
    return latency + model_bytes / available


def ps_push(model_bytes: float, workers: int, available: float, latency: float = 0.0) -> float:
    """Eq. 10 per iteration, as printed: push W/w of gradients at availableB (+ a)."""
    return latency + (model_bytes / workers) / available


def p2p_available_bandwidth(total_bandwidth: float, workers: int) -> float:
    """Eq. 16: availableB = TotalBandwidth / (2 (w - 1)), bandwidth from a peer to each peer."""
    return total_bandwidth / (2 * (workers - 1))


def p2p_network(
    model_bytes: float, workers: int, total_bandwidth: float, latency: float = 0.0
) -> float:
    """Eq. 17 per iteration: messages of W/w at availableB, all 2(w-1) at once (+ one a)."""
    if workers <= 1:
        return 0.0
    return latency + (model_bytes / workers) / p2p_available_bandwidth(total_bandwidth, workers)


def ring_network(model_bytes: float, workers: int, bandwidth: float, latency: float = 0.0) -> float:
    """Eq. 20: 2(w-1) steps of W/w over the link bandwidth (+ a latency a per step)."""
    if workers <= 1:
        return 0.0
    return 2 * (workers - 1) * (latency + (model_bytes / workers) / bandwidth)


def iteration_time(processing: float, update: float, network: float, alpha: float) -> float:
    """T(cpu) + T(tcp) per iteration less the overlapped part alpha * min(T_proc, T_net).

    With alpha = 0 this is Eqs. 13, 18, 21 per iteration. The update runs after the
    exchange, so only the processing (backward pass) overlaps the network.
    """
    return processing + update + network - alpha * min(processing, network)


def iterations_per_epoch(dataset_size: int, batch_size: int, workers: int) -> float:
    """The (n / b) / w factor of Eqs. 9-11, 15, 17, 19: iterations of one epoch per worker."""
    return dataset_size / batch_size / workers


def ideal_throughput(single_iteration: float, workers: int, batch_size: int = 1) -> float:
    """Eq. 14 read as w x the single-worker rate: w * b / T_single (samples/s)."""
    return workers * batch_size / single_iteration


@dataclass(frozen=True)
class Point:
    """One architecture at one worker count; times in seconds per iteration."""

    workers: int
    processing: float
    update: float
    network: float
    iteration_time: float
    throughput: float
    ideal_throughput: float
    epoch_time: float | None
    pull: float | None = None
    push: float | None = None

    @property
    def scaling_efficiency(self) -> float:
        return self.throughput / self.ideal_throughput if self.ideal_throughput > 0 else 0.0


@dataclass(frozen=True)
class Curve:
    """One architecture (with its PS count) over the worker counts."""

    label: str
    arch: str
    ps: int | None
    points: tuple[Point, ...]

    def at(self, workers: int) -> Point | None:
        return next((p for p in self.points if p.workers == workers), None)


@dataclass(frozen=True)
class Settings:
    """What the sweep assumed; stated in the output beside the curves."""

    alpha: float
    alpha_source: str
    bandwidth: float
    latency: float
    batch_size: int | None
    dataset_size: int | None


def point(
    arch: str,
    workers: int,
    cal: Calibration,
    settings: Settings,
    ps: int | None = None,
) -> Point:
    """Evaluate one architecture at `workers` with the calibration and the settings."""
    W, B, a = cal.model_bytes, settings.bandwidth, settings.latency
    pull = push = None
    if arch == "ps":
        if ps is None or ps < 1:
            raise InputError(None, "the PS model needs at least one parameter server")
        available = ps_available_bandwidth(B, workers, ps)
        pull, push = ps_pull(W, available, a), ps_push(W, workers, available, a)
        network = pull + push
    elif arch == "p2p":
        network = p2p_network(W, workers, B, a)
    elif arch == "ring":
        network = ring_network(W, workers, B, a)
    else:
        raise InputError(None, f"unknown architecture {arch!r} (choose from {ARCHITECTURES})")
    network *= cal.network_scale
    if pull is not None and push is not None:
        pull, push = pull * cal.network_scale, push * cal.network_scale
    t = iteration_time(cal.processing_time, cal.update_time, network, settings.alpha)
    t += cal.overhead_time
    b = settings.batch_size or 1
    single = cal.processing_time + cal.update_time
    epoch = None
    if settings.dataset_size and settings.batch_size:
        epoch = iterations_per_epoch(settings.dataset_size, settings.batch_size, workers) * t
    return Point(
        workers=workers,
        processing=cal.processing_time,
        update=cal.update_time,
        network=network,
        iteration_time=t,
        throughput=workers * b / t if t > 0 else math.inf,
        ideal_throughput=ideal_throughput(single, workers, b) if single > 0 else math.inf,
        epoch_time=epoch,
        pull=pull,
        push=push,
    )


def sweep(
    cal: Calibration,
    workers: Sequence[int],
    *,
    architectures: Sequence[str] = ARCHITECTURES,
    ps_counts: Sequence[int] = (1,),
    settings: Settings,
) -> list[Curve]:
    """Curves of every architecture (one per PS count for PS) over `workers`.

    PS points with fewer workers than servers are left out (Eq. 8 assumes w >= ps).
    """
    curves = []
    for arch in architectures:
        if arch == "ps":
            for k in ps_counts:
                pts = tuple(point("ps", w, cal, settings, ps=k) for w in workers if w >= k)
                curves.append(Curve(f"{k}ps", "ps", k, pts))
        else:
            pts = tuple(point(arch, w, cal, settings) for w in workers)
            curves.append(Curve(arch, arch, None, pts))
    return curves


def _rank_key(curve: Curve, p: Point) -> tuple[float, int, int]:
    order = PREFERENCE.index(curve.arch) if curve.arch in PREFERENCE else len(PREFERENCE)
    return (p.iteration_time, order, curve.ps or 0)


def best_at(curves: Sequence[Curve], workers: int) -> Curve | None:
    """The fastest curve at `workers`; near-ties (relative 1e-9) go by PREFERENCE, fewer PS."""
    present = [(c, p) for c in curves if (p := c.at(workers)) is not None]
    if not present:
        return None
    fastest = min(p.iteration_time for _, p in present)
    tied = [
        (c, p)
        for c, p in present
        if p.iteration_time <= fastest * (1 + TIE_TOLERANCE) + TIE_TOLERANCE
    ]
    return min(tied, key=lambda cp: _rank_key(cp[0], cp[1])[1:])[0]


@dataclass(frozen=True)
class Crossover:
    """Between `from_workers` and `to_workers`, `after` becomes faster than `before`."""

    first: str
    second: str
    from_workers: int
    to_workers: int
    before: str
    after: str


def _sign(x: float, y: float) -> int:
    if abs(x - y) <= TIE_TOLERANCE * max(abs(x), abs(y), 1.0):
        return 0
    return -1 if x < y else 1


def crossovers(curves: Sequence[Curve]) -> list[Crossover]:
    """Worker counts where the faster of two curves changes (ties are no change)."""
    found = []
    for i, c1 in enumerate(curves):
        for c2 in curves[i + 1 :]:
            common = sorted({p.workers for p in c1.points} & {p.workers for p in c2.points})
            last_sign, last_w = 0, None
            for w in common:
                p1, p2 = c1.at(w), c2.at(w)
                assert p1 is not None and p2 is not None
                s = _sign(p1.iteration_time, p2.iteration_time)
                if s == 0:
                    continue
                if last_sign != 0 and s != last_sign and last_w is not None:
                    before, after = (c1, c2) if last_sign < 0 else (c2, c1)
                    found.append(
                        Crossover(c1.label, c2.label, last_w, w, before.label, after.label)
                    )
                last_sign, last_w = s, w
    return found


@dataclass(frozen=True)
class Recommendation:
    """The configuration with the highest throughput, and the fastest curve per worker count."""

    label: str
    arch: str
    ps: int | None
    workers: int
    iteration_time: float
    throughput: float
    scaling_efficiency: float
    reason: str
    best_per_workers: tuple[tuple[int, str], ...]


def recommend(curves: Sequence[Curve], workers: Sequence[int]) -> Recommendation | None:
    """Highest modelled throughput over all curves and worker counts.

    Throughput grows with w until communication dominates, so this picks where the
    curves peak within the range; equal throughput goes to fewer workers, then by
    PREFERENCE and fewer PS (fewer machines for the same rate).
    """
    best_per = tuple((w, c.label) for w in workers if (c := best_at(curves, w)) is not None)
    candidates = [(c, p) for c in curves for p in c.points]
    if not candidates:
        return None
    top = max(p.throughput for _, p in candidates)
    tied = [(c, p) for c, p in candidates if p.throughput >= top * (1 - TIE_TOLERANCE)]
    curve, p = min(tied, key=lambda cp: (cp[1].workers, *_rank_key(cp[0], cp[1])[1:]))
    peak_at_edge = p.workers == max(workers)
    reason = (
        f"highest modelled throughput; {curve.label} is {'still' if peak_at_edge else 'no longer'}"
        f" scaling at {max(workers)} workers"
        + ("" if peak_at_edge else f" (its throughput peaks at {p.workers})")
    )
    return Recommendation(
        label=curve.label,
        arch=curve.arch,
        ps=curve.ps,
        workers=p.workers,
        iteration_time=p.iteration_time,
        throughput=p.throughput,
        scaling_efficiency=p.scaling_efficiency,
        reason=reason,
        best_per_workers=best_per,
    )


# --------------------------------------------------------------------------------------
# Omnivore §IV-B, §IV-C, §V-B: compute groups, hardware efficiency, momentum


def t_conv(
    k: int, t_conv_compute1: float, t_conv_network1: float, overlapped: bool = True
) -> float:
    """t_conv(k) from Tc,c = t_conv,compute(1) and Tn,c = t_conv,network(1) (Appendix D).

    Compute speeds up linearly (Tc,c / k), the conv model's network time slows down
    linearly (Tn,c * k); overlapped (the paper's choice) takes their max, else the sum.
    """
    compute, network = t_conv_compute1 / k, t_conv_network1 * k
    return max(compute, network) if overlapped else compute + network


def hardware_efficiency(g: int, t_conv_k: float, t_fc: float) -> float:
    """HE(g) = max{t_fc, (t_conv(k) + t_fc) / g}: predicted time per iteration (§IV-B)."""
    return max(t_fc, (t_conv_k + t_fc) / g)


def fc_saturated(g: int, t_conv_k: float, t_fc: float) -> bool:
    """The FC phase is saturated when t_conv(k) + t_fc <= g * t_fc (boundary included)."""
    return t_conv_k + t_fc <= g * t_fc * (1 + TIE_TOLERANCE)


def implicit_momentum(g: int) -> float:
    """Theorem 1: g asynchronous groups add implicit momentum 1 - 1/g."""
    return 1.0 - 1.0 / g


def explicit_momentum(g: int, target: float) -> float:
    """The explicit momentum that keeps explicit + implicit at `target` (§IV-C, App. E).

    0 when the implicit momentum alone reaches the target: then asynchrony costs
    statistical efficiency, and the optimizer lowers g.
    """
    return max(0.0, target - implicit_momentum(g))


@dataclass(frozen=True)
class GroupPoint:
    """One execution strategy: g compute groups of k devices."""

    groups: int
    group_size: int
    t_conv: float
    hardware_efficiency: float
    fc_saturated: bool
    implicit_momentum: float
    explicit_momentum: float


OMNIVORE_ASSUMPTIONS: tuple[str, ...] = (
    "N conv devices in g equal groups of k = N/g, plus one merged FC server (Omnivore §V-A)",
    "the FC server serves one group at a time (§IV-B); t_fc includes its small network time",
    "conv compute scales linearly with k (Tc,c/k); conv model traffic grows linearly (Tn,c*k)",
    "t_conv(k) = max(compute, network): the two overlap layer by layer (Appendix D)",
    "Tc,c and t_fc split the trace's processing time by conv vs matmul op time",
    "Tn,c = 2 f(conv model bytes): the conv model forward and its gradients back",
    "total momentum = explicit + implicit (1 - 1/g); Theorem 1 assumes batches drawn "
    "uniformly and exponentially distributed, independent step times (A0-A2)",
    "the suggested g is the optimizer's start (§V-B): the smallest g that saturates the FC "
    "phase; Algorithm 1 then halves g while the tuned explicit momentum is 0",
)


@dataclass(frozen=True)
class Omnivore:
    """Omnivore's model for N devices: every divisor g, and the suggested g."""

    devices: int
    t_conv_compute1: float
    t_conv_network1: float
    t_fc: float
    target_momentum: float
    groups: tuple[GroupPoint, ...]
    suggested_groups: int
    suggestion_saturates: bool
    assumptions: tuple[str, ...] = field(default=OMNIVORE_ASSUMPTIONS)


def omnivore(
    devices: int,
    t_conv_compute1: float,
    t_conv_network1: float,
    t_fc: float,
    target_momentum: float = 0.9,
) -> Omnivore:
    """HE(g) and momentum for every g dividing `devices`; suggest the smallest saturating g.

    When no g saturates the FC phase, the suggestion is g = N (fastest iterations) and
    `suggestion_saturates` is False.
    """
    if devices < 1:
        raise InputError(None, f"Omnivore needs at least one device, got {devices}")
    pts = []
    for g in (d for d in range(1, devices + 1) if devices % d == 0):
        k = devices // g
        tc = t_conv(k, t_conv_compute1, t_conv_network1)
        pts.append(
            GroupPoint(
                groups=g,
                group_size=k,
                t_conv=tc,
                hardware_efficiency=hardware_efficiency(g, tc, t_fc),
                fc_saturated=fc_saturated(g, tc, t_fc),
                implicit_momentum=implicit_momentum(g),
                explicit_momentum=explicit_momentum(g, target_momentum),
            )
        )
    saturating = [p for p in pts if p.fc_saturated]
    suggested = saturating[0] if saturating else pts[-1]
    return Omnivore(
        devices=devices,
        t_conv_compute1=t_conv_compute1,
        t_conv_network1=t_conv_network1,
        t_fc=t_fc,
        target_momentum=target_momentum,
        groups=tuple(pts),
        suggested_groups=suggested.groups,
        suggestion_saturates=bool(saturating),
    )


def omnivore_from_calibration(
    cal: Calibration, devices: int, target_momentum: float = 0.9
) -> Omnivore | None:
    """Omnivore's inputs from a calibration; None when no conv/FC op types were seen."""
    if cal.conv_fraction is None:
        return None
    tcc = cal.processing_time * cal.conv_fraction
    tfc = cal.processing_time - tcc
    tnc = 2 * cal.network.time(cal.conv_bytes) if cal.conv_bytes > 0 else 0.0
    return omnivore(devices, tcc, tnc, tfc, target_momentum)


# --------------------------------------------------------------------------------------
# Cross-check against the simulator (issue point 5)

#: Hook: (job, calibration, workers) -> simulated seconds per iteration, or None.
RingSimulator = Callable[[Job, Calibration, int], float | None]


def ring_cross_check(
    job: Job,
    cal: Calibration,
    settings: Settings,
    simulator: RingSimulator | None = None,
) -> dict[str, Any] | None:
    """Ring model vs the simulator at the trace's own worker count; gap = model/sim - 1,
    with the simulator's own error against the measured step beside it: where that is
    over `CALIBRATION_TOLERANCE` the gap measures the simulator, not the model (the
    MI300 DDP's calibrated simulator ran 75 ms against a measured 19 ms step: gap -75%).

    `simulator` is the hook (`calibrated_simulator`: the same calibration in the
    simulator; `replay_simulator`: the traced steps as they ran); without one the
    result is None and the document says so.
    """
    if simulator is None:
        return None
    simulated = simulator(job, cal, cal.workers)
    if simulated is None:
        return None
    predicted = point("ring", cal.workers, cal, settings).iteration_time
    measured = cal.measured_iteration_time
    error = simulated / measured - 1 if measured and simulated else None
    warning = None
    if error is not None and abs(error) > CALIBRATION_TOLERANCE:
        warning = (
            f"the simulator misses the traced configuration by {error:+.1%}: "
            "the gap is no check of the model"
        )
    return {
        "workers": cal.workers,
        "model_iteration_time": predicted,
        "simulated_iteration_time": simulated,
        "gap": predicted / simulated - 1 if simulated else None,
        "measured_iteration_time": measured,
        "simulator_error": error,
        "warning": warning,
    }


# --------------------------------------------------------------------------------------
# The JSON document


def _num(x: float | None) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    return float(x)


def _point_dict(p: Point) -> dict[str, Any]:
    out: dict[str, Any] = {
        "workers": p.workers,
        "processing_time": p.processing,
        "update_time": p.update,
        "network_time": p.network,
        "iteration_time": p.iteration_time,
        "throughput": _num(p.throughput),
        "ideal_throughput": _num(p.ideal_throughput),
        "scaling_efficiency": _num(p.scaling_efficiency),
        "epoch_time": p.epoch_time,
    }
    if p.pull is not None:
        out["pull_time"], out["push_time"] = p.pull, p.push
    return out


def calibration_dict(cal: Calibration) -> dict[str, Any]:
    return {
        "processing_time": cal.processing_time,
        "update_time": cal.update_time,
        "model_bytes": cal.model_bytes,
        "parameters": [{"name": k, "nbytes": v} for k, v in cal.param_bytes.items()],
        "network": {
            "a": cal.network.a,
            "b": cal.network.b,
            "bandwidth": _num(cal.bandwidth),
            "r2": _num(cal.network.r2),
            "points": cal.network.points,
            "source": cal.network_source,
        },
        "alpha": cal.alpha,
        "workers": cal.workers,
        "ps": cal.ps,
        "measured_iteration_time": cal.measured_iteration_time,
        "network_time": cal.network_time,
        "network_scale": cal.network_scale,
        "overhead_time": cal.overhead_time,
        "batch_size": cal.batch_size,
        "conv_fraction": cal.conv_fraction,
        "conv_bytes": cal.conv_bytes,
        "notes": list(cal.notes),
    }


def omnivore_dict(model: Omnivore) -> dict[str, Any]:
    return {
        "devices": model.devices,
        "t_conv_compute1": model.t_conv_compute1,
        "t_conv_network1": model.t_conv_network1,
        "t_fc": model.t_fc,
        "target_momentum": model.target_momentum,
        "groups": [
            {
                "groups": p.groups,
                "group_size": p.group_size,
                "t_conv": p.t_conv,
                "hardware_efficiency": p.hardware_efficiency,
                "fc_saturated": p.fc_saturated,
                "implicit_momentum": p.implicit_momentum,
                "explicit_momentum": p.explicit_momentum,
            }
            for p in model.groups
        ],
        "suggested_groups": model.suggested_groups,
        "suggestion_saturates": model.suggestion_saturates,
        "assumptions": list(model.assumptions),
    }


def settings_for(
    cal: Calibration,
    *,
    overlap: float | None = None,
    dataset_size: int | None = None,
) -> Settings:
    """The sweep's settings: `overlap` given, else the trace's measured alpha, else 0."""
    if overlap is not None:
        if not 0.0 <= overlap <= 1.0:
            raise InputError(None, f"overlap must be in [0, 1], got {overlap}")
        alpha, source = overlap, "given"
    elif cal.alpha is not None:
        alpha, source = min(1.0, max(0.0, cal.alpha)), "measured"
    else:
        alpha, source = 0.0, "none (no transfers traced)"
    return Settings(
        alpha=alpha,
        alpha_source=source,
        bandwidth=cal.bandwidth,
        latency=cal.latency,
        batch_size=cal.batch_size,
        dataset_size=dataset_size,
    )


def model_document(
    job: Job,
    cal: Calibration,
    workers: Sequence[int],
    *,
    architectures: Sequence[str] = ARCHITECTURES,
    ps_counts: Sequence[int] = (1,),
    overlap: float | None = None,
    dataset_size: int | None = None,
    target_momentum: float = 0.9,
    simulator: RingSimulator | None = None,
) -> dict[str, Any]:
    """``planner.model/1``: calibration, assumptions, curves, crossovers, recommendation,
    Omnivore's compute groups and the ring cross-check."""
    if not workers or min(workers) < 1:
        raise InputError(None, "worker counts must be positive integers")
    for arch in architectures:
        if arch not in ARCHITECTURES:
            raise InputError(None, f"unknown architecture {arch!r} (choose from {ARCHITECTURES})")
    settings = settings_for(cal, overlap=overlap, dataset_size=dataset_size)
    curves = sweep(
        cal, workers, architectures=architectures, ps_counts=ps_counts, settings=settings
    )
    rec = recommend(curves, workers)
    own = "ps" if cal.ps > 0 else "ring"
    own_point = point(own, cal.workers, cal, settings, ps=cal.ps if own == "ps" else None)
    measured = cal.measured_iteration_time
    error = own_point.iteration_time / measured - 1 if measured else None
    withheld = None
    if error is None:
        withheld = "no measured step to calibrate on"
    elif abs(error) > CALIBRATION_TOLERANCE:
        withheld = (
            f"the model misses the traced configuration ({own}, {cal.workers} workers) by "
            f"{error:+.1%} (more than {CALIBRATION_TOLERANCE:.0%})"
        )
    if withheld is None and not gradient_exchange(job):
        withheld = (
            "the trace shows no backward pass and no optimizer step, so its collectives are "
            "no data-parallel gradient exchange (an inference or model-parallel job?), which "
            "is what the PS, P2P and ring models price"
        )
    if withheld is not None:
        rec = None
    omni = omnivore_from_calibration(cal, max(workers), target_momentum)
    check = ring_cross_check(job, cal, settings, simulator)
    return {
        "schema": SCHEMA,
        "framework": job.framework,
        "sources": list(job.sources),
        "calibration": calibration_dict(cal),
        "assumptions": {
            "alpha": settings.alpha,
            "alpha_source": settings.alpha_source,
            "bandwidth": _num(settings.bandwidth),
            "latency": settings.latency,
            "batch_size": settings.batch_size,
            "dataset_size": settings.dataset_size,
            "throughput_unit": "samples/s" if settings.batch_size else "worker-iterations/s",
            "scaling": "weak: each worker keeps its per-worker batch",
        },
        "workers": list(workers),
        "curves": [
            {
                "label": c.label,
                "arch": c.arch,
                "ps": c.ps,
                "points": [_point_dict(p) for p in c.points],
            }
            for c in curves
        ],
        "crossovers": [
            {
                "between": [x.first, x.second],
                "from_workers": x.from_workers,
                "to_workers": x.to_workers,
                "before": x.before,
                "after": x.after,
            }
            for x in crossovers(curves)
        ],
        "recommendation": None
        if rec is None
        else {
            "label": rec.label,
            "arch": rec.arch,
            "ps": rec.ps,
            "workers": rec.workers,
            "iteration_time": rec.iteration_time,
            "throughput": _num(rec.throughput),
            "scaling_efficiency": _num(rec.scaling_efficiency),
            "reason": rec.reason,
            "best_per_workers": [{"workers": w, "label": lab} for w, lab in rec.best_per_workers],
        },
        "validation": {
            "arch": own,
            "workers": cal.workers,
            "ps": cal.ps if own == "ps" else None,
            "measured_iteration_time": measured,
            "model_iteration_time": own_point.iteration_time,
            "model_error": error,
            "tolerance": CALIBRATION_TOLERANCE,
            "recommendation_withheld": withheld,
            "network_warning": network_warning(cal),
        },
        "omnivore": None if omni is None else omnivore_dict(omni),
        "cross_check": check
        if check is not None
        else {"status": "unavailable: no simulator hook for a ring what-if on a calibration"},
    }
