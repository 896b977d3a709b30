"""One Kineto rank reduced to ops (`RankModel`): what `kineto_build` makes of the events and
`kineto_dag` and `kineto_params` read, in a module of its own so that they need not
import the reader that calls them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from planner.model.graph import Op


@dataclass
class Occurrences:
    """The op occurrences of one rank, one entry each (columns of the timings table)."""

    iteration: np.ndarray  # int64 step
    op: np.ndarray  # int64 op id (index into RankModel.op_names)
    start: np.ndarray  # int64 ns
    duration: np.ndarray  # int64 ns

    def __len__(self) -> int:
        return len(self.op)


@dataclass
class RankModel:
    """One rank, reduced to ops: the op occurrences plus the edge candidates."""

    rank: str
    ops: dict[str, Op]
    occurrences: Occurrences
    spans: list[tuple[int, int, int]]  # (step, start, end)
    op_names: list[str]  # op id -> name (the keys of `ops`, in order)
    edges_by_step: dict[int, tuple[np.ndarray, np.ndarray]]  # step -> (src ids, dst ids)
    rf_to_op: dict[int, str]  # Record function id (ET step) -> op name
    notes: list[str]
    meta: dict[str, Any]
    #: step -> forward layer-op parameter reads in time order: (op, label, nbytes)
    layer_reads: dict[int, list[tuple[str, str, int]]] = field(default_factory=dict)
