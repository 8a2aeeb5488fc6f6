"""I-JEPA (Assran et al. 2023, arXiv:2301.08243; issue 51): semantic features without hand-made view
augmentations. Its checkable claim, at the digits table's scale.

The paper's protocol is the linear probe (Table 1), so the rules are on it; kNN is reported beside. The arms share
the micro ViT (patch 2, 16 patches of an 8×8 digit; I-JEPA's has no class token and is average-pooled, as the
official ViT, SimCLR's pools its class token, as its preset): ``ijepa-digits`` (the crop (0.3, 1) and the masks only: no
flip, no colour, one view; its recipe follows facebookresearch/ijepa's make_transforms with those off) against
``simclr-digits``, the digits table's best view-based preset (92.2% kNN, two augmented views), at equal
optimiser steps."""

from __future__ import annotations

import json
import statistics

from selfsup.claims.suite import Claim, Context, Rule, knn_top1, linear_top1, mean_ci, pretrain_run
from selfsup.runs.source import INIT_FILE

VIEW_BASED = "simclr-digits"  # the digits table's best view-based preset: 92.2% kNN, +33.6 over its init
PRESET = "ijepa-digits"
EPOCHS = {True: 1, False: 50}  # the view-based arm: simclr-digits' own 50 epochs (250 steps at batch 256)
# Competitive: I-JEPA at most this many linear-probe points under the view-based arm (non-inferiority). The paper's
# gaps to the view-based methods it calls comparable are under 2 points (ViT-H/14 79.3% against iBOT ViT-L/16
# 81.0%, DINO ViT-B/8 80.1%); one digits accuracy near 90% has a binomial sd of ~1.6 points over the 359 test
# images, so the per-seed gap of two such accuracies ~2.2: a margin of 5 leaves the paper's gap and that noise room.
MARGIN = 5.0


def measure_ijepa_without_views(ctx: Context) -> dict:
    """Per seed: simclr-digits at its own budget, then ijepa-digits for as many optimiser steps as that run took;
    the linear probe (and kNN) of I-JEPA's evaluated encoder, of its random init (``RUN/backbone_init.safetensors``,
    the same seed's, through the same probe) and of SimCLR's."""
    m = {k: [] for k in ("ijepa_linear", "ijepa_init_linear", "simclr_linear", "linear_gain_over_init",
                         "linear_gap", "ijepa_knn", "ijepa_init_knn", "simclr_knn", "knn_gain_over_init", "knn_gap")}
    steps_run = []
    for seed in ctx.seed_ids():
        simclr = pretrain_run(ctx, VIEW_BASED, f"simclr-s{seed}",
                              [f"trainer.seed={seed}", f"trainer.max_epochs={EPOCHS[ctx.quick]}"], share=True)
        steps = int(json.loads((simclr / "run.json").read_text())["global_step"])
        ijepa = pretrain_run(ctx, PRESET, f"ijepa-s{seed}", [f"trainer.seed={seed}", f"trainer.max_steps={steps}"])
        steps_run.append(steps)
        m["ijepa_linear"].append(linear_top1(ijepa, ctx.quick))
        m["ijepa_init_linear"].append(linear_top1(ijepa / INIT_FILE, ctx.quick))
        m["simclr_linear"].append(linear_top1(simclr, ctx.quick))
        m["linear_gain_over_init"].append(m["ijepa_linear"][-1] - m["ijepa_init_linear"][-1])
        m["linear_gap"].append(m["ijepa_linear"][-1] - m["simclr_linear"][-1])
        m["ijepa_knn"].append(knn_top1(ijepa))
        m["ijepa_init_knn"].append(knn_top1(ijepa, "random_init"))
        m["simclr_knn"].append(knn_top1(simclr))
        m["knn_gain_over_init"].append(m["ijepa_knn"][-1] - m["ijepa_init_knn"][-1])
        m["knn_gap"].append(m["ijepa_knn"][-1] - m["simclr_knn"][-1])
    mean = statistics.fmean
    return {"metrics": m, "series": {}, "details": {"steps_per_run": steps_run},
            "ours": f"linear probe at {steps_run[0]} steps each: I-JEPA {mean(m['ijepa_linear']):.1f}% (its random "
                    f"init {mean(m['ijepa_init_linear']):.1f}%, gain {mean_ci(m['linear_gain_over_init'])} points) "
                    f"vs SimCLR {mean(m['simclr_linear']):.1f}% (I-JEPA − SimCLR {mean_ci(m['linear_gap'])}); "
                    f"kNN I-JEPA {mean(m['ijepa_knn']):.1f}% (init {mean(m['ijepa_init_knn']):.1f}%, gain "
                    f"{mean_ci(m['knn_gain_over_init'])}) vs SimCLR {mean(m['simclr_knn']):.1f}% "
                    f"(I-JEPA − SimCLR {mean_ci(m['knn_gap'])})"}


CLAIMS = (
    Claim("ijepa-semantic-without-views", "arXiv:2301.08243", "abstract, §1 and Table 1 (linear evaluation)",
          "I-JEPA learns semantic features without hand-made view augmentations: its linear probe gains over its "
          "random init and is competitive with a view-based method's at the same budget.",
          "ImageNet-1K linear probe: I-JEPA ViT-H/14 (300 ep, no view augmentations) 79.3% against view-based iBOT "
          "ViT-L/16 81.0% and DINO ViT-B/8 80.1% (Table 1); I-JEPA − iBOT −1.7 points",
          (Rule("linear_gain_over_init", ">", 0.0, accuracy=True),
           Rule("linear_gap", ">", -MARGIN, paper=79.3 - 81.0, accuracy=True)),
          measure_ijepa_without_views,
          "micro ViT (patch 2; I-JEPA's without a class token and average-pooled, as the code's ViT, SimCLR's "
          "with its class token, as its preset) on 8×8 digits at equal optimiser steps: simclr-digits at its own "
          "50 epochs (250 steps at batch 256, two augmented views of each image) and ijepa-digits for the same "
          "250 steps (its batch 128: 23 epochs; the crop and the masks, no other augmentation; its schedules span "
          "the 250 steps). Steps rather than epochs: the view-based arm is then the digits table's row as it "
          "stands, and equal epochs would give I-JEPA 550 steps, past this claim's 40 CPU minutes; at equal "
          "steps I-JEPA sees half SimCLR's images, a handicap of this budget. Linear probe (MoCo v3's SGD over "
          "its lr grid chosen on a validation split of the training images, 30 epochs on the features) on the "
          "359 test images; the random init is the same seed's, through the same probe; competitive = at most 5 "
          "points under SimCLR (non-inferiority: the paper's gaps are under 2 points, one digits accuracy's "
          "binomial sd ~1.6)",
          decide="ijepa-digits (the backbone's init, the EMA from 0.9, chosen on validation: +10.4 at seed 100) "
                 "does not meet the digits kNN bar on the table's seeds (+8.6 / −10.9 / +3.6; "
                 "benchmarks/jepa_choice.py, results/digits_table_jepa.json). A failing first rule says that at this "
                 "scale I-JEPA does not learn from the masks alone; ijepa-fmnist (a 7×7 grid, closer to the paper's "
                 "14×14 or 16×16) is the form that would test it nearer the paper's setting."),
)
