"""Loud on plain mistakes (issue #46): a folder holding trace files beside run folders is
refused with the runs listed, not read as its top-level files alone (`planner analyze
traces/torch` analysed one file and left 6 runs out, silently); a file of another kind
is named by what it is (a PNG renamed .json read as "not a TensorFlow GraphDef")."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, SHARED, run_cli

PNG = REPO / "docs" / "example" / "report.png"
RESNET = REPO / "traces" / "torch" / "resnet_ddp"


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


@pytest.mark.parametrize("order", ["tf-first", "torch-first"])
def test_mixed_formats_say_what_each_is_and_how_to_split(
    order: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A TF run and a PyTorch run given together: one line naming a file of the odd
    format and what it is, an input of the other, and that they go to two commands."""
    tf, torch = REPO / "traces" / "demo", REPO / "traces" / "torch" / "resnet_ddp"
    inputs = [tf, torch] if order == "tf-first" else [torch, tf]
    code, _, err = run_cli(["metrics", *inputs], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "rank0.json.gz: is a PyTorch profiler (Kineto) trace" in err  # not its ET file
    assert "the other inputs a TensorFlow RunMetadata (e.g. " in err
    assert "two planner commands" in err


BLOCKED = "import runpy, sys; sys.modules['torch'] = sys.modules['tensorflow'] = None; "


@pytest.mark.parametrize(
    ("script", "args", "needs"),
    [
        ("train_ddp.py", ["--write-plans", "plans"], "PyTorch"),
        ("tf_ps_job.py", ["--graph", "base=g.pb", "--out", "runs"], "TensorFlow"),
    ],
)
def test_an_enforcement_example_says_what_to_install(
    script: str, args: list[str], needs: str, tmp_path: Path
) -> None:
    """docs/enforcement.md's examples where their framework is not installed: one line
    saying what to install, exit 2, no traceback."""
    path = REPO / "examples" / script
    code = (
        BLOCKED
        + f"sys.argv = {[str(path), *args]!r}; runpy.run_path(sys.argv[0], run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"examples/{script} needs {needs}, which is not installed: pip install" in done.stderr


def test_the_torch_enforcement_module_says_what_to_install() -> None:
    """`from planner.enforce.torch_ddp import ...` in a job without PyTorch: an ImportError
    that names what to install (the one a training script sees at its first line)."""
    code = BLOCKED + "import planner.enforce.torch_ddp"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: planner.enforce.torch_ddp needs PyTorch"), last
    assert "pip install torch" in last


def _recording_jsons() -> list[Path]:
    """Every plain JSON file beside the traces of a recorded run, in the repo's traces/
    and ../shared/traces/generated, that is no trace (meta.json, steps.json, a plan the
    run enforced, ...)."""
    from planner.ingest import detect

    roots = [REPO / "traces", SHARED / "generated"]
    found = [p for root in roots if root.is_dir() for p in sorted(root.rglob("*.json"))]
    return [p for p in found if detect.sniff(p).format == "unknown_json"]


def test_a_recordings_own_files_are_passed_over_quietly() -> None:
    """`note: skipped …/meta_rank0.json: not a trace` on the repo's own recordings: each
    JSON file a run keeps beside its traces (its description, its step times, the plan
    it enforced) is passed over without a note, in `detect.load` and in the split into
    ranks alike."""
    from planner.ingest import detect

    files = _recording_jsons()
    names = {p.name for p in files}
    assert {"meta.json", "meta_rank0.json", "summary.json", "steps.json", "tic.json"} <= names
    quiet = [p for p in files if detect.run_metadata(detect.sniff(p))]
    folders_of_runs = {"measured.json", "times.json"}  # beside run folders, not in a run
    assert [p for p in files if p not in quiet and p.name not in folders_of_runs] == []


def test_inspect_of_a_recording_says_nothing_of_its_files(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The enforced TAC round keeps its steps.json and the plan (tac.json) beside its
    RunMetadata: no note names them."""
    run = REPO / "traces" / "tf" / "cnn_enforced_tac" / "arrival"
    code, out, err = run_cli(["inspect", run], capsys)
    assert code == 0, err
    assert "steps.json" not in out + err and "tac.json" not in out + err


def test_a_foreign_or_broken_file_in_a_run_is_still_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Beside a DDP run's rank files: its meta_rank*.json and summary.json pass quietly, a
    JSON of another kind is skipped with a note naming it (in one process and in the
    split into ranks), a broken one is an error naming it."""
    from planner.job import parallel

    run = tmp_path / "run"
    run.mkdir()
    for path in RESNET.iterdir():
        (run / path.name).symlink_to(path)
    (run / "results.json").write_text('{"accuracy": 0.9}')
    ranks, notes = parallel.split_ranks([run])
    assert ranks is not None and notes == [f"skipped {run / 'results.json'}: not a trace"]
    code, out, err = run_cli(["inspect", run, "--json"], capsys)
    assert code == 0, err
    assert [n for n in json.loads(out)["notes"] if "skipped" in n] == notes
    (run / "broken.json").write_text('{"accuracy": ')
    code, out, err = run_cli(["inspect", run], capsys)
    assert code == 2 and out == "" and f"{run / 'broken.json'}: invalid JSON" in err


def test_a_folder_of_runs_with_its_measurements_is_a_folder_of_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """traces/torch/ddp_mlp24_gloo keeps measured.json beside its two runs: it is a folder
    of runs (listed, `--each` offered), not "trace files beside 2 run folders"; one run
    is "1 run"."""
    folder = REPO / "traces" / "torch" / "ddp_mlp24_gloo"
    code, _, err = run_cli(["inspect", folder], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "a folder of 2 runs (cap0.001, cap4); give one of them, or --each" in err
    (tmp_path / "only").mkdir()
    (tmp_path / "only" / "rank0.json.gz").symlink_to(folder / "cap4" / "rank0.json.gz")
    (tmp_path / "spec.json").write_text("{}")
    code, _, err = run_cli(["inspect", tmp_path], capsys)
    assert code == 2 and "a folder of 1 run (only)" in err
