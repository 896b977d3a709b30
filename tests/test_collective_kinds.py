"""Collectives by what they do, whatever the backend runs them with (issue #45, point 1):
the c10d op gives the kind, the bytes and the group, the backend's record the time.
Counted from the raw JSON of FSDP1/FSDP2 runs recorded here (`traces/torch/fsdp`, gloo,
which runs FSDP's ``_reduce_scatter_base`` as ``gloo:all_reduce``) and of NCCL GPU
traces in ../shared."""

from __future__ import annotations

import gzip
import json
import math
from collections import Counter
from pathlib import Path

import pytest
from conftest import REPO, SHARED, need, run_cli

from planner.ingest import detect
from planner.job import stages
from planner.planning import bucket_profile

FSDP = REPO / "traces" / "torch" / "fsdp"
VARIANTS = sorted(p.name for p in FSDP.iterdir() if p.is_dir())
HTA = SHARED / "public" / "HolisticTraceAnalysis" / "tests" / "data"
B200 = SHARED / "public" / "external" / "tracelens_b200_vllm_tp8" / "eager_trace.json.gz"

#: The c10d ops FSDP calls, the kind each is and the gloo record that runs it.
CALLS = {
    "c10d::_reduce_scatter_base_": ("reduce_scatter", "gloo:all_reduce"),
    "c10d::_allgather_base_": ("all_gather", "gloo:all_gather"),
    "c10d::allgather_": ("all_gather", "gloo:all_gather"),  # FSDP1: a list of shards
}


def _events(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def _step_of(events: list[dict]):
    steps = [
        (e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1]))
        for e in events
        if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")
    ]
    return lambda ts: next((n for a, b, n in steps if a <= ts < b), None)


def _call_bytes(event: dict, world: int) -> int:
    """The collective's full buffer, by the op's signature: ``_allgather_base_(out, in)``
    and ``_reduce_scatter_base_(out, in)`` name both tensors (the larger is the
    unsharded one); ``allgather_(outs, ins)`` records only its input list (one shard)."""
    dims, types = event["args"]["Input Dims"], event["args"]["Input type"]
    if event["name"] == "c10d::allgather_":
        (shard,) = dims[1]
        return math.prod(shard) * 4 * world
    assert types[:2] == ["float", "float"]
    return max(math.prod(dims[0]), math.prod(dims[1])) * 4


