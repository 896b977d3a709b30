"""The replay: each traced step of each rank run again with its own op times, its observed
order and the typical waits of its other steps (`replay`), and each plan replayed on the
same steps (`_replay_plans`), so that every prediction comes with the error of the same
model on the trace. The rank's step models (`_step_models`) and thread speeds are built
here, where they are used."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from planner.errors import InputError
from planner.model import records
from planner.model.oracle import TimeOracle, mean_of_runs
from planner.model.plan import Plan
from planner.model.records import missing_ops
from planner.model.trace import Job, busy_time, queued_before, rank_meta, with_dedicated
from planner.planning import hook_calls
from planner.planning.ticks import TICKS_PER_SECOND
from planner.prediction import hook_cost, host
from planner.prediction.compiled import (
    Compiled,
    KnownRows,
    PlanArrays,
    _device_ops,
    compile_graph,
    known_rows,
    op_rows,
    op_seconds,
    per_op,
    plan_arrays,
    rank_arrays,
    rank_rows,
    sorted_unique,
    to_ticks,
)
from planner.prediction.critical_path import _cause, _critical, _holders
from planner.prediction.enforced_replay import _enforced, _link, _op_bytes
from planner.prediction.event_loop import _arrays, _draws, _kernel
from planner.prediction.fidelity import _all_errors, _error_summary
from planner.prediction.overheads import (
    _others,
    covered_steps,
    nan_medians,
    orphan_overheads,
    typical_overheads,
)
from planner.prediction.releases import _latest, carried_over, joint_work, peer_releases, spans_of
from planner.prediction.step_model import (
    StepModel,
    measured,
    overhead_names,
    own_rows,
    rank_shape,
    step_model,
    usual_predecessors,
    with_overhead,
)
from planner.prediction.step_timing import covered, cpu_spans_of, timed_cpu, timed_wall

SCHEMA = "planner.simulation/1"


def require_timings(job: Job) -> None:
    """InputError unless `job` has timings; callers check before building any plan."""
    if not job.trace.rows:
        where = job.sources[0] if job.sources else None
        raise InputError(where, "simulation needs timings; input has none")


def _frame(job: Job) -> pd.DataFrame:
    require_timings(job)
    frame = with_dedicated(job.trace, job.graphs)
    if "wait" in frame:
        # A rank's collective lasts its transfer plus its wait for the later peers: the
        # peers' lateness is no order of this rank's, so the simulation keeps it as seen
        # (the schedulers' oracle counts the transfer part only, `planner.model.waits`).
        frame["dedicated"] = frame["dedicated"] + frame["wait"]
    return frame


MAX_SLOWDOWN = 2.0  # a CPU thread's gaps slow down with its ops up to this factor


def thread_speeds(
    compiled: Compiled, models: Mapping[int, StepModel], lenders: Collection[int] | None = None
) -> dict[int, np.ndarray]:
    """Step -> per op the factor the step's replay scales the op's typical overhead by:
    on a CPU thread (not a GPU stream, a network lane or a transfer), the median over
    the thread's ops of their duration in this step over their median duration in the
    other steps among `lenders` (as `typical_overheads` takes them), at most
    `MAX_SLOWDOWN` (at most 1 on a GPU rank); 1 elsewhere.

    The gaps between the ops of a Python thread are that thread's own work (the
    interpreter, the dispatcher), so they run as fast as its ops: `param/linear_kineto`
    step 1, its ops at 0.64 of their typical time, spent 0.31 ms between them against
    0.45 ms typically; the CPU loader loop's step 7, its ops at 1.27, spent 1.38x its
    typical gaps (a host stall). An op that ran far slower waited inside it (a blocking
    call, a contended lock) and the gaps share less of that: resnet DDP step 5, ops
    5.5-6.3x, gaps 1.5-2.3x; uncapped, its worst step replayed 4.6% off. On a GPU rank a
    CPU op also waits inside for the device (a sync, a pageable copy), so a slower step
    is not scaled: `param/resnet_kineto`'s main thread ran its ops at 2.2x their typical
    time in iteration 20 and its gaps at 0.68x; scaled up, its CPU range replayed 13.6%
    long (5.1% unscaled).
    """
    items = sorted(models)
    n = len(compiled.names)
    factors = {it: np.ones(n) for it in items}
    if len(items) < 2:
        return factors
    limit = 1.0 if _device_ops(compiled)[:n].any() else MAX_SLOWDOWN
    table = np.stack([np.where(models[i].observed, models[i].seconds[:n], np.nan) for i in items])
    table[table <= 0] = np.nan
    lending = np.array([lenders is None or i in lenders for i in items])
    thread = np.array([not r.startswith(("gpu", "net")) for r in compiled.resources])
    on_thread = thread[compiled.res[:n]] & ~compiled.transfer[:n]
    for row, it in enumerate(items):
        others = table[_others(lending, row)]
        seen = on_thread & ~np.isnan(table[row]) & (~np.isnan(others)).any(axis=0)
        if not seen.any():
            continue
        typical = np.full(n, np.nan)
        typical[seen] = nan_medians(others[:, seen])
        ratio = table[row] / typical
        for r in sorted_unique(compiled.res[:n][seen]):
            of_r = seen & (compiled.res[:n] == r)
            factors[it][compiled.res[:n] == r] = min(float(np.median(ratio[of_r])), limit)
    return factors


def _step_models(
    compiled: Compiled,
    rows_of_rank: pd.DataFrame | KnownRows,
    oracle: TimeOracle,
    spans: Mapping[int, tuple[int, int]] | None,
    releases: Mapping[int, np.ndarray] | None = None,
    own: int | None = None,
    pools: bool = False,
    plan: PlanArrays | None = None,
) -> dict[int, tuple[dict[str, np.ndarray], tuple[int, int], StepModel]]:
    """Step -> (its rows, its span, its `step_model`) for each step of one rank; `own`:
    the rank's ops are the first `own` of `compiled` (the rest, PS work joined for the
    replay, count neither in the step's span nor in its missing records).
    `pools`: the rank's resources are pools (TensorFlow's inter-op thread pool, gRPC
    serving several transfers on one channel): one runs as many ops at once in every
    step as it ever did in one (`rank_shape`), not only as many as this step did;
    elsewhere (a Python thread, a GPU stream: one op at a time, a rare overlap in one
    step being that step's) each step keeps its own width.
    The edges the trace contradicts are dropped rank-wide either way. Partial steps do
    not shape the rank. A step's rows are numpy columns of its records of `compiled`'s
    ops: ``start``, ``duration`` (ns) and ``idx`` (the op index, `op_rows`; `rows_of_rank`
    may be that answer, looked up once for the rank). `plan`: the steps as the plan would
    run them (`step_model`)."""
    fallback = op_seconds(compiled, oracle)
    # (speed) the op indices looked up once for the rank and the columns taken as numpy,
    # then split by step (a step without a record of `compiled`'s ops has no model and
    # does not shape the rank); no pandas per step
    rows_known, idx_known = known_rows(compiled, rows_of_rank)
    iteration = rows_known["iteration"].to_numpy(dtype=np.int64)
    columns = {
        "start": rows_known["start"].to_numpy(dtype=np.int64),
        "duration": rows_known["duration"].to_numpy(dtype=np.int64),
        "idx": idx_known,
    }
    if "work" in rows_known:
        columns["work"] = rows_known["work"].to_numpy(dtype=np.int64)
    mine = idx_known < own if own is not None else np.ones(len(idx_known), dtype=bool)
    gone = missing_ops(idx_known[mine], iteration[mine], compiled.names, columns["duration"][mine])
    order = np.argsort(iteration, kind="stable")
    ordered = iteration[order]
    at = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if len(order) else order
    its = ordered[at]
    cuts = [*at.tolist(), len(order)]
    steps = []
    for k, it in enumerate(its.tolist()):
        take = order[cuts[k] : cuts[k + 1]]
        steps.append((int(it), {name: c[take] for name, c in columns.items()}))
    dropped, width, always = rank_shape(
        compiled, ((known, known["idx"]) for it, known in steps if it not in gone)
    )
    shape = (dropped, width if pools else np.ones_like(width), always)
    usual = usual_predecessors(compiled, (known for it, known in steps if it not in gone))
    names = overhead_names(compiled)
    models = {}
    for it, known in steps:
        of_rank = own_rows(known, own)  # the first own are mine
        if not len(of_rank["idx"]):
            continue
        first = int(of_rank["start"].min())
        last = int((of_rank["start"] + of_rank["duration"]).max())
        span = (spans or {}).get(it, (first, last))
        span = (min(span[0], first), max(span[1], last))
        release = None
        if releases is not None and it in releases:
            release = releases[it] - span[0]
            release[releases[it] < 0] = -1
        models[it] = (
            known,
            span,
            step_model(
                compiled, known, span, fallback, gone.get(it, ()), release, own, shape,
                known["idx"], plan, usual, names,
            ),
        )  # fmt: skip
    return models


def _replay_rank(
    compiled: Compiled,
    rows_of_rank: pd.DataFrame | KnownRows,
    oracle: TimeOracle,
    seed: int,
    spans: Mapping[int, tuple[int, int]] | None = None,
    releases: Mapping[int, np.ndarray] | None = None,
    own: int | None = None,
    pools: bool = False,
    plans: Mapping[str, Plan] | None = None,
    cpu_spans: Mapping[int, tuple[int, int]] | None = None,
    queued: Mapping[int, Mapping[str, int]] | None = None,
    in_trace: int | None = None,
    enforce: str | None = "arrival",
    hooked: bool = False,
) -> list[dict[str, Any]]:
    """The replayed steps of one rank (see `replay`); `own`, `pools`: as in `_step_models`;
    `plans`: each replayed on every step too (`_replay_plans`, TF plans as `enforce`
    applies them, a PyTorch job's with the hook's calls where `hooked`); `cpu_spans`: a
    GPU rank's steps as its CPU ran them (`cpu_spans_of`), timed beside the device's
    steps;
    `queued`: step -> op -> ns TensorFlow's executor held the op queued (`_cause`);
    `in_trace`: the first `in_trace` ops of `compiled` are the rank's trace (its own ops and
    the PS work its RunMetadata recorded, `own` when None): what covers its steps.
    `rows_of_rank`: its rows, or their `op_rows` where the caller looked them up."""
    looked_up = known_rows(compiled, rows_of_rank)  # once, read by every model below
    models = _step_models(compiled, looked_up, oracle, spans, releases, own, pools)
    in_trace = own if in_trace is None else in_trace
    overheads = _lent_overheads(compiled, models, own, in_trace, pools)
    device = _device_ops(compiled)[: len(compiled.names[:own])]
    steps = []
    for it, (known, span, traced) in models.items():
        step = _replayed_step(
            compiled, it, (known, span, traced), overheads[it], seed, own, in_trace,
            ((spans or {}).get(it), (cpu_spans or {}).get(it)), (queued or {}).get(it, {}),
            device, len(models) > 1,
        )  # fmt: skip
        if traced.missing:
            step["partial"] = records.note(str(looked_up[0]["rank"].iloc[0]), it, traced.missing)
        steps.append(step)
    if plans:
        observed = {s["iteration"]: s["predicted_wall"] for s in steps}
        judged = _replay_plans(
            compiled, looked_up, oracle, seed, spans, releases, own, pools, plans, overheads,
            observed, enforce, hooked,
        )  # fmt: skip
        for step in steps:
            step["plans"] = judged[step["iteration"]]
    return steps


def _lent_overheads(
    compiled: Compiled,
    models: Mapping[int, tuple[dict[str, np.ndarray], tuple[int, int], StepModel]],
    own: int | None,
    in_trace: int | None,
    pools: bool,
) -> dict[int, np.ndarray]:
    """Step -> the overhead per op its replay runs with (`_replay_rank`): the typical
    one of the steps that lend (`covered_steps` of the first `in_trace` ops), an
    orphan's typical start, and on a CPU rank's threads scaled by the thread's speed in
    the step (`thread_speeds`)."""
    lenders = covered_steps(models, in_trace)
    traced_models = {it: m for it, (_, _, m) in models.items()}
    overheads = typical_overheads(traced_models, lenders)
    overheads = orphan_overheads(compiled, traced_models, overheads, own, lenders)
    if not pools:
        speed = thread_speeds(compiled, traced_models, lenders)
        overheads = {it: o * speed[it] for it, o in overheads.items()}
    return overheads


def _replayed_step(
    compiled: Compiled,
    it: int,
    entry: tuple[dict[str, np.ndarray], tuple[int, int], StepModel],
    overhead: np.ndarray,
    seed: int,
    own: int | None,
    in_trace: int | None,
    recorded: tuple[tuple[int, int] | None, tuple[int, int] | None],
    queued: Mapping[str, int],
    device: np.ndarray,
    several: bool,
) -> dict[str, Any]:
    """One step of `_replay_rank`: `entry` (its rows, span and step model) replayed with
    `overhead` and timed against its recorded spans (`recorded`: its wall-clock span and
    its CPU range, each None where not recorded); `queued` as in `_cause`; `several`:
    whether the rank has other steps to lend overheads."""
    known, span, traced = entry
    model = with_overhead(traced, overhead)
    start, ticks = replay_step(model, seed)
    n = len(compiled.names[:own])
    begin, took = start[:n], ticks[:n]
    keep = model.observed[:n]
    predicted_wall, ahead = timed_wall(model, start, ticks, span, recorded[0], device)
    timed = keep & device if (keep & device).any() else keep  # a GPU rank: its device
    predicted = busy_time(begin[timed], took[timed]) / TICKS_PER_SECOND
    holders = _holders(traced, start, ticks)
    path = _critical(traced, start, ticks, n, holders=holders)
    in_queue = per_op(compiled, queued)
    cover = covered(own_rows(known, in_trace), (span[0] + ahead, span[1]))
    known = own_rows(known, n)
    busy, op_span = measured({k: v[timed[known["idx"]]] for k, v in known.items()})
    wall = (span[1] - span[0] - ahead) / 1e9
    error = predicted / busy - 1.0 if busy > 0 else None
    wall_error = predicted_wall / wall - 1.0 if wall > 0 else None
    step: dict[str, Any] = {
        "iteration": it,
        "predicted": predicted,
        "measured": busy,
        "span": op_span,
        "idle": op_span - busy,
        "replay_error": error,
        "wall": wall,
        "predicted_wall": predicted_wall,
        "wall_error": wall_error,
        "overhead": float(model.overhead[:n][keep].sum()),
        "overhead_from": "other steps" if several else "own step",
        "ops_observed": int(len(known["idx"])),
        "cover": cover,
        "cause": _cause(traced, model, path, in_queue),
        "busy_cause": _cause(traced, model, np.arange(len(model.overhead)) < n, in_queue),
    }
    cpu_timed = timed_cpu(model, known, start, ticks, recorded[1], device)
    if cpu_timed is not None:
        step["cpu_wall"], step["predicted_cpu_wall"] = cpu_timed
        step["cpu_wall_error"] = cpu_timed[1] / cpu_timed[0] - 1.0
        cpu_path = _critical(traced, start, ticks, n, ~device, holders)
        step["cpu_cause"] = _cause(traced, model, cpu_path)
    return step


def _replay_plans(
    compiled: Compiled,
    looked_up: KnownRows,
    oracle: TimeOracle,
    seed: int,
    spans: Mapping[int, tuple[int, int]] | None,
    releases: Mapping[int, np.ndarray] | None,
    own: int | None,
    pools: bool,
    plans: Mapping[str, Plan],
    overheads: Mapping[int, np.ndarray],
    observed: Mapping[int, float],
    enforce: str | None = "arrival",
    hooked: bool = False,
) -> dict[int, dict[str, dict[str, Any]]]:
    """Step -> plan -> the step replayed as the plan would run it: the step's own op
    times, the typical waits the observed order's replay used, the planned ops in the
    plan's order and its control edges (`step_model`). ``predicted_wall`` (s, timed as
    `_replay_rank` times the step) and ``gain`` over the observed order's replay of the
    same step; ``error`` instead where the plan cannot run on the step (its order or
    edges close a cycle with what the step observed). On a TF job (`pools`) an ordered
    plan runs with the chain the TF module adds in mode `enforce` (`_enforced`; None:
    its priorities alone), and each entry names the mode it ran as (``enforce``). On a
    PyTorch job (`hooked`) a plan that runs through planner's DDP hook has the hook's
    time (its calls and its passes over the groups' bytes) on the ops that launch its
    collectives (`hook_cost`), in all ``hook_seconds``.
    `looked_up`: the rank's rows as `op_rows` gives them."""
    out: dict[int, dict[str, dict[str, Any]]] = {it: {} for it in observed}
    link: tuple[float, float] | None = None  # (message s, bytes/s), found once per rank
    op_bytes = _op_bytes(compiled) if pools else np.zeros(0)
    for name, plan in plans.items():
        try:
            arrays = plan_arrays(compiled, plan)
        except InputError as exc:
            for it in out:
                out[it][name] = {"error": exc.problem}
            continue
        waits = alone = np.zeros(0, dtype=np.int64)
        latency, least = 0.0, np.zeros(0)
        mode = enforce if pools and plan.order else None
        if mode is not None:  # as the TF module applies it (`enforced`)
            arrays, waits, alone = _enforced(compiled, own, plan, arrays, mode)
            link = link if link is not None else _link(compiled, looked_up, op_bytes)
            latency = link[0]
            nbytes = np.nan_to_num(op_bytes[alone], nan=0.0)
            least = latency + (nbytes / link[1] if link[1] > 0 else 0.0)
        models = _step_models(compiled, looked_up, oracle, spans, releases, own, pools, arrays)
        device = _device_ops(compiled)[: len(compiled.names[:own])]
        hook = 0.0
        launchers, launch_cost = np.zeros(0, dtype=np.int64), np.zeros(0)
        if hooked and hook_calls.calls(plan):  # DDP's copies at the oracle's op times
            launchers, launch_cost, hook = hook_cost.hook_time(
                compiled, plan, op_seconds(compiled, oracle)
            )
        for it, (_, span, traced) in models.items():
            overhead = overheads[it]
            if len(waits):
                overhead = overhead.copy()
                overhead[waits] = np.maximum(overhead[waits], latency)
            model = with_overhead(traced, overhead)
            if len(alone):  # alone on its link: a message, then its bytes at the link's rate
                seconds = model.seconds.copy()
                seconds[alone] = least
                model = replace(model, seconds=seconds)
            if len(launchers):  # the hook's time, on the ops that launch the collectives
                seconds = model.seconds.copy()
                seconds[launchers] += launch_cost
                model = replace(model, seconds=seconds)
            try:
                start, ticks = replay_step(model, seed)
            except InputError:
                out[it][name] = {"error": "the plan's order closes a cycle with the step's"}
                continue
            wall, _ = timed_wall(traced, start, ticks, span, (spans or {}).get(it), device)
            gain = observed[it] / wall - 1.0 if wall > 0 else None
            out[it][name] = {"predicted_wall": wall, "gain": gain, "enforce": mode}
            if hook:
                out[it][name]["hook_seconds"] = hook
    return out


def replay_step(model: StepModel, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(start, duration) in ticks of every op of `model.compiled` as the replay runs the
    step: list scheduling, with each shared processor of `planner.prediction.host` (the host core
    a job's processes shared, a PS's links) shared evenly by the ops on it."""
    ticks = to_ticks(model.seconds)
    c = model.compiled
    cores = np.array([host.is_shared(r) for r in c.resources])
    if cores.any():
        flow = host.flows(c.names, [c.resources[r] for r in c.res])
        begin, end = host.shared_schedule(
            ticks, c.src, c.dst, c.res, model.cap, model.priority, cores, flow
        )
        if (end < 0).any():
            raise InputError(None, "the replay's edges make the graph cyclic: ops never run")
        start = np.rint(begin).astype(np.int64)
        return start, np.rint(end).astype(np.int64) - start
    arrays = _arrays(c, model.priority, (), model.cap)
    _, start, _ = _kernel(arrays, ticks, _draws(seed, [0], len(ticks)), True)
    return start[0], ticks


def replay(
    job: Job,
    *,
    seed: int = 0,
    frame: pd.DataFrame | None = None,
    plans: Mapping[str, Mapping[str, Plan]] | None = None,
    enforce: str | None = "arrival",
    arrays: Mapping[str, tuple[Compiled, KnownRows]] | None = None,
) -> dict[str, Any]:
    """Each traced step of each rank with its own op times and observed order.

    Per step: predicted and measured (busy makespan) iteration time, span, idle and
    ``replay_error``; per rank the median and the largest-magnitude error (signed).
    `frame`: the job's `with_dedicated` timings, when the caller has them already;
    `arrays`: rank -> `rank_arrays` of its graph and rows of `frame`, likewise (each rank's graph
    is compiled and its rows looked up once, here or by the caller, and handed on).
    `plans` ({name: {rank: Plan}}): each step also replayed as each plan would run it
    (``plans`` per step, `_replay_plans`): the same model, so the replay error of the
    observed order is the error beside each plan's prediction. On a TF job an ordered
    plan runs as ``planner export --enforce`` `enforce` applies it (`planner.prediction.enforced`;
    None: its priorities alone, which no TF runtime module applies).
    A TF job runs its compute on one shared host core where its records say its
    processes had one (`host.on_one_core`), else its transfers on its PS's shared links
    (`host.on_links`).
    """
    frame = _frame(job) if frame is None else frame
    if arrays is None:  # the peers' releases read every rank's; one rank's, built below
        arrays = job_arrays(job, frame) if len(job.ranks) > 1 else {}
    releases = job_releases(job, frame, arrays)
    pools = job.framework == "tensorflow"
    shared_core = host.one_core(job, frame)
    ranks = []
    for rank in job.ranks:
        own = len(job.graphs[rank].ops)
        mine = rank_rows(frame, rank)
        graph, rows, release = joint_work(job, rank, mine, releases.get(rank))
        in_trace = len(graph.ops)  # the rank's ops and the PS work of its RunMetadata
        spans = spans_of(job, rank)
        if shared_core is not None:
            graph, rows, release = host.on_one_core(job, rank, graph, rows, release, frame, spans)
        elif pools:
            graph, rows, release = host.on_links(job, rank, graph, rows, release, frame, spans)
        held = arrays.get(rank)
        if held is not None and graph is job.graphs[rank] and rows is mine:
            compiled, looked_up = held  # the rank's own work, as it is
        else:  # or joined with work from outside its records, compiled for the replay
            compiled = compile_graph(graph)
            looked_up = op_rows(compiled, rows)
        oracle = mean_of_runs(graph, rows)
        release = _latest(
            release, carried_over(compiled, looked_up, spans, queued_before(job, rank))
        )
        of_rank = {name: p[rank] for name, p in (plans or {}).items() if rank in p}
        steps = _replay_rank(
            compiled, looked_up, oracle, seed, spans, release, own, pools, of_rank,
            cpu_spans_of(job, rank), rank_meta(job, rank).get("queued"), in_trace, enforce,
            job.framework == "pytorch",
        )  # fmt: skip
        ranks.append({"rank": rank, **_error_summary(steps), "steps": steps})
    document = {"schema": SCHEMA, "kind": "replay", "ranks": ranks, **_all_errors(ranks)}
    if shared_core is not None:
        document["shared_core"] = shared_core
    return document


def job_arrays(job: Job, frame: pd.DataFrame) -> dict[str, tuple[Compiled, KnownRows]]:
    """Rank -> `rank_arrays` of its graph and its rows of `frame` (`rank_rows`): built
    once where a job's replay (or comparison) starts, handed to the pieces that read them."""
    return {rank: rank_arrays(job.graphs[rank], rank_rows(frame, rank)) for rank in job.ranks}


def job_releases(
    job: Job,
    frame: pd.DataFrame,
    arrays: Mapping[str, tuple[Compiled, KnownRows]] | None = None,
) -> dict[str, dict[int, np.ndarray]]:
    """`peer_releases` of a job (empty with one rank); `arrays`: as in `replay`."""
    if len(job.ranks) < 2:
        return {}
    compiled, models = {}, {}
    for rank in job.ranks:
        graph = job.graphs[rank]
        rows = frame[frame["rank"] == rank]
        compiled[rank], looked_up = (arrays or {}).get(rank) or rank_arrays(graph, rows)
        models[rank] = _step_models(
            compiled[rank],
            looked_up,
            mean_of_runs(graph, rows),
            spans_of(job, rank),
            pools=job.framework == "tensorflow",
        )
    return peer_releases(compiled, models)


def replayed_steps(document: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Rank -> steps of a `replay` document, for `compare`/`sweep` to reuse."""
    return {r["rank"]: r["steps"] for r in document["ranks"]}
