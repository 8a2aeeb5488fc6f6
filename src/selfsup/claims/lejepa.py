"""LeJEPA (Balestriero & LeCun 2025, arXiv:2511.08544; issue 51): the training loss tracks downstream accuracy, so
it selects models without labels. Its checkable claim, at the digits table's scale.

Several ``lejepa-digits`` runs (seeds × two learning rates, so that the runs spread) are measured along training:
the kNN monitor (``eval.knn_every_n_steps``: kNN@20, T 0.07 of the model at that step, the whole 359-image test
split against the whole training split, as the end-of-run ``knn.json``) at every ``EVERY`` steps is a checkpoint's
accuracy, and the mean of ``train/loss`` (logged every step) over the ``EVERY`` steps before it is its training
loss. Each seed has its own Spearman ρ, over the checkpoints of its runs (both learning rates); the rule, as every
training claim's, is on the mean of the seeds' ρ with its Student-t 95% interval over at least ``MIN_SEEDS`` seeds.
The ρ pooled over every run's checkpoints, with a bootstrap over the runs (``stats.cluster_bootstrap_spearman``),
is reported beside it, not judged."""

from __future__ import annotations

import statistics

from selfsup.claims import stats
from selfsup.claims.suite import Claim, Context, Rule, column, knn_top1, pretrain_run

PRESET = "lejepa-digits"
LRS = ("2.0e-3", "5.0e-4")  # the preset's base lr and a quarter of it: the runs spread in loss and accuracy
STEPS = {True: 6, False: 110}  # the preset's 10 epochs at batch 128 (11 steps an epoch)
EVERY = {True: 2, False: 10}  # a checkpoint (kNN) every EVERY steps; its loss: the mean over the EVERY steps before


def checkpoint_pairs(run, every: int) -> list[tuple[int, float, float]]:
    """(step, mean training loss over the ``every`` steps up to it, kNN top-1) at each kNN monitor row of ``run``
    (``monitor/knn_top1`` is logged at the index of the step just taken, ``train/loss`` at each step's)."""
    loss = dict(column(run, "train/loss"))
    out = []
    for step, knn in column(run, "monitor/knn_top1"):
        window = [loss[s] for s in range(step - every + 1, step + 1) if s in loss]
        if window:
            out.append((step, statistics.fmean(window), knn))
    return out


def per_seed_spearman(loss: list[float], knn: list[float], seeds: list[int]) -> list[float]:
    """Spearman's ρ(loss, kNN) of each seed's checkpoints (all its runs), in the order the seeds first appear."""
    order = list(dict.fromkeys(seeds))
    return [stats.spearman([x for x, s in zip(loss, seeds) if s == seed], [y for y, s in zip(knn, seeds) if s == seed])
            for seed in order]


def measure_loss_tracks_accuracy(ctx: Context) -> dict:
    every = EVERY[ctx.quick]
    m = {"train_loss": [], "knn": [], "run": [], "seed": [], "step": [], "loss_knn_spearman": [], "final_loss": [],
         "final_knn": []}
    series = {}
    for seed in ctx.seed_ids():
        for lr in LRS:
            name = f"lr{lr}-s{seed}"
            run = pretrain_run(ctx, PRESET, name, [f"trainer.seed={seed}", f"trainer.max_steps={STEPS[ctx.quick]}",
                                                   f"optim.base_lr={lr}", "trainer.log_every_n_steps=1",
                                                   f"eval.knn_every_n_steps={every}"])
            pairs = checkpoint_pairs(run, every)
            for step, loss, knn in pairs:
                m["train_loss"].append(loss)
                m["knn"].append(knn)
                m["run"].append(name)
                m["seed"].append(seed)
                m["step"].append(step)
            series[name] = [[loss, knn] for _, loss, knn in pairs]
            m["final_loss"].append(pairs[-1][1] if pairs else float("nan"))
            m["final_knn"].append(knn_top1(run))
    m["loss_knn_spearman"] = per_seed_spearman(m["train_loss"], m["knn"], m["seed"])
    rhos = m["loss_knn_spearman"]
    pooled = stats.spearman(m["train_loss"], m["knn"])
    lo, hi = stats.cluster_bootstrap_spearman(m["train_loss"], m["knn"], m["run"])
    across = stats.spearman(m["final_loss"], m["final_knn"])
    mean = statistics.fmean(rhos)
    interval = stats.interval(mean, statistics.stdev(rhos), len(rhos)) if len(rhos) > 1 else (mean, mean)
    return {"metrics": m, "series": series, "xlabel": f"training loss (mean of the {every} steps before)",
            "ylabel": "kNN top-1 % (359 test images)",
            "ours": f"Spearman ρ(loss, kNN) per seed over its runs' checkpoints: mean {mean:+.3f} "
                    f"[{interval[0]:+.3f}, {interval[1]:+.3f}] (Student t over {len(rhos)} seeds: "
                    f"{', '.join(f'{r:+.3f}' for r in rhos)}); reported only: pooled over the {len(m['knn'])} "
                    f"checkpoints of {len(series)} runs {pooled:+.3f} [{lo:+.3f}, {hi:+.3f}] (bootstrap over runs), "
                    f"across the runs' last checkpoints alone {across:+.3f} (n {len(series)})"}


CLAIMS = (
    Claim("lejepa-loss-tracks-accuracy", "arXiv:2511.08544", "Figure 1 (training loss against linear probe)",
          "LeJEPA's training loss tracks downstream accuracy across runs and checkpoints: the lower the loss, the "
          "higher the accuracy (label-free model selection).",
          "ViT-Base/8 on ImageNet-1K: Spearman correlation 94.52% between the training loss and the linear probe's "
          "accuracy (in our sign convention ρ(loss, accuracy) = −0.945)",
          (Rule("loss_knn_spearman", "<", 0.0, paper=-0.9452),),
          measure_loss_tracks_accuracy,
          "micro ViT (patch 2) on 8×8 digits, lejepa-digits for its 10 epochs (110 steps) at lr 2e-3 (the preset) and "
          "5e-4, 3 seeds each (6 runs); a checkpoint every 10 steps (11 a run): its kNN@20 on the 359 test images "
          "(the kNN monitor, not the paper's linear probe: 66 linear probes would pass this claim's CPU budget) "
          "against the mean training loss of the 10 steps before it; each seed's ρ over its 22 checkpoints (its two "
          "runs), the rule on their mean with the Student-t 95% interval over the 3 seeds (a seed's checkpoints "
          "are two trajectories, not independent draws: the seeds are the units); the ρ pooled over the 66 pairs "
          "with a bootstrap over the 6 runs is reported only",
          decide="Within a run both the loss and the accuracy move with training, so the pooled ρ is mostly that "
                 "shared trend; the across-run ρ of the last checkpoints (reported, 6 runs) is the model-selection "
                 "half of the paper's claim and would need many more runs (a sweep of lr, λ and epochs) to decide."),
)
