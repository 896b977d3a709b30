"""HTML report on real TF and PyTorch traces, and the CI outputs (JUnit XML, Markdown)."""

from __future__ import annotations

import html
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from planner.ingest import detect
from planner.job import analysis, shown_ranks
from planner.job.verdict import with_verdict
from planner.prediction import simulate as sim
from planner.reporting import Thresholds, failures, junit_xml, markdown_summary, render_html
from planner.reporting.ci import unchecked
from planner.reporting.markup import MAX_ROWS, NOT_AVAILABLE, seconds
from planner.reporting.measured_sections import summary_section
from planner.reporting.svg import layout_of
from tests.conftest import DEMO, REPO, SHARED, need, run_cli

TORCH = REPO / "traces" / "torch" / "resnet_ddp"
TF_CNN = SHARED / "generated" / "tf" / "cnn_ps_ingraph"


@pytest.fixture(scope="module")
def torch_report() -> dict[str, Any]:
    return analysis.analyze(detect.load([need(TORCH)]))


@pytest.fixture(scope="module")
def demo_job():  # noqa: ANN201
    return detect.load([DEMO])


def _sections(page: str) -> dict[str, str]:
    return dict(re.findall(r'<section id="([a-z-]+)">(.*?)</section>', page, flags=re.S))


def test_report_command_on_tf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_cli(["analyze", need(TF_CNN), "-o", tmp_path], capsys)
    assert code == 0, err
    code, _, err = run_cli(["report", tmp_path], capsys)
    assert code == 0, err
    page = (tmp_path / "report.html").read_text()
    # self-contained: nothing to fetch (SVG namespace URIs are names, not loads)
    assert "<script" not in page and "<link" not in page and "@import" not in page
    assert not re.search(r'(src|href)="(https?:)?//', page)
    sections = _sections(page)
    _check_charts(page)
    assert "tensorflow" in sections["summary"] and "worker1" in sections["summary"]
    assert sections["efficiency"].count("<svg") == 1 and "worker0" in sections["efficiency"]
    # the executor's queue, a TF step's wait for a core or a thread, beside its span
    assert "<th>queued</th>" in sections["steps"] and "waited in TensorFlow" in sections["steps"]
    # a PS job has no all-reduce windows: left out with one line saying why
    assert "windows" not in sections and NOT_AVAILABLE not in page
    assert "Transfer windows per parameter: needs all-reduce" in sections["left-out"]
    assert sections["timeline"].count("<svg") == 4 and "worker1: traced step" in page
    assert "Replay error" in sections["comparison"]
    assert "could not be drawn" not in page
    assert "priorities_tac.json" in sections["files"] and "worker1.tac.txt" in sections["files"]
    assert not list(tmp_path.glob(".report.html*")), "temp file left behind"


