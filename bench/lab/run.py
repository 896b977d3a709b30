"""The shaped-network lab: planner's advice applied and measured where communication costs.

For every rate and job: a fresh network namespace with its loopback shaped by tc
(`bench.lab.netns`), the shaped rate checked by a timed TCP transfer, `planner
bench-network` inside it, the plain job traced (torch.profiler per rank), `planner
analyze` on the trace, and then every setting planner predicts (each bucket cap of its
sweep) or writes (the Caramel ``bucket_plan.json``, through ``register_plan_hook``)
measured against the plain job, interleaved in shuffled blocks, ``--repeats`` times.
Medians of per-step times, block-bootstrap 95% intervals of the ratio to plain (numpy,
fixed seed), and the CPU time foreign processes used in every phase and block
(`bench.lab.cpuload`; above ``--foreign-threshold`` cores a phase is flagged, a block is
flagged or, with ``--discard-loaded``, left out). Prints a predicted-vs-measured
Markdown table per job and rate and writes everything to ``OUT/lab.json``.

    python -m bench.lab --job ddp-mlp --rate 1000mbit --steps 30 --repeats 2 --out DIR
    python bench/lab/run.py --job ddp-tiny --rate 200mbit --steps 6 --out DIR
    python -m bench.lab --check-rate --rate 200mbit       # the TCP check and bench-network

Uses planner only through its command line and `planner.enforce` (in the job). Needs
root, ``ip`` and ``tc`` (htb, u32), and torch for the DDP jobs.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path

if __package__ in (None, ""):  # `python bench/lab/run.py`: import as `bench.lab`
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.lab import cpuload, netns, stats, tf_lab  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TF_GRAPHS = ROOT.parent / "shared" / "traces" / "generated" / "tf"
JOBS: dict[str, dict] = {
    # the MLP: 24 Linear layers of 256x256, batch 256 (6.3 MB of gradients)
    "ddp-mlp": {"kind": "ddp", "width": 256, "layers": 24, "batch": 256},
    # fewer, wider layers: 4 of 1024x1024, batch 64 (16.8 MB of gradients)
    "ddp-wide": {"kind": "ddp", "width": 1024, "layers": 4, "batch": 64},
    # the smoke test's: 6 layers of 128x128, batch 32 (0.4 MB)
    "ddp-tiny": {"kind": "ddp", "width": 128, "layers": 6, "batch": 32},
    # the generated TF cnn job (in-graph, 1 ps + 2 workers; ../shared/traces)
    "tf-cnn": {"kind": "tf", "graph": TF_GRAPHS / "cnn_ps_ingraph" / "graph.pb"},
    # the repo's TF mlp job (in-graph, 1 ps + 2 workers; 6 dense layers, kernels up to 16 MiB)
    "tf-mlp": {
        "kind": "tf",
        "graph": ROOT / "traces" / "tf" / "mlp_ps_ingraph" / "run1" / "graph.pb.gz",
        "fetches": ["Momentum"],  # the train op (the averaged loss depends on it)
    },
}
PLAIN = "plain"
AA = "plain-aa"  # a second copy of the plain job: the A/A pair, the comparison's noise floor
CARAMEL = "caramel"
HOOK = "hook"  # DDP's own buckets at the smallest cap, through planner's gated hook
_ports = itertools.count(29500)


def _env() -> dict[str, str]:
    """The jobs' environment: gloo on lo (the namespace's only link), one thread."""
    return {
        **os.environ,
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }


def in_ns(ns: str, *argv: str) -> list[str]:
    """The command line that runs `argv` inside network namespace `ns`."""
    return ["ip", "netns", "exec", ns, *argv]


def planner_cli(*argv: str, ns: str | None = None, timeout: float = 600) -> dict:
    """Run `planner ARGV --json` (inside namespace `ns` if given); its JSON output."""
    cmd = [sys.executable, "-c", "from planner_cli.main import main; main()", *argv, "--json"]
    if ns:
        cmd = in_ns(ns, *cmd)
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(
            f"planner {' '.join(argv)}: exit {done.returncode}: {done.stderr.strip()[-2000:]}"
        )
    return json.loads(done.stdout)


def check_rate(ns: str, mbytes: float, address: str = "127.0.0.1", tries: int = 1) -> dict:
    """The timed TCP transfer inside `ns` (bench/lab/ratecheck.py): bytes, s, Mbit/s of
    the fastest of `tries` (the class caps the rate; a transfer whose processes waited
    for a core on a loaded machine only comes out slower), and every try's Mbit/s."""
    script = [sys.executable, str(HERE / "ratecheck.py"), "--mbytes", str(mbytes)]
    runs = []
    for _ in range(tries):
        cmd = in_ns(ns, *script, "--address", address)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"rate check: {done.stderr.strip()[-2000:]}")
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    best = max(runs, key=lambda r: r["mbit_s"])
    return best | {"tries_mbit_s": [r["mbit_s"] for r in runs]}


