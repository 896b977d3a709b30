"""DDP bucket advice: the iteration time predicted for each ``bucket_cap_mb``.

DDP rebuilds its gradient buckets after the first iteration in gradient-ready order:
it adds gradients to a bucket until the bucket holds at least its limit, then opens
the next. The first bucket's limit depends on the PyTorch release and on whether the
cap was given: with ``bucket_cap_mb`` unset every release uses 25 MiB with a 1 MiB
first bucket; with an explicit cap PyTorch 2.13 uses the cap for the first bucket too,
where older releases kept 1 MiB. Which rule the traced job followed is read from its
buckets (`first_bucket_rule`). A bucket's all-reduce is launched when its last gradient
is ready, in bucket order, and the all-reduces share one channel, each taking
``f(bytes)`` of the network model (`planner.model.oracle.NetworkModel`).

The step time of a cap is ``max(backward end, last all-reduce end) + tail``: the
gradients' ready times (``torch::autograd::AccumulateGrad`` ends, relative to the step
start; per gradient the latest over the ranks, since a bucket's all-reduce waits for
its slowest rank) and the ``tail`` after the last all-reduce (optimizer, the next
step's start) are measured in the trace; only the buckets and their all-reduces change
with the cap.

**Contention** (`kappa`). On GPU ranks the backward pass and NCCL use different
resources. On a CPU job gloo reduces and copies on the cores that run the backward
pass: while both run, each goes slower. The model shares the rank's processor between
them: while a collective and the backward pass overlap, each progresses at ``1/kappa``
of its own speed (``kappa = 1``: independent; ``kappa = 2``: fair halves of one core).
The traced ready times are first turned into backward *work* (the time each gradient
would be ready without collectives in flight), then each cap is replayed. ``kappa`` is
calibrated on the traced steps (the value whose replay of the traced buckets matches
the measured steps) and reported with the per-step replay errors left after it; a
trace whose collectives never overlap the backward pass cannot tell ``kappa`` and
gets no recommendation.

**A reference trace** (`backward_factor`). The two sides need not slow alike: on a
2-core machine the collectives lost 2-4x while the backward pass lost far less, and one
``kappa`` found from the collectives then takes too much time out of the backward
pass. A trace of the same job with one bucket (its all-reduce after the backward pass,
so the backward pass runs alone) shows the backward work directly: the backward pass's
own factor (``kappa_backward``) is the one that turns the traced ready times into that
work, and ``kappa`` (the collectives') is then calibrated on the traced steps with it.

**DDP's copy back.** When the backward pass ends, DDP copies each bucket back into the
gradients once its all-reduce is done (``copy_bucket_to_grad``, on the main thread), at
the speed the trace shows (`Profile.copy_rate`): a single large bucket's copy is on the
critical path, many small ones' mostly overlap the later all-reduces.

**The profiler's cost.** The profiler slows the steps it records, and every prediction
starts from them. Given the job's step time without the profiler at the traced
configuration (from its training log), the traced steps are scaled to it first
(`without_profiler`).

This module is the sweep and its ``planner.bucket_sweep/1`` document, and the advice's
library entry point: it names the public parts of `planner.planning.bucket_profile` (the
trace's side) and `planner.planning.bucket_replay` (the buckets and their replay), where
they are defined.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from planner.measure.foreign_load import is_loaded, load_line
from planner.model.oracle import NetworkModel
from planner.model.trace import Job
from planner.planning import hook_calls
from planner.planning.bucket_profile import (
    Profile,
    join,
    profile,
    rank_profile,
    step_compute,
    wire_share,
    without_profiler,
)
from planner.planning.bucket_replay import (
    DEFAULT_CAP_MB,
    FIRST_BUCKET_BYTES,
    MIB,
    backward_work,
    ddp_buckets,
    decontend,
    first_bucket_rule,
    replay,
    step_times,
)

__all__ = [
    "DEFAULT_CAPS_MB",
    "KAPPA_RANGE",
    "MIB",
    "BadReference",
    "Profile",
    "backward_factor",
    "backward_work",
    "calibrate",
    "ddp_buckets",
    "decontend",
    "first_bucket_rule",
    "join",
    "profile",
    "rank_profile",
    "replay",
    "step_times",
    "sweep",
    "sweep_profile",
    "without_profiler",
]

DEFAULT_CAPS_MB: tuple[float, ...] = (0.25, 0.5, 1, 2, 4, 8, 16, 25, 50, 100)
MIN_GAIN = 0.02
"""A cap is recommended only when it is predicted faster than the traced buckets by more
than this and by more than the replay error of the traced buckets."""
KAPPA_RANGE = (1.0, 4.0)
"""Contention factors searched on a CPU job (1: none; 2: the two halve one core)."""
KAPPA_SENSITIVITY = 0.03
"""``kappa`` is measured only when some ``kappa`` in `KAPPA_RANGE` moves the traced
buckets' replay by this much of the step from its value at ``kappa`` 1."""
KAPPA_COLLECTIVES_RANGE = (1.0, 8.0)
"""The collectives' factors searched when the backward pass's is measured apart."""
REFERENCE_OVERLAP = 0.1
"""A reference trace shows the backward pass alone only when collectives overlap at
most this share of its backward pass."""


