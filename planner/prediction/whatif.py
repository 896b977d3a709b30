"""What-if: the comparison over one knob's values (`sweep`, TicTac Figures 7 and 10). Apart
because it only repeats `compare` and gathers the curves."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from planner.errors import InputError
from planner.model.oracle import TimeOracle
from planner.model.plan import Plan
from planner.model.trace import Job
from planner.prediction.comparison import KNOBS, _knobs, compare
from planner.prediction.compiled import Compiled, KnownRows
from planner.prediction.replay import SCHEMA, _frame, job_arrays, replay, replayed_steps


def sweep(
    job: Job,
    knob: str,
    values: Sequence[float],
    plans: Mapping[str, Mapping[str, Plan]] | None = None,
    *,
    samples: int = 100,
    seed: int = 0,
    oracles: Mapping[str, TimeOracle] | None = None,
    frame: pd.DataFrame | None = None,
    replayed: Mapping[str, Sequence[dict[str, Any]]] | None = None,
    arrays: Mapping[str, tuple[Compiled, KnownRows]] | None = None,
    **knobs: float,
) -> dict[str, Any]:
    """`compare` at each value of one knob: the gain curve per rank and plan.

    Each point carries rho = total transfer time / total compute time of the oracle
    after the knobs, the x-axis of TicTac's Figures 7 and 10. `arrays`: as `compare`
    takes them (built here once for every value where not given).
    """
    if knob not in KNOBS:
        raise InputError(None, f"unknown knob {knob!r} (choose from {', '.join(KNOBS)})")
    if not len(values):
        raise InputError(None, "a sweep needs at least one value")
    frame = _frame(job) if frame is None else frame
    arrays = job_arrays(job, frame) if arrays is None else arrays
    if replayed is None:
        replayed = replayed_steps(replay(job, seed=seed, frame=frame, arrays=arrays))
    points: dict[str, list[dict[str, Any]]] = {}
    for value in values:
        v = int(round(value)) if knob == "channels" else float(value)
        doc = compare(
            job, plans, samples=samples, seed=seed, oracles=oracles, frame=frame,
            replayed=replayed, arrays=arrays, **{**knobs, knob: v},
        )  # fmt: skip
        for entry in doc["ranks"]:
            points.setdefault(entry["rank"], []).append(
                {
                    "value": v,
                    "rho": entry["rho"],
                    "best_plan": entry["best_plan"],
                    "plans": {
                        p["plan"]: {
                            "predicted": p["predicted"],
                            "speedup_vs_baseline": p["speedup_vs_baseline"],
                            "efficiency": p["efficiency"],
                        }
                        for p in entry["plans"]
                    },
                }
            )
    return {
        "schema": SCHEMA,
        "kind": "sweep",
        "knob": knob,
        "values": [int(round(v)) if knob == "channels" else float(v) for v in values],
        "samples": samples,
        "seed": seed,
        "knobs": _knobs(**knobs),
        "ranks": [{"rank": r, "points": p} for r, p in points.items()],
    }
