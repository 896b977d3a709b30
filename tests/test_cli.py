"""The `planner` command line end to end on the bundled demo and the real TF traces."""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path

import pytest
from conftest import DEMO, REPO, TF_RUNS, need, run_cli


def test_analyze_without_path_runs_the_bundled_demo(tmp_path, capsys):
    code, out, err = run_cli(["analyze", "-o", tmp_path / "out"], capsys)
    assert code == 0, err
    assert "Predicted iteration time of worker0" in out  # the plans, the default answer
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["schema"] == "planner.report/1"
    assert set(report["plans"]) == {"tic", "tac"}
    lines = (tmp_path / "out" / "worker0.tac.txt").read_text().splitlines()
    names = [line.split("\t")[0] for line in lines]
    assert [int(line.split("\t")[1]) for line in lines] == list(range(len(lines)))
    assert sorted(names) == sorted(
        t["name"] for t in report["inspect"]["ranks"][0]["transfers"] if t["kind"] == "recv"
    )


@pytest.mark.parametrize("run", sorted(TF_RUNS))
def test_analyze_json_on_every_tf_trace(run, capsys):
    paths = [need(p) for p in TF_RUNS[run]]
    code, out, err = run_cli(["analyze", *paths, "--json"], capsys)
    assert code == 0, err
    assert err == ""
    report = json.loads(out)
    for step in report["metrics"]["steps"]:
        assert 0 <= step["efficiency"] <= 1
    for rank in report["inspect"]["ranks"]:
        recvs = {t["name"] for t in rank["transfers"] if t["kind"] == "recv"}
        for plan in report["plans"].values():
            (entry,) = [e for e in plan["ranks"] if e["rank"] == rank["rank"]]
            assert {t["name"] for t in entry["transfers"]} == recvs


def test_schedule_formats(tmp_path, capsys):
    code, out, _ = run_cli(["schedule", DEMO, "-a", "tac", "--json"], capsys)
    assert code == 0
    document = json.loads(out)
    assert document["schema"] == "planner.priorities/1"
    transfers = document["ranks"][0]["transfers"]
    assert [t["order_index"] for t in transfers] == list(range(len(transfers)))
    assert [t["priority"] for t in transfers] == list(range(len(transfers)))

    code, _, _ = run_cli(
        ["schedule", DEMO, "-a", "tic", "--format", "csv", "-o", tmp_path / "p.csv"], capsys
    )
    assert code == 0
    rows = list(csv.DictReader(io.StringIO((tmp_path / "p.csv").read_text())))
    assert len(rows) == len(transfers)
    assert {r["rank"] for r in rows} == {"worker0"}

    code, out, _ = run_cli(["schedule", DEMO, "-a", "tac", "--format", "tictac"], capsys)
    assert code == 0
    body = [line for line in out.splitlines() if not line.startswith("#")]
    assert [line.split("\t")[0] for line in body] == [t["name"] for t in transfers]


def test_tictac_files_per_rank(tmp_path, capsys):
    paths = [need(p) for p in TF_RUNS["cnn_ps_ingraph"]]
    code, _, err = run_cli(
        ["schedule", *paths, "--format", "tictac", "-o", tmp_path / "prio.txt"], capsys
    )
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prio.worker0.txt", "prio.worker1.txt"]


def test_metrics_gate(capsys):
    code, out, err = run_cli(["metrics", DEMO, "--min-efficiency", "0.0", "--json"], capsys)
    assert code == 0
    assert json.loads(out)["gate"]["failed"] == []
    code, out, err = run_cli(["metrics", DEMO, "--min-efficiency", "1.0", "--json"], capsys)
    assert code == 1
    failed = json.loads(out)["gate"]["failed"]
    assert len(failed) == 5
    assert all(f["metric"] == "efficiency" for f in failed)
    assert "gate failed" in err and "efficiency" in err