def _raw(path: Path) -> tuple[Counter, Counter, dict]:
    """Per step: the (kind, bytes) of each c10d collective op, the gloo records' count
    per name, and the document's distributedInfo."""
    doc = _events(path)
    events, world = doc["traceEvents"], doc["distributedInfo"]["world_size"]
    step_of = _step_of(events)
    calls, records = Counter(), Counter()
    for e in events:
        step = step_of(e.get("ts", -1))
        if step is None:
            continue
        if e.get("cat") == "cpu_op" and e["name"].startswith("c10d::"):
            calls[step, CALLS[e["name"]][0], _call_bytes(e, world)] += 1
        if e.get("cat") == "user_annotation" and e["name"].startswith("gloo:"):
            records[step, e["name"]] += 1
    return calls, records, doc["distributedInfo"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_fsdp_collectives_have_the_kind_bytes_and_group_of_their_c10d_op(variant: str) -> None:
    """Every FSDP reduce-scatter and all-gather of every step, with its bytes (the
    unsharded tensor) and its group (the default one, ranks 0 and 1), as the raw c10d
    ops count them; gloo's all-reduces are as many as the reduce-scatters they run,
    and no all-reduce is left."""
    job = detect.load([FSDP / variant])
    assert job.ranks == ["rank0", "rank1"]
    for rank in job.ranks:
        calls, records, info = _raw(FSDP / variant / f"{rank}.json.gz")
        graph, meta = job.graphs[rank], job.meta["ranks"][rank]
        t = job.trace.of(rank)
        found = Counter()
        for op, step in zip(t["op"], t["iteration"], strict=True):
            if graph.ops[op].kind == "collective":
                found[int(step), meta["collectives"][op]["kind"], graph.ops[op].nbytes] += 1
        assert found == calls and len(found) > 0
        assert {kind for _, kind, _ in calls} == {"reduce_scatter", "all_gather"}
        kinds = Counter()
        for (step, kind, _), n in calls.items():
            kinds[step, kind] += n
        for (step, name), n in records.items():  # gloo runs a reduce-scatter as an all-reduce
            want = "reduce_scatter" if name == "gloo:all_reduce" else "all_gather"
            assert kinds[step, want] == n
        called = {c["call"] for c in meta["collectives"].values()}
        assert called <= set(CALLS) and {c["group"] for c in meta["collectives"].values()} == {"0"}
        (pg,) = info["pg_config"]
        assert meta["process_groups"]["0"] == {
            "name": "0", "desc": pg["pg_desc"], "ranks": [0, 1], "size": 2,
            "backend": pg["backend_config"], "assigned": "trace",
            "role": "fsdp_shard", "role_source": "inferred",  # default_pg states no role
        }  # fmt: skip
        assert not any((op.param or "").startswith("bucket") for op in graph.ops.values())
        assert not bucket_profile.ddp_buckets(job, rank)


@pytest.mark.parametrize("variant", ["fsdp2_reshard", "fsdp1_noprefetch"])
def test_a_collectives_time_is_its_backend_record(variant: str) -> None:
    """The time of each collective is its gloo record's (the worker thread's transfer and
    reduce), not its c10d op's enqueue: per step the same durations (raw ``dur``)."""
    job = detect.load([FSDP / variant])
    for rank in job.ranks:
        events = _events(FSDP / variant / f"{rank}.json.gz")["traceEvents"]
        step_of = _step_of(events)
        raw = Counter()
        for e in events:
            gloo = e.get("cat") == "user_annotation" and e["name"].startswith("gloo:")
            if gloo and step_of(e["ts"]) is not None:
                raw[step_of(e["ts"])] += round(e["dur"] * 1000)
        graph, t = job.graphs[rank], job.trace.of(rank)
        ours = Counter()
        for op, step, took in zip(t["op"], t["iteration"], t["duration"], strict=True):
            if graph.ops[op].kind == "collective":
                ours[int(step)] += int(took)
        assert ours.keys() == raw.keys()
        for step, total in raw.items():
            assert abs(ours[step] - total) <= 60  # ns: one rounding per record at most


def test_no_bucket_sweep_for_fsdp_and_inspect_names_each_call(capsys) -> None:
    """The DDP bucket advice is not offered for an FSDP job (its gradients go out by
    reduce-scatter: a bucket cap sets nothing); ``inspect --json`` names each transfer's
    kind, c10d op, backend record and group."""
    path = FSDP / "fsdp2_reshard"
    job = detect.load([path])
    assert stages.bucket_sweep(job) is None
    code, out, _ = run_cli(["inspect", "--json", path], capsys)
    assert code == 0
    calls, _, _ = _raw(path / "rank0.json.gz")
    rank0 = json.loads(out)["ranks"][0]
    first = min(step for step, _, _ in calls)
    assert Counter((t["collective"]["kind"], t["nbytes"]) for t in rank0["transfers"]) == Counter(
        {(k, n): c for (s, k, n), c in calls.items() if s == first}
    )
    by_kind = {t["collective"]["kind"]: t["collective"] for t in rank0["transfers"]}
    assert by_kind["reduce_scatter"]["call"] == "c10d::_reduce_scatter_base_"
    assert by_kind["reduce_scatter"]["backend"] == "gloo:all_reduce"
    assert rank0["process_groups"]["0"]["ranks"] == [0, 1]


def test_the_ddp_bucket_all_reduces_keep_their_names() -> None:
    """A DDP job (the resnet run recorded here) keeps its buckets and its advice."""
    job = detect.load([REPO / "traces" / "torch" / "resnet_ddp"])
    for rank in job.ranks:
        meta = job.meta["ranks"][rank]["collectives"]
        assert {m["call"] for m in meta.values()} == {"c10d::allreduce_", "c10d::broadcast_"}
        assert bucket_profile.ddp_buckets(job, rank)
        buckets = [op for op in job.graphs[rank].ops.values() if op.param and "bucket" in op.param]
        assert len(buckets) == 2 and all(meta[op.name]["kind"] == "all_reduce" for op in buckets)


NCCL_CALLS = {
    "c10d::_reduce_scatter_base_": "reduce_scatter", "c10d::_allgather_base_": "all_gather",
    "c10d::allreduce_": "all_reduce", "c10d::alltoall_base_": "all_to_all",
}  # fmt: skip
SIZES = {"float": 4, "signed char": 1, "unsigned char": 1, "long": 8, "int": 4}


def _nccl_calls(path: Path) -> dict[tuple[int, str], list[int]]:
    """(step, kind) -> the bytes of each c10d collective op of the step, by start (raw
    JSON): an all-gather's and a reduce-scatter's larger tensor (the unsharded one), an
    all-to-all's input (what the rank sends: ``alltoall_base_(out, in, ...)``), an
    all-reduce's tensor as the ``nccl:all_reduce`` record inside it names it (the
    ``allreduce_`` op records its tensor list without shapes in these traces)."""
    events = _events(path)["traceEvents"]
    step_of = _step_of(events)
    records = [e for e in events if e.get("name") == "nccl:all_reduce"]
    out: dict[tuple[int, str], list[int]] = {}
    for e in sorted(events, key=lambda e: e.get("ts", 0)):
        if e.get("cat") != "cpu_op" or e["name"] not in NCCL_CALLS or step_of(e["ts"]) is None:
            continue
        kind = NCCL_CALLS[e["name"]]
        dims, types = e["args"]["Input Dims"], e["args"]["Input type"]
        if kind == "all_reduce":
            (inner,) = [r for r in records if r["tid"] == e["tid"]
                        and e["ts"] <= r["ts"] <= e["ts"] + e["dur"]]  # fmt: skip
            dims, types = inner["args"]["Input Dims"], inner["args"]["Input type"]
        pairs = zip(dims, types, strict=False)
        tensors = [math.prod(d) * SIZES[t.lower()] for d, t in pairs if d and t]
        nbytes = {"all_to_all": tensors[-1], "all_reduce": tensors[0]}.get(kind, max(tensors))
        out.setdefault((step_of(e["ts"]), kind), []).append(nbytes)
    return out


@pytest.mark.parametrize(
    "path",
    [
        HTA / "negative_queue_length_values_check" / "rank0.json.gz",
        HTA / "trace_filter" / "sampled_rank-0.json.gz",
    ],  # fmt: skip
    ids=["negative_queue", "sampled_rank0"],
)
def test_nccl_collectives_counted_from_the_raw_json(path: Path) -> None:
    """NCCL traces of jobs that shard: each step's reduce-scatters, all-gathers,
    all-reduces and all-to-alls, each op (``net/<kind>#k``, the k-th of its kind in a
    step) of the largest bytes its c10d op moved in any step (an all-gather's is the
    gathered output, 8x or 64x the shard the ``nccl:_all_gather_base`` record names);
    a job that reduce-scatters its gradients has no DDP buckets."""
    job = detect.load([need(path)])
    (rank,) = job.ranks
    graph, t = job.graphs[rank], job.trace.of(rank)
    meta = job.meta["ranks"][rank]["collectives"]
    raw = _nccl_calls(path)
    found: dict[tuple[int, str], list[str]] = {}
    for op, step in zip(t["op"], t["iteration"], strict=True):
        if graph.ops[op].kind == "collective":
            found.setdefault((int(step), meta[op]["kind"]), []).append(op)
    assert {k: len(v) for k, v in found.items()} == {k: len(v) for k, v in raw.items()}
    largest: dict[tuple[str, int], int] = {}
    for (_, kind), sizes in raw.items():
        for k, n in enumerate(sizes):
            largest[kind, k] = max(largest.get((kind, k), 0), n)
    ops = {op for v in found.values() for op in v}
    assert ops == {f"net/{kind}#{k}" for kind, k in largest}
    for kind, k in largest:
        assert graph.ops[f"net/{kind}#{k}"].nbytes == largest[kind, k]
    sharded = any(kind == "reduce_scatter" for _, kind in raw)
    assert bucket_profile.ddp_buckets(job, rank) is not sharded
    named = any((op.param or "").startswith("bucket") for op in graph.ops.values())
    assert named is not sharded


def test_an_nccl_kernel_names_its_kind_and_the_record_its_group() -> None:
    """vLLM on 8 B200s: the one ``ncclDevKernel_AllGather_RING_LL`` is an all-gather of
    the kernel's ``Out msg nelems`` bf16 elements on process group 3, whose ranks, size,
    description and backend the kernel's args and ``distributedInfo.pg_config`` give."""
    from planner.ingest.kineto_comms import BUILTIN_PATTERNS, kernel_kinds
    from planner.ingest.kineto_gpu import gpu_rows
    from planner.ingest.kineto_stream import read_rank

    path = need(B200)
    ev = read_rank(path)
    _, kinds = kernel_kinds(ev, gpu_rows(ev), BUILTIN_PATTERNS)
    code = next(i for i, n in enumerate(ev.names) if n.startswith("ncclDevKernel_AllGather"))
    assert kinds[code] == "all_gather"
    doc = _events(path)
    (kernel,) = [e for e in doc["traceEvents"] if e["name"].startswith("ncclDevKernel_AllGather")]
    job = detect.load([path])
    (rank,) = job.ranks
    meta = job.meta["ranks"][rank]["collectives"]
    (gather,) = [op for op in job.graphs[rank].ops.values()
                 if op.kind == "collective" and meta[op.name]["kind"] == "all_gather"]  # fmt: skip
    assert meta[gather.name]["call"] == "c10d::_allgather_base_"
    assert gather.nbytes == kernel["args"]["Out msg nelems"] * 2 and gather.resource == "net:3"
    group = job.meta["ranks"][rank]["process_groups"]["3"]
    (pg,) = [p for p in doc["distributedInfo"]["pg_config"] if p["pg_name"] == "3"]
    described = {k: group.pop(k) for k in ("assigned", "role", "role_source")}
    assert group == {"name": "3", "desc": pg["pg_desc"], "ranks": pg["ranks"],
                     "size": pg["pg_size"], "backend": pg["backend_config"]}  # fmt: skip
    assert described["assigned"] == "trace"  # the kernel's args name the group
    assert group["ranks"] == json.loads(kernel["args"]["Process Group Ranks"])
