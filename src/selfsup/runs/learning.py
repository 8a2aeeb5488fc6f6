"""Whether a finished run learned: checked at the end of every run (``runs.finish.end_of_run_report``), each failure a
``not_learning`` event in ``events.jsonl`` (instruments/detectors.py ``EventLog``), a console line and a line of the
report, with its cause:

- ``lr``: the scheduled lr never left 0 (every step in a warm-up, a zero ``optim.base_lr``);
- ``frozen``: the evaluated backbone's parameters equal its init's exactly (no step moved them);
- ``knn_noise``: where the data has labels, the kNN difference between the trained backbone and its start (the random
  init, or the ``model.weights`` it started from) is inside the noise of the test split;
- ``knn_drop``: the trained backbone is under its start by more than the noise (where the collapse alarm is off: with
  it on, that is its ``collapse`` event, ``runs.finish.not_learning``).

One noise rule for a gain and a loss alike (``knn_noise_band``): ``NOISE_Z`` binomial standard errors of the
difference of two accuracies measured on the same ``n`` test images, ``√(p₁(1 − p₁)/n + p₀(1 − p₀)/n)`` (the two
treated as independent, which overstates the noise of a paired comparison). A difference past ``+band`` is a gain,
one past ``−band`` a loss, one inside ``±band`` neither: on 100 test images near 50% the band is ±13.9 points, so a
2-point drop is no more a collapse than a 2-point rise is learning.

Also the schedule phases the method shortened to fit the run (``schedules.fit_phases``), recorded in ``run.json``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn

from selfsup.instruments.collapse import KNN_OVER_INIT
from selfsup.instruments.detectors import EventLog, read_events
from selfsup.runs.facts import mark_run

NOISE_Z = 1.96  # the band: a two-sided 95% interval of the kNN gain under the binomial model


def knn_noise_band(knn: dict) -> float:
    """Half-width, in top-1 points, of the 95% band of the kNN difference trained − start on ``knn['test_size']``
    images: the one threshold of a gain and of a loss."""
    n = max(int(knn.get("test_size", 0)), 1)
    p1, p0 = knn["pretrained"]["top1"] / 100, knn["random_init"]["top1"] / 100
    return 100 * NOISE_Z * math.sqrt((p1 * (1 - p1) + p0 * (1 - p0)) / n)


def knn_verdict(knn: dict) -> tuple[str, float, float]:
    """``gain``, ``noise`` or ``loss``, with the difference trained − start in points and the band
    (``knn_noise_band``)."""
    diff, band = knn["pretrained"]["top1"] - knn["random_init"]["top1"], knn_noise_band(knn)
    return ("gain" if diff > band else "loss" if diff < -band else "noise"), diff, band


def start_words(knn: dict) -> str:
    """What the kNN compared the trained backbone with: "its random init", or "its start (weights: SOURCE)"."""
    label = (knn.get("labels") or {}).get("random_init", "random_init")
    return "its random init" if label == "random_init" else f"its {label}"


def noise_words(knn: dict, band: float) -> str:
    """The band, said: ``±B: Z binomial standard errors on N test images``."""
    return f"±{band:.2f}: {NOISE_Z:g} binomial standard errors on {knn.get('test_size', '?')} test images"


def backbone_moved(trained: nn.Module, init: nn.Module) -> bool:
    """Whether any parameter of ``trained`` differs from ``init``'s (buffers such as BatchNorm statistics move
    without learning, so they are left out)."""
    init_params = dict(init.named_parameters())
    for name, p in trained.named_parameters():
        q = init_params.get(name)
        if q is None or q.shape != p.shape or not torch.equal(p.detach().cpu(), q.detach().cpu()):
            return True
    return False


def learning_checks(model, init_backbone: nn.Module, run_dir: Path, step: int | None = None) -> list[dict]:
    """The causes of a run trained to ``step`` (default: the model's own) that did not learn (empty when it did):
    each a dict with ``cause`` and ``line``. The lr's is judged where this process ran the steps (``max_lr`` holds
    their lr); a run finished from its checkpoint after a kill (``runs.finish``) has no such record."""
    found = []
    steps = int(model.global_step if step is None else step)
    if steps == 0:
        found.append({"cause": "no_steps", "value": 0.0, "baseline": 1.0,
                      "line": "the run took no optimiser step; give it more data or epochs"})
    elif int(model.global_step) == steps and model.max_lr == 0:
        found.append({"cause": "lr", "value": 0.0, "baseline": 0.0,
                      "line": f"the lr was 0 at every one of the run's {steps} step(s) (optim.base_lr="
                              f"{model.cfg.optim.base_lr:g}, optim.warmup_epochs={model.cfg.optim.warmup_epochs:g}); "
                              "give a positive lr or a longer run"})
    if steps and not backbone_moved(model.eval_backbone, init_backbone):
        if found:  # the lr's: one cause, one line
            found[-1]["line"] = found[-1]["line"].replace("; give", ", and the backbone's weights equal its init; give")
        else:
            found.append({"cause": "frozen", "value": 0.0, "baseline": 0.0,
                          "line": "the backbone's weights equal its init exactly: no step moved them (frozen "
                                  "parameters, or every gradient 0)"})
    knn_path = Path(run_dir) / "knn.json"
    if knn_path.exists():
        found += knn_checks(json.loads(knn_path.read_text()), run_dir)
    return found


def knn_checks(knn: dict, run_dir: Path) -> list[dict]:
    """The kNN's cause, if any (``knn_verdict``): a difference inside the noise, or a loss past it that no
    ``knn_over_init`` collapse event has said."""
    verdict, diff, band = knn_verdict(knn)
    collapsed = any(e.get("sign") == KNN_OVER_INIT.name for e in read_events(Path(run_dir) / "events.jsonl"))
    if verdict == "gain" or collapsed:
        return []
    if verdict == "noise":
        line = (f"the kNN difference from {start_words(knn)}, {diff:+.2f} points, is inside the noise "
                f"({noise_words(knn, band)}): neither a gain nor a loss is shown; train longer, or check the data "
                "and lr")
        return [{"cause": "knn_noise", "value": diff, "baseline": band, "line": line}]
    line = (f"the trained backbone's kNN is {-diff:.2f} points under {start_words(knn)}, past the noise "
            f"({noise_words(knn, band)}); lower optim.base_lr, or check the data")
    return [{"cause": "knn_drop", "value": diff, "baseline": -band, "line": line}]


def learning_report(model, init_backbone: nn.Module, run_dir: Path, step: int | None = None) -> list[str]:
    """``learning_checks`` as ``not_learning`` events and the console lines; the schedule phases shortened to fit
    the run recorded in ``run.json`` (``phases_fitted``). An event already in ``events.jsonl`` (the finishing's
    report done again after a kill) is not written twice."""
    run_dir = Path(run_dir)
    fitted = getattr(model, "phases_fitted", [])
    if fitted:
        mark_run(run_dir, phases_fitted=fitted)
    lines = []
    step = int(model.global_step if step is None else step)
    log, said = EventLog(run_dir / "events.jsonl"), read_events(run_dir / "events.jsonl")
    for check in learning_checks(model, init_backbone, run_dir, step):
        if not any(e.get("kind") == "not_learning" and e.get("cause") == check["cause"] for e in said):
            log.write(step, "not_learning", check["value"], check["baseline"], cause=check["cause"],
                      meaning=check["line"])
        lines.append(f"  not learning: {check['line']}")
    return lines


# --------------------------------------------------------------------------- without labels
RANK_KEPT = 0.5  # collapse: the effective rank (99%) under this share of its start's (docs/evaluation.md: chosen on
# the digits runs; the first rule's RankMe under 80% called the healthy dino-digits a collapse: its mean direction)
RANK_GAIN = 1.25  # learned: RankMe over this multiple of its start's (an unmoved backbone: exactly 1)
LABEL_FREE_VERDICTS = {"learned": "gain", "noise": "noise", "collapse": "loss"}  # the kNN verdict each answers


def agreement_band(lf: dict) -> float:
    """Half-width, in points, of the 95% band of the NN-agreement difference trained − start on ``lf['images']``
    images: the kNN's binomial rule (``knn_noise_band``) on the two agreements."""
    n = max(int(lf.get("images", 0)), 1)
    p1, p0 = lf["pretrained"]["nn_agreement"] / 100, lf["random_init"]["nn_agreement"] / 100
    return 100 * NOISE_Z * math.sqrt((p1 * (1 - p1) + p0 * (1 - p0)) / n)


