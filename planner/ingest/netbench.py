"""All-reduce microbenchmark with real `torch.distributed` processes (Caramel §4.2).

`world_size` processes join a gloo process group on 127.0.0.1 and all-reduce float32
tensors of each size `repeats` times, one after another (sequential aggregation
transfers, as the paper measures), the sizes taken in turn so that a busy spell of the
machine falls on all of them alike. Rank 0 times each call (barrier before it) and
returns one row per size. torch is imported inside the worker only: it is optional.
"""

from __future__ import annotations

import csv
import io
import json
import multiprocessing as mp
import socket
import statistics
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from planner.errors import InputError
from planner.model.oracle import NetworkModel, fit_network_model

DEFAULT_SIZES = tuple(64 * 4**k for k in range(0, 9)) + (4 << 20,)
"""64 B to 4 MiB: 64, 256, ..., 4 MiB (Caramel measures 64 B and 4 MB)."""

CSV_COLUMNS = ("nbytes", "seconds", "seconds_min", "repeats", "world_size", "backend")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def allreduce_pass(tensors: Sequence[Any], turn: int = 0) -> list[float]:
    """One all-reduce of each tensor (in a joined process group), a barrier before each;
    the seconds each took, in the order of `tensors`.

    The pass starts at tensor ``turn % len(tensors)`` and takes the others in turn, so
    that over passes every size samples the machine's states alike (one size after
    another put a busy spell into one size's median). A job's own benchmark can run
    passes between its steps (`bench/bench_ddp_buckets.py`)."""
    import time

    import torch.distributed as dist

    elapsed = [0.0] * len(tensors)
    for i in range(len(tensors)):
        index = (i + turn) % len(tensors)
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(tensors[index])
        elapsed[index] = time.perf_counter() - start
    return elapsed


def rows_of(
    samples: Sequence[tuple[int, Sequence[float]]], world_size: int
) -> list[dict[str, Any]]:
    """One row per size from its timed all-reduces (median, min): `bench_allreduce`'s."""
    return [
        {
            "nbytes": nbytes,
            "seconds": statistics.median(times),
            "seconds_min": min(times),
            "repeats": len(times),
            "world_size": world_size,
            "backend": "gloo",
        }
        for nbytes, times in samples
    ]


