"""MAE's training step at mask ratio 0.75 against full-sequence steps: what the encoder on 25% of the tokens saves.

    python -m benchmarks.mae_step [--quick]        → benchmarks/results/mae_step.json

Three training steps (forward, backward, AdamW step) on the same model and batch, alternated in one process:

- ``mae``: the MAE step as trained (selfsup.methods.mae): the encoder on the kept 25% of the patches, the
  decoder on all of them (mask tokens in the removed positions), the loss on the removed ones;
- ``mae_full_encoder``: the same step with the encoder on every patch (the decoder then gets no mask token;
  same loss on the same removed patches): only the encoder's sequence length differs from ``mae``;
- ``vit_full``: the encoder alone on the full sequence (a supervised-style ViT step, loss = mean square of
  the class-token feature): the cost of one full-sequence encoder pass, no decoder.

Per repetition the mean step time; across repetitions min and median, as images/s, and the process CPU time per
step (less disturbed by other processes on a shared machine).
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.harness import RESULTS, summarize, timed, write_report


def build(backbone: str, image_size: int, patch_size: int, decoder: tuple[int, int, int], mask_ratio: float):
    from selfsup.config import resolve
    from selfsup.methods import DataInfo
    from selfsup.methods.build import build_method

    dim, depth, heads = decoder
    cfg = resolve({
        "method": {"name": "mae", "mask_ratio": mask_ratio, "decoder_embed_dim": dim, "decoder_depth": depth,
                   "decoder_num_heads": heads},
        "model": {"backbone": backbone, "patch_size": patch_size},
        "optim": {"name": "adamw", "betas": [0.9, 0.95], "weight_decay": 0.05, "decay_1d": False},
        "trainer": {"accelerator": "cpu", "devices": 1},
    })
    return build_method(cfg, DataInfo(3, image_size, (0.5,) * 3, (0.25,) * 3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backbone", default="vit_tiny")
    parser.add_argument("--image-size", type=int, default=64)
    parser.add_argument("--patch-size", type=int, default=8)
    parser.add_argument("--decoder", default="128,2,4", help="decoder width,depth,heads (default 128,2,4)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per repetition")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="vit_micro, 2 steps x 2 reps (smoke run)")
    parser.add_argument("--out", default=str(RESULTS / "mae_step.json"))
    args = parser.parse_args()
    if args.quick:
        args.backbone, args.steps, args.reps, args.warmup = "vit_micro", 2, 2, 1
    torch.set_num_threads(args.threads)
    from selfsup.losses import masked_patch_mse
    from selfsup.models.mae import random_masking

    decoder = tuple(int(v) for v in args.decoder.split(","))
    model = build(args.backbone, args.image_size, args.patch_size, decoder, 0.75)
    model.train()
    opt = model.configure_optimizers()
    for group in opt.param_groups:
        group["lr"] = 1e-4
    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=g)
    length = model.num_patches
    every = torch.arange(length).expand(args.batch_size, -1)

    def mae_step():
        return model.forward_views([x], torch.rand(args.batch_size, length, generator=g)).loss

    def full_encoder_step():
        _, mask, _ = random_masking(torch.rand(args.batch_size, length, generator=g), model.len_keep)
        latent = model.backbone.forward_visible(x, every)  # every patch, in order: no mask token, no unshuffle
        return masked_patch_mse(model.decoder(latent, every).float(), model.target(x), mask)

    def vit_step():
        return model.backbone(x).pow(2).mean()

    steps = {"mae": mae_step, "mae_full_encoder": full_encoder_step, "vit_full": vit_step}

    def one(fn):
        opt.zero_grad(set_to_none=True)
        fn().backward()
        opt.step()

    per_rep: dict[str, list] = {k: [] for k in steps}
    for name, fn in steps.items():
        timed(lambda: one(fn), 0, args.warmup)
    for _ in range(args.reps):
        for name, fn in steps.items():  # alternated, so load changes on the machine hit all three alike
            per_rep[name].append(timed(lambda: one(fn), args.steps))
    report = {"backbone": args.backbone, "image_size": args.image_size, "patch_size": args.patch_size,
              "tokens": length, "kept_tokens": model.len_keep, "mask_ratio": 0.75,
              "decoder_width_depth_heads": list(decoder), "batch_size": args.batch_size, "steps": args.steps,
              "reps": args.reps, "threads": args.threads, "results": {}}
    for name, reps in per_rep.items():
        s = summarize(reps, args.batch_size)
        report["results"][name] = {"images_per_s_best": s["images_per_s_best"],
                                   "images_per_s_median": s["images_per_s_median"],
                                   "cpu_s_per_step_median": s["cpu_step_ms_median"] / 1000,
                                   "wall_s_per_rep": [sum(w for w, _ in r) / len(r) for r in reps]}
    r = report["results"]
    report["speedup_mae_vs_full_encoder_best"] = (r["mae"]["images_per_s_best"]
                                                  / r["mae_full_encoder"]["images_per_s_best"])
    report["speedup_mae_vs_full_encoder_cpu"] = (r["mae_full_encoder"]["cpu_s_per_step_median"]
                                                 / r["mae"]["cpu_s_per_step_median"])
    report["speedup_mae_vs_vit_full_best"] = r["mae"]["images_per_s_best"] / r["vit_full"]["images_per_s_best"]
    report["speedup_mae_vs_vit_full_cpu"] = r["vit_full"]["cpu_s_per_step_median"] / r["mae"]["cpu_s_per_step_median"]
    write_report(report, args.out)
    for name, v in r.items():
        print(f"{name:<18} {v['images_per_s_best']:8.1f} img/s best  {v['images_per_s_median']:8.1f} median  "
              f"{v['cpu_s_per_step_median'] * 1000:7.1f} ms CPU/step")
    print(f"MAE vs full-sequence encoder (same decoder): {report['speedup_mae_vs_full_encoder_best']:.2f}x "
          f"(CPU time {report['speedup_mae_vs_full_encoder_cpu']:.2f}x); vs a plain full ViT step: "
          f"{report['speedup_mae_vs_vit_full_best']:.2f}x (CPU {report['speedup_mae_vs_vit_full_cpu']:.2f}x)")


if __name__ == "__main__":
    main()
