"""Loud on plain mistakes (issue #46): a folder holding trace files beside run folders is
refused with the runs listed, not read as its top-level files alone (`planner analyze
traces/torch` analysed one file and left 6 runs out, silently); a file of another kind
is named by what it is (a PNG renamed .json read as "not a TensorFlow GraphDef")."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from conftest import REPO, run_cli

PNG = REPO / "docs" / "example" / "report.png"


@pytest.mark.parametrize("command", ["inspect", "metrics", "analyze"])
def test_a_folder_of_runs_beside_a_trace_is_refused_with_the_runs(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_cli([command, REPO / "traces" / "torch"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "run folders (" in err and "resnet_ddp" in err and "ddp_windows" in err


@pytest.mark.parametrize(
    ("content", "kind"),
    [
        (PNG.read_bytes(), "a PNG image"),
        (b"PK\x03\x04" + bytes(60), "a ZIP archive"),
        (b"<!DOCTYPE html><html><body>report</body></html>", "an HTML page"),
        (b"%PDF-1.7\n" + bytes(40), "a PDF document"),
        (gzip.compress(PNG.read_bytes()), "a PNG image"),
    ],
    ids=["png", "zip", "html", "pdf", "png-gz"],
)
def test_a_file_of_another_kind_is_named(
    content: bytes, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / ("trace.json.gz" if content[:2] == b"\x1f\x8b" else "trace.json")
    path.write_bytes(content)
    code, _, err = run_cli(["inspect", path], capsys)
    assert (
        code == 2
        and err.strip()
        == f"planner: error: {path}: {kind}"
        + (" (unpack it and give the trace inside)" if "ZIP" in kind else "")
        + ", not a trace this planner reads"
    )