def test_report_of_a_gpu_trace_without_transfers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One MI210 rank, kernels only (no collective, no transfer): every drawn chart is
    whole, E (of transfer orders) is left out saying why, and no card averages a None."""
    source = need(SHARED / "public" / "external" / "tracelens_mi210_gpu_only")
    code, _, err = run_cli(["analyze", source, "-o", tmp_path], capsys)
    assert code == 0, err
    page = (tmp_path / "report.html").read_text()
    assert "could not be drawn" not in page
    sections = _sections(page)
    assert "efficiency" not in sections and "E does not apply" in sections["left-out"]
    assert "mean efficiency E" not in sections["summary"]
    _check_charts(page)


def test_report_on_pytorch_with_simulation(torch_report: dict[str, Any]) -> None:
    job = detect.load([need(TORCH)])
    report = dict(torch_report)
    report["simulation"] = sim.simulation(job, {}, samples=3, timelines=True)
    report = with_verdict(report)
    page = render_html(report, files=["report.json"])
    sections = _sections(page)
    assert "could not be drawn" not in page
    assert "pytorch" in sections["summary"]
    assert "compute C" in sections["steps"] and sections["steps"].count("<svg") == 1
    # no plan was simulated: the traced step of each rank, never the random baseline
    assert sections["timeline"].count("<svg") == 2 and "baseline" not in sections["timeline"]
    assert "rank1: traced step" in sections["timeline"]
    assert "Replay error" in sections["comparison"] and "baseline" in sections["comparison"]
    assert "bucket" in sections["windows"] and "Before:" in sections["windows"]
    assert "Caramel plan" in sections["windows"]
    assert "rank0" in sections["stragglers"]
    # never a random baseline as the advice; no negative time anywhere
    assert "baseline" not in sections["advice"] and "Keep what you have" in page
    assert not re.search(r"-[\d.,]+ ms", page)  # signed percentages are fine


def test_a_malformed_section_says_so_and_the_others_are_drawn(
    torch_report: dict[str, Any],
) -> None:
    job = detect.load([need(TORCH)])
    report = {**torch_report, "simulation": sim.simulation(job, {}, samples=3, timelines=True)}
    report["metrics"] = {"ranks": 5, "steps": 5}  # malformed: sections that cannot be drawn
    one = render_html(report, files=["report.json"])
    assert "could not be drawn" in _sections(one)["steps"]
    assert "left-out" in _sections(one) and _sections(one)["timeline"].count("<svg") == 2


def test_a_long_timeline_stays_small(torch_report: dict[str, Any]) -> None:
    """A timeline's spans that meet on screen are one path command: the real traced step
    (605 ops) repeated 165 times in the same length (99,825 ops) draws in a size bounded
    by the chart's width, not by its op count, on the same time axis."""
    from planner.reporting import plots

    real = next(
        s["timeline"] for s in torch_report["simulation"]["timelines"] if s["plan"] == "measured"
    )
    end = max(s + d for s, d in zip(real["start"], real["duration"], strict=True))
    copies = 165
    many: dict[str, list[Any]] = {k: [] for k in real}
    for c in range(copies):
        for key, values in real.items():
            if key == "start":
                values = [(c * end + v) / copies for v in values]
            elif key == "duration":
                values = [v / copies for v in values]
            many[key] += values
    assert len(many["op"]) == 605 * copies
    small, big = plots.gantt(real), plots.gantt(many)
    assert len(big) < 3 * len(small) + 60_000, (len(small), len(big))
    assert layout_of(big)["xlim"] == layout_of(small)["xlim"]


def test_report_degrades_without_metrics() -> None:
    job = detect.load([DEMO])
    report = analysis.analyze(job)
    report["metrics"] = None
    report["simulation"] = None
    page = render_html(with_verdict(report))
    sections = _sections(page)
    left_out = ("steps", "efficiency", "timeline", "comparison", "replay", "stragglers", "buckets")
    for key in left_out:
        assert key not in sections, key
    assert sections["left-out"].count("<li>") == 8  # the 7, and the transfer windows
    assert "Apply the TIC" in sections["advice"] and "no gain can be predicted" in page
    with pytest.raises(ValueError):
        render_html({"schema": "planner.metrics/1"})


def test_report_rejects_a_dir_without_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli(["report", tmp_path], capsys)
    assert code == 2 and "report.json" in err
    (tmp_path / "report.json").write_text(json.dumps({"schema": "planner.metrics/1"}))
    code, _, err = run_cli(["report", tmp_path], capsys)
    assert code == 2 and "not a planner report" in err
    assert not (tmp_path / "report.html").exists()