def bench_network(ns: str, where: Path, sizes: list[int], repeats: int) -> dict:
    """`planner bench-network` and `planner fit-network` inside `ns`: the fit (a, b) and
    the link rate it implies for a 2-rank gloo all-reduce (each rank sends d bytes of a
    d-byte all-reduce, both from 127.0.0.1: 2d bytes through the one class)."""
    csv = where / "net.csv"
    sizes_arg = ",".join(map(str, sizes))
    planner_cli("bench-network", "-n", "2", "--sizes", sizes_arg, "--repeats", str(repeats),
                "-o", str(csv), ns=ns)  # fmt: skip
    fit = planner_cli("fit-network", str(csv))
    fit = {k: fit[k] for k in ("a", "b", "r2")}
    return {"csv": str(csv), **fit, "implied_mbit_s": 16 / fit["b"] / 1e6}


def launch(ns: str, spec: dict, where: Path, timeout: float) -> list[dict]:
    """Run the DDP job's ranks inside `ns` with `spec`; each rank's result."""
    where.mkdir(parents=True, exist_ok=True)
    spec = {**spec, "port": next(_ports), "out": str(where / "steps")}
    path = where / "spec.json"
    path.write_text(json.dumps(spec, indent=1) + "\n")
    procs = []
    try:
        for rank in range(spec["world"]):
            log = (where / f"rank{rank}.log").open("w")
            cmd = in_ns(ns, sys.executable, str(HERE / "ddp_job.py"), str(path), str(rank))
            procs.append(subprocess.Popen(cmd, stdout=log, stderr=log, env=_env()))
            log.close()
        deadline = time.monotonic() + timeout
        while [p.poll() for p in procs].count(None):  # poll every rank, each time
            failed = [p.returncode for p in procs if p.returncode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                why = f"exit {failed[0]}" if failed else f"over {timeout:.0f} s"
                tail = (where / "rank0.log").read_text()[-1500:]
                raise RuntimeError(f"DDP job ({spec['mode']}) failed: {why}; rank0: {tail}")
            time.sleep(0.1)
        if any(p.returncode for p in procs):
            tail = "".join((where / f"rank{r}.log").read_text()[-800:] for r in range(2))
            raise RuntimeError(f"DDP job ({spec['mode']}) failed: {tail}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    return [json.loads((where / "steps" / f"rank{r}.json").read_text()) for r in range(2)]


def per_step(results: list[dict], key: str) -> list[float]:
    """A step's time: the mean of the ranks' (they start together, after a barrier)."""
    return [statistics.fmean(v) for v in zip(*(r[key] for r in results), strict=True)]


def analyze(trace: Path, where: Path, net: dict | None, untraced: float) -> tuple[dict, list]:
    """`planner analyze` on the trace as a user runs it: with the bench-network file and
    the untraced step time (dropped, and said, when analyze refuses it)."""
    ranks = [str(p) for p in sorted(trace.glob("rank*.json*"))]
    base = [*ranks, "-o", str(where / "plan"), "--force", "-j", "1"]
    notes = []
    options = ["--untraced-step-time", f"{untraced:.6f}"]
    if net:
        options += ["--network", net["csv"]]
    try:
        report = planner_cli("analyze", *base, *options)
    except RuntimeError as exc:
        notes.append(f"analyze refused {' '.join(options)}: {exc}; ran without the step time")
        report = planner_cli("analyze", *base, *options[2:])
    return report, notes


def predictions(report: dict, untraced: float) -> dict:
    """What the report predicts: per cap and DDP's default, and the Caramel plan's gain."""
    sweep = report.get("bucket_sweep") or {}
    caps = {f"cap{c['bucket_cap_mb']:g}": c for c in sweep.get("caps", [])}
    out = {
        label: {
            "cap": c["bucket_cap_mb"],
            "buckets": c["buckets"],
            "predicted_s": c["predicted_step_time"],
            "predicted_hooked_s": c.get("predicted_step_time_hooked"),
        }
        for label, c in caps.items()
    }
    default = sweep.get("default_configuration")
    if default:
        out[PLAIN] = {
            "cap": None,
            "buckets": default["buckets"],
            "predicted_s": default["predicted_step_time"],
        }
    gains = []
    for rank in (report.get("simulation") or {}).get("comparison", {}).get("ranks", []):
        for plan in rank.get("plans", []):
            if plan["plan"] == CARAMEL and plan.get("replayed"):
                gains.append(plan["replayed"]["gain"])
    if gains:  # each rank's replayed gain: its observed step over the plan's, less 1
        gain = statistics.fmean(gains)
        base = out.get(PLAIN, {}).get("predicted_s", untraced)
        out[CARAMEL] = {
            "cap": None,
            "buckets": None,
            "predicted_gain": gain,
            "predicted_s": base / (1 + gain),
        }
    meta = {
        k: sweep.get(k)
        for k in (
            "recommended_cap_mb",
            "best_cap_mb",
            "reason",
            "kappa",
            "kappa_source",
            "replay_error",
            "network",
            "network_source",
            "profiler_cost",
            "traced_step_time",
            "untraced_step_time",
        )
    }
    hooked = min((c for c in out.values() if c["cap"] is not None), key=lambda c: c["cap"],
                 default=None)  # fmt: skip
    if hooked is not None and hooked["predicted_hooked_s"] is not None:  # the most calls
        cost = hooked["predicted_hooked_s"] - hooked["predicted_s"]
        out[HOOK] = {**hooked, "predicted_s": hooked["predicted_hooked_s"], "hook_s": cost}
    return {"configs": out, "sweep": meta}


def layout(predicted: dict) -> tuple:
    """What tells two caps' bucket layouts apart in the sweep: their bucket count and
    predicted step time (the model's prediction depends on the layout alone)."""
    return (predicted["buckets"], round(predicted["predicted_s"], 9))


def measured_as(label: str | None, pred: dict, measured: Collection[str]) -> str | None:
    """The measured configuration that runs cap `label`: itself, else the measured cap
    of the same layout (the lab measures one cap per layout); None when neither."""
    if label is None or label in measured:
        return label
    if label not in pred:
        return None
    key = layout(pred[label])
    return next((m for m in measured if m in pred and m.startswith("cap")
                 and layout(pred[m]) == key), None)  # fmt: skip


def choose_configs(
    pred: dict, plan: Path | None, all_caps: bool, keep: tuple[str, ...] = ()
) -> list[dict]:
    """Plain, every cap of the sweep (one per distinct predicted layout unless
    `all_caps`: caps with as many buckets and the same prediction hold the same
    buckets; the caps in `keep`, the recommended one, always), the smallest cap's
    buckets through planner's hook (DDP's own order, so that only the hook's cost
    differs), and the Caramel plan `plan` where there is one (the file analyze wrote, or
    the plan its report predicts, which the lab writes itself)."""
    configs = [{"label": PLAIN, "cap": None, "plan": None}]
    seen: dict[tuple, str] = {}
    for label, c in sorted(pred.items(), key=lambda kv: kv[1].get("cap") or 0):
        if label in (PLAIN, CARAMEL, HOOK):
            continue
        key = layout(c)
        if key in seen and not all_caps and label not in keep:
            continue
        seen.setdefault(key, label)
        configs.append({"label": label, "cap": c["cap"], "plan": None})
    if HOOK in pred:  # the hook's cost: the same buckets as a measured cap, hooked
        configs.append({"label": HOOK, "cap": pred[HOOK]["cap"], "plan": None, "hook": "own"})
    if plan is not None and plan.exists():
        configs.append({"label": CARAMEL, "cap": None, "plan": str(plan)})
    return configs


def run_ddp(ns: str, job: str, args: argparse.Namespace, where: Path) -> dict:
    """One DDP job at one rate: bench-network, trace, analyze, interleaved measurement."""
    shape = {k: JOBS[job][k] for k in ("width", "layers", "batch")}
    grads = shape["layers"] * shape["width"] * (shape["width"] + 1) * 4
    record: dict = {"job": job, "shape": shape, "gradient_bytes": grads, "phases": {}, "notes": []}
    phases = record["phases"]
    if not args.no_bench_network:
        sizes = sorted({4096, 65536, grads // shape["layers"], grads // 4, grads})
        with cpuload.Sampler(args.interval) as load:
            record["network"] = bench_network(ns, where, sizes, args.net_repeats)
        phases["bench-network"] = load.total()
    base = {
        "mode": "trace",
        "world": 2,
        "shape": shape,
        "warmup": 3,
        "untraced": args.untraced_steps,
        "traced": args.traced_steps,
        "trace_dir": str(where / "trace" / "ranks"),
    }
    with cpuload.Sampler(args.interval) as load:
        traced = launch(ns, base, where / "trace", args.job_timeout)
    phases["trace"] = load.total() | {"peak_foreign_cores": load.peak()}
    untraced = statistics.median(per_step(traced, "untraced"))
    record["trace"] = {
        "untraced_s": untraced,
        "traced_s": statistics.median(per_step(traced, "traced")),
    }
    with cpuload.Sampler(args.interval) as load:
        report, notes = analyze(where / "trace" / "ranks", where, record.get("network"), untraced)
        own = {}  # the same trace with the network planner fits from it, for the record
        if not args.no_trace_fit:
            ranks = map(str, sorted((where / "trace/ranks").glob("rank*.json")))
            own = planner_cli(
                "analyze", *ranks, "-j", "1", "--untraced-step-time", f"{untraced:.6f}"
            )
    phases["analyze"] = load.total()
    record["notes"] += notes
    record["predicted"] = predictions(report, untraced)
    trace_fit = predictions(own, untraced)
    record["predicted_trace_fit"] = trace_fit
    rec = record["predicted"]["sweep"].get("recommended_cap_mb")
    keep = (f"cap{rec:g}",) if rec is not None else ()
    plan = where / "plan" / "bucket_plan.json"
    record["caramel_written"] = plan.exists()
    document = (report.get("exports") or {}).get("bucket_plan")
    if not plan.exists() and document:  # predicted but not written: measured all the same
        plan = where / "plan" / "bucket_plan_predicted.json"
        plan.write_text(json.dumps(document, indent=1) + "\n")
    configs = choose_configs(record["predicted"]["configs"], plan, args.all_caps, keep)
    if not args.no_aa:
        configs.insert(1, {"label": AA, "cap": None, "plan": None})
    record["configs"] = configs
    record["repeats"] = []
    for repeat in range(args.repeats):
        order = [c["label"] for c in configs for _ in range(max(1, args.steps // args.block))]
        random.Random(args.seed + repeat).shuffle(order)
        spec = {
            "mode": "measure",
            "world": 2,
            "shape": shape,
            "warmup": 3,
            "block": args.block,
            "configs": configs,
            "order": order,
        }
        with cpuload.Sampler(args.interval) as load:
            ranks = launch(ns, spec, where / f"measure{repeat}", args.job_timeout)
        phase = load.total() | {"peak_foreign_cores": load.peak()}
        phases[f"measure{repeat}"] = phase
        spans = ranks[0]["spans"]
        block_load = [load.window(s["start"], s["end"])["foreign_cores"] for s in spans]
        record["repeats"].append(
            {
                "order": order,
                "times": {
                    c["label"]: [
                        statistics.fmean(v)
                        for v in zip(*(r["times"][c["label"]] for r in ranks), strict=True)
                    ]
                    for c in configs
                },
                "blocks": ranks[0]["blocks"],
                "block_foreign_cores": block_load,
                "applied_by": ranks[0]["applied_by"],
            }
        )
    record["tc"] = netns.qdisc_stats(ns)
    record["summary"] = summarize(record, args)
    return record


def summarize(record: dict, args: argparse.Namespace) -> dict:
    """Per configuration: medians per repeat, pooled median, ratio to plain with its
    interval, prediction and its error; Spearman over the caps; the recommended cap
    against the fastest."""
    threshold = args.foreign_threshold
    pooled: dict[str, tuple[list[float], list[int]]] = {}
    flagged_blocks = 0
    for k, rep in enumerate(record["repeats"]):
        for label, times in rep["times"].items():
            blocks = rep["blocks"][label]
            keep = [
                (t, 1000 * k + b)
                for t, b in zip(times, blocks, strict=True)
                if not (args.discard_loaded and rep["block_foreign_cores"][b] > threshold)
            ]
            if not keep:  # every block loaded: keep them all rather than nothing
                keep = [(t, 1000 * k + b) for t, b in zip(times, blocks, strict=True)]
            ts, bs = pooled.setdefault(label, ([], []))
            ts += [t for t, _ in keep]
            bs += [b for _, b in keep]
        flagged_blocks += sum(v > threshold for v in rep["block_foreign_cores"])
    pred = record["predicted"]["configs"]
    rows = {}
    for config in record["configs"]:
        label = config["label"]
        times, blocks = pooled[label]
        row = {
            "median_s": statistics.median(times),
            "per_repeat_s": [statistics.median(r["times"][label]) for r in record["repeats"]],
            "steps": len(times),
            "predicted_s": pred.get(label, {}).get("predicted_s"),
            "buckets": pred.get(label, {}).get("buckets"),
        }
        if label != PLAIN:
            ratio, low, high = stats.ratio_interval((times, blocks), pooled[PLAIN])
            row["ratio"], row["ratio_low"], row["ratio_high"] = ratio, low, high
        if row["predicted_s"]:
            row["error"] = row["predicted_s"] / row["median_s"] - 1
        rows[label] = row
    caps = [c["label"] for c in record["configs"] if c["label"].startswith("cap")]
    known = [c["label"] for c in record["configs"] if rows[c["label"]]["predicted_s"]]
    rec = record["predicted"]["sweep"].get("recommended_cap_mb")
    rec_label = f"cap{rec:g}" if rec is not None else None
    rec_run = measured_as(rec_label, pred, caps)  # a cap of the recommended layout
    fastest = min(caps, key=lambda c: rows[c]["median_s"]) if caps else None
    within = None
    if rec_run is not None and fastest:
        r, lo, hi = stats.ratio_interval(pooled[rec_run], pooled[fastest])
        within = rec_run == fastest or lo <= 1.0
    hook = None
    twin = measured_as(f"cap{pred[HOOK]['cap']:g}", pred, caps) if HOOK in pred else None
    if HOOK in rows and twin is not None:  # the hook against the same buckets without it
        calls = pred[HOOK]["buckets"]
        ratio, lo, hi = stats.ratio_interval(pooled[HOOK], pooled[twin])
        hook = {
            "against": twin,
            "calls": calls,
            "ratio": ratio,
            "ratio_low": lo,
            "ratio_high": hi,
            "call_s": (rows[HOOK]["median_s"] - rows[twin]["median_s"]) / calls,
            "predicted_call_s": pred[HOOK]["hook_s"] / calls,
        }
    phases = record["phases"]
    return {
        "rows": rows,
        "spearman_caps": stats.spearman(
            [rows[c]["predicted_s"] for c in caps], [rows[c]["median_s"] for c in caps]
        ),
        "spearman_all": stats.spearman(
            [rows[c]["predicted_s"] for c in known], [rows[c]["median_s"] for c in known]
        ),
        "recommended": rec_label,
        "recommended_measured_as": rec_run,
        "fastest_cap": fastest,
        "recommended_within_interval_of_fastest": within,
        "hook": hook,
        "flagged_phases": [p for p, v in phases.items() if v["foreign_cores"] > threshold],
        "flagged_blocks": flagged_blocks,
        "blocks": sum(len(r["block_foreign_cores"]) for r in record["repeats"]),
    }


def _fmt(value: float | None, spec: str, scale: float = 1.0, suffix: str = "") -> str:
    if value is None:
        return ""
    return f"{value * scale if scale != 1.0 else value:{spec}}{suffix}"


def table(rate: str, check: dict | None, record: dict, threshold: float) -> str:
    """The predicted-vs-measured Markdown table of one job at one rate."""
    s, lines = record["summary"], [f"### {record['job']} at {rate}", ""]
    sweep = record["predicted"].get("sweep") or {}
    if check:
        lines.append(
            f"- rate check (TCP from {check.get('address', '127.0.0.1')}, "
            f"{check['bytes'] / 1e6:.0f} MB): {check['mbit_s']:.1f} Mbit/s"
        )
    net = record.get("network")
    if net:
        lines.append(
            f"- bench-network in the namespace: a = {net['a'] * 1e3:.2f} ms, "
            f"b = {net['b'] * 1e9:.3f} ns/B (R2 {net['r2']:.3f}): "
            f"{net['implied_mbit_s']:.0f} Mbit/s on the shared class"
        )
    own = (record.get("predicted_trace_fit") or {}).get("sweep") or {}
    fit = own.get("network") or {}
    if fit.get("b"):
        lines.append(
            f"- trace's own network fit ({own.get('network_source')}): "
            f"a = {fit['a'] * 1e3:.2f} ms, b = {fit['b'] * 1e9:.3f} ns/B: "
            f"{16 / fit['b'] / 1e6:.0f} Mbit/s"
        )
    if record.get("addresses"):
        lines.append(f"- tasks' addresses (one htb class each): {record['addresses']}")
    tr = record["trace"]
    line = (
        f"- trace: untraced step {tr['untraced_s'] * 1e3:.1f} ms, traced "
        f"{tr['traced_s'] * 1e3:.1f} ms"
    )
    if sweep:
        line += (
            f"; kappa {sweep.get('kappa')} ({sweep.get('kappa_source')}); replay error "
            f"{_fmt(sweep.get('replay_error'), '+.1%')}; advice: {sweep.get('reason')}"
        )
    lines.append(line)
    loads = ", ".join(
        f"{p} {v['foreign_cores']:.2f}"
        + (f" / {v['own_wait_cores']:.2f}" if "own_wait_cores" in v else "")
        for p, v in record["phases"].items()
    )
    flagged = s["flagged_phases"]
    lines.append(
        f"- foreign CPU, cores / the job's run-queue wait, thread-cores: {loads}; "
        f"threshold {threshold:.2f} foreign cores: "
        + (f"**FLAGGED: {', '.join(flagged)}**" if flagged else "none flagged")
        + f"; blocks above it: {s['flagged_blocks']} of {s['blocks']}"
    )
    if "trace" in flagged:
        lines.append(
            f"- **the trace was taken under foreign load** "
            f"({record['phases']['trace']['foreign_cores']:.2f} cores): what planner "
            f"calibrates on it (kappa, the compute times) carries that load"
        )
    lines += [f"- note: {note}" for note in record["notes"]]
    reps = " / ".join(f"r{k + 1}" for k in range(len(record["repeats"])))
    lines += [
        "",
        f"| config | buckets | predicted | pred. vs plain | measured ({reps}) | "
        "measured median | measured vs plain [95% CI] | pred. error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    plain = s["rows"][PLAIN]
    applied = record["repeats"][0]["applied_by"] if record["repeats"] else {}
    for config in record["configs"]:
        label = config["label"]
        row = s["rows"][label]
        tags = [
            t
            for t, on in (
                ("recommended", label == s["recommended"]),
                (
                    f"runs the recommended {s['recommended']}",
                    label == s.get("recommended_measured_as") != s["recommended"],
                ),
                ("fastest cap", label == s["fastest_cap"]),
                (f"hook: {applied.get(label)}", label in applied),
                ("as traced", label == PLAIN),
                ("A/A: plain again", label == AA),
            )
            if on
        ]
        name = label + (f" ({', '.join(tags)})" if tags else "")
        p, base = row["predicted_s"], plain["predicted_s"]
        pvs = f"{p / base - 1:+.1%}" if p and base and label != PLAIN else ""
        each = " / ".join(f"{t * 1e3:.1f}" for t in row["per_repeat_s"])
        ratio = (
            f"{row['ratio'] - 1:+.1%} [{row['ratio_low'] - 1:+.1%}, {row['ratio_high'] - 1:+.1%}]"
            if "ratio" in row
            else ""
        )
        lines.append(
            f"| {name} | {_fmt(row['buckets'], 'd')} | {_fmt(p, '.1f', 1e3, ' ms')} | "
            f"{pvs} | {each} ms | {row['median_s'] * 1e3:.1f} ms | {ratio} | "
            f"{_fmt(row.get('error'), '+.1%')} |"
        )
    every, caps = s["spearman_all"], s["spearman_caps"]
    line = (
        f"\nSpearman(predicted, measured): every predicted configuration "
        f"{_fmt(every, '+.2f') or 'n/a'}"
    )
    if s["fastest_cap"]:
        within = s["recommended_within_interval_of_fastest"]
        line += (
            f"; the caps {_fmt(caps, '+.2f') or 'n/a'}. Recommended cap: "
            f"{s['recommended'] or 'none'}; fastest measured: {s['fastest_cap']}"
            + (
                ""
                if within is None
                else f" (recommended within its interval: {'yes' if within else 'no'})"
            )
        )
    lines.append(line)
    hook = s.get("hook")
    if hook:
        lines.append(
            f"\nThe gated hook on {hook['against']}'s {hook['calls']} buckets (DDP's own order, "
            f"`ddp_order=False`): {hook['ratio'] - 1:+.1%} [{hook['ratio_low'] - 1:+.1%}, "
            f"{hook['ratio_high'] - 1:+.1%}] against the same buckets without it, "
            f"{hook['call_s'] * 1e3:.2f} ms per call (predicted: "
            f"{hook['predicted_call_s'] * 1e3:.2f} ms, the step's share of the calls' time)"
        )
    held = record.get("order_held") or {}
    if held:
        lines.append(
            "\nOrder held (`planner verify` of a few traced steps of each enforced "
            "configuration, both workers): "
            + "; ".join(
                f"{label} {h['in_order']}/{h['steps']}" if "steps" in h else f"{label} n/a"
                for label, h in held.items()
            )
        )
    return "\n".join(lines) + "\n"


def preflight(jobs: list[str]) -> str | None:
    """What is missing to run the lab here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` on PATH"
    if any(JOBS[j]["kind"] == "ddp" for j in jobs) and importlib.util.find_spec("torch") is None:
        return "needs torch for the DDP jobs"
    for job in jobs:
        if JOBS[job]["kind"] == "tf":
            if importlib.util.find_spec("tensorflow") is None:
                return "needs tensorflow for the TF jobs"
            if not Path(JOBS[job]["graph"]).exists():
                return f"{job} needs {JOBS[job]['graph']} (../shared/traces)"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--job", action="append", choices=sorted(JOBS), help="repeatable")
    parser.add_argument("--rate", action="append", help="e.g. 1000mbit, unshaped; repeatable")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per config and repeat")
    parser.add_argument("--block", type=int, default=5, help="consecutive steps of one config")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("lab-out"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--foreign-threshold",
        type=float,
        default=0.10,
        help="foreign CPU, in cores, above which a phase or block is flagged",
    )
    parser.add_argument(
        "--discard-loaded",
        action="store_true",
        help="leave blocks above the threshold out of the statistics",
    )
    parser.add_argument("--interval", type=float, default=0.5, help="CPU sampling (s)")
    parser.add_argument("--untraced-steps", type=int, default=8)
    parser.add_argument("--traced-steps", type=int, default=5)
    parser.add_argument(
        "--all-caps",
        action="store_true",
        help="measure every cap, also those predicted to share a layout",
    )
    parser.add_argument("--no-bench-network", action="store_true")
    parser.add_argument(
        "--no-trace-fit", action="store_true", help="skip analyze with the trace's own network fit"
    )
    parser.add_argument(
        "--no-aa", action="store_true", help="no second plain copy (the A/A noise floor)"
    )
    parser.add_argument("--net-repeats", type=int, default=10)
    parser.add_argument("--check-tries", type=int, default=2, help="TCP checks (the fastest)")
    parser.add_argument("--check-mb", type=float, default=50.0, help="TCP check size (MB)")
    parser.add_argument(
        "--check-rate", action="store_true", help="only the TCP check and bench-network, per rate"
    )
    parser.add_argument("--pfifo-limit", type=int, help="pfifo leaf limit (packets)")
    parser.add_argument("--job-timeout", type=float, default=900.0)
    args = parser.parse_args(argv)
    jobs = args.job or ["ddp-mlp"]
    rates = args.rate or ["1000mbit"]
    for rate in rates:
        netns.parse_rate(rate)
    missing = preflight([] if args.check_rate else jobs)
    if missing:
        print(f"lab: {missing}", file=sys.stderr)
        return 2
    for name in netns.stale():
        netns.remove(name)
        print(f"lab: removed stale namespace {name}", file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    document: dict = {
        "schema": "planner.lab/1",
        "argv": sys.argv[1:] if argv is None else argv,
        "foreign_threshold_cores": args.foreign_threshold,
        "runs": [],
    }
    tables = []
    try:
        for rate in rates:
            for job in [None] if args.check_rate else jobs:
                kind = JOBS[job]["kind"] if job else None
                sources = tf_lab.SOURCES if kind == "tf" else []
                with netns.shaped_namespace(rate, sources, limit=args.pfifo_limit) as ns:
                    where = args.out / (job or "check") / rate
                    where.mkdir(parents=True, exist_ok=True)
                    (where / "namespace").write_text(ns + "\n")
                    print(f"lab: {job or 'rate check'} at {rate} in {ns}", file=sys.stderr)
                    run: dict = {
                        "rate": rate,
                        "rate_bit_s": netns.parse_rate(rate),
                        "namespace": ns,
                    }
                    with cpuload.Sampler(args.interval) as load:
                        address = (sources or ["127.0.0.1"])[0]
                        run["check"] = check_rate(ns, args.check_mb, address, args.check_tries) | {
                            "address": address
                        }
                    run["check"]["foreign_cores"] = load.total()["foreign_cores"]
                    if job is None:
                        sizes = [64, 4096, 65536, 1 << 20, 4 << 20]
                        with cpuload.Sampler(args.interval) as load:
                            run["network"] = bench_network(ns, where, sizes, args.net_repeats)
                        run["network"]["foreign_cores"] = load.total()["foreign_cores"]
                        print(
                            json.dumps(
                                {
                                    "rate": rate,
                                    "tcp_mbit_s": run["check"]["mbit_s"],
                                    "bench_network_mbit_s": run["network"]["implied_mbit_s"],
                                }
                            ),
                            flush=True,
                        )
                    else:
                        if kind == "tf":
                            tools = sys.modules[__name__]
                            run |= tf_lab.run_tf(ns, job, JOBS[job], args, where, tools)
                            run["tc"] = netns.qdisc_stats(ns)
                            run["summary"] = summarize(run, args)
                        else:
                            run |= run_ddp(ns, job, args, where)
                        tables.append(table(rate, run["check"], run, args.foreign_threshold))
                        print(tables[-1], flush=True)
                    document["runs"].append(run)
                    (args.out / "lab.json").write_text(json.dumps(document, indent=1) + "\n")
    finally:
        (args.out / "lab.json").write_text(json.dumps(document, indent=1) + "\n")
        if tables:
            (args.out / "tables.md").write_text("\n".join(tables))
    return 0


if __name__ == "__main__":
    sys.exit(main())
