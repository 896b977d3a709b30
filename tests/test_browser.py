"""A real browser opens the report of a real run: it renders, plots present, no errors.

Skips when Debian's ``chromium`` is not installed. The screenshot is written to
$PLANNER_TEST_ARTIFACTS (default: the test's tmp dir) as ``report-<trace>.png``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.browser_cdp import chromium, open_page
from tests.conftest import DEMO, REPO, need, run_cli

pytestmark = pytest.mark.skipif(chromium() is None, reason="chromium is not installed")
pytest.importorskip("websocket", reason="websocket-client is not installed")

TORCH = REPO / "traces" / "torch" / "resnet_ddp"


def _artifacts(tmp_path: Path) -> Path:
    out = Path(os.environ.get("PLANNER_TEST_ARTIFACTS", tmp_path))
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.mark.parametrize("trace", ["demo", "torch"])
def test_report_renders_in_chromium(
    trace: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = DEMO if trace == "demo" else need(TORCH)
    result_dir = tmp_path / "out"
    assert run_cli(["analyze", source, "-o", result_dir], capsys)[0] == 0
    assert run_cli(["report", result_dir], capsys)[0] == 0
    page = open_page(result_dir / "report.html")
    assert page.errors == []
    assert page.title == "planner report"
    assert {"advice", "summary", "steps", "efficiency", "timeline", "files"} <= set(page.sections)
    assert page.sections[0] == "advice"  # the headline comes first
    # TF PS worker: the comparison credits TIC with ~10%, the replay of the traced steps
    # as enforced with a loss: nothing to apply, and the page says why. DDP, 2 buckets:
    # no order changes the step; never the random baseline as "best"
    assert "Keep what you have" in page.headline, page.headline
    assert "because" in page.headline and "baseline" not in page.headline
    if trace == "demo":
        assert "replayed on the traced steps" in page.headline, page.headline
        assert "windows" not in page.sections and "left-out" in page.sections
    # one time unit: every time axis in ms, none in seconds; no negative time tick
    labels = [t for t in page.svg_text if "ms" in t or "second" in t]
    assert labels and all("second" not in t for t in labels), labels
    assert not [t for t in page.svg_text if t.strip().startswith(("−", "-")) and "%" not in t]
    # iteration time, efficiency, the traced step's and a plan's timelines at least
    assert page.plot_count >= 3
    assert page.png.startswith(b"\x89PNG\r\n\x1a\n") and len(page.png) > 20_000
    (_artifacts(tmp_path) / f"report-{trace}.png").write_bytes(page.png)


def test_a_broken_page_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "broken.html"
    page.write_text(
        "<!DOCTYPE html><html><head><title>x</title></head><body>"
        "<script>console.error('boom'); undefinedFunction();</script></body></html>"
    )
    result = open_page(page)
    assert len(result.errors) >= 2 and result.plot_count == 0
