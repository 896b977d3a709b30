"""TimeOracle: Time(op) for the schedulers, metrics and simulation.

Default is the minimum over the traced iterations of each op's dedicated time (TicTac
§5 uses the minimum of 5 runs, Caramel of 10). A transfer never observed gets
``f(nbytes)`` from a linear network model fitted to the observed transfers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from planner.model.arrays import unique
from planner.model.graph import OpGraph
from planner.model.records import partial_steps

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class NetworkModel:
    """f(d) = a + b*d seconds for a transfer of d bytes (Caramel §4.1)."""

    a: float
    b: float
    r2: float = float("nan")
    points: int = 0
    # the latency of a benchmark's fastest calls (`netbench.read_model`), where it has one
    a_fastest: float | None = None

    def time(self, nbytes: float) -> float:
        return self.a + self.b * nbytes


@dataclass(frozen=True)
class TimeOracle:
    """Seconds per op, with where each figure came from.

    `source[op]` is ``observed`` (min over iterations), ``network_model`` (a transfer
    never observed, from `network`) or ``unobserved`` (a compute op never observed: 0).
    `observed_in[op]` counts the iterations the op was seen in.
    """

    times: Mapping[str, float]
    source: Mapping[str, str] = field(default_factory=dict)
    observed_in: Mapping[str, int] = field(default_factory=dict)
    network: NetworkModel | None = None

    def time(self, op: str) -> float:
        return self.times.get(op, 0.0)


def fit_network_model(nbytes: np.ndarray, seconds: np.ndarray) -> NetworkModel | None:
    """Least-squares fit of f(d) = a + b*d with a, b >= 0; None with < 2 distinct sizes.

    A latency or a per-byte cost cannot be negative, so when the free fit gives one
    (noise on few or similar sizes) the best fit on that boundary is taken instead.
    """
    x = np.asarray(nbytes, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    if len(x) < 2 or len(unique(x)) < 2:
        return None
    b_free, a_free = np.polyfit(x, y, 1)
    candidates = [
        (0.0, max(float((x * y).sum() / (x * x).sum()), 0.0)),
        (float(max(y.mean(), 0.0)), 0.0),
    ]
    if a_free >= 0 and b_free >= 0:
        candidates.append((float(a_free), float(b_free)))
    a, b = min(candidates, key=lambda ab: float(((y - ab[0] - ab[1] * x) ** 2).sum()))
    residual = y - (a + b * x)
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((residual**2).sum()) / total if total > 0 else float("nan")
    return NetworkModel(a=a, b=b, r2=r2, points=len(x))


def min_of_runs(graph: OpGraph, timings: pd.DataFrame) -> TimeOracle:
    """The oracle of one rank: per-op minimum of `dedicated` ns over iterations.

    The schedulers' oracle (TicTac §5: the minimum of the runs). `timings` holds the
    rank's rows with a `dedicated` column (see `planner.model.trace.with_dedicated`).
    """
    return of_runs(graph, timings, "min")


def mean_of_runs(graph: OpGraph, timings: pd.DataFrame) -> TimeOracle:
    """Per-op mean over iterations: the oracle that predicts an iteration's time.

    An iteration's time sums its ops' times along the schedule, and the expected sum is
    the sum of the expected (mean) times. Op times are right-skewed (each traced step has
    a few slow ops, different ones each step), so the sum of per-op minima, and even of
    medians, is far below any traced iteration: on the generated TF PS traces the median
    oracle predicted the observed order 6-43% short of the measured busy time, the mean
    1.6-8% (`planner simulate`, plan ``observed``). Schedulers keep the min of runs.
    """
    return of_runs(graph, timings, "mean")


def of_runs(graph: OpGraph, timings: pd.DataFrame, statistic: str) -> TimeOracle:
    """Per-op `statistic` ("min", "mean" or "median") of the dedicated times over
    iterations, and the network fit on them. Steps with missing records
    (`planner.model.records`) are left out while a complete one remains: their processor-shared
    times lack the missing ops' share."""
    partial = partial_steps(timings, graph.ops) if len(timings) else {}
    if partial and timings["iteration"].nunique() > len(partial):
        timings = timings[~timings["iteration"].isin(list(partial))]
    grouped = timings.groupby("op")["dedicated"]
    minimum = (grouped.agg(statistic) / 1e9).to_dict()
    count = grouped.size().to_dict()
    return _oracle(graph, minimum, count)


def min_of_columns(
    graph: OpGraph,
    op: np.ndarray,
    iteration: np.ndarray,
    duration: np.ndarray,
    dedicated: np.ndarray,
) -> TimeOracle:
    """`min_of_runs` of one rank's rows given as numpy columns (`Trace.table` and
    `trace.dedicated_columns`): the same oracle, without pandas."""
    rows = {"op": op, "iteration": iteration, "duration": duration}
    partial = partial_steps(rows, graph.ops) if len(op) else {}
    names, inverse = np.unique(op, return_inverse=True)
    return min_of_codes(graph, names.tolist(), inverse, iteration, dedicated, partial)


def min_of_codes(
    graph: OpGraph,
    names: list[str],
    code: np.ndarray,
    iteration: np.ndarray,
    dedicated: np.ndarray,
    partial: Mapping[int, object],
) -> TimeOracle:
    """`min_of_columns` of rows whose ops are given as indices (`code`) into `names`
    (`Trace.op_codes`) and whose partial steps (`records.partial_steps`) are known: no
    strings sorted or compared per row."""
    if partial and len(unique(iteration)) > len(partial):
        keep = ~np.isin(iteration, list(partial))
        code, dedicated = code[keep], dedicated[keep]
    minimum = np.full(len(names), np.inf)
    np.minimum.at(minimum, code, dedicated)
    count = np.bincount(code, minlength=len(names))
    seen = np.flatnonzero(count).tolist()
    seconds, counted = (minimum / 1e9).tolist(), count.tolist()
    return _oracle(
        graph, {names[i]: seconds[i] for i in seen}, {names[i]: counted[i] for i in seen}
    )


def _oracle(graph: OpGraph, per_op: Mapping[str, float], count: Mapping[str, int]) -> TimeOracle:
    """The TimeOracle of per-op seconds `per_op` (observed in `count` iterations), with
    the network model fitted on the observed transfers."""
    minimum = per_op
    transfers = [n for n in graph.transfers if n in minimum and graph.ops[n].nbytes > 0]
    network = fit_network_model(
        np.array([graph.ops[n].nbytes for n in transfers]),
        np.array([minimum[n] for n in transfers]),
    )
    times: dict[str, float] = {}
    source: dict[str, str] = {}
    for name, op in graph.ops.items():
        if name in minimum:
            times[name], source[name] = float(minimum[name]), "observed"
        elif op.is_transfer and network is not None:
            times[name], source[name] = network.time(op.nbytes), "network_model"
        else:
            times[name], source[name] = 0.0, "unobserved"
    observed_in = {name: int(count.get(name, 0)) for name in graph.ops}
    return TimeOracle(times=times, source=source, observed_in=observed_in, network=network)


def tic_oracle(graph: OpGraph) -> TimeOracle:
    """TicTac's general oracle (Eq. 5): 1 for recv ops, 0 for everything else."""
    times = {n: 1.0 if op.kind == "recv" else 0.0 for n, op in graph.ops.items()}
    return TimeOracle(times=times, source=dict.fromkeys(times, "tic"))
