"""DDP's buckets and their replay: how DDP fills its buckets (`ddp_buckets`, which
first-bucket rule a trace followed: `first_bucket_rule`), and the time of a step with
the gradients grouped in given buckets (`replay` of one step, `step_times` of every
traced step of a `Profile`), with the backward pass and the collectives slowing each
other by ``kappa`` (`decontend`, `backward_work`). The model is described in
`planner.planning.buckets`, which sweeps the caps with it; apart from it so that the
replay can be read alone.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from planner.model.oracle import NetworkModel
from planner.planning.bucket_profile import Profile, Step

MIB = 1 << 20
FIRST_BUCKET_BYTES = 1 * MIB
"""DDP's first bucket limit with the cap unset (``dist._DEFAULT_FIRST_BUCKET_BYTES``)."""
DEFAULT_CAP_MB = 25.0
"""DDP's ``bucket_cap_mb`` when unset."""


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
    hook: float = 0.0,
    hook_rate: float = 0.0,
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
    a byte. With `hook` (s), each bucket goes through planner's DDP hook, whose call (and
    its pass over the bucket's bytes, `hook_rate` seconds a byte) runs on the backward
    pass's thread once the bucket's last gradient is ready
    (`planner.planning.hook_calls`): the bucket's all-reduce starts after it, and every
    later gradient is that much later.
    """
    count = int(ids.max()) + 1
    nbytes = np.bincount(ids, weights=sizes, minlength=count)
    marks = _bucket_ready(work, ids, count)
    end = float(work.max())
    if hook:  # each gradient after the hook calls of the buckets before its own
        cost = hook + hook_rate * nbytes
        before = np.cumsum(cost) - cost
        work = work + before[ids]
        marks = _bucket_ready(work, ids, count) + cost
        end = max(float(work.max()), float(marks.max()))
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


def step_times(
    p: Profile,
    buckets: Sequence[int],
    network: NetworkModel,
    kappa: float,
    kappa_backward: float | None = None,
    hook: float = 0.0,
) -> list[float]:
    """The predicted time of every traced step with gradients grouped as `buckets`: per
    gradient the latest rank's backward work, the latest rank's tail. The backward pass
    slows by `kappa_backward` where given, else by `kappa` as the collectives do.
    `hook`: each bucket through planner's DDP hook, at that many seconds a call and a
    pass over its bytes at the rate of DDP's copies (`Profile.copy_rate`)."""
    ids = np.asarray(buckets)
    rate = p.copy_rate
    backward = kappa if kappa_backward is None else kappa_backward
    out = []
    for work, ranks in zip(backward_work(p, backward), p.steps.values(), strict=True):
        end = replay(
            work, ids, p.sizes, network, kappa, p.lanes, rate, kappa_backward, hook,
            rate if hook else 0.0,
        )  # fmt: skip
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
