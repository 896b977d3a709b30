"""Replay fidelity: the observed order of every traced step, replayed, against the step.

For every step of every trace in ../shared/traces (generated TF and torch jobs, and the
Kineto traces of public/ and public/external, one job per file, the 8 DLRM ranks as
one job; and the traces recorded for this project, traces/torch/h100_cnn_windows,
traces/torch/cpu_dataloader and the runs of the TF jobs in traces/tf),
`planner.prediction.replay.replay` predicts the step with the step's own op times and
observed order. Printed per trace: steps, median and worst |error| against the step's
wall-clock time (its recorded span: ``ProfilerStep#N`` for PyTorch, first to last
record of the RunMetadata for TF; on a GPU rank the device's step) and against its busy
time (the union of its op intervals; on a GPU rank of its device work); then the overall
figures and the five worst steps (wall-clock, then busy time; over every judged step,
then over those of ../shared/traces) with the largest unmodelled gap the replay names
as their cause. Steps flagged partial (records
missing) are listed apart and left out of the figures, as CI gates leave them out; so
are ranks with a single step (no other step to take the overheads from: the replay
would reproduce the step by construction). `cover` is the share of the wall-clock time
in which some traced op runs. A step is excluded from the judgement only for a defect of
the trace itself, records covering less than half of its wall-clock time; the excluded
traces are printed with the reason, and the overall figures with and without them; the
judged figures once more for the traces of ../shared/traces alone (the set issue #16
names) and for the jobs recorded here alone. For
the generated jobs the replay is also compared with the step times their scripts
recorded (TF: the whole ``session.run``, as it is and with the client time of the other
steps that no RunMetadata record covers). Beside the replay, a baseline with no model:
each step predicted by the median wall-clock time of its rank's other judged steps. A
GPU rank's step is its device's; its CPU range (what the training loop's clock reads)
is printed beside it, not judged.
Files that cannot be replayed (no graph, no timed op) are listed with the reason.

Run: ``nice python bench/bench_replay.py`` from the repo root (``--only SUBSTRING`` to
restrict to some traces). Exit status 1 when median > 2% or worst > 5% over the judged
steps.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.errors import InputError  # noqa: E402
from planner.ingest import detect  # noqa: E402
from planner.prediction import overheads  # noqa: E402
from planner.prediction.replay import replay  # noqa: E402

SHARED = ROOT.parent / "shared" / "traces"
GENERATED = SHARED / "generated"
PUBLIC = SHARED / "public"
DLRM = PUBLIC / "param/et_replay/tests/inputs/dlrm_kineto.tar.gz.extracted/dlrm_kineto"
TARGET_MEDIAN = 0.02
TARGET_WORST = 0.05
REPO_PREFIX = "traces/"  # the names of repo_jobs(): recorded here, beside the shared set
# TF jobs recorded with no process waiting for a core (traces/tf/README.md): 1 ps + 1
# worker, each `taskset`-pinned to its own core, 1 executor thread; judged as a group too
PINNED_TF = ("mlp_ps_pinned", "cnn_ps_pinned")
# a step whose records cover less of its wall-clock time is not judged
MIN_COVER = overheads.MIN_COVER


def generated_jobs() -> list[tuple[str, list[Path]]]:
    """Each generated job: its directory, or the per-worker directories of one TF job."""
    jobs = []
    for framework in sorted(p for p in GENERATED.iterdir() if p.is_dir()):
        for job in sorted(p for p in framework.iterdir() if p.is_dir()):
            workers = sorted(p for p in job.iterdir() if p.is_dir())
            jobs.append((f"generated/{framework.name}/{job.name}", workers or [job]))
    return jobs


def public_jobs() -> list[tuple[str, list[Path]]]:
    """Every trace file under public/ (older `_history` copies left out), one job each;
    the DLRM ranks together as one job. Execution Traces ride with their Kineto files."""
    jobs: list[tuple[str, list[Path]]] = []
    if DLRM.is_dir():
        jobs.append((str(DLRM.relative_to(SHARED)), [DLRM]))
    for path in sorted(PUBLIC.rglob("*")):
        if not path.is_file() or "_history" in path.parts or DLRM in path.parents:
            continue
        if not path.name.endswith((".json", ".json.gz")):
            continue
        jobs.append((str(path.relative_to(SHARED)), [path]))
    return jobs


def repo_jobs() -> list[tuple[str, list[Path]]]:
    """Real traces recorded for this project and kept in the repo's traces/ (their
    README says how): the GPU machine's CNN, recorded after the simulator's models were
    built and never tuned on; the CPU loop fed by a slow DataLoader, recorded to check
    the input wait and the loop's iterations (the loop rule was set on it too); three
    runs each of an in-graph and a between-graph TF PS job on this host's kind, of the
    mlp and of a small CNN (traces/tf/README.md says which rules were set when each was
    recorded); the mlp and the CNN in-graph on 1 ps + 1 worker, each process on its own
    core (`PINNED_TF`: no process waited for a core); the generated cnn's GraphDef run as
    traced and with its TIC plan enforced (`cnn_enforced`)."""
    folder = ROOT / "traces" / "torch" / "h100_cnn_windows"
    jobs = [(str(folder.relative_to(ROOT)), [folder])] if folder.is_dir() else []
    loader = ROOT / "traces" / "torch" / "cpu_dataloader"
    for path in sorted(loader.glob("*.json.gz")):
        jobs.append((str(path.relative_to(ROOT)), [path]))
    for job in ("mlp_ps_ingraph", "mlp_ps_betweengraph", "cnn_ps_ingraph", "cnn_ps_betweengraph",
                *PINNED_TF):  # fmt: skip
        for run in sorted((ROOT / "traces" / "tf" / job).glob("run*")):
            workers = sorted(p for p in run.iterdir() if p.is_dir())
            jobs.append((str(run.relative_to(ROOT)), workers or [run]))
    for run in sorted(p for p in (ROOT / "traces" / "tf" / "cnn_enforced").glob("*") if p.is_dir()):
        jobs.append((str(run.relative_to(ROOT)), [run]))
    return jobs


def recorded_walls(paths: list[Path]) -> dict[tuple[str, int], float]:
    """(rank, step) -> the step's wall time the generating script recorded outside the
    profiler (meta.json / meta_rank*.json of the generated runs; empty elsewhere)."""
    out: dict[tuple[str, int], float] = {}
    for path in paths:
        meta = path / "meta.json"
        if meta.is_file():  # TF: one file per client (both workers of an in-graph job)
            doc = json.loads(meta.read_text())
            steps = doc.get("steps", [])
            every = [f"worker{i}" for i in range(int(doc.get("workers", 2)))]  # in-graph
            ranks = [path.name] if path.name.startswith("worker") else every
            for step in steps:
                for rank in ranks:
                    out[(rank, int(step["step"]))] = float(step["wall_s"])
        for meta in sorted(path.glob("meta_rank*.json")):  # torch: one file per rank
            walls = json.loads(meta.read_text()).get("step_wall_s", [])
            rank = meta.stem.removeprefix("meta_")
            out.update({(rank, i): float(w) for i, w in enumerate(walls)})
    return out


def replay_job(name: str, paths: list[Path], seed: int) -> dict | str:
    """The replay document of one job, or why it cannot be replayed."""
    try:
        job = detect.load(paths)
    except InputError as exc:
        return str(exc)
    if not len(job.trace.timings):
        return "no timed ops"
    try:
        return replay(job, seed=seed)
    except InputError as exc:
        return str(exc)


def pct(x: float) -> str:
    return f"{x * 100:.2f}%"


def summary(steps: list[tuple[str, str, dict]], what: str) -> None:
    """One line of overall figures over `steps`."""
    if not steps:
        print(f"\n{what}: none")
        return
    wall = np.array([abs(s["wall_error"]) for _, _, s in steps])
    busy = np.array([abs(s["replay_error"]) for _, _, s in steps])
    traces = len({name for name, _, _ in steps})
    print(
        f"\n{what} ({len(steps)} steps of {traces} traces): wall-clock median |error| "
        f"{pct(np.median(wall))}, worst {pct(wall.max())}; busy time median "
        f"{pct(np.median(busy))}, worst {pct(busy.max())} "
        f"(targets: median <= {pct(TARGET_MEDIAN)}, worst <= {pct(TARGET_WORST)})"
    )


def recorded(rows: list[tuple[str, str, dict, float]]) -> None:
    """The replay against the step times the generating scripts recorded outside the
    profiler (`recorded_walls`): as it is, and with the client time the trace lacks.

    TF's RunMetadata spans its first to its last record; the script times the whole
    ``session.run`` on the client, which also covers the RunStep RPCs, the tracing
    itself (FULL_TRACE) and the fetch, none of it recorded. That client time is taken,
    like the overheads, as the median over the *other* steps of the rank of (recorded
    time - RunMetadata span), never the step's own. For torch the recorded time is the
    ``ProfilerStep`` itself (client time about 0)."""
    print(
        "\nagainst the step times the generating scripts recorded outside the profiler "
        "(meta*.json; TF: session.run timed on the client, which also covers the RPCs, the "
        "tracing and the fetch outside the RunMetadata's first-to-last record):"
    )
    for trace in dict.fromkeys(n for n, *_ in rows):
        mine = [r for r in rows if r[0] == trace]
        alone = np.array([s["predicted_wall"] / w - 1 for _, _, s, w in mine])
        gaps = np.array([w - s["wall"] for _, _, s, w in mine])
        share = np.median(gaps / np.array([w for *_, w in mine]))
        with_client = []
        for i, (_, rank, step, w) in enumerate(mine):
            others = [g for j, g in enumerate(gaps) if j != i and mine[j][1] == rank]
            client = float(np.median(others)) if others else 0.0
            with_client.append((step["predicted_wall"] + client) / w - 1)
        both = np.abs(np.array(with_client))
        print(
            f"  {trace}: untraced client time median {np.median(gaps) * 1e3:.2f} ms "
            f"({share * 100:.1f}% of the step); replay alone median |error| "
            f"{pct(np.median(np.abs(alone)))}, worst {pct(np.abs(alone).max())} (median "
            f"signed {np.median(alone) * 100:+.1f}%); with the other steps' client time "
            f"median {pct(np.median(both))}, worst {pct(both.max())}"
        )


def baseline(judged: list[tuple[str, str, dict]]) -> None:
    """The replay against a baseline with no model: each step predicted by the median
    wall-clock time of its rank's other judged steps. How far a trace's steps differ
    from one another bounds what the other steps can say of one: where the baseline
    misses by tens of percent, a step's own records carry the prediction. Printed for
    the traces whose replay misses a step by more than the target."""
    by_rank: dict[tuple[str, str], list[dict]] = {}
    for name, rank, step in judged:
        by_rank.setdefault((name, rank), []).append(step)
    errors: dict[str, list[tuple[float, float]]] = {}
    for (name, _), steps in by_rank.items():
        walls = np.array([s["wall"] for s in steps])
        for i, step in enumerate(steps):
            if len(steps) > 1:
                guess = float(np.median(np.delete(walls, i)))
                errors.setdefault(name, []).append(
                    (abs(step["wall_error"]), abs(guess / walls[i] - 1))
                )
    pairs = [p for v in errors.values() for p in v]
    if not pairs:
        return
    better = sum(r < b for r, b in pairs)
    print(
        "\nagainst a baseline with no model (each step predicted by the median wall-clock "
        f"time of its rank's other judged steps): the replay is closer on {better} of "
        f"{len(pairs)} judged steps; on the traces it misses a step by more than "
        f"{pct(TARGET_WORST)}:"
    )
    for name, v in errors.items():
        replay_err, base_err = np.array(v).T
        if replay_err.max() > TARGET_WORST:
            print(
                f"  {name}: replay median {pct(np.median(replay_err))}, worst "
                f"{pct(replay_err.max())}; baseline median {pct(np.median(base_err))}, worst "
                f"{pct(base_err.max())}"
            )


def host_clock(judged: list[tuple[str, str, dict]]) -> None:
    """The judged steps of GPU ranks timed on their CPU's range as well (``cpu_wall``):
    what the training loop's own clock reads, beside the device's step the judgement
    takes. Printed, not judged: a plan moves device work, and the replay holds a CPU
    op that waited for the device (a sync, a copy) at its observed duration; on an
    input-bound job (`param/resnet_kineto`) it is the iteration a user feels."""
    rows = [(n, s) for n, _, s in judged if s.get("cpu_wall_error") is not None]
    if not rows:
        return
    print(
        "\nGPU ranks' judged steps timed on their CPU range too (the host loop's clock; "
        "printed, not judged):"
    )
    for trace in dict.fromkeys(n for n, _ in rows):
        cpu = np.abs([s["cpu_wall_error"] for n, s in rows if n == trace])
        device = np.abs([s["wall_error"] for n, s in rows if n == trace])
        walls = [s["cpu_wall"] / s["wall"] for n, s in rows if n == trace]
        print(
            f"  {trace}: {len(cpu)} steps, CPU range median |error| {pct(np.median(cpu))}, "
            f"worst {pct(cpu.max())} (device step {pct(np.median(device))} / "
            f"{pct(device.max())}); CPU range / device step {min(walls):.2f}-{max(walls):.2f}"
        )


def cover_of(step: dict) -> float:
    """Share of the step's wall-clock time in which some traced op of the rank runs
    (the replay's ``cover``: on a GPU rank its CPU's records count too)."""
    return float(step["cover"])


def exclusion(step: dict) -> str:
    """Why a step is left out of the judgement ("" when it is judged): only a defect of
    the trace itself, a step whose records cover less than `MIN_COVER` of its wall-clock
    time (what the step spent its time on is not in the trace: a replay of its ops
    cannot predict it). A large error alone never excludes a step."""
    if cover_of(step) < MIN_COVER:
        return (
            f"records cover less than {MIN_COVER:.0%} of the step's wall-clock time: what "
            "it spent its time on is not in the trace"
        )
    return ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="Only traces whose name contains this.")
    args = parser.parse_args()
    if not SHARED.is_dir():
        print(f"{SHARED} is not available")
        return 2
    rows = []
    steps_all: list[tuple[str, str, dict]] = []
    partial: list[tuple[str, str, dict]] = []
    skipped: list[tuple[str, str]] = []
    rec_rows: list[tuple[str, str, dict, float]] = []
    for name, paths in generated_jobs() + public_jobs() + repo_jobs():
        if args.only not in name:
            continue
        start = time.perf_counter()
        doc = replay_job(name, paths, args.seed)
        took = time.perf_counter() - start
        if isinstance(doc, str):
            skipped.append((name, doc))
            continue
        wall, busy, cover, n = [], [], [], 0
        walls = recorded_walls(paths)
        for rank in doc["ranks"]:
            for step in rank["steps"]:
                if step.get("partial"):
                    partial.append((name, rank["rank"], step))
                    continue
                n += 1
                key = (rank["rank"], step["iteration"])
                if key in walls:
                    rec_rows.append((name, rank["rank"], step, walls[key]))
                wall.append(abs(step["wall_error"]))
                busy.append(abs(step["replay_error"]))
                cover.append(cover_of(step))
                steps_all.append((name, rank["rank"], step))
        if not n:
            skipped.append((name, "no complete step"))
            continue
        own = any(s["overhead_from"] == "own step" for r in doc["ranks"] for s in r["steps"])
        excluded = sum(bool(exclusion(s)) for x, _, s in steps_all if x == name) * (not own)
        rows.append(
            (name, n, excluded, np.median(wall), max(wall), np.median(busy), max(busy),
             np.median(cover), own, took, "shared_core" in doc)
        )  # fmt: skip

    width = max((len(r[0]) for r in rows), default=10)
    print(
        f"{'trace':<{width}}  steps  excl  wall med  wall worst  busy med  busy worst  cover   time"
    )
    for name, n, excluded, wm, ww, bm, bw, cv, own, took, core in rows:
        print(
            f"{name:<{width}}  {n:>5}  {excluded:>4}  {pct(wm):>8}  {pct(ww):>10}  {pct(bm):>8}  "
            f"{pct(bw):>10}  {cv * 100:4.0f}%  {took:>5.1f}s{'  (1 step: own overheads)' * own}"
            f"{'  (one core shared by its processes)' * core}"
        )
    if not steps_all:
        print("no step replayed")
        return 1
    print(
        "\nexcl: steps excluded from the judgement (below). "
        "cover: median share of the step's wall-clock time in which some traced op runs. "
        "A rank with one step has no other step to take overheads from: its replay uses its "
        "own (it reproduces the step by construction) and is left out of the figures below. "
        "One core shared by its processes: replayed on one processor shared evenly "
        "(planner/host.py), as its records show the processes never ran faster than one core."
    )
    steps_all = [x for x in steps_all if x[2]["overhead_from"] == "other steps"]
    summary(steps_all, "all steps replayed from the other steps' overheads")
    judged, excluded = [], []
    for name, rank, step in steps_all:
        why = exclusion(step)
        (excluded if why else judged).append((name, rank, step, why))
    judged_steps = [(n, r, s) for n, r, s, _ in judged]
    summary(judged_steps, "of them, the steps judged (the excluded ones below left out)")
    named = [x for x in judged_steps if not x[0].startswith(REPO_PREFIX)]
    summary(named, "  of those, the traces of ../shared/traces (the set #16 names)")
    summary(
        [x for x in judged_steps if x[0].startswith(REPO_PREFIX)],
        "  and the jobs recorded for this project (traces/, judged as well)",
    )
    summary(
        [x for x in judged_steps if any(f"/{job}/" in x[0] for job in PINNED_TF)],
        "    of those, the pinned TF jobs (1 ps + 1 worker, each process on its own core)",
    )
    if excluded:
        print(f"\n{len(excluded)} step(s) excluded for a defect of the trace itself:")
        for trace in dict.fromkeys(n for n, *_ in excluded):
            mine = [x for x in excluded if x[0] == trace]
            worst_one = max(abs(s["wall_error"]) for _, _, s, _ in mine)
            covers = [cover_of(s) for _, _, s, _ in mine]
            print(
                f"  {trace}: {len(mine)} step(s), worst wall {pct(worst_one)}, cover "
                f"{min(covers):.0%}-{max(covers):.0%}; {mine[0][3]}"
            )
    wall = np.array([abs(s["wall_error"]) for _, _, s in judged_steps or steps_all])
    busy = np.array([abs(s["replay_error"]) for _, _, s in judged_steps or steps_all])
    baseline(judged_steps)
    host_clock(judged_steps)
    if rec_rows:
        recorded(rec_rows)
    for key, what, among, of in (
        ("wall_error", "wall-clock", judged_steps, ""),
        ("replay_error", "busy time", judged_steps, ""),
        ("wall_error", "wall-clock", named, " of ../shared/traces"),
        ("replay_error", "busy time", named, " of ../shared/traces"),
    ):
        print(f"\nfive worst judged steps{of} ({what} error):")
        worst = sorted(among, key=lambda x: -abs(x[2][key]))[:5]
        for name, rank, step in worst:
            print(
                f"  {name} {rank} step {step['iteration']}: wall "
                f"{step['wall_error'] * 100:+.2f}%, busy {step['replay_error'] * 100:+.2f}%; "
                f"cause: {step.get('busy_cause' if key == 'replay_error' else 'cause') or '-'}"
            )
    if partial:
        print(f"\n{len(partial)} partial step(s) left out:")
        for name, rank, step in partial:
            print(f"  {name} {rank} step {step['iteration']}: {step['partial']}")
    if skipped:
        print(f"\n{len(skipped)} file(s) not replayable:")
        for name, why in skipped:
            print(f"  {name}: {why}")
    ok = np.median(wall) <= TARGET_MEDIAN and wall.max() <= TARGET_WORST
    ok &= np.median(busy) <= TARGET_MEDIAN and busy.max() <= TARGET_WORST
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