class BadReference(ValueError):
    """The reference trace given to the sweep cannot serve as one (`backward_factor`)."""


def _observed_assignment(p: Profile) -> list[int] | None:
    """The traced buckets as a grouping of the gradients in ready order, when their sizes
    split the ready order exactly."""
    out, bucket, held = [], 0, 0.0
    targets = p.observed_buckets.tolist()
    if not targets or abs(sum(targets) - p.sizes.sum()) > 0.5:
        return None
    for size in p.sizes.tolist():
        out.append(bucket)
        held += size
        if bucket < len(targets) and abs(held - targets[bucket]) < 0.5:
            bucket, held = bucket + 1, 0.0
    return out if bucket == len(targets) else None


def calibrate(
    p: Profile, ids: Sequence[int], network: NetworkModel, kappa_backward: float | None = None
) -> tuple[float | None, str]:
    """``kappa`` whose replay of the traced buckets matches the traced steps (median error
    nearest 0, on a 0.05 grid), and how it was found; 1 on GPU ranks. With
    `kappa_backward` (`backward_factor`) only the collectives' factor is sought, in
    `KAPPA_COLLECTIVES_RANGE`. None when the traced steps cannot tell it: their
    collectives overlap the backward pass too little (no ``kappa`` in range moves the
    replay by `KAPPA_SENSITIVITY` from ``kappa`` 1), or they are slower than any
    ``kappa`` in range explains."""
    if not p.cpu:
        return 1.0, "GPU ranks: the backward pass and the collectives use different resources"
    measured = np.array([max(s.measured for s in v) for v in p.steps.values()])
    low, high = KAPPA_RANGE if kappa_backward is None else KAPPA_COLLECTIVES_RANGE
    grid = np.arange(low, high + 1e-9, 0.05)
    errors = np.array([
        float(np.median(np.array(step_times(p, ids, network, k, kappa_backward)) / measured - 1))
        for k in grid
    ])  # fmt: skip
    # the whole range, not 1 -> 2 alone: the replay need not move monotonically with kappa
    # (lanes, latencies), and a trace may tell only a large kappa from 1
    if np.max(np.abs(errors - errors[0])) < KAPPA_SENSITIVITY:
        return None, (
            "the traced all-reduces overlap the backward pass too little to measure how much "
            "gloo and the backward pass slow each other on these cores: trace with a smaller "
            "bucket_cap_mb to get a recommendation"
        )
    best = int(np.argmin(np.abs(errors)))
    if best == len(grid) - 1 and errors[best] < -MIN_GAIN:
        return None, (
            f"the traced steps are {-errors[best]:.0%} slower than the model replays them even "
            f"with kappa {grid[-1]:g}: something the model does not see slows them"
        )
    found = "calibrated on the traced steps"
    if kappa_backward is not None:
        found += f", the backward pass's factor {kappa_backward:g} held"
    return float(round(grid[best], 2)), found


