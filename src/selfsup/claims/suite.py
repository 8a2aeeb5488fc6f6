"""The seeds' checkable claims: each one a statement, the paper's figure, a measurement and a verdict rule
stated before the run.

A claim's ``measure(ctx)`` returns ``{"metrics": {name: [value per seed]}, "ours": text, "series": {label:
[[x, y], ...]}}``. Each metric is a per-seed value; an effect is *paired*: each seed runs every arm with the same
init, data order and augmentation stream where the arm allows, and the metric is the per-seed difference. Its
``rules`` decide the verdict from the metrics alone (``stats``):

* a rule compares one metric's mean over seeds with a threshold (``>`` or ``<``): it *holds* when the whole 95%
  confidence interval of the mean (Student t, n − 1 dof) lies on the claimed side, *fails* when it lies wholly on
  the other side, and is inconclusive otherwise; an equivalence rule (``within``, "comparable") holds when the
  interval lies inside ± its margin (two one-sided tests) and fails when it lies wholly outside;
* one seed is judged without a spread only where the measurement is deterministic (the simulators); a training
  claim with fewer than ``MIN_SEEDS`` seeds is inconclusive, saying so;
* an inconclusive rule says its minimum detectable effect at 80% power, whether that is larger than the paper's
  effect (underpowered), and how many seeds would detect it at the observed spread;
* a correlation rule (``Rule.pairs``) is judged on Spearman's ρ over every (run, checkpoint) pair, its 95% interval
  a percentile bootstrap that resamples whole runs, with the same sides; fewer than ``MIN_SEEDS`` runs or seeds:
  inconclusive;
* the claim is *reproduced* when every rule holds, *not reproduced* when any rule fails, and *inconclusive*
  otherwise.

The claims themselves live in one module per seed (``self_flow``, ``embedding_norms``, ``cookbook``,
``directpred``, ``moco_v3``, ``distillation``) and, for the papers of methods an issue added, one per paper
(``ijepa``, ``lejepa``); ``registry.CLAIMS`` gathers them.
"""

from __future__ import annotations

import ast
import csv
import hashlib
import importlib
import inspect
import json
import math
import shutil
import statistics
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from selfsup.claims import stats
from selfsup.config import load_run, load_run_config, to_dict
from selfsup.data import datasets
from selfsup.engine import pretrain
from selfsup.errors import UserError
from selfsup.eval import ProbeConfig
from selfsup.runs import run_linear

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE = "reproduced", "not reproduced", "inconclusive"
MIN_SEEDS = 3  # every training claim
TEST_IMAGES = {"digits": 359, "fashion-mnist": 10_000}  # the test split behind each kNN accuracy
PILOT_FIRST_SEED = 1000  # a pilot's seeds: never the seeds of the run whose budget it sets


