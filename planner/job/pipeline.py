"""`planner.metrics/1` of a multi-rank job from per-rank summaries, byte for byte.

`summaries.rank_summary` ingests ONE rank and computes its metrics alone; `job_metrics` joins the
summaries into the document one process computes on the whole job. The only figures
that need the other ranks come from each collective's wait for the last rank
(`planner.model.waits`): the wait is cut from the collective's dedicated time (so it moves the
time oracle of the resources the transfers run on, hence the oracle bounds Umax/Lmin),
and it splits the transfers' spans, the steps' ``wait`` and the stragglers. A summary
therefore carries its rank's collective rows and the rows and op order of its transfer
resources; the parent computes the waits from every rank's collective rows
(`waits.split_waits`, as the joint ingest does) and finishes those figures, adding in
the same order as `planner.measure.metrics.bounds`, so that the floats are the same.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.errors import InputError
from planner.job.summaries import load_one_rank

if TYPE_CHECKING:
    from planner.job.summaries import Folded
    from planner.model.graph import OpGraph
    from planner.model.trace import Job


def joint_sources(ranks: Sequence[dict[str, Any]]) -> list[str]:
    """The job's sources in the joint load's order: every rank's traces (its windows, in
    order), then every Execution Trace (``et_<trace>`` beside its trace, as
    `parallel.rank_inputs` pairs them)."""

    def is_et(source: str, mine: Sequence[str]) -> bool:
        name = Path(source).name
        return name.startswith("et_") and any(Path(s).name == name[3:] for s in mine)

    traces = [s for r in ranks for s in r["sources"] if not is_et(s, r["sources"])]
    return traces + [s for r in ranks for s in r["sources"] if is_et(s, r["sources"])]


def checked(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The summaries in rank order; InputError for the first failed rank, a rank given
    twice or ranks of different frameworks."""
    for result in results:
        if "error" in result:
            path, problem = result["error"]
            raise InputError(path, problem)
    by_rank: dict[str, dict[str, Any]] = {}
    for result in results:
        if result["rank"] in by_rank:
            raise InputError(
                result["sources"][0],
                f"rank {result['rank']!r} also comes from {by_rank[result['rank']]['sources'][0]}",
            )
        by_rank[result["rank"]] = result
    ranks = [by_rank[r] for r in sorted(by_rank)]
    frameworks = sorted({r["framework"] for r in ranks})
    if len(frameworks) > 1:
        raise InputError(ranks[0]["sources"][0], f"ranks mix frameworks ({', '.join(frameworks)})")
    return ranks


Waits = tuple[Any, dict[str, dict[tuple[int, str], int]], dict[str, Any] | None]
"""What `job_waits` gives: (collective rows with their wait, rank -> (step, op) -> wait
ns, the clock alignment as `ClockAlignment.to_dict`)."""


def job_metrics(results: Sequence[dict[str, Any]], waits: Waits | None = None) -> dict[str, Any]:
    """The job's `planner.metrics/1` from its ranks' summaries (`rank_summary`); `waits`:
    their `job_waits` when the caller has them (computed once per job)."""

    ranks = checked(results)
    if not ranks:
        raise InputError(None, "no rank inputs given")
    check_same_job(ranks)
    frame, waited, alignment = waits if waits is not None else job_waits(ranks)
    steps, entries, notes = [], [], []
    for r in ranks:
        document = r["document"]
        steps.extend(document["steps"])
        notes.extend(document["notes"])
        (entry,) = document["ranks"]
        entry = dict(entry)
        if "oracle_umax" in entry:
            umax, lmin = _bounds(r["bounds"], waited.get(r["rank"], {}))
            entry["oracle_umax"], entry["oracle_lmin"] = umax, lmin
            if r["bounds"]["applies"]:
                from planner.measure.metrics import speedup_bound

                entry["oracle_speedup_bound"] = speedup_bound(umax, lmin)
        entries.append(entry)
    kinds = {r["document"]["allreduce"] is None for r in ranks}
    if len(kinds) > 1:  # a rank of an all-reduce job that all-reduces nothing: a cut trace
        lacking = next(r for r in ranks if r["document"]["allreduce"] is None)
        having = next(r for r in ranks if r["document"]["allreduce"] is not None)
        problem = (
            f"{lacking['rank']} has no collectives while {having['rank']} has: "
            "not the ranks of one all-reduce job (a trace cut before its collectives?)"
        )
        raise InputError(lacking["sources"][0], problem)
    document = {
        "schema": "planner.metrics/1",
        "framework": ranks[0]["framework"],
        "steps": steps,
        "ranks": entries,
        "allreduce": None if kinds == {True} else _allreduce(ranks, frame, waited, alignment),
        "notes": notes,
    }
    return with_communication(document, ranks)


