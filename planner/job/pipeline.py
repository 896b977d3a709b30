"""`planner.metrics/1` of a multi-rank job from per-rank summaries, byte for byte.

`rank_summary` ingests ONE rank and computes its metrics alone; `job_metrics` joins the
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

import hashlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.errors import InputError

if TYPE_CHECKING:
    import numpy as np

    from planner.model.oracle import TimeOracle
    from planner.model.trace import Job


def load_one_rank(paths: Sequence[str | Path]) -> Job:
    """The Job of one rank's input; InputError when the input holds another number."""
    from planner.ingest import detect

    job = detect.load([Path(p) for p in paths])
    if len(job.graphs) != 1:
        raise InputError(
            paths[0], f"holds {len(job.graphs)} ranks ({', '.join(job.ranks)}); give one rank"
        )
    return plain_text(job)


def plain_text(job: Job) -> Job:
    """`job` with its timings' text columns (rank, op) as Python strings (object
    columns), not pandas string arrays: the same values, which a rank's analysis maps,
    filters and iterates about twice as fast (the per-rank path's speed; one process
    keeps the ingest's frames)."""
    import pandas as pd

    from planner.model.trace import Trace

    def frame(table: Mapping[str, Any]) -> pd.DataFrame:
        return pd.DataFrame(
            {k: pd.Series(v, dtype=object) if v.dtype == object else v for k, v in table.items()}
        )

    trace = Trace(frame(job.trace.table), frame(job.trace.span_table))
    return replace(job, trace=trace)


def rank_summary(paths: Sequence[str], plans: bool = False) -> dict[str, Any]:
    """One task: load one rank's input and return its summary (or an error record);
    `plans`: with the terms of the job's Caramel plan (`schedule`, `simulate`).

    Errors come back as ``{"error": [path, problem]}`` rather than raised, so that they
    cross process and network boundaries intact.
    """
    try:
        return summary_of(load_one_rank(paths), paths, plans)
    except InputError as exc:
        return {"error": [exc.path, exc.problem]}


def summary_of(
    job: Job,
    paths: Sequence[str],
    plans: bool = False,
    oracle: Mapping[str, TimeOracle] | None = None,
) -> dict[str, Any]:
    """The summary of one rank's `job` (read from `paths`): its metrics, collectives, the
    terms of its oracle bounds and, with `plans` and collectives, of the job's Caramel
    plan (else ``"caramel"`` is None). `oracle`: the rank's `analysis.oracles`, when the
    caller has it (computed once, handed on)."""
    from planner.job import analysis
    from planner.model.trace import rank_meta

    if oracle is None:
        oracle = analysis.oracles(job) if len(job.trace.timings) else {}
    document = analysis.metrics(job, oracle)
    (rank,) = job.ranks
    graph = job.graphs[rank]
    collective = [n for n, op in graph.ops.items() if op.kind == "collective"]
    coll = _rows_of_ops(job, rank, collective)
    return {
        "rank": rank,
        "framework": job.framework,
        "inputs": [str(p) for p in paths],
        "sources": list(job.sources),
        "document": document,
        "collectives": _columns(coll),
        "bounds": _bound_terms(job, rank, oracle[rank].times),
        "caramel": _caramel_terms(job, rank, oracle[rank].times) if plans and collective else None,
        "job_signature": {
            "meta": _signature_meta(rank_meta(job, rank)),
            "collectives": [[n, int(graph.ops[n].nbytes)] for n in collective],
        },
    }


