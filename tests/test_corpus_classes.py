"""Issue 47's corpus classes through the real CLI: numbers beyond int64, names not UTF-8.

`tests/mutations.py` builds them (`build_corpus(groups=("numbers", "encoding"))`): integers
past int64 in every numeric field the Kineto, planner JSON and TF timeline readers use, and
op, kernel, thread, process, rank and arg names holding bytes that are not UTF-8. Each runs
`planner inspect` in-process: a broken one must exit 2 with one line naming its file; a
valid one (a name, or a field the reader treats as a name or does not use) must be read.
The gaps known today are strict xfails (`mutations.KNOWN_KINETO_BUGS`). The multi-rank
class, and every command with `-j 1` and `-j 2`, run in `bench/fuzz_ingest.py`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import run_cli
from mutations import Case, build_corpus

SEED = int(os.environ.get("PLANNER_CORPUS_SEED", "0"))
CASES = build_corpus(SEED, groups=("numbers", "encoding"))


def _param(case: Case) -> object:
    marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
    return pytest.param(case, id=case.name, marks=marks)


def test_classes_cover_every_field() -> None:
    families = {c.family for c in CASES}
    assert {"overflow-number", "bad-name", "valid"} <= families
    assert len(CASES) >= 250
    assert len({c.name for c in CASES}) == len(CASES)
    assert [c.files for c in build_corpus(SEED, groups=("numbers",))] == [
        c.files for c in CASES if c.group == "numbers"
    ]  # a class's cases do not depend on the other classes built


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_inspect_reads_or_refuses_in_one_line(
    case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inputs, culprits = case.write(tmp_path / "in")
    code, out, err = run_cli(["inspect", "--json", *inputs], capsys)
    assert "Traceback" not in err, err
    if case.valid:
        assert code == 0, err
        assert out.startswith("{")
        return
    lines = err.splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("planner: error: "), err
    assert any(str(p) in lines[0] for p in culprits), (lines[0], culprits)
    assert out == ""