def with_communication(
    document: dict[str, Any], ranks: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """`document` (a job's metrics or inspection) with the ranks' communication rows
    joined (`communication.join`: per process group, kind and phase, hidden vs exposed)
    where a rank has collectives, and their FSDP units (`fsdp.join`) where a rank
    reduce-scatters."""
    from planner.measure import communication, fsdp

    found = communication.join(r.get("communication") for r in ranks)
    if found is not None:
        document["communication"] = found
    units = fsdp.join(r.get("fsdp") for r in ranks)
    if units is not None:
        document["fsdp"] = units
    return document


def job_waits(ranks: Sequence[dict[str, Any]]) -> Waits:
    """(collective rows of every rank with their ``wait``, rank -> (step, op) -> wait ns,
    the clock alignment): `waits.split_waits`, as the joint ingest computes them."""
    from planner.model import waits

    frame = _collective_frame(ranks)
    frame["wait"], alignment = waits.split_waits(frame)
    return frame, _waited(frame), alignment.to_dict() if alignment is not None else None


def loaded_waits(ranks: Sequence[dict[str, Any]], alignment: dict[str, Any] | None) -> Waits:
    """`job_waits` as the load of a whole job found them (its ingest read every rank's
    collectives together: each row's ``wait`` in the summaries, the job's `alignment`,
    ``meta["clock_alignment"]``): not computed twice; and a rank selected from a loaded
    job (``--rank``) keeps its waits for the peers it was read with."""
    frame = _collective_frame(ranks)
    return frame, _waited(frame), alignment


def _collective_frame(ranks: Sequence[dict[str, Any]]) -> Any:
    """Every rank's collective rows (``rank`` last), in rank and table order."""
    import pandas as pd

    keys = list(dict.fromkeys(k for r in ranks for k in r["collectives"]))
    columns: dict[str, list[Any]] = {k: [] for k in keys}
    rank: list[str] = []
    for r in ranks:  # one frame of the columns joined (a frame per rank, concatenated,
        # cost 0.7 ms a rank)
        rows = r["collectives"]
        for key in keys:
            columns[key].extend(rows[key] if rows else ())
        rank.extend([r["rank"]] * (len(rows[keys[0]]) if rows and keys else 0))
    frame = pd.DataFrame({**columns, "rank": rank})
    typed = {k: "int64" for k in ("iteration", "start", "duration", "wait") if k in frame}
    return frame.astype(typed)


def _waited(frame: Any) -> dict[str, dict[tuple[int, str], int]]:
    """Rank -> (step, op) -> wait ns of `frame`'s collective rows."""
    waited: dict[str, dict[tuple[int, str], int]] = {}
    columns = (frame["rank"], frame["iteration"], frame["op"], frame["wait"])
    for rank, it, op, wait in zip(*columns, strict=True):
        waited.setdefault(rank, {})[(int(it), op)] = int(wait)
    return waited


def check_same_job(ranks: Sequence[dict[str, Any]]) -> None:
    """Refuse ranks of different jobs, as the joint Kineto ingest does
    (`limits.check_same_job`, on the collectives each summary carries)."""
    import numpy as np

    from planner.ingest.limits import check_same_job
    from planner.model.graph import Op, OpGraph

    if ranks[0]["framework"] != "pytorch":
        return
    empty = np.zeros(0, dtype=np.int64)
    graphs = {
        r["rank"]: OpGraph(
            ops={
                n: Op(name=n, kind="collective", nbytes=b)
                for n, b in r["job_signature"]["collectives"]
            },
            src=empty,
            dst=empty,
            control=np.zeros(0, dtype=bool),
        )
        for r in ranks
    }
    check_same_job(graphs, {r["rank"]: r["job_signature"]["meta"] for r in ranks})


def _bounds(terms: Mapping[str, Any], waited: Mapping[tuple[int, str], int]) -> tuple[float, float]:
    """(Umax, Lmin) of a rank from its `_bound_terms`, the open resources' oracle redone
    with the waits cut out of the collectives (`trace.with_dedicated`, `oracle.of_runs`)."""
    import numpy as np

    from planner.model.oracle import fit_network_model

    resource = {name: res for res, ops in terms["ops"].items() for name, _, _ in ops}
    minimum = _open_minimum(terms["rows"], resource, waited)
    transfers = [(n, b) for n, b in terms["transfers"] if n in minimum and b > 0]
    network = fit_network_model(
        np.array([b for _, b in transfers]), np.array([minimum[n] for n, _ in transfers])
    )
    per_resource: dict[str, float] = {}
    for res, total in terms["order"]:
        if total is not None:
            per_resource[res] = total
            continue
        value = 0.0
        for name, nbytes, is_transfer in terms["ops"][res]:
            if name in minimum:
                t = float(minimum[name])
            elif is_transfer and network is not None:
                t = network.time(nbytes)
            else:
                t = 0.0
            value = value + t
        per_resource[res] = value
    return float(sum(per_resource.values())), float(max(per_resource.values(), default=0.0))


def _open_times(
    terms: Mapping[str, Any], caramel: Mapping[str, Any], waited: Mapping[tuple[int, str], int]
) -> dict[str, float]:
    """The oracle times (`oracle.of_runs`, min) of a rank's ops on its transfer resources,
    the waits cut out of its collectives (`trace.with_dedicated`), as the joint job's."""
    import numpy as np

    from planner.model.oracle import fit_network_model

    resource = {name: res for name, res, _, _ in caramel["open"]}
    minimum = _open_minimum(terms["rows"], resource, waited)
    transfers = [(n, b) for n, b in terms["transfers"] if n in minimum and b > 0]
    network = fit_network_model(
        np.array([b for _, b in transfers]), np.array([minimum[n] for n, _ in transfers])
    )
    times = {}
    for name, _, nbytes, is_transfer in caramel["open"]:
        if name in minimum:
            times[name] = float(minimum[name])
        elif is_transfer and network is not None:
            times[name] = network.time(nbytes)
        else:
            times[name] = 0.0
    return times


def _open_minimum(
    rows: Mapping[str, list[Any]],
    resource: Mapping[str, str],
    waited: Mapping[tuple[int, str], int],
) -> dict[str, float]:
    """Op -> minimum over the steps of its dedicated time (s) on its resource (`resource`;
    an op `resource` does not name is not shared out and counts 0), the waits cut out of
    the collectives. Plain dicts, not a pandas groupby: the parent runs it for every rank
    between the two passes, while the workers wait."""
    import numpy as np

    from planner.model.trace import dedicated_durations

    minimum: dict[str, float] = {}
    if rows["op"]:
        ops = rows["op"]
        wait = np.array(
            [waited.get((i, o), 0) for i, o in zip(rows["iteration"], ops, strict=True)],
            dtype=np.int64,
        )
        start = np.array(rows["start"], dtype=np.int64) + wait
        duration = np.array(rows["duration"], dtype=np.int64) - wait
        groups: dict[tuple[Any, str], list[int]] = {}  # (step, resource) -> rows, in order
        for i, (iteration, op) in enumerate(zip(rows["iteration"], ops, strict=True)):
            res = resource.get(op)
            if res is not None:
                groups.setdefault((iteration, res), []).append(i)
        dedicated = np.zeros(len(ops), dtype=np.float64)  # 0 where no resource is named
        for idx in groups.values():
            dedicated[idx] = dedicated_durations(start[idx], duration[idx])
        lowest: dict[str, float] = {}
        for op, d in zip(ops, dedicated.tolist(), strict=True):
            lowest[op] = min(lowest[op], d) if op in lowest else d
        minimum = {op: lowest[op] / 1e9 for op in sorted(lowest)}
    return minimum


def _allreduce(
    ranks: Sequence[dict[str, Any]],
    frame: Any,
    waited: Mapping[str, Mapping[tuple[int, str], int]],
    alignment: Any,
) -> dict[str, Any]:
    """The job's `planner.allreduce/1` from the ranks' own (waits 0) and the waits."""
    from planner.measure.allreduce import SCHEMA, job_summary
    from planner.model.waits import with_step_waits

    steps, entries, transfers = [], [], []
    for r in ranks:
        document = r["document"]["allreduce"]
        rows = r["collectives"]
        own = waited.get(r["rank"], {})
        if len(rows["op"]) != len(document["transfers"]):
            raise InputError(r["sources"][0], "collective rows and transfers disagree")
        for entry, it, op, duration in zip(
            document["transfers"], rows["iteration"], rows["op"], rows["duration"], strict=True
        ):
            wait = own.get((it, op), 0)
            transfers.append(
                {**entry, "wait": float(wait) / 1e9, "transfer": (duration - wait) / 1e9}
            )
        steps.extend(dict(s) for s in document["steps"])
        entries.extend(document["ranks"])
    columns = ["iteration", "op", "start", "duration", "wait", "rank"]
    straggler_list = with_step_waits(frame[columns], steps)
    return {
        "schema": SCHEMA,
        "framework": ranks[0]["framework"],
        "steps": steps,
        "ranks": entries,
        "transfers": transfers,
        "stragglers": straggler_list,
        "job": job_summary(len(ranks), steps, straggler_list),
        "clock_alignment": alignment,
    }


def caramel_inputs(
    results: Sequence[dict[str, Any]],
    fixed: Mapping[str, float],
    waits: Waits | None = None,
    opened: dict[str, dict[str, float]] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(the summaries of the ranks Caramel plans, the inputs of `reference_plan`) of a job
    from its summaries (`rank_summary`, folded by `fold` into `fixed`: `Folded.times`).

    The ranks with collectives, the first of them the reference, each op's time the
    largest over them (the waits for peers cut out), the network fitted to all their
    transfers' rows less the waits.
    InputError when no rank has collectives (Caramel does not apply). `waits`: the
    ranks' `job_waits` when the caller has them; `opened`, when given, receives each
    planned rank's `_open_times` (for `inspect`, not computed twice).
    """
    ranks = checked(results)
    if not ranks:
        raise InputError(None, "no rank inputs given")
    check_same_job(ranks)
    planned = [r for r in ranks if r.get("caramel") is not None]
    why = next((r["caramel_problem"] for r in ranks if r.get("caramel_problem")), None)
    if why is not None:  # FSDP/ZeRO, or no data-parallel group (`scope.rank_problem`)
        raise InputError(ranks[0]["sources"][0], why)
    if not planned:
        problem = "Caramel plans all-reduce collectives; this input has none"
        raise InputError(ranks[0]["sources"][0], f"{problem}, and no scheduler applies")
    _, waited, _ = waits if waits is not None else job_waits(ranks)
    times = dict(fixed)
    rows: dict[str, list[Any]] = {
        "rank": [], "iteration": [], "op": [], "start": [], "duration": [], "wait": []
    }  # fmt: skip
    for r in planned:
        own = waited.get(r["rank"], {})
        open_times = _open_times(r["bounds"], r["caramel"], own)
        if opened is not None:
            opened[r["rank"]] = open_times
        for name, t in open_times.items():
            times[name] = max(times[name], t) if name in times else t
        transfer = r["caramel"]["transfer_rows"]
        rows["rank"].extend([r["rank"]] * len(transfer["op"]))
        rows["iteration"].extend(transfer["iteration"])
        rows["op"].extend(transfer["op"])
        rows["start"].extend(transfer["start"])
        rows["duration"].extend(transfer["duration"])
        rows["wait"].extend(
            own.get((it, op), 0)
            for it, op in zip(transfer["iteration"], transfer["op"], strict=True)
        )
    return planned, {"times": times, "rows": rows, "scope": planned[0]["caramel"].get("scope")}


def reference_plan(
    source: Sequence[str] | Job,
    times: Mapping[str, float],
    rows: Mapping[str, list[Any]],
    channels: int = 1,
    benchmark: Any = None,
    store: str | None = None,
    scope: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One task: the job's Caramel plan on the DAG of the reference rank at `source` (its
    paths, or the rank loaded in this process), from the job-level inputs of
    `caramel_inputs` (`plan_on`); ``{"plan": Plan, "network": the fit of the transfers'
    rows}`` or an error record. A rank given by its paths comes from `store` where the
    first pass kept it there (`rank_store`: 2 ms, where its trace takes 0.1 s and more)."""
    from planner.job import rank_store

    if not isinstance(source, Sequence):
        job = source
    else:
        job = rank_store.load(store, source, keep=True) if store is not None else None
        try:
            job = job or load_one_rank(source)
        except InputError as exc:
            return {"error": [exc.path, exc.problem]}
    (rank,) = job.ranks
    return plan_on(job.graphs[rank], rank, times, rows, channels, benchmark, scope)


def plan_on(
    graph: OpGraph,
    rank: str,
    times: Mapping[str, float],
    rows: Mapping[str, list[Any]],
    channels: int = 1,
    benchmark: Any = None,
    scope: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The job's Caramel plan on the reference rank's `graph`
    (`stages.caramel_reference_plan`) from the inputs of `caramel_inputs`:
    ``{"rank", "plan": Plan, "network": the fit of the transfers' rows}``; `scope`: the
    process groups it plans (`scope.group_scope`), whose transfers alone are fitted."""
    import pandas as pd

    from planner.job import stages
    from planner.planning import caramel

    frame = pd.DataFrame(
        {
            "rank": pd.array(rows["rank"], dtype="str"),
            "iteration": pd.array(rows["iteration"], dtype="int64"),
            "op": pd.array(rows["op"], dtype="str"),
            "start": pd.array(rows["start"], dtype="int64"),
            "duration": pd.array(rows["duration"], dtype="int64"),
            "wait": pd.array(rows["wait"], dtype="int64"),
        }
    )
    if scope is not None:
        frame = frame[frame["op"].isin(scope["planned"])].reset_index(drop=True)
    own = {name: times[name] for name in graph.ops}
    plan = stages.caramel_reference_plan(graph, rank, own, frame, channels, benchmark, scope)
    return {"rank": rank, "plan": plan, "network": caramel.trace_network_model(graph, frame)}


def job_priorities(planned: Sequence[dict[str, Any]], plan: Any, folded: Folded) -> dict[str, Any]:
    """The job's `planner.priorities/1` for Caramel: the reference `plan` on every rank
    of `planned` (`caramel_inputs`), from their `plan_material`, its control edges kept
    where every rank holds both ends (`folded`)."""
    from planner.job import stages

    ops_of = {r["rank"]: r["caramel"]["material"]["ops"] for r in planned}
    plans = stages.caramel_rank_plans(plan, ops_of, planned[0]["sources"][0], folded.holds())
    return stages.plans_document(plans, {r["rank"]: r["caramel"]["material"] for r in planned})