def _signature_meta(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a rank's Job meta that `limits.check_same_job` compares and names:
    its source, world size, backend and process groups without their rank lists (which
    grow with the job: O(ranks) each, O(ranks²) in the parent)."""
    dist = meta.get("distributed") or {}
    groups = [
        {k: v for k, v in g.items() if k != "ranks"} if isinstance(g, dict) else g
        for g in (dist.get("pg_config") or [])
    ]
    return {
        "source": meta.get("source"),
        "world_size": meta.get("world_size"),
        "distributed": {"backend": dist.get("backend"), "pg_config": groups},
    }


def _columns(rows: Any) -> dict[str, list[Any]]:
    """(iteration, op, start, duration) of timing rows as plain lists (cheap to pickle)."""
    return {
        "iteration": [int(v) for v in rows["iteration"]],
        "op": [str(v) for v in rows["op"]],
        "start": [int(v) for v in rows["start"]],
        "duration": [int(v) for v in rows["duration"]],
    }


def _rows_of_ops(
    job: Job, rank: str, ops: Collection[str], leave_out: Collection[int] = ()
) -> dict[str, list[Any]]:
    """`_columns` of one rank's timing rows whose op is one of `ops` (and whose step is
    not in `leave_out`), in table order. (speed) From the trace's numpy columns and op
    codes (`Trace.op_codes`): no DataFrame filtered per call."""
    import numpy as np

    table = job.trace.table
    rows = job.trace.rows_of(rank)
    names, codes = job.trace.op_codes
    wanted = set(ops)
    hit = np.array([n in wanted for n in names], dtype=bool)
    keep = hit[codes[rows]] if len(names) else np.zeros(len(rows), dtype=bool)
    if leave_out:
        keep &= ~np.isin(table["iteration"][rows], list(leave_out))
    rows = rows[keep]
    return {
        "iteration": table["iteration"][rows].tolist(),
        "op": [str(v) for v in table["op"][rows].tolist()],
        "start": table["start"][rows].tolist(),
        "duration": table["duration"][rows].tolist(),
    }


def _bound_terms(job: Job, rank: str, times: Mapping[str, float]) -> dict[str, Any]:
    """What `job_metrics` needs to redo the oracle bounds of a rank once waits are known.

    The resources its transfers run on (when it has collectives) are "open": their rows
    (steps the oracle uses) and op order travel; every other resource's sum of oracle
    times is final here, taken in the order `metrics.bounds` adds them.
    """
    from planner.measure.metrics import device_ops
    from planner.model.trace import rank_partial_steps

    graph = job.graphs[rank]
    device = device_ops(graph)
    has_collectives = any(op.kind == "collective" for op in graph.ops.values())
    open_resources = {graph.ops[n].resource for n in graph.transfers} if has_collectives else set()
    order: list[list[Any]] = []
    sums: dict[str, float] = {}
    ops: dict[str, list[list[Any]]] = {}
    for name, t in times.items():
        if device is not None and name not in device:
            continue
        op = graph.ops[name]
        if op.resource not in sums and op.resource not in ops:
            order.append([op.resource, None])
        if op.resource in open_resources:
            ops.setdefault(op.resource, []).append([name, int(op.nbytes), op.is_transfer])
        else:
            sums[op.resource] = sums.get(op.resource, 0.0) + t
    for entry in order:
        entry[1] = sums.get(entry[0])
    partial = rank_partial_steps(job.trace, rank, graph)
    stepped = set(job.trace.table["iteration"][job.trace.rows_of(rank)].tolist())
    left_out = list(partial) if partial and len(stepped) > len(partial) else []
    on_open = {n for n, op in graph.ops.items() if op.resource in open_resources}
    return {
        "order": order,
        "ops": ops,
        "rows": _rows_of_ops(job, rank, on_open, left_out),
        "transfers": [[n, int(graph.ops[n].nbytes)] for n in graph.transfers],
        "applies": bool(graph.transfers),
    }


def _caramel_terms(job: Job, rank: str, times: Mapping[str, float]) -> dict[str, Any]:
    """What the job's Caramel plan needs of a rank with collectives (`caramel_job_plan`):
    the oracle times of the ops off its transfer resources ("fixed": final here, folded
    into the job's maximum as they arrive, `fold`), the ops on those resources
    (their times wait for the waits, `_open_times`), its transfers' rows (the network
    fit) and the priority document's `plan_material` of its transfers."""
    from planner.job import analysis

    graph = job.graphs[rank]
    open_resources = {graph.ops[n].resource for n in graph.transfers}
    rows = _rows_of_ops(job, rank, graph.transfers)
    return {
        "fixed": [[n, t] for n, t in times.items() if graph.ops[n].resource not in open_resources],
        "open": [
            [n, op.resource, int(op.nbytes), op.is_transfer]
            for n, op in graph.ops.items()
            if op.resource in open_resources
        ],
        "transfer_rows": rows,
        "material": analysis.plan_material(graph, rank, graph.transfers, job.meta),
        "op_keys": op_keys(graph.ops),
    }


def op_keys(names: Iterable[str]) -> np.ndarray:
    """The sorted distinct 64-bit keys (BLAKE2b, the same in every process, unlike
    `hash`) of op `names`: what a rank's summary carries so that the parent can tell
    which ops every rank holds (`Folded.holds`) without holding every rank's names."""
    import numpy as np

    keys = [_key(name) for name in names]
    return np.unique(np.array(keys, dtype=np.uint64))


def _key(name: str) -> int:
    digest = hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


@dataclass
class Folded:
    """What the parent keeps of the first pass's summaries in total, not per rank (`fold`):
    each op's largest fixed oracle time over the ranks with collectives (`times`), and
    the keys of the ops every one of them holds (`common`, `op_keys`)."""

    times: dict[str, float] = field(default_factory=dict)
    common: np.ndarray | None = None

    def holds(self) -> Callable[[str], bool]:
        """Whether every rank with collectives holds an op, by name (as the joint path's
        intersection of the ranks' op names, `analysis.caramel_rank_plans`)."""
        common = frozenset(self.common.tolist()) if self.common is not None else frozenset()
        return lambda name: _key(name) in common


