"""What users see: the HTML report, its figures, and CI outputs (JUnit XML, Markdown).

Reads result documents (``planner.report/1``, ``planner.metrics/1``); computes nothing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Thresholds", "failures", "junit_xml", "markdown_summary", "render_html"]


def __getattr__(name: str) -> Any:
    """Import on first use: the HTML report's sections read the verdict and the plans'
    modules, which `planner metrics` (the CI outputs) never needs."""
    if name == "render_html":
        from planner.reporting.html import render_html

        return render_html
    if name in __all__:
        from planner.reporting import ci

        return getattr(ci, name)
    raise AttributeError(f"module 'planner.reporting' has no attribute {name!r}")
