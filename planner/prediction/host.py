"""Processors a job's ops share evenly: one host core of its processes, a PS's links.

A TensorFlow job whose PS and workers run as processes on one host share its cores with
each other. Where the host gave them one core between them (a container limited to one
CPU, a core pinned, the other cores busy), an op of one process that is ready waits while
another process's ops hold the core, and an op that started is stalled while they run:
``generated/tf/cnn_ps_ingraph`` worker0 step 6 waited 4.4 ms for worker1's backward
pass, and its `Conv2DBackpropFilter` of 0.8 ms took 10.3 ms in step 4 while worker1 ran
its forward pass. A replay that runs each process on its own threads starts both at once.

`one_core` tells such a job from its records: wherever ops of two processes ran at once,
their progress (each op's shortest duration in any step over its duration here) never
added up to more than one core. `on_one_core` then puts the replayed rank's compute
ops, the PS work joined with them and the other workers' compute ops (from their
records of the same step, released at their traced start as a peer's collective is)
on one resource, `HOST`, and `shared_schedule` replays it as one processor shared
evenly by the ops on it, each needing its share of the core in the step (`shares`),
not its stretched duration. Replayed with its own waits, a step runs as it ran.

On a job with cores to spare, a PS's link (`link_of`) is such a processor for the
transfers to and from it: gRPC serves every worker's reads of the PS's variables and
takes their gradients in the PS's one process, so a read answered late shares the link
with the others for less time and ends about when they do
(``traces/tf/mlp_ps_ingraph/run2`` worker1 step 5: its 16 MB read of `MatMul_1`
answered 5.1 ms after worker0's, both ended within 1.2 ms). `on_links` puts each
worker's transfers and the other workers' transfers of the same step on their link,
each needing its share of the link in the step. The link is shared by connections, not
by transfers (`flows`): each worker's gRPC connection to the PS gets an even part of it,
however many of the worker's transfers are in flight, and its transfers split that part.
A worker whose reads a plan chains one at a time (`planner.prediction.enforced`) then
still gets half of a link its peer shares, not one share in twelve.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from planner.model.graph import Op, OpGraph, build_graph

HOST = "(host core)"
LINK = "(link) "  # a PS's link, shared by its transfers to and from all workers
ONE_CORE_RATE = 1.2  # the most progress two processes' ops may add up to on one core
MIN_OVERLAP = 0.05  # share of the busy time with two processes running that decides it
MIN_ONE_CORE = 0.9  # share of that time within ONE_CORE_RATE that says one core


def on_host(op: Op) -> bool:
    """Whether `op` runs on the host's cores: a compute op of a CPU device (not a
    transfer, not a GPU kernel)."""
    return not op.is_transfer and "CPU" in op.resource.upper()


def process_of(resource: str) -> str:
    """The process a compute resource belongs to (``worker0/CPU:0`` -> ``worker0``)."""
    return resource.split("/", 1)[0]


def compute_records(job: Any, frame: pd.DataFrame) -> pd.DataFrame:
    """Every compute record of the job once: each rank's own and the PS work joined for
    the replay (``Job.meta["replay"]``), with columns iteration, op, start, duration,
    process (the PS rows appear once though joined with several workers)."""
    parts = []
    for rank in job.ranks:
        graph = job.graphs[rank]
        rows = frame[frame["rank"] == rank]
        compute = [n for n, op in graph.ops.items() if on_host(op)]
        mine = rows[rows["op"].isin(compute)]
        parts.append(
            pd.DataFrame(
                {
                    "iteration": mine["iteration"].to_numpy(),
                    "op": [f"{rank}:{o}" for o in mine["op"]],
                    "start": mine["start"].to_numpy(dtype=np.int64),
                    "duration": mine["duration"].to_numpy(dtype=np.int64),
                    "process": [process_of(graph.ops[o].resource) for o in mine["op"]],
                }
            )
        )
    joint = job.meta.get("replay") if isinstance(job.meta, Mapping) else None
    if joint:
        ps = pd.DataFrame(
            list(joint.get("rows", ())), columns=["rank", "iteration", "op", "start", "duration"]
        ).drop_duplicates(["iteration", "op"])
        if len(ps):
            parts.append(
                pd.DataFrame(
                    {
                        "iteration": ps["iteration"].to_numpy(),
                        "op": ps["op"].to_numpy(),
                        "start": ps["start"].to_numpy(dtype=np.int64),
                        "duration": ps["duration"].to_numpy(dtype=np.int64),
                        "process": [o.split(":", 1)[0] for o in ps["op"]],
                    }
                )
            )
    if not parts:
        return pd.DataFrame(columns=["iteration", "op", "start", "duration", "process"])
    return pd.concat(parts, ignore_index=True)


def _segments(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The elementary segments between the intervals' ends (their bounds) and how many
    intervals run in each."""
    bounds = np.unique(np.concatenate([start, end]))
    running = np.zeros(len(bounds), dtype=np.int64)
    np.add.at(running, np.searchsorted(bounds, start), 1)
    np.add.at(running, np.searchsorted(bounds, end), -1)
    return bounds, np.cumsum(running)[:-1]


