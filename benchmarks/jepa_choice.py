"""The I-JEPA and LeJEPA small-data presets' settings, chosen on a validation split at seed 100 (and 101 for the later
``ijepa-digits`` variants; never a table seed).

As ``benchmarks/digits_choice.py``: each variant trains the preset at ``trainer.seed=100`` and is scored as
``selfsup eval knn RUN --val-fraction 0.2`` (kNN@20, T 0.07, on a seeded 20% of the training images, fit on the
rest; the test split unread), beside the same seed's random init on the same split. The prediction of each
variant was written here before its run; the result follows it.

* ``ijepa-digits`` ``code``: the code's masks (context 0.85-1.0, 4 targets of 0.15-0.2, aspect 0.75-1.5) on a 4x4
  grid, 30 epochs. Predicted: at least +10 validation points over the init (the digits bar), since a 2-patch
  target on an 8x8 digit is a stroke whose feature needs the rest of the digit. Rule: kept when it clears +10.

  Result (``results/jepa_choice_ijepa-digits.json``): 21.9 against the init's 22.9, -1.0: the prediction failed.
  The curves: the target features' effective rank is 3 from the first step and their per-dimension spread
  ~1e-3; the encoder's gradient is 1e-6 of the predictor's. The code's init (trunc-normal 0.02 on the patch
  projection) gives a patch of 4 pixels an embedding ~1/20 of the sin-cos table's: the pooled features hardly
  depend on the image (ImageNet's 768-pixel patches do not have this).
* ``ijepa-digits`` ``backbone_init``: the encoder keeps the micro ViT's MoCo v3 init (the patch projection scaled
  to its fan-in, ~6x the code's here). Predicted: at least +10 validation points over the init, and 10 points over
  ``code``. Rule: the preset takes ``method.init=backbone`` when it clears both.

  Result: 65.6 against the init's 60.8 (the MoCo v3 init's pooled features carry the image: 60.8 against the
  code init's 22.9), +4.9: under the bar, the prediction failed. The linear probe (the paper's protocol; ``selfsup
  eval linear RUN --val-fraction 0.2 --mode features --epochs 30``, its lr chosen on the validation split, top-1 on
  the test split, reported only, added to the JSON by hand): ``code`` 72.1 against its init's 78.3 (-6.1),
  ``backbone_init`` 89.1 against 90.0 (-0.8): neither learnt by this measure either.
* ``ijepa-digits`` ``patch1``: the code's geometry on an 8x8 grid of 1-pixel patches (targets 0.15-0.2, 4 of
  them, 3x3 to 4x3 patches; the context 0.85-1.0, at most 7x7; min_keep 4, the code's 10 of 196 scaled), the
  backbone's init. On the 4x4 grid the context left after 2 targets of 2x2 is 1-5 patches, too little to predict
  from. Predicted: at least +10 over the init. Rule: the preset takes the patch-1 geometry when it clears +10.

  Result: 76.7 against the init's 71.2, +5.6 (701 s): the prediction failed; the preset keeps patch 2.
* ``ijepa-digits`` ``backbone_init_m0.9``: the backbone's init and the EMA from 0.9 (to 1) instead of the code's
  0.996. A run of 330 steps at 0.996 keeps the target encoder within a product of momenta ~0.996^330 = 0.27 of its
  init: the context encoder learns to predict a near-random network's features (dino-digits takes 0.9 for the same
  reason). Predicted: at least +10 over the init. Rule: the preset takes it when it clears +10.

  Result: 70.5 against the init's 60.8, +9.7 (600 s; the test split, reported only: +11.4): under the rule's +10 by
  0.3, the prediction failed; not adopted. The EMA is the largest lever seen here (+4.9 → +9.7).
* ``ijepa-digits`` ``backbone_init_m0.9_60ep``: ``backbone_init_m0.9`` trained twice as long (60 epochs, 660
  steps). Its curve was still rising at the end (the EMA at 0.9 lets the target follow the encoder), and every
  digits preset that needed more epochs gained with them (dino-digits 43.8 → 49.3 from 10 to 20). Predicted: at
  least +10 over the init (+9.7 at 30 epochs). Rule: the preset takes the three changes when it clears +10; its
  table seeds 0-2 then decide the digits bar.

  Result: 71.2 against the init's 60.8, +10.4 (254 s; test +10.6, reported only): the prediction held and the preset
  took the three changes. Its table seeds then gained +8.6 / -10.9 / +3.6 (``results/digits_table_jepa.json``: +0.5
  [-24.7, 25.6]; the backbone's init itself scores 59-72 across seeds): the digits bar is not met.
* Before the next variants (issue 51's bar after the table seeds' +0.5): the seed-100 run of the preset
  (``backbone_init_m0.9_60ep``) collapsed. Its curves: the loss from 0.37 to 0.0017 by step 129 and 0.0007 from step
  189 on; the pooled target features' spread over the batch (``dim_std_embedding``) 0.0066 at step 0, 0.0013 from
  step 100; RankMe 3.4 → 1.5. The exported features are nearly one point for every image, and the kNN reads what
  is left (so the trained kNN lands at 61-73 whatever the init's). The masks (``method.masks`` drawn for 200
  batches of 128): the context block is always the grid's top-left 3x3 (a block of 0.85-1.0 is lowered to 3x3 and
  ``randint(0, 4 - 3)`` puts it at the corner), and with 2 targets of 2x2 inside it the batch's shortest context,
  to which the code truncates every context, is 2 patches in every batch: 8 pixels to predict 8 patches from. The
  image-dependent part of such targets is mostly unpredictable, and the EMA then drops it. One target leaves 5
  context patches in every batch; patch 1 (an 8x8 grid) with 2 targets of 0.15-0.2 leaves 25-31 (4 targets: 6-17).
  Each variant below is validated at seeds 100 and 101 (one seed misled last time); ``val_context_reported_only``
  is the context encoder's validation kNN beside the evaluated target encoder's (reported, not used).
* ``ijepa-digits`` ``one_target``: the preset (backbone init, EMA from 0.9, 60 epochs) with 1 target block instead
  of 2 (``method.num_pred_masks=1``): the context 5 patches instead of 2. Predicted: no collapse by the signs above
  (the loss above 0.005 and RankMe above 3 at the end) and at least +10 validation points over the init at both
  seeds 100 and 101. Rule: the preset takes 1 target when both seeds clear +10; then the table seeds 0-2 decide the
  bar.

  Result: seed 100 72.9 against 60.8, +12.2 (125 s; test +11.1); seed 101 72.6 against 63.9, +8.7 (116 s; test
  +7.8): the prediction failed on both counts and the preset keeps 2 targets. The collapse signs are those of 2
  targets (loss 0.0008 by step 129, ``dim_std_embedding`` 0.0013, RankMe 1.5 at the end): the 2-patch context was
  not what collapses the features. Against the preset at seed 100 (71.2), +1.7 on 288 validation images. The
  weights move 5-10% from their init (relative norm of the change per matrix). The context encoder scores as the
  target encoder (71.9 for each of the three runs so far, against 71.2 / 72.9 / 72.6; an independent kNN on the
  cached features gives the same): the export is not what holds the score down.
* ``ijepa-digits`` ``patch1_m0.9``: the ``patch1`` geometry on the 8x8 grid (min_keep 4) with 2 targets of
  0.15-0.2 instead of 4 (context 25-31 patches), with the preset's backbone init, EMA from 0.9 and 60 epochs (the
  runs are faster than when ``patch1`` took 701 s: ``one_target`` took 125 s for 60 epochs). Written as 30 epochs
  before ``one_target`` ran and changed to 60 before this one ran. Predicted: at least +10 at both seeds
  (``patch1`` gained +5.6 at 0.996, 30 epochs; the EMA at 0.9 and 60 epochs added +5.5 on the 4x4 grid).
  Rule: the preset takes it when both seeds clear +10.

  Result: seed 100 70.1 against the patch-1 init's 71.2, -1.0 (540 s; test -1.1; the context encoder 69.8): the
  prediction failed, seed 101 not run (the rule needs both). The same collapse, earlier and deeper than on the 4x4
  grid: loss 0.0046 at step 129 and 0.0004-0.0005 from step 249; ``dim_std_embedding`` 0.0026 → 0.0003, RankMe
  1.44 → 1.07. With the EMA at 0.996 for 30 epochs (``patch1``, no collapse: the target stays near its init) the
  same grid reached 76.7; with a fast target it collapses to 70.
* Every run with the EMA at 0.9 collapses by step ~130, just after the 33-step warm-up at the peak lr (5e-4 at batch
  128), and lands at 70-73 validation kNN at seed 100 whatever its grid or targets; at 0.996 the target stays near
  the init and the gain is ~+5. Two variants of the preset (patch 2, 2 targets, backbone init, 60 epochs) between
  the two regimes; each runs at seed 100, and seed 101 runs only for one that clears +10 there (the higher first;
  at most 6 validation runs in this round).
* ``ijepa-digits`` ``code_lr``: the EMA from 0.9 with the code's lr per image (``lr: 0.001`` at batch 2048,
  configs/in1k_vith14_ep300.yaml: ``optim.base_lr=1.25e-4`` per 256, 6.25e-5 at 128, 8x lower than the preset's;
  its ``start_lr: 0.0002`` at 2048 likewise, ``method.start_lr=2.5e-5`` per 256) and the code's warm-up share (40
  of 300 epochs: ``optim.warmup_epochs=8`` of 60). (First launched without the start_lr, which would have warmed
  the lr down from 1e-4; stopped at its start and changed before it ran.) The collapse is a drift of the
  encoder at the peak lr that the fast target follows; 8x slower steps leave the target time to follow without
  the drift. Predicted: the loss stays above 0.005 until step 300 at least, and at least +10 at both seeds. Rule:
  the preset takes the code's lr and warm-up when both seeds clear +10.
* ``ijepa-digits`` ``m0.99``: the EMA from 0.99 (a target horizon of ~100 steps against 0.9's ~10 and 0.996's
  ~250), the preset's lr. Predicted: the collapse later than at 0.9 (loss above 0.005 until step 200) and at least
  +10 at both seeds. Rule: the preset takes 0.99 when both seeds clear +10.

  Results: ``code_lr`` 64.6 against 60.8, +3.8 (104 s; test +2.0; the context encoder 66.7): no collapse (the loss
  0.19-0.42 throughout, RankMe 1.8-2.4, ``dim_std_embedding`` 0.0020-0.0036) and little learning, as at 0.996: the
  first half of the prediction held, the gain failed. ``m0.99`` 45.8 against 60.8, -14.9 (143 s; test -10.9; the
  context encoder 43.1): the loss fell to 0.004 by step 159 and rose again to 0.05-0.07, RankMe 2.1 → 3.2 and
  ``dim_std_embedding`` 0.0030 → 0.0082 from step 200 on: the features spread again while their kNN fell 15
  points under the init. Both failed at seed 100; neither runs at seed 101, and the preset is unchanged. On this
  data the collapse signs do not track the kNN: the collapsed runs (EMA 0.9) score 70-73, the run whose features
  spread again 46.
* The sixth and last run of this round is the preset itself (``backbone_init_m0.9_60ep``, whose overrides are now
  the preset's own) at seed 101: a reference for ``one_target``'s seed 101 and for how far the preset's seed-100
  +10.4 carries to another validation seed, not a candidate. Predicted: +5 to +12 (``one_target`` +8.7 at this
  seed; the table seeds' +8.6 / -10.9 / +3.6 on the test split).

  Result: 70.8 against 63.9, +6.9 (135 s; test +6.4; the context encoder 71.5): the prediction held. ``one_target``
  scored 1.7 points over the preset at both seeds (72.9 / 72.6 against 71.2 / 70.8), under its rule's +10 at seed
  101; it is not adopted (the rule was both seeds) and was not run on the table seeds.
* This round's verdict: no variant cleared its rule; the preset stays as it was, and its table seeds' +0.5 [-24.7,
  25.6] (``results/digits_table_jepa.json``) stands: the digits bar is not met. With the EMA at 0.9 every grid and
  target count tried collapses to a validation kNN of 70-73 at seed 100 (71 at 101), so its gain is that level
  less the seed's init (59-72 across seeds); slower targets or steps (0.996, the code's lr) keep the features near
  the init (+4 to +6), and 0.99 spreads them again at a kNN 15 points under the init. Not tried: the predictor's
  width or depth, a digits image upsampled to 16 px.
* Round 3 (2026-12-05, written before any of its runs): the variants not tried, each from the preset (patch 2, 2
  targets, the backbone's init, the EMA from 0.9) with only its overrides; seeds 100 and 101, seed 101 only for a
  variant that clears its rule at 100; at most 8 runs. Each row's ``signs`` (added to the script with this round) are
  the collapse signs from its ``metrics.csv``: the loss's first and last value, RankMe and ``dim_std_embedding`` at
  the first and last logged step. A run is collapsed, as in ``benchmarks/jepa_collapse_series.py``, when its last
  loss is under 1% of its first. The +10 needed on each table seed means a trained level of ~82 on the seed whose
  init scores 72 (table seed 1); the preset's collapsed level is 70-73.
* ``ijepa-digits`` ``code_lr_300ep``: ``code_lr`` (the code's lr per image, its ``start_lr`` and its warm-up share,
  40 of 300 epochs) trained for the code's 300 epochs (3,300 steps). The EMA from 0.9 to 1 and the cosines span
  ``ipe · 300 · ipe_scale`` with ``ipe_scale`` 1, the code's (configs/in1k_vith14_ep300.yaml), so the stretch is
  the code's; the warm-up is 440 steps. At 60 epochs ``code_lr`` did not collapse (loss 0.19-0.42, RankMe 1.8-2.4)
  and gained +3.8 in 660 steps: too few steps at an lr 8x under the preset's. The risk: its lr integral reaches the
  preset's at its collapse (~0.057 by step 130) near step 1,100, where it may collapse to the same 70-73. Predicted:
  no collapse (the last loss above 1% of the first, RankMe above 1.5 at the end) and +10 at seed 100 (from +6 to
  +14). Rule: the preset takes the code's lr, ``start_lr``, warm-up share and 300 epochs when both seeds clear +10;
  then the table seeds 0-2 decide the bar.

  Result: seed 100 68.8 against 60.8, +8.0 (619 s; test +7.2; the context encoder 69.1): the prediction failed on
  both counts. It collapsed where the risk said: the loss 0.27-0.31 to step ~610, 0.030 at 759, 0.004 at 1,209 and
  0.0004 from 1,509 (0.000399 at the end, from 0.425); RankMe 3.42 → 1.49 at step 600 → 1.25 from 1,200;
  ``dim_std_embedding`` 0.0066 → 0.0013 → 0.0007. Slower steps put the collapse off (step ~130 at the preset's lr,
  ~700-1,200 here) and do not prevent it; the level it lands at, 68.8, is the preset's collapsed level (70-73) or
  under. Seed 101 not run.
* ``ijepa-digits`` ``code_300ep``: the code's whole schedule at its epoch count: ``code_lr_300ep`` with the code's
  EMA from 0.996 (to 1) instead of the preset's 0.9. Over 3,300 steps 0.996's horizon (~250 steps) is 8% of the run
  and 0.996^3300 ~ 2e-6: the target follows the encoder, which 330 steps did not allow (``backbone_init``, +4.9 at
  the preset's lr). Only the init, the 4x4 grid's masks and ``min_keep`` then differ from the code. Predicted: no
  collapse and +8 at seed 100 (from +4 to +12). Rule: as ``code_lr_300ep``.

  Result: seed 100 65.3 against 60.8, +4.5 (727 s; test +4.5; the context encoder 64.6): no collapse, the first
  half of the prediction held; the gain failed. The features spread instead of collapsing: the loss 0.42 → 0.06 by
  step 459, then 0.07-0.12 to the end (0.114); RankMe 3.4 → 5.3 at step 600 → 14.9 at 1,200 → 23.7 at the end;
  ``dim_std_embedding`` 0.0066 → 0.030; the target features' spread 0.12 → 0.58. The first run on this data whose
  features grow in rank throughout, and its kNN is 4.5 over the init: as ``m0.99``'s spread (kNN 15 under), the
  spread the target asks for is not the digits' classes. Seed 101 not run.
* ``ijepa-digits`` ``pred_wide``: the preset with a predictor of depth 4 and width 128 (``method.pred_depth=4``,
  ``method.pred_emb_dim=128``; 4 heads of 32) instead of 2 blocks of 64: as deep and as wide as the micro encoder
  (the code's is 12 deep of 384 beside ViT-H's 32 of 1280). With the EMA at 0.9 the features drop their
  image-dependent part, which the 2-block predictor cannot predict from the context; a stronger predictor may predict
  more of it and so keep it. Predicted: the collapse as before (the last loss under 1% of the first) and the
  preset's level: +10 at seed 100 (from +8 to +13), so under +10 at seed 101 (~+7) where the preset gained +6.9.
  Rule: the preset takes the wider, deeper predictor when both seeds clear +10.

  Result: seed 100 50.7 against 60.8, -10.1 (233 s; test -15.3; the context encoder 49.6): the prediction failed.
  The wider predictor collapses the features sooner (the loss 0.306 → 0.0023 by step 69, RankMe 3.4 → 1.5 at step
  100) and then spreads them again (the loss 0.118 at step 189, RankMe 3.6, the target features' spread 0.03 → 0.57
  at step 200), ending at a loss of 0.021 (7% of its first: not collapsed by the label), RankMe 2.65 and
  ``dim_std_embedding`` 0.0068 (its first value): the path of ``m0.99`` (collapse, spread again, a kNN under the
  init), not the preset's. Seed 101 not run. ``pred_wide_code_lr_300ep``'s condition fails on both counts
  (``code_lr_300ep`` collapsed; ``pred_wide`` under 71.2): not run.
* ``ijepa-digits`` ``pred_wide_code_lr_300ep``: both changes together (``pred_wide``'s predictor with
  ``code_lr_300ep``'s schedule). Runs at seed 100 only when each helps alone: ``code_lr_300ep`` does not collapse and
  gains +5 or more at seed 100 without clearing +10, and ``pred_wide`` scores above the preset's 71.2 at seed 100.
  Predicted: 2 points over ``code_lr_300ep`` at seed 100. Rule: as ``code_lr_300ep``.
* Not run: digits upsampled to 16 px. ``data.image_size`` applies only to the decoded image files
  (``selfsup.data.datasets.DECODED``: imagefolder, images, webdataset); the digits loader keeps its 8x8 images and
  the kNN evaluation reads the same loader, so an upsampled digits needs a change to the in-memory loaders and the
  evaluation, not a preset setting.
* Round 3's verdict: 3 runs, all at seed 100; none cleared +10 there, so none ran at seed 101 and the preset is
  unchanged; its table seeds' +0.5 [-24.7, 25.6] stands and the digits bar is not met. The linear probe (reported
  only, as above; the three share seed 100's init, 89.97): ``code_lr_300ep`` 86.6 (-3.3), ``code_300ep`` 81.9
  (-8.1), ``pred_wide`` 80.8 (-9.2). Across the three rounds (12 runs at seed 100) the I-JEPA objective on 8x8
  digits takes the features to one of two ends: a fast target (the EMA from 0.9 at the preset's lr, or at 8x under
  it over 3,300 steps; ``code_lr``'s 660 steps ended before the collapse) collapses them to a validation kNN of
  68.8-72.9; a slow target or one that keeps them spread (0.996 for 330 or 3,300 steps, RankMe 23.7 at the end of
  the latter; 0.99; the wider predictor after its collapse) gives at most +5.6 over the init, or less than the
  init. No run reached the ~82 that +10 on every table seed needs, and every linear probe measured is under the
  init's.
* ``lejepa-digits`` ``minimal``: MINIMAL.md's recipe on two global views, 10 epochs. Predicted: at least +10 over
  the init (a 1-epoch smoke run gained +16 on the test split, reported only). Rule: kept when it clears +10.
  Result: 85.4 against the init's 58.0, +27.4: the prediction held, kept.
* ``ijepa-fmnist`` ``code``: the code's masks on a 7x7 grid (patch 4), 5 epochs. Predicted: at least +6 over the
  init. Rule: kept when it clears +6.
* ``lejepa-fmnist`` ``minimal``: MINIMAL.md's recipe, two global views with flips, 5 epochs. Predicted: at least
  +6. Rule: kept when it clears +6.

* ``lejepa-fmnist`` as shipped, on the table seeds 0-2 (``benchmarks/methods_fmnist.py --epochs 5``; no
  variant to choose, so no validation run; the warm-up set to the table's 10% of the run, 0.5 epoch). Predicted,
  2026-12-05 before the runs: at least +6 kNN over the init, the interval's lower end above +3 (a 12-step smoke
  run gained +3.3 on the test split, reported only, from an init at 74.1).

  Result (``results/methods_fmnist_5ep.json``): kNN 80.2 against the init's 69.1 (the table's 10k-image kNN),
  +11.5 / +10.7 / +11.2, i.e. +11.1 [10.2, 12.0]; linear probe 82.4 against 75.8; 1,882-3,352 s a seed. The
  prediction held: the Fashion-MNIST bar (+6, the lower end above +3) is met.

* ``ijepa-fmnist`` as shipped (the code's masks on a 7x7 grid, the backbone's init, the code's EMA 0.996 to 1,
  which over 1,170 steps lets the target follow the encoder), on the table seeds 0-2 the same way; the warm-up the
  table's 0.5 epoch. Predicted, 2026-12-05 before the runs: at least +6 kNN over the init (the issue's bar), with
  low confidence: the digits recipe reached it on one validation seed and not on the table seeds.

  Result (``benchmarks/methods_fmnist.py --presets ijepa-fmnist --epochs 5 --steps-per-epoch 0``, seeds 0-2 as three
  processes; ``results/methods_fmnist_5ep.json``): kNN 62.4 / 64.9 / 64.3 against the inits' 67.2 / 67.3 / 70.6, a
  gain of -4.5 [-9.3, +0.3]; linear probe 75.4 / 75.0 / 75.9 against 76.7 / 76.6 / 77.3 (-1.4). The prediction
  failed: the trained encoder is under its own init by both measures. No collapse by the loss (0.35 at step 9, 0.04-
  0.10 from step 200 to the end), as in the digits runs with a slow target (``code_300ep``): the features move, but
  away from what the init's kNN reads. 3,359-3,393 s a seed (three runs and other jobs on the 2 cores).

``lejepa-fmnist`` and ``ijepa-fmnist`` were not run to their end: the ``lejepa-fmnist`` run reached step 39 of
1,170 in 5 minutes on the shared 2-core machine (about 2.5 hours for one run) and was stopped.

Results: written below each run as it finishes (``results/jepa_choice_<preset>.json``).

    python -m benchmarks.jepa_choice --preset ijepa-digits --only code
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from benchmarks.harness import write_report

# round 3: the code's lr, start_lr and warm-up share (40 of 300 epochs) at its 300 epochs; a predictor as deep and
# wide as the micro encoder
CODE_LR_300EP = ["optim.base_lr=1.25e-4", "method.start_lr=2.5e-5", "optim.warmup_epochs=40", "trainer.max_epochs=300"]
PRED_WIDE = ["method.pred_depth=4", "method.pred_emb_dim=128"]
VARIANTS = {
    "ijepa-digits": {"code": [], "backbone_init": ["method.init=backbone"],
                     "patch1": ["model.patch_size=1", "method.init=backbone", "method.pred_mask_scale=[0.15,0.2]",
                                "method.num_pred_masks=4", "method.min_keep=4"],
                     "backbone_init_m0.9": ["method.init=backbone", "method.momentum=0.9"],
                     "backbone_init_m0.9_60ep": ["method.init=backbone", "method.momentum=0.9",
                                                 "trainer.max_epochs=60"],
                     "one_target": ["method.num_pred_masks=1"],
                     "patch1_m0.9": ["model.patch_size=1", "method.pred_mask_scale=[0.15,0.2]",
                                     "method.num_pred_masks=2", "method.min_keep=4"],
                     "code_lr": ["optim.base_lr=1.25e-4", "method.start_lr=2.5e-5", "optim.warmup_epochs=8"],
                     "m0.99": ["method.momentum=0.99"],
                     "code_lr_300ep": CODE_LR_300EP,
                     "code_300ep": ["method.momentum=0.996", *CODE_LR_300EP],
                     "pred_wide": PRED_WIDE,
                     "pred_wide_code_lr_300ep": [*PRED_WIDE, *CODE_LR_300EP]},
    "lejepa-digits": {"minimal": []},
    "ijepa-fmnist": {"code": []},
    "lejepa-fmnist": {"minimal": []},
}


def context_encoder(run: Path) -> Path | None:
    """An I-JEPA run's context encoder (``backbone.*`` of ``checkpoints/last.ckpt``; the run's export is the target
    encoder) written as ``RUN/context_encoder.safetensors`` with the export's metadata, so it is scored the same way
    (reported only); None for a run without a target encoder."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)["state_dict"]
    if not any(k.startswith("target_encoder.") for k in state):
        return None
    with safe_open(str(run / "backbone.safetensors"), framework="pt") as f:
        keys, meta = list(f.keys()), f.metadata()
    out = run / "context_encoder.safetensors"
    save_file({k: state[f"backbone.{k}"].contiguous() for k in keys}, str(out), metadata=meta)
    return out


