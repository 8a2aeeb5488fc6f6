"""MoCo v3 (seed 004): training self-supervised ViTs. Its checkable claims."""

from __future__ import annotations

import hashlib
import statistics
from dataclasses import replace

from selfsup.claims.suite import Claim, Context, Pilot, Rule, events, knn_pair, knn_top1, mean_ci, pretrain_run


# Fashion-MNIST (issue 23 item 2): the §4.2 and §6.2 effects are 0.4–6.6 points, below the digits test split's
# noise (359 images: a binomial sd of 2.4 points near 70%); its 10,000 test images give 0.45. One epoch each run
# (issue 23 item 3: at least one Fashion-MNIST epoch), 234 steps at the preset's batch of 256.
PRESET = "moco-v3-vit-fmnist"
EPOCHS = {True: 1, False: 1}  # quick, full (quick runs are cut short by the tests' overrides)
WARMUP = ["optim.warmup_epochs=0.2"]  # the preset's 1 of 5 epochs, scaled to the one-epoch run


def measure_frozen_patch_projection(ctx: Context) -> dict:
    """MoCo v3 on Fashion-MNIST at 10× the preset's lr: frozen random patch projection against a learned one."""
    epochs = EPOCHS[ctx.quick]
    large_lr = ["optim.base_lr=1.5e-2", "eval.knn_every_n_steps=10", *WARMUP]
    m = {"spikes_learned_minus_frozen": [], "knn_gain": [], "frozen": [], "learned": []}
    for seed in ctx.seed_ids():
        runs = {frozen: pretrain_run(ctx, PRESET, f"{'frozen' if frozen else 'learned'}-s{seed}",
                                     [f"trainer.seed={seed}", f"trainer.max_epochs={epochs}", *large_lr,
                                      f"model.stop_grad_conv1={str(frozen).lower()}"]) for frozen in (True, False)}
        m["spikes_learned_minus_frozen"].append(events(runs[False], "grad_spike") + events(runs[False], "knn_dip")
                                                - events(runs[True], "grad_spike") - events(runs[True], "knn_dip"))
        m["frozen"].append(knn_top1(runs[True]))
        m["learned"].append(knn_top1(runs[False]))
        m["knn_gain"].append(m["frozen"][-1] - m["learned"][-1])
    return {"metrics": m, "series": {},
            "ours": f"learned − frozen spikes + kNN dips {mean_ci(m['spikes_learned_minus_frozen'])}; kNN frozen − "
                    f"learned {mean_ci(m['knn_gain'])} points"}


# ---- claim 16: the §6.2 ablations, each against the default (m = 0.99 fixed, predictor, sin-cos, class token) ------

SMALL = ("micro ViT (patch 7) on Fashion-MNIST, 1 epoch (234 steps, warm-up 0.2 epoch) at a fixed m, scored on its "
         "10,000 test images")
# the paper's ViT default is a fixed m = 0.99 (§6.2; the preset ramps it on a cosine, as the code does)
FIXED_M = ["method.momentum_schedule=constant", *WARMUP]


def default_knn(ctx: Context, seed: int) -> float:
    """kNN top-1 of the default run of ``seed``, trained once per ``--work`` folder and shared by the §6.2 claims
    (a seeded run is reproducible, so the same overrides give the same run)."""
    overrides = [f"trainer.seed={seed}", f"trainer.max_epochs={EPOCHS[ctx.quick]}", *FIXED_M]
    key = hashlib.sha1("\n".join([*overrides, *ctx.overrides]).encode()).hexdigest()[:10]
    shared = replace(ctx, work=ctx.work.parent / "moco-v3-default")
    run = shared.work / f"default-s{seed}-{key}"
    if not (run / "knn.json").exists():
        run = pretrain_run(shared, PRESET, run.name, overrides)
    return knn_top1(run)


def ablation(ctx: Context, name: str, overrides: list[str]) -> dict:
    """kNN top-1 of the default MoCo v3 micro ViT and of one ablation, per seed, with the default's gain."""
    m = {"default": [], name: [], "gain": []}
    for seed in ctx.seed_ids():
        m["default"].append(default_knn(ctx, seed))
        run = pretrain_run(ctx, PRESET, f"{name}-s{seed}",
                           [f"trainer.seed={seed}", f"trainer.max_epochs={EPOCHS[ctx.quick]}", *FIXED_M, *overrides])
        m[name].append(knn_top1(run))
        m["gain"].append(m["default"][-1] - m[name][-1])
    return m


def _ours(m: dict, name: str) -> str:
    return (f"kNN top-1 default {statistics.fmean(m['default']):.1f}% vs {name.replace('_', ' ')} "
            f"{statistics.fmean(m[name]):.1f}% (default − ablation {mean_ci(m['gain'])} points)")


def measure_momentum(ctx: Context) -> dict:
    m = ablation(ctx, "m_0", ["method.momentum=0.0"])
    return {"metrics": m, "series": {}, "ours": _ours(m, "m_0")}


def measure_predictor(ctx: Context) -> dict:
    m = ablation(ctx, "no_predictor", ["method.predictor=none"])
    return {"metrics": m, "series": {}, "ours": _ours(m, "no_predictor")}