def test_junit_on_allreduce_metrics(torch_report: dict[str, Any]) -> None:
    metrics = torch_report["metrics"]
    steps = metrics["steps"]
    worst = min(s["efficiency"] for s in steps)
    gate = Thresholds(min_efficiency=worst + 1e-9, min_utilization=0.0)
    root = ET.fromstring(junit_xml(metrics, gate))
    cases = root.findall("./testsuite/testcase")
    assert len(cases) == len(steps) == int(root.get("tests"))
    failing = [c for c in cases if c.find("failure") is not None]
    assert len(failing) == 1 == int(root.get("failures"))
    assert "efficiency" in failing[0].find("failure").get("message")
    assert {c.get("classname") for c in cases} == {"planner.metrics.rank0", "planner.metrics.rank1"}
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["min_utilization"] == "0"

    # stragglers: only the slowest rank of a step over the limit fails
    stragglers = metrics["allreduce"]["stragglers"]
    worst_step = max(stragglers, key=lambda s: s["straggler_time"])
    failed = failures(metrics, Thresholds(max_straggler=worst_step["straggler_time"] - 1e-9))
    assert [(f.rank, f.iteration, f.metric) for f in failed] == [
        (worst_step["slowest_rank"], worst_step["iteration"], "straggler_time")
    ]
    assert failures(metrics, Thresholds(min_efficiency=0.0, max_straggler=1e9)) == []


def test_ci_outputs_on_ps_metrics(demo_job) -> None:  # noqa: ANN001
    metrics = analysis.metrics(demo_job)
    gate = Thresholds(min_efficiency=0.99, min_utilization=0.5)
    assert unchecked(metrics, gate) == ["min_utilization"]
    markdown = markdown_summary(metrics, gate)
    assert markdown.startswith("### planner metrics: FAIL")
    rows = [line for line in markdown.splitlines() if line.startswith("| worker0 |")]
    assert len(rows) == len(metrics["steps"]) + 1  # steps, then the per-rank summary
    assert all("fail: efficiency" in r for r in rows[:-1])
    assert "`min-utilization`: not available" in markdown
    passing = markdown_summary(metrics, Thresholds(min_efficiency=0.0))
    assert passing.startswith("### planner metrics: PASS") and "| fail:" not in passing
    assert "0 failing" in passing
    root = ET.fromstring(junit_xml(metrics, gate))
    assert int(root.get("failures")) == len(metrics["steps"])
    assert "min_utilization: not available" in root.find(".//system-out").text