@dataclass(frozen=True)
class Rule:
    """``mean(metric) op threshold`` over seeds, e.g. ``Rule("knn_gain", ">", 0.0, paper=1.7)``; ``op="within"``
    reads "comparable": ``|mean(metric)| < threshold`` (the margin).

    ``paper``: the paper's value of the metric where it states one, in the metric's units (its distance from the
    threshold is the paper's effect, which decides whether an inconclusive rule was underpowered); ``arms``: the
    metrics holding the kNN accuracies (in %) that the metric is made of, each on the claim's test split;
    ``accuracy``: the metric is in kNN points where the arms' accuracies are not stored."""

    metric: str
    op: str  # ">" | "<" | "within"
    threshold: float
    paper: float | None = None
    arms: tuple[str, ...] = ()
    accuracy: bool = False  # in kNN points on the claim's test split (implied by arms)
    test_data: str = ""  # the test split of its accuracies where it is not the claim's (``TEST_IMAGES``)
    # (x, y, group[, seed]): a correlation rule. The metric is Spearman's ρ of metrics[x] against metrics[y] pooled
    # over every pair (a run's checkpoint each), its 95% interval a bootstrap over the groups (runs) whole
    # (``stats.cluster_bootstrap_spearman``); judged from those lists, the metric's own list only reports it. The
    # runs, and the seeds where a seed list is named, must each number at least ``MIN_SEEDS``
    pairs: tuple[str, ...] = ()

    def __str__(self) -> str:
        if self.op == "within":
            return f"{self.metric} within ±{self.threshold:g}"
        return f"{self.metric} {self.op} {self.threshold:g}"

    @property
    def paper_effect(self) -> float | None:
        if self.op == "within":
            return self.threshold
        return None if self.paper is None else abs(self.paper - self.threshold)

    def stats(self, values: list[float], deterministic: bool = False) -> dict:
        """n, mean, sd, the 95% interval, the MDE and the verdict of this rule on the per-seed ``values``, with
        the reason of an inconclusive verdict."""
        out = {"rule": str(self), "n": len(values), "mean": None, "sd": None, "interval": None, "mde": None,
               "paper_effect": self.paper_effect, "underpowered": None, "seeds_needed": None}
        finite = [v for v in values if v is not None and math.isfinite(v)]
        if not values or len(finite) < len(values):
            return {**out, "verdict": INCONCLUSIVE,
                    "why": f"undefined for {len(values) - len(finite)} of {len(values)} seed(s)"}
        n, mean, sd = stats.summary(finite)
        out.update(mean=mean, sd=sd)
        if n == 1 and deterministic:
            lo = hi = mean
        elif n == 1:
            return {**out, "verdict": INCONCLUSIVE, "why": f"1 seed; a training claim needs at least {MIN_SEEDS}"}
        else:
            lo, hi = stats.interval(mean, sd, n)
            out.update(interval=[lo, hi], mde=stats.mde(sd, n))
        verdict = self._side(lo, hi)
        if n < MIN_SEEDS and not deterministic:
            why = f"{n} seeds; a training claim needs at least {MIN_SEEDS}" + (
                f" (the interval is on the {'claimed' if verdict == REPRODUCED else 'other'} side)"
                if verdict != INCONCLUSIVE else "")
        elif verdict != INCONCLUSIVE:
            return {**out, "verdict": verdict, "why": ""}
        else:
            why = ("the interval overlaps the margin's edge" if self.op == "within" else
                   "the interval contains the threshold")
        why += self._power(out, mean, sd)  # fills out's underpowered / seeds_needed
        return {**out, "verdict": INCONCLUSIVE, "why": why}

    def judge(self, values: list[float], deterministic: bool = False) -> str:
        return self.stats(values, deterministic)["verdict"]

    def correlation_stats(self, metrics: dict[str, list]) -> dict:
        """A correlation rule (``pairs``): ρ over every pair, its run-bootstrap 95% interval and the verdict; n is
        the number of runs (the resampled units), which must be at least ``MIN_SEEDS``."""
        x, y, groups = (metrics.get(k, []) for k in self.pairs[:3])
        runs = len(set(groups))
        seeds = len(set(metrics.get(self.pairs[3], []))) if len(self.pairs) > 3 else runs
        out = {"rule": str(self), "n": runs, "pairs": len(x), "mean": None, "sd": None, "interval": None,
               "mde": None, "paper_effect": self.paper_effect, "underpowered": None, "seeds_needed": None,
               "interval_kind": f"percentile bootstrap over the runs ({stats.BOOTSTRAP_RESAMPLES} resamples, "
                                f"seed {stats.BOOTSTRAP_SEED})"}
        finite = all(v is not None and math.isfinite(v) for v in (*x, *y))
        r = stats.spearman(x, y) if finite and len(x) == len(y) else math.nan
        if not math.isfinite(r):
            return {**out, "verdict": INCONCLUSIVE, "why": f"ρ undefined over {len(x)} pair(s)"}
        lo, hi = stats.cluster_bootstrap_spearman(x, y, groups)
        out.update(mean=r, interval=None if math.isnan(lo) else [lo, hi])
        if out["interval"] is None:
            return {**out, "verdict": INCONCLUSIVE, "why": "no resample defines ρ"}
        verdict = self._side(lo, hi)
        if runs < MIN_SEEDS or seeds < MIN_SEEDS:
            return {**out, "verdict": INCONCLUSIVE,
                    "why": f"{runs} run(s) of {seeds} seed(s); a correlation across runs needs at least {MIN_SEEDS} "
                           "of each"}
        if verdict == INCONCLUSIVE:
            return {**out, "verdict": verdict, "why": "the interval contains the threshold"}
        return {**out, "verdict": verdict, "why": ""}

    def _side(self, lo: float, hi: float) -> str:
        t = self.threshold
        if self.op == "within":
            holds, fails = -t < lo and hi < t, hi <= -t or lo >= t
        elif self.op == ">":
            holds, fails = lo > t, hi <= t
        elif self.op == "<":
            holds, fails = hi < t, lo >= t
        else:
            raise ValueError(f"rule op must be >, < or within, got {self.op!r}")
        return REPRODUCED if holds else NOT_REPRODUCED if fails else INCONCLUSIVE

    def _power(self, out: dict, mean: float, sd: float | None) -> str:
        """Fills ``underpowered`` / ``seeds_needed``; the sentence saying them."""
        if sd is None or out["mde"] is None:
            return ""
        effect = self.paper_effect
        whose = "the margin" if self.op == "within" else "the paper's effect"  # TOST: a margin the MDE must fit
        target, whose = (effect, whose) if effect else (abs(mean - self.threshold), "the observed distance from the "
                                                                                    "threshold")
        need = stats.seeds_needed(sd, target)
        out["seeds_needed"] = need
        need_text = (f"{need} seeds at this spread would detect" if need else
                     f"more than {stats.MAX_SEEDS} seeds would be needed to detect")
        if effect:
            out["underpowered"] = out["mde"] > effect
            return (f"; {'underpowered' if out['underpowered'] else 'not underpowered'}: MDE {out['mde']:.3g} "
                    f"{'>' if out['underpowered'] else '≤'} {whose} {effect:.3g}; {need_text} it")
        return f"; MDE {out['mde']:.3g} (no paper effect in these units); {need_text} {whose}, {target:.3g}"


