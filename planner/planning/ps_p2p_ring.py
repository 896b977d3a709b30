"""The PS / P2P / ring performance model (Section III, Equations 7-21) over worker counts.

What the model takes (`Calibration`, measured from a trace by
`planner.planning.model_calibration.calibrate`), its equations, the traced
configuration's network time that calibrates it, and the sweep that evaluates every
architecture over worker counts: curves, crossovers, the recommendation and the ring
cross-check against the simulator. Separate from the calibration (reading a trace) and
from the ``planner.model/1`` document (`planner.planning.models`), which both build on
it; see docs/models.md for each formula.

Per iteration, every architecture is ``T = T_processing + T_update + T_network -
alpha * min(T_processing, T_network)``; ``alpha = 0`` is the formulas as printed (no
overlap). Times are seconds, sizes bytes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from planner.errors import InputError
from planner.model.oracle import NetworkModel
from planner.model.trace import Job

ARCHITECTURES: tuple[str, ...] = ("ps", "p2p", "ring")
#: Tie-break between equal iteration times: fewer machines, then the bandwidth-optimal one.
PREFERENCE: tuple[str, ...] = ("ring", "p2p", "ps")
TIE_TOLERANCE = 1e-9
#: The model must predict the traced configuration within this fraction to recommend.
CALIBRATION_TOLERANCE = 0.10


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
