"""Each speed lever's effect on one training step, measured in alternating fresh processes.

Some levers are process settings that cannot be undone inside a process (the host allocator) or
change what a process compiles (``--compile``), so ``mfu.py`` alone cannot put them side by side.
This script runs ``mfu.py`` once per lever per round, the baseline first and the levers after it in
turn (A B C … A B C …), each a fresh process timing the same step (default: MoCo v3, 1024-wide heads,
Fashion-MNIST, batch 256), and reports per lever the median step time and the median of the
per-round ratios baseline / lever (> 1: the lever is faster), which holds when the machine's speed
drifts between rounds. Writes ``results/levers.json``.

    python -m benchmarks.levers                                    # allocator, compile, attention path
    python -m benchmarks.levers --rounds 5 --levers "compile=--compile" "one thread=--threads 1"
    python -m benchmarks.levers --quick                            # smoke test (digits, batch 16)
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

from benchmarks.harness import (RESULTS, child_env, default_device, machine_info, module_cli, pretrain, read_report,
                                trained, write_report)

# name=extra mfu.py flags; the baseline is the default step (cached host allocator, eager, fused attention)
LEVERS = ("glibc's own allocator=--host-allocator system", "compile=--compile", "plain attention=--attention matmul")


def run_once(case: list[str], extra: list[str], out: Path) -> dict:
    """One fresh ``benchmarks.mfu`` process for one case; its selfsup figures."""
    cmd = module_cli("mfu", *case, *extra, "--no-lightly", "--reps", "1", "--out", str(out))
    done = subprocess.run(cmd, capture_output=True, text=True, env=child_env())
    if done.returncode != 0:
        raise SystemExit(f"mfu.py failed ({shlex.join(cmd)}):\n{done.stderr[-2000:]}")
    report = json.loads(out.read_text())
    (result,) = report["results"].values()
    s = result["selfsup"]
    return {"step_ms": s["step_ms_best"], "cpu_step_ms": s["cpu_step_ms_best"], "mfu": s["mfu_best"],
            "peak_flops": report["peak_flops"],
            "flop_kernels_share": (s.get("flop_kernels") or {}).get("flop_kernels_share")}


def stop_after_epoch():
    """A Lightning callback ending fit after the first epoch (its checkpoint is written): the run to resume."""
    import lightning.pytorch as pl

    class Stop(pl.Callback):
        def on_train_epoch_end(self, trainer, pl_module):
            trainer.should_stop = trainer.current_epoch == 0

    return Stop()


def compiled_step_graphs(preset: str, overrides: list[str], backend: str, out_dir: Path) -> dict:
    """``selfsup pretrain`` of ``preset`` under ``trainer.compile=true``: 2 epochs stopped after the first, then
    resumed (dynamo reset, as in the new process a resume is), counting what dynamo made of the step: graphs,
    graph breaks, and recompilations (every graph of the one step frame after its first; ``fullgraph`` is off
    here so that a break would be counted, not raised)."""
    import torch
    from torch._dynamo.utils import counters

    import selfsup.engine as engine
    from selfsup.config import load_run
    from selfsup.methods import base

    compile_step = base.compile_step
    base.compile_step = lambda method, backend="inductor", mode=None, fullgraph=True: compile_step(
        method, backend, mode, fullgraph=False)
    run = out_dir / "graphs"
    sessions = []
    try:
        for session in ("first", "resumed"):
            torch._dynamo.reset()
            counters.clear()
            started = time.perf_counter()
            if session == "first":
                pretrain(preset, [*overrides, "trainer.compile=true", f"trainer.compile_backend={backend}"], run,
                         callbacks=[stop_after_epoch()])
            else:
                engine.pretrain(load_run(run), resume=run)
            steps = trained(run).facts["global_step"]
            graphs = counters["stats"]["unique_graphs"]
            sessions.append({"session": session, "global_step_at_end": steps, "graphs": graphs,
                             "graph_breaks": sum(counters["graph_break"].values()),
                             "graph_break_reasons": dict(counters["graph_break"]),
                             "recompilations": max(graphs - 1, 0), "wall_s": time.perf_counter() - started})
    finally:
        base.compile_step = compile_step
    return {"preset": preset, "overrides": overrides, "backend": backend, "sessions": sessions}


# the step-graph cases: the DINO step holds two crop sizes (2 global 8 px crops, 4 local 4 px ones), MoCo v3's
# the cosine momentum of every step; 2 epochs of 25 steps, stopped after the first and resumed
GRAPH_CASES = {
    "dino": ("dino-digits", ["trainer.max_epochs=2", "trainer.limit_train_batches=25", "data.batch_size=32",
                             "method.warmup_teacher_temp_epochs=2"]),
    "moco_v3": ("moco-v3-vit-digits", ["trainer.max_epochs=2", "trainer.limit_train_batches=25",
                                       "data.batch_size=32"]),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--levers", nargs="+", default=list(LEVERS),
                   help="NAME=FLAGS (benchmarks.mfu flags), each against the baseline")
    p.add_argument("--method", default="moco_v3")
    p.add_argument("--heads", default="wide", choices=("preset", "wide"))
    p.add_argument("--rounds", type=int, default=4,
                   help="0: only the compiled-step graph counts, written into the JSON at --out beside its levers")
    p.add_argument("--steps", type=int, default=4, help="timed steps per process")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(RESULTS / "levers.json"))
    p.add_argument("--quick", action="store_true", help="smoke test: mfu.py --quick, one round")
    p.add_argument("--graphs", default=None,
                   help="the compiled-step graph counts of these cases (default " + ",".join(GRAPH_CASES)
                        + "; none with --quick; '' for none)")
    p.add_argument("--graphs-backend", default="aot_eager",
                   help="the backend of the graph count (dynamo decides graphs and breaks whatever the backend)")
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
    graphs = {}
    if args.graphs is None:
        args.graphs = "" if args.quick else ",".join(GRAPH_CASES)
    with tempfile.TemporaryDirectory() as tmp:
        for name in [g.strip() for g in args.graphs.split(",") if g.strip()]:
            if name not in GRAPH_CASES:
                p.error(f"--graphs takes {','.join(GRAPH_CASES)}, got {name!r}")
            preset, overrides = GRAPH_CASES[name]
            overrides = [*overrides, "trainer.progress_bar=false", "trainer.accelerator=cpu", "trainer.devices=1"]
            if args.quick:
                overrides += ["trainer.limit_train_batches=2", "data.batch_size=16"]
            graphs[name] = compiled_step_graphs(preset, overrides, args.graphs_backend, Path(tmp) / name)
            for sess in graphs[name]["sessions"]:
                print(f"[graphs] {name:<8} {sess['session']:<8} {sess['graphs']} graph(s), {sess['graph_breaks']} "
                      f"break(s), {sess['recompilations']} recompilation(s) by step {sess['global_step_at_end']}",
                      file=sys.stderr, flush=True)
    if args.rounds == 0:  # the graph counts only, beside the levers' last results
        report = read_report(args.out) or {"benchmark": "levers", "results": {}}
        report["compiled_step_graphs"] = graphs
        write_report(report, args.out)
        print(f"wrote the compiled-step graph counts into {args.out}")
        return 0
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
              "machine": machine_info(default_device()), "wall_s": time.perf_counter() - started, "results": results,
              "compiled_step_graphs": graphs}
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
