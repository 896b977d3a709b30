"""Per-rank ingest and analysis in parallel, reduced to job-level figures.

Each task loads the input of ONE rank (its trace files, or its folder), computes that
rank's figures and returns only a small record; the parent reduces the records
(`reduce_ranks` for `analyze-ranks`, `planner.job.pipeline.job_metrics` for `metrics`).
Whole traces never leave the worker.
Runs on a local process pool (`concurrent.futures`) by default, or on a Dask cluster
given its scheduler address (the `dask` extra); there the paths must be readable by
the Dask workers (a shared file system).
"""

from __future__ import annotations

import gc
import importlib
import os
import re
import resource
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from statistics import fmean
from typing import TYPE_CHECKING, Any

from planner.errors import InputError, WorkerDied

if TYPE_CHECKING:
    from planner.model.oracle import NetworkModel

SCHEMA = "planner.ranks/1"

RankInput = Sequence[str | Path]
"""The files (or one folder) of one rank: e.g. a Kineto trace and its Execution Trace."""


def analyze_rank(paths: RankInput) -> dict[str, Any]:
    """One task: load one rank's input and return its small summary (or an error record).

    Errors are returned as ``{"error": [path, problem]}`` rather than raised, so they
    cross process and network boundaries intact.
    """
    from planner.job import stages
    from planner.job.summaries import load_one_rank

    try:
        job = load_one_rank(paths)
        document = stages.rank_metrics(job)
    except InputError as exc:
        return {"error": [exc.path, exc.problem]}
    spans = job.trace.spans
    (rank,) = job.ranks
    graph = job.graphs[rank]
    t = job.trace.timings
    coll = t[t["op"].isin([n for n, op in graph.ops.items() if op.kind == "collective"])]
    return {
        "rank": rank,
        "framework": job.framework,
        "sources": list(job.sources),
        "ops": len(job.graphs[rank].ops),
        "steps": document["steps"],
        "summary": document["ranks"][0],
        "spans": {
            int(row.iteration): [int(row.start), int(row.end)]
            for row in spans.itertuples(index=False)
        },
        "collectives": [
            [int(i), str(o), int(a), int(d)]
            for i, o, a, d in zip(
                coll["iteration"], coll["op"], coll["start"], coll["duration"], strict=True
            )  # fmt: skip
        ],
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "pid": os.getpid(),
    }