def measure_position_embedding(ctx: Context) -> dict:
    """sin-cos (default) against learned and against none, on the same seeds."""
    learned = ablation(ctx, "learned", ["model.pos_embed=learned"])
    none = ablation(ctx, "none", ["model.pos_embed=none"])
    m = {"sincos": learned["default"], "learned": learned["learned"], "none": none["none"],
         "gain_over_learned": learned["gain"], "gain_over_none": none["gain"]}
    return {"metrics": m, "series": {},
            "ours": f"kNN top-1 sin-cos {statistics.fmean(m['sincos']):.1f}%, learned "
                    f"{statistics.fmean(m['learned']):.1f}%, none {statistics.fmean(m['none']):.1f}% (sin-cos − "
                    f"learned {mean_ci(m['gain_over_learned'])}, sin-cos − none {mean_ci(m['gain_over_none'])} points)"}


def measure_pooling(ctx: Context) -> dict:
    """Average pooling with the final LayerNorm kept against average pooling with it removed."""
    m = knn_pair(ctx, PRESET, ("avg_no_ln", ["model.pool=avg", "model.final_norm=false"]),
                 ("avg_ln", ["model.pool=avg"]), epochs=EPOCHS[ctx.quick], extra=FIXED_M)
    return {"metrics": m, "series": {},
            "ours": f"kNN top-1 average pooling without the final LayerNorm "
                    f"{statistics.fmean(m['avg_no_ln']):.1f}% vs with it {statistics.fmean(m['avg_ln']):.1f}% "
                    f"(gain {mean_ci(m['gain'])} points)"}


CLAIMS = (
    Claim("frozen-patch-projection", "004_128fc6c8941a5b31.txt", "§4.2 (instability)",
          "At a large lr the frozen random patch projection gives fewer gradient spikes and kNN dips, and a "
          "higher final accuracy, than a learned one.",
          "ViT-B, lr 1.5e-4 × 10: frozen patch projection removes the dips; +1.7 points at lr 1.5e-4",
          (Rule("spikes_learned_minus_frozen", ">", 0.0),
           Rule("knn_gain", ">", 0.0, paper=1.7, arms=("frozen", "learned"))),
          measure_frozen_patch_projection, "micro ViT (patch 7) on Fashion-MNIST, 1 epoch (234 steps) at 10× the "
          "preset's lr, scored on its 10,000 test images", test_data="fashion-mnist"),
    Claim("moco-v3-momentum", "004_128fc6c8941a5b31.txt", "§6.2 (momentum coefficient)",
          "A momentum encoder helps: m = 0 is worse than m = 0.99.",
          "ViT-B 300 ep: m = 0 74.3% vs m = 0.99 76.5% (−2.2 points)",
          (Rule("gain", ">", 0.0, paper=76.5 - 74.3, arms=("default", "m_0")),),
          measure_momentum, SMALL, test_data="fashion-mnist",
          # `selfsup claims pilot moco-v3-momentum --seeds 2` (seeds 1000, 1001; claims/results/pilots), 2026-12-02
          pilot=Pilot(seeds=2, steps=234, wall_s=1027.1, sd=(("gain", 0.1838),),
                      note="the per-seed spread of the paired gain on Fashion-MNIST is 0.18 points (5 on digits at "
                           "20 steps), so one epoch and 3 seeds detect 0.6 points, below the paper's 2.2; the "
                           "other §6.2 ablations share its default runs and were not piloted themselves")),
    Claim("moco-v3-predictor", "004_128fc6c8941a5b31.txt", "§6.2 (prediction head)",
          "Removing the prediction head costs about a point.",
          "ViT-B: 76.5% with vs 75.5% without (−1.0 point)",
          (Rule("gain", ">", 0.0, paper=76.5 - 75.5, arms=("default", "no_predictor")),),
          measure_predictor, SMALL, test_data="fashion-mnist"),
    Claim("moco-v3-position-embedding", "004_128fc6c8941a5b31.txt", "§6.2 (position embedding)",
          "The fixed sin-cos position embedding beats a learned one and none.",
          "ViT-B: sin-cos 76.5%, learned 76.1%, none 74.9%",
          (Rule("gain_over_learned", ">", 0.0, paper=76.5 - 76.1, arms=("sincos", "learned")),
           Rule("gain_over_none", ">", 0.0, paper=76.5 - 74.9, arms=("sincos", "none"))),
          measure_position_embedding, SMALL, test_data="fashion-mnist"),
    Claim("moco-v3-avg-pool-layernorm", "004_128fc6c8941a5b31.txt", "§6.2 (class token)",
          "Average pooling works only with the final LayerNorm removed; keeping it is worse.",
          "ViT-B without class token: avg pool with LN 69.7%, without LN 76.3% (class token 76.5%)",
          (Rule("gain", ">", 0.0, paper=76.3 - 69.7, arms=("avg_no_ln", "avg_ln")),), measure_pooling,
          SMALL + "; the class token stays in the sequence (unpooled), the paper removes it",
          test_data="fashion-mnist"),
)
