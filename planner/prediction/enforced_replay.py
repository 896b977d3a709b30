"""A TF plan on the compiled graph as the runtime module enforces it
(`planner.prediction.enforced`): the control edges its chain adds, the ops that then wait
for a control message and the link's latency and rate measured from the rank's transfers.
Apart because it adapts the enforced schedules to the replay's arrays and is used only by
the plans' replay."""

from __future__ import annotations

import numpy as np

from planner.model.plan import Plan
from planner.prediction import enforced
from planner.prediction.compiled import Compiled, KnownRows, PlanArrays


def _op_bytes(compiled: Compiled) -> np.ndarray:
    """Per op of `compiled`, the bytes it carries (NaN: unknown, e.g. a control message)."""
    return np.array([op.nbytes or np.nan for op in compiled.graph.ops.values()], dtype=float)


def _link(compiled: Compiled, known: KnownRows, op_bytes: np.ndarray) -> tuple[float, float]:
    """(`enforced.control_message`, `enforced.link_throughput`) on the records of the
    replay's transfers (`known`: the replay's rows as `op_rows` gives them): the rank's
    own and, on a shared link, its peers'; `op_bytes`: `_op_bytes` of `compiled`.

    The message is every rank's: per rank, the lab's cnn at 600 Mbit/s had its only
    lone small transfers on worker1 (0.48 and 1.09 ms, reads behind a queue) and priced
    worker1's hops at 0.79 ms, the run's arrival plans 9-12% slower than measured;
    pooled, the shortest small transfer (0.14 ms) prices them within 6%.

    The rate is the reads' (recv records, every worker's): the transfers the chain
    leaves alone are reads, and they leave through the PS's uplink, which the workers'
    gradients (their own uplinks) never cross. Counting the sends too priced the reads
    of ``traces/tf/lab_mlp_1500mbit`` at 1902 Mbit/s on a 1500 Mbit/s link (recvs
    alone: 1447), a 6% gain predicted for an arrival chain measured 0.4-1% slower."""
    rows, idx = known
    transfer = compiled.transfer[idx]
    idx = idx[transfer]
    start = rows["start"].to_numpy(dtype=np.float64)[transfer]
    duration = rows["duration"].to_numpy(dtype=np.float64)[transfer]
    nbytes = op_bytes[idx]
    step = rows["iteration"].to_numpy()[transfer]
    ops = compiled.graph.ops
    read = np.array([ops[compiled.names[i]].kind == "recv" for i in idx.tolist()], dtype=bool)
    return (
        enforced.control_message(start, duration, nbytes),
        enforced.link_throughput(start[read], duration[read], nbytes[read], step[read]),
    )


def _enforced(
    compiled: Compiled,
    own: int | None,
    plan: Plan,
    arrays: PlanArrays,
    mode: str,
) -> tuple[PlanArrays, np.ndarray, np.ndarray]:
    """`arrays` with the control edges the TF module adds for `plan` in `mode`, the ops
    that then wait for a control message and the transfers alone on their link
    (`enforced.chain`)."""
    n = len(compiled.names[:own])
    is_transfer = compiled.transfer[compiled.dst]
    joined = (compiled.src >= n) & (compiled.dst < n) & is_transfer
    feeder = dict(zip(compiled.dst[joined].tolist(), compiled.src[joined].tolist(), strict=True))
    index = {name: i for name, i in compiled.index.items() if i < n}
    ops = compiled.graph.ops
    reads = [
        t
        for t in plan.order
        if t in index
        and enforced.is_read(
            t, ops[compiled.names[feeder[index[t]]]].type if index[t] in feeder else None
        )
    ]
    # a read's folded control message leaves with its data, planned or not (a plan of a
    # GraphDef has none): just before it, in its read's group
    planned, chained = set(reads), []
    for t in reads:
        message = f"recv:^{t.removeprefix('recv:')}"
        if message in index and message not in planned:
            chained.append(message)
        chained.append(t)
    src, dst, waits, alone = enforced.chain(chained, index, feeder, mode)
    return (
        PlanArrays(
            arrays.position, np.concatenate([arrays.src, src]), np.concatenate([arrays.dst, dst])
        ),
        waits,
        alone,
    )
