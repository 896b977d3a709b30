"""CI outputs of `planner metrics`: JUnit XML and a Markdown summary, from the metrics document.

One test case per step and rank. A case fails when its scheduling efficiency E is below
``min_efficiency``, its all-reduce utilization below ``min_utilization``, or when the
rank is the slowest of a step whose straggler time exceeds ``max_straggler`` (seconds;
shown in ms, the unit `planner metrics --max-straggler` takes).
A step whose E does not apply (a rank without transfers) is a skipped case, never a
pass or a failure. A threshold that the input has no figure for (utilization or
stragglers of a parameter server job) checks nothing and is listed by `unchecked`, so
a caller can warn about it.
All functions are pure: document + thresholds -> value.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Thresholds:
    """Gates of a CI run; None = not checked."""

    min_efficiency: float | None = None
    max_straggler: float | None = None
    min_utilization: float | None = None

    def given(self) -> dict[str, float]:
        """The thresholds that are set, by option name (``min_efficiency``, ...)."""
        return {k: v for k, v in vars(self).items() if v is not None}


@dataclass(frozen=True)
class Failure:
    """One gate a step of a rank failed: `metric` is ``efficiency``, ``utilization`` or
    ``straggler_time``; `limit` the threshold it crossed."""

    rank: str
    iteration: int
    metric: str
    value: float
    limit: float

    def message(self) -> str:
        """One line naming the figure and the gate, e.g. ``efficiency 0.412 < 0.9`` or
        ``straggler_time 12.3 ms > 5 ms`` (times in ms, as `--max-straggler` takes them)."""
        if self.metric == "straggler_time":
            return f"{self.metric} {self.value * 1e3:.4g} ms > {self.limit * 1e3:g} ms"
        return f"{self.metric} {self.value:.4g} < {self.limit:g}"


@dataclass(frozen=True)
class StepCase:
    """The figures of one step of one rank that the gates look at."""

    rank: str
    iteration: int
    makespan: float
    efficiency: float | None
    speedup_bound: float | None
    utilization: float | None
    straggler_time: float | None
    slowest: bool
    failures: tuple[Failure, ...]
    skipped: str | None = None  # why a given gate checked nothing on this step


def _utilization(document: Mapping[str, Any]) -> dict[tuple[str, int], float]:
    steps = (document.get("allreduce") or {}).get("steps") or []
    return {(s["rank"], int(s["iteration"])): s["utilization"] for s in steps}


def _stragglers(document: Mapping[str, Any]) -> dict[int, Mapping[str, Any]]:
    rows = (document.get("allreduce") or {}).get("stragglers") or []
    return {int(s["iteration"]): s for s in rows}


def cases(document: Mapping[str, Any], thresholds: Thresholds) -> list[StepCase]:
    """Every step of every rank with its figures and the gates it failed."""
    utilization = _utilization(document)
    stragglers = _stragglers(document)
    out = []
    for s in document.get("steps") or []:
        rank, iteration = s["rank"], int(s["iteration"])
        util = utilization.get((rank, iteration))
        straggler = stragglers.get(iteration)
        straggler_time = straggler["straggler_time"] if straggler else None
        slowest = bool(straggler) and straggler.get("slowest_rank") == rank
        failed = []
        t = thresholds
        efficiency = s["efficiency"]
        skipped = None
        if s.get("partial"):
            out.append(
                StepCase(
                    rank=rank, iteration=iteration, makespan=s.get("makespan", 0.0),
                    efficiency=efficiency,
                    speedup_bound=s.get("speedup_bound"), utilization=util,
                    straggler_time=straggler_time, slowest=slowest, failures=(),
                    skipped="partial step (records missing): not gated",
                )
            )  # fmt: skip
            continue
        if t.min_efficiency is not None and efficiency is None:
            skipped = "efficiency E does not apply (no transfers): min-efficiency not checked"
        elif t.min_efficiency is not None and efficiency < t.min_efficiency:
            failed.append(Failure(rank, iteration, "efficiency", efficiency, t.min_efficiency))
        if t.min_utilization is not None and util is not None and util < t.min_utilization:
            failed.append(Failure(rank, iteration, "utilization", util, t.min_utilization))
        if (
            t.max_straggler is not None
            and slowest
            and straggler_time is not None
            and straggler_time > t.max_straggler
        ):
            failed.append(
                Failure(rank, iteration, "straggler_time", straggler_time, t.max_straggler)
            )
        out.append(
            StepCase(
                rank=rank,
                iteration=iteration,
                makespan=s.get("makespan", 0.0),
                efficiency=efficiency,
                speedup_bound=s.get("speedup_bound"),
                utilization=util,
                straggler_time=straggler_time,
                slowest=slowest,
                failures=tuple(failed),
                skipped=skipped if not failed else None,
            )
        )
    return out


def failures(document: Mapping[str, Any], thresholds: Thresholds) -> list[Failure]:
    """All failed gates, in step order; empty when every step passes (exit status 0)."""
    return [f for c in cases(document, thresholds) for f in c.failures]


def unchecked(document: Mapping[str, Any], thresholds: Thresholds) -> list[str]:
    """Names of the given thresholds the document has no figures for (they check nothing)."""
    out = []
    steps = document.get("steps") or []
    if thresholds.min_efficiency is not None and all(s["efficiency"] is None for s in steps):
        out.append("min_efficiency")
    if thresholds.min_utilization is not None and not _utilization(document):
        out.append("min_utilization")
    if thresholds.max_straggler is not None and not _stragglers(document):
        out.append("max_straggler")
    return out


def _fmt(value: float | None, digits: int = 4) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    return f"{value:.{digits}g}"


def junit_xml(
    document: Mapping[str, Any], thresholds: Thresholds, suite: str = "planner.metrics"
) -> str:
    """JUnit XML: one ``testcase`` per step and rank (``classname`` = suite.rank, ``name`` =
    ``step N``), with a ``failure`` naming every gate it failed; thresholds as properties."""
    all_cases = cases(document, thresholds)
    n_failed = sum(1 for c in all_cases if c.failures)
    n_skipped = sum(1 for c in all_cases if c.skipped)
    total_time = sum(c.makespan for c in all_cases)
    root = ET.Element(
        "testsuites",
        name="planner",
        tests=str(len(all_cases)),
        failures=str(n_failed),
        errors="0",
        time=f"{total_time:.6f}",
    )
    testsuite = ET.SubElement(
        root,
        "testsuite",
        name=suite,
        tests=str(len(all_cases)),
        failures=str(n_failed),
        errors="0",
        skipped=str(n_skipped),
        time=f"{total_time:.6f}",
    )
    properties = ET.SubElement(testsuite, "properties")
    ET.SubElement(properties, "property", name="schema", value=str(document.get("schema", "")))
    ET.SubElement(
        properties, "property", name="framework", value=str(document.get("framework", ""))
    )
    for name, value in thresholds.given().items():
        ET.SubElement(properties, "property", name=name, value=f"{value:g}")
    missing = unchecked(document, thresholds)
    for c in all_cases:
        case = ET.SubElement(
            testsuite,
            "testcase",
            classname=f"{suite}.{c.rank}",
            name=f"step {c.iteration}",
            time=f"{c.makespan:.6f}",
        )
        if c.failures:
            failure = ET.SubElement(
                case,
                "failure",
                type=",".join(f.metric for f in c.failures),
                message="; ".join(f.message() for f in c.failures),
            )
            failure.text = "\n".join(
                f"{c.rank} step {c.iteration}: {f.message()}" for f in c.failures
            )
        elif c.skipped:
            ET.SubElement(case, "skipped", message=c.skipped)
        out = [
            f"efficiency={_fmt(c.efficiency)}",
            f"speedup_bound={_fmt(c.speedup_bound)}",
            f"utilization={_fmt(c.utilization)}",
            f"straggler_time_ms={_fmt(_ms(c.straggler_time))}",
        ]
        out += [f"{name}: not available for this input" for name in missing]
        ET.SubElement(case, "system-out").text = "\n".join(out)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def _gate_text(name: str, value: float) -> str:
    """A gate as the option takes it: `--max-straggler` in ms."""
    return f"{value * 1e3:g}ms" if name == "max_straggler" else f"{value:g}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_summary(document: Mapping[str, Any], thresholds: Thresholds) -> str:
    """A Markdown summary for a CI job page: verdict line, gates, and a table per step/rank."""
    all_cases = cases(document, thresholds)
    failed = [c for c in all_cases if c.failures]
    gates = thresholds.given()
    verdict = "FAIL" if failed else "PASS"
    if not failed and gates and all(c.skipped for c in all_cases):
        verdict = "NOT CHECKED"
    lines = [
        f"### planner metrics: {verdict}",
        "",
        f"{len(all_cases)} step{'' if len(all_cases) == 1 else 's'} checked "
        f"({document.get('framework', '?')}), "
        f"{len(failed)} failing.",
        "",
    ]
    if gates:
        shown = ", ".join(f"`{k.replace('_', '-')} {_gate_text(k, v)}`" for k, v in gates.items())
        lines.append(f"Gates: {shown}")
    else:
        lines.append("Gates: none given (figures only).")
    for name in unchecked(document, thresholds):
        lines.append(f"`{name.replace('_', '-')}`: not available for this input, not checked.")
    lines += [
        "",
        "| rank | step | efficiency E | speedup bound S | utilization | straggler (ms) | result |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for c in all_cases:
        result = "fail: " + "; ".join(f.message() for f in c.failures) if c.failures else "pass"
        if c.skipped:
            result = f"skipped: {c.skipped}"
        straggler = _fmt(_ms(c.straggler_time)) + (" (slowest)" if c.slowest else "")
        row = [
            c.rank,
            str(c.iteration),
            _fmt(c.efficiency, 3),
            _fmt(c.speedup_bound, 3),
            _fmt(c.utilization, 3),
            straggler if c.straggler_time is not None else "n/a",
            result,
        ]
        lines.append("| " + " | ".join(_cell(x) for x in row) + " |")
    ranks = document.get("ranks") or []
    if ranks:
        lines += [
            "",
            "| rank | mean E | min E | distinct transfer orders |",
            "|---|---:|---:|---:|",
        ]
        for r in ranks:
            lines.append(
                f"| {_cell(str(r['rank']))} | {_fmt(r.get('efficiency_mean'), 3)} | "
                f"{_fmt(r.get('efficiency_min'), 3)} | {r.get('distinct_transfer_orders', 'n/a')} |"
            )
    return "\n".join(lines) + "\n"
