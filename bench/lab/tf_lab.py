"""The lab's TensorFlow parameter-server job: 1 ps + 2 workers in the shaped namespace.

Each task listens on its own 127.0.0.K (ps .2, workers .3 and .4), so what it sends as
an RPC's answer leaves from that address, through its own htb class (its uplink):
`bench.lab.netns` shapes them with u32 filters on the source address. The servers are
examples/tf_ps_job.py's (``--serve``); the client is bench/lab/tf_client.py.

Per rate: the plain graph traced, `planner analyze` on the trace (TIC and TAC, their
predicted gains replayed as ``--enforce arrival`` applies them), `planner simulate
--enforce sender` (the same for the sender chain), each plan exported in each mode
(`planner export`), and plain against every exported graph measured interleaved.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

from bench.lab import cpuload

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
EXAMPLE = ROOT / "examples" / "tf_ps_job.py"
SHARED = ROOT.parent / "shared" / "traces" / "generated" / "tf"
# the generated cnn job's fetches: train op, loss, global step (examples/tf_ps_job.py)
FETCHES = ["Momentum/update", "truediv:0", "global_step/Read/ReadVariableOp:0"]
ADDRESSES = {"ps": ["127.0.0.2"], "worker": ["127.0.0.3", "127.0.0.4"]}
SOURCES = [a for job in ("ps", "worker") for a in ADDRESSES[job]]
PLANS = ("tic", "tac")
MODES = ("arrival", "sender")
REVERSED = "tac-reversed"  # TAC's order backwards, enforced by arrival: does the order matter?


def cluster(ns: str, env: dict, where: Path, port: int = 40000) -> tuple[str, list]:
    """Start the ps and both workers in `ns`, each on its own address; (target, procs)."""
    spec = {
        job: [f"{a}:{port + 10 * i + k}" for k, a in enumerate(addrs)]
        for i, (job, addrs) in enumerate(ADDRESSES.items())
    }
    procs = []
    for job, addrs in spec.items():
        for task in range(len(addrs)):
            serve = [sys.executable, str(EXAMPLE), "--serve", json.dumps(spec), job, str(task)]
            cmd = ["ip", "netns", "exec", ns, *serve]
            log = (where / f"{job}{task}.log").open("w")
            procs.append(
                subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, env=env, text=True)
            )
            log.close()
    for proc in procs:
        if "ready" not in (proc.stdout.readline() if proc.stdout else ""):
            raise RuntimeError(f"a TF server did not start (exit {proc.poll()}); see {where}")
    return f"grpc://{spec['worker'][0]}", procs


def client(ns: str, env: dict, spec: dict, where: Path, timeout: float) -> dict:
    """Run bench/lab/tf_client.py in `ns` with `spec`; its result."""
    spec = {**spec, "out": str(where / "result.json")}
    (where / "spec.json").write_text(json.dumps(spec, indent=1) + "\n")
    cmd = ["ip", "netns", "exec", ns, sys.executable, str(HERE / "tf_client.py")]
    cmd.append(str(where / "spec.json"))
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"TF client ({spec['mode']}) failed: {done.stderr[-2000:]}")
    return json.loads((where / "result.json").read_text())


def _gains(simulation: dict) -> dict[str, float]:
    """Mean over the workers of each plan's replayed gain."""
    gains: dict[str, list[float]] = {}
    for rank in simulation.get("comparison", {}).get("ranks", []):
        for plan in rank.get("plans", []):
            if plan["plan"] in PLANS and plan.get("replayed"):
                gains.setdefault(plan["plan"], []).append(plan["replayed"]["gain"])
    return {k: statistics.fmean(v) for k, v in gains.items()}


def replayed_gains(
    trace_dir: Path, plan_dir: Path, tools: ModuleType
) -> dict[str, dict[str, float]]:
    """Mode -> plan -> its replayed gain (mean over the workers) on the traced run in
    `trace_dir`: `planner analyze` (arrival, the export's default; it writes the plans
    into `plan_dir`) and `planner simulate --enforce MODE` for the other modes. `tools`
    is bench.lab.run."""
    report = tools.planner_cli("analyze", str(trace_dir), "-o", str(plan_dir), "--force", "-j", "1")
    gains = {"arrival": _gains(report.get("simulation", {}))}
    for mode in MODES[1:]:
        replayed = tools.planner_cli("simulate", str(trace_dir), "--enforce", mode, "-j", "1")
        gains[mode] = _gains(replayed)
    return gains