def test_inspect_lists_transfers_and_steps(capsys):
    code, out, _ = run_cli(["inspect", DEMO, "--json"], capsys)
    assert code == 0
    document = json.loads(out)
    (rank,) = document["ranks"]
    assert rank["iterations"] == [3, 4, 5, 6, 7]
    assert rank["ops_by_kind"]["recv"] == 14
    assert rank["ops_by_kind"]["send"] == 24
    assert all(t["observed_in"] == 5 for t in rank["transfers"])
    assert rank["transfer_bytes"] > 4_194_304 * 4


def test_convert_round_trip_keeps_the_figures(tmp_path, capsys):
    target = tmp_path / "demo.json"
    code, _, err = run_cli(["convert", DEMO, "-o", target], capsys)
    assert code == 0, err
    assert json.loads(target.read_text())["schema"] == "planner.trace/1"
    _, direct, _ = run_cli(["metrics", DEMO, "--json"], capsys)
    _, converted, _ = run_cli(["metrics", target, "--json"], capsys)
    a, b = json.loads(direct), json.loads(converted)
    for x, y in zip(a["steps"], b["steps"], strict=True):
        assert x["efficiency"] == pytest.approx(y["efficiency"], abs=1e-6)
        assert x["makespan"] == pytest.approx(y["makespan"], abs=1e-8)
    _, tac_direct, _ = run_cli(["schedule", DEMO, "--json"], capsys)
    _, tac_converted, _ = run_cli(["schedule", target, "--json"], capsys)
    order = [[t["name"] for t in r["transfers"]] for r in json.loads(tac_direct)["ranks"]]
    assert order == [
        [t["name"] for t in r["transfers"]] for r in json.loads(tac_converted)["ranks"]
    ]


def test_convert_of_a_gpu_trace_reads_back_with_the_same_figures(tmp_path, capsys):
    """The H100 CNN's steps are its device's; its CPU ops begin before them."""
    trace = REPO / "traces" / "torch" / "h100_cnn_windows"
    target = tmp_path / "h100.json"
    code, _, err = run_cli(["convert", trace, "-o", target], capsys)
    assert code == 0, err
    _, direct, _ = run_cli(["metrics", trace, "--json"], capsys)
    code, converted, err = run_cli(["metrics", target, "--json"], capsys)
    assert code == 0, err
    a, b = json.loads(direct), json.loads(converted)
    for x, y in zip(a["steps"], b["steps"], strict=True):
        assert x["makespan"] == pytest.approx(y["makespan"], abs=1e-8)
        assert x["busy_makespan"] == pytest.approx(y["busy_makespan"], abs=1e-8)


def test_convert_says_what_the_planner_trace_does_not_carry(tmp_path, capsys):
    """A TF job's replay joins the PS's work, which planner.trace/1 has no member for:
    `convert` says so, and so do `inspect` and `analyze` of the file it wrote."""
    target = tmp_path / "demo.json"
    code, _, err = run_cli(["convert", DEMO, "-o", target], capsys)
    err = " ".join(err.split())  # the note as one paragraph, wrapped to the terminal
    assert code == 0 and "does not carry the parameter server's work" in err
    assert "the executor's queue per op" in err
    code, out, _ = run_cli(["inspect", target, "--json"], capsys)
    assert code == 0 and any("does not carry" in n for n in json.loads(out)["notes"])
    code, out, _ = run_cli(["analyze", target, "-o", tmp_path / "out"], capsys)
    assert code == 0 and "does not carry" in " ".join(out.split())
    code, out, _ = run_cli(["metrics", target, "--json"], capsys)
    assert not any("queued" in s for s in json.loads(out)["steps"])
    # a timeline keeps nothing beside its ops and timings: nothing to say
    timeline = REPO / "traces" / "tf_timeline" / "CPU" / "timeline_03_merged_5_runs.json"
    code, _, err = run_cli(["convert", timeline, "-o", tmp_path / "t.json"], capsys)
    assert code == 0 and "does not carry" not in err


