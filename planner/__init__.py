"""planner: offline communication scheduling for data-parallel DNN training.

Ingest traces -> OpGraph + Trace -> TimeOracle -> schedule (TicTac, Caramel) ->
metrics / simulation -> export. Every stage is a plain function over dataclasses.

The Python API (docs/api.md, or `planner docs api`), equal to the CLI:

    import planner
    job = planner.load("demo")                 # files, run folders, globs, a demo; rank=...
    planner.inspect(job)                       # -> Inspection: devices, ops, transfers
    planner.metrics(job)                       # -> MetricsResult: E, S, umax, lmin per step
    plans = planner.schedule(job, "tac")       # -> Plans: "tic", "tac" or "caramel"
    planner.simulate(job, plans)               # -> SimulationResult: replay and predictions
    planner.report(job, "out/")                # -> Report: writes what `analyze -o` writes

Every result has `.to_dict()` (the `--json` document, with its ``schema``) and
`.to_frame()` (a pandas DataFrame). Bad input raises `planner.InputError`, whose text is
one line naming the file and the problem. `import planner` loads no numerics; each
function imports what it needs on first use.
"""

from __future__ import annotations

from typing import Any

from planner.errors import InputError
from planner.version import __version__

API = ("load", "inspect", "metrics", "schedule", "simulate", "report")
RESULTS = ("Inspection", "MetricsResult", "Plans", "SimulationResult", "Report")
__all__ = [*API, *RESULTS, "InputError", "__version__"]


def __getattr__(name: str) -> Any:
    """The API, imported on first use. No module of the library bears an API function's
    name (the implementations live in their stage packages, docs/architecture.md), so
    `planner.metrics` is always the function."""
    if name in API or name in RESULTS:
        from planner import api

        return getattr(api, name)
    raise AttributeError(f"module 'planner' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
