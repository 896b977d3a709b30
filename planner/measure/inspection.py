"""`planner inspect`: what is in the input, read from the trace's numpy columns.

Kept apart from `planner.job.analysis` so that inspecting a trace loads neither pandas nor
networkx (issue #18: a command's fixed cost). Its oracle is the min-of-runs oracle of
`planner.model.oracle`, computed on `Trace.table`; `analysis` uses the same one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from planner.measure import communication, fsdp
from planner.model.oracle import TimeOracle, min_of_codes
from planner.model.trace import (
    Job,
    dedicated_columns,
    job_parameters,
    queued_before,
    rank_meta,
    rank_partial_steps,
)


def oracles(job: Job) -> dict[str, TimeOracle]:
    """The min-of-runs oracle of every rank (empty times where nothing was traced)."""
    return dict(_each_oracle(job, list(job.graphs)))


def _each_oracle(job: Job, order: list[str]) -> Iterator[tuple[str, TimeOracle]]:
    """(rank, its min-of-runs oracle), one rank at a time: a caller that needs one rank's
    oracle at a time holds one, not all (`inspect`'s peak memory on many ranks)."""
    _, dedicated = dedicated_columns(job.trace, job.graphs)
    iteration = job.trace.table["iteration"]
    names, codes = job.trace.op_codes
    for rank in order:
        graph = job.graphs[rank]
        rows = job.trace.rows_of(rank)
        partial = rank_partial_steps(job.trace, rank, graph)
        yield rank, min_of_codes(graph, names, codes[rows], iteration[rows], dedicated[rows],
                                 partial)  # fmt: skip


def mean_waits(job: Job) -> dict[tuple[str, str], float]:
    """(rank, op) -> the mean seconds its collective waited for peers, over the rows that
    waited (`planner.model.waits`); empty when the trace has no ``wait`` column."""
    table = job.trace.table
    if "wait" not in table:
        return {}
    return waits_by_op(table["rank"], table["op"], table["wait"])


def waits_by_op(ranks: Any, ops: Any, waits: Any) -> dict[tuple[str, str], float]:
    """(rank, op) -> the mean of `waits` (ns, per row) over the rows that waited, in s."""
    waited = np.flatnonzero(np.asarray(waits) > 0)
    total: dict[tuple[str, str], int] = {}
    count: Counter[tuple[str, str]] = Counter()
    for key, wait in zip(
        zip(np.asarray(ranks)[waited].tolist(), np.asarray(ops)[waited].tolist(), strict=True),
        np.asarray(waits)[waited].tolist(),
        strict=True,
    ):
        total[key] = total.get(key, 0) + wait
        count[key] += 1
    return {key: total[key] / count[key] / 1e9 for key in total}


def inspect(job: Job, oracle: Mapping[str, TimeOracle] | None = None) -> dict[str, Any]:
    """What is in the input: devices, op counts by kind, transfers, steps, notes.

    `oracle`: the job's `oracles`, when a caller has them already (computed once, handed on).
    """
    order = [rank for rank in job.ranks if rank in job.graphs]
    each = _each_oracle(job, order) if oracle is None and job.trace.rows else iter(())
    built = dict(oracle or {})
    waited = mean_waits(job)
    ranks = []
    for rank in job.ranks:
        graph = job.graphs[rank]
        while oracle is None and rank not in built:  # one rank's oracle at a time
            done = next(each, None)
            if done is None:
                break
            built = {done[0]: done[1]}
        times = built.get(rank)
        carried = Counter(p.get("collective") for p in job_parameters(job, rank))
        meta = rank_meta(job, rank)
        called = meta.get("collectives") or {}
        transfers = [
            {
                "name": name,
                "kind": graph.ops[name].kind,
                "resource": graph.ops[name].resource,
                "param": graph.ops[name].param,
                "nbytes": graph.ops[name].nbytes,
                "parameters": carried.get(name),
                "time": times.time(name) if times else None,
                "wait_mean": float(waited.get((rank, name), 0.0)),
                "observed_in": times.observed_in.get(name, 0) if times else 0,
                **({"collective": called[name]} if name in called else {}),
            }
            for name in graph.transfers
        ]
        ranks.append(
            {
                "rank": rank,
                "resources": graph.resources,
                "ops": len(graph),
                "edges": graph.edge_count,
                "ops_by_kind": dict(sorted(Counter(o.kind for o in graph.ops.values()).items())),
                "ops_by_type": dict(
                    Counter(o.type or o.kind for o in graph.ops.values()).most_common(10)
                ),
                "transfer_bytes": sum(t["nbytes"] for t in transfers),
                "iterations": job.trace.iterations(rank),
                "transfers": transfers,
                "gpu_steps": gpu_steps(job, rank),
                "queued_before": queued_offsets(job, rank),
                **({"process_groups": meta["process_groups"]} if "process_groups" in meta else {}),
            }
        )
    document = {
        "schema": "planner.inspect/1",
        "framework": job.framework,
        "sources": list(job.sources),
        "notes": list(job.notes),
        "ranks": ranks,
        "clock_alignment": job.meta.get("clock_alignment"),
    }
    if "horovod" in job.meta:  # per tensor: all-reduces, negotiation, transfer; fused groups
        document["horovod"] = job.meta["horovod"]
    found = communication.join(communication.rank_rows(job, rank) for rank in job.ranks)
    if found is not None:  # per process group, kind and phase; hidden vs exposed
        document["communication"] = found
    units = fsdp.join(fsdp.rank_units(job, rank) for rank in job.ranks)
    if units is not None:  # per FSDP unit: all-gathers exposed, reduce-scatters hidden
        document["fsdp"] = units
    return document


def queued_offsets(job: Job, rank: str) -> dict[str, float]:
    """`trace.queued_before` as seconds from the first traced step's start (the CPU
    running ahead; negative: the work ended before the step began). The first step's
    work there waits for it."""
    queued = queued_before(job, rank)
    spans = job.trace.span_table
    mine = np.asarray(spans["rank"], dtype=object) == rank
    if not queued or not mine.any():
        return {}
    start = int(np.asarray(spans["start"])[mine].min())
    return {str(k): (int(v) - start) / 1e9 for k, v in sorted(queued.items())}


def gpu_steps(job: Job, rank: str) -> list[dict[str, Any]]:
    """Per step of a GPU rank: its CPU span, the GPU span of the work it launched, and
    the lag from the CPU start to the GPU start (seconds; empty on a CPU rank)."""
    meta = rank_meta(job, rank)
    return [
        {
            "iteration": s["step"],
            "cpu_span": (s["cpu_end"] - s["cpu_start"]) / 1e9,
            "gpu_span": (s["gpu_end"] - s["gpu_start"]) / 1e9,
            "lag": (s["gpu_start"] - s["cpu_start"]) / 1e9,
        }
        for s in meta.get("steps", [])
    ]
