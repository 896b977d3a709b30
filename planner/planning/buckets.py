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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from planner.model.oracle import NetworkModel
from planner.model.trace import Job, rank_meta

MIB = 1 << 20
FIRST_BUCKET_BYTES = 1 * MIB
"""DDP's first bucket limit with the cap unset (``dist._DEFAULT_FIRST_BUCKET_BYTES``)."""
DEFAULT_CAP_MB = 25.0
"""DDP's ``bucket_cap_mb`` when unset."""
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


def ddp_buckets(sizes: Sequence[int], cap: int, first_cap: int = FIRST_BUCKET_BYTES) -> list[int]:
    """The bucket of each gradient (sizes in ready order), as DDP fills them."""
    out = []
    bucket, held, limit = 0, 0, first_cap
    for size in sizes:
        out.append(bucket)
        held += size
        if held >= limit:
            bucket, held, limit = bucket + 1, 0, cap
    return out


def first_bucket_rule(sizes: Sequence[float], assignment: Sequence[int]) -> str | None:
    """Which first-bucket limit explains the traced buckets, as it applies to an explicit
    ``bucket_cap_mb``: ``"cap"`` (the first bucket takes the cap: PyTorch 2.13),
    ``"1 MiB"`` (an explicit cap with a 1 MiB first bucket: older releases), ``"unset"``
    (the job ran with DDP's default, 25 MiB after a 1 MiB first bucket, which says
    nothing of explicit caps), ``"either"`` when the cap rule and another fit, None when
    none does.

    A bucket closed by its last gradient held at least its limit, and less before it:
    each bucket bounds its limit to ``(held - last, held]`` (the last bucket only from
    below); the buckets after the first share one limit, the cap.
    """
    held: dict[int, float] = {}
    last: dict[int, float] = {}
    for size, bucket in zip(sizes, assignment, strict=True):
        held[bucket] = held.get(bucket, 0.0) + size
        last[bucket] = size
    final = max(held)

    def bounds(ids: Sequence[int]) -> tuple[float, float]:
        low = max((held[b] - last[b] for b in ids), default=0.0)
        high = min((held[b] for b in ids if b != final), default=float("inf"))
        return low, high

    low, high = bounds(list(held))
    rest_low, rest_high = bounds([b for b in held if b != 0])
    first_low, first_high = bounds([0])
    as_cap = low < high
    fixed = first_low < FIRST_BUCKET_BYTES <= first_high and rest_low < rest_high
    unset = fixed and rest_low < DEFAULT_CAP_MB * MIB <= rest_high
    if as_cap:
        return "either" if fixed else "cap"
    return "unset" if unset else "1 MiB" if fixed else None


def _bucket_ready(work: np.ndarray, ids: np.ndarray, count: int) -> np.ndarray:
    ready = np.zeros(count)
    np.maximum.at(ready, ids, work)
    return ready