def _per_segment(k: int, first: np.ndarray, last: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Per elementary segment of `k` bounds the summed weight of the intervals running in
    it (interval i covers the segments from bound `first[i]` to bound `last[i]`)."""
    total = np.zeros(k)
    np.add.at(total, first, weight)
    np.add.at(total, last, -weight)
    return np.cumsum(total)[:-1]


def shares(
    start: np.ndarray,
    duration: np.ndarray,
    since: int | None = None,
    flow: np.ndarray | None = None,
) -> np.ndarray:
    """Per interval its share of one processor: the integral over it (from `since` on,
    when given) of its rate: 1 / (flows running) / (its flow's intervals running); one
    flow without `flow` (so 1 / intervals running). They add up to the union of the
    intervals: the processor's busy time is kept, split evenly among the flows that
    held it at once, a flow's part evenly among its intervals."""
    start = np.asarray(start, dtype=np.int64)
    end = start + np.asarray(duration, dtype=np.int64)
    if not len(start):
        return np.zeros(0)
    begin = start if since is None else np.clip(start, since, end)
    bounds = np.unique(np.concatenate([start, end]))
    first, last = np.searchsorted(bounds, start), np.searchsorted(bounds, end)
    ones = np.ones(len(start))
    labels = np.zeros(len(start), dtype=np.int64) if flow is None else pd.factorize(flow)[0]
    groups = [labels == k for k in range(int(labels.max()) + 1)]
    per_flow = [_per_segment(len(bounds), first[m], last[m], ones[m]) for m in groups]
    flows = np.sum([n > 0.5 for n in per_flow], axis=0)
    out = np.zeros(len(start))
    for m, running in zip(groups, per_flow, strict=True):
        rate = np.where(running > 0.5, 1.0 / np.maximum(running * flows, 1), 0.0)
        cumulative = np.concatenate([[0.0], np.cumsum(rate * np.diff(bounds))])
        out[m] = np.interp(end[m], bounds, cumulative) - np.interp(begin[m], bounds, cumulative)
    return out


def one_core(job: Any, frame: pd.DataFrame) -> dict[str, float] | None:
    """Evidence that the job's processes shared one core, or None: over the time in
    which ops of two or more processes ran at once (at least `MIN_OVERLAP` of the busy
    time), the share in which their progress added up to at most `ONE_CORE_RATE` cores
    (at least `MIN_ONE_CORE`). An op's progress is its shortest duration over the steps
    over its duration in this one (1: ran at full speed)."""
    joint = job.meta.get("replay") if isinstance(job.meta, Mapping) else None
    if job.framework != "tensorflow" or not joint:
        return None
    records = compute_records(job, frame)
    records = records[records["duration"] > 0]
    if not len(records):
        return None
    fastest = records.groupby("op")["duration"].transform("min").to_numpy(dtype=np.float64)
    progress = fastest / records["duration"].to_numpy(dtype=np.float64)
    overlap = within = busy = 0.0
    for _, step in records.assign(progress=progress).groupby("iteration"):
        start = step["start"].to_numpy(dtype=np.int64)
        end = start + step["duration"].to_numpy(dtype=np.int64)
        bounds, running = _segments(start, end)
        length = np.diff(bounds).astype(np.float64)
        busy += float(length[running > 0].sum())
        first, last = np.searchsorted(bounds, start), np.searchsorted(bounds, end)
        rate = _per_segment(len(bounds), first, last, step["progress"].to_numpy())
        process = pd.factorize(step["process"])[0]
        processes = sum(
            _per_segment(len(bounds), first, last, (process == p).astype(np.float64)) > 0.5
            for p in range(process.max() + 1)
        )
        both = processes >= 2
        overlap += float(length[both].sum())
        within += float(length[both & (rate <= ONE_CORE_RATE + 1e-9)].sum())
    if busy <= 0 or overlap < MIN_OVERLAP * busy or within < MIN_ONE_CORE * overlap:
        return None
    return {"overlap": overlap / busy, "within_one_core": within / overlap}


def on_one_core(
    job: Any,
    rank: str,
    graph: OpGraph,
    rows: pd.DataFrame,
    release: Mapping[int, np.ndarray] | None,
    frame: pd.DataFrame,
    spans: Mapping[int, tuple[int, int]],
) -> tuple[OpGraph, pd.DataFrame, dict[int, np.ndarray]]:
    """`rank`'s replay graph, records and releases (as `planner.prediction.releases.joint_work`
    gives them) on one host core: its compute ops and the joined PS work moved to
    `HOST`, the other ranks' compute ops added on it (``(host) rank:op``, no edges,
    released at their traced start), and a ``work`` column: each such record's share
    of the core (`shares`, over every process's records of the step). Transfers and GPU
    kernels (`on_host`) keep their resources and durations."""
    return _shared(
        job, rank, graph, rows, release, frame, spans, "(host) ",
        lambda op: HOST if on_host(op) else None,
    )  # fmt: skip


def link_of(resource: str) -> str | None:
    """The PS link a TF transfer runs through, both ways (``worker1<-ps0`` and
    ``worker1->ps0``: ``(link) ps0``); None for any other resource."""
    for arrow in ("<-", "->"):
        if arrow in resource:
            return f"{LINK}{resource.split(arrow, 1)[1]}"
    return None


def on_links(
    job: Any,
    rank: str,
    graph: OpGraph,
    rows: pd.DataFrame,
    release: Mapping[int, np.ndarray] | None,
    frame: pd.DataFrame,
    spans: Mapping[int, tuple[int, int]],
) -> tuple[OpGraph, pd.DataFrame, dict[int, np.ndarray]]:
    """`rank`'s replay graph, records and releases with each PS link (`link_of`) one
    processor shared by every worker's transfers through it: the rank's transfers moved
    to their link, the other ranks' transfers through it added (``(link) rank:op``, no
    edges, released at their traced start), and a ``work`` column: each transfer's
    share of its link in the step (`shares`)."""
    return _shared(
        job, rank, graph, rows, release, frame, spans, "(link) ",
        lambda op: link_of(op.resource) if op.is_transfer else None,
    )  # fmt: skip


def _shared(
    job: Any,
    rank: str,
    graph: OpGraph,
    rows: pd.DataFrame,
    release: Mapping[int, np.ndarray] | None,
    frame: pd.DataFrame,
    spans: Mapping[int, tuple[int, int]],
    tag: str,
    place: Callable[[Op], str | None],
) -> tuple[OpGraph, pd.DataFrame, dict[int, np.ndarray]]:
    """`on_one_core` and `on_links`: the ops `place` puts on a shared processor moved
    there, the other ranks' such ops added (named `tag` + ``rank:op``, released at their
    traced start) and each such record's share of its processor in the step as its
    ``work``. The step's replay begins at the rank's first record on them (or the
    step's span, if earlier): the other ranks' work before it is theirs alone, and what
    an op straddling it had left is kept."""
    ops = {}
    targets: set[str] = set()  # the shared processors this placement fills
    for name, op in graph.ops.items():
        where = place(op)
        ops[name] = op if where is None else replace(op, resource=where)
        if where is not None:
            targets.add(where)
    if not targets:  # nothing of the rank's to share: its replay is as it was
        return graph, rows, dict(release or {})
    others = _peer_work(job, rank, frame, tag, place, ops, targets)
    names = list(graph.ops)
    edges = [
        (names[u], names[v], "control" if c else "data")
        for u, v, c in zip(graph.src, graph.dst, graph.control, strict=True)
    ]
    joined = build_graph(list(ops.values()), edges)
    rows = pd.concat([rows, *others], ignore_index=True)
    rows = _with_shares(job, rank, joined, rows, targets, spans)
    return joined, rows, _tagged_releases(joined, rows, release, tag)


def _peer_work(
    job: Any,
    rank: str,
    frame: pd.DataFrame,
    tag: str,
    place: Callable[[Op], str | None],
    ops: dict[str, Op],
    targets: set[str],
) -> list[pd.DataFrame]:
    """The other ranks' records of ops `place` puts on a shared processor, as `rank`'s
    rows of ops named `tag` + ``rank:op`` (`_shared`); their ops added to `ops` and
    their processors to `targets`."""
    others = []
    for peer in job.ranks:
        if peer == rank:
            continue
        g = job.graphs[peer]
        mine = frame[frame["rank"] == peer]
        on = {o: w for o in mine["op"].unique() if (w := place(g.ops[o])) is not None}
        mine = mine[mine["op"].isin(on)]
        for o, where in on.items():
            op = g.ops[o]
            ops[f"{tag}{peer}:{o}"] = Op(
                f"{tag}{peer}:{o}", op.kind, where, nbytes=op.nbytes, type=op.type
            )
            targets.add(where)
        others.append(
            pd.DataFrame(
                {
                    "rank": rank,
                    "iteration": mine["iteration"].to_numpy(),
                    "op": [f"{tag}{peer}:{o}" for o in mine["op"]],
                    "start": mine["start"].to_numpy(dtype=np.int64),
                    "duration": mine["duration"].to_numpy(dtype=np.int64),
                    "dedicated": mine["duration"].to_numpy(dtype=np.float64),
                }
            )
        )
    return others


def _with_shares(
    job: Any,
    rank: str,
    joined: OpGraph,
    rows: pd.DataFrame,
    targets: set[str],
    spans: Mapping[int, tuple[int, int]],
) -> pd.DataFrame:
    """`rows` with each record on a shared processor of `targets` given its share of it
    as its ``work`` (`shares`), from the step's replay start on (`_shared`)."""
    where = rows["op"].map({name: op.resource for name, op in joined.ops.items()}).to_numpy()
    placed = np.array([r in targets for r in where], dtype=bool)
    start = rows["start"].to_numpy(dtype=np.int64).copy()
    duration = rows["duration"].to_numpy(dtype=np.int64)
    work = duration.astype(np.float64)
    keep = np.ones(len(rows), dtype=bool)
    own = rows["op"].isin(job.graphs[rank].ops).to_numpy()
    for it, at in rows[placed].groupby("iteration").groups.items():
        at = np.asarray(at)
        of_rank = at[own[at]]
        first = int(start[of_rank].min()) if len(of_rank) else int(start[at].min())
        since = min(spans.get(it, (first,))[0], first)
        for resource in dict.fromkeys(where[at]):
            on = at[where[at] == resource]
            names = rows["op"].to_numpy()[on]
            flow = flows(names, where[on])
            work[on] = shares(start[on], duration[on], since, flow)
        late = start[at] < since
        keep[at[late & (start[at] + duration[at] <= since)]] = False
        start[at[late]] = since
    return rows.assign(start=start, work=np.round(work).astype(np.int64))[keep]


def _tagged_releases(
    joined: OpGraph, rows: pd.DataFrame, release: Mapping[int, np.ndarray] | None, tag: str
) -> dict[int, np.ndarray]:
    """Step -> per op of `joined` its release (`release`'s for the rank's own ops, the
    traced start of the other ranks' ops named `tag` + ``rank:op``; -1 none)."""
    index = {name: i for i, name in enumerate(joined.ops)}
    out: dict[int, np.ndarray] = {}
    for it, step in rows.groupby("iteration"):
        latest = np.full(len(index), -1, dtype=np.int64)
        if release is not None and it in release:
            latest[: len(release[it])] = release[it]
        peer_rows = step[step["op"].str.startswith(tag)]
        at = peer_rows["op"].map(index).to_numpy(dtype=np.int64)
        np.maximum.at(latest, at, peer_rows["start"].to_numpy(dtype=np.int64))
        out[int(it)] = latest
    return out


def flows(names: Sequence[str], resources: Sequence[str]) -> np.ndarray:
    """Per op (`names`, on `resources`) its flow on a shared processor (`shares`): on a
    PS's link the worker whose transfer it is, for the one connection gRPC holds between
    a worker and its PS, which TCP gives an even part of the link however many of the
    worker's transfers are in flight (the other ranks' ops are named ``(link) rank:op``,
    the replayed rank's own ``""``); on the host core every op alike (``""``)."""
    return np.array(
        [
            name[len(LINK) :].split(":", 1)[0]
            if resource.startswith(LINK) and name.startswith(LINK)
            else ""
            for name, resource in zip(names, resources, strict=True)
        ],
        dtype=object,
    )


def is_shared(resource: str) -> bool:
    """Whether a replay resource is one processor shared evenly by the ops on it: the
    host core (`HOST`) or a PS's link (`link_of`)."""
    return resource == HOST or resource.startswith(LINK)


def shared_schedule(
    ticks: np.ndarray,
    src: np.ndarray,
    dst: np.ndarray,
    res: np.ndarray,
    cap: np.ndarray,
    priority: np.ndarray,
    cores: np.ndarray,
    flow: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) per op of a replay in which each resource of `cores` (a mask over
    the resources) is one processor shared evenly by the flows running on it, a flow's
    part evenly by its ops (`flow`: per op its flow, as `shares` takes it; None: one
    flow, every op an even share), so an op of `ticks` work takes longer while others
    share it; every other resource runs up to `cap` ops at once, the ready ones in
    `priority` order (lowest first, then the op's index; -1 last). Ticks as given.

    With each op's share of its processor as its work (`shares`) and its own waits, the
    replay runs every op when it ran: the same ops share it at every instant.
    """
    n = len(ticks)
    succ: list[list[int]] = [[] for _ in range(n)]
    indeg = np.zeros(n, dtype=np.int64)
    for u, v in zip(src.tolist(), dst.tolist(), strict=True):
        succ[u].append(v)
        indeg[v] += 1
    # per shared processor and flow on it its ops, by the service (work per op of the
    # flow since the start) at which each is done: a flow's ops all progress alike
    on: dict[int, dict[int, list[tuple[float, int]]]] = {int(r): {} for r in np.flatnonzero(cores)}
    state: dict[str, Any] = {
        "start": np.full(n, -1.0), "end": np.full(n, -1.0), "free": cap.astype(np.int64).copy(),
        "queues": {}, "ends": [], "on": on, "served": {r: {} for r in on}, "now": 0.0,
        "flow": np.zeros(n, dtype=np.int64) if flow is None else pd.factorize(flow)[0],
    }  # fmt: skip
    for i in np.flatnonzero(indeg == 0).tolist():
        _ready(state, i, ticks, res, priority)
    _dispatch(state, ticks)
    done = 0
    while done < n:
        finished = _advance(state, res)
        if finished is None:
            break  # a cycle: the rest never runs (end stays -1)
        for i in finished:
            state["end"][i] = state["now"]
            done += 1
            for v in succ[i]:
                indeg[v] -= 1
                if indeg[v] == 0:
                    _ready(state, v, ticks, res, priority)
        _dispatch(state, ticks)
    return state["start"], state["end"]


def _ready(
    state: dict[str, Any], i: int, ticks: np.ndarray, res: np.ndarray, priority: np.ndarray
) -> None:
    """Op `i` of `shared_schedule` ready now: started on its shared processor, else
    queued on its resource by priority (``state``: the schedule's ``start`` and ``end``
    per op, ``free`` channels, ``queues``, ``ends`` of the ops off the shared processors,
    ``on`` and ``served`` of each shared processor, ``now``)."""
    r = int(res[i])
    now = state["now"]
    if r in state["on"]:
        state["start"][i] = now
        if ticks[i] <= 0:
            heapq.heappush(state["ends"], (now, i))
        else:
            f = int(state["flow"][i])
            served = state["served"][r].setdefault(f, 0.0)
            heapq.heappush(state["on"][r].setdefault(f, []), (served + float(ticks[i]), i))
        return
    key = int(priority[i]) if priority[i] >= 0 else np.iinfo(np.int64).max
    heapq.heappush(state["queues"].setdefault(r, []), (key, i))


def _dispatch(state: dict[str, Any], ticks: np.ndarray) -> None:
    """Start the queued ops of `shared_schedule` that a free channel can take now."""
    free, start, ends, now = state["free"], state["start"], state["ends"], state["now"]
    for r, queue in state["queues"].items():
        while queue and free[r] > 0:
            _, i = heapq.heappop(queue)
            free[r] -= 1
            start[i] = now
            heapq.heappush(ends, (now + float(ticks[i]), i))


def _advance(state: dict[str, Any], res: np.ndarray) -> list[int] | None:
    """`shared_schedule`'s clock moved to the next end of an op: the ops that end then
    (their channels freed), or None where nothing runs (a cycle)."""
    on, served, ends, now = state["on"], state["served"], state["ends"], state["now"]
    t = ends[0][0] if ends else np.inf
    for r, running in on.items():
        for f, heap in running.items():  # each flow running gets 1 / len(running)
            t = min(t, now + (heap[0][0] - served[r][f]) * len(heap) * len(running))
    if t == np.inf:
        return None
    finished = []
    for r, running in on.items():
        part = len(running)
        for f, heap in list(running.items()):
            served[r][f] += (t - now) / (len(heap) * part)
            while heap and heap[0][0] - served[r][f] <= 0.5:  # ticks: rounding left
                finished.append(heapq.heappop(heap)[1])
            if not heap:
                del running[f]
    state["now"] = now = t
    while ends and ends[0][0] <= now:
        _, i = heapq.heappop(ends)
        if int(res[i]) not in on:
            state["free"][res[i]] += 1
        finished.append(i)
    return finished
