"""MoCo v3 (seed 004): training self-supervised ViTs. Its checkable claims."""

from __future__ import annotations

from selfsup.claims.suite import Claim, Context, Rule, events, knn_top1, pm, pretrain_run


def measure_frozen_patch_projection(ctx: Context) -> dict:
    """MoCo v3 on digits at 10× the preset's lr: frozen random patch projection against a learned one."""
    epochs = 3 if ctx.quick else 40
    large_lr = ["optim.base_lr=1.5e-2", "eval.knn_every_n_steps=10"]
    m = {"spikes_learned_minus_frozen": [], "knn_gain": []}
    for seed in range(ctx.seeds):
        runs = {frozen: pretrain_run(ctx, "moco-v3-vit-digits", f"{'frozen' if frozen else 'learned'}-s{seed}",
                                     [f"trainer.seed={seed}", f"trainer.max_epochs={epochs}", *large_lr,
                                      f"model.stop_grad_conv1={str(frozen).lower()}"]) for frozen in (True, False)}
        m["spikes_learned_minus_frozen"].append(events(runs[False], "grad_spike") + events(runs[False], "knn_dip")
                                                - events(runs[True], "grad_spike") - events(runs[True], "knn_dip"))
        m["knn_gain"].append(knn_top1(runs[True]) - knn_top1(runs[False]))
    return {"metrics": m, "series": {},
            "ours": f"learned − frozen spikes + kNN dips {pm(m['spikes_learned_minus_frozen'])}; kNN frozen − "
                    f"learned {pm(m['knn_gain'])} points"}


CLAIMS = (
    Claim("frozen-patch-projection", "004_128fc6c8941a5b31.txt", "§4.2 (instability)",
          "At a large lr the frozen random patch projection gives fewer gradient spikes and kNN dips, and a "
          "higher final accuracy, than a learned one.",
          "ViT-B, lr 1.5e-4 × 10: frozen patch projection removes the dips; +1.7 points at lr 1.5e-4",
          (Rule("spikes_learned_minus_frozen", ">", 0.0), Rule("knn_gain", ">", 0.0)),
          measure_frozen_patch_projection, "micro ViT (patch 2) on 8×8 digits, 40 epochs", default_seeds=3),
)
