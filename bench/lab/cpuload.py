"""CPU time that processes other than the lab's own used while it measured.

From /proc only (no dependency): the machine's busy time (``/proc/stat``: user, nice,
system; irq and softirq apart, since the lab's own loopback traffic is handled there and
charged to no process) less the CPU time of the lab's process tree (this process and
every descendant: utime + stime + cutime + cstime of each live one, so that a reaped
child's time is counted once, in its parent) and of kernel threads. What remains is
foreign: other users' tests, builds, editors. Per phase, and per sample interval so that
the blocks of a measurement can be judged one by one.

Foreign CPU time says how busy the machine was, not how much the job suffered from it:
the job's own threads' run-queue wait (``/proc/<pid>/task/<tid>/schedstat``, the time
they were ready to run but had no core) says that, and is recorded beside it
(``own_wait_cores``: thread-seconds waited per second).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")
KTHREADD = 2


def _stat_fields(pid: str) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # fields from `state` (field 3) on


def machine() -> dict[str, float]:
    """Seconds of CPU time since boot, all CPUs: busy (user+nice+system), irq (irq +
    softirq), steal, idle (idle + iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return {
        "busy": (user + nice + system) / HZ,
        "irq": (irq + softirq) / HZ,
        "steal": steal / HZ,
        "idle": (idle + iowait) / HZ,
    }


def _run_delay(pid: int) -> float:
    """Seconds the threads of `pid` have waited on a run queue (live threads only)."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tasks:
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1])
    return total / 1e9


def processes(root: int) -> tuple[float, float, dict[int, float]]:
    """(CPU seconds of `root`'s tree, CPU seconds of kernel threads, run-queue wait of
    each of the tree's processes but `root`), live processes."""
    parent: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry.name)
        if fields is None:
            continue
        pid = int(entry.name)
        parent[pid] = int(fields[1])
        utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
        times[pid] = (utime + stime + cutime + cstime) / HZ
    own = kernel = 0.0
    wait: dict[int, float] = {}
    for pid, seconds in times.items():
        p, chain = pid, 0
        while p not in (0, 1, root, KTHREADD) and chain < 64:
            p, chain = parent.get(p, 0), chain + 1
        if p == root or pid == root:
            own += seconds
            if pid != root:  # the lab's own threads (this sampler) are not the job
                wait[pid] = _run_delay(pid)
        elif p == KTHREADD or pid == KTHREADD:
            kernel += seconds
    return own, kernel, wait


def snapshot(root: int | None = None) -> dict[str, float]:
    """The machine's counters and the lab's tree's at one instant (monotonic time `t`)."""
    own, kernel, wait = processes(root or os.getpid())
    return {"t": time.monotonic(), **machine(), "own": own, "kernel": kernel, "waits": wait}


def _waited(a: dict, b: dict) -> float:
    """Run-queue wait of the processes alive at both snapshots, between them."""
    return sum(max(b["waits"][p] - a["waits"][p], 0.0) for p in a["waits"] if p in b["waits"])


def between(a: dict, b: dict, waited: float | None = None) -> dict[str, float]:
    """Foreign CPU over [a, b]: seconds and cores (seconds per second of wall time);
    `waited`: the job's run-queue wait when summed over the samples in between."""
    wall = max(b["t"] - a["t"], 1e-9)
    foreign = (b["busy"] - a["busy"]) - (b["own"] - a["own"]) - (b["kernel"] - a["kernel"])
    foreign = max(foreign, 0.0)  # tick rounding can make it slightly negative
    own = b["own"] - a["own"]
    return {
        "wall_s": wall,
        "foreign_cpu_s": foreign,
        "foreign_cores": foreign / wall,
        "own_cores": own / wall,
        # a process's wait counts between samples that both saw it: a lower bound
        "own_wait_cores": (_waited(a, b) if waited is None else waited) / wall,
        "irq_cores": (b["irq"] - a["irq"]) / wall,
        "steal_cores": (b["steal"] - a["steal"]) / wall,
        "idle_cores": (b["idle"] - a["idle"]) / wall,
    }


class Sampler:
    """Snapshots every `interval` seconds on a thread, for the length of a ``with``."""

    def __init__(self, interval: float = 1.0, root: int | None = None) -> None:
        self.interval, self.root = interval, root or os.getpid()
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.samples.append(snapshot(self.root))

    def __enter__(self) -> Sampler:
        self.samples.append(snapshot(self.root))
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(snapshot(self.root))

    def _span(self, span: list[dict]) -> dict[str, float]:
        waited = sum(_waited(a, b) for a, b in zip(span, span[1:], strict=False))
        return between(span[0], span[-1], waited)

    def total(self) -> dict[str, float]:
        """Foreign CPU over the whole ``with``."""
        return self._span(self.samples)

    def window(self, start: float, end: float) -> dict[str, float]:
        """Foreign CPU over the sample intervals overlapping [start, end] (monotonic)."""
        inside = [s for s in self.samples if start <= s["t"] <= end]
        before = [s for s in self.samples if s["t"] < start][-1:]
        after = [s for s in self.samples if s["t"] > end][:1]
        span = before + inside + after
        if len(span) < 2:
            return self.total()
        return self._span(span)

    def peak(self) -> float:
        """The highest foreign load (cores) of any one sample interval."""
        pairs = zip(self.samples, self.samples[1:], strict=False)
        return max((between(a, b)["foreign_cores"] for a, b in pairs), default=0.0)
