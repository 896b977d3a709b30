"""Horovod's fusion settings against Caramel's batching threshold.

Horovod fuses the tensors ready in one cycle of its background loop into buffers of at
most ``HOROVOD_FUSION_THRESHOLD`` bytes, a cycle every ``HOROVOD_CYCLE_TIME`` ms; its own
tuning of the two is Bayesian autotuning over many steps. Caramel's batching threshold
(§4.2, `batching.threshold_bytes`) answers the same question from one trace: past x
bytes, sending two parameters as one saves less than 20% of sending them apart. Here:
the buffers Horovod ran (which tensors went together, their bytes) set against that
threshold, and the settings worth replaying (`candidates`): Caramel's threshold as the
fusion threshold, and a range of cycle times, beside Horovod's defaults.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

DEFAULT_FUSION_THRESHOLD = 64 * 1024 * 1024
"""Horovod's default ``HOROVOD_FUSION_THRESHOLD`` (bytes)."""
DEFAULT_CYCLE_TIME = 0.005
"""Horovod's default ``HOROVOD_CYCLE_TIME`` (5 ms), in seconds."""
CYCLE_TIMES = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02)
"""Cycle times replayed (seconds)."""


def fused_sizes(
    buffers: Sequence[Sequence[tuple[str, ...]]], nbytes: Mapping[str, int], threshold: int | None
) -> dict[str, Any]:
    """The all-reduces Horovod ran (`buffers`, per iteration: the tensors of each),
    grouped by their tensors: how often, bytes, and where they stand against Caramel's
    `threshold` (``above``: a buffer Caramel would not fill so far, or a tensor it would
    send alone; ``below``: one it would batch with others)."""
    seen: Counter[tuple[str, ...]] = Counter(b for it in buffers for b in it)
    per_iteration = len(buffers) or 1
    rows = []
    for tensors, count in sorted(seen.items(), key=lambda kv: -sum(nbytes[t] for t in kv[0])):
        size = sum(nbytes[t] for t in tensors)
        side = None if threshold is None else ("above" if size >= threshold else "below")
        rows.append({"tensors": list(tensors), "count": count,
                     "per_iteration": count / per_iteration, "nbytes": size,
                     "vs_threshold": side})  # fmt: skip
    small_alone = sum(r["count"] for r in rows
                      if len(r["tensors"]) == 1 and r["vs_threshold"] == "below")  # fmt: skip
    fused_above = sum(
        r["count"] for r in rows if len(r["tensors"]) > 1 and r["vs_threshold"] == "above"
    )
    return {
        "allreduces": rows,
        "small_alone_per_iteration": small_alone / per_iteration,
        "fused_above_threshold_per_iteration": fused_above / per_iteration,
    }


def candidates(threshold: int | None) -> list[tuple[int, float]]:
    """(fusion threshold bytes, cycle time s) to replay: Caramel's threshold and
    Horovod's default, each with every cycle time of `CYCLE_TIMES` and the default."""
    thresholds = [t for t in (threshold, DEFAULT_FUSION_THRESHOLD) if t is not None]
    cycles = sorted({*CYCLE_TIMES, DEFAULT_CYCLE_TIME})
    return [(t, c) for t in dict.fromkeys(thresholds) for c in cycles]


def settings(threshold: int, cycle_time: float) -> dict[str, Any]:
    """The environment variables that set them (Horovod reads the cycle time in ms)."""
    return {"HOROVOD_FUSION_THRESHOLD": int(threshold),
            "HOROVOD_CYCLE_TIME": round(cycle_time * 1e3, 3)}  # fmt: skip
