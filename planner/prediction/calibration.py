"""The simulator as the analytic models' cross-check (`planner.planning.ps_p2p_ring`'s
`RingSimulator` hooks): the traced steps replayed, or the traced DAG re-priced with the
calibration's ring all-reduce. Here, not beside the models, because the models are
planning and the replay is prediction, a later stage (docs/architecture.md)."""

from __future__ import annotations

import statistics

from planner.model.oracle import mean_of_runs
from planner.model.trace import Job, with_dedicated
from planner.planning.ps_p2p_ring import Calibration, ring_network
from planner.prediction import event_loop
from planner.prediction.compiled import compile_graph, observed_priority, op_seconds
from planner.prediction.replay import replay
from planner.prediction.timelines import median_step


def replay_simulator(job: Job, cal: Calibration, workers: int) -> float | None:
    """A `RingSimulator` from `planner.prediction.replay.replay`: the median predicted iteration
    time over the traced steps of every rank (the trace's own op times, its observed
    order). Only at the trace's own worker count; None elsewhere or without steps.

    This compares the model with the simulator on the same trace, not on a transfer
    time re-priced from the calibration's f(d): the simulator offers no such what-if yet.
    """
    if workers != cal.workers:
        return None
    steps = [s["predicted"] for r in replay(job)["ranks"] for s in r["steps"]]
    return float(statistics.median(steps)) if steps else None


def calibrated_simulator(job: Job, cal: Calibration, workers: int) -> float | None:
    """A `RingSimulator` on the calibration: the traced DAG of each all-reduce rank, its
    compute ops at their mean traced time, every collective re-priced as a ring
    all-reduce of its bytes over `workers` (Eq. 20 with the calibration's f(d)), list
    scheduled by `planner.prediction.event_loop` in the traced order. The median over ranks.

    Unlike the model, the simulator keeps the DAG: a collective overlaps only the
    compute that does not depend on it, and collectives queue on the network.
    """
    if cal.network is None or cal.network.b <= 0:
        return None
    frame = with_dedicated(job.trace, job.graphs)
    results = []
    for rank, graph in sorted(job.graphs.items()):
        if not any(op.kind == "collective" for op in graph.ops.values()):
            continue
        rows = frame[frame["rank"] == rank]
        times = dict(mean_of_runs(graph, rows).times)
        for name, op in graph.ops.items():
            if op.kind == "collective":
                times[name] = ring_network(op.nbytes, workers, cal.bandwidth, cal.network.a)
        compiled = compile_graph(graph)
        step = rows[rows["iteration"] == median_step(job, rank)]
        priority = observed_priority(compiled, step)
        result = event_loop.run(compiled, op_seconds(compiled, times), priority)
        results.append(float(result.makespan.mean()))
    return float(statistics.median(results)) if results else None
