"""Process groups (issue #45, point 2): every collective on its group, each group's role,
and communication per group, kind and phase, hidden vs exposed.

`traces/torch/tp_dp_2x2` is a real 2x2 data x tensor parallel job (gloo, 4 ranks): its
CPU trace names no group per collective, but every tensor-parallel all-reduce is of a
``[32, 64]`` activation and every data-parallel one a DDP bucket (its README), so the raw
JSON says which group ran each record; the figures are counted from it."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, run_cli
from test_schemas import validate

from planner.ingest import detect

TP_DP = REPO / "traces" / "torch" / "tp_dp_2x2"
PHASES = {"forward": "forward", "backward": "backward", "optimizer_step": "optimizer"}


def _raw(rank: int) -> tuple[dict, list[dict]]:
    """(distributedInfo, per gloo record of a profiled step: step, group, phase, bytes and
    duration in ns), the group read off the record's tensor (the module's docstring)."""
    doc = json.loads(gzip.decompress((TP_DP / f"rank{rank}.json.gz").read_bytes()))
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    steps = [(e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1]))
             for e in events if e["name"].startswith("ProfilerStep#")]  # fmt: skip
    ranges = [(e["ts"], e["ts"] + e["dur"], PHASES[e["name"]])
              for e in events if e["name"] in PHASES and e["cat"] == "user_annotation"]  # fmt: skip
    by_desc = {g["pg_desc"]: g for g in doc["distributedInfo"]["pg_config"]}
    found = []
    for e in events:
        if not e["name"].startswith("gloo:"):
            continue
        step = next((n for a, b, n in steps if a <= e["ts"] < b), None)
        if step is None:
            continue
        (dims,) = e["args"]["Input Dims"]
        group = by_desc["tp" if dims == [32, 64] else "dp"]["pg_name"]
        phase = next((p for a, b, p in ranges if a <= e["ts"] < b), "unknown")
        found.append({"step": step, "group": group, "phase": phase,
                      "bytes": 4 * dims[0] * (dims[1] if len(dims) > 1 else 1),
                      "ns": round(e["dur"] * 1000)})  # fmt: skip
    return doc["distributedInfo"], found


def test_each_collective_is_on_its_group_with_the_role_its_description_states() -> None:
    """Each rank's collectives are on its own tensor- and data-parallel groups (per step
    and bytes as the raw records), with the ranks pg_config lists; the roles are the
    descriptions' (``tp``, ``dp``), the groups found by gloo's worker threads; only the
    data-parallel all-reduces are DDP buckets."""
    job = detect.load([TP_DP])
    assert job.ranks == ["rank0", "rank1", "rank2", "rank3"]
    for rank in job.ranks:
        info, raw = _raw(int(rank[4:]))
        meta = job.meta["ranks"][rank]
        listed = {g["pg_name"]: g for g in info["pg_config"]}
        groups = meta["process_groups"]
        assert set(groups) == {r["group"] for r in raw} and "0" not in groups
        for name, group in groups.items():
            want = {"tp": "tensor_parallel", "dp": "data_parallel"}[listed[name]["pg_desc"]]
            assert group["ranks"] == listed[name]["ranks"] and rank[4:] in map(str, group["ranks"])
            assert (group["role"], group["role_source"], group["assigned"]) == (
                want, "trace", "inferred")  # fmt: skip
        graph, t = job.graphs[rank], job.trace.of(rank)
        ours = Counter()
        for op, step in zip(t["op"], t["iteration"], strict=True):
            if graph.ops[op].kind == "collective":
                c = meta["collectives"][op]
                ours[int(step), c["group"], graph.ops[op].nbytes] += 1
                bucket = (graph.ops[op].param or "").startswith("bucket")
                assert bucket is (groups[c["group"]]["role"] == "data_parallel")
        assert ours == Counter((r["step"], r["group"], r["bytes"]) for r in raw)


def test_per_group_figures_sum_to_the_raw_event_times(capsys: pytest.CaptureFixture[str]) -> None:
    """``metrics --json``: per rank, step, group and phase the count and time of the
    collectives are the raw records' (their ``dur``, ns rounding aside); the totals per
    group, kind and phase are the rows' sums; exposed + hidden is the time; ``inspect``
    carries the same figures; the text names each group's role and ranks."""
    code, out, err = run_cli(["metrics", TP_DP, "--json"], capsys)
    assert code == 0, err
    document = json.loads(out)
    validate(document)
    c = document["communication"]
    raw_time, raw_count = Counter(), Counter()
    for rank in range(4):
        for r in _raw(rank)[1]:
            key = (f"rank{rank}", r["step"], r["group"], r["phase"])
            raw_time[key] += r["ns"]
            raw_count[key] += 1
    ours_time, ours_count = Counter(), Counter()
    for row in c["rows"]:
        key = (row["rank"], row["iteration"], row["group"], row["phase"])
        ours_time[key] += row["time"]
        ours_count[key] += row["count"]
        assert row["kind"] == "all_reduce" and 0 <= row["exposed"] <= row["time"]
    assert ours_count == raw_count
    for key, ns in raw_time.items():
        assert abs(ours_time[key] * 1e9 - ns) <= raw_count[key]  # 1 ns per record
    for total in c["by_group"]:
        mine = [r for r in c["rows"] if r["group"] == total["group"]]
        assert total["time"] == pytest.approx(sum(r["time"] for r in mine), abs=1e-12)
        assert total["exposed"] + total["hidden"] == pytest.approx(total["time"])
        assert total["ranks"] == 2
        assert total["time_per_step"] == pytest.approx(total["time"] / 6)  # 2 ranks x 3 steps
    assert {t["phase"] for t in c["by_phase"]} == {"forward", "backward"}
    assert sum(t["time"] for t in c["by_kind"]) == pytest.approx(sum(raw_time.values()) / 1e9)
    code, out, err = run_cli(["inspect", TP_DP, "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["communication"] == c
    code, out, err = run_cli(["metrics", TP_DP], capsys)
    assert code == 0, err
    assert "tensor parallel" in out and "data parallel" in out and "0,2" in out


def _kineto(path: Path, events: list[dict]) -> Path:
    """A Kineto trace of one rank and one step around `events` (µs)."""
    step = {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1,
            "tid": 1, "ts": 0, "dur": 1000, "args": {}}  # fmt: skip
    path.write_text(json.dumps({"traceEvents": [step, *events],
                                "distributedInfo": {"backend": "gloo", "rank": 0,
                                                    "world_size": 2}}))  # fmt: skip
    return path


def test_exposed_is_the_time_no_innermost_op_computed(tmp_path: Path) -> None:
    """A collective is hidden by the innermost ops of the computing threads only: an outer
    op that waits for it (a synchronous all-reduce inside an autograd Function's range)
    hides nothing, nor its c10d call, nor gloo's worker thread."""
    op = {"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "args": {}}
    call = {"Input Dims": [[[256]]], "Input type": ["TensorList"]}
    record = {"Input Dims": [[256]], "Input type": ["float"]}
    events = [
        {**op, "name": "outer", "ts": 100, "dur": 500},
        {**op, "name": "aten::mm", "ts": 120, "dur": 80},  # 120..200
        {**op, "name": "c10d::allreduce_", "ts": 200, "dur": 10, "args": call},
        {**op, "name": "aten::add", "ts": 450, "dur": 100},  # 450..550
        {
            **op,
            "tid": 2,
            "cat": "user_annotation",
            "name": "gloo:all_reduce",
            "ts": 150,
            "dur": 350,
            "args": record,
        },  # fmt: skip
    ]
    job = detect.load([_kineto(tmp_path / "rank0.json", events)])
    (rank,) = job.ranks
    (step,) = job.meta["ranks"][rank]["exposed"].values()
    (exposed,) = step.values()
    # the all-reduce 150..500: mm hides 150..200, add 450..500; 250 µs exposed
    assert exposed == 250_000


def test_the_innermost_ops_sort_by_thread_then_start_the_longer_first() -> None:
    """`kineto_exposure`'s one-key sort is the lexsort by (thread, start, -end) it stands
    for: on the events of a real rank, and where two share thread and start (a nested op
    that starts with its parent) or the key would not fit in int64."""
    from planner.ingest.kineto_exposure import _by_thread_then_time
    from planner.ingest.kineto_stream import read_rank

    ev = read_rank(TP_DP / "rank0.json.gz")
    rng = np.random.default_rng(0)
    lane = rng.integers(0, 3, 500).astype(np.int32)
    ts = rng.integers(0, 40, 500) * 1000 + 10**18
    end = ts + rng.integers(1, 900, 500)
    for lanes, starts, ends in [
        (ev.lane, ev.ts, ev.end),  # no two share thread and start
        (lane, ts, end),  # many do
        (lane, np.where(lane == 1, ts - 10**18, ts), end),  # a span past int64's
    ]:
        got = _by_thread_then_time(lanes, starts, ends)
        assert np.array_equal(got, np.lexsort((-ends, starts, lanes)))


def test_caramel_and_the_bucket_advice_plan_only_the_data_parallel_group(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """On the 2x2 job, Caramel's plan (one process, and one rank per process) holds the
    DDP buckets of each rank's data-parallel group and no tensor-parallel all-reduce, and
    names the group it left alone; the bucket advice profiles the buckets the raw records
    hold (``[9296]`` and ``[8256]`` floats) and says the same."""
    from planner.job import analysis, stages
    from planner.planning import bucket_profile

    raw = sorted({r["bytes"] for r in _raw(0)[1] if r["group"] == "3"})
    assert raw == [33024, 37184]
    job = detect.load([TP_DP])
    one = stages.plan_document(analysis.schedule(job, "caramel"), job.graphs, job.meta)
    code, out, err = run_cli(["schedule", "-a", "caramel", TP_DP, "--json"], capsys)
    assert code == 0, err
    for document in (one, json.loads(out)):
        validate(document)
        for entry in document["ranks"]:
            meta = job.meta["ranks"][entry["rank"]]
            planned = [meta["collectives"][t["name"]]["group"] for t in entry["transfers"]]
            dp = {g for g, d in meta["process_groups"].items() if d["role"] == "data_parallel"}
            assert len(planned) == 2 and set(planned) == dp
            assert sorted(t["nbytes"] for t in entry["transfers"]) == raw
            groups = entry["inputs"]["process_groups"]
            assert [g["desc"] for g in groups["left_alone"]] == ["tp"]
            assert "left alone tp (tensor parallel" in groups["note"]
    profile = bucket_profile.profile(job)
    assert sorted(profile.observed_buckets.tolist()) == raw
    sweep = stages.bucket_sweep(job)
    assert sweep["process_groups"]["left_alone"][0]["role"] == "tensor_parallel"


def test_fsdp_gets_no_caramel_plan_and_no_bucket_sweep(capsys: pytest.CaptureFixture[str]) -> None:
    """An FSDP job reduce-scatters its gradients: no Caramel plan (exit 2, the reason
    named, in one process or one rank per process), no bucket sweep in its report, and a
    note that says why."""
    from planner.job import analysis, stages

    fsdp = REPO / "traces" / "torch" / "fsdp" / "fsdp2_reshard"
    job = detect.load([fsdp])
    assert "caramel" not in stages.algorithms_for(job)
    for workers in ("1", "2"):
        code, out, err = run_cli(["schedule", "-a", "caramel", "-j", workers, fsdp], capsys)
        assert code == 2 and out == "" and "reduce-scattered (FSDP/ZeRO)" in err
    report = analysis.analyze(job, samples=3)
    assert report["bucket_sweep"] is None and "caramel" not in report["plans"]
    assert any("reduce-scattered (FSDP/ZeRO)" in n for n in report["inspect"]["notes"])


def test_a_collective_waits_only_for_the_ranks_of_its_group() -> None:
    """Two tensor-parallel groups run the same op apart: with each row's group, a rank
    waits for its group's last rank, not for the other group's (the clocks aligned on an
    op every rank runs)."""
    from planner.model import waits

    rows = {
        "rank": np.array(["r0", "r1", "r2", "r3"] * 2, dtype=object),
        "iteration": np.zeros(8, dtype=np.int64),
        "op": np.array(["net/a"] * 4 + ["net:tp/t"] * 4, dtype=object),
        "start": np.array([0, 0, 0, 0, 1000, 1010, 1100, 1200], dtype=np.int64),
        "duration": np.array([50, 50, 50, 50, 300, 290, 200, 100], dtype=np.int64),
    }
    alone, _ = waits.split_waits(rows)
    assert alone[4:].tolist() == [200, 190, 100, 0]  # all four taken as one collective
    rows["group"] = np.array(["0"] * 4 + ["1", "1", "2", "2"], dtype=object)
    grouped, alignment = waits.split_waits(rows)
    assert alignment is not None and grouped[4:].tolist() == [10, 0, 100, 0]
