"""The README's first command runs again and again on the same clone (issue #46): the
demo's `planner analyze -o out/demo` replaces its own earlier output, which it recognises
by the sources in report.json; any other folder of results still needs --force."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from conftest import REPO, RESNET_IN_REPO, run_cli


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


def test_the_readme_quick_start_on_the_lab_demo_replaces_its_own_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's first command, `planner analyze demo-lab --network
    demo-lab/network.csv ...`, run twice in a folder with no `demo-lab` of its own: the
    demo and the benchmark beside it are the bundled ones, and the second run replaces
    the first's output."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    first = readme.split("```bash\n", 1)[1].split("\n", 1)[0]
    args = shlex.split(first.split("&& planner ", 1)[1])
    assert args[:2] == ["analyze", "demo-lab"] and "demo-lab/network.csv" in args
    out = args.index("-o")
    args[out + 1] = str(tmp_path / "out" / "demo")
    for _ in range(2):
        code, text, err = run_cli(args, capsys)
        assert code == 0, err
    assert text.startswith("Set DDP's bucket_cap_mb=0.25")
    assert (tmp_path / "out" / "demo" / "report.html").is_file()
