"""The SSL cookbook (seed 002, part 5): distilling a large frozen teacher gives a small model "much better
performance than training from scratch" (DINOv2 §5). Its checkable claim, at the digits table's scale.

Digits, not Fashion-MNIST: the Fashion-MNIST form (a ViT-tiny dinov2-fmnist teacher, three 5-epoch students and
three dinov2-fmnist runs from scratch) is about 15 hours of a 2-core machine, the digits form under one; the
presets distill-fmnist / distill-cnn-fmnist keep the Fashion-MNIST recipe for a user with the time."""

from __future__ import annotations

import statistics

from selfsup.claims.suite import Claim, Context, Pilot, Rule, knn_top1, linear_top1, mean_ci, pretrain_run

# the teacher: the digits table's best method (SimCLR, 92.2% kNN) on a larger ViT (vit_tiny), trained twice as long
# (distill-digits' comment); one teacher for every seed (seed 0), its kNN written beside the students'
TEACHER = ("simclr-digits", ["trainer.seed=0", "model.backbone=vit_tiny"])
EPOCHS = {True: 1, False: 50}  # the student's budget: simclr-digits' 50 epochs (quick runs are cut short by tests)
TEACHER_EPOCHS = {True: 1, False: 100}
SCRATCH = "simclr-digits"  # the micro ViT's best preset from scratch (digits table: 92.2% kNN, +33.6 over its init)


def measure_distill_beats_scratch(ctx: Context) -> dict:
    """Per seed: the micro ViT distilled from the frozen teacher (distill-digits) against the micro ViT trained from
    scratch by its best preset (simclr-digits), at the same 50 epochs: kNN and linear-probe top-1 on the test split."""
    preset, overrides = TEACHER
    teacher = pretrain_run(ctx, preset, "teacher", [*overrides, f"trainer.max_epochs={TEACHER_EPOCHS[ctx.quick]}"],
                           share=True)
    teacher_knn = knn_top1(teacher)
    m = {"distilled": [], "scratch": [], "knn_gain": [], "distilled_linear": [], "scratch_linear": [],
         "linear_gain": [], "teacher_knn": []}
    for seed in ctx.seed_ids():
        epochs = [f"trainer.seed={seed}", f"trainer.max_epochs={EPOCHS[ctx.quick]}"]
        distilled = pretrain_run(ctx, "distill-digits", f"distilled-s{seed}",
                                 [*epochs, f"method.teacher.weights={teacher}"])
        scratch = pretrain_run(ctx, SCRATCH, f"scratch-s{seed}", epochs, share=True)
        m["distilled"].append(knn_top1(distilled))
        m["scratch"].append(knn_top1(scratch))
        m["knn_gain"].append(m["distilled"][-1] - m["scratch"][-1])
        m["distilled_linear"].append(linear_top1(distilled, ctx.quick))
        m["scratch_linear"].append(linear_top1(scratch, ctx.quick))
        m["linear_gain"].append(m["distilled_linear"][-1] - m["scratch_linear"][-1])
        m["teacher_knn"].append(teacher_knn)
    return {"metrics": m, "series": {},
            "ours": f"kNN top-1 distilled {statistics.fmean(m['distilled']):.1f}% vs from scratch "
                    f"{statistics.fmean(m['scratch']):.1f}% (gain {mean_ci(m['knn_gain'])} points; the teacher "
                    f"{teacher_knn:.1f}%); linear probe {statistics.fmean(m['distilled_linear']):.1f}% vs "
                    f"{statistics.fmean(m['scratch_linear']):.1f}% (gain {mean_ci(m['linear_gain'])} points)"}


CLAIMS = (
    Claim("distill-beats-scratch", "002_010407c8532905bc.txt", "part 5 (MIM and distillation; DINOv2 §5)",
          "A small model distilled from a larger frozen teacher is better than the same model trained from scratch.",
          "Oquab et al. (2023) train smaller models from a ViT-g teacher \"with much better performance than training "
          "from scratch\" (no figure in the seed)",
          (Rule("knn_gain", ">", 0.0, arms=("distilled", "scratch")),
           Rule("linear_gain", ">", 0.0, accuracy=True)),
          measure_distill_beats_scratch,
          "micro ViT student on digits, 50 epochs (1100 steps at batch 64), LightlyTrain's global distillation from a "
          "simclr-digits ViT-tiny teacher trained 100 epochs, against simclr-digits from scratch at the same 50 "
          "epochs (250 steps at batch 256); scored on the 359 test images",
          # the first run, at seeds 0-2 (2026-12-05, commit 5df89eb), serves as the pilot: kNN +2.04 [+1.24, +2.84],
          # linear probe +1.11 [-0.08, +2.31], inconclusive on the linear probe. At its sd (0.48) 4 seeds detect
          # the 1.11 observed, at the sd's 80% upper bound (1.02) 9 do; 6 seeds (MDE 0.69 at the sd, 1.46 at the
          # bound) were chosen before the run, on the seeds after the pilot's (3-8), the teacher kept (seed 0)
          default_seeds=6, first_seed=3,
          pilot=Pilot(seeds=3, steps=1100, wall_s=2235.8, sd=(("knn_gain", 0.3216), ("linear_gain", 0.4825)),
                      note="the pilot is the claim's first 3-seed run (seeds 0-2, not PILOT_FIRST_SEED's): its "
                           "linear-probe interval held 0, so the run takes 6 seeds, 3-8, none of the pilot's")),
)
