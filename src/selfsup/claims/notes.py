"""What each claim's latest committed run showed and what scale would decide it, by claim id: docs/CLAIMS.md's
paragraph for a claim not reproduced (beside the claim's own ``decide``, which this replaces).

Written after the run, so it is no part of any claim's definition: ``definition_hash`` hashes a claim's seed module,
not this one, and a note added after a run leaves the run's result current for ``claims run --resume``.
"""

from __future__ import annotations

AFTER_RUN: dict[str, str] = {
    "gradscale-imbalanced":
        "At 1,000 SGD steps per arm GradScale does not help on the long tail: its kNN gain is −1.95 [−4.0, +0.13] "
        "points (each accuracy's binomial sd 1.4–1.5 on the 359 digits), on balanced digits −0.28 [−2.7, +2.1], the "
        "defaults at 92% and 98%, near the digits' ceiling. At the measured spread 4 seeds would decide the sign of "
        "the long-tail gain; the paper's claim, a gain on long-tailed CIFAR, needs data far from its ceiling with "
        "Fashion-MNIST's 10,000 test images (binomial sd 0.45) and the BN ConvNet for at least an epoch per arm.",
    "norm-effect-adam":
        "At 1,000 AdamW steps the rule on the norm fails and the one on speed holds: SimCLR's projection norm grows "
        "×1.58 [1.35, 1.80], short of the ×2 the rule asks (×5.4 under SGD, norms-grow), and cut-init speeds it up "
        "×1.37 [1.14, 1.59] where under SGD it slows it down (cut-init-speedup). Not measured here, one candidate "
        "reason: Adam's per-coordinate step is about lr whatever the gradient's size. Whether the norm reaches ×2 "
        "over the paper's 100 CIFAR epochs needs a longer run (several thousand steps), not more seeds (MDE 0.30 "
        "at 3 seeds).",
    "norms-grow":
        "Decided at 1,000 SGD steps: SimCLR's projection norm grows ×5.4 [3.6, 7.2], SimSiam's prediction norm does "
        "not grow (×0.94 [0.85, 1.03]). The SimSiam preset keeps the paper code's weight decay 5e-4 on every "
        "parameter (SimCLR's is 1e-6), and Prop. 3.1's growth is for gradient steps without decay, which shrinks "
        "the weights each step; a run at weight decay 0 would test whether the decay is what holds SimSiam's norm "
        "(the same BN ConvNet, lr and steps).",
    "cut-init-speedup":
        "Decided at 1,000 SGD steps, in opposite directions: cut-init slows SimCLR down (×0.45 [0.42, 0.48] of the "
        "default's steps to its halfway loss) and speeds SimSiam up (×4.1 [3.9, 4.4]), although SimSiam's norm is "
        "the one that does not grow here (norms-grow). The final kNN gains are inside their intervals (SimCLR "
        "−2.5 [−7.5, +2.5], SimSiam +1.2 [−0.9, +3.3] points) with the defaults at 98% and 96%, the digits' "
        "ceiling; whether cut-init's accuracy gain of the paper's tables shows needs data far from its ceiling "
        "(the BN ConvNet on Fashion-MNIST) and a run long enough for SimCLR's cut run to catch up.",
    "cut-init-helps-byol-moco-v3":
        "MoCo v3's rule fails: after 100 Fashion-MNIST steps cut-init costs 5.2 points, whose interval lies wholly "
        "below 0 (each accuracy's binomial sd 0.4 points), so at this budget the cut slows MoCo v3 down rather than "
        "helping it; the rebuttal's +4 points are at 100 ImageNet-100 epochs, and a run of several Fashion-MNIST "
        "epochs would test whether the sign turns once the default's norms have grown. BYOL's rule is inconclusive "
        "and cannot show the paper's 28 points on digits: its default (93.1%) sits below the BN ConvNet's random "
        "init (94.4%), at the digits' ceiling; deciding it needs data where the default is far from its ceiling, "
        "e.g. the BN ConvNet on Fashion-MNIST for at least an epoch.",
    "moco-v3-momentum":
        "At one Fashion-MNIST epoch (234 steps) m = 0 and m = 0.99 end level: the gain is −0.01 [−2.05, +2.02] points, "
        "the per-seed gains −0.82, −0.04 and +0.82. That spread (sd 0.82) is four times the pilot's 0.18 from 2 "
        "seeds, so the pilot's MDE of 0.6 points was optimistic; at the measured spread the MDE is 2.7, just above "
        "the paper's 2.2, and 4 seeds would detect the paper's effect. Not measured here: whether a momentum "
        "encoder needs more than 234 steps to matter (at m = 0.99 the key encoder averages the last ~100 steps); "
        "the paper's −2.2 points are at 300 ImageNet epochs. A 5-epoch run at 4 seeds would decide it.",
    "moco-v3-predictor":
        "Decided at one Fashion-MNIST epoch, with the opposite sign: without the prediction head the kNN top-1 is "
        "0.83 [0.22, 1.45] points higher, and every seed agrees (−0.57, −1.06, −0.87 for with − without). The "
        "paper's −1.0 point is at 300 ImageNet epochs. One candidate reason, not measured: the freshly "
        "initialised predictor is one more layer for 234 steps to train. A run of several epochs would test "
        "whether the sign turns.",
    "moco-v3-position-embedding":
        "Half of the claim reproduces: sin-cos beats no position embedding by +2.0 [+1.3, +2.7] points (the "
        "paper's +1.6). Sin-cos against a learned embedding is −0.24 [−2.0, +1.5]: the paper's 0.4 points lie "
        "under this budget's MDE of 2.3, so 27 seeds at this spread, or less noise per run (longer runs), would "
        "decide it. The claim stays inconclusive because that rule does.",
    "moco-v3-avg-pool-layernorm":
        "At one Fashion-MNIST epoch removing the final LayerNorm under average pooling changes nothing: +0.11 "
        "[−1.01, +1.23] points. This budget is not underpowered for the paper's 6.6 points (MDE 1.5), and the "
        "interval excludes an effect that large, so the paper's gap does not show here. Here the class token "
        "stays in the sequence and is only left out of the pool; the paper removes it. Whether that difference, "
        "or ViT-B's depth, is what makes the LayerNorm hurt would need the token removed and a deeper ViT.",
    "cut-init-speedup-swav-wmse-nnclr":
        "At 1,000 SGD steps cut-init slows W-MSE down (×0.70 [0.60, 0.80] of the default's steps to its halfway "
        "loss). SwAV (×0.90 [0.69, 1.10]) and NNCLR (×0.74 [0.46, 1.02]) lean the same way, but their intervals "
        "reach 1. Each default's norm grows ×5–6 over the run (norms-grow-swav-wmse-nnclr), so the norms do grow "
        "where the rebuttal says they do, yet cut-init does not turn that into speed. SimCLR goes the same way under "
        "SGD (×0.45, cut-init-speedup). The final kNN gains lie inside their intervals, with the defaults at "
        "97–99%, the digits' ceiling. The rebuttal gives no cut-init figures for these methods. At this spread 8 "
        "seeds would decide SwAV's sign; whether any speed-up shows in accuracy needs data away from its "
        "ceiling (the BN ConvNet on Fashion-MNIST).",
    "eigenspace-alignment":
        "At 1,000 SGD steps on the BN ConvNet the normalised commutator falls to 0.67 [0.26, 1.09] of its start "
        "(per seed 0.84, 0.51, 0.66), and the asymmetry to 0.86. Both move in the direction of Fig. 2, but the "
        "interval reaches past the rule's 0.5 and past 1. The seeds spread 3.5 times the pilot's 2-seed sd (0.17 "
        "against 0.047), so 10 seeds would be needed at this spread. Seed count is not the limit, though. W_p "
        "stops learning after about 200 steps: the loss falls to 0.015, the prediction's effective rank from 60 to "
        "3, and ‖W_p‖ ends ×1.08 [1.06, 1.10], never doubling. The micro ViT pilot stalls the same way. Deciding "
        "it needs a run in which BYOL keeps learning under SGD: the paper's ResNet-18 on STL-10 for its epochs, "
        "or a GPU-sized stand-in.",
    "self-flow-ablations":
        "At 110 steps × 3 training seeds the two measures disagree. Judged on the held-out velocity error, as the "
        "rule was fixed before this run, removing the masking does not hurt. It lowers the error by 0.030 [0.025, "
        "0.034], every seed agreeing, so that rule is not reproduced. One candidate reason, not measured: the "
        "masked model trains on a harder input than the clean one it is scored on. The encoder FD points the "
        "paper's way for the masking: without it the FD rises by +29.6 [+16.2, +42.9]. Without the "
        "representation loss the velocity error changes by −0.058 [−0.117, +0.000], and the FD by −18.7 [−47.1, "
        "+9.7], so both measures lean against the paper there, and 4 seeds would decide the velocity rule. The "
        "paper's ablations are FID on SiT-XL/2 over hundreds of thousands of steps; at 110 steps of a micro SiT the "
        "representation loss has only just ramped in (28 steps).",
    "self-flow-generation-quality":
        "At 110 steps × 3 training seeds Self-Flow's held-out velocity error is 0.94 [0.89, 1.00], against 0.85 "
        "for flow matching and for REPA. The gains are −0.094 [−0.193, +0.005] and −0.093 [−0.220, +0.035], leaning "
        "against the claim with the intervals just touching 0; 4–5 seeds would decide them. The encoder FD gains "
        "(+10 [−51, +71] and +4 [−86, +95]) are far inside their noise. Self-Flow's extra terms (the masked input "
        "and the representation loss) cost held-out velocity error at this length. Whether they pay off in "
        "sample quality, as the paper's FID over hundreds of thousands of steps says, needs runs far longer than "
        "110 steps and an FD over more than 2 × 500 samples.",
    "byol-no-ema-predictor-lr":
        "At one Fashion-MNIST epoch BYOL without EMA (m = 0) does not fail at the preset's predictor lr: it scores "
        "73.8% kNN top-1. So there is little for a 10× predictor lr to rescue, and the gain is −1.43 [−13.6, "
        "+10.7] points. The per-seed gains are −7.0, +0.8 and +2.0: one seed's 10× run (67.7%) lost 7 points, and "
        "that run's spread is what leaves the interval wide (94 seeds at this spread for the observed 1.4). The "
        "cookbook's statement comes from DirectPred's STL-10 runs, where BYOL without EMA fails at 1×. Deciding it "
        "needs a budget at which the m = 0 run fails first: longer runs, or the symmetric predictor, whose no-EMA "
        "failure symmetric-predictor-needs-ema reproduces.",
    "frozen-patch-projection":
        "At one Fashion-MNIST epoch at 10× the preset's lr (1.5e-2), the frozen patch projection neither removes "
        "instability nor raises accuracy. Learned − frozen gradient spikes plus kNN dips is −0.67 [−4.5, +3.1] "
        "events a run (per seed +1, −2, −1), and the kNN gain is −0.04 [−2.6, +2.5] points (the paper's +1.7 is "
        "under this budget's MDE of 3.3; 6 seeds would detect it at this spread). Both arms still train to 76–78%, "
        "against 80.3% at the preset's lr (moco-v3-momentum's default runs). So 10× the lr here does not reach "
        "the dips and recoveries of the paper's ViT-B, which the frozen projection removes. Deciding it needs a "
        "larger lr multiple or a deeper ViT, where the learned run's dips appear first.",
    "weight-decay-window":
        "At one Fashion-MNIST epoch of BYOL on the micro ViT, moderate weight decay (AdamW 0.1) against none gains "
        "+0.32 [−0.41, +1.05] points (wd 0: 76.6%, 0.1: 76.9%; MDE 0.96 at 3 seeds, 9 seeds would decide it at "
        "this spread). Too strong decay (100) costs 51 points of kNN (25.8%) in every seed, and the backbone's "
        "embedding norm falls from 11.3 to 0.02–0.03 (the moderate run ends at 11.1). The rule reads collapse as "
        "the projection's spread at the last logged step, and that is under a fifth of the moderate run's in one "
        "seed of three (0.02; 1.09 and 1.14 in the others). Over the run's logged steps after step 40 the strong "
        "run's spread is under a fifth of the moderate one's at 72%, 72% and 59% of them (per seed, read from the "
        "runs' metrics.csv after the verdict): it swings between about 0.001 and 0.9, so one step's reading is "
        "chance. Deciding the collapse half needs a rule fixed before a re-run on a signal that does not swing, "
        "such as the spread averaged after the warm-up or the embedding norm; the gain half needs about 9 seeds.",
    "self-flow-alignment-curve":
        "At 3 training seeds of the micro SiT on digits (440 steps, the full representation weight from step 0): "
        "1 − cos starts at 1.07 [0.97, 1.16] as the thread says, but by step 30 it is still at 0.21 [0.17, 0.25], "
        "wholly above the 0.1 the rule asks within a few iterations. Its lowest points come at steps 183–199 "
        "(0.12, 0.08, 0.10 per seed; only one seed crosses 0.1, at step 134), and it then rises again to "
        "0.11–0.15 by step 440. So the late/early ratio holds (0.61 [0.32, 0.89]), but the curve has a bottom, not "
        "the thread's fall without a plateau. The thread's curve is SiT-XL/2 on ImageNet latents over 100K "
        "iterations. Deciding it needs a SiT of that width, or a check of whether the rise after step 200 "
        "follows the micro SiT's lr schedule or its EMA teacher catching up.",
    "distill-beats-scratch":
        "At 6 seeds on Fashion-MNIST the distilled micro ViT's linear probe is 1.24 points under the same network "
        "trained from scratch by lejepa-fmnist, [−1.95, −0.53], every seed below (−0.71 to −2.51); its kNN is level "
        "(−0.27 [−0.79, +0.24]). Seeds 0-2 ran first and were inconclusive on both (linear −0.93 [−1.99, +0.13]); "
        "the run was extended to seeds 0-5 before 3-5 ran, and 3-5 alone agree (linear −1.53). The teacher, a "
        "10-epoch ViT-tiny simclr-fmnist run, scores 84.2% kNN and 86.3% by linear probe, 0.5 and 2.5 points above "
        "the micro ViT from scratch: a far smaller gap than DINOv2's ViT-g over a ViT-S. In 5 epochs the students "
        "reach a cosine of 0.73-0.76 between their projection and the teacher's embedding (0.64-0.69 at mid-run). "
        "They come near the teacher's kNN (83.4% against 84.2%) but not its linear probe (82.5% against 86.3%). "
        "Whether distillation wins with a teacher far above the student needs a stronger teacher than this CPU "
        "trains in a session (the table's best method, dinov2-fmnist, on ViT-tiny costs 7.5 times this one a step, "
        "and this one trained 2.3 hours), and both arms trained past 5 epochs.",
}
