"""The seeds' checkable claims: each one a statement, the paper's figure, a measurement and a verdict rule
stated before the run.

A claim's ``measure(ctx)`` returns ``{"metrics": {name: [value per seed]}, "ours": text, "series": {label:
[[x, y], ...]}}``. Its ``rules`` decide the verdict from the metrics alone:

* each rule compares one metric's mean over seeds with a threshold (``>`` or ``<``);
* with two or more seeds the rule holds only if mean ± std lies wholly on the passing side, fails only if it
  lies wholly on the failing side, and is *inside the spread* otherwise;
* the claim is *reproduced* when every rule holds, *not reproduced* when any rule fails, and *inconclusive*
  otherwise.
"""

from __future__ import annotations

import csv
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"


@dataclass(frozen=True)
class Rule:
    """``mean(metric) op threshold`` over seeds, e.g. ``Rule("knn_gain", ">", 0.0)``."""

    metric: str
    op: str  # ">" | "<"
    threshold: float

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.threshold:g}"

    def judge(self, values: list[float]) -> str:
        mean = statistics.fmean(values)
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        lo, hi = mean - spread, mean + spread
        holds, fails = (lo > self.threshold, hi <= self.threshold) if self.op == ">" else \
            (hi < self.threshold, lo >= self.threshold)
        return REPRODUCED if holds else NOT_REPRODUCED if fails else INCONCLUSIVE


def verdict(rules: tuple[Rule, ...], metrics: dict[str, list[float]]) -> str:
    """Every rule holds: reproduced; any fails: not reproduced; otherwise inconclusive."""
    judged = [rule.judge(metrics[rule.metric]) for rule in rules]
    if NOT_REPRODUCED in judged:
        return NOT_REPRODUCED
    return REPRODUCED if all(j == REPRODUCED for j in judged) else INCONCLUSIVE


@dataclass
class Context:
    """What a measurement may use: quick or full budget, the seeds, the folder for its training runs, extra
    run overrides (the tests pass tiny ones), and a progress printer."""

    quick: bool
    seeds: int
    work: Path
    overrides: list[str] = field(default_factory=list)
    progress: Callable[[str], None] = print


@dataclass(frozen=True)
class Claim:
    id: str
    seed: str  # the seed document's file
    section: str
    statement: str
    paper: str  # the paper's figure
    rules: tuple[Rule, ...]
    measure: Callable[[Context], dict]
    why_different: str = ""  # scale, data, budget
    default_seeds: int = 1


# ---- measurement helpers ----------------------------------------------------------------------------------

def pretrain_run(ctx: Context, preset: str, name: str, overrides: list[str]) -> Path:
    """One pretraining run of ``preset`` in ``ctx.work/name`` (replaced if it exists)."""
    import shutil

    from selfsup.config import load_run_config
    from selfsup.engine import pretrain

    run_dir = ctx.work / name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    cfg = load_run_config(preset, [*overrides, "trainer.progress_bar=false", "trainer.accelerator=cpu",
                                   "trainer.devices=1", f"output_dir={ctx.work}", f"name={name}",
                                   *ctx.overrides])
    ctx.progress(f"pretrain {preset} {' '.join(overrides)}")
    return pretrain(cfg, preset=preset)


def column(run_dir: Path, key: str) -> list[tuple[int, float]]:
    """``(step, value)`` rows of ``metrics.csv`` where ``key`` was logged."""
    with (run_dir / "metrics.csv").open(newline="") as f:
        return [(int(r["step"]), float(r[key])) for r in csv.DictReader(f) if r.get(key) not in (None, "")]


def knn_top1(run_dir: Path, which: str = "pretrained") -> float:
    return json.loads((run_dir / "knn.json").read_text())[which]["top1"]


def events(run_dir: Path, kind: str) -> int:
    path = run_dir / "events.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return sum(json.loads(line).get("kind") == kind for line in lines)


# ---- the claims ------------------------------------------------------------------------------------------

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


def _knn_pair(ctx: Context, preset: str, a: tuple[str, list[str]], b: tuple[str, list[str]], epochs: int,
              extra: list[str] = ()) -> dict:
    """kNN top-1 of two variants over seeds and the per-seed gain of ``a`` over ``b``."""
    out = {a[0]: [], b[0]: [], "gain": []}
    for seed in range(ctx.seeds):
        for label, overrides in (a, b):
            run = pretrain_run(ctx, preset, f"{label}-s{seed}",
                               [f"trainer.seed={seed}", f"trainer.max_epochs={epochs}", *extra, *overrides])
            out[label].append(knn_top1(run))
        out["gain"].append(out[a[0]][-1] - out[b[0]][-1])
    return out


def measure_directpred_vs_linear(ctx: Context) -> dict:
    """BYOL on digits with the DirectPred predictor against a gradient-trained linear predictor."""
    m = _knn_pair(ctx, "byol-digits", ("directpred", ["method.predictor=directpred"]),
                  ("linear", ["method.predictor=linear"]), epochs=3 if ctx.quick else 30)
    return {"metrics": m, "series": {},
            "ours": f"kNN top-1 DirectPred {statistics.fmean(m['directpred']):.1f}% vs linear "
                    f"{statistics.fmean(m['linear']):.1f}% (gain {_pm(m['gain'])} points, {ctx.seeds} seed(s))"}


