"""The mutation corpus through the real CLI: exit 2, one line naming the file, no output.

Every broken case runs `planner analyze CASE... -o DIR` in-process and must exit 2 with
exactly one stderr line (`planner: error: <file>: <problem>`) that names the culprit,
print nothing on stdout, and leave DIR absent. Valid look-alikes must convert (exit 0).
A sample also runs in subprocesses (a real interpreter, real exit status, no traceback).
Seed: PLANNER_CORPUS_SEED (default 0).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import run_cli
from mutations import Case, build_corpus

SEED = int(os.environ.get("PLANNER_CORPUS_SEED", "0"))
CASES = build_corpus(SEED)  # the heavy cases (GiBs to inflate) run in bench/fuzz_ingest.py
BROKEN = [c for c in CASES if not c.valid]


def _param(case: Case) -> object:
    marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
    return pytest.param(case, id=case.name, marks=marks)


def test_corpus_is_large_and_covers_every_family() -> None:
    families = Counter(c.family for c in BROKEN)
    assert len(BROKEN) >= 200, families
    wanted = {
        "truncated-gzip",
        "truncated-protobuf",
        "invalid-json",
        "missing-field",
        "mistyped-field",
        "wrong-units",
        "negative-huge",
        "duplicate-steps",
        "missing-steps",
        "cycle",
        "mismatched-ranks",
        "empty",
        "garbage",
        "special-file",
        "limits",
        "deep-nesting",
        "overflow-number",
        "bad-name",
        "output",
    }
    assert wanted <= set(families), wanted - set(families)
    assert len({c.name for c in CASES}) == len(CASES)


def test_corpus_is_deterministic_for_a_seed() -> None:
    again = build_corpus(SEED)
    assert [(c.name, c.files) for c in again] == [(c.name, c.files) for c in CASES]
    other = build_corpus(SEED + 1)
    assert [c.files for c in other] != [c.files for c in CASES]


def _assert_refused(
    code: int, out: str, err: str, culprits: list[Path], output: Path, kept: bytes | None = None
) -> None:
    """Exit 2, one line naming a culprit then the problem, nothing on stdout, no output.

    `kept`: the bytes of a file that `-o` named, which must be left as it was.
    """
    lines = err.splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("planner: error: "), err
    assert "Traceback" not in err
    shown = [os.fsencode(p).decode("utf-8", "backslashreplace") for p in culprits]
    named = sorted((p for p in shown if p in lines[0]), key=lambda p: -len(p))
    assert named, (lines[0], culprits)
    rest = lines[0].split(named[0], 1)[1]
    problem = rest.split(": ", 1)[1] if ": " in rest else ""
    assert len(problem) >= 10, lines[0]  # the file, then what is wrong
    assert out == ""
    if kept is None:
        assert not output.exists(), sorted(output.rglob("*"))
    else:
        taken = output if output.is_file() else output.parent
        assert taken.read_bytes() == kept and not output.is_dir()
    beside = list(output.parent.iterdir()) if output.parent.is_dir() else []
    leftovers = [p for p in beside if p.name.startswith(f".{output.name}.")]
    assert not leftovers, leftovers


def _culprits(case: Case, culprits: list[Path], output: Path) -> list[Path]:
    return [output] if case.output else culprits


@pytest.mark.parametrize("case", [_param(c) for c in BROKEN])
def test_broken_input_exits_2_with_one_line(
    case: Case,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inputs, culprits = case.write(tmp_path / "in")
    for name, value in case.env:
        monkeypatch.setenv(name, value)
    output, kept = case.output_path(tmp_path / "work")
    code, out, err = run_cli(["analyze", *inputs, "-o", output], capsys)
    _assert_refused(code, out, err, _culprits(case, culprits, output), output, kept)


@pytest.mark.parametrize("case", [_param(c) for c in CASES if c.valid])
def test_valid_look_alike_is_accepted(
    case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs, _ = case.write(tmp_path / "in")
    output = tmp_path / "out" / "trace.json"
    code, _, err = run_cli(["convert", *inputs, "-o", output], capsys)
    assert code == 0, err
    assert output.exists()


SAMPLE = (
    random.Random(SEED).sample([c for c in BROKEN if not c.xfail], 3)
    + [c for c in BROKEN if c.family == "special-file" and "fifo" in c.name][:1]
)  # a FIFO that an open() would block on: a real process, with a timeout


@pytest.mark.parametrize("case", [_param(c) for c in SAMPLE])
def test_broken_input_in_a_subprocess(case: Case, tmp_path: Path) -> None:
    inputs, culprits = case.write(tmp_path / "in")
    output, kept = case.output_path(tmp_path / "work")
    done = subprocess.run(
        [sys.executable, "-c", "from planner_cli.main import main; main()"]
        + ["analyze", *map(str, inputs), "-o", str(output)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONWARNINGS": "error::RuntimeWarning", **dict(case.env)},
    )
    culprits = _culprits(case, culprits, output)
    _assert_refused(done.returncode, done.stdout, done.stderr, culprits, output, kept)
