"""What each command imports before it reads a byte: `--version`/`--help` load no
numerics, and a command loads only the heavy modules its input needs (the timings
are in bench/bench_startup.py; this checks the cause, the module set)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import DEMO, RESNET_IN_REPO

HEAVY = ("numpy", "pandas", "networkx", "numba", "matplotlib", "google.protobuf", "rich")


def _loaded(argv: list[str]) -> set[str]:
    """The heavy top-level modules a fresh interpreter holds after `planner ARGV`."""
    code = (
        "import sys, json\n"
        "from planner_cli.main import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        f"heavy = {HEAVY!r}\n"
        "found = sorted(h for h in heavy if h in sys.modules)\n"
        "sys.stderr.write('\\n' + json.dumps(found))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return set(json.loads(done.stderr.strip().splitlines()[-1]))


@pytest.mark.parametrize("argv", [["--version"], ["--help"], ["inspect", "--help"]])
def test_version_and_help_load_no_numerics(argv: list[str]) -> None:
    assert _loaded(argv) == set()


def test_import_planner_is_cheap() -> None:
    code = f"import sys, planner; print(sorted(h for h in {HEAVY!r} if h in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "[]", done.stderr


@pytest.mark.parametrize(
    ("argv", "absent"),
    [
        (["metrics", str(DEMO), "--json"], {"numba", "matplotlib"}),
        (
            ["inspect", str(RESNET_IN_REPO), "--json"],
            {"pandas", "networkx", "numba", "matplotlib", "google.protobuf"},
        ),
        (["schedule", str(DEMO), "--json"], {"numba", "matplotlib"}),
        (["simulate", str(DEMO), "--samples", "20", "--json"], {"numba", "matplotlib"}),
        # the quick start and a 2-rank DDP job: the replay's Python loop, the graph's own
        # views (no networkx), no figures without -o
        (["analyze", "--json"], {"numba", "networkx", "matplotlib"}),
        (["analyze", str(RESNET_IN_REPO), "-j", "1"], {"numba", "networkx", "matplotlib"}),
    ],
    ids=["metrics-tf", "inspect-torch", "schedule-tf", "simulate-small", "analyze-demo",
         "analyze-ddp"],
)  # fmt: skip
def test_commands_load_only_what_they_need(argv: list[str], absent: set[str]) -> None:
    loaded = _loaded(argv)
    assert "numpy" in loaded  # the command did read its input
    if argv[0] != "inspect":  # inspect reads the numpy columns alone (Trace.table)
        assert "pandas" in loaded
    assert not loaded & absent, sorted(loaded & absent)


def test_analyze_draws_the_report_figures_without_a_plotting_library(tmp_path) -> None:  # noqa: ANN001
    """`analyze -o`: the figures are SVG put together by `planner.reporting.svg`; no
    plotting library is imported (matplotlib alone took longer than the analysis)."""
    out = tmp_path / "out"
    loaded = _loaded(["analyze", "-o", str(out)])
    assert "pandas" in loaded and not loaded & {"matplotlib", "numba", "networkx"}
    assert "<svg" in (out / "report.html").read_text()