def judge(rules: tuple[Rule, ...], metrics: dict[str, list[float]], deterministic: bool = False,
          test_images: int | None = None) -> tuple[str, list[dict]]:
    """Every rule holds: reproduced; any fails: not reproduced; otherwise inconclusive. With each rule's stats
    (and, for a rule over kNN accuracies, the test images behind each, ``test_images`` unless the rule names its
    own ``test_data``, and each accuracy's binomial sd in points)."""
    judged = []
    for rule in rules:
        s = rule.correlation_stats(metrics) if rule.pairs else rule.stats(metrics[rule.metric], deterministic)
        if rule.arms or rule.accuracy:
            images = TEST_IMAGES[rule.test_data] if rule.test_data else test_images
            s["test_images"] = images
            s["binomial_sd"] = {arm: binomial_sd(statistics.fmean(metrics[arm]), images)
                                for arm in rule.arms if metrics.get(arm)}
        judged.append(s)
    verdicts = [s["verdict"] for s in judged]
    if NOT_REPRODUCED in verdicts:
        return NOT_REPRODUCED, judged
    return (REPRODUCED if all(v == REPRODUCED for v in verdicts) else INCONCLUSIVE), judged


def verdict(rules: tuple[Rule, ...], metrics: dict[str, list[float]], deterministic: bool = False) -> str:
    return judge(rules, metrics, deterministic)[0]


def binomial_sd(accuracy: float, images: int | None) -> float | None:
    """The binomial sd, in points, of one top-1 accuracy (in %) over ``images`` test images."""
    if not images or not math.isfinite(accuracy):
        return None
    p = min(max(accuracy / 100.0, 0.0), 1.0)
    return 100.0 * math.sqrt(p * (1 - p) / images)


@dataclass(frozen=True)
class Pilot:
    """The figures of the short pilot that set a claim's budget before its run (``selfsup claims pilot``): its
    seeds (from ``PILOT_FIRST_SEED``, never the run's), the optimiser steps of each of its training runs, its
    wall time, and the per-seed sd of each paired effect, whose minimum detectable effect at ``MIN_SEEDS`` seeds
    (80% power, ``stats.mde``) decides whether the budget can show the effect; ``note``: what the pilot covered
    where it is not the whole claim, and the choice it led to."""

    seeds: int
    steps: int  # per training run
    wall_s: float  # the whole pilot, one CPU thread
    sd: tuple[tuple[str, float], ...]  # (metric, per-seed sd of the paired effect)
    note: str = ""

    def mde(self, n: int = MIN_SEEDS) -> dict[str, float]:
        return {metric: stats.mde(sd, n) for metric, sd in self.sd}

    def __str__(self) -> str:
        spread = "; ".join(f"{m}: sd {sd:.3g} → MDE at {MIN_SEEDS} seeds {self.mde()[m]:.3g}" for m, sd in self.sd)
        return (f"{self.seeds} pilot seeds × {self.steps} steps per run, {self.wall_s / 60:.1f} min on one thread"
                + (f"; {spread}" if spread else "") + (f". {self.note}" if self.note else ""))


