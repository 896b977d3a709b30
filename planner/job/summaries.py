"""One rank's summary for the job level: what a worker returns after reading one rank
(`rank_summary`: its metrics alone, its collectives, the terms of its oracle bounds and
of the job's Caramel plan), and what the parent folds of the summaries in total, not per
rank (`fold`: the job's op times and the ops every rank holds). The job level joins them
in `planner.job.pipeline`."""

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
    metrics: bool = True,
) -> dict[str, Any]:
    """The summary of one rank's `job` (read from `paths`): its metrics, its communication
    rows (`communication.rank_rows`) and FSDP units (`fsdp.rank_units`), collectives, the
    terms of its oracle bounds and, with `plans` and collectives, of the job's Caramel
    plan (else ``"caramel"`` is None; ``"caramel_problem"`` says why where Caramel does
    not apply to its collectives).
    `oracle`: the rank's `stages.oracles`, when the caller has it (computed once, handed
    on). Without `metrics` its ``document`` is None:
    a plan or a replay needs the other terms only (`pipeline.job_metrics` needs it)."""
    from planner.job import stages
    from planner.measure.communication import rank_rows
    from planner.measure.fsdp import rank_units
    from planner.model.trace import rank_meta
    from planner.planning.scope import rank_problem

    if oracle is None:
        oracle = stages.oracles(job) if job.trace.rows else {}
    document = stages.rank_metrics(job, oracle) if metrics else None
    (rank,) = job.ranks
    graph = job.graphs[rank]
    collective = [n for n, op in graph.ops.items() if op.kind == "collective"]
    coll = _rows_of_ops(job, rank, collective, with_wait=True)
    # FSDP/ZeRO, or no data-parallel group: no Caramel plan (`scope.rank_problem`)
    problem = rank_problem(graph, rank_meta(job, rank)) if collective else None
    planned = plans and collective and problem is None
    return {
        "rank": rank,
        "framework": job.framework,
        "inputs": [str(p) for p in paths],
        "sources": list(job.sources),
        "document": document,
        "communication": rank_rows(job, rank) if metrics else None,
        "fsdp": rank_units(job, rank) if metrics else None,
        "collectives": coll,
        "bounds": _bound_terms(job, rank, oracle[rank].times),
        "caramel": _caramel_terms(job, rank, oracle[rank].times) if planned else None,
        "caramel_problem": problem,
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


def _rows_of_ops(
    job: Job,
    rank: str,
    ops: Collection[str],
    leave_out: Collection[int] = (),
    with_wait: bool = False,
) -> dict[str, list[Any]]:
    """(iteration, op, start, duration) as plain lists (cheap to pickle) of one rank's
    timing rows whose op is one of `ops` (and whose step is
    not in `leave_out`), in table order; `with_wait`: with the ``wait`` the load found
    (0 where it read the rank alone: `pipeline.loaded_waits`). (speed) From the trace's
    numpy columns and op codes (`Trace.op_codes`): no DataFrame filtered per call."""
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
    found = {
        "iteration": table["iteration"][rows].tolist(),
        "op": [str(v) for v in table["op"][rows].tolist()],
        "start": table["start"][rows].tolist(),
        "duration": table["duration"][rows].tolist(),
    }
    if with_wait:
        from planner.model.trace import rank_meta

        found["wait"] = table["wait"][rows].tolist() if "wait" in table else [0] * len(rows)
        called = rank_meta(job, rank).get("collectives") or {}
        if called:  # each row's process group: a row waits for its group's ranks only
            found["group"] = [str((called.get(op) or {}).get("group", "0")) for op in found["op"]]
    return found


def _bound_terms(job: Job, rank: str, times: Mapping[str, float]) -> dict[str, Any]:
    """What `job_metrics` needs to redo the oracle bounds of a rank once waits are known.

    The resources its transfers run on (when it has collectives) are "open": their rows
    (steps the oracle uses) and op order travel; every other resource's sum of oracle
    times is final here, taken in the order `metrics.bounds` adds them.
    """
    from planner.measure.metrics import collectives_alone, device_ops
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
        "applies": bool(graph.transfers) and not collectives_alone(job, rank),
    }


def _caramel_terms(job: Job, rank: str, times: Mapping[str, float]) -> dict[str, Any]:
    """What the job's Caramel plan needs of a rank with collectives (`analysis.caramel_plans`):
    the oracle times of the ops off its transfer resources ("fixed": final here, folded
    into the job's maximum as they arrive, `fold`), the ops on those resources
    (their times wait for the waits, `_open_times`), its transfers' rows (the network
    fit), the priority document's `plan_material` of its transfers and the process
    groups it plans (`scope.group_scope`: None on a rank of one group)."""
    from planner.job import stages
    from planner.model.trace import rank_meta
    from planner.planning.scope import group_scope

    graph = job.graphs[rank]
    open_resources = {graph.ops[n].resource for n in graph.transfers}
    rows = _rows_of_ops(job, rank, graph.transfers)
    return {
        "scope": group_scope(graph, rank_meta(job, rank)),
        "fixed": [[n, t] for n, t in times.items() if graph.ops[n].resource not in open_resources],
        "open": [
            [n, op.resource, int(op.nbytes), op.is_transfer]
            for n, op in graph.ops.items()
            if op.resource in open_resources
        ],
        "transfer_rows": rows,
        "material": stages.plan_material(graph, rank, graph.transfers, job.meta),
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
        intersection of the ranks' op names, `stages.caramel_rank_plans`)."""
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
