"""Horovod timelines, and chrome traces left without their closing bracket (issue #45, 5).

The figures of the real 4-rank timeline are counted here from its raw events and from
its SOURCE.md; the unterminated cases run on small synthetic files and on copies of the
repository's own traces.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import shutil
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, SHARED, need, run_cli

from planner.errors import InputError
from planner.ingest import detect
from planner.ingest.files import loads_unterminated

HOROVOD = SHARED / "public" / "external" / "horovod_tf_cpu_mpi4" / "horovod_timeline.json"
KINETO = REPO / "traces" / "torch" / "ddp_windows" / "rank0.w0.json.gz"
TIMELINES = REPO / "traces" / "tf_timeline" / "GPU"


def _raw(path: Path) -> list[dict[str, Any]]:
    """The timeline's events, closed by hand (Horovod never writes the ``]``)."""
    text = path.read_text().rstrip()
    assert not text.endswith("]"), "the shared timeline is unterminated"
    return json.loads(text.rstrip(",") + "]")


def _raw_figures(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Per tensor from the raw events: ALLREDUCE count, NEGOTIATE_ALLREDUCE and ALLREDUCE
    time (µs), its bytes; per all-reduce the ticks; the MPI_ALLREDUCE spans."""
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    stack: dict[int, list[dict[str, Any]]] = defaultdict(list)
    count: Counter[str] = Counter()
    negotiate: Counter[str] = Counter()
    transfer: Counter[str] = Counter()
    ticks: dict[int, dict[str, int]] = {}
    reduces: list[tuple[str, dict[str, int], int]] = []  # (tensor, ticks, ALLREDUCE begin)
    wire: list[tuple[int, int, str]] = []
    for e in events:
        pid = e.get("pid")
        if e["ph"] == "B":
            stack[pid].append(e)
            if e["name"].startswith("NEGOTIATE_"):
                ticks[pid] = {}
        elif e["ph"] == "X" and e["name"].isdigit():
            ticks[pid][e["name"]] = e["ts"]
        elif e["ph"] == "E":
            begin = stack[pid].pop()
            tensor, took = names[pid], e["ts"] - begin["ts"]
            if begin["name"] == "NEGOTIATE_ALLREDUCE":
                negotiate[tensor] += took
            elif begin["name"] == "ALLREDUCE":
                count[tensor] += 1
                transfer[tensor] += took
                reduces.append((tensor, ticks[pid], begin["ts"]))
            elif begin["name"] == "MPI_ALLREDUCE":
                wire.append((begin["ts"], e["ts"], tensor))
    return {
        "count": count,
        "negotiate": negotiate,
        "transfer": transfer,
        "reduces": reduces,
        "wire": sorted(wire),
    }


@pytest.fixture(scope="module")
def horovod() -> dict[str, Any]:
    path = need(HOROVOD)
    from planner_cli.main import main

    documents = {}
    for command in ("inspect", "metrics"):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            main([command, "--json", str(path)])
        documents[command] = json.loads(out.getvalue())
    return {"raw": _raw_figures(_raw(path)), **documents}


def test_the_timeline_is_sniffed_and_read_without_its_closing_bracket() -> None:
    path = need(HOROVOD)
    assert detect.sniff(path).format == "horovod"
    job = detect.load([path])
    assert job.framework == "horovod"
    assert job.ranks == ["rank0", "rank1", "rank2", "rank3"]  # SOURCE.md: 4 ranks
    for rank in job.ranks:
        assert job.trace.iterations(rank) == list(range(110))  # 110 ALLREDUCE per tensor
        graph = job.graphs[rank]
        assert {op.kind for op in graph.ops.values()} == {"collective"}
        assert {op.resource for op in graph.ops.values()} == {"net"}
        # SOURCE.md: 125,595,364 bytes all-reduced per iteration, 6 tensors
        assert len(graph) == 6
        assert sum(op.nbytes for op in graph.ops.values()) == 125_595_364


def test_per_tensor_counts_and_sums_match_the_raw_events(horovod: dict[str, Any]) -> None:
    raw, summary = horovod["raw"], horovod["inspect"]["horovod"]
    assert summary == horovod["metrics"]["horovod"]
    tensors = {t["tensor"]: t for t in summary["tensors"]}
    assert set(tensors) == set(raw["count"])
    for name, entry in tensors.items():
        assert entry["allreduces"] == raw["count"][name] == 110
        assert entry["negotiate"] == pytest.approx(raw["negotiate"][name] / 1e6, abs=1e-6)
        assert entry["transfer"] == pytest.approx(raw["transfer"][name] / 1e6, abs=1e-6)
    # SOURCE.md: NEGOTIATE_ALLREDUCE 386,701.0 ms, MPI_ALLREDUCE 47,169.5 ms in all,
    # MEMCPY_IN / OUT_FUSION_BUFFER 135.5 / 162.6 ms
    assert sum(t["negotiate"] for t in tensors.values()) == pytest.approx(386.701, abs=5e-4)
    assert sum(t["wire"] for t in tensors.values()) == pytest.approx(47.1695, abs=5e-5)
    assert sum(t["memcpy_in"] for t in tensors.values()) == pytest.approx(0.1355, abs=5e-5)
    assert sum(t["memcpy_out"] for t in tensors.values()) == pytest.approx(0.1626, abs=5e-5)
    assert summary["ranks"] == 4 and summary["iterations"] == 110
    assert summary["bytes_per_iteration"] == 125_595_364
    assert summary["cycles"] == 13_999  # the CYCLE_START marks
    assert summary["other_collectives"] == {"BROADCAST": 13}


def test_fused_groups_are_the_overlapping_wire_spans(horovod: dict[str, Any]) -> None:
    groups: list[list[tuple[int, int, str]]] = []
    for span in horovod["raw"]["wire"]:
        if groups and span[0] < max(e for _, e, _ in groups[-1]):
            groups[-1].append(span)
        else:
            groups.append([span])
    fused = Counter(tuple(sorted(t for _, _, t in g)) for g in groups if len(g) > 1)
    reported = horovod["inspect"]["horovod"]["fused"]
    assert reported["allreduces"] == sum(fused.values()) == 107  # 214 MEMCPY_IN / 2
    assert {tuple(g["tensors"]): g["count"] for g in reported["groups"]} == dict(fused)
    sizes = {t["tensor"]: t["nbytes"] for t in horovod["inspect"]["horovod"]["tensors"]}
    for group in reported["groups"]:
        assert group["nbytes"] == sum(sizes[t] for t in group["tensors"])


def test_metrics_split_each_ranks_wait_from_the_transfer(horovod: dict[str, Any]) -> None:
    raw, allreduce = horovod["raw"], horovod["metrics"]["allreduce"]
    waits: Counter[tuple[str, str]] = Counter()  # (rank, tensor) -> µs from its tick to the last
    for tensor, ticks, _ in raw["reduces"]:
        for rank, tick in ticks.items():
            waits[f"rank{rank}", tensor] += max(ticks.values()) - tick
    got_wait: Counter[tuple[str, str]] = Counter()
    got_transfer: Counter[tuple[str, str]] = Counter()
    for t in allreduce["transfers"]:
        got_wait[t["rank"], t["name"]] += t["wait"]
        got_transfer[t["rank"], t["name"]] += t["transfer"]
    assert len(allreduce["transfers"]) == 4 * 6 * 110
    for (rank, tensor), total in got_transfer.items():
        assert total == pytest.approx(raw["transfer"][tensor] / 1e6, abs=1e-5), (rank, tensor)
        assert got_wait[rank, tensor] == pytest.approx(waits[rank, tensor] / 1e6, abs=1e-5)
    steps = horovod["metrics"]["horovod"]["steps"]
    assert [s["iteration"] for s in steps] == list(range(110))
    for step in steps:
        assert step["tensors"] == 6
        assert 0 < step["transfer_covered"] <= step["transfer"]
        assert 0 < step["wait_covered"] <= step["wait"]
    total_wait = sum(s["wait"] for s in steps)
    spread = sum(max(ticks.values()) - min(ticks.values()) for _, ticks, _ in raw["reduces"])
    assert total_wait == pytest.approx(spread / 1e6, abs=1e-4)


# ----------------------------------------------------------------------------- unterminated


def _tiny_timeline(trailer: str) -> str:
    """A 2-rank Horovod timeline of one tensor all-reduced twice, left open."""
    lines = [
        '{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "grad_w"}}',
        '{"ph": "i", "name": "CYCLE_START", "ts": 100, "s": "g"}',
    ]
    for k, base in enumerate((1000, 5000)):
        lines += [
            f'{{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": {base}, "pid": 1}}',
            f'{{"ph": "X", "name": "1", "ts": {base}, "pid": 1, "dur": 0}}',
            f'{{"ph": "X", "name": "0", "ts": {base + 300 + k}, "pid": 1, "dur": 0}}',
            f'{{"ph": "E", "ts": {base + 301 + k}, "pid": 1}}',
            f'{{"ph": "B", "name": "ALLREDUCE", "ts": {base + 400}, "pid": 1}}',
            f'{{"ph": "B", "name": "MPI_ALLREDUCE", "ts": {base + 401}, "pid": 1}}',
            f'{{"ph": "E", "ts": {base + 900}, "pid": 1}}',
            f'{{"ph": "E", "ts": {base + 1000}, "pid": 1, '
            '"args": {"dtype": "float32", "shape": "[10, 4]"}}',
        ]
    return "[\n" + ",\n".join(lines) + trailer


@pytest.mark.parametrize("trailer", [",\n", "\n", "", ",", ", \n\n"])
def test_an_unterminated_horovod_timeline_is_read(tmp_path: Path, trailer: str) -> None:
    path = tmp_path / "timeline.json"
    path.write_text(_tiny_timeline(trailer))
    job = detect.load([path])
    assert job.ranks == ["rank0", "rank1"]
    assert job.graphs["rank0"].ops["grad_w"].nbytes == 160
    table = job.trace.table
    rows = [
        (r, int(i), int(s), int(d), int(w))
        for r, i, s, d, w in zip(
            table["rank"],
            table["iteration"],
            table["start"],
            table["duration"],
            table["wait"],
            strict=True,
        )
    ]  # rank1 ticked 300 (then 301) µs before rank0: its wait; the transfer is 600 µs
    assert sorted(rows) == [
        ("rank0", 0, 1_400_000, 600_000, 0),
        ("rank0", 1, 5_400_000, 600_000, 0),
        ("rank1", 0, 1_100_000, 900_000, 300_000),
        ("rank1", 1, 5_099_000, 901_000, 301_000),
    ]
    summary = job.meta["horovod"]
    assert summary["tensors"][0]["negotiate"] == pytest.approx((301 + 302) / 1e6)
    assert summary["tensors"][0]["transfer"] == pytest.approx(1200 / 1e6)


def test_loads_unterminated_closes_arrays_and_objects_only_on_failure() -> None:
    calls: list[bytes] = []

    def loads(data: bytes) -> Any:
        calls.append(data)
        return json.loads(data)

    assert loads_unterminated(loads, b"[1, 2]", ValueError) == [1, 2]
    assert calls == [b"[1, 2]"]  # the normal path parses once
    assert loads_unterminated(json.loads, b"[1, 2,\n ", ValueError) == [1, 2]
    assert loads_unterminated(json.loads, b'{"traceEvents": [1', ValueError) == {"traceEvents": [1]}
    events = b'{"traceEvents": [1], "b": 2'
    assert loads_unterminated(json.loads, events, ValueError) == {"traceEvents": [1], "b": 2}
    with pytest.raises(ValueError):  # no chrome trace: a planner trace cut short stays invalid
        loads_unterminated(json.loads, b'{"schema": "planner.trace/1", "ranks": [', ValueError)
    with pytest.raises(ValueError, match="Unterminated"):  # a cut inside an event stays
        loads_unterminated(json.loads, b'[{"ph": "X", "na', ValueError)
    with pytest.raises(ValueError):  # a closed text with another fault: the first error
        loads_unterminated(json.loads, b"[1, 2,]", ValueError)


def _inspect(paths: list[Path], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, out, err = run_cli(["inspect", "--json", *paths], capsys)
    assert code == 0, err
    document = json.loads(out)
    document.pop("sources")
    for rank in document["ranks"]:
        rank.pop("sources", None)
    return document


def test_a_kineto_trace_without_its_closing_bracket_reads_as_the_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = gzip.decompress(KINETO.read_bytes()).rstrip()
    assert text.endswith(b"}")
    cut = tmp_path / "cut" / "rank0.json"
    cut.parent.mkdir()
    cut.write_bytes(text[:-1] + b"\n")
    whole = _inspect([KINETO], capsys)
    assert _inspect([cut], capsys) == whole
    # the old bare-array layout, its ``]`` left off after a trailing comma
    events = json.loads(text)["traceEvents"]
    bare = tmp_path / "bare" / "rank0.json"
    bare.parent.mkdir()
    bare.write_text("[\n" + ",\n".join(json.dumps(e) for e in events) + ",\n")
    closed = tmp_path / "closed" / "rank0.json"
    closed.parent.mkdir()
    closed.write_text(json.dumps(events))
    assert _inspect([bare], capsys) == _inspect([closed], capsys)


def test_tf_timelines_without_their_closing_brackets_read_as_a_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for k in range(3):  # each step's file cut after its last event: ``]}`` left off
        text = (TIMELINES / f"timeline_02_step_{k}.json").read_text().rstrip()
        assert text.endswith("}")
        (tmp_path / f"timeline_02_step_{k}.json").write_text(text[:-1].rstrip()[:-1])
    whole = _inspect(sorted(TIMELINES.glob("timeline_02_step_*.json")), capsys)
    assert _inspect([tmp_path], capsys) == whole


def test_a_folder_with_one_unreadable_file_names_it_and_analyses_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for k in range(3):
        shutil.copy(TIMELINES / f"timeline_02_step_{k}.json", tmp_path)
    broken = tmp_path / "timeline_02_step_1.json"
    text = broken.read_text()
    broken.write_text(text[: len(text) // 2])  # cut inside an event: no bracket closes it
    for command in ("inspect", "metrics"):
        code, out, err = run_cli([command, tmp_path], capsys)
        assert code == 2
        assert out == ""
        lines = err.strip().splitlines()
        assert len(lines) == 1 and str(broken) in lines[0] and "invalid JSON" in lines[0]
    with pytest.raises(InputError) as raised:
        detect.load([tmp_path])
    assert raised.value.path == str(broken)


def test_a_horovod_timeline_cut_inside_an_event_is_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "timeline.json"
    text = _tiny_timeline(",\n")
    path.write_text(text[: text.rindex('"args"') + 4])
    code, out, err = run_cli(["inspect", path], capsys)
    assert (code, out) == (2, "")
    assert err.strip().splitlines() == [err.strip()] and str(path) in err