def replay(
    work: np.ndarray,
    ids: np.ndarray,
    sizes: np.ndarray,
    network: NetworkModel,
    kappa: float,
    lanes: int = 1,
    copy_rate: float = 0.0,
    kappa_backward: float | None = None,
) -> float:
    """When the backward pass, the last all-reduce and DDP's copies of the buckets back
    into the gradients are done, from the step start.

    `work` is each gradient's ready time with no collective in flight. The buckets'
    all-reduces start in order, up to `lanes` at once (gloo runs two worker threads,
    NCCL one stream); each first pays the latency ``a`` (in parallel), then its bytes
    share the link (``b`` per byte, processor-shared). While a collective overlaps the
    backward pass both progress at ``1/kappa`` of their speed (see the module doc), the
    backward pass at ``1/kappa_backward`` when that is given.
    When the backward pass ends, DDP copies each bucket back into the gradients in
    order, once its all-reduce is done (``copy_bucket_to_grad``), `copy_rate` seconds
    a byte.
    """
    count = int(ids.max()) + 1
    marks = _bucket_ready(work, ids, count)
    nbytes = np.bincount(ids, weights=sizes, minlength=count)
    end = float(work.max())
    t, done, nxt = 0.0, 0.0, 0  # time, backward work done, next bucket to start
    active: list[list[float]] = []  # [latency left, bandwidth time left, bucket]
    ends = np.zeros(count)  # each bucket's all-reduce end
    backward_end = None
    eps = 1e-12
    while True:
        while len(active) < lanes and nxt < count and marks[nxt] <= done + eps:
            active.append([network.a, network.b * float(nbytes[nxt]), nxt])
            nxt += 1
        computing = done < end - eps
        if not computing and backward_end is None:
            backward_end = t
        if not active and not computing:
            copied = float(backward_end)
            for k in range(count):
                copied = max(copied, float(ends[k])) + copy_rate * float(nbytes[k])
            return max(t, copied)
        both = bool(active) and computing
        slow = 1.0 / kappa if both else 1.0
        slow_backward = (1.0 / (kappa if kappa_backward is None else kappa_backward)
                         if both else 1.0)  # fmt: skip
        sharing = sum(1 for lat, *_ in active if lat <= eps) or 1
        rates = [slow if lat > eps else slow / sharing for lat, *_ in active]
        # the next event: a latency or a transfer ends, the backward pass ends, or (a
        # lane free) the next bucket's last gradient is ready
        target = end if len(active) == lanes or nxt >= count else min(marks[nxt], end)
        dt = (target - done) / slow_backward if computing else np.inf
        for (lat, rest, _), rate in zip(active, rates, strict=True):
            dt = min(dt, (lat if lat > eps else rest) / rate)
        t += dt
        if computing:
            done = min(end, done + dt * slow_backward)
        for item, rate in zip(active, rates, strict=True):
            if item[0] > eps:
                item[0] -= dt * rate
            else:
                item[1] -= dt * rate
            if item[0] <= eps and item[1] <= eps:
                ends[int(item[2])] = t
        active = [x for x in active if x[0] > eps or x[1] > eps]


def decontend(ready: np.ndarray, busy: Sequence[tuple[float, float]], kappa: float) -> np.ndarray:
    """The backward work behind traced ready times: time with a collective in flight
    (the union `busy`) counted at ``1/kappa``. The definition for one rank; the sweep
    computes it for all ranks of a step at once (`backward_work`)."""
    if kappa == 1.0 or not busy:
        return ready.copy()
    out = ready.copy()
    for start, end in busy:
        out -= (1.0 - 1.0 / kappa) * np.clip(np.minimum(ready, end) - start, 0.0, None)
    return out