def reduce_ranks(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Job-level figures from per-rank summaries; InputError for the first failed rank."""
    from planner.job.pipeline import checked

    ranks = checked(results)
    frameworks = [ranks[0]["framework"]] if ranks else []
    common = sorted(set.intersection(*(set(r["spans"]) for r in ranks))) if ranks else []
    stragglers = _stragglers(ranks)
    iterations = []
    for number in common:
        lengths = [r["spans"][number][1] - r["spans"][number][0] for r in ranks]
        waited = stragglers.get(number)
        iterations.append(
            {
                "iteration": number,
                "duration": max(lengths) / 1e9,
                "straggler": waited["straggler_time"] if waited else 0.0,
                "slowest_rank": waited["slowest_rank"] if waited else None,
            }
        )
    efficiencies = [
        s["efficiency"] for r in ranks for s in r["steps"] if s["efficiency"] is not None
    ]
    return {
        "schema": SCHEMA,
        "framework": frameworks[0] if frameworks else None,
        "ranks": [
            {
                "rank": r["rank"],
                "sources": r["sources"],
                "ops": r["ops"],
                **{k: v for k, v in r["summary"].items() if k != "rank"},
            }
            for r in ranks
        ],
        "steps": [s for r in ranks for s in r["steps"]],
        "iterations": iterations,
        "job": {
            "ranks": len(ranks),
            "common_iterations": len(common),
            "mean_efficiency": fmean(efficiencies) if efficiencies else None,
            "min_efficiency": min(efficiencies) if efficiencies else None,
            "mean_iteration": fmean(i["duration"] for i in iterations) if iterations else None,
            "max_straggler": max((i["straggler"] for i in iterations), default=None),
        },
    }


def _stragglers(ranks: Sequence[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Step -> straggler figures from the ranks' collectives (`planner.model.waits`), the same
    definition `planner metrics` uses on a whole job."""
    import pandas as pd

    from planner.model import waits

    rows = pd.DataFrame(
        [[r["rank"], *c] for r in ranks for c in r.get("collectives", [])],
        columns=["rank", "iteration", "op", "start", "duration"],
    )
    if rows.empty:
        return {}
    rows["wait"] = waits.split_waits(rows)[0]
    return {int(s["iteration"]): s for s in waits.straggler_times(rows).to_dict("records")}


def rank_inputs(paths: Sequence[Path]) -> list[list[Path]] | None:
    """The inputs of one job split into one entry per rank, when they are the PyTorch
    profiler traces of two or more ranks (each with its Execution Trace, named
    ``et_<name>`` beside it, when given); None for anything else (one rank, TensorFlow,
    planner JSON, an Execution Trace named otherwise, a file that does not sniff): one
    process loads those, and names any problem exactly as without the split.

    Files are listed as `detect.load` lists them, and files it skips (a folder's
    meta.json) are skipped here too.
    """
    return split_ranks(paths)[0]


def split_ranks(paths: Sequence[Path]) -> tuple[list[list[Path]] | None, list[str]]:
    """(`rank_inputs`, the notes `detect.load` gives on the files it skips in a folder)."""
    from planner.ingest import detect

    kineto: list[Path] = []
    traces: dict[tuple[Path, str], Path] = {}
    notes: list[str] = []
    try:
        for path, explicit in detect.expand(paths):
            item = detect.sniff(path)
            found = item.format
            if found == "kineto":
                kineto.append(path)
            elif found == "execution_trace":
                traces[(path.parent, path.name)] = path
            elif found == "unknown_json" and not explicit:
                if not detect.run_metadata(item):
                    notes.append(f"skipped {path}: not a trace")
            else:
                return None, []
    except InputError:
        return None, []
    groups = _windows(kineto)
    if groups is None:
        return None, []
    ranks = [
        [*group, *(traces[(p.parent, "et_" + p.name)] for p in group
                   if (p.parent, "et_" + p.name) in traces)]
        for group in groups
    ]  # fmt: skip
    if len(ranks) < 2 or sum(len(r) for r in ranks) != len(kineto) + len(traces):
        return None, []
    return ranks, notes


_HEAD_RANK = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d{1,18})\b')


def _windows(kineto: Sequence[Path]) -> list[list[Path]] | None:
    """The Kineto files grouped per rank: adjacent files whose header names one rank are
    windows of one profiling session (`planner.ingest.kineto_windows`), read by one task
    and joined there, which also refuses files that are not. None when a file's header
    names no rank (no ``distributedInfo``): which files are one process's windows is
    known only from their events, so one process reads them all."""
    from planner.ingest.files import read_head

    groups: list[list[Path]] = []
    last: int | None = None
    for path in kineto:
        found = _HEAD_RANK.search(read_head(path))
        if found is None:
            return None
        rank = int(found.group(1))
        if groups and rank == last:
            groups[-1].append(path)
        else:
            groups.append([path])
        last = rank
    return groups


