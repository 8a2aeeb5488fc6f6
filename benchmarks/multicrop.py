"""The multi-crop training step: images/s with crops batched by resolution against crop-by-crop forwarding.

One DINO step (teacher on the 2 global crops, student on every crop, loss, centre, backward, per-tensor
clipping, AdamW, EMA) on a fixed batch of views, two ways:
  * batched: ``encode_views`` puts the crops of one resolution through a backbone in one call (DINO's
    MultiCropWrapper: 2 calls for globals + locals), the head runs once on all crops;
  * crop_by_crop: one backbone call per crop (what a two-view loop extended to N crops does).
Both give the same outputs (tests/test_multicrop.py); the rounds alternate between the two, and the ratio is
taken per round (shared machine). Rates are images (samples of the batch, each with all its crops) per
second of wall time and per CPU-second of this process.

    python -m benchmarks.multicrop [--quick] [--rounds 5] [--steps 3]   → benchmarks/results/multicrop.json
"""

from __future__ import annotations

import argparse
import statistics

import torch

from benchmarks.harness import RESULTS, default_device, sync, timed, write_report

CASES = {  # name: (backbone, patch, image size, local size, local crops, batch, K)
    "micro_fmnist": ("vit_micro", 4, 28, 12, 6, 64, 1024),
    "tiny_vit_s16_like": ("vit_tiny", 16, 224, 96, 8, 8, 4096),
}


def build(case: str, device: torch.device):
    from selfsup.config import resolve
    from selfsup.methods import DataInfo
    from selfsup.methods.build import build_method

    backbone, patch, size, local, n_local, batch, k = CASES[case]
    cfg = resolve({"method": {"name": "dino", "out_dim": k, "hidden_dim": 512, "bottleneck_dim": 128},
                   "data": {"name": "digits", "batch_size": batch},
                   "augment": {"recipe": "dino", "local_crops_number": n_local, "local_crops_size": local},
                   "model": {"backbone": backbone, "patch_size": patch, "pos_embed": "learned",
                             "init": "trunc_normal", "drop_path_rate": 0.1},
                   "optim": {"decay_1d": False}, "trainer": {"accelerator": "cpu"}})
    model = build_method(cfg, DataInfo(3, size, (0.5,) * 3, (0.25,) * 3)).to(device).train()
    g = torch.Generator().manual_seed(0)
    views = [torch.randn(batch, 3, s, s, generator=g).to(device) for s in [size] * 2 + [local] * n_local]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    return model, views, optimizer, batch


def step(model, views, optimizer) -> None:
    out = model.forward_views(views)
    out.loss.backward()
    model.on_before_optimizer_step(optimizer)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    for hook in model.post_step_hooks:  # the teacher EMA (DINO), as the training base runs it
        hook()


def steps_time(model, views, optimizer, steps: int, device) -> tuple[float, float]:
    """(wall, process CPU) seconds of ``steps`` steps."""
    sync(device)
    times = timed(lambda: step(model, views, optimizer), steps, device=device)
    return sum(w for w, _ in times), sum(c for _, c in times)


def measure(case: str, rounds: int, steps: int, device: torch.device) -> dict:
    import selfsup.methods.dino as dino_module

    batched_encode = dino_module.encode_views

    def crop_by_crop(encoder, views, per_view_batch_norm=True):
        return [encoder(v) for v in views]

    model, views, optimizer, batch = build(case, device)
    step(model, views, optimizer)  # warm-up (allocator, first-call costs)
    runs = {"batched": [], "crop_by_crop": []}
    for r in range(rounds):
        order = ("batched", "crop_by_crop") if r % 2 == 0 else ("crop_by_crop", "batched")
        for mode in order:
            dino_module.encode_views = batched_encode if mode == "batched" else crop_by_crop
            try:
                wall, cpu = steps_time(model, views, optimizer, steps, device)
            finally:
                dino_module.encode_views = batched_encode
            runs[mode].append((batch * steps / wall, batch * steps / max(cpu, 1e-9)))
    ratios = [b[0] / c[0] for b, c in zip(runs["batched"], runs["crop_by_crop"])]
    cpu_ratios = [b[1] / c[1] for b, c in zip(runs["batched"], runs["crop_by_crop"])]
    backbone, patch, size, local, n_local, _, k = CASES[case]
    return {
        "case": case, "backbone": backbone, "patch": patch, "global_crops": [size, size],
        "local_crops": [local] * n_local, "batch": batch, "out_dim": k, "steps_per_round": steps, "rounds": rounds,
        "images_per_s": {m: statistics.median(v[0] for v in runs[m]) for m in runs},
        "images_per_cpu_s": {m: statistics.median(v[1] for v in runs[m]) for m in runs},
        "speedup_batched_wall": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
        "speedup_batched_cpu": {"median": statistics.median(cpu_ratios), "min": min(cpu_ratios),
                                "max": max(cpu_ratios)},
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the micro case only, 3 rounds of 2 steps")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--cases", nargs="*", default=list(CASES))
    p.add_argument("--out", default=str(RESULTS / "multicrop.json"))
    a = p.parse_args(argv)
    device = default_device()
    cases, rounds, steps = (["micro_fmnist"], 3, 2) if a.quick else (a.cases, a.rounds, a.steps)
    results = [measure(c, rounds, steps, device) for c in cases]
    report = {"device": str(device), "threads": torch.get_num_threads(), "torch": torch.__version__, "results": results}
    write_report(report, a.out)
    for r in results:
        print(f"{r['case']:>20}: batched {r['images_per_s']['batched']:8.1f} img/s, crop-by-crop "
              f"{r['images_per_s']['crop_by_crop']:8.1f} img/s, speed-up x{r['speedup_batched_wall']['median']:.2f} "
              f"({r['speedup_batched_wall']['min']:.2f}-{r['speedup_batched_wall']['max']:.2f})")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
