"""One verdict, the same in every output (issue #46): the CLI's first line, report.json's
``verdict``, the HTML headline, the summary card and the CI files (summary.md, junit.xml)
say the same thing, on a TF
parameter-server trace and a DDP trace, and every figure the verdict cites appears in a
table of the same output."""

from __future__ import annotations

import html
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import DEMO, RESNET_IN_REPO, TF_RUNS, need, run_cli

FIGURE = re.compile(r"[+-]?\d+(?:\.\d+)?%")


@pytest.mark.parametrize("trace", [DEMO, RESNET_IN_REPO], ids=["tf_demo", "ddp_resnet"])
def test_every_output_says_the_same_verdict(
    trace: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, text, err = run_cli(["analyze", trace, "-o", tmp_path / "out"], capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    found = report["verdict"]
    assert found["schema"] == "planner.verdict/1" and found["text"]
    first, rest = text.split("\n\n", 1)  # a paragraph of its own, wrapped to the terminal
    assert " ".join(first.split()) == found["text"]
    page = (tmp_path / "out" / "report.html").read_text()
    headlines = re.findall(r'<p class="headline">(.*?)</p>', page)
    assert [html.unescape(h) for h in headlines] == [found["text"]]
    code, out, err = run_cli(["analyze", trace, "--json"], capsys)
    assert code == 0 and json.loads(out)["verdict"] == found
    body = page.replace(headlines[0], "")
    # the CI files: summary.md opens with it, junit.xml carries it
    summary = (tmp_path / "out" / "summary.md").read_text()
    first_md, table = summary.split("\n", 1)
    assert first_md == found["text"]
    suite = ET.parse(tmp_path / "out" / "junit.xml").getroot().find("testsuite")
    assert suite is not None and suite.findtext("system-out") == found["text"]
    props = {p.get("name"): p.get("value") for p in suite.findall("properties/property")}
    assert props["verdict"] == found["text"] and props["action"] == found["action"]
    cases = suite.findall("testcase")
    assert [c.get("name").split(":")[0] for c in cases] == [r["rank"] for r in found["ranks"]]
    for figure in FIGURE.findall(found["text"]):
        assert figure in rest, f"{figure} is in no table of the CLI output"
        assert figure in body, f"{figure} is in no table of the HTML report"
        assert figure in table, f"{figure} is in no table of summary.md"


def test_the_demo_verdict_names_why_it_keeps_the_observed_order(tmp_path: Path) -> None:
    """The bundled demo: the CLI's plan table credits TIC with a gain in the comparison
    and a loss replayed as enforced; the verdict is to keep, citing the replayed loss,
    not a figure no table shows."""
    import planner

    document = planner.report(planner.load([DEMO]), tmp_path / "out")
    found = document.to_dict()["verdict"]
    assert found["action"] == "keep"
    assert "costs more than it gains" in found["text"]


def test_caramel_files_are_written_only_where_the_verdict_recommends_them(
    tmp_path: Path,
) -> None:
    """Issue #44 point 3: on the DDP run the verdict keeps DDP's order, so Caramel's
    bucket plan and control deps stay in report.json, not written as a plan to apply;
    the same report with a verdict that recommends Caramel writes them."""
    from planner.ingest import detect
    from planner.job import analysis
    from planner.reporting.outputs import analysis_files

    job = detect.load([RESNET_IN_REPO])
    report = analysis.analyze(job, samples=5)
    assert report["verdict"]["action"] != "apply_plan"
    assert set(report["exports"]) == {"bucket_plan", "control_deps"}
    names = {p.name for p in analysis_files(report, job.graphs, tmp_path / "keep")}
    assert "bucket_plan.json" not in names and "control_deps.json" not in names
    assert "priorities_caramel.json" in names
    pick = {**report["verdict"]["ranks"][0], "apply": True, "plan": "caramel"}
    recommended = {**report, "verdict": {**report["verdict"], "action": "apply_plan",
                                         "ranks": [pick]}}  # fmt: skip
    names = {p.name for p in analysis_files(recommended, job.graphs, tmp_path / "apply")}
    assert {"bucket_plan.json", "control_deps.json"} <= names


def test_a_plan_that_slows_the_job_on_a_shaped_link_is_not_applied() -> None:
    """On the lab's mlp trace (1500 Mbit/s, no foreign load) TIC replayed as enforced by
    arrival is slower on both workers; measured in the same lab run, TIC enforced by
    arrival made the step 0.4% slower [-0.2%, +1.0%] and TAC 1.0% [+0.3%, +1.5%]
    (bench/lab/results/tf-grid/mlp). The replay prices each chained read at the reads'
    rate and its worker's part of the link (docs/algorithms.md); before, worker1 was
    credited with +11.7%."""
    from planner.ingest import detect
    from planner.job import analysis

    run = Path(__file__).resolve().parents[1] / "traces" / "tf" / "lab_mlp_1500mbit"
    report = analysis.analyze(detect.load([run]), samples=20)
    ranks = {r["rank"]: r for r in report["verdict"]["ranks"]}
    assert ranks["worker1"]["plan"] == ranks["worker0"]["plan"] == "tic"
    assert -0.03 < ranks["worker1"]["replayed_gain"] < 0.0  # measured -0.4%
    assert -0.10 < ranks["worker0"]["replayed_gain"] < -0.03
    assert not any(r["apply"] for r in ranks.values())
    assert report["verdict"]["action"] == "keep" and report["verdict"]["files"] == []
    assert "enforcing its order costs more than it gains" in report["verdict"]["text"]


def test_a_plan_that_slows_one_worker_is_not_applied() -> None:
    """The generated cnn job (unshaped loopback): TIC replayed as enforced gains on
    worker1 and loses on worker0. Every worker waits for the slowest each step, so the
    verdict keeps the observed order (enforced runs of this job measured 1.01-1.87x the
    step, docs/algorithms.md "A plan replayed as it is enforced")."""
    from planner.ingest import detect
    from planner.job import analysis

    job = detect.load([need(p) for p in TF_RUNS["cnn_ps_ingraph"]])
    report = analysis.analyze(job, samples=20)
    ranks = {r["rank"]: r for r in report["verdict"]["ranks"]}
    assert ranks["worker1"]["plan"] == ranks["worker0"]["plan"] == "tic"
    assert ranks["worker1"]["replayed_gain"] > 0.0 > -0.05 > ranks["worker0"]["replayed_gain"]
    assert not any(r["apply"] for r in ranks.values())
    assert report["verdict"]["action"] == "keep" and report["verdict"]["files"] == []
    assert "slows one slows the job" in report["verdict"]["text"]
