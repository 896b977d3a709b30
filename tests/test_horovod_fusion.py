"""`schedule -a caramel` on a Horovod timeline: Caramel's batching threshold against the
buffers Horovod fused, Horovod's loop replayed, a setting recommended only beyond the
replay's error (issue #45, 5). Figures are counted here from the raw events of the real
4-rank timeline in ../shared (test data only: read from there, never copied)."""

from __future__ import annotations

import contextlib
import io
import json
import re
from collections import Counter, defaultdict
from pathlib import Path
from statistics import median
from typing import Any

import pytest
from conftest import SHARED, need, run_cli

from planner.ingest import detect
from planner.model.oracle import NetworkModel
from planner.prediction import horovod_replay
from tests.test_schemas import validate

HOROVOD = SHARED / "public" / "external" / "horovod_tf_cpu_mpi4" / "horovod_timeline.json"
UNIT_IN_CELL = re.compile(r"\d (ms|µs|s) *│")
"""A time whose unit sits in its cell (each cell its own unit, before): one unit per
table, under its headers."""


def _raw_allreduces(path: Path) -> list[dict[str, Any]]:
    """Each ALLREDUCE from the raw events, in file order: tensor, its k-th all-reduce,
    bytes (from the ``E`` args), the last rank's tick, its span and its MPI span (µs)."""
    events = json.loads(path.read_text().rstrip().rstrip(",") + "]")
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    width = {"float32": 4, "float64": 8, "float16": 2, "int32": 4, "int64": 8}
    stack: dict[int, list[dict[str, Any]]] = defaultdict(list)
    ticks: dict[int, list[int]] = {}
    wire: dict[int, tuple[int, int]] = {}
    seen: Counter[str] = Counter()
    found = []
    for e in events:
        pid = e.get("pid")
        if e["ph"] == "B":
            stack[pid].append(e)
            if e["name"].startswith("NEGOTIATE_"):
                ticks[pid] = []
        elif e["ph"] == "X" and e["name"].isdigit():
            ticks[pid].append(e["ts"])
        elif e["ph"] == "E":
            begin = stack[pid].pop()
            if begin["name"] == "MPI_ALLREDUCE":
                wire[pid] = (begin["ts"], e["ts"])
            elif begin["name"] == "ALLREDUCE":
                tensor = names[pid]
                size = width[e["args"]["dtype"]]
                for dim in json.loads(e["args"]["shape"]):
                    size *= dim
                found.append({"tensor": tensor, "k": seen[tensor], "nbytes": size,
                              "ready": max(ticks[pid]), "start": begin["ts"], "end": e["ts"],
                              "wire": wire.pop(pid)})  # fmt: skip
                seen[tensor] += 1
    return found


def _raw_buffers(reduces: list[dict[str, Any]]) -> Counter[tuple[str, ...]]:
    """The all-reduces Horovod ran: tensors whose MPI_ALLREDUCE spans overlap went as one."""
    spans = sorted((r["wire"], r["tensor"]) for r in reduces)
    groups: list[list[str]] = []
    reach = None
    for (begin, end), tensor in spans:
        if reach is not None and begin < reach:
            groups[-1].append(tensor)
            reach = max(reach, end)
        else:
            groups.append([tensor])
            reach = end
    return Counter(tuple(sorted(g)) for g in groups)


@pytest.fixture(scope="module")
def planned() -> dict[str, Any]:
    path = need(HOROVOD)
    from planner_cli.main import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
        main(["schedule", "-a", "caramel", "--json", str(path)])
    return {"document": json.loads(out.getvalue()), "raw": _raw_allreduces(path)}


def test_the_plan_document_carries_the_fusion_advice(planned: dict[str, Any]) -> None:
    document = planned["document"]
    validate(document)
    advice = document["horovod"]
    assert advice["threshold_bytes"] == document["ranks"][0]["inputs"]["threshold_bytes"]
    assert advice["network"] == document["ranks"][0]["inputs"]["network"]


def test_horovods_buffers_are_counted_from_the_raw_spans(planned: dict[str, Any]) -> None:
    advice, raw = planned["document"]["horovod"], planned["raw"]
    nbytes = {r["tensor"]: r["nbytes"] for r in raw}
    buffers = _raw_buffers(raw)
    rows = {tuple(r["tensors"]): r for r in advice["fused"]["allreduces"]}
    assert {k: r["count"] for k, r in rows.items()} == dict(buffers)
    iterations = max(r["k"] for r in raw) + 1
    threshold = advice["threshold_bytes"]
    for tensors, row in rows.items():
        assert row["nbytes"] == sum(nbytes[t] for t in tensors)
        assert row["per_iteration"] == pytest.approx(buffers[tensors] / iterations)
        assert row["vs_threshold"] == ("above" if row["nbytes"] >= threshold else "below")
    small_alone = sum(c for t, c in buffers.items() if len(t) == 1 and nbytes[t[0]] < threshold)
    assert advice["fused"]["small_alone_per_iteration"] == pytest.approx(small_alone / iterations)