def _worker(
    rank: int,
    world_size: int,
    port: int,
    sizes: Sequence[int],
    repeats: int,
    warmup: int,
    queue: Any,
) -> None:
    import torch
    import torch.distributed as dist

    try:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
        )
        torch.set_num_threads(1)
        tensors = [torch.ones(max(1, nbytes // 4), dtype=torch.float32) for nbytes in sizes]
        samples: list[list[float]] = [[] for _ in sizes]
        for k in range(warmup + repeats):
            elapsed = allreduce_pass(tensors, k)
            if k >= warmup:
                for kept, seconds in zip(samples, elapsed, strict=True):
                    kept.append(seconds)
        rows = [(int(t.numel() * 4), s) for t, s in zip(tensors, samples, strict=True)]
        dist.barrier()
        dist.destroy_process_group()
        if rank == 0:
            queue.put(("ok", rows))
    except Exception as exc:  # the parent turns this into one error line
        queue.put(("error", f"rank {rank}: {type(exc).__name__}: {exc}"))


def bench_allreduce(
    sizes: Sequence[int] = DEFAULT_SIZES,
    world_size: int = 2,
    repeats: int = 10,
    warmup: int = 2,
    timeout: float = 300.0,
) -> list[dict[str, Any]]:
    """Measure all-reduce time per message size; one row per size (median, min).

    Sizes are rounded down to whole float32 elements (at least one). Raises
    RuntimeError if a process fails or the run exceeds `timeout` seconds, and
    ImportError when torch is not installed.
    """
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise ImportError("bench-network needs torch (pip install torch==2.13.0 for the CPU wheel)")
    if world_size < 2:
        raise ValueError("world_size must be >= 2")
    if repeats < 1 or not sizes:
        raise ValueError("need at least one size and one repeat")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(
            target=_worker,
            args=(r, world_size, port, list(sizes), repeats, warmup, queue),
            daemon=True,
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    status, payload = "error", "no result"
    try:
        status, payload = _result(queue, procs, timeout)
    finally:
        for p in procs:  # after a failure the others may wait in a collective: stop them
            p.join(timeout=10 if status == "ok" else 0.1)
            if p.is_alive():
                p.terminate()
    if status != "ok":
        raise RuntimeError(str(payload))
    return rows_of(payload, world_size)


def _result(queue: Any, procs: Sequence[Any], timeout: float) -> tuple[str, Any]:
    """The first report on `queue`; RuntimeError as soon as a process has died without
    one (its peers would wait in a collective for gloo's own timeout, 30 min) or after
    `timeout` seconds."""
    import queue as queues
    import time

    deadline = time.monotonic() + timeout
    while True:
        try:
            return queue.get(timeout=min(0.5, max(0.0, deadline - time.monotonic())))
        except queues.Empty:
            pass
        dead = [(rank, p.exitcode) for rank, p in enumerate(procs) if p.exitcode not in (None, 0)]
        if dead:
            rank, code = dead[0]
            raise RuntimeError(
                f"rank {rank} exited with code {code} before the benchmark ended (spawned "
                "processes re-import the caller's main module: call it under "
                "`if __name__ == '__main__':`)"
            )
        if time.monotonic() >= deadline:
            raise RuntimeError(f"all-reduce benchmark gave no result in {timeout:.0f} s")


def to_csv(rows: Sequence[dict[str, Any]]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(CSV_COLUMNS), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({c: row.get(c, "") for c in CSV_COLUMNS})
    return out.getvalue()


def read_csv(text: str, column: str = "seconds") -> tuple[list[float], list[float]]:
    """(nbytes, seconds) from a benchmark CSV (needs columns `nbytes` and `seconds`); the
    seconds from `column` where a row has it (``seconds_min``: the fastest repeat).

    Raises ValueError naming the problem (missing column, non-numeric or negative value).
    """
    reader = csv.DictReader(io.StringIO(text))
    fields = reader.fieldnames or []
    for needed in ("nbytes", "seconds"):
        if needed not in fields:
            raise ValueError(f"CSV has no {needed!r} column (columns: {', '.join(fields)})")
    sizes: list[float] = []
    seconds: list[float] = []
    for line, row in enumerate(reader, start=2):
        try:
            n, s = float(row["nbytes"]), float(row.get(column) or row["seconds"])
        except (TypeError, ValueError):
            raise ValueError(f"line {line}: nbytes and seconds must be numbers") from None
        if n < 0 or s < 0:
            raise ValueError(f"line {line}: negative nbytes or seconds")
        sizes.append(n)
        seconds.append(s)
    return sizes, seconds


def read_model(path: Path) -> NetworkModel:
    """The network model of a benchmark: a CSV from `planner bench-network` (fitted
    here) or a ``planner.network_model/1`` JSON from `planner fit-network --json`.

    The fit is of each size's median (``seconds``); the latency of the fastest calls
    (``seconds_min``) is kept beside it (`NetworkModel.a_fastest`): the median of a few
    blocking calls carries each call's jitter, most of a small one's time, which a
    wire-bound job's pipelined all-reduces do not pay (`buckets.wire_network`).
    Raises InputError naming the file and the problem.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(path, f"cannot read ({exc})") from None
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
            return NetworkModel(float(doc["a"]), float(doc["b"]), float(doc.get("r2", "nan")),
                                int(doc.get("points", 0)))  # fmt: skip
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(path, f"not a planner.network_model/1 document ({exc})") from None
    try:
        sizes, seconds = read_csv(text)
        _, fastest = read_csv(text, "seconds_min")
    except ValueError as exc:
        raise InputError(path, str(exc)) from None
    model = fit_network_model(np.asarray(sizes), np.asarray(seconds))
    if model is None:
        raise InputError(path, "the fit needs at least two distinct message sizes")
    floor = fit_network_model(np.asarray(sizes), np.asarray(fastest))
    if floor is not None and floor.a < model.a:  # the latency of the fastest calls
        model = replace(model, a_fastest=floor.a)
    return model
