"""What holds a rank's step back from outside its own records: the peers' readiness for
each collective (`peer_releases`), the queue a stream carries over from the step before
(`carried_over`), the parameter servers' work a TF worker waits for (`joint_work`), and the
recorded step spans (`spans_of`). Apart because each is a per-step release the replay only
applies."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from planner.model.graph import OpGraph, on_gpu
from planner.model.trace import Job
from planner.prediction.compiled import Compiled, KnownRows, known_rows
from planner.prediction.overheads import nan_medians
from planner.prediction.step_model import StepModel


def peer_releases(
    compiled: Mapping[str, Compiled],
    models: Mapping[str, Mapping[int, tuple[Any, tuple[int, int], StepModel]]],
) -> dict[str, dict[int, np.ndarray]]:
    """Rank -> step -> per op the latest time (epoch ns, -1 none) another rank was ready
    for the same collective or transfer (same name) in the same step.

    A collective starts when the slowest rank joins it; one rank's trace shows that
    wait only as a late start. With the peers' traces of the step the replay starts it
    no earlier than they were ready (hosts' clocks are taken as synchronised).
    """
    ready: dict[str, dict[int, dict[str, int]]] = {}
    for rank, steps in models.items():
        c = compiled[rank]
        shared = c.transfer
        for it, (_, _, model) in steps.items():
            keep = np.flatnonzero(shared & model.observed)
            ready.setdefault(rank, {})[it] = {
                c.names[i]: int(model.ready[i]) + model.t0 for i in keep
            }
    out: dict[str, dict[int, np.ndarray]] = {}
    for rank, steps in models.items():
        c = compiled[rank]
        for it in steps:
            latest = np.full(len(c.names), -1, dtype=np.int64)
            for peer, of_peer in ready.items():
                if peer == rank or it not in of_peer:
                    continue
                for name, t in of_peer[it].items():
                    i = c.index.get(name)
                    if i is not None and c.transfer[i]:
                        latest[i] = max(latest[i], t)
            out.setdefault(rank, {})[it] = latest
    return out


def carried_over(
    compiled: Compiled,
    rows: pd.DataFrame | KnownRows,
    spans: Mapping[int, tuple[int, int]] | None = None,
    queued: Mapping[str, int] | None = None,
) -> dict[int, np.ndarray]:
    """Step -> per op the end (epoch ns, -1 none) of the previous traced step's last op
    on the op's resource: a GPU stream still running the kernels the CPU queued a step
    ahead cannot start this step's before (the queue a step begins with). On resources
    whose previous step ended before this one began it releases nothing. The first
    traced step, whose previous step is not in the trace, begins on each GPU stream and
    on the collectives' resources with the queue the trace recorded before it
    (`queued`: the end of the work issued before profiling began, `queued_before`; none
    where it recorded none) and elsewhere, or where the trace recorded no such work at
    all, with the typical queue: per resource the median over the other steps of that
    end less the step's start (its recorded span's, else its first record's). `rows`:
    the rank's rows, or their `op_rows` where the caller looked them up."""
    rows, idx = known_rows(compiled, rows)
    if not len(rows):
        return {}
    # (speed) per step its first start and per (step, resource) its last end, by one
    # sort and numpy reductions rather than pandas group-bys
    res = compiled.res[idx]
    start = rows["start"].to_numpy()
    end = (rows["start"] + rows["duration"]).to_numpy()
    steps, step_of = np.unique(rows["iteration"].to_numpy(), return_inverse=True)
    order = np.lexsort((res, step_of))
    step_sorted, res_sorted = step_of[order], res[order]
    at_step = np.flatnonzero(np.r_[True, step_sorted[1:] != step_sorted[:-1]])
    at_pair = np.flatnonzero(
        np.r_[True, (step_sorted[1:] != step_sorted[:-1]) | (res_sorted[1:] != res_sorted[:-1])]
    )
    first = np.minimum.reduceat(start[order], at_step)
    last_end = np.maximum.reduceat(end[order], at_pair)
    pair_step, pair_res = step_sorted[at_pair], res_sorted[at_pair]
    position = {int(it): k for k, it in enumerate(steps.tolist())}
    for it, (begin, _end) in (spans or {}).items():
        if it in position:
            first[position[it]] = begin
    n_res = len(compiled.resources)
    queue: dict[int, np.ndarray] = {}  # step -> per resource previous end - step start
    for k in range(1, len(steps)):
        q = np.full(n_res, np.nan)
        previous = pair_step == k - 1
        q[pair_res[previous]] = last_end[previous] - first[k]
        queue[int(steps[k])] = q
    head = np.full(n_res, np.nan)
    if len(queue) > 1:
        table = np.stack(list(queue.values()))
        seen = (~np.isnan(table)).any(axis=0)
        head[seen] = nan_medians(table[:, seen])
    if queued:  # the recorded queue on the streams and the collectives' resources
        for r, name in enumerate(compiled.resources):
            key = "net" if name.split(":")[0] == "net" else name
            if on_gpu(name) or key == "net":
                head[r] = queued[key] - first[0] if key in queued else np.nan
    if len(queue) > 1 or queued:
        queue[int(steps[0])] = head
    out = {}
    for it, q in queue.items():
        offset = np.nan_to_num(q).round().astype(np.int64)  # ns; epochs stay integers
        last = np.where(np.isnan(q), -1, offset + int(first[position[it]]))
        out[it] = last[compiled.res]
    return out


def _latest(
    a: Mapping[int, np.ndarray] | None, b: Mapping[int, np.ndarray]
) -> dict[int, np.ndarray]:
    """Per step the later of two release arrays (-1: none)."""
    out = {it: r.copy() for it, r in (a or {}).items()}
    for it, r in b.items():
        out[it] = np.maximum(out[it], r) if it in out else r.copy()
    return out


def joint_work(
    job: Job,
    rank: str,
    rows: pd.DataFrame,
    releases: Mapping[int, np.ndarray] | None,
) -> tuple[OpGraph, pd.DataFrame, dict[int, np.ndarray] | None]:
    """The graph, records and releases the replay runs for `rank`: its own, or, for a
    TF worker, its partition joined with the parameter servers' work it exchanges
    tensors with (``Job.meta["replay"]``, `planner.ingest.tf_runmetadata._ps_work`).

    The recvs at a TF step's start wait for the PS to read the variables, and a
    SyncReplicas token waits for the PS to apply the gradients, differently in every
    step; replayed with the worker, the PS ops run at their observed durations with
    their typical overheads, and the worker's recvs wait for them. PS work that waits
    for no worker is released at its traced start (a peer's trace, as for collectives);
    a PS op that reads another worker's tensor, at that tensor's arrival.
    """
    joint = (job.meta.get("replay") or {}) if isinstance(job.meta, Mapping) else {}
    graph = (joint.get("graphs") or {}).get(rank)
    if graph is None:
        return job.graphs[rank], rows, releases
    extra = pd.DataFrame(
        [r for r in joint.get("rows", ()) if r[0] == rank],
        columns=["rank", "iteration", "op", "start", "duration"],
    )
    extra["dedicated"] = extra["duration"]
    joined = pd.concat([rows, extra.astype({"start": "int64", "duration": "int64"})])
    index = {name: i for i, name in enumerate(graph.ops)}  # as `compile_graph` numbers them
    n_own = len(job.graphs[rank].ops)
    out: dict[int, np.ndarray] = {}
    steps = set(rows["iteration"].unique().tolist())
    for it in steps:
        latest = np.full(len(index), -1, dtype=np.int64)
        if releases is not None and it in releases:
            latest[:n_own] = releases[it]
        for name, t in ((joint.get("release") or {}).get(rank, {}).get(it) or {}).items():
            if name in index:
                latest[index[name]] = max(latest[index[name]], t)
        out[int(it)] = latest
    return graph, joined, out


def spans_of(job: Job, rank: str) -> dict[int, tuple[int, int]]:
    """Iteration -> (start, end) ns of the rank's recorded step spans (wall-clock).
    (speed) From the trace's numpy columns: no DataFrame view is built for them."""
    spans = job.trace.span_table
    mine = np.asarray(spans["rank"], dtype=object) == rank
    columns = (np.asarray(spans[k])[mine].tolist() for k in ("iteration", "start", "end"))
    return {int(i): (int(a), int(b)) for i, a, b in zip(*columns, strict=True)}
