"""DDP bucket advice: the iteration time predicted for each ``bucket_cap_mb``.

DDP rebuilds its gradient buckets after the first iteration in gradient-ready order:
it adds gradients to a bucket until the bucket holds at least its limit (1 MiB for the
first bucket, ``first_bucket_cap``; ``bucket_cap_mb`` for the rest), then opens the
next. A bucket's all-reduce is launched when its last gradient is ready, in bucket
order, and the all-reduces share one channel, each taking ``f(bytes)`` of the network
model (`planner.oracle.NetworkModel`).

The step time of a cap is ``max(last gradient ready, last all-reduce end) + tail``:
the gradients' ready times (``torch::autograd::AccumulateGrad`` ends, relative to the
step start; per gradient the latest over the ranks, since a bucket's all-reduce waits
for its slowest rank) and the ``tail`` after the last all-reduce (optimizer, the next
step's start) are measured in the trace; only the buckets and their all-reduces
change with the cap. The same model run on the observed buckets gives the replay
error printed beside every prediction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from planner.oracle import NetworkModel
from planner.trace import Job

MIB = 1 << 20
FIRST_BUCKET_BYTES = 1 * MIB
"""DDP's first bucket limit (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``)."""
DEFAULT_CAPS_MB: tuple[float, ...] = (0.25, 0.5, 1, 2, 4, 8, 16, 25, 50, 100)
MIN_GAIN = 0.02
"""A cap is recommended only when it is predicted faster than the traced buckets by more
than this and by more than the replay error of the traced buckets."""


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


def comm_end(ready: np.ndarray, nbytes: np.ndarray, network: NetworkModel) -> float:
    """When the last all-reduce ends: buckets launched in order, one at a time."""
    free = 0.0
    for r, n in zip(ready.tolist(), nbytes.tolist(), strict=True):
        free = max(free, r) + network.time(n)
    return free


@dataclass(frozen=True)
class Profile:
    """What the sweep needs from a trace: gradients in ready order (seconds from the
    step start, latest over ranks; bytes), the tail, and the measured step time."""

    ready: np.ndarray
    sizes: np.ndarray
    tail: float
    measured: float
    observed_buckets: np.ndarray  # bytes of the traced buckets, in launch order
    steps: int


def step_time(p: Profile, buckets: Sequence[int], network: NetworkModel) -> float:
    """The predicted step time with gradients grouped as `buckets` (one id each)."""
    ids = np.asarray(buckets)
    count = int(ids.max()) + 1
    ready = np.zeros(count)
    np.maximum.at(ready, ids, p.ready)
    nbytes = np.bincount(ids, weights=p.sizes, minlength=count)
    return max(float(p.ready.max()), comm_end(ready, nbytes, network)) + p.tail


def profile(job: Job) -> Profile | None:
    """The sweep's inputs from a Kineto DDP job (None without gradient-ready events).

    Per step, a gradient's ready time is the latest over the ranks (from each rank's
    step start); over steps, the median. The tail and the step time likewise: the
    latest rank per step, the median over steps.
    """
    ranks = job.meta.get("ranks") or {}
    per_rank = {r: m.get("gradient_ready") for r, m in ranks.items() if m.get("gradient_ready")}
    if not per_rank:
        return None
    spans = job.trace.spans.set_index(["rank", "iteration"])
    t = job.trace.timings
    by_step: dict[int, list[tuple[np.ndarray, float, float]]] = {}
    sizes: list[int] | None = None
    for rank, steps in per_rank.items():
        for step, grads in steps.items():
            if (rank, int(step)) not in spans.index:
                continue
            if sizes is None:
                sizes = [g[1] for g in grads]
            if [g[1] for g in grads] != sizes:
                return None  # steps or ranks disagree on the gradients: no one ready order
            start, end = spans.loc[(rank, int(step))][["start", "end"]].tolist()
            times = np.array([g[0] for g in grads], dtype=np.float64)
            c = t[(t["rank"] == rank) & (t["iteration"] == int(step))]
            c = c[c["op"].str.contains("all_reduce", regex=False)]
            last = max(times.max(), float((c["start"] + c["duration"]).max()) if len(c) else 0.0)
            by_step.setdefault(int(step), []).append(
                ((times - start) / 1e9, (end - last) / 1e9, (end - start) / 1e9)
            )
    if not by_step or sizes is None:
        return None
    ready = np.median([np.max([r for r, _, _ in v], axis=0) for v in by_step.values()], axis=0)
    tail = float(np.median([max(x for _, x, _ in v) for v in by_step.values()]))
    measured = float(np.median([max(x for _, _, x in v) for v in by_step.values()]))
    graph = job.graphs[next(iter(per_rank))]
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
    return Profile(ready, np.array(sizes, dtype=np.float64), tail, measured,
                   np.array([n for _, n in observed], dtype=np.float64), len(by_step))  # fmt: skip


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


def sweep(
    job: Job,
    network: NetworkModel,
    caps_mb: Sequence[float] = DEFAULT_CAPS_MB,
    first_cap: int = FIRST_BUCKET_BYTES,
) -> dict[str, Any] | None:
    """``planner.bucket_sweep/1``: the predicted step time per cap, the recommended cap,
    and the observed configuration's replay error; None without gradient-ready times."""
    p = profile(job)
    if p is None:
        return None
    observed = _observed_assignment(p)
    replay = step_time(p, observed, network) if observed is not None else None
    rows = []
    for cap in caps_mb:
        buckets = ddp_buckets(p.sizes.tolist(), int(cap * MIB), first_cap)
        rows.append(
            {
                "bucket_cap_mb": cap,
                "buckets": int(max(buckets)) + 1,
                "predicted_step_time": step_time(p, buckets, network),
            }
        )
    best = min(rows, key=lambda r: (r["predicted_step_time"], -r["bucket_cap_mb"]))
    error = replay / p.measured - 1 if replay is not None else None
    gain = replay / best["predicted_step_time"] - 1 if replay is not None else None
    margin = max(abs(error), MIN_GAIN) if error is not None else None
    if gain is None:
        reason = "the traced buckets do not split the gradients in ready order: no replay"
        recommended = None
    elif gain <= margin:
        reason = (
            f"no cap is predicted to beat the traced buckets by more than the model's error "
            f"({gain:.1%} <= {margin:.1%}): keep the observed configuration"
        )
        recommended = None
    else:
        reason = f"predicted {gain:.1%} faster than the traced buckets (replay error {error:+.1%})"
        recommended = best["bucket_cap_mb"]
    return {
        "schema": "planner.bucket_sweep/1",
        "first_bucket_cap_mb": first_cap / MIB,
        "gradients": len(p.sizes),
        "gradient_bytes": int(p.sizes.sum()),
        "steps": p.steps,
        "measured_step_time": p.measured,
        "observed_buckets": p.observed_buckets.astype(int).tolist(),
        "observed_predicted_step_time": replay,
        "replay_error": error,
        "network": {"a": network.a, "b": network.b, "r2": network.r2},
        "caps": rows,
        "best_cap_mb": best["bucket_cap_mb"],
        "best_gain": gain,
        "recommended_cap_mb": recommended,
        "reason": reason,
    }
