"""The closed loop: check a trace taken with enforcement on against its plan.

Per rank and step: the order in which transfers were handed over, whether it equals the
plan's total order, the first departure, and (for all-reduce plans) whether each transfer
was split into its planned depth. Per rank: the fraction of compliant steps and the
measured iteration time, beside the predicted one when a simulator is available.

Where the order comes from:

- a torch.profiler (Kineto) trace with ``planner.transfer:<name>`` ranges (written by
  `planner.enforce.torch_ddp`): the ranges in start order within each ``ProfilerStep#N``;
  chunks = the ``c10d::allreduce_`` ops inside a range;
- any other trace `planner` reads (TF RunMetadata, planner JSON, ...): the planned
  transfers in the order they start, per iteration. A transfer of the traced graph with
  no record in a step (TensorFlow drops a RecvTensor record now and then) is listed as
  unrecorded and the step's order is checked without it.

A Caramel group stands for its traced ops (``transfers`` in the bucket plan): it starts
when the first of them starts.

A planned transfer that never ran in any traced step of a rank is unmatched: it is
listed (``unmatched``), left out of the order check, and `verify` is not passed
(``matched`` false; the CLI exits 1). Compliance counts matched transfers only, and a
rank with no matched transfer is never compliant.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import networkx as nx

from planner.enforce.plan_file import TransferPlan, load_plan
from planner.errors import InputError
from planner.ingest.demos import named
from planner.model.plan import Plan, read_of
from planner.model.trace import Job, busy_time
from planner.prediction.enforced import is_read, read_groups

TRANSFER_PREFIX = "planner.transfer:"
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_COLLECTIVE_CALL = re.compile(r"^c10d::all_?reduce_?$")


@dataclass(frozen=True)
class StepOrder:
    """The transfers of one step of one rank, in hand-over order."""

    rank: str
    iteration: int
    order: tuple[str, ...]
    duration: float  # seconds
    chunks: tuple[int, ...] = ()  # per transfer in `order`; empty when unknown
    unrecorded: tuple[str, ...] = ()  # planned transfers that ran but left no record
    busy: float | None = None  # seconds some op of the rank ran (span less idle), if known


@dataclass(frozen=True)
class Departure:
    """Where a step first departs from the plan."""

    position: int
    expected: str | None
    observed: str | None


def first_departure(order: Sequence[str], plan: Sequence[str]) -> Departure | None:
    """The first position where `order` differs from `plan` (None when equal)."""
    for i, (seen, want) in enumerate(zip(order, plan, strict=False)):
        if seen != want:
            return Departure(i, want, seen)
    if len(order) != len(plan):
        i = min(len(order), len(plan))
        return Departure(i, plan[i] if i < len(plan) else None,
                         order[i] if i < len(order) else None)  # fmt: skip
    return None


# ------------------------------------------------------------------ reading the traces


def _kineto_steps(path: Path) -> tuple[str, list[StepOrder]] | None:
    """Steps of a Kineto trace with planner.transfer ranges; None if it has none."""
    from planner.ingest import kineto

    doc = kineto.read_document(path)
    if isinstance(doc, list):
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return None
    info = doc.get("distributedInfo") if isinstance(doc.get("distributedInfo"), dict) else {}
    rank = f"rank{info['rank']}" if isinstance(info.get("rank"), int) else path.stem.split(".")[0]
    steps, marks, calls = [], [], []
    for e in doc["traceEvents"]:
        if not isinstance(e, dict) or e.get("ph") != "X" or "ts" not in e:
            continue
        name = str(e.get("name", ""))
        span = (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), e.get("tid"))
        if found := _STEP.match(name):
            steps.append((int(found[1]), *span))
        elif name.startswith(TRANSFER_PREFIX):
            marks.append((span, name[len(TRANSFER_PREFIX) :]))
        elif _COLLECTIVE_CALL.match(name):
            calls.append(span)
    if not marks:
        return None
    out = []
    for number, start, end, _tid in sorted(steps, key=lambda s: s[1]):
        inside = sorted((m for m in marks if start <= m[0][0] <= end), key=lambda m: m[0][0])
        chunks = tuple(
            sum(1 for c in calls if c[2] == s[2] and s[0] <= c[0] <= s[1]) for s, _ in inside
        )
        order = tuple(n for _, n in inside)
        out.append(StepOrder(rank, number, order, (end - start) * 1e-6, chunks))
    return rank, out


def _job_steps(job: Job, plans: dict[str, TransferPlan]) -> list[StepOrder]:
    """Steps of any trace `planner` ingests: planned transfers by start time."""
    by_step = dict(iter(job.trace.timings.groupby(["rank", "iteration"], sort=False)))
    out = []
    for row in job.trace.spans.itertuples(index=False):
        plan = plans.get(row.rank) or plans.get("*")
        step = by_step.get((row.rank, row.iteration))
        if plan is None or step is None:
            continue
        busy = busy_time(step["start"].to_numpy(), step["duration"].to_numpy()) * 1e-9
        graph = job.graphs.get(row.rank)
        alias = _aliases(plan, graph)
        mine = step[step["op"].isin(set(alias))]
        if job.framework == "tensorflow":  # a recv is issued at the step's start: by arrival
            mine = mine.assign(arrived=mine["start"] + mine["duration"])
            mine = mine.sort_values(["arrived", "op"])
        else:
            mine = mine.sort_values(["start", "op"])
        order = tuple(dict.fromkeys(alias[o] for o in mine["op"]))  # a group: its first op
        ops = graph.ops if graph is not None else {}
        seen = set(order)
        unrecorded = tuple(
            t.name
            for t in plan.transfers
            if t.name not in seen and any(o in ops for o in (t.ops or (t.name,)))
        )
        out.append(StepOrder(row.rank, int(row.iteration), order,
                             (row.end - row.start) * 1e-9, (), unrecorded, busy))  # fmt: skip
    return out


def _aliases(plan: TransferPlan, graph: Any) -> dict[str, str]:
    """traced op name -> planned transfer (a group's ops, else the transfer's own name).

    A planned DDP bucket matches a traced op only when it carries the same bytes, so a
    plan made for another model matches nothing.
    """
    ops = graph.ops if graph is not None else {}
    out = {}
    for t in plan.transfers:
        names = t.ops or (t.name,)
        sizes = [b.nbytes for b in t.buckets] if len(t.buckets) == len(names) else []
        for i, name in enumerate(names):
            if sizes and (name not in ops or ops[name].nbytes != sizes[i]):
                continue
            out[name] = t.name
    return out


def run_graph(paths: Sequence[Path], read: Collection[str] = ()) -> nx.DiGraph | None:
    """The DAG of the traced run's own GraphDef (`tf_graph.node_dag`): a TF run traced
    by the lab, or by a job that saves its client graph beside its RunMetadata, keeps
    the rewritten graph it ran, with the waits the export put in. None without a
    GraphDef among `paths`. The files in `read` (the job's sources: its RunMetadata)
    are not opened again."""
    from planner.export.tf_graph import node_dag
    from planner.ingest import detect
    from planner.ingest.tf_graphdef import parse_graphdef

    done = {Path(s).resolve() for s in read}
    found: nx.DiGraph | None = None
    for path, _ in detect.expand(paths):
        if path.resolve() in done:
            continue
        item = detect.sniff(path)
        if item.format in ("graphdef", "graphdef_text"):
            dag = node_dag(parse_graphdef(item.data, path, item.format == "graphdef_text"))
            found = dag if found is None else nx.compose(found, dag)
    return found


def enforced_pieces(reads: Sequence[str], dag: nx.DiGraph | None) -> tuple[list[list[str]], int]:
    """`reads` (a rank's planned reads in plan order) cut where the run's graph (`dag`,
    `run_graph`) has no path from one to the next, and how many of those cuts the graph
    orders the other way round. The export leaves out an edge that would close a cycle
    (``--drop-cyclic``: the plan put a read before one the graph already makes it wait
    for); the run then orders each piece (arrival: the next read waits for a marker of
    the previous one, or for a node that waits for it), not the pieces among
    themselves. Left whole (the plan's order checked as it is) without a graph, and
    where it holds fewer than half of the plan's waits: a run without enforcement (its
    graph may order a read or two by itself) or one enforcing another plan."""
    planned = list(zip(reads[:-1], reads[1:], strict=True))
    if dag is None or not planned:
        return [list(reads)], 0
    path = lambda u, v: u in dag and v in dag and nx.has_path(dag, u, v)  # noqa: E731
    held = [path(u, v) for u, v in planned]
    if sum(held) < len(planned) / 2:
        return [list(reads)], 0
    pieces = [[reads[0]]]
    for (_, v), kept in zip(planned, held, strict=True):
        if kept:
            pieces[-1].append(v)
        else:
            pieces.append([v])
    against = sum(path(v, u) for (u, v), kept in zip(planned, held, strict=True) if not kept)
    return pieces, against


def read_steps(
    plan_path: Path, traces: Sequence[Path]
) -> tuple[dict[str, TransferPlan], list[StepOrder], Job | None]:
    """Plans by rank (``*`` for all), the steps of every trace, and the ingested job of
    the traces without planner.transfer ranges (None when all have them)."""
    job = None
    steps: list[StepOrder] = []
    rest: list[Path] = []
    for path in traces:
        found = None
        if path.is_file() and (path.suffix == ".json" or path.name.endswith(".json.gz")):
            try:
                found = _kineto_steps(path)
            except InputError:
                found = None
        if found is None:
            rest.append(path)
        else:
            steps.extend(found[1])
    plans: dict[str, TransferPlan] = {}
    ranks = sorted({s.rank for s in steps})
    for rank in ranks:
        plans[rank] = _plan_for(plan_path, rank)
    if rest:
        from planner.ingest import detect

        job = detect.load(rest)
        for rank in job.ranks:
            plans[rank] = _plan_for(plan_path, rank)
        steps.extend(_job_steps(job, plans))
    if not steps:
        raise InputError(traces[0] if traces else None, "no steps with planned transfers found")
    return plans, steps, job


def _plan_for(path: Path, rank: str) -> TransferPlan:
    try:
        return load_plan(path, rank)
    except InputError as exc:
        if "no rank" not in str(exc):
            raise
        return load_plan(path)  # a plan for every rank alike (e.g. all-reduce groups)


def enforced_order(order: Sequence[str]) -> list[str]:
    """`order` as the export enforces it: each read's transfers (`read_of`) together, at
    the first place any of them has (`enforced.read_groups`, as the replay groups them);
    an order of other transfers (each its own read) as it is."""
    index = {name: i for i, name in enumerate(order)}
    return [order[i] for group in read_groups(order, index) for i in group]


def ordered(transfer: str) -> bool:
    """Whether the export orders `transfer`, so that `verify` checks its place: on a TF
    job only the reads of PS variables (`enforced.is_read`): a value the PS computed
    (``recv:truediv``, the loss) and a gradient sent are in no chain of the export, and
    their place in a run is the runtime's; every transfer of another job."""
    if transfer.startswith("send:"):
        return False
    return not transfer.startswith("recv:") or is_read(transfer)


def _units(order: Sequence[str]) -> list[str]:
    """The first transfer of each read of `order` (`read_of`), in order."""
    first: dict[str, str] = {}
    for name in order:
        first.setdefault(read_of(name), name)
    return list(first.values())


# ------------------------------------------------------------------ the check


def predict_orders(
    job: Job, rank: str, orders: Mapping[str, Sequence[str]], samples: int = 1
) -> dict[str, float]:
    """Predicted iteration time (s) of each total transfer order on `rank`'s DAG.

    A sender counter lets transfer k go only after transfer k-1, so an order is
    simulated as priorities plus the chain of control edges it implies
    (`planner.prediction.event_loop`, with its prediction oracle: the mean of the traced runs).
    """
    from planner.model.oracle import mean_of_runs
    from planner.model.trace import with_dedicated
    from planner.prediction import event_loop
    from planner.prediction.compiled import compile_graph

    graph = job.graphs[rank]
    compiled = compile_graph(graph)  # once for every order
    frame = with_dedicated(job.trace, {rank: graph})
    oracle = mean_of_runs(graph, frame[frame["rank"] == rank])
    out = {}
    for label, order in orders.items():
        known = [n for n in order if n in graph.ops]
        plan = Plan(
            algorithm=label,
            rank=rank,
            priority={n: i for i, n in enumerate(known)},
            order=tuple(known),
            control_edges=tuple(zip(known[:-1], known[1:], strict=True)),
        )
        run = event_loop.simulate(
            graph, oracle, plan, samples=samples, record=False, compiled=compiled
        )
        out[label] = float(run.makespan.mean())
    return out


def verify(plan_path: str | Path, traces: Sequence[str | Path]) -> dict[str, Any]:
    """`planner.verify/1`: per rank the fraction of steps in plan order, the first
    departure, depth mismatches, and measured (vs predicted) iteration time."""
    plan_path = Path(plan_path)
    paths = [named(t) for t in traces]
    plans, steps, job = read_steps(plan_path, paths)
    dag = None
    if job is not None and job.framework == "tensorflow":  # the graph it ran, if kept
        dag = run_graph(paths, job.sources)
    notes: list[str] = []
    step_docs: list[dict[str, Any]] = []
    ranks: list[dict[str, Any]] = []
    for rank in sorted({s.rank for s in steps}):
        plan = plans.get(rank) or plans["*"]
        mine = sorted((s for s in steps if s.rank == rank), key=lambda s: s.iteration)
        ranks.append(_check_rank(rank, plan, mine, job, notes, step_docs, dag))
    first_plan = next(iter(plans.values()))
    return {
        "schema": "planner.verify/1",
        "plan": str(plan_path),
        "algorithm": first_plan.algorithm,
        "transfers": len(first_plan),
        "traces": [str(t) for t in traces],
        "compliance": min(r["compliance"] for r in ranks),
        "matched": all(r["matched"] for r in ranks),
        "unmatched": [{"rank": r["rank"], "transfer": n} for r in ranks for n in r["untraced"]],
        "ranks": ranks,
        "steps": step_docs,
        "notes": notes
        + (
            []
            if any(r["predicted_iteration_time"] is not None for r in ranks)
            else [
                "no prediction: the plan carries no predicted_iteration_time and its "
                "transfers are not ops of the traced graph; measured times only"
            ]
        ),
    }


def _check_rank(
    rank: str,
    plan: TransferPlan,
    mine: Sequence[StepOrder],
    job: Job | None,
    notes: list[str],
    step_docs: list[dict[str, Any]],
    dag: nx.DiGraph | None = None,
) -> dict[str, Any]:
    """The verify entry of one rank: its steps `mine` (in iteration order) checked
    against `plan` as far as the run's graph chains it (`dag`, `enforced_pieces`),
    their documents appended to `step_docs` and notes on planned transfers that matched
    nothing and on a chain cut to `notes`."""
    depth = {t.name: t.depth for t in plan.transfers}
    traced = {n for s in mine for n in s.order}
    expected = [n for n in enforced_order(plan.order) if n in traced]
    # a read's control message leaves with its data: traced where the data is
    seen = {read_of(n) for n in traced}
    untraced = [n for n in plan.order if read_of(n) not in seen]
    if untraced:
        notes.append(
            f"{rank}: {len(untraced)} of {len(plan)} planned transfer(s) matched nothing "
            f"in the traced steps and are not checked (e.g. {untraced[0]!r}: a trace "
            "without enforcement, a plan for another run, or pruned by the run's fetches)"
        )
    reads = [read_of(n) for n in _units([n for n in expected if ordered(n)])]
    pieces, against = enforced_pieces(reads, dag)
    if len(pieces) > 1:
        notes.append(
            f"{rank}: the run's graph chains the plan's {len(reads)} reads in {len(pieces)} "
            f"pieces: {len(pieces) - 1} of the plan's {len(reads) - 1} waits are not in it "
            f"({against} of them ordered the other way by the graph itself), left out by "
            "the export (--drop-cyclic); each piece's order is checked, not the order "
            "between pieces"
        )
    first: dict[str, Any] | None = None
    compliant = 0
    for s in mine:
        doc, violation = _check_step(rank, s, expected, depth, pieces)
        compliant += violation is None
        step_docs.append(doc)
        if violation is not None and first is None:
            first = violation
    times = [s.duration for s in mine]
    measured = sum(times) / len(times)
    busy = [s.busy for s in mine if s.busy is not None]
    measured_busy = sum(busy) / len(busy) if len(busy) == len(mine) else None
    predicted = plan.predicted_iteration_time
    reference = measured
    if predicted is None and job is not None and rank in job.graphs:
        try:
            predicted = predict_orders(job, rank, {"plan": enforced_order(plan.order)})["plan"]
        except InputError:  # the order against the run's own edges (e.g. arrival markers)
            notes.append(f"{rank}: no prediction: the plan's order closes a cycle with the "
                         "traced graph's edges")  # fmt: skip
        reference = measured_busy or measured  # the simulator predicts busy time
    return {
        "rank": rank,
        "steps": len(mine),
        "compliant_steps": compliant,
        "compliance": compliant / len(mine),
        "checked_transfers": len(expected),
        "enforced_pieces": len(pieces),
        "planned_transfers": len(plan),
        "matched": not untraced,
        "untraced": untraced,
        "first_violation": first,
        "measured_iteration_time": measured,
        "measured_iteration_time_min": min(times),
        "measured_busy_time": measured_busy,
        "predicted_iteration_time": predicted,
        "replay_error": (predicted / reference - 1) if predicted else None,
    }


def _check_step(
    rank: str,
    s: StepOrder,
    expected: Sequence[str],
    depth: Mapping[str, int],
    pieces: Sequence[Sequence[str]],
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The verify document of step `s` and, unless it is compliant (each of `pieces` of
    the reads in the order of the `expected` transfers, each transfer split into its
    planned `depth`), its first violation."""
    want = [read_of(n) for n in _units([n for n in expected if n not in s.unrecorded
                                         and ordered(n)])]  # fmt: skip
    seen = [read_of(n) for n in _units([n for n in s.order if ordered(n)])]
    gone = None
    for piece in pieces:
        inside = set(piece)
        gone = first_departure([r for r in seen if r in inside], [r for r in want if r in inside])
        if gone is not None:
            break
    wrong_depth = [
        {"transfer": n, "depth": depth.get(n, 1), "chunks": c}
        for n, c in zip(s.order, s.chunks, strict=False)
        if n in depth and c != depth[n]
    ]
    ok = gone is None and not wrong_depth and bool(expected)
    doc: dict[str, Any] = {
        "rank": rank,
        "iteration": s.iteration,
        "in_plan_order": gone is None,
        "depth_as_planned": not wrong_depth,
        "duration": s.duration,
        "order": list(s.order),
    }
    if s.unrecorded:
        doc["unrecorded"] = list(s.unrecorded)
    if gone is not None:
        doc["departure"] = vars(gone)
    if wrong_depth:
        doc["depth_mismatch"] = wrong_depth
    if ok:
        return doc, None
    return doc, {"iteration": s.iteration, **(vars(gone) if gone else {}),
                 **({"depth_mismatch": wrong_depth[0]} if wrong_depth else {})}  # fmt: skip
