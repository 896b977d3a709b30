"""What the runtime side needs of the training job's framework, said in one line.

The enforcement modules run inside a PyTorch or TensorFlow job; imported where that
framework is not installed they raise an ImportError that says what to install (not a
bare "No module named torch" from deep inside), and the examples print that line.
"""

from __future__ import annotations

import importlib.util

INSTALL = {
    "torch": ("PyTorch", "pip install torch (or pip install 'planner[torch]')"),
    "tensorflow": ("TensorFlow", "pip install tensorflow-cpu (or pip install 'planner[tf]')"),
}
"""Framework module -> (its name, how to install it)."""


def missing(module: str, user: str) -> str | None:
    """The line saying that `user` (a module or script) needs `module` and how to install
    it, or None when `module` can be imported."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a module set to None in sys.modules, a bad spec
        found = False
    if found:
        return None
    name, install = INSTALL.get(module, (module, f"pip install {module}"))
    return f"{user} needs {name}, which is not installed: {install}"


def require(module: str, user: str) -> None:
    """ImportError saying what to install unless `module` can be imported (`missing`)."""
    line = missing(module, user)
    if line is not None:
        raise ImportError(line, name=module)
