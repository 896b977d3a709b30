"""What users see: the HTML report, its figures, and CI outputs (JUnit XML, Markdown).

Reads result documents (``planner.report/1``, ``planner.metrics/1``); computes nothing.
"""

from planner.report.ci import Thresholds, failures, junit_xml, markdown_summary
from planner.report.html import render_html

__all__ = ["Thresholds", "failures", "junit_xml", "markdown_summary", "render_html"]
