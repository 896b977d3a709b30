"""The README's first command runs again and again on the same clone (issue #46): the
demo's `planner analyze -o out/demo` replaces its own earlier output, which it recognises
by the sources in report.json; any other folder of results still needs --force."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import RESNET_IN_REPO, run_cli


def test_the_demo_replaces_its_own_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "out" / "demo"
    for _ in range(2):
        code, _, err = run_cli(["analyze", "-o", target], capsys)
        assert code == 0, err
    assert (target / "report.html").is_file()
    code, _, err = run_cli(["analyze", RESNET_IN_REPO, "-o", target], capsys)
    assert code == 2 and "pass --force" in err
    other = tmp_path / "resnet"
    assert run_cli(["analyze", RESNET_IN_REPO, "-o", other], capsys)[0] == 0
    code, _, err = run_cli(["analyze", "-o", other], capsys)
    assert code == 2 and "pass --force" in err  # the demo does not replace another job's
