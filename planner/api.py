"""The public Python API: what the CLI does, as functions over a loaded job.

    import planner
    job = planner.load("demo")                     # files, folders, globs or a demo's name
    planner.metrics(job).to_frame()                # one row per rank and step
    plans = planner.schedule(job, "tac")           # one plan per rank
    planner.simulate(job, plans).to_frame()        # predicted time of each plan
    planner.report(job, "out/")                    # what `planner analyze -o out/` writes

Every result is a dataclass with `.to_dict()` (the document the CLI's `--json` prints,
with its ``schema``) and `.to_frame()` (a pandas DataFrame). Heavy modules (pandas,
numba, protobuf) load on first use, so `import planner` stays cheap.
"""

from __future__ import annotations

import copy
import glob
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from planner.errors import InputError
from planner.ingest.demos import named

if TYPE_CHECKING:
    import pandas as pd

    from planner.model.plan import Plan
    from planner.model.trace import Job

__all__ = [
    "Inspection", "MetricsResult", "Plans", "Report", "SimulationResult",
    "inspect", "load", "metrics", "report", "schedule", "simulate",
]  # fmt: skip

GLOB_CHARS = "*?["
TRACE_SUFFIXES = (".pb", ".pbtxt", ".json", ".gz")


def expand_globs(paths: Iterable[str | Path]) -> list[Path]:
    """Paths with shell patterns (`*`, `?`, `[...]`) expanded in sorted order, as a shell
    would; a pattern that matches nothing is an error naming it. A bundled demo's name
    (``demo``, ``demo-ddp``) that is no file or folder here is that demo's folder."""
    out: list[Path] = []
    for path in paths:
        text = str(named(path))
        if any(c in text for c in GLOB_CHARS) and not Path(text).exists():
            matches = sorted(glob.glob(text))
            if not matches:
                raise InputError(text, "no file or directory matches this pattern")
            out.extend(Path(m) for m in matches)
        else:
            out.append(Path(text))
    return out


def _holds_traces(folder: Path) -> bool:
    """Whether `folder` is a run: it holds a trace file. A JSON file that is no trace (a
    folder of runs keeps its measured step times beside them: ``measured.json``) does
    not make it one; the names of the others decide, plain JSON files sniffed last."""
    files = sorted(
        (p for p in folder.iterdir() if p.is_file() and p.name.endswith(TRACE_SUFFIXES)),
        key=lambda p: (p.name.endswith(".json"), p.name),
    )
    return any(not p.name.endswith(".json") or not _other_json(p) for p in files)


def _other_json(path: Path) -> bool:
    """Whether a plain JSON file is valid JSON of no format planner reads (one that cannot
    be read is left for its reader to name)."""
    from planner.ingest import detect

    try:
        return detect.sniff(path).format == "unknown_json"
    except (InputError, OSError):
        return False


def find_runs(folder: Path) -> list[Path]:
    """The runs inside a folder that holds no trace files itself: each subfolder (at any
    depth) that holds trace files, sorted. Empty when `folder` is a run itself."""
    try:
        if not folder.is_dir() or _holds_traces(folder):
            return []
    except OSError:  # a name the system refuses: the reader's check words it
        return []
    runs: list[Path] = []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        if _holds_traces(sub):
            runs.append(sub)
        else:
            runs.extend(find_runs(sub))
    return runs


def runs_beside_traces(folder: Path) -> list[Path]:
    """The runs in the subfolders of a folder that also holds trace files itself (read as
    one run, its files alone would be analysed and its runs silently left out)."""
    try:
        if not folder.is_dir() or not _holds_traces(folder):
            return []
        subfolders = sorted(p for p in folder.iterdir() if p.is_dir())
    except OSError:
        return []
    runs: list[Path] = []
    for sub in subfolders:
        runs.extend([sub] if _holds_traces(sub) else find_runs(sub))
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
        runs, beside = find_runs(path), False
        if not runs:
            runs, beside = runs_beside_traces(path), True
        if runs:
            names = ", ".join(str(r.relative_to(path)) for r in runs)
            plural = "s" if len(runs) != 1 else ""
            what, ask = (
                (f"holds trace files beside {len(runs)} run folder{plural}", "give one run "
                 "folder, or the trace files themselves")
                if beside
                else (f"a folder of {len(runs)} run{plural}", "give one of them, or --each "
                      "to analyse every run")
            )  # fmt: skip
            raise InputError(path, f"{what} ({names}); {ask}")
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


