"""How a replayed step is timed against the trace's clocks: its wall-clock time from the
device's first op (`timed_wall`), a GPU rank's CPU range (`timed_cpu`) and how much of a
step the records cover (`covered`). Apart because the replay of the observed order and of
each plan time their steps alike."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from planner.model.trace import Job, busy_time, rank_meta
from planner.planning.ticks import TICKS_PER_SECOND
from planner.prediction.step_model import StepModel


def timed_wall(
    model: StepModel,
    start: np.ndarray,
    ticks: np.ndarray,
    span: tuple[int, int],
    recorded: tuple[int, int] | None,
    device: np.ndarray,
) -> tuple[float, int]:
    """(the replayed step's wall-clock time in s, how many ns its records began before
    its recorded start): from the end of the rank's n ops as replayed (`device`: per op
    of the n, whether it is device work, `_device_ops`; computed once per rank), plus the
    close after them as observed. The step's clock starts at its recorded start: on a
    GPU rank (the device's step) the CPU issued its records earlier, a step or two
    ahead (30 ms before a 19 ms step on the MI300 DDP trace); they are replayed, not
    timed. `span`: the step's span as the replay ran it (`_step_models`).

    A device step is timed in the replay as it is in the trace: from its first device
    op (a kernel, a copy, a collective) *as replayed*. Timed from the recorded start,
    any error in when the CPU got to the step's first launch counted as device time:
    `param/resnet_kineto`'s main thread runs nothing the trace records for 12-35 ms
    before each batch copy, and a replay that took 24 ms there read 12 ms longer a
    158 ms device step that the same kernels, launched 12 ms later, run as long."""
    n = len(device)
    keep = model.observed[:n]
    end = float((start[:n][keep] + ticks[:n][keep]).max(initial=0)) / TICKS_PER_SECOND
    ahead = max(0, recorded[0] - span[0]) if recorded is not None else 0
    on_device = keep & device
    if recorded is not None and on_device.any():
        return end + model.tail - float(start[:n][on_device].min()) / TICKS_PER_SECOND, ahead
    return end + model.tail - ahead / 1e9, ahead


def timed_cpu(
    model: StepModel,
    known: Mapping[str, np.ndarray],
    start: np.ndarray,
    ticks: np.ndarray,
    cpu_span: tuple[int, int] | None,
    device: np.ndarray,
) -> tuple[float, float] | None:
    """(the step's CPU range in s, as recorded and as replayed) on a GPU rank: what the
    training loop's own clock reads. The device's step leaves out what the CPU did before
    its first launch, the wait for a batch included (`param/resnet_kineto`: device steps
    of 150-171 ms in iterations of 124-829 ms). Replayed: from the recorded range start
    to the end of the rank's CPU ops as replayed, plus the close after them as observed.
    `known`: the rank's records of the step (``start``, ``duration``, ``idx``);
    `device`: as in `timed_wall`. None without a CPU range or a CPU record in it."""
    n = len(device)
    on_cpu = ~device
    cpu = model.observed[:n] & on_cpu
    if cpu_span is None or not cpu.any() or cpu_span[1] <= cpu_span[0]:
        return None
    begin, end = cpu_span
    mine = on_cpu[known["idx"]]
    last = int((known["start"][mine] + known["duration"][mine]).max())
    replayed = float((start[:n][cpu] + ticks[:n][cpu]).max()) / TICKS_PER_SECOND
    close = max(0, end - last) / 1e9
    return (end - begin) / 1e9, replayed + close + (model.t0 - begin) / 1e9


def cpu_spans_of(job: Job, rank: str) -> dict[int, tuple[int, int]]:
    """Iteration -> (start, end) ns of a GPU rank's steps as its CPU ran them (the
    ingest's record of each step's CPU range beside its device span; empty on a CPU
    rank, whose step spans are these)."""
    steps = rank_meta(job, rank).get("steps") or []
    return {int(s["step"]): (int(s["cpu_start"]), int(s["cpu_end"])) for s in steps}


def covered(rows: Mapping[str, np.ndarray], window: tuple[int, int]) -> float:
    """Share of `window` (epoch ns) in which some of `rows` (``start``, ``duration``)
    runs: how much of the step the trace accounts for."""
    lo, hi = window
    if hi <= lo:
        return 0.0
    start = np.clip(np.asarray(rows["start"], dtype=np.int64), lo, hi)
    end = np.clip(np.asarray(rows["start"]) + np.asarray(rows["duration"]), lo, hi)
    return busy_time(start, end - start) / (hi - lo)
