"""Caramel's network model commands, exported files, and the real gloo benchmark."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli

from planner.export import caramel_files
from planner.ingest import netbench
from planner.model.graph import Op, build_graph
from planner.model.oracle import NetworkModel
from planner.planning.caramel import caramel, trace_network_model


def _write_csv(path: Path, a: float = 2e-4, b: float = 1e-9) -> Path:
    rows = [{"nbytes": n, "seconds": a + b * n, "seconds_min": a + b * n} for n in (64, 4 << 20)]
    rows.append({"nbytes": 65536, "seconds": a + b * 65536 + 1e-6})
    path.write_text(netbench.to_csv(rows))
    return path


def test_fit_network_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["fit-network", _write_csv(tmp_path / "n.csv"), "--json"], capsys)
    assert code == 0
    report = json.loads(out)
    assert report["schema"] == "planner.network_model/1"
    assert report["a"] == pytest.approx(2e-4, rel=1e-2)
    assert report["b"] == pytest.approx(1e-9, rel=1e-3)
    assert 0.99 < report["r2"] <= 1.0
    assert len(report["residuals"]) == 3
    assert abs(report["threshold_bytes"] - 1.5 * report["a"] / report["b"]) <= 1
    assert [r["depth"] for r in report["depth_table"]] == [1, 2, 4, 8]


def test_fit_network_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(["--no-color", "fit-network", _write_csv(tmp_path / "n.csv")], capsys)
    assert code == 0
    assert "batching threshold" in out and "Residuals" in out and "Depth" in out


@pytest.mark.parametrize(
    ("text", "problem"),
    [("size,time\n1,2\n", "no 'nbytes' column"), ("nbytes,seconds\n64,x\n", "must be numbers"),
     ("nbytes,seconds\n64,1\n64,2\n", "two distinct")],
)  # fmt: skip
def test_fit_network_bad_csv_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, problem: str
) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    code, out, err = run_cli(["fit-network", path], capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and problem in err and str(path) in err


def _plan():
    ops = [Op("loss"), Op("a1"), Op("b1")] + [
        Op(p, "collective", "net", param=f"w.{p}", nbytes=n, phase="backward")
        for p, n in (("A", 100), ("B", 4000))
    ]
    graph = build_graph(ops, [("loss", "a1"), ("loss", "b1"), ("a1", "A"), ("b1", "B")])
    return caramel(graph, {"loss": 1.0, "a1": 2.0, "b1": 1.0}, NetworkModel(1e-3, 1e-6), rank="r0")


def test_export_documents(tmp_path: Path) -> None:
    plan = _plan()
    assert plan.control_edges == (("b1", "a1"),)
    caramel_files.write_control_deps(tmp_path / "deps.json", {"r0": plan})
    caramel_files.write_bucket_plan(tmp_path / "buckets.json", {"r0": plan})
    deps = json.loads((tmp_path / "deps.json").read_text())
    assert deps["schema"] == "planner.control_deps/1"
    assert deps["ranks"][0]["edges"] == [{"src": "b1", "dst": "a1"}]
    assert deps["ranks"][0]["activation_order"] == ["B", "A"]
    buckets = json.loads((tmp_path / "buckets.json").read_text())
    assert buckets["schema"] == "planner.bucket_plan/1"
    groups = buckets["ranks"][0]["groups"]
    assert [g["order_index"] for g in groups] == list(range(len(groups)))
    assert sorted(p for g in groups for p in g["params"]) == ["w.A", "w.B"]
    assert all(g["placement"]["pass"] in ("backward", "forward", "beyond_backward",
                                          "beyond_forward") for g in groups)  # fmt: skip
    assert buckets["ranks"][0]["threshold_bytes"] == 1501
    assert [g["depth"] for g in groups if g["nbytes"] == 4000] == [2]  # 4000 >= 2 x 1501


def test_export_refuses_other_plans() -> None:
    from dataclasses import replace

    with pytest.raises(ValueError, match="tac"):
        caramel_files.control_deps_document({"r0": replace(_plan(), algorithm="tac")})


def test_trace_network_model_fits_the_fastest_transfer_per_size() -> None:
    """One point per size: the fastest transfer part (duration less the wait for the
    peers) over every occurrence, as the time oracle takes the minimum of the runs."""
    import pandas as pd

    ops = [Op(f"t{n}", "collective", "net", nbytes=n) for n in (1000, 2000, 4000)]
    graph = build_graph(ops, [])
    timings = pd.DataFrame(
        {
            "rank": ["r0"] * 5,
            "iteration": [1, 2, 1, 2, 3],
            "op": ["t1000", "t1000", "t2000", "t2000", "t4000"],
            "start": [0, 0, 5000, 0, 0],
            "duration": [2000, 2200, 3000, 9200, 5000],
            "wait": [0, 0, 0, 6000, 0],
        }
    )
    model = trace_network_model(graph, timings)
    assert model is not None and model.points == 3
    assert model.b == pytest.approx(1e-9) and model.a == pytest.approx(1e-6)
    assert model.r2 == pytest.approx(1.0)
    # two transfers in flight at once on a rank share the link: each counts for half
    # of the time they overlap (t1000 and t2000 of step 1 now overlap from 1000 to 2000)
    timings.loc[2, "start"] = 1000
    shared = trace_network_model(graph, timings)
    assert shared.time(1000) < model.time(1000)
    # every step's transfers one block of several (step 1 alone: [0, 2000) and [1000,
    # 4000)): the link busy throughout, its throughput, 3000 bytes over 4000 ns
    block = trace_network_model(graph, timings[timings["iteration"] == 1])
    assert block is not None and block.points == 1 and block.a == 0.0
    assert block.b == pytest.approx(4000e-9 / 3000)


def test_bench_network_real_gloo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    out_csv = tmp_path / "net.csv"
    args = ["bench-network", "-n", "2", "--sizes", "64,65536", "--repeats", "3", "--warmup",
            "1", "-o", out_csv, "--json"]  # fmt: skip
    code, out, _ = run_cli(args, capsys)
    assert code == 0
    rows = json.loads(out)["rows"]
    assert [r["nbytes"] for r in rows] == [64, 65536]
    assert all(r["seconds"] > 0 and r["seconds_min"] <= r["seconds"] for r in rows)
    sizes, seconds = netbench.read_csv(out_csv.read_text())
    assert sizes == [64.0, 65536.0] and len(seconds) == 2
