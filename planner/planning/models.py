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

This module holds that document and is the models' library entry point: it names the
public parts of `planner.planning.model_calibration` (reading the trace),
`planner.planning.ps_p2p_ring` (the equations and the sweep) and
`planner.planning.omnivore`, where they are defined.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from planner.errors import InputError
from planner.model.trace import Job
from planner.planning.model_calibration import (
    calibrate,
    gradient_exchange,
    network_warning,
    workers_alone,
)
from planner.planning.omnivore import (
    Omnivore,
    explicit_momentum,
    implicit_momentum,
    omnivore,
    omnivore_from_calibration,
    t_conv,
)
from planner.planning.ps_p2p_ring import (
    ARCHITECTURES,
    CALIBRATION_TOLERANCE,
    Calibration,
    Point,
    Recommendation,
    RingSimulator,
    Settings,
    best_at,
    crossovers,
    iteration_time,
    iterations_per_epoch,
    p2p_network,
    point,
    ps_available_bandwidth,
    recommend,
    ring_cross_check,
    ring_network,
    settings_for,
    sweep,
)

__all__ = [
    "CALIBRATION_TOLERANCE",
    "Calibration",
    "Settings",
    "best_at",
    "calibrate",
    "crossovers",
    "explicit_momentum",
    "gradient_exchange",
    "implicit_momentum",
    "iteration_time",
    "iterations_per_epoch",
    "model_document",
    "omnivore",
    "omnivore_from_calibration",
    "p2p_network",
    "point",
    "ps_available_bandwidth",
    "recommend",
    "ring_cross_check",
    "ring_network",
    "settings_for",
    "sweep",
    "t_conv",
    "workers_alone",
]

SCHEMA = "planner.model/1"


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
    validation = _validation(job, cal, settings)
    if validation["recommendation_withheld"] is not None:
        rec = None
    omni = omnivore_from_calibration(cal, max(workers), target_momentum)
    check = ring_cross_check(job, cal, settings, simulator)
    return {
        "schema": SCHEMA,
        "framework": job.framework,
        "sources": list(job.sources),
        "calibration": calibration_dict(cal),
        "assumptions": _assumptions_dict(settings),
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
        "recommendation": None if rec is None else _recommendation_dict(rec),
        "validation": validation,
        "omnivore": None if omni is None else omnivore_dict(omni),
        "cross_check": check
        if check is not None
        else {"status": "unavailable: no simulator hook for a ring what-if on a calibration"},
    }


def _assumptions_dict(settings: Settings) -> dict[str, Any]:
    return {
        "alpha": settings.alpha,
        "alpha_source": settings.alpha_source,
        "bandwidth": _num(settings.bandwidth),
        "latency": settings.latency,
        "batch_size": settings.batch_size,
        "dataset_size": settings.dataset_size,
        "throughput_unit": "samples/s" if settings.batch_size else "worker-iterations/s",
        "scaling": "weak: each worker keeps its per-worker batch",
    }


def _recommendation_dict(rec: Recommendation) -> dict[str, Any]:
    return {
        "label": rec.label,
        "arch": rec.arch,
        "ps": rec.ps,
        "workers": rec.workers,
        "iteration_time": rec.iteration_time,
        "throughput": _num(rec.throughput),
        "scaling_efficiency": _num(rec.scaling_efficiency),
        "reason": rec.reason,
        "best_per_workers": [{"workers": w, "label": lab} for w, lab in rec.best_per_workers],
    }


def _validation(job: Job, cal: Calibration, settings: Settings) -> dict[str, Any]:
    """The model at the traced configuration against the measured step, and why the
    recommendation is withheld (``recommendation_withheld``; None: it stands)."""
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
    return {
        "arch": own,
        "workers": cal.workers,
        "ps": cal.ps if own == "ps" else None,
        "measured_iteration_time": measured,
        "model_iteration_time": own_point.iteration_time,
        "model_error": error,
        "tolerance": CALIBRATION_TOLERANCE,
        "recommendation_withheld": withheld,
        "network_warning": network_warning(cal),
    }
