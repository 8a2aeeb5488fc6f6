"""Each speed lever's effect on one training step, measured in alternating fresh processes.

Some levers are process settings that cannot be undone inside a process (the host allocator) or
change what a process compiles (``--compile``), so ``mfu.py`` alone cannot put them side by side.
This script runs ``mfu.py`` once per lever per round, the baseline first and the levers after it in
turn (A B C … A B C …), each a fresh process timing the same step (default: MoCo v3, 1024-wide heads,
Fashion-MNIST, batch 256), and reports per lever the median step time and the median of the
per-round ratios baseline / lever (> 1: the lever is faster), which holds when the machine's speed
drifts between rounds. Writes ``results/levers.json``.

    python benchmarks/levers.py                                    # allocator, compile, attention path
    python benchmarks/levers.py --rounds 5 --levers "compile=--compile" "one thread=--threads 1"
    python benchmarks/levers.py --quick                            # smoke test (digits, batch 16)
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from throughput import _device, machine_info, write_report  # noqa: E402

# name=extra mfu.py flags; the baseline is the default step (cached host allocator, eager, fused attention)
LEVERS = ("glibc's own allocator=--host-allocator system", "compile=--compile", "plain attention=--attention matmul")


def run_once(case: list[str], extra: list[str], out: Path) -> dict:
    """One fresh ``mfu.py`` process for one case; its selfsup figures."""
    cmd = [sys.executable, str(HERE / "mfu.py"), *case, *extra, "--no-lightly", "--reps", "1", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"mfu.py failed ({shlex.join(cmd)}):\n{done.stderr[-2000:]}")
    report = json.loads(out.read_text())
    (result,) = report["results"].values()
    s = result["selfsup"]
    return {"step_ms": s["step_ms_best"], "cpu_step_ms": s["cpu_step_ms_best"], "mfu": s["mfu_best"],
            "peak_flops": report["peak_flops"],
            "flop_kernels_share": (s.get("flop_kernels") or {}).get("flop_kernels_share")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--levers", nargs="+", default=list(LEVERS),
                   help="NAME=FLAGS (mfu.py flags), each against the baseline")
    p.add_argument("--method", default="moco_v3")
    p.add_argument("--heads", default="wide", choices=("preset", "wide"))
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=4, help="timed steps per process")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(HERE / "results" / "levers.json"))
    p.add_argument("--quick", action="store_true", help="smoke test: mfu.py --quick, one round")
    args = p.parse_args(argv)
    levers = {"baseline": []}
    for item in args.levers:
        name, sep, flags = item.partition("=")
        if not sep or not name.strip():
            p.error(f"--levers takes NAME=FLAGS, got {item!r}")
        levers[name.strip()] = shlex.split(flags)
    case = ["--methods", args.method, "--heads", args.heads, "--threads", str(args.threads), "--steps", str(args.steps)]
    if args.quick:
        case, args.rounds = ["--quick", "--methods", args.method, "--threads", "1"], 1

    started = time.perf_counter()
    runs: dict[str, list[dict]] = {name: [] for name in levers}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, extra in levers.items():
                runs[name].append(run_once(case, extra, Path(tmp) / "mfu.json"))
                print(f"[round {r + 1}/{args.rounds}] {name:<28} {runs[name][-1]['step_ms']:8.1f} ms/step",
                      file=sys.stderr, flush=True)
    base = runs["baseline"]
    results = {}
    for name, rs in runs.items():
        ratios = [b["step_ms"] / x["step_ms"] for b, x in zip(base, rs)]
        results[name] = {"flags": levers[name], "runs": rs,
                         "step_ms_median": statistics.median(x["step_ms"] for x in rs),
                         "cpu_step_ms_median": statistics.median(x["cpu_step_ms"] for x in rs),
                         "speedup_median": statistics.median(ratios),
                         "speedup_each_round": [round(x, 3) for x in ratios]}
    report = {"benchmark": "levers", "settings": {"case": case, "rounds": args.rounds, "quick": args.quick},
              "machine": machine_info(_device()), "wall_s": time.perf_counter() - started, "results": results}
    write_report(report, args.out)
    print(f"\n{' '.join(case)}; {args.rounds} rounds, each lever in a fresh process after the baseline")
    print(f"{'lever':<28} {'ms/step (median)':>16} {'CPU ms':>8} {'speed-up vs baseline (median, each round)':>44}")
    for name, r in results.items():
        each = " ".join(f"{x:.2f}" for x in r["speedup_each_round"])
        print(f"{name:<28} {r['step_ms_median']:>16.1f} {r['cpu_step_ms_median']:>8.1f} "
              f"{r['speedup_median']:>9.2f}x   ({each})")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