def analyze_ranks(
    rank_inputs: Sequence[RankInput],
    workers: int | None = None,
    dask_address: str | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Analyse every rank's input in parallel; (job document, per-worker resource records).

    `rank_inputs`: one entry per rank (its files, or its folder). `workers`: process pool
    size (default: CPU count; 1 runs in this process, no pool). `dask_address`: run the
    tasks on that Dask scheduler instead (``tcp://host:8786``, or ``local`` for a local
    cluster; needs ``pip install planner[dask]``). Raises InputError for the first bad
    rank input.
    """
    results = map_ranks(analyze_rank, rank_inputs, workers, dask_address)
    return reduce_ranks(results), usage_of(results)


def metrics_ranks(
    rank_inputs: Sequence[RankInput],
    workers: int | None = None,
    dask_address: str | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """`planner.metrics/1` of a job, one rank per task (`planner.job.pipeline`); the same
    document, byte for byte, as `stages.metrics` on the whole job in one process.

    Arguments as `analyze_ranks`; returns (document, per-worker resource records).
    """
    from planner.job import pipeline, summaries

    results = map_ranks(summaries.rank_summary, rank_inputs, workers, dask_address)
    return pipeline.job_metrics(results), usage_of(results)


def schedule_ranks(
    rank_inputs: Sequence[RankInput],
    workers: int | None = None,
    dask_address: str | None = None,
    channels: int = 1,
    network: NetworkModel | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The job's Caramel `planner.priorities/1`, one rank per task (`planner.job.pipeline`):
    the same document, byte for byte, as `stages.schedule` on the whole job.

    Each rank is read once; the parent folds the summaries into the job's op times and
    network rows, and one more task plans on the reference rank's DAG. Arguments as
    `analyze_ranks` (`network`: a benchmark model, as ``--network``); returns
    (document, per-worker resource records).
    """
    from planner.job import pipeline, summaries

    folded = summaries.Folded()
    with rank_mapper(workers, dask_address, len(rank_inputs)) as mapper:
        task = partial(summaries.rank_summary, plans=True)
        results = mapper(task, rank_inputs, summaries.fold(folded))
        planned, inputs = pipeline.caramel_inputs(results, folded.times)
        task = partial(pipeline.reference_plan, **inputs, channels=channels, benchmark=network)
        (reference,) = mapper(task, [planned[0]["inputs"]], None)
    if "error" in reference:
        raise InputError(*reference["error"])
    return pipeline.job_priorities(planned, reference["plan"], folded), usage_of(results)


def simulate_ranks(
    rank_inputs: Sequence[RankInput],
    workers: int | None = None,
    dask_address: str | None = None,
    plan: str = "all",
    *,
    samples: int = 100,
    seed: int = 0,
    sweep_knob: str | None = None,
    sweep_values: Sequence[float] = (),
    **knobs: float,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The job's `planner.simulation/1`, one rank per task (`planner.job.rank_replay`): the same
    document, byte for byte, as `simulate.simulation` on the whole job with the plans of
    `planner simulate --plan` (`all`, `caramel`, or only the reference `baseline` and
    `observed`). Two passes over the ranks (summaries, then replays; each trace read
    once, the loaded rank kept between them by `rank_store`); between them the parent
    computes the waits, the peers' ready times and the Caramel plan.
    Returns (document, per-worker resource records of both passes).
    """
    from planner.job import pipeline, rank_replay, stages, summaries

    if plan not in ("all", "caramel", "baseline", "observed"):
        raise InputError(None, f"plan {plan!r}: one process plans it (TIC/TAC)")
    folded = summaries.Folded()
    with (
        tempfile.TemporaryDirectory(prefix="planner-ranks-") as store,
        rank_mapper(workers, dask_address, len(rank_inputs)) as mapper,
    ):
        task = partial(rank_replay.replay_summary, store=store)
        results = mapper(task, rank_inputs, summaries.fold(folded))
        ranks = pipeline.checked(results)
        reference = None
        if plan == "caramel" or (plan == "all" and any(r["caramel"] for r in ranks)):
            channels = int(knobs.get("channels", 1))
            planned, inputs = pipeline.caramel_inputs(results, folded.times)
            task = partial(pipeline.reference_plan, **inputs, channels=channels)
            (reference,) = mapper(task, [planned[0]["inputs"]], None)
            if "error" in reference:
                raise InputError(*reference["error"])
        _, waited, _ = pipeline.job_waits(ranks)
        ready = rank_replay.releases(ranks)
        options = {
            "samples": samples,
            "seed": seed,
            "sweep_knob": sweep_knob,
            "sweep_values": list(sweep_values),
            "knobs": knobs,
        }
        plan_of = None
        if reference is not None:  # the plan every rank runs, as the joint path's
            plan_of = stages.job_plan(reference["plan"], folded.holds())
        count = pool_size(workers, len(ranks))  # rank i goes to about process i % count
        args = [
            (
                waited.get(r["rank"], {}),
                ready.get(r["rank"], {}),
                plan_of if r["caramel"] is not None else None,
                options,
                store,
                (len(ranks) - 1 - i) // count,
            )
            for i, r in enumerate(ranks)
        ]
        replays = mapper(rank_replay.rank_simulation, [r["inputs"] for r in ranks], None, args)
    sources = pipeline.joint_sources(results)
    document = rank_replay.job_simulation(replays, ranks[0]["framework"], sources)
    return document, usage_of(results) + usage_of(replays)


def usage_of(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rank: the worker process that computed it and its peak RSS (MiB) by then."""
    return [
        {"rank": r.get("rank"), "pid": r.get("pid"), "peak_rss_mib": r.get("peak_rss_mib")}
        for r in results
        if "error" not in r
    ]


def _with_usage(task: Callable[[list[str]], dict[str, Any]], paths: list[str]) -> dict[str, Any]:
    """Run one task and note the process and its peak RSS in its record."""
    result = task(paths)
    result.setdefault("pid", os.getpid())
    result.setdefault("peak_rss_mib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return result


Task = Callable[[list[str]], dict[str, Any]]
Each = Callable[[dict[str, Any]], dict[str, Any]]
Mapper = Callable[..., list[dict[str, Any]]]
"""Runs a task over rank inputs (see `map_ranks`) on the workers of a `rank_mapper`."""


def map_ranks(
    task: Task,
    rank_inputs: Sequence[RankInput],
    workers: int | None = None,
    dask_address: str | None = None,
    each: Each | None = None,
) -> list[dict[str, Any]]:
    """`task` on every rank's input, in input order: here (`workers` 1), on a local process
    pool (`workers` processes, default the CPUs) or on Dask (`dask_address`, or
    ``"local"`` for a LocalCluster of `workers` processes on 127.0.0.1).

    `task` is a module-level function (or a `partial` of one), so that it pickles by
    name; a worker holds one rank at a time and returns only its small record. `each`
    is applied in this process to every record as it comes back, in input order, and
    its result kept instead: it folds what is needed only in total (a running maximum)
    so that the parent never holds it for every rank at once.
    """
    with rank_mapper(workers, dask_address, len(rank_inputs)) as mapper:
        return mapper(task, rank_inputs, each)


WARM = (
    "planner.job.analysis",
    "planner.job.pipeline",
    "planner.prediction.simulate",
    "planner.planning.buckets",
    "planner.ingest.detect",
    "planner.ingest.kineto",
    "planner.job.rank_analysis",
    "planner.job.rank_replay",
    "planner.job.rank_store",
)
"""Modules every rank task imports (pandas, the readers and the analysis: ~0.4 s
of CPU per process), loaded before a local pool starts: its workers are forked (Linux) with them
loaded, instead of each importing them again, and the parent needs them for the join."""


def pool_size(workers: int | None, tasks: int) -> int:
    """The processes a local pool starts for `tasks` tasks: `workers`, default the CPUs,
    never more than the tasks."""
    return max(1, min(workers or os.cpu_count() or 1, tasks))


@contextmanager
def rank_mapper(
    workers: int | None = None, dask_address: str | None = None, ranks: int = 2
) -> Iterator[Mapper]:
    """The workers of `map_ranks` (here, a process pool or a Dask client), kept for
    several maps in a row: a command that maps twice (`schedule_ranks`) starts them once.
    `ranks`: how many tasks the first map has (a pool never has more processes)."""
    if dask_address is not None:
        with _dask_client(dask_address, workers) as client:
            yield partial(_map, partial(_on_dask, client))
    elif workers == 1 or ranks == 1:
        yield partial(_map, map)
    else:
        count = pool_size(workers, ranks)
        for module in WARM:
            importlib.import_module(module)
        # the modules' objects outlive every rank: the collector of a forked worker (and of
        # this process) need not scan them again at each collection of a rank's objects
        gc.freeze()
        try:
            with ProcessPoolExecutor(max_workers=count) as pool:
                try:
                    yield partial(_map, partial(_pool_map, pool))
                except BaseException:
                    pool.shutdown(cancel_futures=True)  # tasks sent ahead are not waited for
                    raise
        finally:
            gc.unfreeze()


def _pool_map(
    pool: ProcessPoolExecutor, run: Callable[[Any], dict[str, Any]], items: list[Any]
) -> Iterator[dict[str, Any]]:
    """`pool.map(run, items)`: every task sent at once, the records in order; a worker
    that died (a signal, out of memory) is `WorkerDied` naming the first rank input it
    left unfinished, not concurrent.futures' traceback. Closing the iterator early
    cancels the tasks not yet started, as `pool.map`'s does."""
    futures = [pool.submit(run, item) for item in items]
    return _pool_results(futures, items)


def _pool_results(futures: list[Any], items: list[Any]) -> Iterator[dict[str, Any]]:
    try:
        for i, future in enumerate(futures):
            try:
                yield future.result()
            except BrokenProcessPool:
                raise WorkerDied(_first_path(items[i]), DIED) from None
            futures[i] = None
    finally:
        for future in futures:
            if future is not None:
                future.cancel()


DIED = "killed by a signal or out of memory"


def _first_path(item: Any) -> str | None:
    """The first file of a task's rank input (`item`: the paths or a loaded rank, or
    (either, args))."""
    paths = item[0] if isinstance(item, tuple) else item
    if not isinstance(paths, Sequence):  # a rank loaded in this process: its sources
        paths = paths.sources
    return str(paths[0]) if paths else None


def _map(
    mapping: Callable[[Callable[[Any], dict[str, Any]], list[Any]], Iterable[dict[str, Any]]],
    task: Callable[..., dict[str, Any]],
    rank_inputs: Sequence[RankInput],
    each: Each | None = None,
    args: Sequence[tuple[Any, ...]] | None = None,
    lazy: bool = False,
) -> list[dict[str, Any]] | Iterator[dict[str, Any]]:
    """`task(paths)` per rank input, or `task(paths, *args[i])` with `args` (one tuple per
    input: what the parent computed for that rank alone). `lazy`: the records as an
    iterator, the tasks already sent to the workers (a pool or Dask; one process
    computes each as it is asked for), so that the caller works meanwhile. A rank input
    that is not a sequence of paths (a rank loaded in this process, `analysis.rank_view`)
    is handed to the task as it is: only a task run here takes one."""
    tasks = [[str(p) for p in r] if isinstance(r, Sequence) else r for r in rank_inputs]
    if not tasks:
        raise InputError(None, "no rank inputs given")
    keep = each or (lambda result: result)
    if args is None:
        records = mapping(partial(_with_usage, task), tasks)
    else:
        records = mapping(partial(_with_usage_args, task), list(zip(tasks, args, strict=True)))
    if lazy:
        return (keep(r) for r in records)
    return [keep(r) for r in records]


def _with_usage_args(
    task: Callable[..., dict[str, Any]], item: tuple[list[str], tuple[Any, ...]]
) -> dict[str, Any]:
    """`_with_usage` of `task(paths, *args)` for one (paths, args) item."""
    paths, args = item
    return _with_usage(lambda p: task(p, *args), paths)


@contextmanager
def _dask_client(address: str, workers: int | None) -> Iterator[Any]:
    """A Dask client of the scheduler at `address`, or of a LocalCluster (``local``)."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise InputError(None, "--dask needs the dask extra: pip install 'planner[dask]'") from None
    if address == "local":
        with (
            LocalCluster(
                host="127.0.0.1",
                n_workers=workers or os.cpu_count() or 1,
                threads_per_worker=1,
                processes=True,
                dashboard_address=None,
            ) as cluster,
            _dask_client(cluster.scheduler_address, workers) as client,
        ):
            yield client
        return
    try:
        client = Client(address, timeout="10s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise InputError(None, f"cannot reach the Dask scheduler at {address} ({exc})") from None
    with client:
        yield client


def _on_dask(client: Any, run: Task, tasks: list[list[str]]) -> Iterator[dict[str, Any]]:
    """The records of `run` over `tasks` on a Dask client, in task order, each one
    released on the cluster once it is here; the tasks are sent at once."""
    return _released(client.map(run, tasks, pure=False), tasks)


def _released(futures: list[Any], tasks: list[Any]) -> Iterator[dict[str, Any]]:
    """The results of Dask `futures`, in order, each released once it is here; a task
    whose workers kept dying (Dask's `KilledWorker`) is `WorkerDied` naming its input."""
    from distributed import KilledWorker

    for i, future in enumerate(futures):
        try:
            yield future.result()
        except KilledWorker:
            raise WorkerDied(_first_path(tasks[i]), DIED) from None
        futures[i] = None  # let the cluster drop the record
