"""The SSL cookbook (seed 002). Its checkable claims."""

from __future__ import annotations

import statistics

from selfsup.claims.suite import Claim, Context, Rule, knn_pair, pm


def measure_byol_no_ema(ctx: Context) -> dict:
    """BYOL without EMA (m = 0): a 10× predictor lr against the same lr as the rest."""
    no_ema = ["method.momentum=0.0", "method.momentum_schedule=constant"]
    m = knn_pair(ctx, "byol-digits", ("pred_lr_10x", ["optim.predictor_lr_mult=10"]),
                  ("pred_lr_1x", ["optim.predictor_lr_mult=1"]), epochs=3 if ctx.quick else 30, extra=no_ema)
    return {"metrics": m, "series": {},
            "ours": f"m = 0: kNN top-1 with a 10× predictor lr {statistics.fmean(m['pred_lr_10x']):.1f}% vs 1× "
                    f"{statistics.fmean(m['pred_lr_1x']):.1f}% (gain {pm(m['gain'])} points)"}


CLAIMS = (
    Claim("byol-no-ema-predictor-lr", "002_010407c8532905bc.txt", "§3.2 (EMA teacher)",
          "BYOL trains without EMA when the predictor's learning rate is higher.",
          "no EMA works with a larger predictor lr (DirectPred: α_p = 10)", (Rule("gain", ">", 0.0),),
          measure_byol_no_ema, "micro ViT on 8×8 digits for 30 epochs", default_seeds=3),
)