def measure_byol_no_ema(ctx: Context) -> dict:
    """BYOL without EMA (m = 0): a 10× predictor lr against the same lr as the rest."""
    no_ema = ["method.momentum=0.0", "method.momentum_schedule=constant"]
    m = _knn_pair(ctx, "byol-digits", ("pred_lr_10x", ["optim.predictor_lr_mult=10"]),
                  ("pred_lr_1x", ["optim.predictor_lr_mult=1"]), epochs=3 if ctx.quick else 30, extra=no_ema)
    return {"metrics": m, "series": {},
            "ours": f"m = 0: kNN top-1 with a 10× predictor lr {statistics.fmean(m['pred_lr_10x']):.1f}% vs 1× "
                    f"{statistics.fmean(m['pred_lr_1x']):.1f}% (gain {_pm(m['gain'])} points)"}


def measure_frozen_patch_projection(ctx: Context) -> dict:
    """MoCo v3 on digits at 10× the preset's lr: frozen random patch projection against a learned one."""
    epochs = 3 if ctx.quick else 40
    large_lr = ["optim.base_lr=1.5e-2", "eval.knn_every_n_steps=10"]
    m = {"spikes_learned_minus_frozen": [], "knn_gain": []}
    for seed in range(ctx.seeds):
        runs = {frozen: pretrain_run(ctx, "moco-v3-vit-digits", f"{'frozen' if frozen else 'learned'}-s{seed}",
                                     [f"trainer.seed={seed}", f"trainer.max_epochs={epochs}", *large_lr,
                                      f"model.stop_grad_conv1={str(frozen).lower()}"]) for frozen in (True, False)}
        m["spikes_learned_minus_frozen"].append(events(runs[False], "grad_spike") + events(runs[False], "knn_dip")
                                                - events(runs[True], "grad_spike") - events(runs[True], "knn_dip"))
        m["knn_gain"].append(knn_top1(runs[True]) - knn_top1(runs[False]))
    return {"metrics": m, "series": {},
            "ours": f"learned − frozen spikes + kNN dips {_pm(m['spikes_learned_minus_frozen'])}; kNN frozen − "
                    f"learned {_pm(m['knn_gain'])} points"}


def _pm(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:+.2f}" + (f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else "")


CLAIMS: dict[str, Claim] = {c.id: c for c in (
    Claim("self-flow-alignment-curve", "000_c0eb5cef7d50dfe6.txt", "the alignment curve",
          "With the projector's random init, 1 − cos starts near 1, falls below 0.1 within a few iterations and "
          "keeps falling without a plateau.",
          "starts ≈ 1, < 0.1 within a few iterations, keeps falling",
          (Rule("first", ">", 0.8), Rule("min_early", "<", 0.1), Rule("late_over_early", "<", 1.0)),
          measure_self_flow_alignment,
          "micro SiT on 8×8 digits for 40 epochs (~440 steps), not SiT-XL/2 on ImageNet latents"),
    Claim("norm-convergence-quadratic", "001_83bb0da94ad51f7b.txt", "convergence simulation",
          "Steps to converge grow quadratically with the initial embedding norm.",
          "≈ 96·r² steps (r = 1: 96, r = 4: 1547)",
          (Rule("exponent", ">", 1.8), Rule("exponent", "<", 2.2)), measure_norm_convergence,
          "the same simulation (cosine loss on random pairs, plain SGD)"),
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
    Claim("byol-no-ema-predictor-lr", "002_010407c8532905bc.txt", "§3.2 (EMA teacher)",
          "BYOL trains without EMA when the predictor's learning rate is higher.",
          "no EMA works with a larger predictor lr (DirectPred: α_p = 10)", (Rule("gain", ">", 0.0),),
          measure_byol_no_ema, "micro ViT on 8×8 digits for 30 epochs", default_seeds=3),
    Claim("frozen-patch-projection", "004_128fc6c8941a5b31.txt", "§4.2 (instability)",
          "At a large lr the frozen random patch projection gives fewer gradient spikes and kNN dips, and a "
          "higher final accuracy, than a learned one.",
          "ViT-B, lr 1.5e-4 × 10: frozen patch projection removes the dips; +1.7 points at lr 1.5e-4",
          (Rule("spikes_learned_minus_frozen", ">", 0.0), Rule("knn_gain", ">", 0.0)),
          measure_frozen_patch_projection, "micro ViT (patch 2) on 8×8 digits, 40 epochs", default_seeds=3),
)}


def run_claim(claim: Claim, ctx: Context) -> dict:
    """Measure ``claim`` and judge it by its rules; the result JSON's content."""
    measured = claim.measure(ctx)
    metrics = measured["metrics"]
    return {"id": claim.id, "seed": claim.seed, "section": claim.section, "statement": claim.statement,
            "paper": claim.paper, "rules": [str(r) for r in claim.rules], "quick": ctx.quick, "seeds": ctx.seeds,
            "metrics": metrics, "ours": measured["ours"], "verdict": verdict(claim.rules, metrics),
            "why_different": claim.why_different, "series": measured.get("series", {}),
            "plot": {k: measured[k] for k in ("xlabel", "ylabel", "logy", "logx") if k in measured}}


def plot_result(result: dict, path: Path) -> None:
    """The claim's series if it has any, else its per-seed metrics as points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    style = result.get("plot", {})
    if result["series"]:
        for label, points in result["series"].items():
            ax.plot([p[0] for p in points], [p[1] for p in points], label=label,
                    marker="." if len(points) < 30 else None)
        ax.set_xlabel(style.get("xlabel", ""))
        ax.set_ylabel(style.get("ylabel", ""))
        if style.get("logy"):
            ax.set_yscale("log")
        if style.get("logx"):
            ax.set_xscale("log")
    else:
        for i, (name, values) in enumerate(result["metrics"].items()):
            ax.scatter([i] * len(values), values, label=name)
        ax.set_xticks(range(len(result["metrics"])), list(result["metrics"]), rotation=15)
    ax.legend(fontsize=8)
    ax.set_title(f"{result['id']}: {result['verdict']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
