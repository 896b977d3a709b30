"""The DDP bucket advice's inputs from a trace: per traced step and rank, the gradients'
ready times, the collectives' spans, the tail and DDP's copies (`Step`), joined over the
ranks (`Profile`), and the profiler's own cost taken out (`without_profiler`). Apart
from the replay (`planner.planning.bucket_replay`) and the sweep
(`planner.planning.buckets`, whose docstring describes the model) because it is the
part that reads traces, once per rank (`planner.job.rank_analysis`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from planner.measure.foreign_load import forward_stretch
from planner.model.trace import Job, rank_meta
from planner.planning.scope import group_scope, scope_line


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
    # on ranks of several process groups: the groups it plans and leaves alone
    groups: dict[str, Any] | None = None
    # the most stretched rank's forward ops (`foreign_load.forward_stretch`): foreign load
    load: dict[str, Any] | None = None
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


def wire_share(compute: float, wire: float) -> float:
    """How far a step is bound by the wire rather than by its cores: 0 while the network
    model's time for its all-reduces (`wire`) is at most half its compute on the critical
    path, 1 from equal on, linear between. On a loopback faster than the cores can feed
    it (the lab unshaped: 0.2-0.35 of the compute) the all-reduces are CPU work on the
    same cores; on a shaped link (0.9 to 25 in the lab's grid) they are wire time."""
    if compute <= 0:
        return 0.0
    return float(min(1.0, max(0.0, 2.0 * wire / compute - 1.0)))


def step_compute(s: Step) -> float:
    """A traced step's compute on its critical path: the forward and backward passes up to
    the last gradient, and the tail."""
    return min(s.measured, float(s.ready.max(initial=0.0)) + s.tail)


def without_profiler(p: Profile, untraced: float, wire: float = 0.0) -> Profile:
    """`p` with the profiler's own cost taken out: each step loses the difference between
    the traced steps' median and `untraced` (the job's step time without the profiler,
    at the traced configuration); `ValueError` when the two are more than 2x apart.

    The profiler slows the ops it records, not a wire. Where a step's all-reduces are
    wire time (`wire_share` of `wire`, the network model's time for the step's traced
    buckets), the cost comes out of its compute on the critical path (`step_compute`);
    where they are CPU work on the same cores, it is spread over the whole step, as the
    profiler slows those too. Spread over the whole step at every rate, the cost came
    out of the all-reduces' time too: on the lab's link-bound MLP (130 Mbit/s, 20 ms of
    profiler cost in an 800 ms step that is mostly one all-reduce) every cap was
    predicted 5-8% slow (docs/validation.md)."""
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
            compute = step_compute(s)
            share = wire_share(compute, wire)
            taken = share * cost / compute if compute > 0 else 0.0
            f = max(0.5, 1.0 - taken - (1.0 - share) * cost / s.measured)
            measured = max(s.measured - cost, 0.5 * s.measured)
            scaled.append(Step(s.ready * f, [(a * f, b * f) for a, b in s.busy], s.tail * f,
                               measured, s.copy * f, s.copy_tail * f))  # fmt: skip
        steps[step] = scaled
    return replace(p, steps=steps)


def profile(job: Job) -> Profile | None:
    """The sweep's inputs from a Kineto DDP job's ranks (None without gradient-ready
    events); a job of one rank selected from its load (``--rank``) profiles that rank."""
    ranks = job.meta.get("ranks") or {}
    with_ready = [r for r, m in ranks.items() if m.get("gradient_ready") and r in job.graphs]
    cpu = not any(
        op.resource.startswith("gpu") for g in job.graphs.values() for op in g.ops.values()
    )
    return join([rank_profile(job, r) for r in with_ready], cpu)


SHARDED = frozenset({"reduce_scatter"})
"""Collective kinds of a job that shards its gradients (FSDP, ZeRO): no DDP buckets."""


def ddp_buckets(job: Job, rank: str) -> bool:
    """Whether the rank's gradients go out as DDP's bucket all-reduces: it has
    all-reduces and reduces no gradient by reduce-scatter (FSDP, ZeRO), by the kinds
    the ingest gave its collectives (rank meta ``collectives``), else by their names."""
    graph = job.graphs[rank]
    called = rank_meta(job, rank).get("collectives") or {}
    kinds = {
        (called.get(op.name) or {}).get("kind") or _named_kind(op.name)
        for op in graph.ops.values()
        if op.kind == "collective"
    }
    return "all_reduce" in kinds and not kinds & SHARDED


def _named_kind(name: str) -> str:
    """``net:3/all_gather#2`` -> ``all_gather``."""
    return name.rsplit("/", 1)[-1].split("#", 1)[0]


def rank_profile(job: Job, rank: str) -> Profile | None:
    """One rank's part of `profile` (its traced steps only; ``cpu`` its own); None without
    gradient-ready events, without DDP bucket all-reduces (`ddp_buckets`: an FSDP job
    reduce-scatters its gradients, and a bucket cap sets nothing there) or when its
    steps disagree on the gradients."""
    from planner.model.arrays import lanes as interval_lanes

    steps = rank_meta(job, rank).get("gradient_ready")
    if not steps or not ddp_buckets(job, rank):
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
    is_collective, groups = _bucket_rows(job, rank, ops)
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
                   np.array([n for _, n in observed], dtype=np.float64), cpu, lanes,
                   groups, forward_stretch(job, rank))  # fmt: skip


def _bucket_rows(job: Job, rank: str, ops: list[str]) -> tuple[np.ndarray, dict[str, Any] | None]:
    """(per row of `ops`: a collective the advice sizes, the process groups it plans and
    leaves alone): every all-reduce on a rank of one group, else the data-parallel
    group's collectives only (`scope.group_scope`)."""
    scope = group_scope(job.graphs[rank], rank_meta(job, rank))
    if scope is None:
        return np.fromiter(("all_reduce" in op for op in ops), bool, len(ops)), None
    planned = set(scope["planned"])
    groups = {"groups": scope["groups"], "left_alone": scope["left_alone"],
              "note": scope_line(scope)}  # fmt: skip
    return np.fromiter((op in planned for op in ops), bool, len(ops)), groups


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
    loads = [p.load for p in traced if p.load is not None]
    load = max(loads, key=lambda s: s["stretch"]) if loads else None
    return Profile(by_step, first.sizes, first.observed_buckets, cpu, lanes, first.groups, load)


def _bucket_index(param: str | None) -> int:
    return int(param[len("bucket") :]) if param and param.startswith("bucket") else -1