def backward_factor(p: Profile, reference: Profile) -> tuple[float, str]:
    """``kappa_backward``: the factor whose backward work behind `p`'s ready times ends
    where `reference`'s backward pass ends (the medians over steps of the latest rank's
    last gradient), on a 0.05 grid in `KAPPA_RANGE`, and what it rests on.

    `reference` is the same job traced with its all-reduces after the backward pass
    (one bucket): its backward pass ran alone. `ValueError` when it is not the same job
    (other gradients) or its collectives overlap more than `REFERENCE_OVERLAP` of its
    backward pass."""
    if not np.array_equal(p.sizes, reference.sizes):
        raise ValueError(
            f"the reference trace has {len(reference.sizes)} gradients of "
            f"{int(reference.sizes.sum())} B, the traced job {len(p.sizes)} of "
            f"{int(p.sizes.sum())} B: not the same job"
        )
    overlap = float(np.median([
        sum(max(0.0, min(b, s.ready.max()) - a) for a, b in s.busy) / s.ready.max()
        for v in reference.steps.values() for s in v
    ]))  # fmt: skip
    if overlap > REFERENCE_OVERLAP:
        raise ValueError(
            f"collectives overlap {overlap:.0%} of the reference trace's backward pass (at most "
            f"{REFERENCE_OVERLAP:.0%}): trace the reference with one bucket (a bucket_cap_mb "
            "above the gradients' size)"
        )
    alone = float(np.median([max(s.ready.max() for s in v) for v in reference.steps.values()]))
    grid = np.arange(KAPPA_RANGE[0], KAPPA_RANGE[1] + 1e-9, 0.05)
    ends = np.array([float(np.median([w.max() for w in backward_work(p, k)])) for k in grid])
    best = int(np.argmin(np.abs(ends - alone)))
    return float(round(grid[best], 2)), (
        f"measured: the backward pass of the reference trace ({len(reference.observed_buckets)} "
        f"bucket(s), {overlap:.0%} of its backward pass overlapped) ends at "
        f"{alone * 1e3:.1f} ms, this trace's backward work at that factor at "
        f"{ends[best] * 1e3:.1f} ms"
        + (
            f" (the end of the range {KAPPA_RANGE[0]:g}-{KAPPA_RANGE[1]:g}: the two traces "
            f"disagree by {ends[best] / alone - 1:+.0%})"
            if best in (0, len(grid) - 1) and abs(ends[best] / alone - 1) > 0.05
            else ""
        )
    )


def _row(
    p: Profile,
    cap: float,
    first: float,
    network: NetworkModel,
    kappa: float,
    kappa_backward: float | None = None,
) -> dict[str, Any]:
    ids = ddp_buckets(p.sizes.tolist(), int(cap * MIB), int(first * MIB))
    hooked = step_times(p, ids, network, kappa, kappa_backward, hook_calls.CALL_SECONDS)
    return {
        "bucket_cap_mb": cap,
        "first_bucket_cap_mb": first,
        "buckets": int(max(ids)) + 1,
        "predicted_step_time": float(np.median(step_times(p, ids, network, kappa, kappa_backward))),
        # the same buckets through planner's DDP hook, a call per bucket (a plan of them)
        "predicted_step_time_hooked": float(np.median(hooked)),
    }


def _decide(
    rows_by_kappa: list[list[dict[str, Any]]], replays: list[float], margin: float
) -> tuple[dict[str, Any], float, bool]:
    """The best cap, its predicted gain over the traced buckets (the least over the
    kappas tried), and whether it wins by more than `margin` under every kappa."""
    bests = [min(rows, key=lambda r: (r["predicted_step_time"], -r["bucket_cap_mb"]))
             for rows in rows_by_kappa]  # fmt: skip
    gains = [r / b["predicted_step_time"] - 1 for b, r in zip(bests, replays, strict=True)]
    same = all(b["bucket_cap_mb"] == bests[0]["bucket_cap_mb"] for b in bests)
    return bests[0], min(gains), same and min(gains) > margin


