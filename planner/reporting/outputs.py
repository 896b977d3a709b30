"""The files `planner analyze -o DIR` (and `planner.report(job, DIR)`) writes, rendered
from the `planner.report/1` document before any is written."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.export.files import dumps

if TYPE_CHECKING:
    from collections.abc import Mapping

    from planner.model.graph import OpGraph


TO_APPLY = ("bucket_plan", "control_deps")
"""Caramel's exports the training job applies: written as files only where the verdict
recommends the Caramel plan (a plan that does not pay is reported, not handed over)."""


def recommends(report: Mapping[str, Any], plan: str) -> bool:
    """Whether the report's verdict says to apply `plan` on some rank."""
    found = report.get("verdict") or {}
    return found.get("action") == "apply_plan" and any(
        r["apply"] and r["plan"] == plan for r in found.get("ranks") or []
    )


def analysis_files(
    report: dict[str, Any],
    graphs: Mapping[str, OpGraph],
    output: Path,
) -> dict[Path, str]:
    """Path -> text of every file: report.json and report.html, the verdict for CI
    (summary.md, junit.xml: `verdict_files`), the priority files of every plan,
    Caramel's exports where the verdict recommends its plan, and timeline.json (the
    traced step and the best plan's predicted schedule, per rank; `graphs`: rank -> its
    DAG, for the events' labels).

    Rank names come from the inputs: the file name part made of each
    (`planner.export.files.file_names`) is recorded in the report as ``file_names``.
    """
    from planner.export import priorities
    from planner.export.chrome_trace import chrome_trace
    from planner.export.files import file_names
    from planner.job.verdict import recommendation
    from planner.reporting.html import render_html
    from planner.reporting.verdict_files import verdict_junit, verdict_markdown

    ranks = [entry["rank"] for doc in report["plans"].values() for entry in doc["ranks"]]
    parts = file_names(ranks)
    report["file_names"] = {"ranks": parts}
    files = {output / "report.json": dumps(report)}
    if report.get("verdict"):  # the verdict for a CI job's page and its test tab
        files[output / "summary.md"] = verdict_markdown(report)
        files[output / "junit.xml"] = verdict_junit(report)
    for name, document in report["plans"].items():
        files[output / f"priorities_{name}.json"] = dumps(document)
        if name in ("tic", "tac"):
            for entry in document["ranks"]:
                text = priorities.to_tictac(document, entry["rank"])
                files[output / f"{parts[entry['rank']]}.{name}.txt"] = text
    for name, document in report["exports"].items():
        if name in TO_APPLY and not recommends(report, "caramel"):
            continue  # reported in report.json, not written as a plan to apply
        files[output / f"{name}.json"] = dumps(document)
    simulation = report["simulation"]
    if simulation is not None and simulation.get("timelines"):
        # the fastest plan of each rank, never the random-order baseline (see the report)
        best = {r["rank"]: recommendation(r)["plan"] for r in simulation["comparison"]["ranks"]}
        chosen = [
            {**s, "graph": graphs[s["rank"]]}
            for s in simulation["timelines"]
            if s["plan"] in ("measured", best.get(s["rank"]))
        ]
        meta = {"planner": "analyze", "best_plan": best}
        files[output / "timeline.json"] = dumps(chrome_trace(chosen, meta))
    names = sorted({path.name for path in files} | {"report.html"})
    files[output / "report.html"] = render_html(report, files=names)
    return files
