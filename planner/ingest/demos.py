"""The bundled demo traces, by the name every command takes in place of a path.

Light on purpose (no reader imported): path resolution asks it about every input.
"""

from __future__ import annotations

from pathlib import Path

DEMOS = {
    "demo": ("planner.demo_trace", ("traces", "demo")),
    "demo-ddp": ("planner.demo_ddp", ("traces", "torch", "resnet_ddp")),
}
"""Name -> the data package it is installed as, and its folder in a source checkout.
`demo`: five traced steps of one worker of a real TensorFlow parameter-server job;
`demo-ddp`: a PyTorch DDP run of two ranks (profiler trace and Execution Trace of each)."""


def demo_trace(name: str = "demo") -> Path:
    """The folder of the bundled demo `name` (a key of `DEMOS`).

    Installed as a data package (`planner.demo_trace`, `planner.demo_ddp`); in a source
    checkout it is the repository's folder under traces/.
    """
    from importlib.util import find_spec

    package, checkout = DEMOS[name]
    try:
        spec = find_spec(package)
    except ModuleNotFoundError:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(__file__).resolve().parents[2].joinpath(*checkout)


def named(path: str | Path) -> Path:
    """`path`, or the demo it names: a bare demo name (``demo``, ``demo-ddp``) that is not
    a file or folder here is the bundled demo; a real path of that name wins."""
    text = str(path)
    if text in DEMOS and not Path(text).exists():
        return demo_trace(text)
    return Path(text)
