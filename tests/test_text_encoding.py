"""Names that are not valid UTF-8 (a profiler that wrote Latin-1) are read with the bytes
escaped as ``\\xNN`` and a note, by both Kineto readers, never a traceback (issue #47:
the streaming reader's piece decoder raised UnicodeDecodeError)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from conftest import REPO, run_cli

from planner.ingest.files import escape_invalid_utf8

CPU_STEPS = REPO / "traces" / "torch" / "cpu_dataloader" / "steps.json.gz"


def test_escape_keeps_valid_text_and_counts_the_bytes_it_escapes() -> None:
    assert escape_invalid_utf8('{"a": "é"}'.encode()) == ('{"a": "é"}'.encode(), 0)
    data, count = escape_invalid_utf8(b'{"a": "caf\xe9", "b": "\xc3"}')
    assert count == 2
    assert json.loads(data) == {"a": "caf\\xe9", "b": "\\xc3"}


def _latin(tmp_path: Path, layout: str) -> Path:
    """The real CPU trace with every `aten::` name spelled with a Latin-1 é."""
    raw = gzip.decompress(CPU_STEPS.read_bytes()).replace(b"aten::", b"aten\xe9::")
    if layout == "array":  # the old layout (the event list alone): the whole-document reader
        doc = json.loads(raw.decode("latin-1"))
        raw = json.dumps(doc["traceEvents"], ensure_ascii=False).encode("latin-1")
    path = tmp_path / f"latin_{layout}.json.gz"
    path.write_bytes(gzip.compress(raw))
    return path


@pytest.mark.parametrize("layout", ["kineto", "array"])
def test_latin1_names_are_read_escaped_with_a_note(
    tmp_path: Path, layout: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import planner

    path = _latin(tmp_path, layout)
    job = planner.load([path])
    names = [n for g in job.graphs.values() for n in g.ops]
    assert any("aten\\xe9::" in n for n in names)
    count = gzip.decompress(CPU_STEPS.read_bytes()).count(b"aten::")
    assert any(f"{count} byte(s) of the trace's text are not UTF-8" in n for n in job.notes)
    code, out, err = run_cli(["inspect", path, "--json"], capsys)
    assert code == 0 and "Traceback" not in err
    assert any("not UTF-8" in n for n in json.loads(out)["notes"])