def _bad_inputs(tmp_path):
    demo = sorted(DEMO.glob("run_metadata_step*.pb"))[0].read_bytes()
    truncated = tmp_path / "run_metadata_step3.pb"
    truncated.write_bytes(demo[: len(demo) // 3])
    text = tmp_path / "notes.pb"
    text.write_text("these are not the bytes you are looking for\n" * 20)
    cycle = tmp_path / "cycle.pbtxt"
    cycle.write_text(
        'node { name: "a" op: "Add" input: "b" device: "/job:worker/task:0" }\n'
        'node { name: "b" op: "Add" input: "a" device: "/job:worker/task:0" }\n'
    )
    cycle_json = tmp_path / "cycle.json"
    cycle_json.write_text(
        json.dumps(
            {
                "schema": "planner.trace/1",
                "ranks": [
                    {
                        "rank": "r0",
                        "ops": [{"name": "a"}, {"name": "b"}],
                        "edges": [["a", "b"], ["b", "a"]],
                    }
                ],
            }
        )
    )
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    empty_file = tmp_path / "empty.pb"
    empty_file.write_bytes(b"")
    bad_gzip = tmp_path / "rank0.json.gz"
    bad_gzip.write_bytes(gzip.compress(b'{"traceEvents": []}' * 50)[:40])
    bad_json = tmp_path / "trace.json"
    bad_json.write_text('{"schema": "planner.trace/1", "ranks": [')
    return {
        "truncated protobuf": (truncated, "RunMetadata"),
        "text file": (text, "GraphDef"),
        "graph with a cycle": (cycle, "cycle"),
        "planner json with a cycle": (cycle_json, "cycle"),
        "empty directory": (empty_dir, "no trace files"),
        "empty file": (empty_file, "empty"),
        "truncated gzip": (bad_gzip, "gzip"),
        "invalid json": (bad_json, "invalid JSON"),
        "missing file": (tmp_path / "nope.pb", "no such file"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "truncated protobuf",
        "text file",
        "graph with a cycle",
        "planner json with a cycle",
        "empty directory",
        "empty file",
        "truncated gzip",
        "invalid json",
        "missing file",
    ],
)
@pytest.mark.parametrize("command", ["inspect", "schedule", "metrics", "analyze", "convert"])
def test_bad_input_exits_2_with_one_line(case, command, tmp_path, capsys):
    path, expected = _bad_inputs(tmp_path)[case]
    out_dir = tmp_path / "out"
    extra = ["-o", out_dir / "x.json"] if command in ("schedule", "convert") else []
    if command == "analyze":
        extra = ["-o", out_dir]
    code, out, err = run_cli([command, path, *extra], capsys)
    assert code == 2
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert str(path) in lines[0]
    assert expected.lower() in lines[0].lower()
    assert not out_dir.exists()


def test_usage_errors_exit_2_with_one_line(capsys):
    for args in (["schedule", DEMO, "--algorithm", "nope"], ["frobnicate"], ["metrics"]):
        code, out, err = run_cli(args, capsys)
        assert code == 2
        assert len(err.strip().splitlines()) == 1, err


def test_demo_trace_is_found_as_a_directory_of_run_metadata():
    from planner.ingest import demos

    demo = demos.demo_trace()
    assert demo.is_dir()
    assert len(list(demo.glob("run_metadata_step*.pb"))) == 5


def test_a_demo_name_also_names_the_files_in_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`demo-lab/network.csv` is the bundled demo's benchmark where the current folder
    has no `demo-lab`; a real path of that name wins, and other names stay as given."""
    from planner.ingest import demos

    monkeypatch.chdir(tmp_path)
    bundled = demos.named("demo-lab/network.csv")
    assert bundled == demos.demo_trace("demo-lab") / "network.csv" and bundled.is_file()
    assert demos.named("demo-lab") == demos.demo_trace("demo-lab")
    assert demos.named("elsewhere/network.csv") == Path("elsewhere/network.csv")
    (tmp_path / "demo-lab").mkdir()
    (tmp_path / "demo-lab" / "network.csv").write_text("nbytes,seconds\n")
    assert demos.named("demo-lab/network.csv") == Path("demo-lab/network.csv")
