"""A plan as planner's runtime module enforces it: what the replay of a plan must run.

A plan's predicted gain is only worth having if it is the gain of the files `planner`
exports, applied as its runtime module applies them. On a TensorFlow PS job the
priorities alone change nothing: gRPC serves a rank's pending transfers at once (the
replay shares each PS link among them, `planner.prediction.host.on_links`), so a priority on the
link orders nothing. The TF module (`planner.export.tf_graph`, ``--enforce``) instead
chains the PS-side reads of a rank's transfers, each read at the first place any of its
transfers has in the plan:

- ``arrival`` (the default): read k+1 waits for an arrival marker of read k on the
  worker, whose control edge back to the PS is a control message: transfer k+1 leaves the
  PS one control message after transfer k arrived (TicTac §5.1's "direct dependency in
  the DAG", no two transfers of a rank at once);
- ``sender``: the reads chained on the PS, so the PS sends in plan order, but the
  worker's concurrent RecvTensor RPCs still share the link.

`chain` gives the control edges each mode adds to the replayed step, the transfers that
then wait for a control message (`control_message`) and those it leaves alone on their
link (a message, then their bytes at the link's rate, `link_throughput`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise

import numpy as np

from planner.model.plan import read_of  # noqa: F401 (this module's API)
from planner.model.trace import busy_time

MODES = ("arrival", "sender")
READS = ("ReadVariableOp", "Identity")  # the PS ops whose values the TF module orders
SMALL = 1024  # bytes: a transfer no larger carries a control message, not a tensor
LONE = 5  # lone small transfers a median of the control message needs
# the arrival replay's median |error| against the enforced runs' step on the cnn job: 16
# rank-rounds of two runs of bench/bench_enforce_tf.py --rounds 4 recorded after the
# replay's rules (the reads' rate, the link shared by connection, a read's folded
# control message chained with its data) were set
# (docs/algorithms.md, "A plan replayed as it is enforced")
UNCERTAINTY = {"arrival": 0.163}


def is_read(transfer: str, feeder_type: str | None = None) -> bool:
    """Whether the TF module orders `transfer`: the value of a PS-side variable read
    (`feeder_type`, the type of the PS op it receives from, where known; else its name:
    ``.../ReadVariableOp``, or ``v/read`` of a ref variable). A computed value (a loss
    the PS averaged) is not a read: no edge of the module orders it. A control message
    grappler folded beside a read (``recv:^X``, fed by the `Const` its `ShapeN` became)
    is its read's when X is one, by X's name: it leaves with X's data."""
    if feeder_type is not None and not transfer.startswith("recv:^"):
        return feeder_type in READS
    last = read_of(transfer).rsplit("/", 1)[-1]
    return last.startswith("ReadVariableOp") or last == "read"


def read_groups(order: Sequence[str], index: Mapping[str, int]) -> list[list[int]]:
    """The plan's transfers (op indices, those `index` holds) grouped by their read, the
    groups in the order of each read's first place in the plan."""
    place: dict[str, int] = {}
    groups: list[list[int]] = []
    for name in order:
        if name not in index:
            continue
        read = read_of(name)
        if read not in place:
            place[read] = len(groups)
            groups.append([])
        groups[place[read]].append(index[name])
    return groups


