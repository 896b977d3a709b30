"""Stream syncs inferred between device ops (`kineto_dag.stream_wait_edges`): checked
against the raw JSON of HTA's ``trace_diff`` DLRM ranks and the MI300 DDP trace, and
what the replay misses without them."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from planner.ingest import detect, kineto_dag
from planner.prediction import replay as sim
from tests.conftest import SHARED, need

HTA = SHARED / "public/HolisticTraceAnalysis/tests/data"
CONTROL = HTA / "trace_diff/control/control.json.gz"
TEST = HTA / "trace_diff/test/test.json.gz"
MI300 = SHARED / "public/external/tracelens_mi300_resnet_ddp8/resnet_act_checkpoint.json.gz"


def _worst(document: dict, field: str) -> float:
    """The largest |`field`| (``wall_error``, or ``replay_error``: busy time) over the
    complete steps of a replay."""
    return max(abs(s[field]) for r in document["ranks"] for s in r["steps"] if not s.get("partial"))


def test_the_copy_after_an_all_to_all_waits_for_it():
    """DLRM's embeddings come back by all-to-all (NCCL ``SendRecv`` kernels on their own
    stream) and are concatenated on the compute stream. Raw JSON: in every step a
    ``CatArrayBatchedCopy`` kernel starts 1-2 us after the first ``SendRecv`` ends,
    10-20 ms into the step. The DAG has the edge, from the step's first all-to-all to
    that copy; no step runs against it."""
    events = json.loads(gzip.decompress(need(CONTROL).read_bytes()))["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    copies = [e for e in kernels if "CatArrayBatchedCopy" in e["name"]]
    lags = []
    for step in (e for e in events if e.get("name", "").startswith("ProfilerStep#")):
        sends = [e for e in kernels if "SendRecv" in e["name"] and e["ts"] >= step["ts"]]
        first = min(sends, key=lambda e: e["ts"])
        end = first["ts"] + first["dur"]
        copy = min((e for e in copies if e["ts"] >= end), key=lambda e: e["ts"])
        assert 10_000 < end - step["ts"] < 20_000
        lags.append(copy["ts"] - end)
    assert len(lags) == 6 and max(lags) <= 2
    job = detect.load([CONTROL])
    (rank,) = job.ranks
    graph = job.graphs[rank]
    names = list(graph.ops)
    waits = [names[v] for u, v in zip(graph.src.tolist(), graph.dst.tolist(), strict=True)
             if names[u] == "net/all_to_all#0" and names[v].startswith("gpu")]  # fmt: skip
    assert any("CatArrayBatchedCopy" in n for n in waits)
    rows = job.trace.of(rank)
    for _, group in rows.groupby("iteration"):
        at = dict(zip(group["op"], zip(group["start"], group["duration"], strict=True),
                      strict=True))  # fmt: skip
        for v in waits:
            assert at[v][0] >= sum(at["net/all_to_all#0"])


@pytest.mark.parametrize(
    ("path", "field", "worst", "without"),
    [
        (CONTROL, "replay_error", 0.025, 0.10),
        (TEST, "wall_error", 0.02, 0.15),
        (MI300, "wall_error", 0.002, 0.02),
    ],
    ids=["trace_diff/control busy", "trace_diff/test wall", "mi300_ddp wall"],
)
def test_the_replay_keeps_the_streams_waits(monkeypatch, path, field, worst, without):
    """Without the inferred waits a device op's wait for another stream was an overhead
    taken from the other steps. ``trace_diff/test`` step 1012, whose device had no queue
    left from the step before, ran its kernels late: +16.9% (1.6% with them; +24.4%
    before its all-to-alls' waiters were kernels, which carry part of that wait).
    ``trace_diff/control`` step 1010 ran the compute stream under its all-to-alls
    instead of after them: device busy time -11.4% (2.3%). The MI300 DDP steps read
    2.5% (0.12%): the copy back of each DDP bucket (``Memcpy DtoD``) waits for its
    all-reduce."""
    job = detect.load([need(path)])
    assert _worst(sim.replay(job), field) < worst
    empty = np.zeros(0, dtype=np.int64)
    monkeypatch.setattr(kineto_dag, "stream_wait_edges", lambda *args: (empty, empty))
    assert _worst(sim.replay(detect.load([path])), field) > without


CRITICAL = HTA / "critical_path"
RECORDED = [
    CRITICAL / "cuda_event_sync_multi_stream/event_sync_trace.json.gz",
    CRITICAL / "alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
]


def _raw_waits(path) -> set[tuple[tuple[int, int], tuple[int, int]]]:
    """Each recorded stream wait from the raw JSON, as ((stream, kernel ts) waited on,
    (stream, kernel ts) waiting): the GPU event launched last before the
    ``cudaEventRecord`` call on the stream waited on, and the one launched first after
    the ``cudaStreamWaitEvent`` call on the waiting stream."""
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    calls = {e["args"]["correlation"]: e["ts"] for e in events
             if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}  # fmt: skip
    launched: dict[int, list[tuple[float, float]]] = {}
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            at = calls.get(e["args"].get("correlation"))
            if at is not None:
                launched.setdefault(e["tid"], []).append((at, e["ts"]))
    out = set()
    for e in events:
        if e.get("name") != "Stream Wait Event":
            continue
        a = e["args"]
        record, wait = calls[a["wait_on_cuda_event_record_corr_id"]], calls[a["correlation"]]
        before = [k for k in launched.get(a["wait_on_stream"], []) if k[0] <= record]
        after = [k for k in launched.get(a["stream"], []) if k[0] >= wait]
        if before and after:
            out.add(((a["wait_on_stream"], round(max(before)[1], 3)),
                     (a["stream"], round(min(after)[1], 3))))  # fmt: skip
    return out


@pytest.mark.parametrize("path", RECORDED, ids=lambda p: p.parent.name)
def test_recorded_stream_waits_are_the_edges(monkeypatch, path):
    """Newer Kineto records each ``cudaStreamWaitEvent`` ("Stream Wait Event", with the
    stream waited on and the ``cudaEventRecord`` call's correlation). Those are the
    edges between streams, read from the trace, not inferred (the inference is not run):
    each edge is one the raw JSON gives, and every wait holds in the trace. The multi-
    stream trace's stream 24 begins with its sync record, and is a GPU stream still."""
    path = need(path)
    raw = _raw_waits(path)
    assert raw

    def no_inference(*args):
        raise AssertionError("stream syncs inferred where the trace records them")

    monkeypatch.setattr(kineto_dag, "stream_wait_edges", no_inference)
    job = detect.load([path])
    (rank,) = job.ranks
    graph = job.graphs[rank]
    names = list(graph.ops)
    rows = job.trace.of(rank)
    at = dict(zip(rows["op"], zip(rows["start"], rows["duration"], strict=True), strict=True))
    found = set()
    for u, v in zip(graph.src.tolist(), graph.dst.tolist(), strict=True):
        a, b = names[u], names[v]
        if a.startswith("gpu") and b.startswith("gpu") and a.split("/")[1] != b.split("/")[1]:
            assert at[b][0] >= sum(at[a])  # the wait holds in the trace
            found.add(((int(a.split("/")[1][6:]), round(at[a][0] / 1e3, 3)),
                       (int(b.split("/")[1][6:]), round(at[b][0] / 1e3, 3))))  # fmt: skip
    assert found == raw
    streams = {op.resource for op in graph.ops.values()}
    assert ("gpu0/stream24" in streams) == ("multi" in str(path))
