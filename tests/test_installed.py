"""A non-editable install, run outside the repository, takes the README tour (issue #46):
the docs its help texts cite, the JSON schemas and both bundled demos come from the
wheel itself, and the project URLs are in its metadata.

The wheel is built from a copy of what it is made of (no build/ left in the checkout, no
stale files from an earlier build), offline (`--no-build-isolation`: the setuptools of
this environment), and installed with `--target` into a scratch folder: the `planner`
it runs is that copy (asserted), started from a folder that holds no trace."""

from __future__ import annotations

import email
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import REPO

SOURCES = ("pyproject.toml", "README.md", "planner", "cli", "docs", "traces/demo",
           "traces/torch/resnet_ddp", "traces/demo_lab")  # fmt: skip
"""What pyproject.toml builds the wheel from."""


def _builds_wheels() -> bool:
    """Whether this environment builds a wheel offline: pip, and a setuptools with its own
    ``bdist_wheel`` (70.1 on) or the ``wheel`` package beside an older one (the test extra
    asks for setuptools>=70.1)."""
    if importlib.util.find_spec("setuptools") is None or importlib.util.find_spec("pip") is None:
        return False
    from importlib.metadata import version

    major, minor = (int(p) for p in version("setuptools").split(".")[:2])
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


pytestmark = pytest.mark.skipif(
    not _builds_wheels(),
    reason="needs pip and setuptools>=70.1 (or wheel) in this environment to build the "
    "wheel offline",
)


def _pip(*args: str, cwd: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", *args, "--no-deps", "--no-index", "--no-cache-dir", "-q"],
        cwd=cwd, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The built wheel, the folder it is installed in, and a folder outside the repo."""
    root = tmp_path_factory.mktemp("installed")
    source = root / "source"
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))  # fmt: skip
        else:
            source.mkdir(exist_ok=True)
            shutil.copy2(REPO / name, source / name)
    _pip("wheel", "--no-build-isolation", "-w", str(root / "dist"), str(source), cwd=root)
    (wheel,) = (root / "dist").glob("planner-*.whl")
    _pip("install", "--target", str(root / "site"), str(wheel), cwd=root)
    work = root / "work"
    work.mkdir()
    return {"wheel": wheel, "site": root / "site", "work": work}


def _planner(installed: dict[str, Path], *args: str) -> subprocess.CompletedProcess[str]:
    """The installed `planner` script, run in the scratch folder on the installed copy.

    Numba's compiled loops run as Python (NUMBA_DISABLE_JIT): a fresh install has no
    compile cache, and compiling them would take this test 25 s; the rest of the suite
    runs them compiled."""
    env = {**os.environ, "PYTHONPATH": str(installed["site"]), "NUMBA_DISABLE_JIT": "1"}
    script = installed["site"] / "bin" / "planner"
    return subprocess.run(
        [sys.executable, str(script), *args],
        cwd=installed["work"], env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def readme_tour() -> list[list[str]]:
    """The README's commands: the quick start's `planner ...` and the short tour's lines
    (all but the tour's `analyze` of a path: the quick start's analyze is the same
    command on the other demo, and twice the cost of the rest together)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    quick = re.search(r"```bash\n[^`]*?&& (planner [^\n]*)\n```", text)
    tour = text.split("## A short tour", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    lines = [quick.group(1)] if quick else []
    lines += [
        line
        for line in tour.splitlines()
        if line.startswith("planner ") and not line.startswith("planner analyze ")
    ]
    return [shlex.split(line)[1:] for line in lines]


def test_the_wheel_ships_docs_schemas_demos_and_urls(installed: dict[str, Path]) -> None:
    with zipfile.ZipFile(installed["wheel"]) as wheel:
        names = set(wheel.namelist())
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = email.message_from_string(wheel.read(meta).decode())
    docs = {p.relative_to(REPO).as_posix() for p in (REPO / "docs").rglob("*.md")}
    schemas = {p.relative_to(REPO).as_posix() for p in (REPO / "docs" / "schemas").iterdir()}
    for path in docs | schemas:
        assert "planner/" + path in names, path
    for demo, folder in (("demo_trace", "traces/demo"), ("demo_ddp", "traces/torch/resnet_ddp"),
                         ("demo_lab", "traces/demo_lab")):  # fmt: skip
        for path in (REPO / folder).iterdir():
            assert f"planner/{demo}/{path.name}" in names, path
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL"))
    assert {"Homepage", "Documentation", "Issues"} <= set(urls)
    assert all(u.startswith("https://") for u in urls.values())


def test_the_installed_copy_runs_outside_the_repo(installed: dict[str, Path]) -> None:
    probe = subprocess.run(
        [sys.executable, "-c", "import planner, planner_cli; print(planner.__file__)"],
        cwd=installed["work"], env={**os.environ, "PYTHONPATH": str(installed["site"])},
        capture_output=True, text=True,
    )  # fmt: skip
    assert Path(probe.stdout.strip()).is_relative_to(installed["site"]), probe.stderr
    assert not installed["work"].is_relative_to(REPO)


def test_the_docs_come_from_the_install(installed: dict[str, Path]) -> None:
    listing = _planner(installed, "docs")
    assert listing.returncode == 0, listing.stderr
    assert str(installed["site"] / "planner" / "docs") in listing.stdout
    page = _planner(installed, "docs", "formats")
    assert page.stdout == (REPO / "docs" / "formats.md").read_text(encoding="utf-8")
    where = _planner(installed, "docs", "--schemas", "planner.report/1", "--path")
    assert Path(where.stdout.strip()).is_relative_to(installed["site"]), where.stderr
    assert json.loads(Path(where.stdout.strip()).read_text())["$id"] == "planner.report.1.json"


def test_the_readme_tour_runs_from_the_install(installed: dict[str, Path]) -> None:
    inspect = _planner(installed, "inspect", "demo", "--json")
    assert inspect.returncode == 0, inspect.stderr
    sources = json.loads(inspect.stdout)["sources"]
    assert sources and all(Path(s).is_relative_to(installed["site"]) for s in sources)
    tour = readme_tour()
    assert tour[0][:2] == ["analyze", "demo-lab"] and tour[0][-2:] == ["-o", "out/demo"]
    assert "demo-lab/network.csv" in tour[0] and len(tour) >= 6
    assert {"demo", "demo-ddp", "demo-lab"} <= {arg for args in tour for arg in args}
    for args in tour:
        done = _planner(installed, *args)
        assert done.returncode == 0, f"planner {shlex.join(args)}: {done.stderr[-1000:]}"
    assert (installed["work"] / "out" / "demo" / "report.html").is_file()
