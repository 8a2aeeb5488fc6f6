"""Embedding norms (seed 001): the norm effect, cut-initialisation, GradScale, norm-OOD. Its checkable claims."""

from __future__ import annotations

from selfsup.claims.suite import Claim, Context, Rule


def measure_norm_convergence(ctx: Context) -> dict:
    """The embedding-norm paper's simulation: steps to converge by initial norm (γ = 0)."""
    from selfsup.simulate import norm_convergence as nc

    base = nc.NormConvergenceConfig()
    cfg = nc.NormConvergenceConfig(n_pairs=64 if ctx.quick else base.n_pairs, seed=0,
                                   norms=(0.5, 1.0, 2.0, 3.0) if ctx.quick else base.norms,
                                   gammas=() if ctx.quick else base.gammas)
    result = nc.run(cfg, progress=ctx.progress)
    rows = result["by_norm"]["rows"]
    exponent = result["by_norm"]["exponent"]
    penalty = ", ".join(f"γ={p['gamma']:g}: exponent {p['exponent']:.2f}" if p["exponent"] is not None
                        else f"γ={p['gamma']:g}: {p['converged']}/{p['runs']} converged" for p in result["penalty"])
    return {"metrics": {"exponent": [exponent if exponent is not None else float("nan")]},
            "series": {"ours": [[r["norm"], r["steps"]] for r in rows if r["steps"] is not None],
                       "paper": [[r, s] for r, s in nc.PAPER_STEPS.items() if r <= max(cfg.norms)]},
            "xlabel": "initial norm r", "ylabel": "steps to converge", "logy": True, "logx": True,
            "ours": f"steps ∝ r^{exponent:.2f}" + (f"; with the penalty {penalty} (the stated loss removes "
                                                    "lr·γ/n of norm per step, so at large r steps grow like "
                                                    "n·r/(lr·γ): linearly, not quadratically)" if penalty else "")}


CLAIMS = (
    Claim("norm-convergence-quadratic", "001_83bb0da94ad51f7b.txt", "convergence simulation",
          "Steps to converge grow quadratically with the initial embedding norm.",
          "≈ 96·r² steps (r = 1: 96, r = 4: 1547)",
          (Rule("exponent", ">", 1.8), Rule("exponent", "<", 2.2)), measure_norm_convergence,
          "the same simulation (cosine loss on random pairs, plain SGD)"),
)
