"""The SSL cookbook (seed 002, part 5): distilling a large frozen teacher gives a small model "much better
performance than training from scratch" (DINOv2 §5). Its checkable claim, on Fashion-MNIST.

Fashion-MNIST, not digits: on digits the first form of this claim (a 100-epoch ViT-tiny simclr-digits teacher, the
micro ViT at 50 epochs against simclr-digits from scratch, 6 seeds) was inconclusive, kNN +1.3 [-1.8, +4.3],
because the teacher (93.0% kNN) was level with the student from scratch (92.8%) and 359 test images leave a
binomial sd of 1.3 points an accuracy. Fashion-MNIST scores on 10,000 (0.4 points). Its larger, longer-trained
teacher was expected to stand clearly above the micro ViT's 5 epochs there; measured, it stands 0.5 kNN points and
2.5 linear-probe points above (the claim's note in ``notes.py``)."""

from __future__ import annotations

import statistics

from selfsup.claims.suite import Claim, Context, Rule, knn_top1, linear_top1, mean_ci, pretrain_run

# the teacher: a larger ViT (vit_tiny: 12 blocks of width 192, against the student's 4 of 128) trained twice the
# table's 5 epochs by SimCLR, one teacher for every seed (seed 0), its kNN written beside the students'. SimCLR, not
# the 5-epoch table's best kNN (dinov2-fmnist, 80.6% against SimCLR's 79.5%), at a seventh of its CPU cost (the
# table's dinov2-fmnist runs took 7.5 times simclr-fmnist's time). Measured: this teacher trains 9 steps a minute on
# one core of a 2-core AMD EPYC, so its 2,340 steps take about 4.3 hours of one core.
TEACHER = ("simclr-fmnist", ["trainer.seed=0", "model.backbone=vit_tiny"])
TEACHER_EPOCHS = {True: 1, False: 10}
STUDENT = "distill-fmnist"  # LightlyTrain's global distillation into the table's micro ViT (patch 7), 5 epochs
EPOCHS = {True: 1, False: 5}  # the 5-epoch table's budget for student and scratch alike
# the micro ViT from scratch: lejepa-fmnist is second of the 5-epoch table by kNN (80.2% against dinov2-fmnist's
# 80.6%) and by linear probe (82.4% against vicreg-fmnist's 82.7%), the only preset within 0.4 points of the best
# on both; dinov2-fmnist is seventh by linear probe (80.0%) at three times lejepa-fmnist's cost
SCRATCH = "lejepa-fmnist"


def measure_distill_beats_scratch(ctx: Context) -> dict:
    """Per seed: the micro ViT distilled from the frozen teacher (distill-fmnist) against the micro ViT trained from
    scratch (lejepa-fmnist), both for the table's 5 epochs: kNN and linear-probe top-1 on the 10,000 test images,
    the teacher's own beside them."""
    preset, overrides = TEACHER
    teacher = pretrain_run(ctx, preset, "teacher", [*overrides, f"trainer.max_epochs={TEACHER_EPOCHS[ctx.quick]}"],
                           share=True)
    teacher_knn, teacher_linear = knn_top1(teacher), linear_top1(teacher, ctx.quick)
    m = {"distilled": [], "scratch": [], "knn_gain": [], "distilled_linear": [], "scratch_linear": [],
         "linear_gain": [], "teacher_knn": [], "teacher_linear": []}
    for seed in ctx.seed_ids():
        epochs = [f"trainer.seed={seed}", f"trainer.max_epochs={EPOCHS[ctx.quick]}"]
        distilled = pretrain_run(ctx, STUDENT, f"distilled-s{seed}", [*epochs, f"method.teacher.weights={teacher}"])
        scratch = pretrain_run(ctx, SCRATCH, f"scratch-s{seed}", epochs, share=True)
        m["distilled"].append(knn_top1(distilled))
        m["scratch"].append(knn_top1(scratch))
        m["knn_gain"].append(m["distilled"][-1] - m["scratch"][-1])
        m["distilled_linear"].append(linear_top1(distilled, ctx.quick))
        m["scratch_linear"].append(linear_top1(scratch, ctx.quick))
        m["linear_gain"].append(m["distilled_linear"][-1] - m["scratch_linear"][-1])
        m["teacher_knn"].append(teacher_knn)
        m["teacher_linear"].append(teacher_linear)
    return {"metrics": m, "series": {},
            "ours": f"kNN top-1 distilled {statistics.fmean(m['distilled']):.1f}% vs from scratch "
                    f"{statistics.fmean(m['scratch']):.1f}% (gain {mean_ci(m['knn_gain'])} points; the teacher "
                    f"{teacher_knn:.1f}%); linear probe {statistics.fmean(m['distilled_linear']):.1f}% vs "
                    f"{statistics.fmean(m['scratch_linear']):.1f}% (gain {mean_ci(m['linear_gain'])} points; the "
                    f"teacher {teacher_linear:.1f}%)"}


CLAIMS = (
    Claim("distill-beats-scratch", "002_010407c8532905bc.txt", "part 5 (MIM and distillation; DINOv2 §5)",
          "A small model distilled from a larger frozen teacher is better than the same model trained from scratch.",
          "Oquab et al. (2023) train smaller models from a ViT-g teacher \"with much better performance than training "
          "from scratch\" (no figure in the seed)",
          (Rule("knn_gain", ">", 0.0, arms=("distilled", "scratch")),
           Rule("linear_gain", ">", 0.0, accuracy=True)),
          measure_distill_beats_scratch,
          "micro ViT student on Fashion-MNIST, 5 epochs (1,170 steps at batch 256), LightlyTrain's global "
          "distillation from a simclr-fmnist ViT-tiny teacher trained 10 epochs, against lejepa-fmnist from scratch "
          "at the same 5 epochs; scored on the 10,000 test images",
          test_data="fashion-mnist",
          # seeds 0-2 ran first (2026-12-06): kNN -0.03 [-1.15, +1.10], linear probe -0.93 [-1.99, +0.13] (per seed
          # -0.65, -0.72, -1.42), inconclusive; the run was extended to seeds 0-5 from that spread (the suite's 4 seeds
          # to detect it, and margin), before seeds 3-5 ran. Seeds 0-2 are kept in the run, not set apart as a pilot:
          # fresh seeds 3-8 would cost another 2 hours of both cores.
          default_seeds=6),
)