@dataclass
class Context:
    """What a measurement may use: quick or full budget, the seeds (``seed_ids``: from ``first_seed``, which a
    pilot moves to ``PILOT_FIRST_SEED``), the folder for its training runs, extra run overrides (the tests pass
    tiny ones), a progress printer, and the record of its training runs (``pretrain_run`` appends each:
    name, optimiser steps, fit seconds)."""

    quick: bool
    seeds: int
    work: Path
    overrides: list[str] = field(default_factory=list)
    progress: Callable[[str], None] = print
    first_seed: int = 0
    runs: list[dict] = field(default_factory=list)

    def seed_ids(self) -> range:
        return range(self.first_seed, self.first_seed + self.seeds)


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
    default_seeds: int = MIN_SEEDS
    deterministic: bool = False  # a simulator: one run has no spread to estimate
    test_data: str = "digits"  # the test split behind its kNN accuracies (``TEST_IMAGES``)
    decide: str = ""  # what would decide it where the suite's budget does not (docs/CLAIMS.md's paragraph)
    pilot: Pilot | None = None  # the pilot that set its budget, where one ran
    first_seed: int = 0  # the run's first seed: past the seeds of an earlier run that served as its pilot


# ---- measurement helpers ----------------------------------------------------------------------------------

_SHARED_RUNS: dict[tuple, Path] = {}  # this process's shared runs: (preset, overrides) -> run folder


def pretrain_run(ctx: Context, preset: str, name: str, overrides: list[str], share: bool = False) -> Path:
    """One pretraining run of ``preset`` in ``ctx.work/name`` (a finished run of the same config there is read, any
    other replaced), recorded in ``ctx.runs``.
    ``share``: a run of the same preset and overrides trained earlier in this process (by this claim or another;
    a seeded run is reproducible) is reused instead of trained again."""
    key = (preset, tuple(overrides), tuple(ctx.overrides))
    if share and key in _SHARED_RUNS and (_SHARED_RUNS[key] / "knn.json").exists():
        ctx.progress(f"shared run {_SHARED_RUNS[key]} (pretrain {preset} {' '.join(overrides)})")
        _record(ctx, _SHARED_RUNS[key], shared=True)
        return _SHARED_RUNS[key]
    run_dir = ctx.work / name
    cfg = load_run_config(preset, [*overrides, "trainer.progress_bar=false", "trainer.accelerator=cpu",
                                   "trainer.devices=1", f"output_dir={ctx.work}", f"name={name}",
                                   *ctx.overrides])
    if finished_as(run_dir, cfg):  # a seeded run is reproducible: an interrupted claim keeps its finished runs
        ctx.progress(f"finished run {run_dir} (pretrain {preset} {' '.join(overrides)}): read, not trained again")
        _record(ctx, run_dir)
        if share:
            _SHARED_RUNS[key] = run_dir
        return run_dir
    if resumable_as(run_dir, cfg):  # and its unfinished ones: a resumed run ends as the uninterrupted one
        ctx.progress(f"unfinished run {run_dir} (pretrain {preset} {' '.join(overrides)}): resumed from its last "
                     "checkpoint")
        run_dir = pretrain(cfg, preset=preset, resume=run_dir)
    else:
        if run_dir.exists():
            shutil.rmtree(run_dir)
        ctx.progress(f"pretrain {preset} {' '.join(overrides)}")
        run_dir = pretrain(cfg, preset=preset)
    if share:
        _SHARED_RUNS[key] = run_dir
    _record(ctx, run_dir)
    return run_dir


def same_config(run_dir: Path, cfg) -> bool:
    """Whether ``run_dir``'s config.yaml, resolved as a resume resolves it (a field added to the config since the run
    takes its default), is exactly the config ``cfg``."""
    if not (run_dir / "config.yaml").exists():
        return False
    try:
        saved = load_run(run_dir)
    except UserError:  # a config this code no longer resolves: not the run it would train
        return False

    def as_written(c) -> dict:  # as config.yaml holds it (tuples as lists)
        return yaml.safe_load(yaml.safe_dump(to_dict(c), sort_keys=False))

    return as_written(saved) == as_written(cfg)


