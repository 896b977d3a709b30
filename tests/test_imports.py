"""The core must run without TensorFlow or TensorBoard installed."""

from __future__ import annotations

import subprocess
import sys

from conftest import DEMO


def test_core_never_imports_tensorflow_or_tensorboard():
    code = (
        "import sys\n"
        "from planner.job import analysis\n"
        "from planner.ingest import detect\n"
        "import planner_cli.main\n"
        f"analysis.analyze(detect.load([{str(DEMO)!r}]))\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tensorboard'))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
