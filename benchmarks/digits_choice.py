"""A ``*-digits`` preset's setting, chosen on a validation split at seed 100 (not a table seed).

Each variant trains the preset (its own epochs unless the variant changes them) at ``trainer.seed=100`` and is
scored as ``selfsup eval knn RUN --val-fraction 0.2`` (kNN@20, T 0.07, on a seeded 20% of the training images,
fit on the rest; the test split unread). The prediction and the rule of each choice were written here before
its runs; the result follows each.

* ``dinov2-digits``: KoLeo (issue 38). A pilot at seed 0 scored on the test split (which only reports) gave kNN
  30.9 with KoLeo 0.1 (the code's), 43.7 without, and 39.8 without KoLeo and the iBOT term, against the random
  init's 31.5. The reading: KoLeo pushes each image's backbone [CLS] feature away from its nearest neighbour in
  the batch, and with 10 classes a batch of 64 holds ~6 images of each, so the nearest neighbour is mostly of the
  same class (DINOv2's ImageNet batches of 64 hold 1000 classes). Predicted: without KoLeo at least 3 points
  higher. Rule: the preset drops KoLeo when ``koleo_0`` is 3 points or more higher; otherwise it keeps 0.1.
  Result (``results/dinov2_digits_choice.json``): 47.9 with KoLeo, 41.0 without: the prediction failed, 0.1 kept.
* ``dino-digits`` and ``dinov2-digits``: the budget (issue 37). At the presets' 6 epochs (132 steps of 64) the cut-
  init claims' default arms score kNN 40.7 / 35.9 / 38.7 at seeds 0-2 (DINO; seed 0's floor 31.5: +9.2) and gain
  -0.6 / +4.2 / -1.7 over the floor (DINOv2), short of the digits bar (+10). The DINO-family presets here are the
  only micro-ViT digits presets at 6 epochs; the others train 20-50. Their teacher is an EMA of a student that has
  had 132 steps, and with Sinkhorn-Knopp over a batch of 64 rows and 1024 prototypes
  (``dino_digits_centring_choice.json``: 39.2 against the centre's 44.8) the targets cannot be equipartitioned, so
  the lever left is steps. Predicted: 20 epochs (440 steps) scores at least 3 validation points above 6 epochs for
  both. Rule: each preset takes 20 epochs when ``epochs_20`` is 3 points or more above ``epochs_6``; otherwise it
  keeps 6. The cut-init claims keep the 6 epochs they measured.

  Result (``results/dino_digits_epochs_choice.json``, ``dinov2_digits_epochs_choice.json``): DINO 49.3 at 20
  epochs against 43.8 at 6, adopted; DINOv2 38.5 against 47.9, kept at 6.
* ``dinov2-digits``: KoLeo again, over seeds 100-103 (issue 38). Its table seeds still gain -0.6 / +4.2 / -1.7, and
  the one-seed choices disagree: at seed 0 (a pilot on the test split) KoLeo cost 12.8 points, at seed 100 it gave
  6.9. One seed's validation score moves by several points from seed to seed here, so the choice is made again on
  the mean of four seeds (100, written above, and 101-103). Predicted: without KoLeo at least 3 points higher on
  that mean (the nearest-neighbour reading above). Rule: the preset drops KoLeo when ``koleo_0``'s mean is 3 points
  or more above ``koleo_0.1``'s; otherwise it keeps 0.1. Result (``results/dinov2_digits_koleo_4seeds.json``): 45.7
  without (40.97 / 47.57 / 45.49 / 48.61) against 42.9 with (47.92 / 41.67 / 40.97 / 40.97): +2.8, the prediction
  failed by 0.2 points, 0.1 kept.

* ``dinov2-digits``: what DINOv2 adds to dino-digits (issue 38, written before the runs). At 6 epochs dino-digits
  gains +9.2 on the test split (seed 0) where dinov2-digits gains -0.6 / +4.2 / -1.7 (seeds 0-2), and KoLeo is not
  it (above). The other additions, one at a time, on the mean of seeds 100-103 against the preset (``koleo_0.1``):
  ``dino_optim``, DINO's optimiser (no layer-wise lr decay, the patch embedding at the full lr: with decay 0.9 over
  4 blocks and x 0.2 on the patch embedding, the lowest layers move at 0.13-0.59 of the lr for 132 steps), and
  ``ibot_0``, no masked-patch term (half the global crops masked: the [CLS] targets come from masked crops' teachers
  seeing whole crops, and the patch term's targets come from a teacher of 132 steps). Predicted: ``dino_optim`` at
  least 3 validation points above the preset, ``ibot_0`` within 3 points of it. Rule: the preset takes a variant
  that scores 3 points or more above ``koleo_0.1``; if both do, the higher one. Each variant's validation gain
  over the same seed's random init (``val_init``) is written beside its score, and its test-split gain from the
  run's own ``knn.json`` is reported only.
  Result (``results/dinov2_digits_additions.json``): the preset 42.9 (val gain +7.9 over the init's 35.0),
  ``dino_optim`` 40.5 (+5.6), ``ibot_0`` 41.1 (+6.1): the first prediction failed, the second held, and the preset
  keeps DINOv2's optimiser and its iBOT term. Neither is why its table seeds do not learn.

* ``dinov2-digits``: Sinkhorn-Knopp with as many outputs as a batch has teacher rows (issue 38, written before the
  runs, after ``dino_optim`` and ``ibot_0``). Sinkhorn-Knopp was tried here at K = 1024 (DINO: 39.2 against the
  centre's 44.8), where the 128 [CLS] rows of a batch of 64 cannot use 1024 outputs equally; dinov2-fmnist, whose
  512 rows exceed its 1024 / 2, learns with it (+16.8). ``sk_k128``: ``method.centering=sinkhorn_knopp`` with
  ``method.out_dim=128`` (the one head shared by the [CLS] and the patch tokens). Reading: the teacher that ends
  near uniform at seed 0 is the centre failing at batch 64; equipartitioned targets over K = 128 rows cannot all
  fall on one output nor spread evenly over every output for every image. Predicted: at least 3 validation points
  above the preset (``koleo_0.1``) on the mean of seeds 100-103. Rule: adopted at 3 points or more.
  Result (``results/dinov2_digits_sinkhorn.json``): 45.2 (48.96 / 46.18 / 44.79 / 40.97; val gain +10.2) against
  the preset's 42.9 (+7.9): +2.4, under the rule's 3 points; the prediction failed and the preset keeps the centre
  (test gains, reported only: +13.1 / +10.3 / +11.4 / +6.1 against +11.4 / +9.5 / +3.9 / +5.6).

* ``dinov2-digits``: the budget again, over seeds 100-103 (issue 38, written before the runs). The one-seed choice
  above (seed 100: 20 epochs 38.5 against 47.9) is as noisy as KoLeo's was (one seed's score moves by several
  points), and ``dino-digits``, the same [CLS] term, learned only with 20 epochs. ``epochs_20`` against the preset's
  6 (``koleo_0.1``) on the mean of four seeds. Predicted: within 3 points of the preset (seed 100's 9-point loss
  being mostly that seed). Rule: 20 epochs adopted at 3 points or more above ``koleo_0.1``.
  Result (``results/dinov2_digits_epochs_4seeds.json``): 37.6 (38.54 / 39.58 / 35.76 / 36.46; val gain +2.6)
  against 42.9 (+7.9): 5.3 points under, the prediction failed the other way and the preset keeps 6 epochs. Unlike
  DINO's, DINOv2's teacher here loses what it had gained when it trains longer.

* ``dinov2-digits``: the two near misses together (issue 38, written 2026-12-04 before the runs). Without KoLeo
  (+2.8) and Sinkhorn-Knopp at K = 128 (+2.4) each came within a point of the rule, by different routes: KoLeo
  pushes a backbone feature from its same-class neighbour, Sinkhorn-Knopp keeps the teacher's targets from drifting
  to uniform. ``sk_k128_koleo0``: both, at 6 epochs. ``sk_k128_e20``: Sinkhorn-Knopp at K = 128 for 20 epochs, since
  the preset lost its gain when trained longer (``epochs_20``: 37.6) and the reading of ``dino-digits`` is that the
  centre's targets drift to uniform as the lr decays, which equipartitioned targets cannot do. Predicted: each at
  least 3 validation points above the preset (``koleo_0.1``, 42.9) on the mean of seeds 100-103. Rule: the preset
  takes the higher of those that clear it by 3 points. Two more tries against the same four seeds make a lucky pass
  likelier, which is why the bar is judged on the table seeds 0-2, never on these.
  Result (``results/dinov2_digits_together.json``): ``sk_k128_e20`` 58.7 (59.03 / 57.64 / 62.15 / 55.90; val gain
  +23.7), adopted; ``sk_k128_koleo0`` 40.5 (+5.6), not: the first prediction held, the second failed (test gains,
  reported only: +26.7 / +29.3 / +33.4 / +27.9 and +13.1 / +9.8 / +8.4 / +11.1, against the preset's +11.4 / +9.5 /
  +3.9 / +5.6). ``dinov2-digits`` takes Sinkhorn-Knopp over K = 128 and 20 epochs.

* ``dino-digits``, ``ibot-digits``, ``dinov2-digits``: the ViT's init (issue 49, written 2026-12-05 before the runs).
  The three end at 41.2 / 41.6 / 54.8 test kNN (``results/digits_table.json``) from a random init at 29.9, where
  every other digits preset ends at 74.6-92.2 and their random ViT alone scores 58.6: a user who picks DINO gets a
  backbone worse than another preset's untrained one. The DINO-family presets keep the official trunc-normal init
  with learned positions; the others use MoCo v3's (xavier, a fixed 2-D sin-cos table). Reading: on 8x8 digits the
  trunc-normal ViT's [CLS] features are almost constant across images (mean cosine 0.98, the preset's comment), so
  the teacher starts from targets with nothing to tell apart, and a learned table at std 0.02 carries almost no
  position. ``moco_init``: ``model.init=moco_v3 model.pos_embed=sincos``. Predicted: for each preset at least 3
  validation points above the preset as shipped (``preset``) at seed 100, and above 58.6 (the others' random
  init). Rule: a preset takes ``moco_init`` when it scores 3 points or more above ``preset`` at seed 100; the bar is
  then judged on the table seeds 0-2 (``digits_table.py``).
  Result for ``dino-digits`` (``results/dino_digits_init_choice.json``; the preset's own seed-100 score is
  ``epochs_20``'s 49.3 in ``dino_digits_epochs_choice.json``, the same config, not re-run): ``moco_init`` 64.2, +14.9
  over the preset and above 58.6: the prediction held and the rule adopts it. But the gain over its own init is
  small: +6.2 on validation (the init at 58.0) and +0.8 on the test split (reported only), where the digits bar asks
  +10. The better init is most of the score; the DINO training on top adds little in 440 steps. Not yet written into
  the preset: the table seeds 0-2 decide both bars together, and ``ibot-digits`` / ``dinov2-digits`` were not run
  (this session's CPU went to the integration; 2,643 s for this one run on the loaded 2 cores).
* ``dino-digits`` ``moco_init_2crops``: ``moco_init`` without the 4 local crops (``augment.local_crops_number=0``):
  a 4-px local crop of an 8-px digit (2 x 2 patches) keeps little of the symbol, and its cross-view terms are 8 of
  the 10 loss terms, so the student learns mostly to match a teacher that saw another symbol. Predicted: at least 3
  validation points above ``moco_init`` (64.2) at seed 100, and at least +10 over the init (58.0). Rule: the family's
  presets take it with ``moco_init`` when it clears both; the table seeds 0-2 then decide the bars.
  Result (``results/dino_digits_2crops_choice.json``, 323 s): 71.9 against the init's 58.0, +13.9, and +7.7 over
  ``moco_init``: the prediction held; the three presets took both changes (``ibot-digits`` had no local crops). The
  table seeds (``results/digits_table.json``): ``dino-digits`` 68.6%, +10.0 [8.2, 11.9]; ``ibot-digits`` 73.0%,
  +14.4 [7.9, 20.9]; ``dinov2-digits`` 85.1%, +26.5 [16.7, 36.3]: both bars met on the means.

    python -m benchmarks.digits_choice --preset dinov2-digits --only koleo_0.1,koleo_0 \\
        --out benchmarks/results/dinov2_digits_choice.json
    python -m benchmarks.digits_choice --preset dino-digits --only epochs_6,epochs_20 \\
        --out benchmarks/results/dino_digits_epochs_choice.json
    python -m benchmarks.digits_choice --preset dinov2-digits --only koleo_0.1,koleo_0 --seeds 100,101,102,103 \\
        --out benchmarks/results/dinov2_digits_koleo_4seeds.json
    python -m benchmarks.digits_choice --preset dinov2-digits --only koleo_0.1,dino_optim,ibot_0 \\
        --seeds 100,101,102,103 --out benchmarks/results/dinov2_digits_additions.json
    python -m benchmarks.digits_choice --preset dinov2-digits --only koleo_0.1,sk_k128 \\
        --seeds 100,101,102,103 --out benchmarks/results/dinov2_digits_sinkhorn.json
    python -m benchmarks.digits_choice --preset dinov2-digits --only koleo_0.1,epochs_20 \\
        --seeds 100,101,102,103 --out benchmarks/results/dinov2_digits_epochs_4seeds.json
    python -m benchmarks.digits_choice --preset dinov2-digits --only koleo_0.1,sk_k128_koleo0,sk_k128_e20 \\
        --seeds 100,101,102,103 --out benchmarks/results/dinov2_digits_together.json
    python -m benchmarks.digits_choice --preset dino-digits --only preset,moco_init \\
        --out benchmarks/results/dino_digits_init_choice.json  # and ibot-digits, dinov2-digits alike
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from benchmarks.harness import pretrain, write_report

VARIANTS = {"preset": [], "moco_init": ["model.init=moco_v3", "model.pos_embed=sincos"],
            "moco_init_2crops": ["model.init=moco_v3", "model.pos_embed=sincos", "augment.local_crops_number=0"],
            "koleo_0.1": ["method.koleo_loss_weight=0.1"], "koleo_0": ["method.koleo_loss_weight=0.0"],
            "epochs_6": ["trainer.max_epochs=6"], "epochs_20": ["trainer.max_epochs=20"],
            "dino_optim": ["method.layerwise_decay=1.0", "method.patch_embed_lr_mult=1.0"],
            "ibot_0": ["method.ibot_loss_weight=0.0"],
            "sk_k128": ["method.centering=sinkhorn_knopp", "method.out_dim=128"],
            "sk_k128_koleo0": ["method.centering=sinkhorn_knopp", "method.out_dim=128", "method.koleo_loss_weight=0.0"],
            "sk_k128_e20": ["method.centering=sinkhorn_knopp", "method.out_dim=128", "trainer.max_epochs=20"]}
RULES = {  # (variant to adopt, the preset's variant): adopted when it scores 3 validation points or more above
    ("koleo_0", "koleo_0.1"): 3.0, ("epochs_20", "epochs_6"): 3.0, ("dino_optim", "koleo_0.1"): 3.0,
    ("ibot_0", "koleo_0.1"): 3.0, ("sk_k128", "koleo_0.1"): 3.0,
    ("epochs_20", "koleo_0.1"): 3.0, ("sk_k128_koleo0", "koleo_0.1"): 3.0, ("sk_k128_e20", "koleo_0.1"): 3.0,
    ("moco_init", "preset"): 3.0, ("moco_init_2crops", "moco_init"): 3.0}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="dinov2-digits")
    p.add_argument("--only", default="koleo_0.1,koleo_0", help=f"comma list of variants: {', '.join(VARIANTS)}")
    p.add_argument("--seeds", default="100", help="comma list of training seeds; a variant's score is their mean")
    p.add_argument("--runs", default="runs/digits_choice")
    p.add_argument("--out", default="benchmarks/results/dinov2_digits_choice.json")
    args = p.parse_args(argv)
    names = args.only.split(",")
    for name in names:
        if name not in VARIANTS:
            print(f"error: --only {name}: no such variant; choose from {', '.join(VARIANTS)}", file=sys.stderr)
            return 2
    from selfsup.eval.knn import KnnConfig
    from selfsup.runs.evaluate import run_knn
    from selfsup.runs.session import EvalSession

    torch.set_num_threads(1)
    seeds = [int(x) for x in args.seeds.split(",")]
    out = {"note": f"{args.preset}, seeds {args.seeds}; kNN@20 T 0.07 on a seeded 20% of the training images (val), "
                   "fit on the rest; the test split unread; a variant's score is the mean over the seeds",
           "variants": {}}
    stem = args.preset.removesuffix("-digits")
    for name in names:
        overrides, scores, walls, inits, test_gains = VARIANTS[name], [], [], [], []
        for seed in seeds:
            run = Path(args.runs) / (f"{stem}-{name}" + (f"-s{seed}" if seed != 100 else ""))
            if not (run / "backbone.safetensors").exists():  # seed 100's runs keep their first names
                done = pretrain(args.preset, [*overrides, f"trainer.seed={seed}", "trainer.progress_bar=false"], run)
                walls.append(round(done.wall_s))
            knn = run_knn(run, KnnConfig(ks=(20,), val_fraction=0.2))
            scores.append(round(knn["results"]["k=20"]["top1"], 2))
            init = run_knn(EvalSession(run / "backbone_init.safetensors", out=str(run / "eval_init")),
                           KnnConfig(ks=(20,), val_fraction=0.2))  # the same seed's random init, same split
            inits.append(round(init["results"]["k=20"]["top1"], 2))
            test = json.loads((run / "knn.json").read_text())  # the end-of-run report's test split: reported only
            test_gains.append(round(test["pretrained"]["top1"] - test["random_init"]["top1"], 2))
        out["variants"][name] = {"overrides": overrides, "seeds": seeds, "train_wall_s": walls,
                                 "val_knn20_top1_per_seed": scores, "val_init_per_seed": inits,
                                 "val_knn20_top1": round(sum(scores) / len(scores), 2),
                                 "val_gain": round((sum(scores) - sum(inits)) / len(scores), 2),
                                 "test_gain_per_seed_reported_only": test_gains}
        print(name, json.dumps(out["variants"][name]), flush=True)
    by_base: dict = {}  # the preset's variant -> the variants that clear it by their margin
    for (new, old), margin in RULES.items():
        if new in out["variants"] and old in out["variants"]:
            a, b = (out["variants"][k]["val_knn20_top1"] for k in (new, old))
            by_base.setdefault(old, []).extend([new] if a - b >= margin else [])
            print(f"{new} {a:.1f} against {old} {b:.1f}: {'adopted' if a - b >= margin else 'not adopted'} "
                  f"(the rule: +{margin:g})")
    for old, cleared in by_base.items():  # of the variants that clear the rule, the highest
        out["choice"] = max(cleared, key=lambda k: out["variants"][k]["val_knn20_top1"]) if cleared else old
        print(f"choice: {out['choice']}")
    write_report(out, Path(args.out))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
