"""Per-rank parallel analysis: same figures as one process, on a pool and on Dask."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import DEMO, REPO, SHARED, need, run_cli
from test_schemas import validate

from planner.errors import InputError
from planner.ingest import detect
from planner.job import analysis, parallel, pipeline, shown_ranks, stages, summaries
from planner.job.parallel import analyze_ranks
from planner.model import trace as trace_module

MLP = SHARED / "generated" / "tf" / "mlp_ps_betweengraph_sync"
RESNET = REPO / "traces" / "torch" / "resnet_ddp"


def _ranks(kind: str) -> list[list[Path]]:
    if kind == "tf":
        return [[need(MLP / "worker0")], [MLP / "worker1"]]
    return [[need(RESNET / "rank0.json.gz")], [RESNET / "rank1.json.gz"]]


@pytest.mark.parametrize("kind", ["tf", "torch"])
def test_pool_matches_one_process_and_the_joint_load(kind: str) -> None:
    inputs = _ranks(kind)
    pooled, usage = analyze_ranks(inputs, workers=2)
    serial, _ = analyze_ranks(inputs, workers=1)
    assert pooled == serial
    joint = detect.load([p for paths in inputs for p in paths])
    whole = analysis.metrics(joint)
    key = lambda s: (s["rank"], s["iteration"])  # noqa: E731
    assert sorted(pooled["steps"], key=key) == sorted(whole["steps"], key=key)
    # one straggler definition: the longest wait in collectives for a later rank
    stragglers = {s["iteration"]: s for s in (whole["allreduce"] or {}).get("stragglers", [])}
    for item in pooled["iterations"]:
        expected = stragglers.get(item["iteration"], {}).get("straggler_time", 0.0)
        assert item["straggler"] == pytest.approx(expected, abs=1e-9)
    assert pooled["job"]["ranks"] == 2 and pooled["job"]["common_iterations"] == 5
    assert len(usage) == 2 and all(u["peak_rss_mib"] > 10 for u in usage)


def test_a_bad_rank_is_an_input_error(tmp_path: Path) -> None:
    broken = tmp_path / "rank1.json.gz"
    broken.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(InputError) as caught:
        analyze_ranks([[DEMO], [broken]], workers=2)
    assert caught.value.path == str(broken)


def test_the_same_rank_twice_is_refused() -> None:
    with pytest.raises(InputError, match="rank 'worker0' also comes from"):
        analyze_ranks([[DEMO], [DEMO]], workers=1)


def test_cli_analyze_ranks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ranks.json"
    code, _, err = run_cli(["analyze-ranks", DEMO, "-j", "1", "-o", out], capsys)
    assert code == 0, err
    document = json.loads(out.read_text())
    validate(document)
    assert document["schema"] == "planner.ranks/1" and document["job"]["ranks"] == 1
    code, stdout, err = run_cli(["analyze-ranks", DEMO, tmp_path / "none", "-o", out], capsys)
    assert code == 2 and stdout == "" and len(err.splitlines()) == 1 and "none" in err


def test_on_a_dask_local_cluster() -> None:
    distributed = pytest.importorskip("distributed")
    inputs = _ranks("tf")
    expected, _ = analyze_ranks(inputs, workers=1)
    with distributed.LocalCluster(
        host="127.0.0.1", n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        got, usage = analyze_ranks(inputs, dask_address=cluster.scheduler_address)
    assert got == expected
    assert len({u["pid"] for u in usage}) >= 1


def test_unreachable_dask_scheduler_is_an_input_error() -> None:
    pytest.importorskip("distributed")
    with pytest.raises(InputError, match="cannot reach the Dask scheduler"):
        analyze_ranks([[DEMO]], dask_address="tcp://127.0.0.1:9")


# ---------------------------------------------------------------------------------------
# `planner metrics` on several ranks: one rank per task, the same document byte for byte

TORCH_RUNS = SHARED / "generated" / "torch"
DLRM = (
    SHARED / "public" / "param" / "et_replay" / "tests" / "inputs"
    / "dlrm_kineto.tar.gz.extracted" / "dlrm_kineto"
)  # fmt: skip
JOBS = {
    "resnet_ddp": TORCH_RUNS / "resnet_ddp",
    "resnet_ddp_bucket1mb": TORCH_RUNS / "resnet_ddp_bucket1mb",
    "transformer_ddp": TORCH_RUNS / "transformer_ddp",
    "dlrm_8_ranks": DLRM,
}


def _one_process(folder: Path) -> str:
    """`planner metrics FOLDER --json` as one process computes it: the joint load."""
    from planner.export.files import dumps

    return dumps(analysis.metrics(detect.load([folder])))


@pytest.mark.parametrize("name", sorted(JOBS))
def test_metrics_per_rank_is_byte_identical(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    folder = need(JOBS[name])
    expected = _one_process(folder)
    ranks = parallel.rank_inputs([folder])
    assert ranks is not None and len(ranks) == (8 if name == "dlrm_8_ranks" else 2)
    for workers in ("1", "2"):
        code, out, err = run_cli(["metrics", folder, "--json", "-j", workers], capsys)
        assert code == 0, err
        assert out == expected
    document = json.loads(expected)
    validate(document)
    assert document["allreduce"]["stragglers"]  # the cross-rank part is there to get right


def _one_process_plan(folder: Path) -> str:
    """`planner schedule -a caramel FOLDER --json` as one process computes it."""
    from planner.export.files import dumps

    job = detect.load([folder])
    return dumps(analysis.plan_document(analysis.schedule(job, "caramel"), job.graphs, job.meta))


@pytest.mark.parametrize("name", sorted(JOBS))
def test_caramel_per_rank_is_byte_identical(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    folder = need(JOBS[name])
    expected = _one_process_plan(folder)
    for workers in ("1", "2"):
        code, out, err = run_cli(
            ["schedule", "-a", "caramel", folder, "--json", "-j", workers], capsys
        )
        assert code == 0, err
        assert out == expected
    document = json.loads(expected)
    validate(document)
    orders = {tuple(t["name"] for t in r["transfers"]) for r in document["ranks"]}
    assert len(document["ranks"]) == len(parallel.rank_inputs([folder])) and len(orders) == 1


def test_the_job_plan_takes_each_op_at_its_slowest_rank_less_the_waits() -> None:
    """The parent's op times for Caramel are the joint job's: per op the largest over the
    ranks of the oracle with the collectives' waits cut out, which no rank alone has."""
    folder = need(JOBS["transformer_ddp"])
    folded = summaries.Folded()
    fold = summaries.fold(folded)
    summaries_ = [
        fold(summaries.rank_summary([str(p) for p in r], plans=True))
        for r in parallel.rank_inputs([folder])
    ]
    assert all("fixed" not in s["caramel"] for s in summaries_)  # folded, not kept per rank
    planned, inputs = pipeline.caramel_inputs(summaries_, folded.times)
    job = detect.load([folder])
    oracle = analysis.oracles(job)
    expected = {
        name: max(oracle[r].times.get(name, 0.0) for r in job.ranks if name in job.graphs[r].ops)
        for graph in job.graphs.values()
        for name in graph.ops
    }
    assert inputs["times"] == expected
    alone = analysis.oracles(summaries.load_one_rank(planned[0]["inputs"]))
    (own,) = alone.values()
    collectives = [
        n for n, t in own.times.items() if n in summaries_[0]["caramel"]["material"]["ops"]
    ]
    assert any(own.times[n] != expected[n] for n in collectives)  # the waits moved them


