"""Peer check: planner's communication time and overlap against Holistic Trace Analysis.

On every multi-rank GPU trace under ../shared/traces/public (a Kineto trace with GPU
kernels whose ``distributedInfo.world_size`` is > 1 or that runs NCCL kernels; the
files of one folder are the ranks of one job; ``_history`` copies are left out), this
prints, per rank and per step, planner's Caramel §3.1 figures (`planner.measure.allreduce`:
N, C, alpha) beside HTA 0.5.0's, and the relative difference; a difference over 5%
is flagged with ``!``. A trace that either tool cannot read is a row saying why.

What is compared (docs/formats.md, "Peer check against HTA", says the same):

- ``comm``: planner's N = the union of the rank's collective spans in the step, its
  waits for later ranks included, as HTA's kernel time holds them (``wait pl``: the
  part of N this rank spent waiting, `planner.model.waits`);
  HTA's = the union of its communication kernels (``get_kernel_type`` ==
  COMMUNICATION, i.e. "nccl" in the kernel name) in the step, merged by HTA's own
  ``merge_kernel_intervals`` over its trace frame (``iteration`` column). The rank row
  (step ``all``) sums planner's steps and takes HTA over the whole trace.
- ``comp``: planner's C = the union of the rank's GPU compute ops (all compute ops
  on a rank without GPU ops); HTA's = the union of COMPUTATION kernels (not
  communication, not memcpy/memset) — per rank, ``get_temporal_breakdown``'s
  ``compute_time``.
- ``ovl``: the fraction of communication time overlapped by computation. HTA's
  ``get_comm_comp_overlap`` is exactly that, per rank over the whole trace. Planner's
  alpha = (N + C - busy) / min(N, C) is the overlap divided by the *smaller* of N and C,
  so planner's comparable figure is ``alpha * min(N, C) / N``; both are printed
  (``alpha`` column): they agree when N <= C and differ when communication dominates.
  Two overlap fractions both under 1% count as equal.

HTA runs with ``include_last_profiler_step=True`` so that both tools cover the same
steps (HTA drops the last step by default), and with its correlation column widened to
int64 (`widen_hta_correlation`: HTA 0.5.0 fails under pandas >= 3 otherwise). HTA is bench-only:
``pip install -e '.[bench]'`` (holistictraceanalysis 0.5.0).

Usage: nice python bench/bench_vs_hta.py [--root DIR] [--json FILE] [JOB_DIR ...]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import re
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1] / "shared" / "traces" / "public"
THRESHOLD = 0.05
NEGLIGIBLE = 0.01
_WORLD = re.compile(rb'"world_size"\s*:\s*(\d+)')
_KERNEL = re.compile(rb'"cat"\s*:\s*"kernel"')
_NCCL = re.compile(rb'"name"\s*:\s*"nccl(?:Dev)?Kernel_', re.IGNORECASE)
_RANK_DIGITS = re.compile(r"(\d+)$")


# ----------------------------------------------------------------------------- jobs


def is_multirank_gpu(path: Path) -> bool:
    """A Kineto trace with GPU kernels of a job of several ranks (or NCCL kernels)."""
    from planner.ingest import kineto
    from planner.ingest.files import read_bytes, read_head

    try:
        if not kineto.is_kineto(read_head(path)):
            return False
        data = read_bytes(path)
    except Exception:  # an unreadable file is no job to compare
        return False
    if not _KERNEL.search(data):
        return False
    world = _WORLD.search(data[: 1 << 16])
    return bool(world and int(world.group(1)) > 1) or bool(_NCCL.search(data))


def find_jobs(root: Path) -> list[list[Path]]:
    """The multi-rank GPU traces under `root`, grouped by folder (one job per folder)."""
    by_folder: dict[Path, list[Path]] = defaultdict(list)
    for path in sorted(root.rglob("*")):
        if "_history" in path.parts or not path.is_file():
            continue
        if path.name.endswith((".json", ".json.gz")) and is_multirank_gpu(path):
            by_folder[path.parent].append(path)
    return [files for _, files in sorted(by_folder.items())]


# ----------------------------------------------------------------------------- planner


def planner_figures(files: list[Path]) -> dict[int, dict[Any, dict[str, float]]]:
    """Rank -> step -> C, N, alpha, overlap and the rank's wait for its peers in
    collectives (seconds) from planner's library."""
    from planner.ingest import detect
    from planner.measure import allreduce

    job = detect.load(files)
    try:  # where planner splits a collective into waiting and transferring
        steps_doc = allreduce.allreduce_metrics(job).get("steps", [])
    except Exception:  # the per-step figures below still stand without the waits
        steps_doc = []
    waits = {(s.get("rank"), s.get("iteration")): s.get("wait") or 0.0 for s in steps_doc}
    out: dict[int, dict[Any, dict[str, float]]] = {}
    for rank in job.ranks:
        found = _RANK_DIGITS.search(rank)
        if found is None:
            continue
        steps = {}
        for m in allreduce.rank_steps(job, rank):
            overlap = m.alpha * min(m.network, m.compute) if m.network and m.compute else 0.0
            steps[m.iteration] = {
                "comm": m.network,
                "wait": float(waits.get((rank, m.iteration), 0.0)),
                "comp": m.compute,
                "overlap": overlap,
                "alpha": m.alpha,
            }
        out[int(found.group(1))] = steps
    return out


