"""Output is whole or absent, safe to name and made with the user's umask (issue 17, point 4).

`analyze -o DIR` writes its set through `planner.export.files.write_set`; a writer killed
with SIGKILL at random moments must leave the old set or the new one, never a mix.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import DEMO, TF_RUNS, need, run_cli

from planner.errors import InputError
from planner.export import files

DEMO_STEPS = [DEMO / "run_metadata_step3.pb", DEMO / "run_metadata_step4.pb"]


def _entries(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def _one_line_error(code: int, err: str, culprit: Path, words: str) -> None:
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith(f"planner: error: {culprit}: "), err
    assert words in err, err


def test_analyze_replaces_earlier_results_only_with_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert run_cli(["analyze", DEMO_STEPS[0], "-o", out], capsys)[0] == 0
    first = (out / "report.json").read_bytes()
    names = _entries(out)
    assert {"report.json", "report.html", "worker0.tac.txt"} <= names
    code, _, err = run_cli(["analyze", *DEMO_STEPS, "-o", out], capsys)
    _one_line_error(code, err, out, "holds earlier results; pass --force to replace them")
    assert (out / "report.json").read_bytes() == first
    (out / "stale.txt").write_text("from an older planner")
    code, _, err = run_cli(["analyze", *DEMO_STEPS, "-o", out, "--force"], capsys)
    assert code == 0, err
    assert (out / "report.json").read_bytes() != first
    assert _entries(out) == names  # replaced as a set: the stale file went with the old set
    assert _entries(tmp_path) == {"out"}  # no staging directory, no lock file left


def test_a_directory_of_other_files_is_never_replaced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "home"
    out.mkdir()
    (out / "thesis.tex").write_text("precious")
    code, _, err = run_cli(["analyze", DEMO_STEPS[0], "-o", out, "--force"], capsys)
    _one_line_error(code, err, out, "holds files that are not planner results")
    assert _entries(out) == {"thesis.tex"}
    empty = tmp_path / "empty"
    empty.mkdir()
    assert run_cli(["analyze", DEMO_STEPS[0], "-o", empty], capsys)[0] == 0


def test_output_paths_that_cannot_be_used_are_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    a_dir = tmp_path / "dir"
    a_dir.mkdir()
    cases = [
        (["analyze", DEMO_STEPS[0], "-o", a_file], a_file, "exists and is not a directory"),
        (["analyze", DEMO_STEPS[0], "-o", a_file / "out"], a_file / "out", "is not a directory"),
        (["convert", DEMO_STEPS[0], "-o", a_dir], a_dir, "is a directory; give a file name"),
        (["convert", DEMO_STEPS[0], "-o", a_file / "t.json"], a_file / "t.json", "not a direc"),
    ]
    before = sorted(tmp_path.rglob("*"))
    for args, culprit, words in cases:
        code, _, err = run_cli(args, capsys)
        _one_line_error(code, err, culprit, words)
    assert sorted(tmp_path.rglob("*")) == before


def test_a_second_concurrent_writer_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    lock = tmp_path / ".out.planner-lock"
    with lock.open("w") as held:  # what a running writer holds
        fcntl.flock(held, fcntl.LOCK_EX)
        code, _, err = run_cli(["analyze", DEMO_STEPS[0], "-o", out], capsys)
    _one_line_error(code, err, out, "another planner is writing it now")
    assert not out.exists()
    assert run_cli(["analyze", DEMO_STEPS[0], "-o", out], capsys)[0] == 0  # lock released
    assert _entries(tmp_path) == {"out"}  # the stale lock file was removed


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002])
def test_files_are_created_with_the_users_umask(
    mask: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    old = os.umask(mask)
    try:
        assert run_cli(["analyze", DEMO_STEPS[0], "-o", tmp_path / "out"], capsys)[0] == 0
        assert run_cli(["convert", DEMO_STEPS[0], "-o", tmp_path / "t.json"], capsys)[0] == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o777 & ~mask
    written = [*(tmp_path / "out").iterdir(), tmp_path / "t.json"]
    assert {stat.S_IMODE(p.stat().st_mode) for p in written} == {0o666 & ~mask}


def test_export_is_byte_identical_across_runs(tmp_path: Path) -> None:
    graph = need(TF_RUNS["mlp_ps_betweengraph_sync"][0] / "graph.pb")
    plan = tmp_path / "plan.json"
    cli = [sys.executable, "-c", "from planner_cli.main import main; main()"]
    subprocess.run([*cli, "schedule", "-a", "tic", str(graph), "-o", str(plan)], check=True)
    outputs = []
    for seed in ("1", "2", "3"):
        out = tmp_path / f"rewritten{seed}.pb"
        args = ["export", "--graphdef", str(graph), "--plan", str(plan), "-o", str(out)]
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run([*cli, *args], check=True, env=env, capture_output=True)
        outputs.append(out.read_bytes())
    assert len(outputs[0]) > 1000
    assert outputs[1] == outputs[0] and outputs[2] == outputs[0]


# ------------------------------------------------------------------ names


def test_safe_names_are_plain_bounded_and_unique() -> None:
    names = ["worker0", "../../etc", ".hidden", "a/b", "a_b", "A_B", "x" * 300, "ps\x00", "é"]
    parts = files.file_names(names)
    assert list(parts) == names
    assert parts["worker0"] == "worker0"
    assert len({p.lower() for p in parts.values()}) == len(names)
    for part in parts.values():
        assert part and not part.startswith(".") and len(part) <= files.MAX_NAME_PART
        assert all(c.isascii() and (c.isalnum() or c in "._+-") for c in part), part
    assert files.file_names(names) == parts  # deterministic


# ------------------------------------------------------------------ kill -9


_WRITER = """
import sys
from planner.export.files import write_set
target = sys.argv[1]
generation = 0
while True:
    generation += 1
    body = f"generation {generation}\\n" + "x" * (1 << 16)
    report = '{"schema": "planner.report/1", "generation": %d}' % generation
    files = {"report.json": report, **{f"part{i}.txt": body for i in range(12)}}
    write_set(target, files, force=True)
    print(generation, flush=True)