def label_free_verdict(lf: dict) -> tuple[str, str]:
    """``learned``, ``noise`` or ``collapse`` from the label-free measures of a run and of its start
    (``runs.label_free``), with the reason in words. The rule (docs/evaluation.md): ``collapse`` when the trained
    effective rank (99% variance) is under ``RANK_KEPT`` of the start's or the two views' nearest-neighbour
    agreement fell past its band (``agreement_band``); else ``learned`` when the agreement rose past the band or
    RankMe rose over ``RANK_GAIN`` times the start's; else ``noise``."""
    trained, start = lf["pretrained"], lf["random_init"]
    diff, band = trained["nn_agreement"] - start["nn_agreement"], agreement_band(lf)
    kept = trained["effective_rank_99"] / max(start["effective_rank_99"], 1)
    gained = trained["rankme"] / max(start["rankme"], 1e-12)
    said = (f"NN agreement {diff:+.2f} points (band ±{band:.2f}), effective rank {kept:.0%} and RankMe "
            f"{gained:.0%} of the start's")
    if kept < RANK_KEPT:
        return "collapse", f"{said}: the effective rank under {RANK_KEPT:.0%}, the embedding collapsed"
    if diff < -band:
        return "collapse", f"{said}: the views' agreement fell past the noise"
    if diff > band:
        return "learned", f"{said}: the views' agreement rose past the noise"
    if gained > RANK_GAIN:
        return "learned", f"{said}: RankMe rose over {RANK_GAIN:.0%} of the start's"
    return "noise", (f"{said}: the agreement moved inside the noise and RankMe under {RANK_GAIN:.0%}; train "
                     "longer, or check the data and lr")


def label_free_words(lf: dict, knn_verdict: str | None = None) -> list[str]:
    """The printed lines: the measures of the trained backbone and of its start, then the verdict (and whether the
    kNN verdict agrees where the run has one)."""
    labels, width = lf["labels"], max(12, *(len(v) for v in lf["labels"].values()))
    lines = [f"label-free (no labels read) on {lf['scored_on']}, two views each ({lf['views']}):"]
    for key in ("pretrained", "random_init"):
        m = lf[key]
        lines.append(f"  {labels[key]:<{width}} NN agreement {m['nn_agreement']:6.2f}%   RankMe {m['rankme']:7.2f}   "
                     f"eff. rank {m['effective_rank_99']:4d}   alignment {m['alignment']:.3f}   "
                     f"uniformity {m['uniformity']:.3f}")
    verdict, why = label_free_verdict(lf)
    start = "its random init" if labels["random_init"] == "random_init" else f"its {labels['random_init']}"
    line = f"  label-free verdict against {start}: {verdict} ({why})"
    if knn_verdict is not None:
        agree = LABEL_FREE_VERDICTS[verdict] == knn_verdict or (verdict != "learned" and knn_verdict != "gain")
        line += f"; the kNN verdict: {knn_verdict} ({'agrees' if agree else 'disagrees'})"
    return lines + [line]