# ----------------------------------------------------------------------------- HTA


def _union(intervals: Any) -> float:
    return float((intervals["end"] - intervals["ts"]).sum())


def _intersection(a: Any, b: Any) -> float:
    """Length of the intersection of two sets of disjoint, merged intervals."""
    i = j = 0
    total = 0
    a_s, a_e = a["ts"].tolist(), a["end"].tolist()
    b_s, b_e = b["ts"].tolist(), b["end"].tolist()
    while i < len(a_s) and j < len(b_s):
        lo, hi = max(a_s[i], b_s[j]), min(a_e[i], b_e[j])
        total += max(0, hi - lo)
        if a_e[i] < b_e[j]:
            i += 1
        else:
            j += 1
    return float(total)


def widen_hta_correlation() -> None:
    """Let HTA 0.5.0 run under pandas >= 3. HTA seeds ``index_correlation`` with the
    dtype of the trace's ``correlation`` column (int16 when the ids are small, as on the
    MI300 trace) and then stores row indices in it; pandas >= 3 refuses a value above
    32767 there where older pandas upcast silently. Widening ``correlation`` to int64
    before HTA's transform changes no value."""
    from hta.common import trace as hta_trace

    original = hta_trace.transform_correlation_to_index
    if getattr(original, "widened", False):
        return

    def widened(df: Any, symbol_table: Any) -> Any:
        if "correlation" in df.columns:
            df["correlation"] = df["correlation"].astype("int64")
        return original(df, symbol_table)

    widened.widened = True  # type: ignore[attr-defined]
    hta_trace.transform_correlation_to_index = widened


def hta_figures(files: list[Path]) -> tuple[dict[int, dict[Any, dict[str, float]]], dict]:
    """(rank -> step -> comm, comp, overlap in seconds from HTA's trace frame and kernel
    classes; rank -> HTA's own per-rank API figures)."""
    logging.disable(logging.CRITICAL)
    warnings.filterwarnings("ignore")
    from hta.trace_analysis import TraceAnalysis
    from hta.utils.utils import KernelType, get_kernel_type, merge_kernel_intervals

    widen_hta_correlation()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        analysis = TraceAnalysis(
            trace_files=[str(f) for f in files],
            trace_dir=str(files[0].parent),
            include_last_profiler_step=True,
        )
        overlap = analysis.get_comm_comp_overlap(visualize=False)
        breakdown = analysis.get_temporal_breakdown(visualize=False)
    api: dict[int, dict[str, float]] = {}
    for _, row in overlap.iterrows():
        api.setdefault(int(row["rank"]), {})["overlap"] = row["comp_comm_overlap_pctg"] / 100
    for _, row in breakdown.iterrows():
        api.setdefault(int(row["rank"]), {})["comp"] = row["compute_time(us)"] * 1e-6
    symbols = analysis.t.symbol_table.get_sym_table()
    steps: dict[int, dict[Any, dict[str, float]]] = {}
    for rank, frame in analysis.t.traces.items():
        kernels = frame[frame["stream"].ne(-1)].copy()
        kernels["kind"] = [get_kernel_type(symbols[n]) for n in kernels["name"]]
        compute = kernels["kind"].eq(KernelType.COMPUTATION.name)
        whole = merge_kernel_intervals(kernels[kernels["kind"].eq(KernelType.COMMUNICATION.name)])
        api.setdefault(int(rank), {})["comm"] = _union(whole) * 1e-6
        stepless = int((compute & ~kernels["iteration"].ge(0)).sum())
        per_step: dict[Any, dict[str, Any]] = {}
        for iteration, group in kernels.groupby("iteration"):
            if iteration < 0:
                continue
            comm = merge_kernel_intervals(group[group["kind"].eq(KernelType.COMMUNICATION.name)])
            comp = merge_kernel_intervals(group[group["kind"].eq(KernelType.COMPUTATION.name)])
            known = len(comp) > 0 or not stepless  # else HTA put no compute kernel in a step
            per_step[int(iteration)] = {
                "comm": _union(comm) * 1e-6,
                "comp": _union(comp) * 1e-6 if known else None,
                "overlap": _intersection(comm, comp) * 1e-6 if known else None,
                "note": "" if known else f"HTA: {stepless} compute kernels in no step",
            }
        steps[int(rank)] = per_step
    return steps, api