def _one_process_simulation(folder: Path, **options: object) -> str:
    """`planner simulate FOLDER --json` (plans: all) as one process computes it."""
    from planner.export.files import dumps
    from planner.prediction import simulate as sim

    job = detect.load([folder])
    plans = {name: analysis.schedule(job, name) for name in analysis.algorithms_for(job)}
    knobs = {"bandwidth_scale": 1.0, "compute_scale": 1.0, "latency": 0.0, "channels": 1}
    return dumps(sim.simulation(job, plans, **options, **knobs))  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(JOBS))
def test_simulate_per_rank_is_byte_identical(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    folder = need(JOBS[name])
    expected = _one_process_simulation(
        folder, samples=8, seed=3, sweep_knob="latency", sweep_values=[0.0, 0.001]
    )
    for workers in ("1", "2"):
        command = ["simulate", folder, "--samples", "8", "--seed", "3", "--json", "-j", workers]
        code, out, err = run_cli([*command, "--sweep", "latency=0:0.001:2"], capsys)
        assert code == 0, err
        assert out == expected
    document = json.loads(expected)
    validate(document)
    plans = {p["plan"] for r in document["comparison"]["ranks"] for p in r["plans"]}
    assert "caramel" in plans and document["sweep"]["ranks"]


def test_peer_releases_from_the_summaries_are_the_joint_ones() -> None:
    """Each rank's replay waits for its peers' readiness: the parent's top-two reduction
    over the summaries gives every rank the same release times as the joint replay."""
    import numpy as np

    from planner.job import rank_replay
    from planner.prediction import replay as sim

    folder = need(JOBS["dlrm_8_ranks"])
    inputs = parallel.rank_inputs([folder])
    summaries = [rank_replay.replay_summary([str(p) for p in r]) for r in inputs]
    got = rank_replay.releases(summaries)
    job = detect.load([folder])
    expected = sim.job_releases(job, sim._frame(job))
    assert sorted(got) == sorted(expected) == job.ranks
    held = 0
    for rank, steps in expected.items():
        compiled = sim.compile_graph(job.graphs[rank])
        assert sorted(got[rank]) == sorted(steps)
        for it, latest in steps.items():
            mine = np.full(len(compiled.names), -1, dtype=np.int64)
            for name, t in got[rank][it].items():
                if name in compiled.index and compiled.transfer[compiled.index[name]]:
                    mine[compiled.index[name]] = t
            assert np.array_equal(mine, latest)
            held += int((latest >= 0).sum())
    assert held > 0  # the ranks do wait for one another


def test_the_parent_redoes_what_the_waits_change() -> None:
    """A rank alone reads its collectives' waits as transfer; in its job the oracle drops
    them, so the job's bounds differ from the rank's own and the parent must redo them."""
    folder = need(JOBS["transformer_ddp"])
    ranks = [summaries.rank_summary([str(p) for p in r]) for r in parallel.rank_inputs([folder])]
    alone = [s["document"]["ranks"][0]["oracle_umax"] for s in ranks]
    joined = pipeline.job_metrics(ranks)
    whole = analysis.metrics(detect.load([folder]))
    assert [r["oracle_umax"] for r in joined["ranks"]] == [r["oracle_umax"] for r in whole["ranks"]]
    assert [r["oracle_umax"] for r in joined["ranks"]] != alone
    waits = [t["wait"] for t in joined["allreduce"]["transfers"]]
    assert any(w > 0 for w in waits)
    assert waits == [t["wait"] for t in whole["allreduce"]["transfers"]]


def test_metrics_on_a_dask_local_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    distributed = pytest.importorskip("distributed", reason="the dask extra is not installed")
    folder = need(JOBS["dlrm_8_ranks"])
    expected = _one_process(folder)
    from planner.export.files import dumps

    with distributed.LocalCluster(
        host="127.0.0.1", n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
    ) as cluster:
        document, usage = parallel.metrics_ranks(
            parallel.rank_inputs([folder]), dask_address=cluster.scheduler_address
        )
        plan, _ = parallel.schedule_ranks(
            parallel.rank_inputs([folder]), dask_address=cluster.scheduler_address
        )
        simulation, _ = parallel.simulate_ranks(
            parallel.rank_inputs([folder]), dask_address=cluster.scheduler_address, samples=4
        )
    assert dumps(document) == expected
    assert dumps(plan) == _one_process_plan(folder)
    assert dumps(simulation) == _one_process_simulation(folder, samples=4)
    assert len(usage) == 8 and all(u["peak_rss_mib"] > 10 for u in usage)
    code, out, err = run_cli(["metrics", JOBS["transformer_ddp"], "--json", "--dask", "local",
                              "-j", "2"], capsys)  # fmt: skip
    assert code == 0, err
    assert out == _one_process(JOBS["transformer_ddp"])


def test_rank_inputs_split_only_pytorch_ranks(tmp_path: Path) -> None:
    folder = need(JOBS["resnet_ddp"])
    ranks = parallel.rank_inputs([folder])
    assert [[p.name for p in r] for r in ranks] == [
        ["rank0.json.gz", "et_rank0.json.gz"],
        ["rank1.json.gz", "et_rank1.json.gz"],
    ]
    files = [folder / "rank0.json.gz", folder / "rank1.json.gz"]
    assert parallel.rank_inputs(files) == [[files[0]], [files[1]]]
    assert parallel.rank_inputs([files[0]]) is None  # one rank
    assert parallel.rank_inputs([DEMO]) is None  # TensorFlow
    # an Execution Trace not named et_<trace>: the joint load pairs it, so no split
    (tmp_path / "a.json.gz").write_bytes((folder / "rank0.json.gz").read_bytes())
    (tmp_path / "b.json.gz").write_bytes((folder / "rank1.json.gz").read_bytes())
    (tmp_path / "trace0.json.gz").write_bytes((folder / "et_rank0.json.gz").read_bytes())
    assert parallel.rank_inputs([tmp_path]) is None


def test_a_truncated_rank_fails_as_in_one_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = need(JOBS["transformer_ddp"])
    data = (folder / "rank1.json.gz").read_bytes()
    (tmp_path / "rank0.json.gz").write_bytes((folder / "rank0.json.gz").read_bytes())
    (tmp_path / "rank1.json.gz").write_bytes(data[: len(data) * 2 // 3])
    assert parallel.rank_inputs([tmp_path]) is not None  # its head still sniffs as Kineto
    out_file = tmp_path / "out" / "metrics.md"
    results = []
    plan_file = tmp_path / "out" / "plan.json"
    for workers in ("1", "2"):
        code, out, err = run_cli(
            ["metrics", tmp_path, "-j", workers, "--markdown", out_file], capsys
        )
        results.append((code, out, err))
        command = ["schedule", "-a", "caramel", tmp_path, "-j", workers, "-o", plan_file]
        code, out, err = run_cli(command, capsys)
        assert code == 2 and out == "" and len(err.splitlines()) == 1, err
        assert "rank1.json.gz" in err and not plan_file.exists()
        code, out, err = run_cli(["simulate", tmp_path, "-j", workers, "--json"], capsys)
        assert code == 2 and out == "" and len(err.splitlines()) == 1, err
        assert "rank1.json.gz" in err
        report_dir = tmp_path / "report"
        code, out, err = run_cli(["analyze", tmp_path, "-j", workers, "-o", report_dir], capsys)
        assert code == 2 and out == "" and len(err.splitlines()) == 1, err
        assert "rank1.json.gz" in err and not report_dir.exists()
        assert code == 2 and out == "" and len(err.splitlines()) == 1, err
        assert "rank1.json.gz" in err and not out_file.exists()
    with pytest.raises(InputError) as joint:
        detect.load([tmp_path])
    assert str(joint.value) in results[1][2]


def test_ranks_of_different_jobs_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    a = need(JOBS["resnet_ddp"]) / "rank0.json.gz"
    b = need(JOBS["transformer_ddp"]) / "rank1.json.gz"
    with pytest.raises(InputError) as joint:
        detect.load([a, b])
    code, out, err = run_cli(["metrics", a, b, "-j", "2"], capsys)
    assert code == 2 and out == ""
    assert err.strip().endswith(str(joint.value)) and "not from the same job" in err


def test_analyze_computes_the_oracle_once_and_hands_it_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inspect, the plans and the metrics of `analyze` share one time oracle per rank (and
    so one dedicated-time table for it, on the rank's rows only), with the figures each
    would compute on its own. The metrics' view (whole spans) comes out of the same
    computation as the oracle's (collectives without their waits), one per rank."""
    calls = {"oracles": 0, "tables": 0}
    real_oracles, real_tables = stages.oracles, trace_module._dedicated_columns

    def counted_oracles(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["oracles"] += 1
        return real_oracles(*args, **kwargs)

    def counted_tables(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["tables"] += 1
        return real_tables(*args, **kwargs)

    for inputs, ranks, waited in (([RESNET], 2, True), ([RESNET / "rank0.json.gz"], 1, False)):
        job = detect.load(inputs)
        assert bool(job.trace.table["wait"].any()) == waited
        tables = ranks
        calls.update(oracles=0, tables=0)
        monkeypatch.setattr(stages, "oracles", counted_oracles)
        monkeypatch.setattr(trace_module, "_dedicated_columns", counted_tables)
        report = analysis.analyze(job, samples=5)
        assert calls == {"oracles": ranks, "tables": tables}
        monkeypatch.undo()
        fresh = detect.load(inputs)  # nothing kept on its trace
        assert report["inspect"] == analysis.inspect(fresh)
        assert report["metrics"] == analysis.metrics(fresh)


def test_a_summary_is_small_beside_its_rank() -> None:
    """The parent holds summaries only: after the fold, a rank's summary is under 1% of
    its trace (the generated transformer rank: 5 MiB of JSON, about 12 KiB pickled)."""
    import gzip
    import pickle

    from planner.job import rank_replay

    rank = need(JOBS["transformer_ddp"]) / "rank0.json.gz"
    summary = rank_replay.replay_summary([str(rank)])
    folded = summaries.Folded()
    summaries.fold(folded)(summary)
    trace = len(gzip.decompress(rank.read_bytes()))
    assert folded.times and len(pickle.dumps(summary)) * 100 < trace


# ---------------------------------------------------------------------------------------
# `planner analyze` on several ranks: one rank per task, the same report byte for byte

ANALYZE_JOBS = {
    "resnet_ddp": RESNET,
    "transformer_ddp": JOBS["transformer_ddp"],
    "dlrm_8_ranks": DLRM,
}


def _one_process_report(folder: Path, out: Path) -> tuple[str, dict[str, str]]:
    """(`planner analyze FOLDER --json -o OUT`, the files of `-o OUT`) as one process
    computes them on the joint load (with -o, the report names the files' rank parts)."""
    from planner.export.files import dumps
    from planner.reporting.outputs import analysis_files

    job = detect.load([folder])
    report = analysis.analyze(job)
    files = analysis_files(report, job.graphs, out)
    return dumps(report), {path.name: body for path, body in files.items()}


def _written(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("name", sorted(ANALYZE_JOBS))
def test_analyze_per_rank_is_byte_identical(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = need(ANALYZE_JOBS[name])
    expected, files = _one_process_report(folder, tmp_path / "joint")
    for workers in ("1", "2"):
        target = tmp_path / f"j{workers}"
        command = ["analyze", folder, "--json", "-j", workers, "-o", target]
        code, out, err = run_cli(command, capsys)
        assert code == 0, err
        assert out == expected and _written(target) == files
    report = json.loads(expected)
    validate(report)
    assert report["bucket_sweep"] is not None and report["simulation"]["timelines"]
    assert report["inspect"]["clock_alignment"] is not None  # the cross-rank parts are there
    assert any(t["wait_mean"] > 0 for r in report["inspect"]["ranks"] for t in r["transfers"])


def test_analyze_on_a_dask_local_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("distributed", reason="the dask extra is not installed")
    folder = need(ANALYZE_JOBS["dlrm_8_ranks"])
    expected, files = _one_process_report(folder, tmp_path / "joint")
    target = tmp_path / "dask"
    command = ["analyze", folder, "--dask", "local", "-j", "2", "--json", "-o", target]
    code, out, err = run_cli(command, capsys)
    assert code == 0, err
    assert out == expected and _written(target) == files


def test_analyze_reads_each_rank_with_one_oracle(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank's oracle is computed once in the first pass and handed on to its
    inspection, metrics and Caramel terms; the parent holds no trace."""
    from planner.job import rank_analysis

    folder = need(ANALYZE_JOBS["dlrm_8_ranks"])
    calls = {"oracles": 0}
    real = stages.oracles

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["oracles"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(stages, "oracles", counted)
    ranks, notes = parallel.split_ranks([folder])
    report, graphs, usage = rank_analysis.report_ranks(ranks, workers=1, samples=4, notes=notes)
    assert calls["oracles"] == len(ranks) == 8
    assert sorted(graphs) == [r["rank"] for r in report["metrics"]["ranks"]]
    assert len(usage) == 16  # two passes, one record per rank each


@pytest.mark.parametrize("name", sorted(ANALYZE_JOBS))
def test_a_kept_rank_reads_back_as_the_trace_gives_it(name: str, tmp_path: Path) -> None:
    """`rank_store`: a loaded rank (its trace and Execution Trace, meta with integer-keyed
    steps) kept between the passes reads back equal field by field, types included."""
    import numpy as np

    from planner.job import rank_store

    ranks = parallel.rank_inputs([need(ANALYZE_JOBS[name])])
    assert ranks is not None
    paths = [str(p) for p in ranks[-1]]
    job = summaries.load_one_rank(paths)
    assert rank_store.save(str(tmp_path), paths, job)
    back = rank_store.load(str(tmp_path), paths)
    assert back is not None and not list(tmp_path.iterdir())  # read once, then removed
    assert rank_store.load(str(tmp_path), paths) is None
    (rank,) = job.ranks
    assert (back.framework, back.sources, back.notes) == (job.framework, job.sources, job.notes)
    assert repr(back.meta) == repr(job.meta)
    assert any(isinstance(k, int) for m in job.meta["ranks"].values() for k in m.get(
        "collectives_per_step", {}))  # fmt: skip
    assert list(back.graphs[rank].ops.items()) == list(job.graphs[rank].ops.items())
    for edge in ("src", "dst", "control"):
        a, b = getattr(job.graphs[rank], edge), getattr(back.graphs[rank], edge)
        assert a.dtype == b.dtype and np.array_equal(a, b)
    for table in ("table", "span_table"):
        a, b = getattr(job.trace, table), getattr(back.trace, table)
        assert list(a) == list(b)
        for column in a:
            assert a[column].dtype == b[column].dtype
            assert [(type(v), v) for v in a[column].tolist()] == [
                (type(v), v) for v in b[column].tolist()
            ]


def test_a_rank_that_would_not_read_back_the_same_is_not_kept(tmp_path: Path) -> None:
    """A meta value JSON cannot hold (a numpy integer), or no folder on this machine (a
    Dask worker elsewhere): nothing is kept, and the second pass reads the trace again."""
    from dataclasses import replace

    import numpy as np

    from planner.job import rank_store

    paths = [str(RESNET / "rank0.json.gz")]
    job = summaries.load_one_rank(paths)
    odd = replace(job, meta={**job.meta, "world_size": np.int64(2)})
    assert not rank_store.save(str(tmp_path), paths, odd)
    assert not rank_store.save(str(tmp_path / "elsewhere"), paths, job)
    assert not list(tmp_path.iterdir()) and rank_store.load(str(tmp_path), paths) is None


def test_a_damaged_kept_rank_reads_as_none(tmp_path: Path) -> None:
    """A kept file cut short or overwritten (a full disk, another program) is no rank:
    `load` gives None, so that the second pass reads the trace again, never a traceback."""
    from planner.job import rank_store

    paths = [str(RESNET / "rank0.json.gz")]
    job = summaries.load_one_rank(paths)
    target = rank_store.path_of(str(tmp_path), paths)
    assert rank_store.save(str(tmp_path), paths, job)
    whole = target.read_bytes()
    for damaged in (whole[: len(whole) // 2], whole[:40], b"PK\x03\x04 not ours", b""):
        target.write_bytes(damaged)
        assert rank_store.load(str(tmp_path), paths) is None
    target.write_bytes(whole)
    back = rank_store.load(str(tmp_path), paths)
    assert back is not None and back.trace.rows == job.trace.rows


def _count_reads(monkeypatch: pytest.MonkeyPatch, *modules: Any) -> dict[str, int]:
    """Counts the calls of each module's `load_one_rank` (each one reads a rank's trace)."""
    reads = {"n": 0}
    for module in modules:
        real = module.load_one_rank

        def counted(paths, real=real):  # type: ignore[no-untyped-def]
            reads["n"] += 1
            return real(paths)

        monkeypatch.setattr(module, "load_one_rank", counted)
    return reads


def test_analyze_reads_each_rank_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first pass keeps each rank (`rank_store`) and the reference rank's plan and the
    second pass read it from there, not from its trace; without the store (a worker
    elsewhere) the report is the same."""
    from planner.export.files import dumps
    from planner.job import pipeline, rank_analysis, rank_store

    folder = need(ANALYZE_JOBS["dlrm_8_ranks"])
    ranks, notes = parallel.split_ranks([folder])
    reads = _count_reads(monkeypatch, rank_analysis, pipeline)
    kept, _, _ = rank_analysis.report_ranks(ranks, workers=1, samples=4, notes=notes)
    assert reads["n"] == len(ranks) == 8
    monkeypatch.setattr(rank_store, "save", lambda *args: False)
    again, _, _ = rank_analysis.report_ranks(ranks, workers=1, samples=4, notes=notes)
    assert reads["n"] == 8 + 8 + 8 + 1  # both passes and the reference plan
    assert dumps(kept) == dumps(again)


def test_simulate_reads_each_rank_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """`simulate` per rank keeps each rank between its passes too (`rank_store`): each
    trace is read once, and the document is the one the second read gives."""
    from planner.export.files import dumps
    from planner.job import rank_replay, rank_store

    ranks = parallel.rank_inputs([RESNET])
    assert ranks is not None
    reads = _count_reads(monkeypatch, rank_replay)
    kept, _ = parallel.simulate_ranks(ranks, workers=1, samples=4)
    assert reads["n"] == len(ranks) == 2
    monkeypatch.setattr(rank_store, "save", lambda *args: False)
    again, _ = parallel.simulate_ranks(ranks, workers=1, samples=4)
    assert reads["n"] == 2 + 4 and dumps(kept) == dumps(again)
    joint = detect.load([p for paths in ranks for p in paths])
    from planner.prediction import simulate

    plans = {"caramel": analysis.schedule(joint, "caramel")}
    assert dumps(kept) == dumps(simulate.simulation(joint, plans, samples=4))


def test_report_text_is_json_dumps_joined_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """`export.files.dumps` joins the encoder's chunks in pieces (a 1,000-rank report's
    parent memory): the text is `json.dumps`'s, whatever the piece size."""
    from planner.export import files

    document = analysis.metrics(detect.load([RESNET]))
    expected = json.dumps(document, indent=2, sort_keys=True, allow_nan=False) + "\n"
    for piece in (1, 7, 1 << 16):
        monkeypatch.setattr(files, "_PIECE", piece)
        assert files.dumps(document) == expected
    with pytest.raises(ValueError, match="not JSON compliant"):
        files.dumps({"x": float("nan")})


def test_a_large_job_carries_timelines_of_a_bounded_set(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Above `shown_ranks.TIMELINE_RANKS` the report keeps every rank's rows and only the
    schedules of the slowest, the fastest and the most often last-arriving rank, per rank
    and in one process alike; the rest of the report does not change."""
    from planner.job import rank_analysis
    from planner.reporting.outputs import analysis_files

    folder = need(ANALYZE_JOBS["dlrm_8_ranks"])
    ranks, notes = parallel.split_ranks([folder])
    full, _, _ = rank_analysis.report_ranks(ranks, workers=1, samples=4, notes=notes)
    full_timelines = full["simulation"]["timelines"]
    monkeypatch.setattr(shown_ranks, "TIMELINE_RANKS", 4)
    bounded, graphs, _ = rank_analysis.report_ranks(ranks, workers=1, samples=4, notes=notes)
    kept = {s["rank"] for s in bounded["simulation"]["timelines"]}
    spans = {e["rank"]: e["makespan_mean"] for e in full["metrics"]["ranks"]}
    last = [s["slowest_rank"] for s in full["metrics"]["allreduce"]["stragglers"]]
    expected = {max(spans, key=spans.get), min(spans, key=spans.get)}  # type: ignore[arg-type]
    expected.add(max(sorted(set(last)), key=last.count))
    assert kept == expected and 1 < len(kept) <= 3 and set(graphs) == kept
    assert bounded["simulation"]["timelines"] == [
        s for s in full["simulation"]["timelines"] if s["rank"] in kept
    ]
    files = analysis_files(bounded, graphs, tmp_path)
    timeline = json.loads(files[tmp_path / "timeline.json"])
    named = {e["args"]["name"] for e in timeline["traceEvents"] if e["name"] == "process_name"}
    assert named and all(any(rank in n for rank in kept) for n in named)
    del full["simulation"]["timelines"], bounded["simulation"]["timelines"]
    del bounded["file_names"]  # analysis_files records them
    assert bounded == full
    joint = analysis.analyze(detect.load([folder]), samples=4)  # one process: the same set
    assert joint["simulation"]["timelines"] == [s for s in full_timelines if s["rank"] in kept]


def test_analyze_per_rank_with_a_benchmark_model() -> None:
    """`analyze --network FILE` per rank: the plan and the bucket sweep use the benchmark
    model as in one process (the traced job's cap-4 run and its network benchmark)."""
    from planner.export.files import dumps
    from planner.ingest import netbench
    from planner.job import rank_analysis

    run = REPO / "traces" / "torch" / "ddp_mlp24_gloo"
    network = netbench.read_model(run / "net.csv")
    ranks, notes = parallel.split_ranks([run / "cap4"])
    assert ranks is not None and len(ranks) == 2
    got = rank_analysis.report_ranks(ranks, 2, samples=8, network=network, notes=notes)
    assert got is not None
    joint = analysis.analyze(detect.load([run / "cap4"]), samples=8, network=network)
    assert dumps(got[0]) == dumps(joint)
    assert joint["bucket_sweep"]["network_source"] == "benchmark"
    assert joint["bucket_sweep"]["recommended_cap_mb"] is not None


def test_a_ranks_windows_are_one_task_and_read_as_in_one_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rank traced in windows (a file per window of one profiling session) is one task:
    metrics and analyze per rank give the joint load's documents byte for byte."""
    folder = REPO / "traces" / "torch" / "ddp_windows"
    ranks = parallel.rank_inputs([folder])
    assert [[p.name for p in r] for r in ranks] == [
        [f"rank{r}.w{k}.json.gz" for k in range(3)] for r in range(2)
    ]
    assert parallel.rank_inputs(sorted(folder.glob("rank0.*.json.gz"))) is None  # one rank
    expected_metrics = _one_process(folder)
    expected, files = _one_process_report(folder, tmp_path / "joint")
    for workers in ("1", "2"):
        code, out, err = run_cli(["metrics", folder, "--json", "-j", workers], capsys)
        assert code == 0 and out == expected_metrics, err
        target = tmp_path / f"j{workers}"
        code, out, err = run_cli(["analyze", folder, "--json", "-j", workers, "-o", target], capsys)
        assert code == 0, err
        assert out == expected and _written(target) == files
    notes = json.loads(expected)["inspect"]["notes"]
    assert notes == [f"rank{r}: 3 windows of one profiling session joined" for r in range(2)]


# The per-rank analysis's fast paths (issue #19: worker CPU per rank) against plain
# references on real ranks: the replay's critical-path walk, the partial steps, the queue
# carried over between steps and the predecessor order the networkx view would give.


def _plain_critical_waits(model: Any, start: Any, end: Any, last: int) -> list[bool]:
    """The critical walk as first written: a dict per resource of the op that ended at a
    time (the highest index wins), the first held predecessor in edge order."""
    c = model.compiled
    n = len(model.overhead)
    preds: dict[int, list[int]] = {}
    for u, v in zip(c.src.tolist(), c.dst.tolist(), strict=True):
        preds.setdefault(v, []).append(u)
    ended: dict[tuple[int, int], int] = {}
    for i, (r, e) in enumerate(zip(c.res.tolist(), end.tolist(), strict=True)):
        if e >= 0:
            ended[(r, e)] = i
    on = [False] * n
    seen: set[int] = set()
    x = last
    while x >= 0 and x not in seen and start[x] > 0:
        seen.add(x)
        if n <= x < 2 * n:
            on[x - n] = True
        held = [u for u in preds.get(x, []) if end[u] == start[x]]
        x = held[0] if held else ended.get((int(c.res[x]), int(start[x])), -1)
    return on


def _rank(path: Path) -> tuple[Any, Any, Any]:
    from planner.prediction import replay as sim

    job = detect.load([path])
    (rank,) = job.ranks
    frame = sim._frame(job)
    return job, sim.compile_graph(job.graphs[rank]), frame[frame["rank"] == rank]


def test_the_critical_walk_is_the_plain_walk_on_real_steps() -> None:
    """On each step of a real DDP rank, as traced and as replayed, and on random times
    with many ties (ops ending as others start on the same resource), the vectorised
    walk marks exactly the waits the plain walk does."""
    import numpy as np

    from planner.prediction import replay as sim
    from planner.prediction.critical_path import critical_waits, observed_times

    job, compiled, rows = _rank(RESNET / "rank0.json.gz")
    (rank,) = job.ranks
    oracle = sim.mean_of_runs(job.graphs[rank], rows)
    models = sim._step_models(compiled, rows, oracle, sim.spans_of(job, rank))
    rng = np.random.default_rng(0)
    marked = 0
    for _, _, model in models.values():
        start, end = observed_times(model, model.start_of)
        ticks = sim.to_ticks(model.seconds)
        arrays = sim._arrays(model.compiled, model.priority, (), model.cap)
        _, begin, _ = sim._kernel(arrays, ticks, sim._draws(0, [0], len(ticks)), True)
        cases = [(start, end), (begin[0], begin[0] + ticks)]
        m = len(start)
        for _ in range(3):
            s = rng.integers(-1, 6, m)
            cases.append((s, np.where(s < 0, -1, s + rng.integers(0, 3, m))))
        for s, e in cases:
            for last in [int(np.argmax(e)), *rng.integers(0, m, 3).tolist()]:
                got = critical_waits(model, s, e, last)
                assert got.tolist() == _plain_critical_waits(model, s, e, last)
                marked += int(got.sum())
    assert marked > 0  # the walks did pass through waits


def test_partial_steps_are_the_plain_set_difference() -> None:
    """`records.partial_steps` on a real rank with records dropped at random: the ops
    seen in every other step but not this one, as plain sets give them, where their
    median time in the steps that have them adds up to `MISSING_SHARE` of the median
    step's recorded op time (statistics.median of plain lists)."""
    import statistics

    import numpy as np

    from planner.model.records import MISSING_SHARE, partial_steps

    job, _, rows = _rank(RESNET / "rank0.json.gz")
    (rank,) = job.ranks
    ops = job.graphs[rank].ops
    rng = np.random.default_rng(1)
    found = 0
    for share in (0.0, 0.002, 0.02, 0.3):
        kept = rows[rng.random(len(rows)) >= share]
        took: dict[tuple[str, int], float] = {}
        for o, i, d in zip(kept["op"], kept["iteration"], kept["duration"], strict=True):
            if o in ops:
                took[(o, int(i))] = took.get((o, int(i)), 0.0) + float(d)
        steps = sorted({i for _, i in took})
        typical_step = statistics.median(
            sum(d for (_, i), d in took.items() if i == s) for s in steps
        )
        expected = {}
        for step in steps:
            others = [s for s in steps if s != step]
            everywhere = {o for o in ops if all((o, s) in took for s in others)}
            gone = tuple(sorted(o for o in everywhere if (o, step) not in took))
            lost = sum(statistics.median(took[(o, s)] for s in others) for o in gone)
            if gone and lost >= MISSING_SHARE * typical_step:
                expected[step] = gone
        assert partial_steps(kept, ops) == expected
        found += len(expected)
    assert found > 0


def test_the_carried_queue_is_the_group_by_one() -> None:
    """`releases.carried_over` (numpy reductions) against pandas group-bys of the same
    rows: per step, the previous step's last end on each resource, the typical queue for
    the first step."""
    import numpy as np

    from planner.prediction import releases as sim

    job, compiled, rows = _rank(RESNET / "rank1.json.gz")
    (rank,) = job.ranks
    spans = sim.spans_of(job, rank)
    got = sim.carried_over(compiled, rows, spans)
    res = compiled.res[rows["op"].map(compiled.index).to_numpy()]
    table = rows.assign(res=res, end=rows["start"] + rows["duration"])
    ends = table.groupby(["iteration", "res"])["end"].max()
    first = {
        it: spans.get(it, (v, 0))[0] for it, v in table.groupby("iteration")["start"].min().items()
    }
    steps = sorted(first)
    assert list(got) == [*steps[1:], steps[0]]
    for before, it in zip(steps, steps[1:], strict=False):
        expected = np.full(len(compiled.resources), -1, dtype=np.int64)
        previous = ends.xs(before, level="iteration")
        expected[previous.index.to_numpy()] = previous.to_numpy()
        assert got[it].tolist() == expected[compiled.res].tolist()


def test_predecessors_in_the_networkx_order() -> None:
    """The replay's batching and the all-reduce launchers read predecessors from the
    edge arrays: the same ops in the same order as the graph's networkx view."""
    from planner.measure import allreduce
    from planner.prediction import comparison as sim

    job, compiled, _ = _rank(RESNET / "rank0.json.gz")
    (rank,) = job.ranks
    graph = job.graphs[rank]
    for i, name in enumerate(compiled.names):
        assert sim._predecessors(compiled, i) == list(graph.dag.pred[name])
    collectives = [n for n, op in graph.ops.items() if op.kind == "collective"]
    launchers = allreduce._launchers(graph, collectives)
    for name in collectives:
        cpu = [
            p
            for p in graph.dag.predecessors(name)
            if graph.ops[p].kind == "compute" and not graph.ops[p].resource.startswith("gpu")
        ]
        assert launchers[name] == (cpu[0] if cpu else None)
    assert any(launchers.values())
