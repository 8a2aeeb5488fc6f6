"""The claim ``gram-anchoring-keeps-dense-features`` at a budget of one's choosing (issue 65 part 3): dinov3-fmnist with
and without its Gram term for ``--epochs`` (the Gram phase in proportion: ``claims.gram_anchoring.gram_phase``), one
process per seed list, so that several run side by side on one GPU; ``--combine`` merges the per-process JSONs and
judges the claim's rules on them.

    python -m benchmarks.gram_anchoring --epochs 30 --seeds 0 --accelerator gpu --out /tmp/gram_s0.json
    python -m benchmarks.gram_anchoring --combine /tmp/gram_s*.json --out benchmarks/results/gram_anchoring_30ep.json
    python -m benchmarks.gram_anchoring --quick --epochs 1 --out /tmp/gram_quick.json   # a smoke test on digits, CPU

Each row: the seed, both arms' kNN@20 top-1 (the EMA teacher, the 10,000 test images) and dense mIoU (undefined until
``selfsup eval segment`` is in the tree), their fit seconds and steps, and the machine."""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

from selfsup.claims import gram_anchoring
from selfsup.claims.suite import Context, judge, mean_ci

CLAIM = gram_anchoring.CLAIMS[0]


def measure(args) -> dict:
    """Both arms for each seed of ``--seeds`` through the claim's own measurement, in ``--work``."""
    overrides = [f"trainer.accelerator={args.accelerator}", *args.set]
    if args.quick:  # digits (8 x 8, patch 2): no Fashion-MNIST files needed
        overrides += ["data.name=digits", "model.patch_size=2", "augment.local_crops_size=4",
                      "trainer.limit_train_batches=2", "data.batch_size=32", "method.out_dim=32",
                      "method.ibot_out_dim=32", "method.hidden_dim=32", "method.bottleneck_dim=16",
                      "method.ibot_hidden_dim=32", "method.ibot_bottleneck_dim=16"]
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    for seed in seeds:
        ctx = Context(quick=args.quick, seeds=1, work=Path(args.work), overrides=overrides, first_seed=seed)
        t0 = time.perf_counter()
        out = gram_anchoring.measure_gram_keeps_dense(ctx, epochs=args.epochs)
        rows.append({"seed": seed, **{k: v[0] for k, v in out["metrics"].items()}, "runs": ctx.runs,
                     "wall_s": round(time.perf_counter() - t0, 1)})
    return {"claim": CLAIM.id, "epochs": args.epochs, "quick": args.quick, "accelerator": args.accelerator,
            "overrides": overrides, "machine": platform.processor() or platform.machine(), "rows": rows}


def combined(parts: list[dict]) -> dict:
    """The rows of several runs of one budget, and the claim's rules judged on them."""
    budget = {(p["epochs"], p["quick"]) for p in parts}
    if len(budget) != 1:
        raise SystemExit(f"--combine: the JSONs were measured at other budgets: {sorted(budget)}")
    rows = sorted((r for p in parts for r in p["rows"]), key=lambda r: r["seed"])
    metrics = {k: [r[k] for r in rows] for k in ("gram_miou", "no_gram_miou", "miou_gain", "gram_knn",
                                                 "no_gram_knn", "knn_gain")}
    verdict, stats = judge(CLAIM.rules, metrics, test_images=10_000)
    return {**parts[0], "rows": rows, "metrics": metrics, "verdict": verdict, "statistics": stats}


def summary(result: dict) -> str:
    m = result["metrics"]
    dense = "undefined (no selfsup eval segment)" if any(math.isnan(v) for v in m["miou_gain"]) \
        else mean_ci(m["miou_gain"])
    return (f"{CLAIM.id} at {result['epochs']} epochs, {len(result['rows'])} seed(s): kNN gain with Gram "
            f"{mean_ci(m['knn_gain'])} points; dense mIoU gain {dense}; verdict {result['verdict']}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--seeds", default="0", help="comma list; each seed trains both arms")
    p.add_argument("--accelerator", default="cpu", choices=("cpu", "gpu"))
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="extra overrides for every run")
    p.add_argument("--work", default="runs/gram_anchoring")
    p.add_argument("--quick", action="store_true", help="2 steps an epoch, narrow heads (a smoke test)")
    p.add_argument("--combine", nargs="+", metavar="JSON", help="merge these JSONs and judge the claim")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.combine:
        result = combined([json.loads(Path(f).read_text()) for f in args.combine])
        print(summary(result))
    else:
        result = measure(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1, default=float) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
