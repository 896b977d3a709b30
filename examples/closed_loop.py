"""The closed loop for your own training script: trace, plan, enforce, verify.

    python examples/closed_loop.py --out loop/ -- python examples/train_ddp.py --nproc 2

Runs COMMAND twice. The script it starts must honour two environment variables:
``PLANNER_TRACE_DIR`` (write one torch.profiler trace per rank under it, with
``record_shapes=True``) and ``PLANNER_PLAN`` (when set, load it with
``planner.enforce.load_plan`` and register it with
``planner.enforce.torch_ddp.register_plan_hook``). ``examples/train_ddp.py`` does both.

1. ``COMMAND`` with ``PLANNER_TRACE_DIR=OUT/traced``: the job as it runs today;
2. ``planner analyze OUT/traced/... -o OUT/plan``: ``bucket_plan.json`` among the results
   where its verdict recommends the Caramel plan; where it does not (the plan is not
   predicted to gain more than the replay error), the loop prints the verdict and stops
   there, exit 0, unless ``--plan-anyway`` takes the plan from ``report.json`` (to check
   the enforcement itself);
3. ``COMMAND`` with ``PLANNER_PLAN=OUT/plan/bucket_plan.json``, ``PLANNER_TRACE_DIR=OUT/enforced``;
4. ``planner verify OUT/plan/bucket_plan.json OUT/enforced/... --min-compliance X``.

The exit status is the first failing stage's (verify: 1 when a planned transfer was not
matched or a rank is below X).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path


def traces(where: Path) -> list[Path]:
    """The per-rank torch.profiler traces the script wrote (``rank<N>.json``)."""
    found = sorted(p for p in where.rglob("rank*.json*") if p.name.split(".")[0][4:].isdigit())
    if not found:
        raise SystemExit(f"{where}: the training script wrote no rank<N>.json trace")
    return found


def stage(argv: list[str], env: dict[str, str] | None = None) -> None:
    """Run one stage; stop the loop with its exit status when it fails."""
    print("+", " ".join(argv), file=sys.stderr, flush=True)
    code = subprocess.run(argv, env={**os.environ, **(env or {})}).returncode
    if code != 0:
        raise SystemExit(code)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--min-compliance", default="1.0")
    parser.add_argument(
        "--plan-anyway",
        action="store_true",
        help="apply the Caramel plan even where the verdict does not recommend it",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND...")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the training command after --")
    planner = [sys.executable, "-c", "from planner_cli.main import main; main()"]
    out = args.out.resolve()
    env = {"PLANNER_TRACE_DIR": str(out / "traced")}
    stage(command, {**env, "PLANNER_PLAN": ""})
    stage([*planner, "analyze", *map(str, traces(out / "traced")), "-o", str(out / "plan")])
    plan = out / "plan" / "bucket_plan.json"
    report = json.loads((out / "plan" / "report.json").read_text())
    if not plan.exists():
        print(f"planner: {report['verdict']['text']}", file=sys.stderr)
        if not args.plan_anyway:
            return  # nothing recommended to apply
        plan.write_text(json.dumps(report["exports"]["bucket_plan"]))
    stage(command, {"PLANNER_TRACE_DIR": str(out / "enforced"), "PLANNER_PLAN": str(plan)})
    stage([*planner, "verify", str(plan), *map(str, traces(out / "enforced")),
           "--min-compliance", args.min_compliance])  # fmt: skip


if __name__ == "__main__":
    main()
