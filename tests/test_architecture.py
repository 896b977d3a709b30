"""The layout of docs/architecture.md, computed from the source: every import inside
`planner/` points down the data flow (to its own stage or an earlier one) and no group of
modules imports each other in a circle. Imports inside functions and under
`TYPE_CHECKING` count too: a late import is still a dependency."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "planner"

STAGES = (
    ("planner.errors", "planner.version"),
    ("planner.model",),
    ("planner.enforce",),
    ("planner.ingest",),
    ("planner.measure",),
    ("planner.planning",),
    ("planner.prediction",),
    ("planner.export",),
    ("planner.job",),
    ("planner.reporting",),
    ("planner.api", "planner"),
)
"""The stages in data-flow order (docs/architecture.md); a module may import its own
stage's modules and those of earlier stages, never a later one."""


def module_names() -> dict[str, Path]:
    """Dotted name -> file of every module of the package (generated protobufs aside)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name.endswith("_pb2.py"):
            continue
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that module `name` imports (a name imported from a package
    counts as its submodule when there is one)."""

    def known(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for target in targets:
            if target.split(".")[0] == "planner":
                module = known(target)
                if module is not None and module != name:
                    found.add(module)
    # `from planner.x import y` names both planner.x and, when y is a module, planner.x.y:
    # keep the most specific of each chain
    return {m for m in found if not any(o.startswith(m + ".") for o in found)} | {
        m for m in found if m in modules and modules[m].name != "__init__.py"
    }


def stage_of(module: str) -> int:
    """The index in `STAGES` of the stage holding `module`."""
    best = None
    for index, prefixes in enumerate(STAGES):
        for prefix in prefixes:
            inside = module == prefix or module.startswith(prefix + ".")
            if inside and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    assert best is not None, f"{module} is in no stage of docs/architecture.md"
    return best[0]


def import_graph() -> nx.DiGraph:
    modules = module_names()
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for name, path in modules.items():
        for target in imports_of(name, path, modules):
            graph.add_edge(name, target)
    return graph


def test_every_module_lies_in_a_stage() -> None:
    for module in module_names():
        stage_of(module)


def test_no_import_points_up_the_flow() -> None:
    upward = sorted(
        f"{a} (stage {stage_of(a)}) imports {b} (stage {stage_of(b)})"
        for a, b in import_graph().edges
        if stage_of(b) > stage_of(a)
    )
    assert not upward, "\n".join(upward)


def test_no_import_circle() -> None:
    circles = [sorted(c) for c in nx.strongly_connected_components(import_graph()) if len(c) > 1]
    assert not circles, circles


def test_the_check_sees_an_upward_import_and_a_circle(tmp_path: Path) -> None:
    """The checks above can fail: an import from a later stage and a two-module circle,
    written as source and read by the same functions."""
    modules = {"planner.model.a": tmp_path / "a.py", "planner.job.b": tmp_path / "b.py"}
    modules["planner.model.a"].write_text("def f():\n    from planner.job.b import g\n")
    modules["planner.job.b"].write_text("from planner.model import a\n")
    found = {n: imports_of(n, p, modules) for n, p in modules.items()}
    assert found == {"planner.model.a": {"planner.job.b"}, "planner.job.b": {"planner.model.a"}}
    assert stage_of("planner.job.b") > stage_of("planner.model.a")


@pytest.mark.parametrize("name", ["metrics", "schedule", "simulate", "report", "inspect", "load"])
def test_no_module_bears_an_api_function_name(name: str) -> None:
    """`planner.metrics(job)` is the API function because no module is `planner.metrics`
    (no module swaps its class to be callable)."""
    assert f"planner.{name}" not in module_names()
    assert not any("callable_module" in p.read_text() for p in module_names().values())


MODULE_LINES = 600
FUNCTION_LINES = 80
"""Rooms a person can hold in their head (issue #43): no module of `planner/` over
`MODULE_LINES` lines, no function over `FUNCTION_LINES` (its def line to its last, the
docstring included)."""


LONG_ON_PURPOSE = {
    "planner.prediction._simkernel._sample": "the numba-compiled event loop of one sample: "
    "its three phases per instant as functions ran 1.5-5x slower compiled",
}
"""Functions over `FUNCTION_LINES` kept whole, each with the measured reason."""


def test_no_module_or_function_is_too_long_to_hold_in_the_head() -> None:
    too_long = []
    for name, path in sorted(module_names().items()):
        text = path.read_text()
        if text.count("\n") > MODULE_LINES:
            too_long.append(f"{name}: {text.count(chr(10))} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = node.end_lineno - node.lineno + 1
                if length > FUNCTION_LINES and f"{name}.{node.name}" not in LONG_ON_PURPOSE:
                    too_long.append(f"{name}.{node.name}: {length} lines")
    assert not too_long, "\n".join(too_long)