def predicted_configs(
    gains: dict[str, dict[str, float]], untraced: float, labels: list[str]
) -> dict[str, dict]:
    """Each configuration's predicted step: plain's, the untraced step; a plan enforced
    in a mode (``tic-arrival``), that step over (1 + the plan's replayed gain in the
    mode): the replay's gain is observed / predicted - 1. (The first-order form,
    untraced x (1 - gain), hid about 5 points of the arrival chains' cost.)"""
    predicted = {"plain": {"predicted_s": untraced, "predicted_gain": 0.0}}
    for label in labels:
        plan, _, mode = label.rpartition("-")
        gain = gains.get(mode, {}).get(plan)
        if gain is not None:
            predicted[label] = {"predicted_s": untraced / (1 + gain), "predicted_gain": gain}
    return predicted


def run_tf(ns: str, job: str, spec: dict, args: argparse.Namespace, where: Path, tools) -> dict:
    """One TF job at one rate: trace, analyze, export, interleaved measurement.
    `tools` is bench.lab.run (planner_cli, _env, summarize), passed to avoid a cycle."""
    env = {**tools._env(), "CUDA_VISIBLE_DEVICES": ""}
    graph = Path(spec["graph"])
    if graph.suffix == ".gz":  # the client and the export read the GraphDef's bytes
        (where / "graph.pb").write_bytes(gzip.decompress(graph.read_bytes()))
        graph = where / "graph.pb"
    record: dict = {
        "job": job,
        "graph": str(graph),
        "phases": {},
        "notes": [],
        "addresses": ADDRESSES,
    }
    phases = record["phases"]
    target, procs = cluster(ns, env, where)
    try:
        base = {"target": target, "fetches": spec.get("fetches", FETCHES), "warmup": 2}
        trace_dir = where / "trace" / "run"
        (where / "trace").mkdir(parents=True, exist_ok=True)
        with cpuload.Sampler(args.interval) as load:
            traced = client(
                ns,
                env,
                base
                | {
                    "mode": "trace",
                    "graphs": {"plain": str(graph)},
                    "trace_dir": str(trace_dir),
                    "untraced": args.untraced_steps,
                    "traced": args.traced_steps,
                },
                where / "trace",
                args.job_timeout,
            )
        phases["trace"] = load.total() | {"peak_foreign_cores": load.peak()}
        untraced = statistics.median(traced["untraced"])
        record["trace"] = {"untraced_s": untraced, "traced_s": statistics.median(traced["traced"])}
        with cpuload.Sampler(args.interval) as load:
            gains = replayed_gains(trace_dir, where / "plan", tools)
        phases["analyze"] = load.total()
        configs = [{"label": "plain", "graph": str(graph)}]
        if not args.no_aa:
            configs.append({"label": "plain-aa", "graph": str(graph)})
        for plan in PLANS:
            priorities = where / "plan" / f"priorities_{plan}.json"
            if not priorities.exists():
                record["notes"].append(f"analyze wrote no {priorities.name}")
                continue
            for mode in MODES:
                label = f"{plan}-{mode}"
                out = where / "plan" / f"{label}.pb"
                try:
                    tools.planner_cli(
                        "export",
                        "--graphdef",
                        str(graph),
                        "--plan",
                        str(priorities),
                        "-o",
                        str(out),
                        "--enforce",
                        mode,
                    )
                except RuntimeError as exc:
                    record["notes"].append(f"{label}: export failed: {exc}")
                    continue
                configs.append({"label": label, "graph": str(out)})
        reversed_plan = _reversed(where / "plan" / "priorities_tac.json", where / "plan")
        if reversed_plan is not None:
            out = where / "plan" / f"{REVERSED}-arrival.pb"
            # the loss and the global step read after every read: backwards, their edges
            # would close cycles, and are left out (--drop-cyclic)
            tools.planner_cli("export", "--graphdef", str(graph), "--plan", str(reversed_plan),
                              "-o", str(out), "--enforce", "arrival", "--drop-cyclic")  # fmt: skip
            configs.append({"label": f"{REVERSED}-arrival", "graph": str(out)})
        record["configs"] = configs
        predicted = predicted_configs(gains, untraced, [c["label"] for c in configs])
        record["predicted"] = {"configs": predicted, "sweep": {}}
        record["repeats"] = []
        graphs = {c["label"]: c["graph"] for c in configs}
        for repeat in range(args.repeats):
            order = [c["label"] for c in configs for _ in range(max(1, args.steps // args.block))]
            random.Random(args.seed + repeat).shuffle(order)
            folder = where / f"measure{repeat}"
            folder.mkdir(parents=True, exist_ok=True)
            with cpuload.Sampler(args.interval) as load:
                result = client(
                    ns,
                    env,
                    base
                    | {"mode": "measure", "graphs": graphs, "order": order, "block": args.block},
                    folder,
                    args.job_timeout,
                )
            phases[f"measure{repeat}"] = load.total() | {"peak_foreign_cores": load.peak()}
            record["repeats"].append(
                {
                    "order": order,
                    "times": result["times"],
                    "blocks": result["blocks"],
                    "block_foreign_cores": [
                        load.window(s["start"], s["end"])["foreign_cores"] for s in result["spans"]
                    ],
                    "applied_by": {},
                }
            )
        try:
            record["order_held"] = _orders_held(ns, env, base, configs, where, args, tools)
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:  # keep the figures
            record["notes"].append(f"order check failed: {str(exc)[-300:]}")
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(timeout=30)
        time.sleep(0.1)
    return record


def _reversed(priorities: Path, where: Path) -> Path | None:
    """TAC's plan with each rank's order reversed (its messages still before their data),
    written beside it; None without a TAC plan."""
    if not priorities.exists():
        return None
    document = json.loads(priorities.read_text())
    for rank in document["ranks"]:
        transfers = sorted(rank["transfers"], key=lambda t: t["order_index"])
        units: list[list[dict]] = []  # a read's control message stays with its data
        for t in transfers:
            if units and units[-1][-1]["name"] == t["name"].replace("recv:", "recv:^", 1):
                units[-1].append(t)
            else:
                units.append([t])
        flat = [t for unit in reversed(units) for t in unit]
        for i, t in enumerate(flat):
            t["order_index"] = t["priority"] = i
        rank["transfers"] = flat
    out = where / f"priorities_{REVERSED}.json"
    out.write_text(json.dumps(document, indent=1) + "\n")
    return out


def _orders_held(ns, env, base, configs, where: Path, args, tools) -> dict:  # noqa: ANN001
    """Per enforced configuration, a few traced steps and `planner verify` of its plan
    on them: the steps (over both workers) whose reads arrived in the plan's order."""
    held = {}
    for config in configs:
        label = config["label"]
        plan = label.rsplit("-", 1)[0]
        if plan not in (*PLANS, REVERSED):
            continue
        folder = where / "order" / label
        folder.mkdir(parents=True, exist_ok=True)
        client(
            ns, env,
            base | {"mode": "trace", "graphs": {label: config["graph"]},
                    "trace_dir": str(folder / "run"), "untraced": 0, "traced": args.traced_steps},
            folder, args.job_timeout,
        )  # fmt: skip
        priorities = where / "plan" / f"priorities_{plan}.json"
        try:
            document = tools.planner_cli("verify", str(priorities), str(folder / "run"))
        except RuntimeError as exc:  # verify exits 1 on an unmatched transfer: say so
            held[label] = {"error": str(exc)[-300:]}
            continue
        steps = document["steps"]
        held[label] = {
            "in_order": sum(s["in_plan_order"] for s in steps),
            "steps": len(steps),
            "compliance": document["compliance"],
        }
    return held
