"""The seeds' checkable claims: each one a statement, the paper's figure, a measurement and a verdict rule
stated before the run.

A claim's ``measure(ctx)`` returns ``{"metrics": {name: [value per seed]}, "ours": text, "series": {label:
[[x, y], ...]}}``. Its ``rules`` decide the verdict from the metrics alone:

* each rule compares one metric's mean over seeds with a threshold (``>`` or ``<``);
* with two or more seeds the rule holds only if mean ± std lies wholly on the passing side, fails only if it
  lies wholly on the failing side, and is *inside the spread* otherwise;
* the claim is *reproduced* when every rule holds, *not reproduced* when any rule fails, and *inconclusive*
  otherwise.

The claims themselves live in one module per seed (``self_flow``, ``embedding_norms``, ``cookbook``,
``directpred``, ``moco_v3``); ``registry.CLAIMS`` gathers them.
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


def knn_pair(ctx: Context, preset: str, a: tuple[str, list[str]], b: tuple[str, list[str]], epochs: int,
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


def pm(values: list[float]) -> str:
    mean = statistics.fmean(values)
    return f"{mean:+.2f}" + (f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else "")


def run_claim(claim: Claim, ctx: Context) -> dict:
    """Measure ``claim`` and judge it by its rules; the result JSON's content."""
    measured = claim.measure(ctx)
    metrics = measured["metrics"]
    return {"id": claim.id, "seed": claim.seed, "section": claim.section, "statement": claim.statement,
            "paper": claim.paper, "rules": [str(r) for r in claim.rules], "quick": ctx.quick, "seeds": ctx.seeds,
            "metrics": metrics, "ours": measured["ours"], "verdict": verdict(claim.rules, metrics),
            "why_different": claim.why_different, "series": measured.get("series", {}),
            "details": measured.get("details", {}),
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
