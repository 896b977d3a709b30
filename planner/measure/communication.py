"""Communication time per process group, collective kind and phase, hidden vs exposed.

Per rank and step, each collective's time is its traced duration (the backend record or
the GPU span: what the trace says it took, its wait for peers included); its
``exposed`` part is the part in which the rank computed nothing, as the ingest found it
(`planner.ingest.kineto_exposure`: on a GPU rank no compute kernel ran, on a CPU rank
no innermost CPU op of a computing thread), its ``hidden`` part the rest; None for a
trace whose reader finds no exposure (TF, Horovod). Collectives of two groups that run
at once are each counted whole: a group's figures are its own, and each group's times
add up to the durations of its records.

The rows (`rank_rows`) are per rank, step, group, kind and phase; `join` folds the
ranks' rows into the job's ``communication`` document: the groups as the trace
describes them (`planner.ingest.kineto_groups`: name, ranks, role and where each came
from), the rows, and the totals per group, per kind, per phase and per all three.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from planner.ingest.kineto_calls import KINDS, collective_kind
from planner.model.trace import Job, rank_meta

KEYS = ("group", "kind", "phase")


def op_group(name: str, resource: str, called: Mapping[str, Any]) -> tuple[str, str]:
    """(group, kind) of a collective op: the ingest's (rank meta ``collectives``), else
    its resource's (``net:3`` -> ``3``; ``net`` -> the default ``0``) and its name's where
    that names a kind (``net/all_reduce#2``), else ``collective`` (a Horovod tensor)."""
    meta = called.get(name) or {}
    group = meta.get("group") or (resource.split(":", 1)[1] if ":" in resource else "0")
    kind = meta.get("kind")
    if not kind:
        named = collective_kind(name.rsplit("/", 1)[-1].split("#", 1)[0])
        kind = named if named in KINDS else "collective"
    return str(group), str(kind)


def rank_rows(job: Job, rank: str) -> dict[str, Any] | None:
    """One rank's communication rows (the module's docstring) and its groups; None
    without collectives."""
    graph = job.graphs[rank]
    collective = {n for n, op in graph.ops.items() if op.kind == "collective"}
    if not collective:
        return None
    meta = rank_meta(job, rank)
    called = meta.get("collectives") or {}
    shown = meta.get("exposed") or {}
    table, rows = job.trace.table, job.trace.rows_of(rank)
    names = table["op"][rows].tolist()
    step = np.asarray(table["iteration"][rows], dtype=np.int64)
    took = np.asarray(table["duration"][rows], dtype=np.int64)
    found: dict[tuple[Any, ...], list[Any]] = {}
    for i in (i for i, n in enumerate(names) if n in collective):
        op = graph.ops[names[i]]
        group, kind = op_group(op.name, op.resource, called)
        entry = found.setdefault((int(step[i]), group, kind, op.phase), [0, 0, 0, 0])
        entry[0] += 1
        entry[1] += int(op.nbytes)
        entry[2] += int(took[i])
        if shown and entry[3] is not None:
            entry[3] += exposed_ns(shown, int(step[i]), op.name, int(took[i]))
        else:
            entry[3] = None
    described = meta.get("process_groups") or {}
    groups = {str(k): dict(v) for k, v in described.items() if isinstance(v, dict)}
    for _, group, _, _ in found:
        groups.setdefault(group, {"name": group})
    return {
        "rank": rank,
        "steps": len(set(step.tolist())),
        "groups": groups,
        "rows": [
            {
                "rank": rank,
                "iteration": s,
                "group": g,
                "kind": k,
                "phase": p,
                "count": n,
                "bytes": b,
                "time": t / 1e9,
                "exposed": None if x is None else x / 1e9,
            }  # fmt: skip
            for (s, g, k, p), (n, b, t, x) in sorted(found.items())
        ],
    }


def exposed_ns(shown: Mapping[Any, Any], step: int, op: str, took: int) -> int:
    """The exposed ns of one occurrence as the ingest found it (rank meta ``exposed``,
    keyed by step: an int, or its text once the meta went through JSON)."""
    of_step = shown.get(step, shown.get(str(step))) or {}
    return min(int(of_step.get(op, took)), took)


def join(parts: Iterable[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The job's ``communication`` document from its ranks' `rank_rows`; None when no
    rank has collectives."""
    parts = [p for p in parts if p]
    if not parts:
        return None
    groups: dict[str, dict[str, Any]] = {}
    for part in parts:
        for name, info in part["groups"].items():
            entry = groups.setdefault(name, {**info, "seen_on": []})
            entry["seen_on"].append(part["rank"])
    rows = [row for part in parts for row in part["rows"]]
    steps = {p["rank"]: p["steps"] for p in parts}
    document = {"groups": dict(sorted(groups.items())), "rows": rows}
    for key in KEYS:
        document[f"by_{key}"] = totals(rows, (key,), steps)
    document["by_group_kind_phase"] = totals(rows, KEYS, steps)
    return document


def totals(
    rows: Sequence[Mapping[str, Any]], keys: Sequence[str], steps: Mapping[str, int]
) -> list[dict[str, Any]]:
    """The rows summed per value of `keys`: count, bytes, time, exposed, hidden, and the
    time and exposed time per step of the ranks that have it (`steps`: each rank's number
    of steps)."""
    found: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        entry = found.setdefault(
            tuple(row[k] for k in keys),
            {
                **{k: row[k] for k in keys},
                "count": 0,
                "bytes": 0,
                "time": 0.0,
                "exposed": 0.0,
                "ranks": set(),
            },  # fmt: skip
        )
        for field in ("count", "bytes", "time"):
            entry[field] += row[field]
        known = entry["exposed"] is not None and row["exposed"] is not None
        entry["exposed"] = entry["exposed"] + row["exposed"] if known else None
        entry["ranks"].add(row["rank"])
    out = []
    for _, entry in sorted(found.items()):
        ranks = entry.pop("ranks")
        per = sum(steps[r] for r in ranks) or 1
        exposed = entry["exposed"]
        entry["hidden"] = None if exposed is None else entry["time"] - exposed
        entry["ranks"] = len(ranks)
        entry["time_per_step"] = entry["time"] / per
        entry["exposed_per_step"] = None if exposed is None else exposed / per
        out.append(entry)
    return out