def sweep(
    job: Job,
    network: NetworkModel,
    caps_mb: Sequence[float] = DEFAULT_CAPS_MB,
    untraced_step_time: float | None = None,
    reference: Job | None = None,
    reference_untraced_step_time: float | None = None,
) -> dict[str, Any] | None:
    """``planner.bucket_sweep/1``: the predicted step time per cap, the recommended cap,
    and the observed configuration's replay error; None without gradient-ready times.

    With ``kappa`` unknown (a CPU trace whose collectives barely overlap the backward
    pass) every cap is predicted at both ends of `KAPPA_RANGE`, and a cap is recommended
    only when it wins at both. `untraced_step_time`: the job's step time without the
    profiler at the traced configuration (`without_profiler`). `reference`: the same job
    traced with one bucket, whose backward pass ran alone (`backward_factor`), and its
    untraced step time."""
    p = profile(job)
    if p is None:
        return None
    ref = None
    if reference is not None:
        ref = profile(reference)
        if ref is None:
            raise BadReference("the reference trace has no gradient-ready times")
    return sweep_profile(p, network, caps_mb, untraced_step_time, ref,
                         reference_untraced_step_time)  # fmt: skip


def sweep_profile(
    p: Profile,
    network: NetworkModel,
    caps_mb: Sequence[float] = DEFAULT_CAPS_MB,
    untraced_step_time: float | None = None,
    reference: Profile | None = None,
    reference_untraced_step_time: float | None = None,
) -> dict[str, Any]:
    """`sweep` of a job's `profile` (its ranks' profiles joined, `planner.job.rank_analysis`)
    and of its reference trace's; `ValueError` when an untraced step time cannot be its
    traced configuration's, `BadReference` when the reference cannot be one
    (`backward_factor`)."""
    traced = p.measured
    network = wire_network(p, network)
    if untraced_step_time is not None:
        p = without_profiler(p, untraced_step_time, _wire(p, network))
    profiler = {
        "traced_step_time": traced,
        "untraced_step_time": untraced_step_time,
        "profiler_cost": None if untraced_step_time is None else traced / untraced_step_time - 1,
        "copy_rate": p.copy_rate,
    }
    kappa_backward, source = None, "the one kappa: no reference trace"
    if reference is not None and not p.cpu:
        source = "GPU ranks: no contention to measure, the reference trace is not used"
    elif reference is not None:
        if reference_untraced_step_time is not None:
            try:
                reference = without_profiler(reference, reference_untraced_step_time)
            except ValueError as err:
                raise BadReference(f"the reference's untraced step time: {err}") from err
        try:
            kappa_backward, source = backward_factor(p, reference)
        except ValueError as err:
            raise BadReference(str(err)) from err
    document = _sweep(p, network, caps_mb, kappa_backward)
    document.update(profiler)
    document["kappa_backward"] = kappa_backward if kappa_backward is not None else document["kappa"]
    document["kappa_backward_source"] = source
    return document


def _wire(p: Profile, network: NetworkModel) -> float:
    """The network model's time for a step's traced buckets, one after another."""
    return float(sum(network.time(float(n)) for n in p.observed_buckets))


def wire_network(p: Profile, network: NetworkModel) -> NetworkModel:
    """`network` with the latency a wire-bound job pays: the benchmark's fastest calls'
    (`NetworkModel.a_fastest`) as far as the traced steps are bound by the wire
    (`wire_share`, at their median compute), its medians' where they are CPU work.

    DDP's all-reduces of one step follow each other on gloo's two threads, each one's
    start overlapping another's bytes, so a wire-bound step pays the call's own latency
    and not the jitter a few blocking calls of the benchmark add; on the lab's 3000
    Mbit/s link the medians put ``a`` at 1.8 ms where the fastest 4 KiB calls took
    0.5 ms, and a cap of 24 buckets was predicted 60% slow. On a loopback the
    all-reduces share the cores with the backward pass and the medians' latency holds
    (docs/algorithms.md)."""
    if network.a_fastest is None or not p.steps:
        return network
    compute = float(np.median([step_compute(s) for v in p.steps.values() for s in v]))
    share = wire_share(compute, _wire(p, network))
    return replace(network, a=share * network.a_fastest + (1.0 - share) * network.a)


