"""DirectPred (seed 003): the predictor dynamics of non-contrastive SSL. Its checkable claims."""

from __future__ import annotations

import statistics

from selfsup.claims.embedding_norms import _model
from selfsup.claims.suite import Claim, Context, Pilot, Rule, ci, column, knn_pair, knn_top1, mean_ci, pretrain_run
from selfsup.instruments.dynamics import square_weight
from selfsup.simulate import byol_dynamics as bd


def measure_byol_ode(ctx: Context) -> dict:
    """The DirectPred paper's 3-D dynamical system (p, s, τ): the observations the simulator checks."""
    cfg = bd.ByolDynamicsConfig()  # seconds: quick and full are the same
    result = bd.run(cfg, progress=ctx.progress)
    rows = bd.checks(result, cfg)
    share = sum(r["confirmed"] for r in rows) / len(rows)
    return {"metrics": {"share_confirmed": [share]}, "series": {},
            "ours": f"{sum(r['confirmed'] for r in rows)} of {len(rows)} observations shown: "
                    + "; ".join(f"{r['claim']} ({'yes' if r['confirmed'] else 'no'})" for r in rows)}


def measure_directpred_vs_linear(ctx: Context) -> dict:
    """BYOL on digits with the DirectPred predictor against a gradient-trained linear predictor."""
    m = knn_pair(ctx, "byol-digits", ("directpred", ["method.predictor=directpred"]),
                  ("linear", ["method.predictor=linear"]), epochs=3 if ctx.quick else 30)
    return {"metrics": m, "series": {},
            "ours": f"kNN top-1 DirectPred {statistics.fmean(m['directpred']):.1f}% vs linear "
                    f"{statistics.fmean(m['linear']):.1f}% (gain {mean_ci(m['gain'])} points, {ctx.seeds} seed(s))"}


def measure_directpred_vs_mlp(ctx: Context) -> dict:
    """BYOL on digits with the DirectPred predictor against the default 2-layer MLP predictor (BN, ReLU)."""
    m = knn_pair(ctx, "byol-digits", ("directpred", ["method.predictor=directpred"]),
                 ("mlp", ["method.predictor=mlp"]), epochs=3 if ctx.quick else 30)
    return {"metrics": m, "series": {},
            "ours": f"kNN top-1 DirectPred {statistics.fmean(m['directpred']):.1f}% vs 2-layer MLP "
                    f"{statistics.fmean(m['mlp']):.1f}% (DirectPred − MLP {mean_ci(m['gain'])} points, "
                    f"{ctx.seeds} seed(s))"}


# ---- claims 10-13: the ablations of §1 and §4-5, measured on digits ------------------------------------------------

RANK = "instruments/dim_std_projection"
EFF_RANK = "instruments/eff_rank_embedding"  # PCs for 99% of the variance of the backbone features
SHORT = ["optim.warmup_epochs=1"]  # the presets warm up for 5 epochs; these runs are a few epochs long


def spread(run_dir, dim: int) -> list[tuple[int, float]]:
    """(step, √D · std over the batch of the L2-normalised projector outputs), eval mode on a fixed batch of 512
    training images (``RankCollapse``): about 1 when the outputs spread over the sphere, 0 when collapsed
    (SimSiam Fig. 2 plots the unscaled std against 1/√D)."""
    return [(s, v * dim ** 0.5) for s, v in column(run_dir, RANK)]


