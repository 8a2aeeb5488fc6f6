"""Self-Flow (seed 000): self-supervised flow matching. Its checkable claims."""

from __future__ import annotations

import statistics

from selfsup.claims.suite import Claim, Context, Rule, column, pretrain_run


def measure_self_flow_alignment(ctx: Context) -> dict:
    """Self-Flow on digits: the alignment loss 1 − cos per step."""
    epochs = 6 if ctx.quick else 40  # 11 steps an epoch at the preset's batch of 128
    early = 30
    metrics = {"first": [], "min_early": [], "late_over_early": []}
    series = {}
    for seed in range(ctx.seeds):
        run = pretrain_run(ctx, "self-flow-digits", f"self-flow-s{seed}",
                           [f"trainer.seed={seed}", f"trainer.max_epochs={epochs}", "trainer.log_every_n_steps=1"])
        curve = column(run, "train/rep_loss")
        values = [v for _, v in curve]
        window = max(1, min(early, len(values)) // 10)
        metrics["first"].append(values[0])
        metrics["min_early"].append(min(values[:early]))
        end_early = min(early, len(values))
        late = statistics.fmean(values[-window:])
        at_early = statistics.fmean(values[max(0, end_early - window):end_early])
        metrics["late_over_early"].append(late / at_early)
        series[f"seed {seed}"] = [[s, v] for s, v in curve]
    f = {k: statistics.fmean(v) for k, v in metrics.items()}
    return {"metrics": metrics, "series": series, "xlabel": "step", "ylabel": "1 - cos",
            "ours": f"starts at {f['first']:.2f}, min over the first {early} steps {f['min_early']:.3f}, "
                    f"last steps / around step {early} = {f['late_over_early']:.2f} ({len(values)} steps)"}


CLAIMS = (
    Claim("self-flow-alignment-curve", "000_c0eb5cef7d50dfe6.txt", "the alignment curve",
          "With the projector's random init, 1 − cos starts near 1, falls below 0.1 within a few iterations and "
          "keeps falling without a plateau.",
          "starts ≈ 1, < 0.1 within a few iterations, keeps falling",
          (Rule("first", ">", 0.8), Rule("min_early", "<", 0.1), Rule("late_over_early", "<", 1.0)),
          measure_self_flow_alignment,
          "micro SiT on 8×8 digits for 40 epochs (~440 steps), not SiT-XL/2 on ImageNet latents"),
)
