"""A rank traced in windows of one profiling session (a schedule with ``repeat``, a file
per window) reads as one rank with every window's steps; files that are not windows of
one session are refused with one line naming the file."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from conftest import REPO, run_cli

from planner.ingest.kineto import load_kineto

WINDOWS = REPO / "traces" / "torch" / "ddp_windows"
FILES = sorted(WINDOWS.glob("rank*.w*.json.gz"))


def _raw(path: Path) -> dict:
    with gzip.open(path, "rt") as f:
        return json.load(f)


def _raw_steps(path: Path) -> list[int]:
    names = (e.get("name", "") for e in _raw(path)["traceEvents"])
    return sorted(int(m.group(1)) for n in names if (m := re.match(r"ProfilerStep#(\d+)$", n)))


def test_the_windows_of_each_rank_join_into_one_rank_with_every_step() -> None:
    job = load_kineto(FILES)
    spans = job.trace.spans
    assert sorted(spans["rank"].unique()) == ["rank0", "rank1"]
    for rank in ("rank0", "rank1"):
        raw = sorted(s for f in FILES if f.name.startswith(rank) for s in _raw_steps(f))
        assert raw == [2, 3, 6, 7, 10, 11]
        assert sorted(spans[spans["rank"] == rank]["iteration"].tolist()) == raw
    assert "rank0: 3 windows of one profiling session joined" in job.notes
    # every step holds its 4 gloo all-reduce records, as counted in the JSON
    t = job.trace.timings
    per_step = t[t["op"].str.startswith("net/all_reduce")].groupby(["rank", "iteration"]).size()
    assert per_step.tolist() == [4] * 12
    raw_records = sum(
        e.get("name") == "gloo:all_reduce" and e.get("ph") == "X"
        for f in FILES
        for e in _raw(f)["traceEvents"]
    )
    assert raw_records == int(per_step.sum()) == 48


def test_a_joined_window_reads_as_the_window_alone() -> None:
    """Joining changes no figure of a window's own steps: op names, starts, durations.
    (Waits may move: the ranks' clocks are aligned on every collective of the job.)"""
    joined = load_kineto(FILES).trace.timings
    for k in range(3):
        alone = load_kineto([WINDOWS / f"rank0.w{k}.json.gz", WINDOWS / f"rank1.w{k}.json.gz"])
        one = alone.trace.timings
        cols = ["rank", "iteration", "op", "start", "duration"]
        mine = joined[joined["iteration"].isin(one["iteration"].unique())][cols]
        key = ["rank", "iteration", "op"]
        assert mine.sort_values(key).values.tolist() == one[cols].sort_values(key).values.tolist()


def test_windows_given_in_reverse_order_join_the_same() -> None:
    forward = load_kineto(FILES).trace.timings
    backward = load_kineto(
        [f for r in ("rank0", "rank1") for f in reversed(FILES) if f.name.startswith(r)]
    ).trace.timings
    key = ["rank", "iteration", "op"]
    assert forward.sort_values(key).values.tolist() == backward.sort_values(key).values.tolist()


def _rewritten(tmp_path: Path, source: Path, name: str, change) -> Path:
    doc = _raw(source)
    for event in doc["traceEvents"]:
        change(event)
    out = tmp_path / name
    out.write_text(json.dumps(doc))
    return out


def _another_pid(event: dict) -> None:
    if isinstance(event.get("pid"), int):
        event["pid"] += 1


def test_files_that_are_not_windows_of_one_session_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = WINDOWS / "rank0.w0.json.gz"
    # another process: the same rank from another run
    other = _rewritten(tmp_path, FILES[1], "other.json", _another_pid)
    code, out, err = run_cli(["inspect", first, other], capsys)
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [err.strip()]
    assert "other.json" in err and "from another process" in err
    # a separate session: its step numbers repeat the first window's
    steps = {"ProfilerStep#6": "ProfilerStep#2", "ProfilerStep#7": "ProfilerStep#3"}
    again = _rewritten(
        tmp_path,
        FILES[1],
        "again.json",
        lambda e: e.update(name=steps.get(e.get("name"), e.get("name"))),
    )
    code, _, err = run_cli(["inspect", first, again], capsys)
    assert code == 2 and "again.json" in err and "ProfilerStep#2 is in rank0.w0.json.gz too" in err
    # one window given twice overlaps itself
    code, _, err = run_cli(["inspect", first, first], capsys)
    assert code == 2 and "overlaps" in err


H100 = REPO / "traces" / "torch" / "h100_cnn_windows"


def test_the_windows_of_a_one_process_job_are_one_rank(capsys) -> None:
    """A job without torch.distributed has no distributedInfo: its two windows (one
    process, steps counted from the raw JSON) read as one rank with all six steps, in
    one process, not as two ranks, nor as two tasks that both claim rank0."""
    from planner.job.parallel import split_ranks

    files = sorted(H100.glob("cnn_1gpu.w*.json.gz"))
    raw = sorted({s for f in files for s in _raw_steps(f)})
    assert raw == [4, 5, 6, 11, 12, 13]
    job = load_kineto(files)
    assert job.ranks == ["rank0"]
    assert sorted(job.trace.spans["iteration"].tolist()) == raw
    assert "rank0: 2 windows of one profiling session joined" in job.notes
    assert split_ranks(files) == (None, [])
    code, out, err = run_cli(["simulate", *files, "--json"], capsys)
    assert code == 0, err
    replay = json.loads(out)["replay"]["ranks"]
    assert [r["rank"] for r in replay] == ["rank0"]
    assert sorted(s["iteration"] for s in replay[0]["steps"]) == raw


def test_files_of_two_processes_without_distributedinfo_stay_two_ranks(tmp_path) -> None:
    """Without distributedInfo a rank is a process: a file of another process is another
    rank, whatever the order the files come in."""
    first = _raw(H100 / "cnn_1gpu.w0.json.gz")
    other = _raw(H100 / "cnn_1gpu.w1.json.gz")
    for event in other["traceEvents"]:
        if event.get("pid") == 440:
            event["pid"] = 441
    paths = []
    for name, doc in (("a.json", first), ("b.json", other)):
        path = tmp_path / name
        path.write_text(json.dumps(doc))
        paths.append(path)
    job = load_kineto(paths)
    assert job.ranks == ["rank0", "rank1"]
    assert not any("windows" in note for note in job.notes)
