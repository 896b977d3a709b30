"""Kineto ingest on real traces: collectives and sizes, steps, op identity, DAG, errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from planner.errors import InputError
from planner.ingest import detect
from planner.ingest.kineto import is_execution_trace, is_kineto, load_kineto
from planner.job.analysis import oracles
from tests.conftest import needs

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
GENERATED = SHARED / "generated" / "torch"
DLRM = SHARED / "public/param/et_replay/tests/inputs/dlrm_kineto.tar.gz.extracted/dlrm_kineto"
SMALL = REPO / "traces" / "torch" / "hta_trace_compare_base.json.gz"
RUNS = ["resnet_ddp", "resnet_ddp_bucket1mb", "transformer_ddp"]

needs_generated = needs(GENERATED)
needs_dlrm = needs(DLRM)


@pytest.fixture(scope="module")
def jobs():
    cache: dict[str, object] = {}

    def get(run: str):
        if run not in cache:
            cache[run] = load_kineto([GENERATED / run])
        return cache[run]

    return get


@needs_generated
@pytest.mark.parametrize("run", RUNS)
def test_one_allreduce_per_bucket_with_bucket_sizes(jobs, run):
    job = jobs(run)
    assert job.ranks == ["rank0", "rank1"]
    for rank in job.ranks:
        meta = json.loads((GENERATED / run / f"meta_{rank}.json").read_text())
        buckets = [int(x) for x in meta["ddp_logging_data"]["rebuilt_bucket_sizes"].split(",")]
        graph = job.graphs[rank]
        allreduces = [n for n in graph.transfers if graph.ops[n].type == "gloo:all_reduce"]
        assert len(allreduces) == len(buckets)
        sizes = sorted((graph.ops[n].nbytes for n in allreduces), reverse=False)
        assert sizes == sorted(buckets)
        rows = job.trace.of(rank)
        for step in meta["profiled_steps"]:
            in_step = rows[(rows["iteration"] == step) & rows["op"].isin(allreduces)]
            assert len(in_step) == len(buckets), (rank, step)
        # bucket k is the k-th all-reduce DDP launches; each one carries param bucket<k>
        params = {graph.ops[n].param for n in allreduces}
        assert params == {f"bucket{k}" for k in range(len(buckets))}
        assert all(graph.ops[n].phase == "backward" for n in allreduces)
        assert all(graph.ops[n].resource == "net" for n in allreduces)


@needs_generated
def test_broadcasts_are_transfers_with_sizes(jobs):
    graph = jobs("resnet_ddp").graphs["rank0"]
    casts = [n for n in graph.transfers if graph.ops[n].type == "gloo:broadcast"]
    assert len(casts) == 2  # BatchNorm buffers, once per step
    assert all(n.startswith("net/broadcast#") for n in casts)
    assert sorted(graph.ops[n].nbytes for n in casts) == [20 * 8, 4800 * 4]


@needs_generated
def test_steps_and_spans_from_profiler_steps(jobs):
    job = jobs("transformer_ddp")
    summary = json.loads((GENERATED / "transformer_ddp" / "summary.json").read_text())
    for rank, chrome in zip(job.ranks, summary["chrome"], strict=False):
        assert job.trace.iterations(rank) == [3, 4, 5, 6, 7]
        spans = job.trace.spans[job.trace.spans["rank"] == rank].set_index("iteration")
        for step, info in chrome["per_step"].items():
            number = int(step.split("#")[1])
            span = spans.loc[number]
            assert span["end"] - span["start"] >= round(info["dur_us"] * 1000) - 1


@needs_generated
def test_op_identity_across_steps_and_ranks(jobs):
    job = jobs("resnet_ddp")
    names = {
        (rank, step): set(job.trace.of(rank, step)["op"])
        for rank in job.ranks
        for step in job.trace.iterations(rank)
    }
    reference = names[("rank0", 3)]
    assert len(reference) > 500
    for key, ops in names.items():
        assert ops == reference, key
    rows = job.trace.of("rank0")
    assert not rows.duplicated(["iteration", "op"]).any()


@needs_generated
def test_oracle_is_min_over_steps(jobs):
    job = jobs("resnet_ddp")
    oracle = oracles(job)["rank0"]
    graph = job.graphs["rank0"]
    rows = job.trace.of("rank0")
    main = rows[[graph.ops[n].resource == "main" for n in rows["op"]]]
    minimum = main.groupby("op")["duration"].min() / 1e9
    assert len(minimum) > 500
    for name, value in minimum.items():  # one thread: dedicated time == duration
        assert oracle.time(name) == pytest.approx(value, abs=1e-12)
        assert oracle.observed_in[name] == 5


@needs_generated
def test_conservative_dag(jobs):
    job = jobs("resnet_ddp")
    graph = job.graphs["rank0"]
    dag = graph.dag
    main = [n for n in graph.topological_order() if graph.ops[n].resource == "main"]
    # program order on the main thread is a chain
    rows = job.trace.of("rank0", 3).set_index("op")["start"]
    assert [n for n in sorted(main, key=lambda n: rows[n])] == main
    optimizer = [n for n in main if graph.ops[n].phase == "optimizer"]
    assert optimizer
    for name in graph.transfers:
        preds = list(dag.predecessors(name))
        # the launching op: the outermost main-thread op around c10d::<collective>_
        assert [graph.ops[p].resource for p in preds] == ["main"]
        start = job.trace.of("rank0", 3).set_index("op")["start"]
        assert start[preds[0]] <= start[name]
    for name in (n for n in graph.transfers if graph.ops[n].param.startswith("bucket")):
        assert dag.has_edge(name, optimizer[0])  # the optimizer step waits for the gradients


@needs_dlrm
def test_dlrm_eight_ranks_nccl_collectives():
    job = load_kineto([DLRM])
    assert job.ranks == [f"rank{i}" for i in range(8)]
    for rank in job.ranks:
        graph = job.graphs[rank]
        kinds = sorted(n.split("#")[0] for n in graph.transfers)
        assert kinds.count("net/all_to_all") == 5
        assert kinds.count("net/all_reduce") == 3
        for name in graph.transfers:
            op = graph.ops[name]
            assert op.type.startswith("ncclKernel_")  # the kernel's time, not the launch
            assert op.nbytes > 0
        assert any(r.startswith(f"gpu{rank[4:]}/stream") for r in graph.resources)
    sizes = {graph.ops["net/all_reduce#0"].nbytes for graph in job.graphs.values()}
    assert sizes == {394241 * 4}  # nccl:all_reduce Input Dims [[394241]] float


def test_small_trace_reads():
    job = load_kineto([SMALL])
    assert job.ranks == ["rank1"]
    graph = job.graphs["rank1"]
    assert graph.transfers == ["net/all_reduce#0"]
    assert graph.ops["net/all_reduce#0"].nbytes == 4432073 * 4
    assert job.trace.iterations("rank1") == [1009, 1010]


def test_sniffing_heads():
    head = gzip.decompress(SMALL.read_bytes())[:65536]
    assert is_kineto(head)
    assert not is_execution_trace(head)
    assert not is_kineto(b'{"traceEvents": [{"args": {"name": "/job:worker/replica:0"}}]}')


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("name", "make", "problem"),
    [
        ("cut.json.gz", lambda raw: raw[: len(raw) // 2], "broken gzip"),
        ("bad.json", lambda raw: gzip.decompress(raw)[:-20], "invalid JSON"),
        ("empty.json", lambda raw: b"", "empty"),
        ("none.json", lambda raw: b'{"schemaVersion": 1}', "no traceEvents"),
        ("list.json", lambda raw: b'{"traceEvents": [1, 2]}', "not an event"),
    ],
)
def test_bad_input_is_one_input_error(tmp_path, name, make, problem):
    path = _write(tmp_path, name, make(SMALL.read_bytes()))
    with pytest.raises(InputError) as info:
        load_kineto([path])
    assert str(path) in str(info.value)
    assert problem in info.value.problem
    assert "\n" not in str(info.value)


PUBLIC = SHARED / "public"
PUBLIC_FILES = (
    sorted(
        p
        for p in PUBLIC.rglob("*")
        if p.is_file() and p.name not in ("LICENSE", "INDEX.md") and p.suffix != ".md"
    )
    if PUBLIC.is_dir()
    else [pytest.param(PUBLIC, marks=needs(PUBLIC))]
)


@pytest.mark.parametrize("path", PUBLIC_FILES, ids=lambda p: str(p.relative_to(PUBLIC)))
def test_public_file_is_read_or_refused(path):
    """Every public file: a Job (or parsed ET), or one InputError line; never a traceback."""
    from planner.ingest import execution_trace
    from planner.model.trace import Job

    raw = path.read_bytes()
    try:
        head = gzip.decompress(raw)[:65536] if raw[:2] == b"\x1f\x8b" else raw[:65536]
    except (OSError, EOFError):
        head = raw[:65536]
    try:
        if is_kineto(head):
            result = load_kineto([path])
            assert isinstance(result, Job) and result.graphs
        elif is_execution_trace(head):
            result = execution_trace.read_execution_trace(path)
            assert len(result.nodes) > 0
        else:
            assert isinstance(detect.load([path]), Job)
    except InputError as exc:
        assert str(exc).strip() and "\n" not in str(exc)