def _union(spans: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


@dataclass(frozen=True)
class Step:
    """One traced step of one rank: gradient ready times and the union of its collective
    spans (seconds from the step start), the tail and the step time; the time DDP spent
    copying buckets back into the gradients in the step (`copy`) and, of that, in the
    tail (`copy_tail`)."""

    ready: np.ndarray
    busy: list[tuple[float, float]]
    tail: float
    measured: float
    copy: float = 0.0
    copy_tail: float = 0.0


@dataclass(frozen=True)
class Profile:
    """What the sweep needs from a trace: per step the ranks' `Step`s, gradient sizes in
    ready order, the traced buckets (bytes, launch order) and whether ranks are CPU-only."""

    steps: dict[int, list[Step]]
    sizes: np.ndarray
    observed_buckets: np.ndarray
    cpu: bool
    lanes: int  # the most collectives a rank ever had in flight at once
    # kappa -> per step the latest rank's backward work per gradient (`backward_work`)
    work: dict[float, list[np.ndarray]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @property
    def measured(self) -> float:
        """The median over steps of the latest rank's step time."""
        return float(np.median([max(s.measured for s in v) for v in self.steps.values()]))

    @property
    def copy_rate(self) -> float:
        """Seconds a byte of DDP's copy of the buckets back into the gradients: the median
        over steps and ranks of the step's copying time over the gradients' bytes."""
        total = float(self.sizes.sum())
        copies = [s.copy for v in self.steps.values() for s in v]
        return float(np.median(copies)) / total if copies and total > 0 else 0.0


def without_profiler(p: Profile, untraced: float) -> Profile:
    """`p` with the profiler's own cost taken out: each step's times scaled so that the
    median step takes `untraced` (the job's step time without the profiler, at the
    traced configuration), the cost spread evenly over the step; `ValueError` when the
    two are more than 2x apart."""
    if not 0.5 <= untraced / p.measured <= 2.0:
        raise ValueError(
            f"the untraced step time {untraced * 1e3:.1f} ms is more than 2x from the traced "
            f"steps' {p.measured * 1e3:.1f} ms: not the traced configuration"
        )
    cost = p.measured - untraced
    steps = {}
    for step, ranks in p.steps.items():
        scaled = []
        for s in ranks:
            f = max(0.5, 1.0 - cost / s.measured)
            scaled.append(Step(s.ready * f, [(a * f, b * f) for a, b in s.busy], s.tail * f,
                               s.measured * f, s.copy * f, s.copy_tail * f))  # fmt: skip
        steps[step] = scaled
    return replace(p, steps=steps)


def step_times(
    p: Profile,
    buckets: Sequence[int],
    network: NetworkModel,
    kappa: float,
    kappa_backward: float | None = None,
) -> list[float]:
    """The predicted time of every traced step with gradients grouped as `buckets`: per
    gradient the latest rank's backward work, the latest rank's tail. The backward pass
    slows by `kappa_backward` where given, else by `kappa` as the collectives do."""
    ids = np.asarray(buckets)
    rate = p.copy_rate
    backward = kappa if kappa_backward is None else kappa_backward
    out = []
    for work, ranks in zip(backward_work(p, backward), p.steps.values(), strict=True):
        end = replay(work, ids, p.sizes, network, kappa, p.lanes, rate, kappa_backward)
        out.append(end + max(s.tail - s.copy_tail for s in ranks))
    return out


def backward_work(p: Profile, kappa: float) -> list[np.ndarray]:
    """Per step, the latest rank's backward work behind each gradient (`decontend`),
    kept in `p` per `kappa`: the sweep replays every cap at the same few kappas."""
    works = p.work.get(kappa)
    if works is None:
        works = p.work[kappa] = [_latest_work(ranks, kappa) for ranks in p.steps.values()]
    return works


def _latest_work(ranks: Sequence[Step], kappa: float) -> np.ndarray:
    """The largest over `ranks` of `decontend` of each rank's ready times, for all ranks at
    once: the ranks' spans padded with empty ones at infinity, which take exactly nothing
    off (the same floating-point result as one `decontend` per rank)."""
    ready = np.array([s.ready for s in ranks], dtype=np.float64)
    width = max(len(s.busy) for s in ranks)
    if kappa == 1.0 or width == 0:
        return ready.max(axis=0)
    starts = np.full((len(ranks), width, 1), np.inf)
    ends = np.full((len(ranks), width, 1), np.inf)
    for i, s in enumerate(ranks):
        if s.busy:
            starts[i, : len(s.busy), 0], ends[i, : len(s.busy), 0] = zip(*s.busy, strict=True)
    out, slow = ready.copy(), 1.0 - 1.0 / kappa
    for j in range(width):
        out -= slow * np.clip(np.minimum(ready, ends[:, j]) - starts[:, j], 0.0, None)
    return out.max(axis=0)


def profile(job: Job) -> Profile | None:
    """The sweep's inputs from a Kineto DDP job (None without gradient-ready events)."""
    ranks = job.meta.get("ranks") or {}
    with_ready = [r for r, m in ranks.items() if m.get("gradient_ready")]
    cpu = not any(
        op.resource.startswith("gpu") for g in job.graphs.values() for op in g.ops.values()
    )
    return join([rank_profile(job, r) for r in with_ready], cpu)


def rank_profile(job: Job, rank: str) -> Profile | None:
    """One rank's part of `profile` (its traced steps only; ``cpu`` its own); None without
    gradient-ready events or when its steps disagree on the gradients."""
    from planner.model.arrays import lanes as interval_lanes

    steps = rank_meta(job, rank).get("gradient_ready")
    if not steps:
        return None
    spans = job.trace.spans
    spans = spans[spans["rank"] == rank]
    span_of = {
        step: (start, end)
        for step, start, end in zip(
            spans["iteration"].tolist(), spans["start"].tolist(), spans["end"].tolist(),
            strict=True,
        )
    }  # fmt: skip
    mine = job.trace.timings
    mine = mine[mine["rank"] == rank]
    ops = mine["op"].tolist()
    is_copy = np.fromiter(("copy_bucket_to_grad" in op for op in ops), bool, len(ops))
    is_collective = np.fromiter(("all_reduce" in op for op in ops), bool, len(ops))
    iteration = mine["iteration"].to_numpy()
    start_ns = mine["start"].to_numpy()
    duration_ns = mine["duration"].to_numpy()
    by_step: dict[int, list[Step]] = {}
    sizes: list[int] | None = None
    lanes = 1
    for step, grads in steps.items():
        if int(step) not in span_of:
            continue
        if sizes is None:
            sizes = [g[1] for g in grads]
        if [g[1] for g in grads] != sizes:
            return None  # steps disagree on the gradients: no one ready order
        start, end = span_of[int(step)]
        times = np.array([g[0] for g in grads], dtype=np.float64)
        c = is_collective & (iteration == int(step))
        starts = start_ns[c].astype(np.float64)
        ends = (start_ns[c] + duration_ns[c]).astype(np.float64)
        last = max(times.max(), float(ends.max()) if len(ends) else 0.0)
        busy = _union(
            [((a - start) / 1e9, (b - start) / 1e9) for a, b in zip(starts, ends, strict=True)]
        )
        if len(starts):  # the most in flight at once: greedy interval partitioning
            lane = interval_lanes(np.zeros(len(starts)), starts, ends - starts)
            lanes = max(lanes, int(lane.max()) + 1)
        k = is_copy & (iteration == int(step))
        copy_starts = start_ns[k].astype(np.float64)
        copy_spans = duration_ns[k].astype(np.float64)
        by_step.setdefault(int(step), []).append(
            Step((times - start) / 1e9, busy, (end - last) / 1e9, (end - start) / 1e9,
                 float(copy_spans.sum()) / 1e9,
                 float(copy_spans[copy_starts >= last].sum()) / 1e9)
        )  # fmt: skip
    graph = job.graphs[rank]
    observed = sorted(
        (_bucket_index(op.param), op.nbytes)
        for op in graph.ops.values()
        if (op.param or "").startswith("bucket")
    )
    if not observed:  # no backward range to tell gradient buckets: the step's all-reduces
        observed = sorted(
            (int(op.name.rsplit("#", 1)[1]), op.nbytes)
            for op in graph.ops.values()
            if op.kind == "collective" and op.name.startswith("net/all_reduce#")
        )
    cpu = not any(op.resource.startswith("gpu") for op in graph.ops.values())
    return Profile(by_step, np.array(sizes or [], dtype=np.float64),
                   np.array([n for _, n in observed], dtype=np.float64), cpu, lanes)  # fmt: skip


def join(profiles: Sequence[Profile | None], cpu: bool) -> Profile | None:
    """The job's profile from its gradient-ready ranks' `rank_profile`s: their steps side
    by side, the most collectives in flight over them, the first traced rank's buckets;
    None when a rank's steps, or two ranks, disagree on the gradients (no one ready
    order) or no rank has a traced step. `cpu`: no rank of the job runs on a GPU."""
    if any(p is None for p in profiles):
        return None
    traced = [p for p in profiles if p is not None and p.steps]
    if not traced:
        return None
    first = traced[0]
    by_step: dict[int, list[Step]] = {}
    for p in traced:
        if not np.array_equal(p.sizes, first.sizes):
            return None
        for step, steps in p.steps.items():
            by_step.setdefault(step, []).extend(steps)
    lanes = max(p.lanes for p in traced)
    return Profile(by_step, first.sizes, first.observed_buckets, cpu, lanes)


def _bucket_index(param: str | None) -> int:
    return int(param[len("bucket") :]) if param and param.startswith("bucket") else -1


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
    return {
        "bucket_cap_mb": cap,
        "first_bucket_cap_mb": first,
        "buckets": int(max(ids)) + 1,
        "predicted_step_time": float(np.median(step_times(p, ids, network, kappa, kappa_backward))),
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
    if untraced_step_time is not None:
        p = without_profiler(p, untraced_step_time)
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
        "recommended_cap_mb": best["bucket_cap_mb"] if wins else None,
        "reason": reason,
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
             "recommended_cap_mb": None}  # fmt: skip
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
    }