def finished_as(run_dir: Path, cfg) -> bool:
    """Whether ``run_dir`` holds a finished run (its report written) of exactly the config ``cfg``."""
    facts = run_dir / "run.json"
    if not ((run_dir / "knn.json").exists() and facts.exists()):
        return False
    return json.loads(facts.read_text()).get("status") == "finished" and same_config(run_dir, cfg)


def resumable_as(run_dir: Path, cfg) -> bool:
    """Whether ``run_dir`` holds an unfinished run of exactly the config ``cfg`` with a checkpoint to resume from
    (a session stopped mid-claim: its hours of training are kept)."""
    return (run_dir / "checkpoints" / "last.ckpt").exists() and same_config(run_dir, cfg)


def _record(ctx: Context, run_dir: Path, shared: bool = False) -> None:
    info = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else {}
    ctx.runs.append({"name": run_dir.name, "steps": info.get("global_step"), "fit_s": info.get("fit_seconds"),
                     **({"shared": True} if shared else {})})


def column(run_dir: Path, key: str) -> list[tuple[int, float]]:
    """``(step, value)`` rows of ``metrics.csv`` where ``key`` was logged."""
    with (run_dir / "metrics.csv").open(newline="") as f:
        return [(int(r["step"]), float(r[key])) for r in csv.DictReader(f) if r.get(key) not in (None, "")]


_KNN_TEST_SIZES: list[int] = []  # the test images behind each kNN accuracy read in this claim (``run_claim``)


def knn_top1(run_dir: Path, which: str = "pretrained") -> float:
    knn = json.loads((run_dir / "knn.json").read_text())
    _KNN_TEST_SIZES.append(knn["test_size"])
    return knn[which]["top1"]


def linear_top1(weights: Path, quick: bool) -> float:
    """The linear probe's test top-1 (%) of a run folder's trained backbone, or of a weights file in it (its
    ``backbone_init.safetensors``: the random init, through the same evaluation path): MoCo v3's protocol, SGD
    over its lr grid chosen on a validation split carved from the training images, on cached features; 30
    epochs (2 when quick)."""
    cfg = ProbeConfig.for_protocol("moco_v3", epochs=2 if quick else 30)
    return float(run_linear(weights, cfg)["test"]["top1"])


def events(run_dir: Path, kind: str) -> int:
    path = run_dir / "events.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return sum(json.loads(line).get("kind") == kind for line in lines)


def knn_pair(ctx: Context, preset: str, a: tuple[str, list[str]], b: tuple[str, list[str]], epochs: int,
              extra: list[str] = ()) -> dict:
    """kNN top-1 of two variants over seeds and the per-seed gain of ``a`` over ``b``."""
    out = {a[0]: [], b[0]: [], "gain": []}
    for seed in ctx.seed_ids():
        for label, overrides in (a, b):
            run = pretrain_run(ctx, preset, f"{label}-s{seed}",
                               [f"trainer.seed={seed}", f"trainer.max_epochs={epochs}", *extra, *overrides])
            out[label].append(knn_top1(run))
        out["gain"].append(out[a[0]][-1] - out[b[0]][-1])
    return out


def mean_ci(values: list[float], sign: bool = True) -> str:
    """``mean [lo, hi]``: the mean over seeds and its 95% interval (Student t); the mean alone for one value."""
    f = "{:+.2f}" if sign else "{:.2f}"
    finite = [v for v in values if math.isfinite(v)]
    if len(finite) < len(values) or not values:
        return "undefined"
    n, mean, sd = stats.summary(values)
    if n == 1:
        return f.format(mean)
    lo, hi = stats.interval(mean, sd, n)
    return f"{f.format(mean)} [{f.format(lo)}, {f.format(hi)}]"


def ci(values: list[float]) -> str:
    """``mean [lo, hi]`` without the leading + (a level, not a gain)."""
    return mean_ci(values, sign=False)


