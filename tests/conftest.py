"""Shared fixtures: the real traces in ../shared/traces and the repo's traces/."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
DEMO = REPO / "traces" / "demo"
MLP_IN_REPO = [DEMO, REPO / "traces" / "tf" / "mlp_ps_betweengraph_sync" / "worker1"]
"""Both workers of the generated mlp_ps_betweengraph_sync run, from the repo (worker0 is
the demo)."""
RESNET_IN_REPO = REPO / "traces" / "torch" / "resnet_ddp"
TF = SHARED / "generated" / "tf"
TF_RUNS = {
    "cnn_ps_ingraph": [TF / "cnn_ps_ingraph"],
    "mlp_ps_betweengraph_sync": [
        TF / "mlp_ps_betweengraph_sync" / "worker0",
        TF / "mlp_ps_betweengraph_sync" / "worker1",
    ],
}


def missing_reason(path: Path) -> str:
    """The skip reason for a test whose input is absent: it names the missing path."""
    return f"needs {path}, which is not present (a checkout without ../shared beside it)"


def need(path: Path) -> Path:
    """Skip the test when a shared trace is not present on this machine."""
    if not path.exists():
        pytest.skip(missing_reason(path))
    return path


def needs(path: Path) -> pytest.MarkDecorator:
    """A skipif mark for tests or modules that read `path` (a shared trace)."""
    return pytest.mark.skipif(not path.exists(), reason=missing_reason(path))


def run_cli(
    args: list[str], capsys: pytest.CaptureFixture[str], columns: int = 80
) -> tuple[int, str, str]:
    """Run the `planner` entry point in-process, its text `columns` wide (``COLUMNS``, as
    a terminal or a pipe that sets it): (exit status, stdout, stderr)."""
    from planner_cli.main import main

    code = 0
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(columns)
    try:
        main([str(a) for a in args])
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before
    sys.stdout.flush()
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def without_links(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replay as it was before the PS's links were shared (`planner.prediction.host.on_links`):
    each transfer at its observed duration on its own channel."""
    from planner.prediction import host

    monkeypatch.setattr(
        host, "on_links", lambda job, rank, graph, rows, release, *_: (graph, rows, release)
    )