def fold(into: Folded) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A `parallel.map_ranks` ``each``: moves a summary's fixed oracle times into `into`
    (the largest over the ranks per op) and intersects its op keys with the others', so
    that the parent holds one table and one key set, not one per rank."""
    import numpy as np

    def fold_one(result: dict[str, Any]) -> dict[str, Any]:
        terms = result.get("caramel")
        if terms is not None:
            times = into.times
            for name, t in terms.pop("fixed"):
                times[name] = max(times[name], t) if name in times else t
            keys = terms.pop("op_keys")
            into.common = keys if into.common is None else np.intersect1d(into.common, keys)
        return result

    return fold_one


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


Waits = tuple[Any, dict[str, dict[tuple[int, str], int]], Any]
"""What `job_waits` gives: (collective rows with their wait, rank -> (step, op) -> wait
ns, the clock alignment)."""


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
    if len(kinds) > 1:
        problem = "some ranks have collectives and some none: give them to one process (-j 1)"
        raise InputError(ranks[0]["sources"][0], problem)
    return {
        "schema": "planner.metrics/1",
        "framework": ranks[0]["framework"],
        "steps": steps,
        "ranks": entries,
        "allreduce": None if kinds == {True} else _allreduce(ranks, frame, waited, alignment),
        "notes": notes,
    }


def job_waits(ranks: Sequence[dict[str, Any]]) -> Waits:
    """(collective rows of every rank with their ``wait``, rank -> (step, op) -> wait ns,
    the clock alignment): `waits.split_waits`, as the joint ingest computes them."""
    import pandas as pd

    from planner.model import waits

    frame = pd.concat(
        [pd.DataFrame(r["collectives"]).assign(rank=r["rank"]) for r in ranks], ignore_index=True
    )
    frame = frame.astype({"iteration": "int64", "start": "int64", "duration": "int64"})
    frame["wait"], alignment = waits.split_waits(frame)
    waited: dict[str, dict[tuple[int, str], int]] = {}
    columns = (frame["rank"], frame["iteration"], frame["op"], frame["wait"])
    for rank, it, op, wait in zip(*columns, strict=True):
        waited.setdefault(rank, {})[(int(it), op)] = int(wait)
    return frame, waited, alignment


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
        "clock_alignment": alignment.to_dict() if alignment is not None else None,
    }


def caramel_inputs(
    results: Sequence[dict[str, Any]],
    fixed: Mapping[str, float],
    waits: Waits | None = None,
    opened: dict[str, dict[str, float]] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(the summaries of the ranks Caramel plans, the inputs of `reference_plan`) of a job
    from its summaries (`rank_summary`, folded by `fold` into `fixed`: `Folded.times`).

    As `analysis.caramel_job_plan` on the whole job: the ranks with collectives, the
    first of them the reference, each op's time the largest over them (the waits for
    peers cut out), the network fitted to all their transfers' rows less the waits.
    InputError when no rank has collectives (Caramel does not apply). `waits`: the
    ranks' `job_waits` when the caller has them; `opened`, when given, receives each
    planned rank's `_open_times` (for `inspect`, not computed twice).
    """
    ranks = checked(results)
    if not ranks:
        raise InputError(None, "no rank inputs given")
    check_same_job(ranks)
    planned = [r for r in ranks if r.get("caramel") is not None]
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
    return planned, {"times": times, "rows": rows}


def reference_plan(
    paths: Sequence[str],
    times: Mapping[str, float],
    rows: Mapping[str, list[Any]],
    channels: int = 1,
    benchmark: Any = None,
) -> dict[str, Any]:
    """One task: the job's Caramel plan on the DAG of the reference rank at `paths`
    (`analysis.caramel_reference_plan`), from the job-level inputs of `caramel_inputs`;
    ``{"plan": Plan, "network": the fit of the transfers' rows}`` or an error record."""
    import pandas as pd

    from planner.job import analysis
    from planner.planning import caramel

    try:
        job = load_one_rank(paths)
    except InputError as exc:
        return {"error": [exc.path, exc.problem]}
    (rank,) = job.ranks
    graph = job.graphs[rank]
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
    own = {name: times[name] for name in graph.ops}
    plan = analysis.caramel_reference_plan(graph, rank, own, frame, channels, benchmark)
    return {"rank": rank, "plan": plan, "network": caramel.trace_network_model(graph, frame)}


def job_priorities(planned: Sequence[dict[str, Any]], plan: Any, folded: Folded) -> dict[str, Any]:
    """The job's `planner.priorities/1` for Caramel: the reference `plan` on every rank
    of `planned` (`caramel_inputs`), from their `plan_material`, its control edges kept
    where every rank holds both ends (`folded`)."""
    from planner.job import analysis

    ops_of = {r["rank"]: r["caramel"]["material"]["ops"] for r in planned}
    plans = analysis.caramel_rank_plans(plan, ops_of, planned[0]["sources"][0], folded.holds())
    return analysis.plans_document(plans, {r["rank"]: r["caramel"]["material"] for r in planned})
