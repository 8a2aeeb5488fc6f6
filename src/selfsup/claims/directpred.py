"""DirectPred (seed 003): the predictor dynamics of non-contrastive SSL. Its checkable claims."""

from __future__ import annotations

import statistics

from selfsup.claims.suite import Claim, Context, Rule, knn_pair, pm


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
)