def _sweep(
    p: Profile,
    network: NetworkModel,
    caps_mb: Sequence[float],
    kappa_backward: float | None = None,
) -> dict[str, Any]:
    observed = _observed_assignment(p)
    if observed is None:
        reason = "the traced buckets do not split the gradients in ready order: no replay"
        return _document(p, None, network, [], {"reason": reason})
    rule = first_bucket_rule(p.sizes.tolist(), observed)
    kappa, kappa_source = calibrate(p, observed, network, kappa_backward)
    kb = kappa_backward
    searched = KAPPA_RANGE if kb is None else KAPPA_COLLECTIVES_RANGE
    kappas = [kappa] if kappa is not None else list(searched)
    measured = np.array([max(s.measured for s in v) for v in p.steps.values()])
    errors = np.array(step_times(p, observed, network, kappas[0], kb)) / measured - 1
    first = (lambda cap: cap) if rule != "1 MiB" else (lambda cap: FIRST_BUCKET_BYTES / MIB)
    rows_by_kappa = [[_row(p, cap, first(cap), network, k, kb) for cap in caps_mb]
                     for k in kappas]  # fmt: skip
    replays = [float(np.median(step_times(p, observed, network, k, kb))) for k in kappas]
    error = float(np.median(errors))
    margin = max(abs(error), float(np.median(np.abs(errors))), MIN_GAIN)
    best, gain, wins = _decide(rows_by_kappa, replays, margin)
    rows = rows_by_kappa[0]
    if kappa is None:
        for row, high in zip(rows, rows_by_kappa[-1], strict=True):
            row["predicted_step_time_contended"] = high["predicted_step_time"]
    if not wins:
        reason = (
            f"no cap is predicted to beat the traced buckets by more than the model's error "
            f"({gain:.1%} <= {margin:.1%}): keep the observed configuration"
            if kappa is not None or gain <= margin
            else f"{kappa_source}; the best cap depends on it"
        )
    elif kappa is None:
        reason = (
            f"predicted {gain:.1%} faster than the traced buckets whatever the contention "
            f"(kappa {searched[0]:g} to {searched[1]:g}; replay error {error:+.1%})"
        )
    else:
        reason = f"predicted {gain:.1%} faster than the traced buckets (replay error {error:+.1%})"
    loaded = p.cpu and is_loaded(p.load)
    if loaded:  # what it predicts carries the load: said, and nothing recommended
        reason = load_line(p.load)
    return _document(p, observed, network, rows, {
        "first_bucket_rule": rule,
        "observed_predicted_step_time": replays[0],
        "replay_error": error,
        "replay_error_worst": float(np.max(np.abs(errors))),
        "kappa": kappa,
        "kappa_source": kappa_source,
        "uncalibrated_replay_error": float(
            np.median(np.array(step_times(p, observed, network, 1.0)) / measured - 1)),
        "default_configuration": _row(p, DEFAULT_CAP_MB, FIRST_BUCKET_BYTES / MIB, network,
                                      kappas[0], kb),
        "best_cap_mb": best["bucket_cap_mb"],
        "best_gain": gain,
        "gain_margin": margin,
        "recommended_cap_mb": best["bucket_cap_mb"] if wins and not loaded else None,
        "reason": reason,
        "foreign_load": p.load if p.cpu else None,
    })  # fmt: skip


def _document(
    p: Profile,
    observed: list[int] | None,
    network: NetworkModel,
    rows: list[dict[str, Any]],
    fields: dict[str, Any],
) -> dict[str, Any]:
    empty = {"first_bucket_rule": None, "observed_predicted_step_time": None,
             "replay_error": None, "replay_error_worst": None, "kappa": None,
             "kappa_source": "", "uncalibrated_replay_error": None,
             "default_configuration": None, "best_cap_mb": None, "best_gain": None,
             "gain_margin": None, "recommended_cap_mb": None,
             "foreign_load": None}  # fmt: skip
    return {
        "schema": "planner.bucket_sweep/1",
        "gradients": len(p.sizes),
        "gradient_bytes": int(p.sizes.sum()),
        "steps": len(p.steps),
        "measured_step_time": p.measured,
        "observed_buckets": p.observed_buckets.astype(int).tolist(),
        "network": {
            "a": network.a,
            "b": network.b,
            "r2": network.r2 if np.isfinite(network.r2) else None,
        },
        "caps": rows,
        **empty,
        **fields,
        **({"process_groups": p.groups} if p.groups else {}),
    }