def logged_signs(run: Path) -> dict:
    """The run's collapse signs from its ``metrics.csv``: the loss, RankMe and the pooled features' spread over the
    batch (``dim_std_embedding``), each at its first and last logged step, and the loss's label (collapsed when the
    last loss is under 1% of the first, as ``benchmarks.jepa_collapse_series``)."""
    from selfsup.claims.suite import column

    signs = {}
    for name, key in (("loss", "train/loss"), ("rankme", "instruments/rankme_embedding"),
                      ("dim_std_embedding", "instruments/dim_std_embedding")):
        rows = column(run, key)
        signs[name] = [[rows[0][0], round(rows[0][1], 6)], [rows[-1][0], round(rows[-1][1], 6)]] if rows else None
    if signs["loss"]:
        signs["collapsed"] = signs["loss"][1][1] < 0.01 * signs["loss"][0][1]
    return signs


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", required=True, choices=sorted(VARIANTS))
    p.add_argument("--only", default="", help="comma list of variants (default: all of the preset's)")
    p.add_argument("--seed", type=int, default=100)
    p.add_argument("--runs", default="runs/jepa_choice")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    variants = VARIANTS[args.preset]
    names = args.only.split(",") if args.only else list(variants)
    import selfsup.engine as engine
    from selfsup.config import load_run_config
    from selfsup.eval.knn import KnnConfig
    from selfsup.runs.evaluate import run_knn
    from selfsup.runs.session import EvalSession

    torch.set_num_threads(args.threads)
    out_file = Path(f"benchmarks/results/jepa_choice_{args.preset}.json")
    out = json.loads(out_file.read_text()) if out_file.exists() else {
        "note": f"{args.preset}, seed {args.seed}; kNN@20 T 0.07 on a seeded 20% of the training images (val), fit "
                "on the rest; the test split unread (the end-of-run test kNN is reported only)", "variants": {}}
    for name in names:
        run = Path(args.runs) / f"{args.preset}-{name}-s{args.seed}"
        t0 = time.perf_counter()
        if not (run / "backbone.safetensors").exists():
            cfg = load_run_config(args.preset, variants[name] + [f"trainer.seed={args.seed}", f"output_dir={args.runs}",
                                                                 f"name={run.name}", "trainer.progress_bar=false"])
            engine.pretrain(cfg, args.preset)
        wall = round(time.perf_counter() - t0)
        knn = run_knn(run, KnnConfig(ks=(20,), val_fraction=0.2))
        init = run_knn(EvalSession(run / "backbone_init.safetensors", out=str(run / "eval_init")),
                       KnnConfig(ks=(20,), val_fraction=0.2))
        test = json.loads((run / "knn.json").read_text())
        val, floor = knn["results"]["k=20"]["top1"], init["results"]["k=20"]["top1"]
        ctx = context_encoder(run)
        ctx_val = None if ctx is None else run_knn(EvalSession(ctx, out=str(run / "eval_context")),
                                                   KnnConfig(ks=(20,), val_fraction=0.2))["results"]["k=20"]["top1"]
        key = name if args.seed == 100 else f"{name}@s{args.seed}"  # seed 100's rows keep their first names
        out["variants"][key] = {"overrides": variants[name], "seed": args.seed, "wall_s": wall,
                                 "val_knn20_top1": round(val, 2), "val_init": round(floor, 2),
                                 "val_gain": round(val - floor, 2),
                                 "test_gain_reported_only": round(test["pretrained"]["top1"]
                                                                  - test["random_init"]["top1"], 2)}
        if ctx_val is not None:
            out["variants"][key]["val_context_reported_only"] = round(ctx_val, 2)
        out["variants"][key]["signs"] = logged_signs(run)
        print(key, json.dumps(out["variants"][key]), flush=True)
        write_report(out, out_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
