"""The queue a GPU stream held when profiling began (`kineto_build._queued_before`): work the
CPU issued before the window, which CUPTI records without its launch. Checked against
the raw JSON of HTA's ``trace_diff/test`` rank, and what the replay of the first traced
step misses without it."""

from __future__ import annotations

import gzip
import json

import pytest

from planner.ingest import detect
from planner.measure.inspection import inspect
from planner.prediction import replay as sim
from tests.conftest import SHARED, need, run_cli

HTA = SHARED / "public/HolisticTraceAnalysis/tests/data"
TEST = HTA / "trace_diff/test/test.json.gz"
NEGATIVE = HTA / "negative_queue_length_values_check/rank0.json.gz"
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _unlaunched(path) -> tuple[dict[int, list[dict]], dict[int, list[dict]], float]:
    """Per stream the GPU events whose launch the trace lacks and those it has (raw
    JSON, in time order), and the first ``ProfilerStep#N`` start (us)."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    calls = {e["args"]["correlation"] for e in events
             if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}  # fmt: skip
    lacking: dict[int, list[dict]] = {}
    launched: dict[int, list[dict]] = {}
    for e in sorted((e for e in events if e.get("cat") in GPU_CATS), key=lambda e: e["ts"]):
        side = launched if e["args"].get("correlation") in calls else lacking
        side.setdefault(e["args"]["stream"], []).append(e)
    first = min(e["ts"] for e in events if e.get("name", "").startswith("ProfilerStep#"))
    return lacking, launched, first


def test_the_queue_before_the_window_is_read_from_the_trace():
    """Raw JSON: 610 kernels and copies on stream 7 have no launch in the trace (the CPU
    issued them in the step before profiling began); they run from 0.04 ms to 39.3 ms
    into ``ProfilerStep#1009``, and the step's own first kernel on the stream starts
    6 us after the last of them ends. The ingest records that end per stream, and for
    the collectives the end of the NCCL kernels among them."""
    lacking, launched, first = _unlaunched(need(TEST))
    seven = lacking[7]
    end = max(e["ts"] + e["dur"] for e in seven)
    assert len(seven) == 610 and 39_000 < end - first < 39_500
    assert 0 <= launched[7][0]["ts"] - end <= 10
    job = detect.load([TEST])
    (rank,) = job.ranks
    queued = sim.queued_before(job, rank)
    assert queued["gpu1/stream7"] == pytest.approx(end * 1000, abs=1000)
    for stream, rows in lacking.items():
        ends = max(e["ts"] + e["dur"] for e in rows)
        assert queued[f"gpu1/stream{stream}"] == pytest.approx(ends * 1000, abs=1000)
    # NCCL's stream 15 ran 4 kernels of the step before (an all-reduce, all-to-alls):
    # the collectives' queue
    nccl = [e for rows in lacking.values() for e in rows if e["name"].startswith("ncclKernel")]
    assert len(nccl) == 4 and {e["args"]["stream"] for e in nccl} == {15}
    ends = max(e["ts"] + e["dur"] for e in nccl)
    assert queued["net"] == pytest.approx(ends * 1000, abs=1000)


def test_inspect_shows_the_queue_before_the_window(capsys):
    """`planner inspect` gives the queue from the first step's start as the replay times
    it (its device span: the step's first GPU work, 0.76 ms after its CPU start): 38.5
    ms on stream 7, and in its terminal view one line per stream."""
    job = detect.load([need(TEST)])
    (rank,) = inspect(job)["ranks"]
    first = min(sim.spans_of(job, rank["rank"]).values())[0]
    queued = sim.queued_before(job, rank["rank"])
    assert rank["queued_before"] == {k: (v - first) / 1e9 for k, v in queued.items()}
    assert 0.038 < rank["queued_before"]["gpu1/stream7"] < 0.039
    code, out, _ = run_cli(["inspect", TEST], capsys)
    assert code == 0 and "gpu1/stream7 ran work issued before profiling began" in out


@pytest.mark.parametrize(
    ("path", "field", "step", "within", "without"),
    [(TEST, "replay_error", 1009, 0.01, 0.05), (NEGATIVE, "wall_error", None, 0.01, 0.015)],
    ids=["trace_diff/test busy", "negative_queue_length wall"],
)
def test_the_first_step_starts_behind_the_recorded_queue(
    monkeypatch, path, field, step, within, without
):
    """Given the typical queue of the other steps (50 ms on ``trace_diff/test``'s stream
    7 against the 39.3 ms recorded), the replay ran the first step's compute stream
    beside its other streams rather than after the queue: device busy time -5.5%
    (0.5% with the recorded queue). ``negative_queue_length``'s streams 7 and 84 held
    152 ms and 142 ms of queued work: its worst step 1.9% (0.5%)."""

    def worst(document: dict) -> float:
        steps = [s for r in document["ranks"] for s in r["steps"] if not s.get("partial")]
        if step is not None:
            steps = [s for s in steps if s["iteration"] == step]
        return max(abs(s[field]) for s in steps)

    job = detect.load([need(path)])
    assert worst(sim.replay(job)) < within
    monkeypatch.setattr(sim, "queued_before", lambda job, rank: {})
    assert worst(sim.replay(job)) > without