"""


def _generation(folder: Path) -> int:
    """The one generation every file of a set carries (AssertionError on a mixed set)."""
    report = json.loads((folder / "report.json").read_text())
    assert _entries(folder) == {"report.json", *(f"part{i}.txt" for i in range(12))}
    for i in range(12):
        text = (folder / f"part{i}.txt").read_text()
        assert text.startswith(f"generation {report['generation']}\n"), (i, text[:20])
    return report["generation"]


def test_kill_9_at_any_moment_leaves_the_old_set_or_the_new_one(tmp_path: Path) -> None:
    out = tmp_path / "out"
    rng = random.Random(17)
    seen: list[int] = []
    for _ in range(12):
        writer = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(out)], stdout=subprocess.PIPE, text=True
        )
        assert writer.stdout is not None
        writer.stdout.readline()  # at least one set written, more under way
        time.sleep(rng.uniform(0.0, 0.25))
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
        seen.append(_generation(out))  # whole: one generation in every file
        leftovers = _entries(tmp_path) - {"out"}
        assert all(name.startswith(".out.planner-") for name in leftovers), leftovers
    assert len(set(seen)) > 1
    files.write_set(out, {"report.json": '{"schema": "planner.report/1"}'}, force=True)
    assert _entries(tmp_path) == {"out"}  # the next writer removed what the killed ones left


def test_a_set_cut_between_the_fallback_renames_is_mended(tmp_path: Path) -> None:
    out = tmp_path / "out"
    files.write_set(out, {"report.json": '{"schema": "planner.report/1", "n": 1}'})
    old = tmp_path / ".out.planner-old-x"
    out.rename(old)  # a writer killed after moving the old set away, before the new came
    files.write_set(out, {"report.json": '{"schema": "planner.report/1", "n": 2}'}, force=True)
    assert json.loads((out / "report.json").read_text())["n"] == 2
    assert _entries(tmp_path) == {"out"}


def test_write_set_refuses_names_with_path_syntax(tmp_path: Path) -> None:
    for name in ("../x", "a/b", "", ".."):
        with pytest.raises(ValueError, match="not a plain file name"):
            files.write_set(tmp_path / "out", {name: "x"})
    with pytest.raises(InputError, match="exists and is not a directory"):
        (tmp_path / "f").write_text("x")
        files.write_set(tmp_path / "f", {"a": "x"})
    assert _entries(tmp_path) == {"f"}