def measure_collapse(ctx: Context) -> dict:
    """SimSiam and BYOL on digits, each as published and without its predictor or its stop-gradient."""
    epochs = 2 if ctx.quick else 15
    dims = {"simsiam": 512, "byol": 128}  # the presets' method.dim
    variants = {"simsiam": [("base", []), ("no_predictor", ["method.predictor=none"]),
                            ("no_stop_gradient", ["method.stop_gradient=false"])],
                "byol": [("base", []), ("no_predictor", ["method.predictor=none"]),
                         ("no_stop_gradient", ["method.stop_gradient=false", "method.momentum=0.0",
                                               "method.momentum_schedule=constant"])]}
    m, series, knn, rank = {}, {}, {}, {}
    for seed in ctx.seed_ids():
        for method, runs in variants.items():
            last = {}
            for label, overrides in runs:
                run = pretrain_run(ctx, f"{method}-digits", f"{method}-{label}-s{seed}",
                                   [f"trainer.seed={seed}", f"trainer.max_epochs={epochs}",
                                    "instruments.rank_every_n_steps=5", *SHORT, *overrides])
                curve = spread(run, dims[method])
                last[label] = curve[-1][1]
                knn.setdefault(f"{method}_{label}", []).append(knn_top1(run))
                rank.setdefault(f"{method}_{label}", []).append(column(run, EFF_RANK)[-1][1])
                if seed == ctx.first_seed:
                    series[f"{method} {label.replace('_', ' ')}"] = [list(p) for p in curve]
            m.setdefault(f"{method}_base_spread", []).append(last["base"])
            for label in ("no_predictor", "no_stop_gradient"):
                m.setdefault(f"{method}_{label}_ratio", []).append(last[label] / max(last["base"], 1e-12))
    m.update({f"knn_{k}": v for k, v in knn.items()})
    m.update({f"eff_rank_{k}": v for k, v in rank.items()})  # reported, not judged
    ours = "; ".join(f"{method}: spread base {statistics.fmean(m[f'{method}_base_spread']):.3f}, without predictor "
                     f"×{statistics.fmean(m[f'{method}_no_predictor_ratio']):.3f}, without stop-gradient "
                     f"×{statistics.fmean(m[f'{method}_no_stop_gradient_ratio']):.3f} (kNN "
                     + " / ".join(f"{statistics.fmean(knn[f'{method}_{label}']):.1f}" for label, _ in variants[method])
                     + "%; backbone effective rank " + " / ".join(f"{statistics.fmean(rank[f'{method}_{label}']):.0f}"
                                                                for label, _ in variants[method])
                     + ")" for method in variants)
    return {"metrics": m, "series": series, "ours": ours, "xlabel": "step",
            "ylabel": "√D · std of L2-normalised projection", "logy": True}


def byol_runs(ctx: Context, variants: list[tuple[str, list[str]]], epochs: int, extra: list[str] = (),
              preset: str = "byol-digits", warmup: list[str] = SHORT) -> dict:
    """Per variant and seed: kNN top-1 and the final spread (``spread``) of a BYOL run of ``preset``."""
    out = {}
    for seed in ctx.seed_ids():
        for label, overrides in variants:
            run = pretrain_run(ctx, preset, f"{label}-s{seed}",
                               [f"trainer.seed={seed}", f"trainer.max_epochs={epochs}",
                                "instruments.rank_every_n_steps=5", *warmup, *extra, *overrides])
            out.setdefault(label, []).append(knn_top1(run))
            out.setdefault(f"spread_{label}", []).append(spread(run, 128)[-1][1])
    return out


def measure_symmetric_ema(ctx: Context) -> dict:
    """BYOL with the symmetric linear predictor: with EMA, without (m = 0), and without at a 10× predictor lr."""
    no_ema = ["method.momentum=0.0", "method.momentum_schedule=constant"]
    fast = [*no_ema, "optim.predictor_lr_mult=10"]
    m = byol_runs(ctx, [("ema", []), ("no_ema", no_ema), ("no_ema_pred_lr_10x", fast)],
                  epochs=2 if ctx.quick else 6, extra=["method.predictor=symmetric"])
    m["ema_gain"] = [a - b for a, b in zip(m["ema"], m["no_ema"])]
    m["lr_gain"] = [a - b for a, b in zip(m["no_ema_pred_lr_10x"], m["no_ema"])]
    return {"metrics": m, "series": {},
            "ours": f"symmetric W_p, kNN top-1: EMA {statistics.fmean(m['ema']):.1f}%, no EMA "
                    f"{statistics.fmean(m['no_ema']):.1f}%, no EMA with 10× predictor lr "
                    f"{statistics.fmean(m['no_ema_pred_lr_10x']):.1f}% (EMA gain {mean_ci(m['ema_gain'])}, lr gain "
                    f"{mean_ci(m['lr_gain'])} points; spreads " + " / ".join(
                        f"{statistics.fmean(m[f'spread_{k}']):.3f}" for k in ("ema", "no_ema", "no_ema_pred_lr_10x"))
                    + ")"}


