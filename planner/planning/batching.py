"""Caramel's batching threshold and small-parameter batcher (Caramel §4.2).

Threshold: the least size x with ``f(2x) / (2 f(x)) > 0.8``, for the fitted network
model ``f(d) = a + b*d``: sending two x-byte parameters as one costs more than 80% of
sending them apart, so batching beyond x saves little. For a linear f the condition
is ``(a + 2bx) / (2a + 2bx) > 0.8``, i.e. ``x > 1.5 a / b``.

Batcher: parameters in order of expected activation (ready time). A parameter of at
least the threshold goes alone. A smaller one joins the open batch; the batch is sent
when its bytes reach the threshold, or when the network queue would go idle before
the next parameter is ready (nothing to wait for: sending now costs no overlap).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from planner.model.oracle import NetworkModel, fit_network_model

BATCH_RATIO = 0.8
"""Caramel §4.2: batching stops paying once f(2x)/(2f(x)) exceeds this."""


def threshold_bound(network: NetworkModel, ratio: float = BATCH_RATIO) -> float:
    """The real x0 with ``f(2x)/(2f(x)) > ratio`` exactly for x > x0 (linear f).

    ``(a + 2bx) > 2 ratio (a + bx)`` gives ``x > a (2 ratio - 1) / (2 b (1 - ratio))``
    (``1.5 a / b`` at 0.8). +inf when b = 0 (a size-independent cost: always batch).
    """
    if not 0.5 < ratio < 1.0:
        raise ValueError(f"ratio must be in (0.5, 1), got {ratio}")
    if network.b <= 0:
        return math.inf
    return network.a * (2 * ratio - 1) / (2 * network.b * (1 - ratio))


def threshold_bytes(network: NetworkModel, ratio: float = BATCH_RATIO) -> int | None:
    """The least whole number of bytes above `threshold_bound` (None when unbounded)."""
    bound = threshold_bound(network, ratio)
    if math.isinf(bound):
        return None
    return max(1, math.floor(bound) + 1)


def threshold_search(
    f: Callable[[float], float], ratio: float = BATCH_RATIO, hi: int = 1 << 50
) -> int | None:
    """Least integer x in [1, hi] with ``f(2x)/(2f(x)) > ratio``, by bisection.

    For any f whose ratio grows with x (true for a + b*d with a, b >= 0); the check of
    the closed form, and the threshold of a model that is not linear.
    """

    def ok(x: int) -> bool:
        return f(2 * x) > ratio * 2 * f(x)

    if not ok(hi):
        return None
    lo = 1
    if ok(lo):
        return lo
    while hi - lo > 1:  # invariant: not ok(lo), ok(hi)
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def fit_report(nbytes: Sequence[float], seconds: Sequence[float]) -> dict[str, object]:
    """The fit of f(d) = a + b*d with R^2, residuals, threshold and depth table.

    Raises ValueError with fewer than two distinct sizes.
    """
    from planner.planning.depth import depth_table

    x = np.asarray(nbytes, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    model = fit_network_model(x, y)
    if model is None:
        raise ValueError("the fit needs at least two distinct message sizes")
    residual = y - np.array([model.time(v) for v in x])
    limit = threshold_bytes(model)
    return {
        "schema": "planner.network_model/1",
        "a": model.a,
        "b": model.b,
        "r2": model.r2,
        "points": model.points,
        "bandwidth_bytes_per_s": 1.0 / model.b if model.b > 0 else None,
        "residuals": [
            {"nbytes": int(n), "seconds": float(s), "predicted": float(s - r), "residual": float(r)}
            for n, s, r in zip(x, y, residual, strict=True)
        ],
        "residual_max_abs": float(np.abs(residual).max()) if len(residual) else 0.0,
        "ratio": BATCH_RATIO,
        "threshold_bytes": limit,
        "depth_table": depth_table(limit),
    }


@dataclass(frozen=True)
class Batch:
    """One group the network sends as a single transfer.

    `ready`: when its last parameter is expected to be ready (seconds, same clock as
    the inputs); `send`: when the batcher's queue model starts it; `end` = send + f.
    """

    params: tuple[str, ...]
    nbytes: int
    ready: float
    send: float
    end: float


def batch(
    order: Sequence[str],
    nbytes: Mapping[str, int],
    ready: Mapping[str, float],
    network: NetworkModel | None,
    threshold: int | None,
) -> list[Batch]:
    """Caramel's batcher over parameters in activation order (see module docstring).

    `threshold` None means no batching (every parameter alone); `network` None gives
    zero-length transfers (the queue then always goes idle, so batches never grow).
    Batches come out in the order they are sent.
    """
    f = network.time if network is not None else (lambda _d: 0.0)
    params = sorted(order, key=lambda p: ready[p])  # stable: activation order on ties
    out: list[Batch] = []
    net_free = 0.0
    open_params: list[str] = []
    open_bytes = 0

    def send(members: list[str], size: int) -> None:
        nonlocal net_free
        when = max(max(ready[m] for m in members), net_free)
        net_free = when + f(size)
        out.append(Batch(tuple(members), size, max(ready[m] for m in members), when, net_free))

    for k, p in enumerate(params):
        size = int(nbytes[p])
        if threshold is None or size >= threshold:
            send([p], size)
            continue
        open_params.append(p)
        open_bytes += size
        next_ready = ready[params[k + 1]] if k + 1 < len(params) else math.inf
        idle_before_next = max(net_free, ready[p]) < next_ready
        if open_bytes >= threshold or idle_before_next:
            send(open_params, open_bytes)
            open_params, open_bytes = [], 0
    if open_params:
        send(open_params, open_bytes)
    return out