# ---------------------------------------------------------------------------------------
# Results


def _frame(rows: list[dict[str, Any]], columns: Sequence[str]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame(rows, columns=list(columns))


@dataclass(frozen=True)
class Inspection:
    """What is in the input (`planner.inspect/1`): per rank its resources, op counts and
    transfers."""

    document: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The `planner.inspect/1` document (a copy)."""
        return copy.deepcopy(self.document)

    def to_frame(self) -> pd.DataFrame:
        """One row per rank and transfer: name, kind, resource, param, nbytes, time (s),
        observed_in (steps)."""
        columns = ["rank", "name", "kind", "resource", "param", "nbytes", "time", "observed_in"]
        rows = [
            {"rank": r["rank"], **{k: t[k] for k in columns[1:]}}
            for r in self.document["ranks"]
            for t in r["transfers"]
        ]
        return _frame(rows, columns)


@dataclass(frozen=True)
class MetricsResult:
    """Scheduling efficiency per step (`planner.metrics/1`, TicTac §3.2; Caramel §3.1 for
    all-reduce jobs under ``allreduce``). ``makespan`` is the step's span, ``busy_makespan``
    the `m` of E = (umax - m) / (umax - lmin)."""

    document: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The `planner.metrics/1` document (a copy)."""
        return copy.deepcopy(self.document)

    def to_frame(self) -> pd.DataFrame:
        """One row per rank and step: span (``makespan``), idle, busy_makespan, umax, lmin,
        efficiency, speedup_bound, queued (TensorFlow RunMetadata steps; else NaN); seconds."""
        columns = [
            "rank", "iteration", "makespan", "idle", "busy_makespan", "umax", "lmin",
            "efficiency", "speedup_bound", "queued",
        ]  # fmt: skip
        rows = [{k: s.get(k) for k in columns} for s in self.document["steps"]]
        return _frame(rows, columns)


@dataclass(frozen=True)
class Plans:
    """One scheduler's plan per rank (`planner.priorities/1`): the transfer order with
    each transfer's ``priority`` and ``order_index``."""

    algorithm: str
    plans: Mapping[str, Plan]
    job: Job = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The `planner.priorities/1` document (what `planner schedule --json` prints)."""
        from planner.job import analysis

        return analysis.plan_document(self.plans, self.job.graphs, self.job.meta)

    def to_frame(self) -> pd.DataFrame:
        """One row per rank and planned transfer, in plan order."""
        columns = ["rank", "algorithm", "order_index", "priority", "name", "param", "nbytes"]
        rows = [
            {"rank": r["rank"], "algorithm": r["algorithm"], **{k: t[k] for k in columns[2:]}}
            for r in self.to_dict()["ranks"]
            for t in r["transfers"]
        ]
        return _frame(rows, columns)


@dataclass(frozen=True)
class SimulationResult:
    """Replay of the traced steps (with ``replay_error``) and the predicted iteration time
    of the random-order baseline, the observed order and each plan
    (`planner.simulation/1`)."""

    document: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """The `planner.simulation/1` document (what `planner simulate --json` prints)."""
        return copy.deepcopy(self.document)

    def to_frame(self) -> pd.DataFrame:
        """One row per rank and plan: predicted (mean, s), p5, p95, speedup_vs_baseline,
        speedup_vs_observed, efficiency, and the rank's median replay error."""
        columns = [
            "rank", "plan", "predicted", "p5", "p95", "speedup_vs_baseline",
            "speedup_vs_observed", "efficiency", "replay_error_median",
        ]  # fmt: skip
        rows = [
            {
                "rank": r["rank"],
                **{k: p.get(k) for k in columns[1:-1]},
                "replay_error_median": r.get("replay_error_median"),
            }
            for r in self.document["comparison"]["ranks"]
            for p in r["plans"]
        ]
        return _frame(rows, columns)

    def replay_frame(self) -> pd.DataFrame:
        """One row per rank and traced step: measured busy makespan, predicted, replay_error."""
        columns = ["rank", "iteration", "measured", "predicted", "replay_error", "span", "idle"]
        rows = [
            {"rank": r["rank"], **{k: s[k] for k in columns[1:]}}
            for r in self.document["replay"]["ranks"]
            for s in r["steps"]
        ]
        return _frame(rows, columns)


@dataclass(frozen=True)
class Report:
    """Everything `planner analyze -o OUT` computes and writes (`planner.report/1`)."""

    document: dict[str, Any] = field(repr=False)
    files: tuple[Path, ...] = field(repr=False)

    def __repr__(self) -> str:
        """The verdict and where the files are, not the whole document."""
        verdict = (self.document.get("verdict") or {}).get("text", "")
        folder = self.files[0].parent if self.files else None
        return f"Report(verdict={verdict!r}, files={len(self.files)} in {str(folder)!r})"

    def to_dict(self) -> dict[str, Any]:
        """The `planner.report/1` document (report.json)."""
        return copy.deepcopy(self.document)

    def to_frame(self) -> pd.DataFrame:
        """The metrics of every step (as `MetricsResult.to_frame`)."""
        return MetricsResult(self.document["metrics"] or {"steps": []}).to_frame()

    @property
    def html(self) -> Path:
        """The HTML report."""
        return next(p for p in self.files if p.name == "report.html")


# ---------------------------------------------------------------------------------------
# Functions


def load(paths: str | Path | Iterable[str | Path], rank: str | None = None) -> Job:
    """Read traces into one Job: files, run folders, glob patterns or a bundled demo's name
    (``demo``, ``demo-ddp``), as the CLI takes them (format sniffed from content). `rank`
    keeps only that rank. Raises InputError (one line naming the file and the problem) on
    bad input."""
    from planner.ingest import detect

    items = [paths] if isinstance(paths, (str, Path)) else list(paths)
    job = detect.load(resolve(items))
    return select_rank(job, rank) if rank is not None else job


def select_rank(job: Job, rank: str) -> Job:
    """The job restricted to one rank; an unknown rank names the ones there are."""
    from planner.job.analysis import rank_view

    if rank not in job.graphs:
        raise InputError(None, f"no rank {rank!r} in the input (ranks: {', '.join(job.ranks)})")
    return rank_view(job, rank)


def inspect(job: Job) -> Inspection:
    """What is in the input: devices, op counts, transfers with sizes, steps."""
    from planner.measure import inspection

    return Inspection(inspection.inspect(job))


def metrics(job: Job) -> MetricsResult:
    """Per-step Umax, Lmin, busy makespan, efficiency E and speedup bound S (TicTac §3.2);
    for all-reduce jobs also Caramel's overlap figures and stragglers."""
    from planner.job import analysis

    return MetricsResult(analysis.metrics(job))


def schedule(job: Job, algorithm: str = "tac", *, channels: int = 1) -> Plans:
    """Plan the transfers of every rank: ``"tic"``, ``"tac"`` (parameter server) or
    ``"caramel"`` (all-reduce). A scheduler that does not apply raises InputError naming
    the one that does."""
    from planner.job import analysis

    return Plans(algorithm, analysis.schedule(job, algorithm, channels=channels), job)


def simulate(
    job: Job,
    plans: Plans | Sequence[Plans] | None = None,
    *,
    samples: int = 100,
    seed: int = 0,
    **knobs: float,
) -> SimulationResult:
    """Replay the traced steps and predict the iteration time of the baseline, the
    observed order and each of `plans` (default: every scheduler that applies).
    `knobs`: bandwidth_scale, compute_scale, latency, channels (as `planner simulate`)."""
    from planner.job import analysis

    if plans is None:
        chosen = {
            name: analysis.schedule(job, name, channels=int(knobs.get("channels", 1)))
            for name in analysis.algorithms_for(job)
        }
    else:
        items = [plans] if isinstance(plans, Plans) else list(plans)
        chosen = {p.algorithm: p.plans for p in items}
    return SimulationResult(analysis.simulation(job, chosen, samples=samples, seed=seed, **knobs))


def report(
    job: Job, out: str | Path, *, samples: int = 100, seed: int = 0, force: bool = False
) -> Report:
    """Analyse the job and write what `planner analyze -o OUT` writes into folder `out`:
    report.json, report.html, the plans' priority files, Caramel's files where the
    verdict recommends them, timeline.json. As the CLI: written as one set, all or none;
    a folder of earlier results is replaced only with `force` (InputError otherwise)."""
    from planner.export.files import check_set_target, write_set
    from planner.job import analysis
    from planner.reporting.outputs import analysis_files

    target = check_set_target(out, force)
    document = analysis.analyze(job, samples=samples, seed=seed)
    files = analysis_files(document, job.graphs, target)
    write_set(target, {path.name: text for path, text in files.items()}, force=force)
    return Report(document, tuple(files))
