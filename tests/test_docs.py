"""Every `planner ...` line in a ```bash block of the docs runs and succeeds.

The lines of one page run in order in one scratch directory that holds only the repo's
``traces/`` (no ``../shared``: a fresh clone has nothing beside it), so a page can write
``out/`` and read it back. Every example runs as written: an input path that does not
exist fails the test (the bundled demos' names, ``demo`` and ``demo-ddp``, are inputs).
A line ending in ``# exit 1`` must exit 1 (a failed gate), one ending in ``# needs
torch`` (or ``tensorflow``) runs only where that module is. ``python examples/...``
lines run too, in a subprocess. Globs expand as a shell would.
"""

from __future__ import annotations

import glob
import importlib.util
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from planner.ingest.demos import DEMOS
from tests.conftest import REPO, run_cli

PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
SHELL_ONLY = {"|", ">", "<", "&&", ";"}


def commands(page: Path) -> list[tuple[str, int]]:
    """(command line, expected exit status) for each `planner` or `python examples/` line of
    the page's bash blocks, leaving out those that need a module this machine lacks."""
    out: list[tuple[str, int]] = []
    inside = False
    for line in page.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            inside = stripped == "```bash" if not inside else False
            continue
        if inside and stripped.startswith(("planner ", "python examples/")):
            command, _, comment = stripped.partition("#")
            note = comment.strip()
            if note.startswith("needs ") and importlib.util.find_spec(note[6:]) is None:
                continue
            out.append((command.strip(), 1 if note == "exit 1" else 0))
    return out


def _options(name: str) -> dict[str, click.Option]:
    """The options of a `planner` subcommand by every spelling."""
    from planner_cli.main import cli

    command = cli.commands.get(name)
    assert command is not None, f"no command {name!r}"
    return {
        opt: p
        for p in command.params
        if isinstance(p, click.Option)
        for opt in p.opts + p.secondary_opts
    }


def _takes_paths(name: str) -> bool:
    """Whether the positional arguments of a subcommand are paths (`docs` takes a topic)."""
    from planner_cli.main import cli

    arguments = [p for p in cli.commands[name].params if isinstance(p, click.Argument)]
    return any(isinstance(p.type, click.Path) for p in arguments)


def inputs(args: list[str]) -> list[str]:
    """The input paths of a command line: positional arguments (of a command that takes
    paths) and the values of options that must name an existing file. An option the
    command does not have fails the test."""
    options = _options(args[0])
    paths = _takes_paths(args[0])
    out: list[str] = []
    pending: click.Option | None = None
    for arg in args[1:]:
        if pending is not None:
            if isinstance(pending.type, click.Path) and pending.type.exists:
                out.append(arg)
            pending = None
            continue
        if arg.startswith("-") and arg != "-":
            name = arg.split("=", 1)[0]
            assert name in options or name in ("-h", "--help"), f"unknown option {name}"
            option = options.get(name)
            if option is not None and not option.is_flag and "=" not in arg:
                pending = option
            continue
        if paths:
            out.append(arg)
    return out


def command_part(args: list[str]) -> list[str]:
    """The subcommand and its own arguments: the group's options (`--detail`, `--wide`,
    ...) taken out wherever they stand, as `planner` itself does (`hoist_globals`)."""
    from planner_cli.main import GLOBAL_FLAGS, GLOBAL_VALUED, hoist_globals

    hoisted, i = hoist_globals(args), 0
    while i < len(hoisted) and hoisted[i].split("=", 1)[0] in GLOBAL_FLAGS | GLOBAL_VALUED:
        i += 1 if hoisted[i] in GLOBAL_FLAGS or "=" in hoisted[i] else 2
    return hoisted[i:]


def expand(args: list[str]) -> list[str]:
    out = []
    for arg in args:
        matches = sorted(glob.glob(arg)) if any(c in arg for c in "*?[") else []
        out.extend(matches or [arg])
    return out


def test_docs_have_examples() -> None:
    pages = {p.name for p in PAGES if commands(p)}
    assert {"getting-started.md", "ci.md", "report.md", "analyze.md", "metrics.md"} <= pages


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_examples_run(
    page: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = commands(page)
    if not lines:
        pytest.skip("no planner examples")
    work = tmp_path / "main"
    work.mkdir()
    (work / "traces").symlink_to(REPO / "traces")
    (work / "examples").symlink_to(REPO / "examples")
    (work / "bench").symlink_to(REPO / "bench")  # the lab's stored runs
    monkeypatch.chdir(work)
    for line, code in lines:
        if line.startswith("python "):
            done = subprocess.run([sys.executable, *shlex.split(line)[1:]], capture_output=True)
            assert done.returncode == code, f"{page.name}: `{line}`: {done.stderr[-500:]!r}"
            continue
        args = shlex.split(line)[1:]
        assert not SHELL_ONLY & set(args), f"{page.name}: not a plain command: {line}"
        args = expand(args)
        missing = [p for p in inputs(command_part(args)) if not Path(p).exists() and p not in DEMOS]
        assert not missing, f"{page.name}: `{line}` reads {missing[0]}, which is not in the repo"
        status, _, err = run_cli(args, capsys)
        assert status == code, f"{page.name}: `{line}` exited {status}: {err[-500:]}"