def test_a_report_of_many_ranks_plots_the_timeline_ranks_and_tables_every_rank(
    torch_report: dict[str, Any],
) -> None:
    """Above `shown_ranks.TIMELINE_RANKS` ranks the per-step plots draw the slowest, the
    fastest and the most often last rank (a plot of 1,000 ranks is unreadable and took
    seconds); the tables still hold every rank's rows. The real 2-rank job's rows, copied to 20
    ranks whose mean makespans grow with the rank number."""
    metrics = torch_report["metrics"]
    world = shown_ranks.TIMELINE_RANKS + 4

    def copies(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for k in range(world):
            for row in rows:
                if row["rank"] == f"rank{k % 2}":
                    out.append({**row, "rank": f"rank{k}"})
        return out

    ranks = copies(metrics["ranks"])
    for k, row in enumerate(ranks):
        row["makespan_mean"] = metrics["ranks"][k % 2]["makespan_mean"] * (1 + k / 100)
    allreduce = {**metrics["allreduce"], "steps": copies(metrics["allreduce"]["steps"])}
    many = {**metrics, "steps": copies(metrics["steps"]), "ranks": ranks, "allreduce": allreduce}
    sections = _sections(render_html({**torch_report, "metrics": many}, files=["report.json"]))
    shown = shown_ranks.timeline_ranks([f"rank{k}" for k in range(world)], many)
    last = f"rank{world - 1}"
    assert {"rank0", last} <= shown and len(shown) <= 3
    for name in ("steps", "efficiency"):
        plot, rest = sections[name].split("</figure>", 1)
        assert f"Drawn for {len(shown)} of {world} ranks" in plot
        drawn = set(re.findall(r"rank\d+", plot.split("<figcaption>")[0]))
        assert drawn == shown, name  # the svg names the drawn ranks only
        table = rest.split("</table>")[0]
        rows = len(copies(metrics["steps"]))
        assert table.count("<tr>") - 1 == min(rows, MAX_ROWS), name  # every rank's rows


def test_the_advice_follows_the_replay_of_each_plan() -> None:
    """The demo's TF worker: the comparison (mean op times, no waits) credits TIC with
    about 10%, but TIC replayed on the five traced steps (their op times and waits, the
    model whose error the page gives) as `planner export --enforce arrival` applies it
    loses. The page recommends nothing and says why; with the replay's figures taken
    away it would recommend TIC."""
    job = detect.load([DEMO])
    report = analysis.analyze(job)
    entry = report["simulation"]["comparison"]["ranks"][0]
    plans = {p["plan"]: p for p in entry["plans"]}
    assert plans["tic"]["speedup_vs_observed"] > 0.05
    assert plans["tic"]["replayed"]["gain"] < -0.005
    advice = _sections(render_html(report))["advice"]
    assert "Keep what you have" in advice and "replayed on the traced steps" in advice
    assert "--enforce arrival" in advice and "costs more than the order gains" in advice
    caution = plans["tic"]["replayed"]["caution"]
    assert "not one" in caution and "a gain smaller than that is not one" in render_html(report)
    # the plan's chart says whose schedule it draws and what the replay gives the plan
    timeline = html.unescape(_sections(render_html(report))["timeline"])  # its heading
    assert "the comparison's schedule" in timeline and "replayed on the traced steps" in timeline
    for p in entry["plans"]:
        p["replayed"] = None
    assert "Apply TIC" in _sections(render_html(with_verdict(report)))["advice"]


# ------------------------------------------------------------------ the charts, read from the SVGs


def _charts(section: str) -> list[dict[str, Any]]:
    """Each chart of a section: what its ``<svg>`` says it drew (``data-chart``: kind, axis
    limits and scales, boxes of legend, labels and ticks as laid out), its axis labels and
    legend as the SVG holds them (ids ``xlabel``, ``ylabel``, ``legend``), its x tick
    labels, every text it shows, and the page's heading above it."""
    charts = []
    for match in re.finditer(r"<svg data-chart='([^']*)'(.*?)</svg>", section, re.S):
        record, body = match.groups()
        chart = json.loads(record)
        above = re.findall(r"<h[23]>([^<]*)</h[23]>", section[: match.start()])
        chart["heading"] = html.unescape(above[-1]) if above else None
        texts = [html.unescape(t) for t in re.findall(r"<text\b[^>]*>([^<]*)</text>", body)]
        label = r'<g id="{}">\s*<text\b[^>]*>([^<]*)</text>'
        chart["texts"] = [t for t in texts if t.strip()]
        chart["xlabel"], chart["ylabel"] = (
            html.unescape(m.group(1)) if (m := re.search(label.format(k), body)) else None
            for k in ("xlabel", "ylabel")
        )
        chart["has_legend"] = '<g id="legend">' in body
        chart["xticks"] = re.findall(
            r'<g id="xtick_\d+">.*?<text\b[^>]*>([^<]*)</text>', body, re.S
        )
        charts.append(chart)
    assert len(charts) == section.count("<svg"), "a chart without its data-chart record"
    return charts


def _overlap(a: list[float], b: list[float]) -> bool:
    """Whether two [left, top, right, bottom] boxes share any area."""
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _text(page: str) -> str:
    """The page's text as a reader sees it: no figures or styles, inline tags joined."""
    page = re.sub(r"<(svg|style)\b.*?</\1>", " ", page, flags=re.S)
    page = re.sub(r"</?(b|code|span|a|i|em|strong)\b[^>]*>", "", page)
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", page)))


def _check_charts(page: str) -> dict[str, list[dict[str, Any]]]:
    """What every chart of a page must hold (issue 46, point 7); the charts per section."""
    sections = _sections(page)
    charts = {key: _charts(body) for key, body in sections.items()}
    for key, drawn in charts.items():
        for chart in drawn:
            where = (key, chart["kind"])
            # both axes labelled, as drawn text, and the label's box recorded
            assert chart["xlabel"] and chart["ylabel"], where
            assert {"xlabel", "ylabel", "axes"} <= set(chart["boxes"]), where
            # the legend (drawn above the plot) covers no label, tick or data
            boxes = chart["boxes"]
            assert chart["has_legend"] == ("legend" in boxes), where
            if chart["has_legend"]:
                for other in ("xlabel", "ylabel", "xticks", "yticks", "axes"):
                    if other in boxes:
                        assert not _overlap(boxes["legend"], boxes[other]), (where, other)
            for label, ticks in (("xlabel", "xticks"), ("ylabel", "yticks")):
                assert not _overlap(boxes[label], boxes.get(ticks, [0, 0, 0, 0])), where
            # the value axis starts at 0: a bar or line chart's y, a time axis's x
            if chart["kind"] in ("bar", "line"):
                assert chart["ylim"][0] == 0, where
            else:
                assert chart["xlim"][0] == 0, where
            # the page's heading names the chart: the chart has no title to repeat it
            assert chart["heading"] and chart["heading"] not in chart["texts"], where
            assert "title" not in boxes, where
    return charts


def test_charts_are_labelled_and_compared_charts_share_their_axis(
    torch_report: dict[str, Any],
) -> None:
    """The DDP run (2 ranks, per-bucket windows, a Caramel plan, a bucket sweep traced
    with bucket_cap_mb unset): every chart labelled, no legend over a label, values from
    0, titles only in the page, Before/After windows on one origin and one x range."""
    page = render_html(torch_report, files=["report.json"])
    charts = _check_charts(page)
    sections = _sections(page)
    assert charts["steps"][0]["xlabel"] == "rank and step"  # the iteration chart's x label
    before, after = charts["windows"]
    # one origin (the step start; Caramel's backward-pass times moved by its forward
    # pass) and one x range, so that the charts compare
    assert before["xlabel"] == after["xlabel"] == "ms from the step start"
    assert before["xlim"] == after["xlim"] and before["xlim"][1] > 0
    assert before["boxes"]["axes"][::2] == after["boxes"]["axes"][::2]  # one above the other
    forward = torch_report["plans"]["caramel"]["ranks"][0]["inputs"]["forward_time"]
    assert f"after the {seconds(forward)} of its forward pass" in sections["windows"]
    timelines = charts["timeline"]
    assert len(timelines) >= 2 and len({tuple(c["xlim"]) for c in timelines}) == 1
    # the bucket sweep: plain MB ticks on its log axis, from 0 ms, the CLI's unset row
    sweep = torch_report["bucket_sweep"]
    (chart,) = charts["buckets"]
    assert chart["xscale"] == "log" and chart["ylim"][0] == 0
    assert chart["xticks"] == [f"{c['bucket_cap_mb']:g}" for c in sweep["caps"]]
    unset = sweep["default_configuration"]
    row = re.search(r"<tr><td[^>]*>25 \(unset\)</td>(.*?)</tr>", sections["buckets"])
    assert row and seconds(unset["predicted_step_time"]) in row.group(1)
    # the text reads as sentences: none opens with a parenthesis
    text = _text(page)
    assert not re.search(r"(^|[.!?:] )\)", text), re.search(r".{40}[.!?:] \).{20}", text)
    assert not re.search(r">\s*\)", re.sub(r"<svg\b.*?</svg>", "", page, flags=re.S))


def test_counts_agree_with_their_nouns(demo_job) -> None:  # noqa: ANN001
    """The demo (one rank, one worker): "1 rank" on its card, "1 note" for one note."""
    report = analysis.analyze(demo_job)
    page = render_html(report)
    _check_charts(page)
    summary = _sections(page)["summary"]
    assert "<b>1</b><span>rank</span>" in summary
    report["inspect"] = {**report["inspect"], "notes": ["the one note from ingest"]}
    summary = summary_section(report)
    assert "1 note from ingest" in summary and "1 notes" not in summary
    text = _text(page)
    assert not re.search(r"(?<![\d.,])1 (ranks|notes|files|transfers|rows|steps)\b", text)