def measure_weight_decay(ctx: Context) -> dict:
    """BYOL on Fashion-MNIST for one epoch with no, the preset's (moderate) and a 1000× (too strong) AdamW weight
    decay."""
    m = byol_runs(ctx, [("wd_0", ["optim.weight_decay=0"]), ("wd_moderate", ["optim.weight_decay=0.1"]),
                        ("wd_strong", ["optim.weight_decay=100"])], epochs=1, preset="byol-fmnist",
                  warmup=["optim.warmup_epochs=0.2"])
    m["moderate_gain"] = [a - b for a, b in zip(m["wd_moderate"], m["wd_0"])]
    m["strong_spread_ratio"] = [a / max(b, 1e-12) for a, b in zip(m["spread_wd_strong"], m["spread_wd_moderate"])]
    return {"metrics": m, "series": {},
            "ours": f"kNN top-1 wd 0 {statistics.fmean(m['wd_0']):.1f}%, 0.1 "
                    f"{statistics.fmean(m['wd_moderate']):.1f}%, 100 {statistics.fmean(m['wd_strong']):.1f}% "
                    f"(moderate − none {mean_ci(m['moderate_gain'])} points); "
                    f"spread at wd 100 ×{statistics.fmean(m['strong_spread_ratio']):.3f} of wd 0.1's"}


# DirectPred's STL-10 training (its Fig. 2): ResNet-18, SGD lr 0.03, momentum 0.9, wd 4e-4 (reference METHODS.md);
# here the suite's BN ConvNet for ResNet-18 (as the embedding-norm claims) for 1,000 steps (200 digits epochs at 256).
# Issue 23 item 3 asks for W_p's norm at least doubling: the pilot shows no length reaches it here (the claim's note).
SGD = ["optim.name=sgd", "optim.base_lr=0.03", "optim.momentum=0.9", "optim.weight_decay=4e-4"]
ALIGNMENT_EPOCHS = 200
ALIGNMENT_BACKBONE = "model.backbone=bn_cnn_micro"
# `selfsup claims pilot eigenspace-alignment --seeds 2` (seeds 1000, 1001; claims/results/pilots), 2026-12-02; the
# same pilot on the micro ViT first (pilots/eigenspace-alignment.micro-vit.pilot.json: 33.6 min, ratio 0.65, sd 0.03)
PILOT_ALIGNMENT = Pilot(
    seeds=2, steps=1000, wall_s=187.1, sd=(("commutator_ratio", 0.0472),),
    note="‖W_p‖ grows ×1.08 in 1,000 steps (×1.09 on the micro ViT), short of the doubling issue 23 asks for, and no "
         "length reaches it here: on both backbones the commutator, the asymmetry and W_p stop moving after about "
         "200 steps, as the loss falls to 0.015 and the prediction's effective rank from 60 to 3. The budget stays "
         "at 1,000 steps, on the BN ConvNet (ResNet-18's stand-in, 11× cheaper than the micro ViT)")


def predictor_norm(run_dir, trained: bool) -> float:
    """‖W_p‖ (Frobenius) of the run's linear predictor at init (rebuilt from its seed) or at its end."""
    model, _, _ = _model(run_dir, trained)
    return float(square_weight(model.predictor).detach().norm())


