"""The public Python API: what the CLI does, as functions over a loaded job.

    import planner
    job = planner.load(["traces/demo"])
    planner.metrics(job).to_frame()
    plans = planner.schedule(job, "tac")
    planner.simulate(job, plans).to_frame()
    planner.report(job, "out/")

Results are dataclasses with `.to_dict()` (the JSON document the CLI's `--json` prints)
and `.to_frame()` (a pandas DataFrame, one row per step or transfer). Heavy modules
(pandas, numba, matplotlib, protobuf) load on first use, so `import planner` stays cheap.
"""

from __future__ import annotations

import glob
from collections.abc import Iterable
from pathlib import Path

from planner.errors import InputError

GLOB_CHARS = "*?["
TRACE_SUFFIXES = (".pb", ".pbtxt", ".json", ".gz")


def expand_globs(paths: Iterable[str | Path]) -> list[Path]:
    """Paths with shell patterns (`*`, `?`, `[...]`) expanded in sorted order, as a shell
    would; a pattern that matches nothing is an error naming it."""
    out: list[Path] = []
    for path in paths:
        text = str(path)
        if any(c in text for c in GLOB_CHARS) and not Path(text).exists():
            matches = sorted(glob.glob(text))
            if not matches:
                raise InputError(text, "no file or directory matches this pattern")
            out.extend(Path(m) for m in matches)
        else:
            out.append(Path(text))
    return out


def _holds_traces(folder: Path) -> bool:
    return any(p.is_file() and p.name.endswith(TRACE_SUFFIXES) for p in folder.iterdir())


def find_runs(folder: Path) -> list[Path]:
    """The runs inside a folder that holds no trace files itself: each subfolder (at any
    depth) that holds trace files, sorted. Empty when `folder` is a run itself."""
    if not folder.is_dir() or _holds_traces(folder):
        return []
    runs: list[Path] = []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        if _holds_traces(sub):
            runs.append(sub)
        else:
            runs.extend(find_runs(sub))
    return runs


def runs_of(paths: Iterable[str | Path]) -> list[Path] | None:
    """The runs named by `paths` when they are one folder of runs, else None."""
    expanded = expand_globs(paths)
    if len(expanded) != 1:
        return None
    runs = find_runs(expanded[0])
    return runs or None


def resolve(paths: Iterable[str | Path]) -> list[Path]:
    """The input paths of one job: globs expanded; a folder of runs is an error that lists
    the runs and asks for one (or, in the CLI, `--each`)."""
    expanded = expand_globs(paths)
    for path in expanded:
        runs = find_runs(path)
        if runs:
            names = ", ".join(str(r.relative_to(path)) for r in runs)
            raise InputError(
                path,
                f"a folder of {len(runs)} runs ({names}); give one of them, or --each "
                "to analyse every run",
            )
    return expanded


def rank_files(folder: Path) -> list[list[Path]] | None:
    """One input per rank of a run folder that holds one PyTorch profiler trace per rank
    (with its Execution Trace, ``et_<name>``, when present); None for any other folder.

    This is how `analyze-ranks RUN_DIR` splits a run into ranks."""
    from planner.ingest import detect

    if not folder.is_dir():
        return None
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES))
    formats = {}
    for path in files:
        try:
            formats[path] = detect.sniff(path).format
        except InputError:
            continue
    kineto = [p for p, f in formats.items() if f == "kineto"]
    if len(kineto) < 2:
        return None
    traces = {p.name: p for p, f in formats.items() if f == "execution_trace"}
    return [[p, *([traces["et_" + p.name]] if "et_" + p.name in traces else [])] for p in kineto]
