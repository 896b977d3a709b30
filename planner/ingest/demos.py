"""The bundled demo traces, by the name every command takes in place of a path.

Light on purpose (no reader imported): path resolution asks it about every input.
"""

from __future__ import annotations

from pathlib import Path

DEMOS = {
    "demo": ("planner.demo_trace", ("traces", "demo")),
    "demo-ddp": ("planner.demo_ddp", ("traces", "torch", "resnet_ddp")),
    "demo-lab": ("planner.demo_lab", ("traces", "demo_lab")),
}
"""Name -> the data package it is installed as, and its folder in a source checkout.
`demo`: five traced steps of one worker of a real TensorFlow parameter-server job;
`demo-ddp`: a PyTorch DDP run of two ranks (profiler trace and Execution Trace of each);
`demo-lab`: the lab's DDP job traced on a 1500 Mbit/s shaped link, with the network
benchmark run beside it (``demo-lab/network.csv``), whose recommended bucket cap was
measured faster."""


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
    a file or folder here is the bundled demo, and ``demo-lab/network.csv`` a file in
    it; a real path of that name wins."""
    text = str(path)
    first, _, rest = text.replace("\\", "/").partition("/")
    if first not in DEMOS or Path(text).exists():
        return Path(text)
    return demo_trace(first) / rest if rest else demo_trace(first)