def definition_hash(claim: Claim) -> str:
    """sha256 of what a committed result was measured by (``claims run --resume`` reruns a claim when it
    changed): the claim's definition (every field, the rules, the measuring function's name), the source of
    ``suite.py`` and ``stats.py``, of the claim's seed module, of every ``selfsup`` module that module imports
    directly (the simulators, ``selfsup.eval.*``, ``selfsup.flow.*``...) and of the presets it names (not its
    ``decide`` text nor its ``pilot``'s figures, which do not change what it measures). Changes
    deeper in the library (the engine, a method's code) are not hashed: rerun without ``--resume`` after those."""
    module = inspect.getmodule(claim.measure)
    sources = {name: Path(inspect.getfile(m)).read_bytes() for name, m in
               (("suite", inspect.getmodule(Claim)), ("stats", stats), (module.__name__, module))}
    tree = ast.parse(sources[module.__name__])
    for node in ast.walk(tree):
        names = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                 [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        for name in names:
            if name.startswith("selfsup.") and not name.startswith("selfsup.claims"):
                sources[name] = Path(inspect.getfile(importlib.import_module(name))).read_bytes()
    presets = {p.stem: p for p in (Path(__file__).resolve().parents[1] / "presets").glob("*.yaml")}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in presets:
            sources[f"preset:{node.value}"] = presets[node.value].read_bytes()
    digest = hashlib.sha256()
    definition = {k: (str(v) if k != "measure" else v.__qualname__) for k, v in vars(claim).items()
                  if k not in ("decide", "pilot")}  # what would decide it, and how its budget was chosen
    definition["rules"] = [repr(r) for r in claim.rules]
    digest.update(json.dumps(definition, sort_keys=True).encode())
    for name in sorted(sources):
        digest.update(name.encode() + b"\0" + sources[name] + b"\0")
    return digest.hexdigest()


def judge_result(claim: Claim, metrics: dict) -> tuple[str, list[dict]]:
    return judge(claim.rules, metrics, claim.deterministic, TEST_IMAGES.get(claim.test_data))


IN_MEMORY = ("digits", "fashion-mnist")  # the datasets a claim's runs share in memory
_SPLITS: dict[tuple, object] = {}


@contextmanager
def shared_datasets():
    """While it is open, each split of an in-memory dataset (``IN_MEMORY``) is read once per process and shared
    by every run, evaluation and monitor (Fashion-MNIST: 1.5 s per train + test read on this machine); held-out
    classes and long tails are still applied per run (``restrict``), on the shared split."""
    original = datasets._load_dataset

    def shared(cfg, split):
        if cfg.name not in IN_MEMORY:
            return original(cfg, split)
        key = (cfg.name, cfg.root, split)
        if key not in _SPLITS:
            _SPLITS[key] = original(cfg, split)
        return _SPLITS[key]

    datasets._load_dataset = shared
    try:
        yield
    finally:
        datasets._load_dataset = original


def declared_test_images(claim: Claim) -> set[int]:
    """The test-split sizes the claim's rules say its accuracies are measured on."""
    return {TEST_IMAGES[claim.test_data]} | {TEST_IMAGES[r.test_data] for r in claim.rules if r.test_data}


def run_claim(claim: Claim, ctx: Context) -> dict:
    """Measure ``claim`` (its runs sharing the datasets: ``shared_datasets``) and judge it by its rules; the
    result JSON's content, with its training runs (steps, fit seconds) and the test images behind every kNN
    accuracy it read (``knn_test_images``; a size its rules do not declare is reported)."""
    _KNN_TEST_SIZES.clear()
    code_hash = definition_hash(claim)  # of the sources as they were when it started
    with shared_datasets():
        measured = claim.measure(ctx)
    sizes = sorted(set(_KNN_TEST_SIZES))
    undeclared = [n for n in sizes if n not in declared_test_images(claim)]
    if undeclared:
        ctx.progress(f"{claim.id}: kNN accuracies on {undeclared} test images, not the declared "
                     f"{sorted(declared_test_images(claim))}: its binomial sds are wrong (fix its test_data)")
    metrics = measured["metrics"]
    verdict_, judged = judge_result(claim, metrics)
    return {"id": claim.id, "seed": claim.seed, "section": claim.section, "statement": claim.statement,
            "paper": claim.paper, "rules": [str(r) for r in claim.rules], "quick": ctx.quick, "seeds": ctx.seeds,
            "first_seed": ctx.first_seed, "metrics": metrics, "ours": measured["ours"], "verdict": verdict_,
            "statistics": judged, "knn_test_images": sizes, "runs": list(ctx.runs),
            "code_hash": code_hash,
            "why_different": claim.why_different, "series": measured.get("series", {}),
            "details": measured.get("details", {}),
            "plot": {k: measured[k] for k in ("xlabel", "ylabel", "logy", "logx") if k in measured}}


def plot_result(result: dict, path: Path) -> None:
    """The claim's series if it has any, else its per-seed metrics as points."""
    import matplotlib  # lazy: the Agg backend is chosen before pyplot, on the one path that draws

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
