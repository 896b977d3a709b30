"""Load time and peak memory of the Kineto ingest vs Holistic Trace Analysis's loader.

Each loader runs in its own subprocess (after its imports) on the same files; peak
memory is the growth of the process's max RSS during the load. HTA is bench-only:
``pip install holistictraceanalysis``. Usage: python bench/bench_ingest_torch.py [DIR]
(default: the 8-rank DLRM set under ../shared/traces).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

DEFAULT = (
    Path(__file__).resolve().parents[1].parent
    / "shared/traces/public/param/et_replay/tests/inputs/dlrm_kineto.tar.gz.extracted/dlrm_kineto"
)

CHILD = r"""
import json, resource, sys, time
which, path = sys.argv[1], sys.argv[2]
if which == "planner":
    from pathlib import Path
    from planner.ingest.kineto import load_kineto
    load = lambda: load_kineto([Path(path)])
else:
    import logging
    logging.disable(logging.CRITICAL)
    from hta.common.trace import Trace
    def load():
        t = Trace(trace_dir=path)
        t.parse_traces(use_multiprocessing=False)
        return t
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
load()
elapsed = time.perf_counter() - t0
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"seconds": elapsed, "peak_mib": peak / 1024}))
"""


def measure(which: str, path: Path, repeat: int = 3) -> dict[str, float]:
    """Best time and smallest peak over `repeat` fresh processes."""
    runs = []
    for _ in range(repeat):
        out = subprocess.run(
            [sys.executable, "-c", CHILD, which, str(path)],
            capture_output=True,
            text=True,
            check=True,
        )
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {
        "seconds": min(r["seconds"] for r in runs),
        "peak_mib": min(r["peak_mib"] for r in runs),
    }


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    files = sorted(p for p in path.iterdir() if p.name.endswith((".json", ".json.gz")))
    size = sum(p.stat().st_size for p in files) / 2**20
    print(f"{path} : {len(files)} files, {size:.1f} MiB on disk")
    ours = measure("planner", path)
    try:
        hta = measure("hta", path)
    except subprocess.CalledProcessError as exc:
        print(f"HTA loader failed: {exc.stderr.strip().splitlines()[-1:]}")
        hta = None
    print(f"{'loader':<10} {'seconds':>10} {'peak MiB':>10}")
    print(f"{'planner':<10} {ours['seconds']:>10.3f} {ours['peak_mib']:>10.1f}")
    if hta:
        print(f"{'HTA':<10} {hta['seconds']:>10.3f} {hta['peak_mib']:>10.1f}")
        print(
            f"speed-up x{hta['seconds'] / ours['seconds']:.2f} (target >= 3), "
            f"memory ratio {ours['peak_mib'] / max(hta['peak_mib'], 1e-9):.2f} (target <= 0.33)"
        )


if __name__ == "__main__":
    main()