def measure_eigenspace_alignment(ctx: Context) -> dict:
    """BYOL on digits (BN ConvNet) with a gradient-trained linear predictor (no symmetry imposed), under SGD as
    DirectPred's Fig. 2: the normalised commutator ‖[F, W_p]‖ / (‖F‖ ‖W_p‖) and the asymmetry ‖W_p − W_pᵀ‖ / ‖W_p‖
    over training (``PredictorAlignment``), and how far ‖W_p‖ grew."""
    m = {"commutator_ratio": [], "asymmetry_ratio": [], "commutator_first": [], "commutator_last": [],
         "wp_norm_growth": []}
    series = {}
    for seed in ctx.seed_ids():
        run = pretrain_run(ctx, "byol-digits", f"linear-s{seed}",
                           [f"trainer.seed={seed}", f"trainer.max_epochs={2 if ctx.quick else ALIGNMENT_EPOCHS}",
                            "method.predictor=linear", ALIGNMENT_BACKBONE, "instruments.every_n_steps=10", *SHORT,
                            *SGD])
        m["wp_norm_growth"].append(predictor_norm(run, True) / predictor_norm(run, False))
        comm = column(run, "instruments/pred_commutator")
        asym = column(run, "instruments/pred_asymmetry")
        tail = statistics.fmean(v for _, v in comm[-3:])
        m["commutator_first"].append(comm[0][1])
        m["commutator_last"].append(tail)
        m["commutator_ratio"].append(tail / max(comm[0][1], 1e-12))
        m["asymmetry_ratio"].append(statistics.fmean(v for _, v in asym[-3:]) / max(asym[0][1], 1e-12))
        if seed == ctx.first_seed:
            series = {"‖[F, W_p]‖ / (‖F‖‖W_p‖)": [list(p) for p in comm],
                      "‖W_p − W_pᵀ‖ / ‖W_p‖": [list(p) for p in asym]}
    return {"metrics": m, "series": series, "xlabel": "step", "ylabel": "normalised norm",
            "ours": f"normalised commutator {statistics.fmean(m['commutator_first']):.3f} at step 0 → "
                    f"{statistics.fmean(m['commutator_last']):.3f} at the end "
                    f"(×{statistics.fmean(m['commutator_ratio']):.2f}); "
                    f"asymmetry ×{statistics.fmean(m['asymmetry_ratio']):.2f}; ‖W_p‖ grew ×{ci(m['wp_norm_growth'])}"}


