"""Fusion advice for a Horovod job: Caramel's threshold, Horovod's buffers, the what-if.

`schedule -a caramel` on a Horovod timeline plans with a network model fitted to its
all-reduces; this sets that plan's batching threshold against the buffers Horovod fused
(`planning.horovod_fusion`) and replays Horovod's loop (`prediction.horovod_replay`)
under the settings the job ran with and under the candidates. The job's own settings
are not in the timeline: Horovod's defaults are assumed (64 MiB, 5 ms) and the rest of
the loop's observed period (its ``CYCLE_START`` marks) is taken as coordination.

The replay of the settings the job ran with, against the traced spans, is the error; a
candidate is recommended only when its predicted gain (the replayed span of the job's
settings less its own, per iteration, median) exceeds that error (the median of the
per-iteration misses, either way): a smaller gain is not one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from planner.model.oracle import NetworkModel
from planner.model.trace import Job
from planner.planning import horovod_fusion
from planner.prediction import horovod_replay


def fusion_advice(job: Job, plan_inputs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``horovod`` section of a Caramel plan of a Horovod timeline, or None when the
    job is no Horovod timeline or the plan has no network model (seconds, bytes)."""
    records = job.meta.get("horovod_allreduces") if isinstance(job.meta, Mapping) else None
    fitted = plan_inputs.get("network")
    if not records or not fitted or not records.get("iteration"):
        return None
    network = NetworkModel(fitted["a"], fitted["b"], fitted.get("r2", float("nan")),
                           fitted.get("points", 0))  # fmt: skip
    threshold = plan_inputs.get("threshold_bytes")
    traced = horovod_replay.iterations(records)
    measured = np.array([it.span for it in traced])
    period = (records.get("cycle_period") or 0) / 1e9 or horovod_fusion.DEFAULT_CYCLE_TIME
    overhead = max(period - horovod_fusion.DEFAULT_CYCLE_TIME, 0.0)
    base = horovod_replay.replay(traced, horovod_fusion.DEFAULT_FUSION_THRESHOLD,
                                 horovod_fusion.DEFAULT_CYCLE_TIME, overhead, network)  # fmt: skip
    miss = (base["spans"] - measured) / measured
    error = float(np.median(np.abs(miss)))
    matched = np.mean(
        [set(b) == set(it.fused) for b, it in zip(base["buffers"], traced, strict=True)]
    )
    rows = []
    for size, cycle in horovod_fusion.candidates(threshold):
        spans = horovod_replay.replay(traced, size, cycle, overhead, network)["spans"]
        gain = float(np.median(base["spans"] - spans))
        rows.append({**horovod_fusion.settings(size, cycle),
                     "predicted_span": float(np.median(spans)), "gain": gain,
                     "gain_fraction": gain / float(np.median(measured))})  # fmt: skip
    best = max(rows, key=lambda r: r["gain"])
    nbytes = dict(zip(records["tensor"], records["nbytes"], strict=True))
    return {
        "threshold_bytes": threshold,
        "network": dict(fitted),
        "fused": horovod_fusion.fused_sizes([it.fused for it in traced], nbytes, threshold),
        "assumed": {
            **horovod_fusion.settings(
                horovod_fusion.DEFAULT_FUSION_THRESHOLD, horovod_fusion.DEFAULT_CYCLE_TIME
            ),  # fmt: skip
            "cycle_period": period,
            "overhead": overhead,
        },
        "measured_span": float(np.median(measured)),
        "replay_error": {
            "median": float(np.median(miss)),
            "median_abs": error,
            "worst": float(miss[int(np.argmax(np.abs(miss)))]),
            "buffers_matched": float(matched),
        },
        "candidates": rows,
        "best": best,
        "recommended": best if best["gain"] > 0 and best["gain_fraction"] > error else None,
    }
