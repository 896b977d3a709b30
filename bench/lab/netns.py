"""The shaped network: a private network namespace whose loopback is rate-limited with tc.

Inside a fresh namespace only `lo` exists (127.0.0.0/8). Its root qdisc is htb with
rate = ceil and quantum 65536, one pfifo leaf per class:

- one class per listed source address (a TF task listening on its own 127.0.0.K answers
  from it, so that class is its uplink), selected by u32 filters on the source address;
- a default class for everything else: for gloo, whose ranks all send from 127.0.0.1, the
  one shared class.

``unshaped`` leaves the loopback without a qdisc. The namespace is removed on every exit
path: `shaped_namespace` deletes it in a ``finally`` (SIGTERM/SIGINT/SIGHUP become
exceptions while it is held), and a watcher process in its own session, reading a pipe
from this process, kills what runs in the namespace and deletes it when the pipe closes,
which is also when this process dies of SIGKILL or a crash.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence

PREFIX = "planner-lab-"
DEFAULT_CLASS = 0x10
UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12}

# the watcher: wait for EOF on stdin (the lab closed it, or died), then empty and delete
# the namespace; its own session, so the lab's process group's signals do not reach it
WATCHER = r"""
import os, signal, subprocess, sys
name = sys.argv[1]
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
sys.stdin.buffer.read()
for _ in range(3):
    pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    for pid in pids.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    gone = subprocess.run(["ip", "netns", "del", name], capture_output=True)
    if gone.returncode == 0:
        break
"""


def parse_rate(text: str) -> float | None:
    """Bits per second of a tc rate ('1500mbit', '1gbit'); None for 'unshaped'."""
    text = text.strip().lower()
    if text in ("unshaped", "none", "inf"):
        return None
    match = re.fullmatch(r"([0-9.]+)\s*([kmgt]?bit)", text)
    if not match:
        raise ValueError(f"rate {text!r}: expected e.g. 200mbit, 1gbit or unshaped")
    return float(match.group(1)) * UNITS[match.group(2)]


def _ip(*argv: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", "netns", "exec", ns, *argv] if ns else list(argv)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")
    return done


def namespaces() -> list[str]:
    """Names of the network namespaces that exist now."""
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def shape(name: str, rate: str, sources: Sequence[str] = (), limit: int | None = None) -> list:
    """Bring `lo` up in namespace `name` and shape it; the tc commands run (for the record)."""
    # 127.0.0.0/8 is lo's already: a task binds its 127.0.0.K as it is (adding the address
    # would make connections *to* it leave from it too, i.e. fill the peer's class)
    commands: list[list[str]] = [["ip", "link", "set", "lo", "up"]]
    if parse_rate(rate) is not None:
        leaf = "pfifo" + (f" limit {limit}" if limit else "")
        lines = [f"tc qdisc add dev lo root handle 1: htb default {DEFAULT_CLASS:x}"]
        classes = [DEFAULT_CLASS] + [DEFAULT_CLASS + 1 + i for i in range(len(sources))]
        for k in classes:
            lines.append(
                f"tc class add dev lo parent 1: classid 1:{k:x} htb rate {rate} "
                f"ceil {rate} quantum 65536"
            )
            lines.append(f"tc qdisc add dev lo parent 1:{k:x} handle {k:x}: {leaf}")
        for k, address in zip(classes[1:], sources, strict=True):
            lines.append(
                f"tc filter add dev lo parent 1: protocol ip prio 1 u32 "
                f"match ip src {address}/32 flowid 1:{k:x}"
            )
        commands += [line.split() for line in lines]
    for command in commands:
        _ip(*command, ns=name)
    return commands


def qdisc_stats(name: str) -> str:
    """`tc -s class show dev lo` in the namespace (bytes and drops per class)."""
    return _ip("tc", "-s", "class", "show", "dev", "lo", ns=name, check=False).stdout


def remove(name: str) -> None:
    """Kill every process in namespace `name` and delete it (no error when it is gone)."""
    for _ in range(3):
        if name not in namespaces():
            return
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
        for pid in pids.stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
        time.sleep(0.05)


def stale() -> list[str]:
    """Lab namespaces whose creating process is gone (left by a lab killed before its
    watcher could act, e.g. a reboot of the watcher itself)."""
    found = []
    for name in namespaces():
        match = re.fullmatch(re.escape(PREFIX) + r"(\d+)(?:-\d+)?", name)
        if match and not os.path.exists(f"/proc/{match.group(1)}"):
            found.append(name)
    return found


class Terminated(SystemExit):
    """A SIGTERM/SIGHUP received while a namespace was held (exit status 128 + signal)."""


def _raise(signum: int, _frame: object) -> None:
    raise Terminated(128 + signum)


_serial = iter(range(1 << 30))


@contextlib.contextmanager
def shaped_namespace(
    rate: str, sources: Sequence[str] = (), limit: int | None = None
) -> Iterator[str]:
    """A fresh namespace ``planner-lab-<pid>-<n>`` with `lo` shaped to `rate`; yields its
    name and deletes it (with whatever still runs in it) on every way out."""
    name = f"{PREFIX}{os.getpid()}-{next(_serial)}"
    old = {}
    for signum in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError):  # not the main thread: leave the handlers
            old[signum] = signal.signal(signum, _raise)
    watcher = None
    try:
        _ip("ip", "netns", "add", name)
        watcher = subprocess.Popen(
            [sys.executable, "-c", WATCHER, name],
            stdin=subprocess.PIPE,
            start_new_session=True,
        )
        shape(name, rate, sources, limit)
        yield name
    finally:
        try:
            remove(name)
        finally:
            if watcher is not None:
                assert watcher.stdin is not None
                watcher.stdin.close()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    watcher.wait(timeout=10)
            for signum, handler in old.items():
                signal.signal(signum, handler)
