"""The verdict as the files a CI job shows: a Markdown summary (a job page, a pull-request
comment) and a JUnit report (a test tab), written by ``planner analyze -o`` beside
report.json. Both open with the verdict's own text (`planner.job.verdict`), word for word
as the CLI's first line and the HTML headline, and hold the per-rank table whose figures
it cites: a plan's gain against the observed order (``vs obs``), its gain replayed as
enforced, the median replay error. The verdict is advice, not a gate: every testcase
passes (gate on figures with ``planner metrics --min-efficiency`` and its JUnit)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any

from planner.job.verdict import plan_label
from planner.reporting.markup import percent as _pct


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 1e3:,.1f}"


def _rows(verdict: Mapping[str, Any]) -> list[dict[str, str]]:
    """Per rank: the plan it would apply and the figures the verdict cites."""
    return [
        {
            "rank": str(r["rank"]),
            "plan": plan_label(r["plan"] or "none"),
            "observed": _ms(r["observed"]),
            "predicted": _ms(r["predicted"]),
            "vs obs": _pct(r["speedup"]),
            "replayed": _pct(r["replayed_gain"]),
            "replay error": _pct(r["replay_error"]),
            "worth applying": "yes" if r["apply"] else "no",
        }
        for r in verdict.get("ranks") or []
    ]


HEADERS = {
    "rank": "rank",
    "plan": "best plan",
    "observed": "observed order (ms)",
    "predicted": "best plan (ms)",
    "vs obs": "vs obs",
    "replayed": "replayed as enforced",
    "replay error": "replay error (median)",
    "worth applying": "worth applying",
}


def verdict_markdown(report: Mapping[str, Any]) -> str:
    """Markdown: the verdict's text as the first line, then the per-rank table."""
    verdict = report["verdict"]
    lines = [verdict["text"], ""]
    rows = _rows(verdict)
    if rows:
        lines.append("| " + " | ".join(HEADERS.values()) + " |")
        lines.append("|---|---|" + "---:|" * (len(HEADERS) - 3) + "---|")
        lines += ["| " + " | ".join(row[k] for k in HEADERS) + " |" for row in rows]
        lines.append("")
    lines += _sweep_lines(report.get("bucket_sweep") or {}, verdict["text"])
    lines.append(f"Details: report.html, report.json (planner {report.get('planner_version')}).")
    return "\n".join(lines) + "\n"


def _sweep_lines(sweep: Mapping[str, Any], text: str) -> list[str]:
    """The DDP bucket advice: its best cap against the traced buckets, with the gain the
    cap must beat (the figures the verdict's bucket sentence cites)."""
    lines = []
    if sweep.get("best_cap_mb") is not None:
        best = next(c for c in sweep["caps"] if c["bucket_cap_mb"] == sweep["best_cap_mb"])
        recommended = sweep.get("recommended_cap_mb")
        lines += [
            "| best cap (MB) | best cap (ms) | traced buckets (ms) | predicted gain "
            "| model's error | recommended |",
            "|---:|---:|---:|---:|---:|---|",
            f"| {sweep['best_cap_mb']:g} | {_ms(best['predicted_step_time'])} "
            f"| {_ms(sweep['observed_predicted_step_time'])} | {_pct(sweep['best_gain'])} "
            f"| {_pct(sweep.get('gain_margin'))} "
            f"| {'yes' if recommended is not None else 'no: keep the traced buckets'} |",
            "",
        ]
    if sweep.get("reason") and sweep["reason"] not in text:
        lines += [f"DDP bucket size: {sweep['reason']}.", ""]
    return lines


def verdict_junit(report: Mapping[str, Any]) -> str:
    """JUnit XML: one passing testcase per rank, the verdict's text as the suite's
    ``verdict`` property and output, each rank's figures as its case's properties."""
    verdict = report["verdict"]
    rows = _rows(verdict)
    root = ET.Element("testsuites", name="planner", tests=str(len(rows)), failures="0")
    suite = ET.SubElement(root, "testsuite", name="planner.verdict", tests=str(len(rows)),
                          failures="0", errors="0", skipped="0")  # fmt: skip
    properties = ET.SubElement(suite, "properties")
    for name in ("action", "plan", "bucket_cap_mb", "speedup", "replay_error", "text"):
        value = verdict.get(name)
        if value is not None:
            key = "verdict" if name == "text" else name
            ET.SubElement(properties, "property", name=key, value=str(value))
    for row in rows:
        case = ET.SubElement(suite, "testcase", classname=f"planner.verdict.{row['rank']}",
                             name=f"{row['rank']}: {row['plan']}")  # fmt: skip
        figures = ET.SubElement(case, "properties")
        for key, header in HEADERS.items():
            if key not in ("rank", "plan"):
                ET.SubElement(figures, "property", name=header, value=row[key])
    ET.SubElement(suite, "system-out").text = verdict["text"]
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
