"""trainer.compile's variants side by side in one process: the eager step, the whole step forward compiled
(inductor default, ``max-autotune-no-cudagraphs``, with compiled autograd for the backward) and each module
compiled on its own (the earlier ``trainer.compile``), all with the same weights and views, alternating per
repetition so drift in machine load hits every variant (MoCo v3, 1024-wide heads, Fashion-MNIST). The
optimiser is the presets' fused AdamW in every variant; the EMA update is inside the compiled graph.

    python -m benchmarks.compile_modes --batch-size 64 --threads 1 --reps 4
    python -m benchmarks.compile_modes --variants eager,step,modules

Per variant: its first calls (the first holds the compilation), each repetition's mean step time and the
per-repetition ratio eager / variant (> 1: faster), with their median. Writes results/compile_modes.json.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from contextlib import nullcontext

import torch

from benchmarks import mfu
from benchmarks.harness import RESULTS, machine_info, write_report

# name: (trainer.compile, trainer.compile_mode, scope)
VARIANTS = {"eager": (False, None, "step"), "step": (True, None, "step"),
            "step_max_autotune": (True, "max-autotune-no-cudagraphs", "step"),
            "step_compiled_autograd": (True, None, "step"), "modules": (True, None, "modules")}


class CompiledAutogradStep(mfu.SelfsupStep):
    """The compiled step with its backward captured at run time by compiled autograd (inductor)."""

    def __call__(self, views):
        with torch._dynamo.compiled_autograd._enable(torch.compile(backend="inductor")):
            self.loss(views).backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS))
    p.add_argument("--method", default="moco_v3", choices=mfu.METHODS)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--steps", type=int, default=3, help="timed steps per repetition (after 1 untimed)")
    p.add_argument("--out", default=str(RESULTS / "compile_modes.json"))
    args = p.parse_args(argv)
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    if "eager" not in names or any(n not in VARIANTS for n in names):
        p.error(f"--variants takes eager (required) and any of {','.join(VARIANTS)}")
    torch.set_num_threads(args.threads)
    from selfsup import host
    host.cache_freed_memory()
    from selfsup.data.datasets import load_dataset
    from selfsup.methods.build import data_info

    bench = argparse.Namespace(batch_size=args.batch_size, memory_format="auto", set=[], recipe=None, synthetic=False)
    cfg = mfu.selfsup_config(args.method, "fashion-mnist", "wide", bench)
    info = data_info(cfg, load_dataset(cfg.data, "train"))
    device = torch.device("cpu")
    batches, _, _ = mfu.make_views(cfg, info, device, 2, bench)
    started = time.perf_counter()
    steps, first, weights = {}, {}, None
    for name in names:
        compiled, mode, scope = VARIANTS[name]
        c = copy.deepcopy(cfg)
        c.trainer.compile, c.trainer.compile_mode = compiled, mode
        step = (CompiledAutogradStep if name == "step_compiled_autograd" else mfu.SelfsupStep)(
            c, info, device, nullcontext, scope)
        if weights is None:
            weights = step.model.state_dict()
        step.model.load_state_dict(weights)
        first[name] = mfu.first_steps(step, batches, device, 2)
        print(f"{name:<24} first calls {[round(x, 2) for x in first[name]]} s", file=sys.stderr, flush=True)
        steps[name] = step
    times = {k: [] for k in steps}
    for rep in range(args.reps):
        for k in (list(steps) if rep % 2 == 0 else list(steps)[::-1]):
            t = mfu.time_step(steps[k], batches, 1, args.steps, device)
            times[k].append(sum(w for w, _ in t) / len(t))
            print(f"[rep {rep + 1}/{args.reps}] {k:<24} {1000 * times[k][-1]:8.1f} ms/step", file=sys.stderr,
                  flush=True)
    results = {}
    for k, ts in times.items():
        ratios = [e / x for e, x in zip(times["eager"], ts)]
        results[k] = {"settings": dict(zip(("compile", "compile_mode", "scope"), VARIANTS[k])),
                      "first_calls_s": first[k], "rep_step_ms": [round(1000 * x, 2) for x in ts],
                      "speedup_vs_eager_each_rep": [round(x, 3) for x in ratios],
                      "speedup_vs_eager_median": statistics.median(ratios)}
    report = {"benchmark": "compile_modes",
              "settings": {"method": args.method, "heads": "wide", "batch_size": args.batch_size,
                           "threads": args.threads, "reps": args.reps, "steps": args.steps},
              "machine": machine_info(device), "wall_s": time.perf_counter() - started, "results": results}
    write_report(report, args.out)
    print(f"\n{args.method} wide, batch {args.batch_size}, {args.threads} thread(s), {args.reps} alternating reps")
    for k, r in results.items():
        each = " ".join(f"{x:.2f}" for x in r["speedup_vs_eager_each_rep"])
        print(f"{k:<24} first call {r['first_calls_s'][0]:7.1f} s   x{r['speedup_vs_eager_median']:.2f} eager ({each})")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