def chain(
    order: Sequence[str],
    index: Mapping[str, int],
    feeder: Mapping[int, int],
    mode: str = "arrival",
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(src, dst, waits, alone) as op indices: the control edges `mode` adds for a rank's
    `order`, the ops that wait for a control message after them, and the transfers it
    leaves alone on their link (each then takes a message's time and its bytes at the
    link's rate, `control_message`, `link_throughput`, not its share of a link it no
    longer shares). ``arrival``: the PS read of each read's transfers (`feeder`:
    transfer -> the PS op it receives from, where the replay holds one; else the
    transfers themselves) after every transfer of the read before, one control message
    later; every planned transfer alone. ``sender``: each read after the read before
    it, no message, no transfer alone."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    groups = read_groups(order, index)
    alone: list[int] = []
    if mode == "arrival":  # each read released by the arrival of the read before it
        alone = [i for g in groups for i in g]
        steps = [
            (before, sorted({feeder.get(i, i) for i in after}))
            for before, after in pairwise(groups)
        ]
    else:  # each PS read after the read before it
        reads = [r for g in groups if (r := sorted({feeder[i] for i in g if i in feeder}))]
        steps = list(pairwise(reads))
    src = [u for before, after in steps for u in before for _ in after]
    dst = [v for before, after in steps for _ in before for v in after]
    waits = [v for _, after in steps for v in after] if mode == "arrival" else []
    as_array = lambda xs: np.asarray(xs, dtype=np.int64)  # noqa: E731
    return as_array(src), as_array(dst), as_array(waits), as_array(alone)


def control_message(start: np.ndarray, duration: np.ndarray, nbytes: np.ndarray) -> float:
    """The time (s) a control message between a worker and its PS takes: the median
    traced duration of the transfers of at most `SMALL` bytes that had the link to
    themselves (no other transfer in flight: a small message's time is its latency,
    which a queue behind another transfer inflates), where at least `LONE` such are
    recorded, else the shortest small transfer; 0 without any. Every rank's records
    count: the latency is the network's, and a rank whose small messages all ran beside
    other transfers has no lone one of its own. `start`, `duration` (ns), `nbytes` per
    transfer record (NaN: unknown size, a control message)."""
    small = np.nan_to_num(nbytes, nan=0.0) <= SMALL
    if not small.any():
        return 0.0
    order = np.argsort(start, kind="stable")
    begin, end = start[order], start[order] + duration[order]
    before = np.concatenate([[-np.inf], np.maximum.accumulate(end)[:-1]])
    after = np.concatenate([begin[1:], [np.inf]])
    alone = np.zeros(len(start), dtype=bool)
    alone[order] = (before <= begin) & (end <= after)
    lone = duration[small & alone]
    return float(np.median(lone) if len(lone) >= LONE else duration[small].min()) / 1e9


def caution(mode: str | None) -> str | None:
    """What a plan's replayed gain in `mode` does not model, and how far it missed where
    it was measured, for every output that prints it, on any job (the figure is cited
    as the cnn job's, never as the job at hand's); None where nothing is known."""
    if mode not in UNCERTAINTY:
        return None
    return (
        "enforced by arrival, each transfer also waits for the worker's and the PS's "
        "executors to dispatch its marker and read, which the traced run never shows: "
        "measured against runs that enforced a plan (the generated TF cnn job: planner docs "
        f"algorithms), the replay missed the enforced step by {UNCERTAINTY[mode]:.1%} "
        "(median, either way), so a gain smaller than that is not one"
    )


def link_throughput(
    start: np.ndarray, duration: np.ndarray, nbytes: np.ndarray, step: np.ndarray | None = None
) -> float:
    """The bytes per second a link moved while any transfer was in flight on it: all the
    transfers' bytes over the union of their records (`start`, `duration` in ns), per
    traced step (`step`, each record's; one step when None), the median over the steps
    that moved a byte; a low estimate of its bandwidth, as the latency-bound spells count
    in the union. Per step, since a step whose peer's records are missing (its
    transfers shared the link unseen) reads low: the lab's mlp at 600 Mbit/s moved
    598-600 Mbit/s in four steps and 316 in the fifth, whose peer records the replay
    had left out (`host._shared`); pooled, 545. 0 without a timed byte."""
    steps = np.zeros(len(start), dtype=np.int64) if step is None else np.asarray(step)
    rates = []
    for s in np.unique(steps):
        mine = steps == s
        union = float(busy_time(start[mine], duration[mine]))
        moved = float(np.nansum(nbytes[mine]))
        if union > 0 and moved > 0:
            rates.append(moved / (union / 1e9))
    return float(np.median(rates)) if rates else 0.0