CLAIMS = (
    Claim("byol-ode", "003_7eb28182f9835575.txt", "§3–4, the (p, s, τ) dynamics",
          "The BYOL/SimSiam ODE: conserved quantity at η = 0, its e^(−2ηt) decay, the fixed points and the "
          "collapse basin growing with weight decay.",
          "Obs. 1–4 and the closed-form fixed points", (Rule("share_confirmed", ">", 0.999, paper=1.0),),
          measure_byol_ode, "the same ODE, integrated numerically", default_seeds=1, deterministic=True),
    Claim("directpred-beats-linear", "003_7eb28182f9835575.txt", "§5, Table 1",
          "DirectPred beats the gradient-trained linear predictor.",
          "+5 points on STL-10 and ImageNet at 60 epochs",
          (Rule("gain", ">", 0.0, paper=5.0, arms=("directpred", "linear")),),
          measure_directpred_vs_linear, "micro ViT on 8×8 digits for 30 epochs, not ResNet-18 on STL-10"),
    Claim("directpred-comparable-to-mlp", "003_7eb28182f9835575.txt", "§5, Table 9",
          "DirectPred, with no gradient-trained predictor, is comparable with BYOL's default 2-layer MLP predictor.",
          "ImageNet 300 epochs: DirectPred 72.4% vs the 2-layer predictor 72.5% top-1",
          (Rule("gain", "within", 2.0, arms=("directpred", "mlp")),), measure_directpred_vs_mlp,
          "micro ViT on 8×8 digits for 30 epochs, not ResNet-50 on ImageNet; 'comparable' read as within ±2 kNN "
          "points, two one-sided tests",
          decide="Decided at 30 epochs: DirectPred is better here, not comparable. Whether the 2-layer predictor "
                 "catches up, as at ImageNet's 300 epochs, needs a longer run, not more seeds."),
    Claim("predictor-and-stop-gradient-needed", "003_7eb28182f9835575.txt", "§1 (and SimSiam §4.1–4.2, Fig. 2)",
          "Removing the predictor or the stop-gradient collapses BYOL and SimSiam.",
          "collapse: SimSiam without stop-gradient 0.1% kNN, the std of the L2-normalised output → 0; without "
          "predictor 0.1% (SimSiam Tab. 1); BYOL without predictor collapses too (BYOL Tab. 5)",
          tuple(Rule(f"{m}_{a}_ratio", "<", 0.2, paper=0.0) for m in ("simsiam", "byol")
                for a in ("no_predictor", "no_stop_gradient")),
          measure_collapse, "micro ViT on 8×8 digits for 15 epochs (75 steps, 1 warmup epoch); collapse read as the "
          "final spread of the projector's L2-normalised outputs falling under a fifth of the unablated run's; BYOL's "
          "stop-gradient is removed at m = 0, where the target is the online network",
          decide="Without its predictor BYOL's spread ends just above a fifth of the base's after 75 steps; a "
                 "longer run decides whether it falls under. SimSiam's no-predictor ratio varies too much across "
                 "seeds at this length; longer runs lower that spread."),
    Claim("symmetric-predictor-needs-ema", "003_7eb28182f9835575.txt", "§4 (Tbl. 3, Fig. 6)",
          "A symmetric linear predictor fails without EMA and works with it; a larger relative predictor lr rescues "
          "the no-EMA case.",
          "STL-10 Tbl. 3: symmetric W_p fails without EMA; ImageNet SimSiam with a symmetric linear W_p 0.1% top-1 "
          "(asymmetric 68.1%); Fig. 6: α_p > 1 makes it work",
          (Rule("ema_gain", ">", 0.0, arms=("ema", "no_ema")),
           Rule("lr_gain", ">", 0.0, arms=("no_ema_pred_lr_10x", "no_ema"))),
          measure_symmetric_ema,
          "micro ViT on 8×8 digits, BYOL for 6 epochs (30 steps), AdamW; 10× predictor lr as α_p",
          decide="Deciding needs 3 seeds; at the measured spread 3–4 seeds suffice."),
    Claim("weight-decay-window", "003_7eb28182f9835575.txt", "§4 (Obs. 3–5, Tbl. 2)",
          "Too strong weight decay collapses; moderate weight decay helps.",
          "Obs. 5: η > τ²/4(1+σ²) leaves only the collapsed fixed point; Tbl. 2: weight decay improves BYOL on STL-10",
          (Rule("moderate_gain", ">", 0.0, arms=("wd_moderate", "wd_0")),
           Rule("strong_spread_ratio", "<", 0.2, paper=0.0)),
          measure_weight_decay,
          "micro ViT (patch 7) on Fashion-MNIST, BYOL for 1 epoch (234 steps, warm-up 0.2 epoch), scored on its "
          "10,000 test images; AdamW's decoupled decay 0 / 0.1 / 100 (lr 1.5e-3) instead of SGD's η; collapse read "
          "as the spread falling under a fifth of the moderate run's", test_data="fashion-mnist"),
    Claim("eigenspace-alignment", "003_7eb28182f9835575.txt", "§4, Thm. 3, Fig. 2",
          "The eigenspace of a gradient-trained linear predictor W_p aligns with that of F (the normalised commutator "
          "shrinks) over training.",
          "Fig. 2 (BYOL, ResNet-18, STL-10): the eigenspaces align and W_p moves towards symmetry",
          (Rule("commutator_ratio", "<", 0.5),), measure_eigenspace_alignment,
          "8×8 digits, a 4-layer BN ConvNet for ResNet-18, BYOL with a linear predictor for 200 epochs (1,000 "
          "steps) under SGD as Fig. 2 (lr 0.03, momentum 0.9, wd 4e-4); ratio of the mean of the last three logged "
          "commutators to the first; ‖W_p‖'s growth reported",
          pilot=PILOT_ALIGNMENT),
)