def test_the_replay_error_is_against_the_raw_spans(planned: dict[str, Any]) -> None:
    advice, raw = planned["document"]["horovod"], planned["raw"]
    by: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in raw:
        by[r["k"]].append(r)
    spans = [(max(r["end"] for r in rs) - min(r["ready"] for r in rs)) / 1e6 for rs in by.values()]
    assert advice["measured_span"] == pytest.approx(median(spans))
    error = advice["replay_error"]
    assert error["median_abs"] >= abs(error["median"]) - 1e-12
    assert abs(error["worst"]) >= error["median_abs"]
    # the loop replayed as the job ran rebuilds Horovod's own buffers in most iterations
    assert error["buffers_matched"] > 0.5


def test_a_setting_is_recommended_only_beyond_the_replay_error(planned: dict[str, Any]) -> None:
    advice = planned["document"]["horovod"]
    best = max(advice["candidates"], key=lambda c: c["gain"])
    assert advice["best"] == best
    beyond = best["gain"] > 0 and best["gain_fraction"] > advice["replay_error"]["median_abs"]
    assert (advice["recommended"] == best) if beyond else advice["recommended"] is None
    assert {c["HOROVOD_FUSION_THRESHOLD"] for c in advice["candidates"]} == {
        advice["threshold_bytes"],
        advice["assumed"]["HOROVOD_FUSION_THRESHOLD"],
    }
    own = [c for c in advice["candidates"]
           if (c["HOROVOD_FUSION_THRESHOLD"], c["HOROVOD_CYCLE_TIME"]) == (
               advice["assumed"]["HOROVOD_FUSION_THRESHOLD"],
               advice["assumed"]["HOROVOD_CYCLE_TIME"])]  # fmt: skip
    assert [c["gain"] for c in own] == [0.0]  # the job's own settings gain nothing


def test_the_schedule_text_says_threshold_buffers_and_verdict(capsys) -> None:  # noqa: ANN001
    code, out, err = run_cli(["schedule", "-a", "caramel", need(HOROVOD)], capsys)
    assert code == 0, err
    assert "Caramel batching threshold:" in out
    assert "Horovod's all-reduces against the threshold" in out
    assert "Fusion settings replayed" in out
    assert ("recommended: HOROVOD_FUSION_THRESHOLD=" in out) != ("no setting recommended" in out)
    assert not UNIT_IN_CELL.search(out) and "span" in out and re.search(r"\((ms|µs|s)\)", out)


def test_each_tensor_alone_and_all_in_one_cycle(planned: dict[str, Any]) -> None:
    """The replay's fusion on the timeline's own ready times: a threshold of one byte
    sends every tensor alone; a cycle longer than the iteration fuses what fits."""
    job = detect.load([need(HOROVOD)])
    traced = horovod_replay.iterations(job.meta["horovod_allreduces"])
    net = planned["document"]["horovod"]["network"]
    network = NetworkModel(net["a"], net["b"])
    alone = horovod_replay.replay(traced, 1, 0.005, 0.0, network)
    assert all(len(b) == 1 for it in alone["buffers"] for b in it)
    sizes = {t: n for it in traced for _, n, t in it.tensors}
    whole = horovod_replay.replay(traced, sum(sizes.values()), 100.0, 0.0, network)
    assert all(len(it) == 1 for it in whole["buffers"])  # one buffer per iteration
    # the loop runs its buffers one after the other: no span is shorter than their costs
    total = network.time(sum(sizes.values()))
    assert (whole["spans"] >= total - 1e-12).all()
    costs = sum(network.time(n) for n in sizes.values())
    assert (alone["spans"] >= costs - 1e-12).all()


def test_inspect_and_metrics_show_the_horovod_tables(capsys) -> None:  # noqa: ANN001
    path = need(HOROVOD)
    raw = _raw_allreduces(path)
    code, out, _ = run_cli(["inspect", path, "--wide"], capsys)
    assert code == 0
    iterations = max(r["k"] for r in raw) + 1
    assert f"Horovod: 4 ranks, {iterations} iterations" in out
    assert all(t in out for t in {r["tensor"] for r in raw})
    assert not UNIT_IN_CELL.search(out)
    code, out, _ = run_cli(["metrics", path, "--wide"], capsys)
    assert code == 0 and not UNIT_IN_CELL.search(out)
    table = out[out.index("negotiation wait vs transfer per iteration") :]
    rows = [line for line in table.splitlines() if line.startswith("│")]
    assert len(rows) == iterations
