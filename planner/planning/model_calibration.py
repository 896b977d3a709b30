"""The analytic models' calibration: their inputs (`Calibration`) measured from a trace.

`calibrate` reads a traced job's per-step processing, update and network times, its
parameter sizes, network model f(d), overlap alpha and configuration (workers, PS); the
helpers here say what the trace is (`world_size`, `gradient_exchange`,
`workers_alone`) and whether its network fit holds (`network_warning`). Apart from the
models themselves (`planner.planning.ps_p2p_ring`, `planner.planning.omnivore`)
because it is the one part that reads traces; named apart from
`planner.prediction.calibration`, the simulator hooks that cross-check the models.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from planner.errors import InputError
from planner.ingest.files import read_bytes
from planner.measure import allreduce
from planner.measure.metrics import caramel_figures, collectives_alone
from planner.model.graph import OpGraph
from planner.model.oracle import NetworkModel, fit_network_model
from planner.model.records import partial_steps
from planner.model.trace import Job, busy_time, with_dedicated
from planner.planning.caramel import network_problem
from planner.planning.ps_p2p_ring import Calibration, on_traced_configuration

_UPDATE_TYPES = re.compile(r"apply|optimizer|\.step\b|adam|sgd", re.IGNORECASE)
_CONV_TYPES = re.compile(r"conv", re.IGNORECASE)
_ALLREDUCE = re.compile(r"all_?reduce", re.IGNORECASE)
_FC_TYPES = re.compile(r"matmul|gemm|addmm|linear|\bmm\b|bmm", re.IGNORECASE)

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
            for succ in graph.succ[name]:
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
    if not job.trace.rows:
        raise InputError(source, "the models need timings; input has none")
    notes: list[str] = []
    times, ps, conv_time, fc_time = _step_times(job)
    params = _model_params(job)
    if not params:
        notes.append("no transfers with sizes in the trace: W = 0 (give the model size)")
    network, network_source = _calibration_network(job, network, bandwidth, notes)

    updates = times["update"]
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
    processing, net, idle, walls = (
        times["processing"],
        times["network"],
        times["idle"],
        times["wall"],
    )
    cal = Calibration(
        processing_time=float(statistics.median(processing)) if processing else 0.0,
        update_time=float(update_time),
        model_bytes=int(sum(params.values())),
        param_bytes=dict(sorted(params.items())),
        network=network,
        network_source=network_source,
        alpha=measured_alpha(job),
        workers=workers,
        ps=ps,
        measured_iteration_time=float(statistics.median(walls)) if walls else None,
        batch_size=batch_size,
        conv_fraction=conv_fraction,
        conv_bytes=_conv_model_bytes(job, params, meta),
        notes=tuple(notes),
        network_time=float(statistics.median(net)) if net else None,
        overhead_time=float(statistics.median(idle)) if idle else 0.0,
    )
    return on_traced_configuration(cal)


def _step_times(job: Job) -> tuple[dict[str, list[float]], int, float, float]:
    """Per traced rank and step (partial steps left out of the fits): the processing,
    update and network busy times, the overhead and the step's wall time (seconds,
    under ``processing``, ``update``, ``network``, ``idle``, ``wall``); the number of
    parameter servers the transfers name; the conv and the FC op time."""
    times: dict[str, list[float]] = {
        k: [] for k in ("processing", "update", "network", "idle", "wall")
    }
    ps_names: set[str] = set()
    conv_time = fc_time = 0.0
    for rank in job.ranks:
        graph = job.graphs[rank]
        for op in graph.ops.values():
            if op.is_transfer:
                ps_names.update(re.findall(r"ps\d+", op.resource))
        rows = job.trace.of(rank)
        partial = partial_steps(rows, graph.ops)  # left out of the fits
        if partial and rows["iteration"].nunique() > len(partial):
            rows = rows[~rows["iteration"].isin(list(partial))]
        _rank_step_times(job, rank, rows, times)
        layer_of = {n: _layer_kind(o.type) for n, o in graph.ops.items() if o.kind == "compute"}
        kinds = rows["op"].map(layer_of)
        conv_time += float(rows.loc[kinds == "conv", "duration"].sum()) / 1e9
        fc_time += float(rows.loc[kinds == "fc", "duration"].sum()) / 1e9
    return times, len(ps_names), conv_time, fc_time


def _rank_step_times(
    job: Job, rank: str, rows: pd.DataFrame, times: dict[str, list[float]]
) -> None:
    """`_step_times` of one rank's steps `rows`, appended to `times`."""
    graph = job.graphs[rank]
    layer, update = _compute_ops(graph)
    in_layer = rows["op"].isin(layer).to_numpy()
    in_update = rows["op"].isin(update).to_numpy()
    in_net = rows["op"].isin(graph.transfers).to_numpy()
    span_of = _spans(job, rank)
    for step, idx in rows.groupby("iteration").indices.items():
        starts = rows["start"].to_numpy()[idx]
        durations = rows["duration"].to_numpy()[idx]
        times["processing"].append(busy_time(starts[in_layer[idx]], durations[in_layer[idx]]) / 1e9)
        times["update"].append(busy_time(starts[in_update[idx]], durations[in_update[idx]]) / 1e9)
        if in_net[idx].any():
            times["network"].append(busy_time(starts[in_net[idx]], durations[in_net[idx]]) / 1e9)
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
        times["idle"].append(max(0.0, wall - busy))
        times["wall"].append(wall)


def _model_params(job: Job) -> dict[str, int]:
    """Bytes per parameter over the ranks (the largest any rank moves)."""
    params: dict[str, int] = {}
    for graph in job.graphs.values():
        for key, size in _param_bytes(graph).items():
            params[key] = max(params.get(key, 0), size)
    return params


def _calibration_network(
    job: Job, network: NetworkModel | None, bandwidth: float | None, notes: list[str]
) -> tuple[NetworkModel, str]:
    """The network model f(d) and where it comes from: `network` as given, else fitted to
    the trace's transfers; `bandwidth` replaces its slope. A note for `notes` when the
    fit rests on untraced peers; `InputError` when no bandwidth can be had."""
    source = job.sources[0] if job.sources else None
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
    return network, network_source


def _conv_model_bytes(job: Job, params: Mapping[str, int], meta: Mapping[str, object]) -> int:
    """Bytes of the conv parameters: those whose pull feeds a conv layer, or (all-reduce,
    no pulls) the 4-D parameters the metadata lists when it lists any."""
    conv_bytes = 0
    for key, size in params.items():
        graph_kind = next(
            (k for g in job.graphs.values() if (k := _param_layer(g, key)) is not None), None
        )
        if graph_kind == "conv":
            conv_bytes += size
    if not any(g.recvs for g in job.graphs.values()):
        conv_bytes = _meta_conv_bytes(meta) or conv_bytes
    return conv_bytes


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