# ----------------------------------------------------------------------------- table


def rel(ours: float | None, theirs: float | None) -> float | None:
    """Relative difference ours/theirs - 1; 0 when both are 0; None when unknown."""
    if ours is None or theirs is None:
        return None
    if theirs == 0:
        return 0.0 if ours == 0 else float("inf")
    return ours / theirs - 1


def rel_overlap(ours: float | None, theirs: float | None) -> float | None:
    """`rel` of two overlap fractions, 0 when both are under NEGLIGIBLE (a relative
    difference of two near-zero fractions says nothing)."""
    if ours is not None and theirs is not None and max(ours, theirs) < NEGLIGIBLE:
        return 0.0
    return rel(ours, theirs)


def _fraction(overlap: float | None, comm: float | None) -> float | None:
    return overlap / comm if overlap is not None and comm else None


def compare(files: list[Path]) -> dict[str, Any]:
    """One job's side-by-side figures, or the reason a tool could not give them."""
    entry: dict[str, Any] = {"job": str(files[0].parent), "files": len(files), "rows": []}
    ours = theirs = api = None
    t0 = time.perf_counter()
    try:
        ours = planner_figures(files)
    except Exception as exc:  # a row saying why, never a crash
        entry["planner_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    entry["planner_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    try:
        theirs, api = hta_figures(files)
    except BaseException as exc:  # HTA asserts and may sys.exit on traces it rejects
        if isinstance(exc, KeyboardInterrupt):
            raise
        entry["hta_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
    entry["hta_s"] = time.perf_counter() - t0
    ours, theirs = ours or {}, theirs or {}  # one tool's figures alone are still shown
    for rank in sorted(set(ours) | set(theirs)):
        mine, peer = ours.get(rank, {}), theirs.get(rank, {})
        for step in sorted(set(mine) | set(peer)):
            entry["rows"].append(_row(rank, step, mine.get(step), peer.get(step)))
        unread = [t for t in ("planner", "hta") if f"{t}_error" in entry]
        note = f"{unread[0]} cannot read it" if unread else ""
        entry["rows"].append(_rank_row(rank, mine, (api or {}).get(rank, {}), note))
    return entry


def _row(rank: int, step: Any, mine: dict | None, peer: dict | None) -> dict[str, Any]:
    mine, peer = mine or {}, peer or {}
    row: dict[str, Any] = {"rank": rank, "step": step}
    notes = [peer.get("note", "")]
    if bool(mine) != bool(peer):
        notes.append("step only in " + ("HTA" if not mine else "planner"))
    for key in ("comm", "comp"):
        row[f"planner_{key}"] = mine.get(key)
        row[f"hta_{key}"] = peer.get(key)
    row["planner_wait"] = mine.get("wait")
    row["planner_ovl"] = _fraction(mine.get("overlap"), mine.get("comm"))
    row["hta_ovl"] = _fraction(peer.get("overlap"), peer.get("comm"))
    row["planner_alpha"] = mine.get("alpha")
    row["note"] = "; ".join(n for n in notes if n)
    return row


def _rank_row(rank: int, mine: dict, api: dict, note: str) -> dict[str, Any]:
    """The whole rank: planner summed over its steps vs HTA over the whole trace (comm:
    the union of its communication kernels; comp: get_temporal_breakdown; ovl:
    get_comm_comp_overlap)."""
    comm = sum(s["comm"] for s in mine.values())
    overlap = sum(s["overlap"] for s in mine.values())
    return {
        "note": note,
        "rank": rank,
        "step": "all",
        "planner_comm": comm if mine else None,
        "planner_wait": sum(s["wait"] for s in mine.values()) if mine else None,
        "hta_comm": api.get("comm"),
        "planner_comp": sum(s["comp"] for s in mine.values()) if mine else None,
        "hta_comp": api.get("comp"),
        "planner_ovl": _fraction(overlap, comm) if mine else None,
        "hta_ovl": api.get("overlap"),
        "planner_alpha": None,
    }


def _ms(value: float | None) -> str:
    return f"{'-':>9}" if value is None else f"{value * 1e3:9.3f}"


def _pct(value: float | None) -> str:
    if value is None:
        return "      -"
    if value == float("inf"):
        return "   inf"
    return f"{value * 100:+6.1f}%"


def _frac(value: float | None) -> str:
    return "    -" if value is None else f"{value:5.3f}"


def render(entries: list[dict[str, Any]]) -> str:
    head = (
        f"{'rank':>4} {'step':>5} | {'N pl':>9} {'wait pl':>9} {'comm HTA':>9} {'diff':>7} | "
        f"{'C pl':>9} {'comp HTA':>9} {'diff':>7} | {'ovl pl':>6} {'ovl HTA':>7} "
        f"{'diff':>7} | {'alpha':>5} flag"
    )
    lines = [
        "Peer check vs HTA 0.5.0 (times in ms; diff of comm = N / HTA - 1, wait = the part "
        "of N spent waiting for later ranks; ovl = "
        f"fraction of comm time overlapped by compute; flag ! = a difference > {THRESHOLD:.0%})"
    ]
    for entry in entries:
        lines.append("")
        lines.append(
            f"== {entry['job']} ({entry['files']} file(s); planner {entry['planner_s']:.1f} s,"
            f" HTA {entry['hta_s']:.1f} s)"
        )
        for tool in ("planner", "hta"):
            if f"{tool}_error" in entry:
                lines.append(f"   {tool} cannot read it: {entry[f'{tool}_error']}")
        if not entry["rows"]:
            continue
        lines.append(head)
        for row in entry["rows"]:
            diffs = [
                rel(row["planner_comm"], row["hta_comm"]),
                rel(row["planner_comp"], row["hta_comp"]),
                rel_overlap(row["planner_ovl"], row["hta_ovl"]),
            ]
            flag = "!" if any(d is not None and abs(d) > THRESHOLD for d in diffs) else ""
            row["flag"] = bool(flag)
            lines.append(
                f"{row['rank']:>4} {row['step']!s:>5} | {_ms(row['planner_comm'])} "
                f"{_ms(row['planner_wait'])} {_ms(row['hta_comm'])} {_pct(diffs[0])} | "
                f"{_ms(row['planner_comp'])} {_ms(row['hta_comp'])} {_pct(diffs[1])} | "
                f"{_frac(row['planner_ovl']):>6} {_frac(row['hta_ovl']):>7} {_pct(diffs[2])} | "
                f"{_frac(row['planner_alpha'])} {flag}"
                f"{'  ' + row['note'] if row.get('note') else ''}"
            )
    flagged = sum(1 for e in entries for r in e["rows"] if r.get("flag"))
    total = sum(len(e["rows"]) for e in entries)
    lines.append("")
    lines.append(f"{flagged} of {total} rows differ by more than {THRESHOLD:.0%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("jobs", nargs="*", type=Path, help="job folders (default: discover)")
    parser.add_argument("--root", type=Path, default=ROOT, help="where to discover jobs")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    if args.jobs:
        jobs = [sorted(p for p in d.iterdir() if is_multirank_gpu(p)) for d in args.jobs]
        jobs = [j for j in jobs if j]
    else:
        if not args.root.exists():
            print(f"{args.root}: not found (the shared traces are needed)", file=sys.stderr)
            return 2
        jobs = find_jobs(args.root)
    entries = []
    for files in jobs:
        print(f"... {files[0].parent}", file=sys.stderr, flush=True)
        entries.append(compare(files))
    print(render(entries))
    if args.json:
        args.json.write_text(json.dumps(entries, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
