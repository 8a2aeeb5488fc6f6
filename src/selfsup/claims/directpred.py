"""DirectPred (seed 003): the predictor dynamics of non-contrastive SSL. Its checkable claims."""

from __future__ import annotations

import statistics

from selfsup.claims.suite import Claim, Context, Rule, column, knn_pair, knn_top1, pm, pretrain_run


def measure_byol_ode(ctx: Context) -> dict:
    """The DirectPred paper's 3-D dynamical system (p, s, τ): the observations the simulator checks."""
    from selfsup.simulate import byol_dynamics as bd

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
                    f"{statistics.fmean(m['linear']):.1f}% (gain {pm(m['gain'])} points, {ctx.seeds} seed(s))"}



# ---- claims 10-13: the ablations of §1 and §4-5, measured on digits ------------------------------------------------

RANK = "instruments/dim_std_projection"


def spread(run_dir, dim: int) -> list[tuple[int, float]]:
    """(step, √D · std over the batch of the L2-normalised projector outputs), eval mode on a fixed batch of 512
    training images (``RankCollapse``): about 1 when the outputs spread over the sphere, 0 when collapsed
    (SimSiam Fig. 2 plots the unscaled std against 1/√D)."""
    return [(s, v * dim ** 0.5) for s, v in column(run_dir, RANK)]


def measure_collapse(ctx: Context) -> dict:
    """SimSiam and BYOL on digits, each as published and without its predictor or its stop-gradient."""
    epochs = 2 if ctx.quick else 4
    dims = {"simsiam": 512, "byol": 128}  # the presets' method.dim
    variants = {"simsiam": [("base", []), ("no_predictor", ["method.predictor=none"]),
                            ("no_stop_gradient", ["method.stop_gradient=false"])],
                "byol": [("base", []), ("no_predictor", ["method.predictor=none"]),
                         ("no_stop_gradient", ["method.stop_gradient=false", "method.momentum=0.0",
                                               "method.momentum_schedule=constant"])]}
    m, series, knn = {}, {}, {}
    for seed in range(ctx.seeds):
        for method, runs in variants.items():
            last = {}
            for label, overrides in runs:
                run = pretrain_run(ctx, f"{method}-digits", f"{method}-{label}-s{seed}",
                                   [f"trainer.seed={seed}", f"trainer.max_epochs={epochs}",
                                    "instruments.rank_every_n_steps=5", *overrides])
                curve = spread(run, dims[method])
                last[label] = curve[-1][1]
                knn.setdefault(f"{method}_{label}", []).append(knn_top1(run))
                if seed == 0:
                    series[f"{method} {label.replace('_', ' ')}"] = [list(p) for p in curve]
            m.setdefault(f"{method}_base_spread", []).append(last["base"])
            for label in ("no_predictor", "no_stop_gradient"):
                m.setdefault(f"{method}_{label}_ratio", []).append(last[label] / max(last["base"], 1e-12))
    m.update({f"knn_{k}": v for k, v in knn.items()})
    ours = "; ".join(f"{method}: spread base {statistics.fmean(m[f'{method}_base_spread']):.3f}, without predictor "
                     f"×{statistics.fmean(m[f'{method}_no_predictor_ratio']):.3f}, without stop-gradient "
                     f"×{statistics.fmean(m[f'{method}_no_stop_gradient_ratio']):.3f} (kNN "
                     + " / ".join(f"{statistics.fmean(knn[f'{method}_{label}']):.1f}" for label, _ in variants[method])
                     + "%)" for method in variants)
    return {"metrics": m, "series": series, "ours": ours, "xlabel": "step",
            "ylabel": "√D · std of L2-normalised projection", "logy": True}


CLAIMS = (
    Claim("byol-ode", "003_7eb28182f9835575.txt", "§3–4, the (p, s, τ) dynamics",
          "The BYOL/SimSiam ODE: conserved quantity at η = 0, its e^(−2ηt) decay, the fixed points and the "
          "collapse basin growing with weight decay.",
          "Obs. 1–4 and the closed-form fixed points", (Rule("share_confirmed", ">", 0.999),),
          measure_byol_ode, "the same ODE, integrated numerically"),
    Claim("directpred-beats-linear", "003_7eb28182f9835575.txt", "§5, Table 1",
          "DirectPred beats the gradient-trained linear predictor.",
          "+5 points on STL-10 and ImageNet at 60 epochs", (Rule("gain", ">", 0.0),),
          measure_directpred_vs_linear, "micro ViT on 8×8 digits for 30 epochs, not ResNet-18 on STL-10",
          default_seeds=3),
    Claim("predictor-and-stop-gradient-needed", "003_7eb28182f9835575.txt", "§1 (and SimSiam §4.1–4.2, Fig. 2)",
          "Removing the predictor or the stop-gradient collapses BYOL and SimSiam.",
          "collapse: SimSiam without stop-gradient 0.1% kNN, the std of the L2-normalised output → 0; without "
          "predictor 0.1% (SimSiam Tab. 1); BYOL without predictor 0.2% (BYOL Tab. 5)",
          tuple(Rule(f"{m}_{a}_ratio", "<", 0.2) for m in ("simsiam", "byol")
                for a in ("no_predictor", "no_stop_gradient")),
          measure_collapse, "micro ViT on 8×8 digits for 4 epochs (20 steps); collapse read as the final spread of "
          "the projector's L2-normalised outputs falling under a fifth of the unablated run's; BYOL's stop-gradient "
          "is removed at m = 0, where the target is the online network"),
)
