"""``selfsup report``: one run, or several overlaid, for a reader: what was trained, how well, what happened.

Reads a run folder's ``config.yaml``, ``run.json`` (steps, devices, wall time), ``metrics.csv`` (CSVLogger),
``events.jsonl`` (detector events), ``knn.json`` (final kNN, trained and at random init), ``eval/*.json``
(every evaluation run on it), ``embedding_norms.pt`` and ``pictures/`` (the embedding's pictures that the
``selfsup report`` command draws first: ``runs.pictures``). It builds one model, a list of ``Section``s (the run
header, the headline numbers, the events, the plots, the full metric table), and renders it twice: ``report.md``
and ``report.html``, one self-contained page with every image embedded as base64 (no external file, script,
style sheet or network reference). A plot is drawn only when its metrics are present; a folder without
metrics is a UserError.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from selfsup.config import flatten, read_run_config
from selfsup.diskspace import write_text, writing
from selfsup.errors import UserError
from selfsup.export import read_meta
from selfsup.instruments.detectors import read_events

MAX_EVENTS = 50  # rows of the events table (the rest: events.jsonl)
PICTURES = "pictures"  # RUN/pictures/: the embedding's pictures, drawn by runs.pictures before the report


@dataclass
class Run:
    """One run folder: its series (metric → [(step, value)]), events, final files and evaluations."""

    path: Path
    name: str
    series: dict[str, list[tuple[int, float]]]
    events: list[dict] = field(default_factory=list)
    knn: dict | None = None
    label_free: dict | None = None  # label_free.json: the label-free measures and verdict against the start
    final_norms: dict | None = None
    config: dict = field(default_factory=dict)
    facts: dict = field(default_factory=dict)  # run.json
    meta: dict = field(default_factory=dict)  # the exported backbone's metadata
    evals: dict[str, dict] = field(default_factory=dict)  # eval/<name>.json
    eval_images: list[Path] = field(default_factory=list)
    last_epoch: int | None = None
    pictures: dict | None = None  # pictures/pictures.json: the embedding's pictures (runs.pictures), their captions

    @property
    def method(self) -> str:
        return str(self.config.get("method", {}).get("name") or self.meta.get("method") or "?")


def read_metrics(path: Path) -> tuple[dict[str, list[tuple[int, float]]], int | None]:
    """metric → [(step, value)] from a CSVLogger file (empty cells skipped), and the last epoch index seen."""
    series: dict[str, list[tuple[int, float]]] = {}
    last_epoch = None
    try:
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                step = row.get("step", "")
                if not step.strip().lstrip("-").isdigit():
                    continue
                epoch = (row.get("epoch") or "").strip()
                if epoch.isdigit():
                    last_epoch = max(int(epoch), last_epoch if last_epoch is not None else -1)
                for key, raw in row.items():
                    if key in ("step", "epoch") or raw in ("", None):
                        continue
                    try:
                        value = float(raw)
                    except ValueError:
                        continue
                    series.setdefault(key, []).append((int(step), value))
    except (OSError, csv.Error, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not a readable metrics file ({type(e).__name__})") from None
    return series, last_epoch


def _read_json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _run_config(path: Path) -> dict:
    """The run's config as a plain mapping (``config.read_run_config``); {} when absent or unreadable, which only
    blanks the header's method and data."""
    try:
        return read_run_config(path)
    except UserError:
        return {}


def load_run(run_dir: str | Path) -> Run:
    """A run folder's metrics, events, config and evaluations, or a one-line UserError."""
    path = Path(run_dir)
    if not path.is_dir():
        raise UserError(f"{path} is not a folder; pass a run folder made by selfsup pretrain")
    metrics = path / "metrics.csv"
    series, last_epoch = read_metrics(metrics) if metrics.exists() else ({}, None)
    if not series:
        raise UserError(f"{path} has no metrics (metrics.csv missing or empty); train it with selfsup pretrain first")
    run = Run(path, path.name, series, read_events(path / "events.jsonl"), last_epoch=last_epoch)
    run.knn = _read_json(path / "knn.json")
    run.label_free = _read_json(path / "label_free.json")
    run.config = _run_config(path)
    run.facts = _read_json(path / "run.json") or {}
    if (path / "backbone.safetensors").exists():
        try:
            run.meta = read_meta(path / "backbone.safetensors")
        except UserError:
            run.meta = {}
    for file in sorted((path / "eval").glob("*.json")):
        data = _read_json(file)
        if data is not None:
            run.evals[file.stem] = data
    run.eval_images = sorted((path / "eval").glob("*.png"))
    run.pictures = _read_json(path / PICTURES / "pictures.json")
    if (path / "embedding_norms.pt").exists():
        try:
            norms = torch.load(path / "embedding_norms.pt", weights_only=True)
            run.final_norms = {k: v.float().numpy() for k, v in norms.items()}
        except Exception:  # a corrupt optional file only loses its histogram
            run.final_norms = None
    return run


# --------------------------------------------------------------------------- the model: sections of blocks
@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]
    note: str = ""


@dataclass
class Figure:
    path: Path
    caption: str
    titled: bool = True  # the image carries its caption as its title (the page shows no second one)


@dataclass
class Section:
    """A titled part of the report: tables, figures (drawn in a grid) and short paragraphs, in order."""

    key: str
    title: str
    blocks: list = field(default_factory=list)  # Table | list[Figure] | str


def _fmt(v) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    return "nan" if v != v else (f"{v:.4g}" if abs(v) < 1e4 else f"{v:.3e}")


def _pct(v) -> str:
    return "–" if not isinstance(v, (int, float)) else f"{v:.2f}%"


def _duration(seconds) -> str:
    if not isinstance(seconds, (int, float)):
        return "not recorded"
    s = int(round(seconds))
    return f"{s // 3600}h {s % 3600 // 60:02d}m" if s >= 3600 else (f"{s // 60}m {s % 60:02d}s" if s >= 60 else f"{s}s")


def last_step(run: Run) -> int:
    return max(s for pts in run.series.values() for s, _ in pts)


def backbone_label(run: Run) -> str:
    """The backbone as a reader names it: ``vit_micro/2``, ``resnet50``, ``SiT-micro/2``."""
    method, model = run.config.get("method", {}), run.config.get("model", {})
    if run.meta.get("backbone") == "flow_encoder" or ("size" in method and "hidden" in method):
        return f"SiT-{method.get('size', '?')}/{method.get('patch_size', '?')}"
    name = model.get("backbone") or run.meta.get("backbone") or "?"
    return f"{name}/{model['patch_size']}" if str(name).startswith("vit") and model.get("patch_size") else str(name)


def ending(run: Run) -> str:
    """How the run's last session ended (``run.json``'s status, written by the engine): finished, or why not."""
    facts = run.facts
    status, step = facts.get("status"), facts.get("global_step")
    at = f" after {step} steps" if step is not None else ""
    if status == "finished" or (status is None and facts):  # run.json of a version without status: written at the end
        return "finished"
    if status == "trained":
        return (f"trained{at}, its finishing (export, end-of-run report) cut short: selfsup pretrain --resume "
                f"{run.path} finishes it")
    if status == "interrupted":
        return (f"did not finish: interrupted by {facts.get('signal', 'a signal')}{at} (checkpoint written; "
                f"selfsup pretrain --resume {run.path} continues it)")
    if status == "nan":
        return f"did not finish: stopped by a non-finite loss or weights ({facts.get('reason', '?')})"
    if status == "collapsed":
        return f"did not finish: the representation collapsed ({facts.get('reason', '?')})"
    if status == "failed":
        return f"did not finish: failed ({facts.get('reason', '?')})"
    return ("did not finish: killed (no end record; or still training), last checkpoint "
            f"{'in checkpoints/last.ckpt' if (run.path / 'checkpoints' / 'last.ckpt').exists() else 'none'}")


def start_row(run: Run) -> str:
    """The header's ``start``: a random init, or the weights the run started from and their digest."""
    weights = run.facts.get("weights")
    if not isinstance(weights, dict) or not weights.get("source"):
        return "random init"
    digest = str(weights.get("sha256", ""))[:12]
    return f"weights: {weights['source']}" + (f" (sha256 {digest})" if digest else "")


def run_facts(run: Run) -> list[tuple[str, str]]:
    """The header rows of one run: what was trained on what, for how long, where."""
    cfg, facts = run.config, run.facts
    data, trainer, optim = cfg.get("data", {}), cfg.get("trainer", {}), cfg.get("optim", {})
    size = run.meta.get("image_size") or data.get("image_size")
    chans = run.meta.get("in_chans")
    dataset = str(data.get("name") or run.meta.get("dataset") or "?")
    if size:
        dataset += f" ({size}×{size}" + (f"×{chans})" if chans else ")")
    ended = facts.get("status") != "running"  # a killed session left its start record: count from metrics.csv
    steps = facts["global_step"] if ended and "global_step" in facts else last_step(run) + 1
    epochs = (facts["epochs"] if ended and "epochs" in facts
              else (run.last_epoch + 1) if run.last_epoch is not None else None)
    max_epochs = trainer.get("max_epochs")
    epoch_text = "–" if epochs is None else (f"{epochs} of {max_epochs}" if max_epochs else str(epochs))
    if facts.get("world_size"):
        devices = f"{facts['world_size']} × {facts.get('device', facts.get('accelerator', '?'))}"
        if facts.get("num_nodes", 1) > 1:
            devices += f" on {facts['num_nodes']} nodes"
    else:
        devices = f"{trainer.get('devices', '?')} ({trainer.get('accelerator', '?')}; not recorded)"
    wall = _duration(facts.get("fit_seconds")) + (" (fit)" if "fit_seconds" in facts else "")
    if facts.get("sessions", 1) > 1:
        wall += f" over {facts['sessions']} sessions (resumed)"
    return [("method", run.method), ("dataset", dataset), ("backbone", backbone_label(run)), ("start", start_row(run)),
            ("steps", _fmt(steps)), ("epochs", epoch_text), ("ended", ending(run)),
            ("batch", _fmt(data.get("batch_size")) + (f", {optim['name']}" if optim.get("name") else "")),
            ("wall time", wall), ("devices", devices), ("seed", _fmt(trainer.get("seed"))), ("folder", str(run.path))]


def header_section(runs: list[Run]) -> Section:
    rows = [[label] + [dict(run_facts(r))[label] for r in runs] for label, _ in run_facts(runs[0])]
    return Section("run", "The run" if len(runs) == 1 else "The runs", [Table(["", *[r.name for r in runs]], rows)])


def start_of(run: Run) -> str:
    """What the run's kNN floor is: ``random init``, or ``start (weights: SOURCE)`` for a run started from
    ``model.weights`` (run.json's ``weights``)."""
    weights = run.facts.get("weights")
    source = weights.get("source") if isinstance(weights, dict) else None
    return f"start (weights: {source})" if source else "random init"


def headline_rows(run: Run) -> list[tuple[str, str, str]]:
    """(measure, value, how) rows: the final kNN against the random-init floor, then every evaluation on disk."""
    rows = []
    knn = run.knn or {}
    trained, floor = (knn.get(k) if isinstance(knn.get(k), dict) else {} for k in ("pretrained", "random_init"))
    held = knn.get("held_out") if isinstance(knn.get("held_out"), dict) else None
    scored = (f"{knn.get('test_size', '?')} images held out of train/ ({held.get('fraction', 0):.0%}, seed "
              f"{held.get('seed', '?')})" if held else f"{knn.get('test_size', '?')} test images")
    how = f"k={knn.get('k', '?')}, T={knn.get('temperature', '?')}, {scored}"
    start = start_of(run)
    if trained:
        rows.append(("kNN top-1, trained", _pct(trained.get("top1")), how))
    if floor:
        rows.append((f"kNN top-1, {start} (floor)", _pct(floor.get("top1")), "the same backbone before training"))
    if (trained and floor and isinstance(trained.get("top1"), (int, float))
            and isinstance(floor.get("top1"), (int, float))):
        rows.append(("gain over the floor", f"{trained['top1'] - floor['top1']:+.2f} points", ""))
    rows += label_free_rows(run.label_free or {}, start)
    order = ("knn", "linear", "finetune", "rankme", "norms", "generation")
    named = sorted(run.evals.items(), key=lambda kv: (order.index(_kind(kv[0])) if _kind(kv[0]) in order
                                                      else len(order), kv[0]))
    for name, ev in named:
        rows.extend(_eval_rows(name, ev))
    return rows


def label_free_rows(lf: dict, start: str) -> list[tuple[str, str, str]]:
    """The label-free measures of the trained backbone and of its start (``label_free.json``), then the verdict."""
    trained, floor = lf.get("pretrained"), lf.get("random_init")
    if not (isinstance(trained, dict) and isinstance(floor, dict)):
        return []
    how = f"{lf.get('scored_on', '?')}, two views each"
    rows = [(f"NN agreement of two views, trained / {start}",
             f"{_pct(trained.get('nn_agreement'))} / {_pct(floor.get('nn_agreement'))}", how)]
    for key, name in (("rankme", "RankMe"), ("effective_rank_99", "effective rank (99%)"),
                      ("alignment", "alignment"), ("uniformity", "uniformity")):
        rows.append((f"{name}, trained / {start}", f"{_fmt(trained.get(key))} / {_fmt(floor.get(key))}", ""))
    rows.append(("label-free verdict", str(lf.get("verdict", "?")), str(lf.get("why", ""))))
    return rows


def _epochs(n) -> str:
    return f"{n} epoch" + ("" if n == 1 else "s")


def _kind(name: str) -> str:
    """The protocol of ``eval/<protocol>[-<embedding>][.<weights>].json``."""
    return name.split(".")[0].split("-")[0]


def evaluated(ev: dict) -> str:
    """What an evaluation evaluated: its ``weights`` (trained, random init, checkpoint at step N, a file name),
    from the source path for results written before they carried it, and the embedding where not the backbone."""
    what = ev.get("weights")
    if not isinstance(what, str):
        source = Path(str(ev.get("source", "")))
        what = {"backbone.safetensors": "trained", "backbone_init.safetensors": "random init"}.get(
            source.name, "checkpoint" if source.suffix == ".ckpt" else source.name or "?")
    embedding = ev.get("embedding")
    return what + (f", {embedding}" if isinstance(embedding, str) and embedding != "backbone" else "")


def _eval_rows(name: str, ev: dict) -> list[tuple[str, str, str]]:
    """The headline of one ``eval/<name>.json``, each measure labelled with what it evaluated (``all`` repeats the
    others and is skipped)."""
    what = evaluated(ev)
    return [(f"{measure} [{what}]", value, how) for measure, value, how in _eval_values(_kind(name), ev)]


def _eval_values(kind: str, ev: dict) -> list[tuple[str, str, str]]:
    where = ev.get("dataset", "")
    if kind == "knn" and isinstance(ev.get("results"), dict):
        results = {k: r["top1"] for k, r in ev["results"].items() if isinstance(r, dict) and "top1" in r}
        if not results:
            return []
        main = "k=20" if "k=20" in results else next(iter(results))
        others = ", ".join(f"{k}: {v:.2f}" for k, v in results.items() if k != main)
        return [(f"eval kNN top-1 ({main})", _pct(results[main]),
                 f"{ev.get('voting', '')}, {where}" + (f"; {others}" if others else ""))]
    if kind == "linear" and isinstance(ev.get("test"), dict):
        return [("linear probe top-1", _pct(ev["test"].get("top1")),
                 f"{ev.get('mode', '')}, {_epochs(ev.get('epochs', '?'))}, lr {_fmt(ev.get('lr'))}, {where}")]
    if kind == "finetune" and isinstance(ev.get("test"), dict):
        return [("fine-tuning top-1", _pct(ev["test"].get("top1")),
                 f"{_epochs(ev.get('epochs', '?'))}, recipe {ev.get('recipe', '?')}, {where}")]
    if kind == "rankme":
        return [("RankMe", _fmt(ev.get("rankme")), f"of {ev.get('dim', '?')} dims, {ev.get('samples', '?')} samples"),
                ("effective rank (99%)", _fmt(ev.get("effective_rank_99")), "")]
    if kind == "norms" and "auroc" in ev:
        return [(f"norm OOD AUROC ({ev.get('ood', '?')})", _fmt(ev.get("auroc")),
                 f"{ev.get('in_size', '?')} in vs {ev.get('ood_size', '?')} OOD; 0.5 = chance")]
    if kind == "generation":
        return [("encoder Fréchet distance", _fmt(ev.get("encoder_frechet_distance")),
                 f"real test images: {_fmt(ev.get('reference_real_test_frechet_distance'))}"),
                ("class fidelity", _pct(ev.get("class_fidelity")), f"{ev.get('n', '?')} samples")]
    return []


def headline_section(runs: list[Run]) -> Section:
    if len(runs) == 1:
        rows = [list(r) for r in headline_rows(runs[0])]
        blocks = [Table(["measure", "value", "how"], rows)] if rows else ["No kNN result or evaluation in this folder."]
        return Section("headline", "Headline numbers", blocks)
    per_run = [{m: v for m, v, _ in headline_rows(r)} for r in runs]
    measures = list(dict.fromkeys(m for rows in per_run for m in rows))
    rows = [[m] + [rows.get(m, "–") for rows in per_run] for m in measures]
    return Section("headline", "Headline numbers",
                   [Table(["measure", *[r.name for r in runs]], rows)] if rows else ["No kNN result or evaluation."])


def collapse_section(runs: list[Run]) -> list[Section]:
    """The collapse alarm's events (instruments/collapse.py), the report's first section when there are any: the
    sign, its value, the step and the method's usual remedies."""
    rows = []
    for run in runs:
        for e in run.events:
            if e.get("kind") == "collapse":
                rows.append(([run.name] if len(runs) > 1 else []) + [
                    str(e.get("step", "?")), str(e.get("sign", "?")), _fmt(e.get("value")), _fmt(e.get("baseline")),
                    str(e.get("remedy", ""))])
    if not rows:
        return []
    header = (["run"] if len(runs) > 1 else []) + ["step", "sign", "value", "threshold", "try"]
    lead = (f"This run's representation collapsed or stopped learning: {len(rows)} sign" + ("s" if len(rows) > 1
            else "") + " stayed past the alarm's threshold for instruments.collapse_window measurements in a row "
            "(knn_over_init: the backbone's kNN under its start's by more than the noise at the end, or under its "
            "init's in 3 kNN-monitor measurements).")
    return [Section("collapse", "Collapse", [lead, Table(header, rows)])]


def not_learning_section(runs: list[Run]) -> list[Section]:
    """The ``not_learning`` events of the end of a run (runs/learning.py), first with the collapse: each cause."""
    rows = [([run.name] if len(runs) > 1 else []) + [str(e.get("step", "?")), str(e.get("cause", "?")),
                                                     str(e.get("meaning", ""))]
            for run in runs for e in run.events if e.get("kind") == "not_learning"]
    if not rows:
        return []
    header = (["run"] if len(runs) > 1 else []) + ["step", "cause", "what was found"]
    return [Section("not-learning", "Not learning", ["This run shows no sign of having learned:",
                                                     Table(header, rows)])]


def events_section(runs: list[Run]) -> Section:
    events = sorted(((r, e) for r in runs for e in r.events), key=lambda re_: (re_[1].get("step", 0), re_[0].name))
    if not events:
        return Section("events", "Events", ["No events: no gradient spike, no kNN dip and no collapse was detected."])
    counts: dict[str, int] = {}
    for _, e in events:
        counts[str(e.get("kind", "?"))] = counts.get(str(e.get("kind", "?")), 0) + 1
    summary = ", ".join(f"{k} × {n}" for k, n in sorted(counts.items()))
    header = (["run"] if len(runs) > 1 else []) + ["step", "kind", "group", "value", "baseline", "× baseline"]
    rows = []
    for run, e in events[:MAX_EVENTS]:
        value, base = e.get("value"), e.get("baseline")
        ratio = (f"{value / base:.3g}" if isinstance(value, (int, float)) and isinstance(base, (int, float)) and base
                 else "–")
        rows.append(([run.name] if len(runs) > 1 else []) + [str(e.get("step", "?")), str(e.get("kind", "?")),
                                                             str(e.get("group", "")), _fmt(value), _fmt(base), ratio])
    note = f"first {MAX_EVENTS} of {len(events)}; all are in events.jsonl" if len(events) > MAX_EVENTS else ""
    count = f"{len(events)} event" + ("" if len(events) == 1 else "s")
    return Section("events", "Events", [f"{count}: {summary}.", Table(header, rows, note)])


def _summary(points: list[tuple[int, float]]) -> tuple[float, float, float, float]:
    """(first, last, min, max) of a series; min and max over its finite values."""
    values = [v for _, v in points]
    finite = [v for v in values if math.isfinite(v)] or [float("nan")]
    return values[0], values[-1], min(finite), max(finite)


def summary_rows(run: Run) -> list[list[str]]:
    """One row per metric: first, last, min, max and the step of the last value."""
    return [[key, *map(_fmt, _summary(run.series[key])), str(run.series[key][-1][0])] for key in sorted(run.series)]


HEADER = ["metric", "first", "last", "min", "max", "last step"]
OVERLAY_NOTE = "each cell: the last value (min … max over the run); – where the run has no such metric"


def metrics_section(runs: list[Run]) -> Section:
    """One run: first, last, min, max, last step of each metric. Several: one table side by side, a column per
    run holding the last value and the range."""
    if len(runs) == 1:
        return Section("metrics", "Every metric", [Table(HEADER, summary_rows(runs[0]))])
    rows = []
    for key in sorted({k for r in runs for k in r.series}):
        cells = []
        for run in runs:
            if run.series.get(key):
                _, last, lo, hi = _summary(run.series[key])
                cells.append(f"{_fmt(last)} ({_fmt(lo)} … {_fmt(hi)})")
            else:
                cells.append("–")
        rows.append([key, *cells])
    return Section("metrics", "Every metric", [Table(["metric", *[r.name for r in runs]], rows, OVERLAY_NOTE)])


NOT_SETTINGS = ("name", "output_dir", "description")  # differ between any two runs, or say nothing of training


def settings_section(runs: list[Run]) -> Section:
    """The config settings that differ between overlaid runs (``dotted.key``: each run's value; – not set)."""
    flat = [flatten(r.config) for r in runs]
    keys = [k for k in dict.fromkeys(k for f in flat for k in f) if k not in NOT_SETTINGS]
    missing = object()
    rows = [[key, *("–" if f.get(key, missing) is missing else _fmt(f[key]) for f in flat)] for key in keys
            if len({json.dumps(f.get(key, "<unset>"), sort_keys=True, default=str) for f in flat}) > 1]
    if not rows:
        return Section("settings", "Settings that differ",
                       ["The runs' configs are the same (name and output_dir aside)."])
    return Section("settings", "Settings that differ", [Table(["setting", *[r.name for r in runs]], rows)])


# --------------------------------------------------------------------------- plots
@dataclass
class Plot:
    """A figure: the metrics matching ``pattern`` (regex on the metric name) on the left axis, those matching
    ``right`` on a second axis; ``log`` (``rlog``: the right axis) "auto" (log when the positive values span more
    than two decades), True or False; ``events``: the event kind to mark; ``floor``: each run's random-init kNN
    as a dashed line."""

    name: str
    title: str
    pattern: str
    ylabel: str
    log: bool | str = "auto"
    events: str | None = None
    right: str | None = None
    rlabel: str = ""
    rlog: bool | str = False  # the right axis (an EMA momentum in [0, 1]: linear)
    floor: bool = False


PLOTS = [
    Plot("loss", "Training loss", r"^train/(loss|flow_loss|rep_loss)$", "loss"),
    Plot("schedules", "Learning rate (left) and EMA momentum (right)", r"^train/lr$", "learning rate",
         log=False, right=r"^train/(momentum|ema_decay)$", rlabel="EMA momentum"),
    Plot("knn", "kNN top-1 during training (dips marked; dashed: random init)", r"^monitor/knn_top1$", "top-1 (%)",
         log=False, events="knn_dip", floor=True),
    Plot("probe", "Online linear probe", r"^monitor/probe_acc$", "accuracy (%)", log=False),
    Plot("grad_norms", "Gradient L2 norm by layer group (spikes marked)", r"^instruments/grad_l2(_.*)?$", "‖g‖₂",
         log=True, events="grad_spike"),
    Plot("embedding_norms", "Mean embedding norm", r"^instruments/norm_.*_mean$", "‖·‖"),
    Plot("rank", "RankMe and effective rank (fixed batch)", r"^instruments/(rankme|eff_rank)_.*$", "rank"),
    Plot("dim_std", "Per-dimension std of L2-normalised embeddings", r"^instruments/dim_std_.*$", "std"),
    Plot("alignment", "Misalignment 1 − cos", r"^instruments/align_.*$", "1 − cos"),
    Plot("predictor_alignment", "Predictor alignment (DirectPred)", r"^instruments/pred_.*$", "value"),
    Plot("dino_collapse", "DINO collapse signs: teacher entropy, KL(teacher ‖ student), centre norm",
         r"^instruments/dino_.*$", "value"),
    Plot("flow_levels", "Flow loss by noise level t", r"^train/flow_loss_t.*$", "loss"),
]

STYLES = ["-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)), (0, (8, 2))]
MARKERS = [None, "o", "s", "^", "x"]


def _short(key: str) -> str:
    return key.split("/", 1)[-1]


def _spans_decades(values: list[float]) -> bool:
    positive = [v for v in values if math.isfinite(v)]
    return bool(positive) and min(positive) > 0 and max(positive) / min(positive) > 100


def _pyplot():
    import matplotlib  # lazy: the Agg backend is chosen before pyplot, on the one path that draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _draw(ax, runs: list[Run], keys: list[str], colours, offset: int = 0) -> list:
    """Each run × key as a line: one run → a colour per key; several → a colour per run, a style per key."""
    lines = []
    for i, run in enumerate(runs):
        for j, key in enumerate(keys):
            points = run.series.get(key)
            if not points:
                continue
            steps, values = zip(*points)
            marker = "o" if len(points) <= 2 else ("." if len(points) < 30 else None)  # a lone value stays visible
            if len(runs) > 1:  # more keys than line styles: the next round of styles carries markers
                colour, style = colours[i % len(colours)], STYLES[(j + offset) % len(STYLES)]
                marker = MARKERS[(j + offset) // len(STYLES) % len(MARKERS)] or marker
                label = f"{run.name}: {_short(key)}"
            else:
                colour, style, label = colours[(j + offset) % len(colours)], "-" if not offset else "--", _short(key)
            lines += ax.plot(steps, values, linestyle=style, color=colour, label=label, lw=1.3, marker=marker,
                             markevery=max(1, len(points) // 12), markersize=4)
    return lines


def _scale(ax, plot_log, runs: list[Run], keys: list[str]) -> None:
    """Log scale when asked (or, for "auto", when the positive values span more than two decades); zeros (a
    frozen layer's gradient at step 0) are left out of a log axis rather than forcing a linear one."""
    values = [v for r in runs for k in keys for _, v in r.series.get(k, []) if math.isfinite(v)]
    positive = [v for v in values if v > 0]
    log = _spans_decades(positive) if plot_log == "auto" else plot_log
    if log and len(positive) >= max(1, len(values) // 2):
        ax.set_yscale("log", nonpositive="mask")


def _figure(plot: Plot, runs: list[Run], out: Path) -> Figure | None:
    keys = sorted({k for r in runs for k in r.series if re.match(plot.pattern, k)})
    right = sorted({k for r in runs for k in r.series if plot.right and re.match(plot.right, k)})
    if not keys and not right:
        return None
    plt = _pyplot()
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    lines = _draw(ax, runs, keys, colours)
    _scale(ax, plot.log, runs, keys)
    ax.set(xlabel="step", ylabel=plot.ylabel if keys else "")
    if right:
        ax2 = ax.twinx() if keys else ax
        lines += _draw(ax2, runs, right, colours, offset=len(keys))
        ax2.set_ylabel(plot.rlabel)
        _scale(ax2, plot.rlog, runs, right)
    if plot.floor:
        for i, run in enumerate(runs):
            floor = (run.knn or {}).get("random_init")
            if isinstance(floor, dict) and isinstance(floor.get("top1"), (int, float)):
                who = f"{run.name}: " if len(runs) > 1 else ""
                lines.append(ax.axhline(floor["top1"], ls="--", lw=1, color=colours[i % len(colours)] if len(runs) > 1
                                        else "grey", label=f"{who}{start_of(run)}"))
    if plot.events:
        for i, run in enumerate(runs):
            marks = [e for e in run.events if e.get("kind") == plot.events]
            if marks:
                if plot.floor:  # a dip spans from its first step: shade a step's width around it
                    for e in marks:
                        ax.axvline(e["step"], color="red", alpha=0.25, lw=3)
                lines.append(ax.scatter([e["step"] for e in marks], [e["value"] for e in marks], marker="v", s=36,
                                        zorder=5, color=colours[i % len(colours)] if len(runs) > 1 else "red",
                                        label=f"{run.name + ': ' if len(runs) > 1 else ''}{plot.events} "
                                              f"({len(marks)})"))
    end = max(1, max(last_step(r) for r in runs))
    ax.set_xlim(-0.02 * end, 1.02 * end)  # every plot on the same step axis
    ax.set_title(plot.title, fontsize=10)
    ax.grid(alpha=0.3)
    _legend(ax, lines, outside=len(runs) > 1 or len(lines) > LEGEND_INSIDE, right_axis=bool(keys and right))
    fig.tight_layout()
    path = out / f"{plot.name}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return Figure(path, plot.title)


LEGEND_INSIDE = 4  # a legend of more entries (or of several runs) goes beside the axes, where it covers no curve


def _legend(ax, lines: list, outside: bool, right_axis: bool = False) -> None:
    """The plot's legend: beside the axes (right of them, past a second axis' labels) for overlays and long
    legends, else at matplotlib's ``best`` place inside (where the lines cross it least)."""
    labels = [line.get_label() for line in lines]
    if outside:
        ax.legend(lines, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.18 if right_axis else 1.02, 1.0),
                  borderaxespad=0.0, ncol=2 if len(lines) > 14 else 1)
    else:
        ax.legend(lines, labels, fontsize=7, loc="best")


def _histogram(runs: list[Run], out: Path) -> Figure | None:
    have = [(r, k, v) for r in runs if r.final_norms for k, v in r.final_norms.items() if len(v)]
    if not have:
        return None
    plt = _pyplot()
    keys = sorted({k for _, k, _ in have})
    fig, axes = plt.subplots(1, len(keys), figsize=(max(6.4, 2.4 * len(keys)), 3.6), squeeze=False)
    for ax, key in zip(axes[0], keys):
        chosen = [(run, v) for run, k, v in have if k == key]
        lo, hi = min(float(v.min()) for _, v in chosen), max(float(v.max()) for _, v in chosen)
        pad = max(hi - lo, 1e-3 * abs(hi), 1e-6) * 0.05  # a shared range, finite even when all norms are equal
        for run, values in chosen:
            ax.hist(values, bins=30, range=(lo - pad, hi + pad), alpha=0.55, label=run.name)
        ax.set_title(f"final ‖{key}‖", fontsize=10)
        ax.set(xlabel="norm", ylabel="samples")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.22), borderaxespad=0.0)  # below: no bar hidden
    fig.tight_layout()
    path = out / "norm_histogram.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return Figure(path, "Final embedding norms")


def plots_section(runs: list[Run], out: Path) -> Section:
    figures = [f for f in (_figure(plot, runs, out) for plot in PLOTS) if f is not None]
    hist = _histogram(runs, out)
    if hist is not None:
        after = next((i + 1 for i, f in enumerate(figures) if f.path.stem == "embedding_norms"), len(figures))
        figures.insert(after, hist)
    for run in runs:
        figures += [Figure(p, f"{run.name + ': ' if len(runs) > 1 else ''}eval/{p.name}", titled=False)
                    for p in run.eval_images]
    return Section("plots", "Training dynamics", [figures] if figures else ["No metric to plot."])


def pictures_section(runs: list[Run]) -> list[Section]:
    """The embedding's pictures that ``selfsup report`` drew in each run's ``pictures/`` (its test images' map,
    their nearest neighbours, a ViT's patch picture), captioned as ``pictures.json`` says; none: no section."""
    figures = []
    for run in runs:
        for name, caption in ((run.pictures or {}).get("captions") or {}).items():
            if (run.path / PICTURES / name).exists():
                figures.append(Figure(run.path / PICTURES / name,
                                      f"{run.name + ': ' if len(runs) > 1 else ''}{caption}", titled=False))
    return [Section("embedding", "Embedding", [figures])] if figures else []


def build_report(runs: list[Run], out: Path) -> list[Section]:
    """The report's model: (a collapse: its alarm's events,) (not learning: its causes,) (overlays: the settings
    that differ,) header, headline numbers, events, plots, (the embedding's pictures,) every metric."""
    return collapse_section(runs) + not_learning_section(runs) + ([settings_section(runs)] if len(runs) > 1 else []) + [
        header_section(runs), headline_section(runs), events_section(runs), plots_section(runs, out),
        *pictures_section(runs), metrics_section(runs)]


def title(runs: list[Run]) -> str:
    return "selfsup report: " + ", ".join(r.name for r in runs)


# --------------------------------------------------------------------------- the two renderings
def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def to_markdown(runs: list[Run], sections: list[Section], out_dir: Path) -> str:
    """The model as markdown; images are linked relative to ``out_dir`` (where report.md is written)."""
    lines = [f"# {title(runs)}", ""]
    for section in sections:
        lines += [f"## {section.title}", ""]
        for block in section.blocks:
            if isinstance(block, str):
                lines += [block, ""]
            elif isinstance(block, Table):
                lines.append("| " + " | ".join(_md_cell(h) for h in block.header) + " |")
                lines.append("|" + "---|" * len(block.header))
                lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in block.rows]
                lines += (["", f"*{block.note}*"] if block.note else []) + [""]
            else:  # figures: two per row of a table, which markdown viewers draw as a grid
                lines += ["| | |", "|---|---|"]
                for i in range(0, len(block), 2):
                    pair = block[i:i + 2]
                    cells = [f"![{_md_cell(f.caption)}]({Path(os.path.relpath(f.path, out_dir)).as_posix()})"
                             for f in pair]
                    lines.append("| " + " | ".join(cells + [""] * (2 - len(cells))) + " |")
                lines.append("")
    return "\n".join(lines) + "\n"


CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:#222;max-width:1180px;margin:auto;padding:1.2em}
h1{font-size:1.5em;margin:.2em 0 .6em}\
h2{font-size:1.15em;border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:1.6em}
table{border-collapse:collapse;margin:.4em 0 .8em}
td,th{border:1px solid #ddd;padding:3px 9px;text-align:left;vertical-align:top}
th{background:#f4f4f6}tr:nth-child(even) td{background:#fafafb}\
td.num{text-align:right;font-variant-numeric:tabular-nums}
section#run td:first-child,section#headline td:first-child{font-weight:600}
section#metrics table{font-size:12px}p.note{color:#666;font-size:12px;margin-top:-.4em}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:14px}
figure{margin:0;border:1px solid #e4e4e8;border-radius:6px;padding:6px;background:#fff}
figure img{width:100%;height:auto;display:block}figcaption{font-size:12px;color:#555;margin-top:4px}
"""

_NUMERIC = re.compile(r"^[−+-]?[\d,.]+(e[+-]?\d+)?( ?%| points)?$|^nan$|^–$")


def to_html(runs: list[Run], sections: list[Section]) -> str:
    esc = html.escape
    parts = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
             f"<title>{esc(title(runs))}</title><style>{CSS}</style></head><body>", f"<h1>{esc(title(runs))}</h1>"]
    for section in sections:
        parts.append(f"<section id='{section.key}'><h2>{esc(section.title)}</h2>")
        for block in section.blocks:
            if isinstance(block, str):
                parts.append(f"<p>{esc(block)}</p>")
            elif isinstance(block, Table):
                head = "".join(f"<th>{esc(h)}</th>" for h in block.header)
                body = "".join("<tr>" + "".join(
                    f"<td class='num'>{esc(c)}</td>" if j and _NUMERIC.match(str(c)) else f"<td>{esc(c)}</td>"
                    for j, c in enumerate(row)) + "</tr>" for row in block.rows)
                parts.append(f"<table><tr>{head}</tr>{body}</table>")
                if block.note:
                    parts.append(f"<p class='note'>{esc(block.note)}</p>")
            else:
                parts.append("<div class='grid'>")
                for fig in block:
                    data = base64.b64encode(fig.path.read_bytes()).decode("ascii")
                    caption = "" if fig.titled else f"<figcaption>{esc(fig.caption)}</figcaption>"
                    parts.append(f"<figure><img alt='{esc(fig.caption)}' src='data:image/png;base64,{data}'>"
                                 f"{caption}</figure>")
                parts.append("</div>")
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(run_dirs: list[str | Path], out: str | Path | None = None) -> Path:
    """Plots, ``report.md`` and a self-contained ``report.html`` for one run (default ``RUN/report``) or several
    overlaid (``out`` required)."""
    if not run_dirs:
        raise UserError("selfsup report needs a run folder (or several with --out DIR)")
    if len(run_dirs) > 1 and out is None:
        raise UserError("comparing several runs needs --out DIR for the overlaid report")
    runs = [load_run(d) for d in run_dirs]
    names = [r.name for r in runs]
    for run in runs:  # two folders with the same name: tell them apart by their parent
        if names.count(run.name) > 1:
            run.name = f"{run.path.parent.name}/{run.name}"
    out_dir = Path(out) if out is not None else runs[0].path / "report"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the report folder {out_dir} ({e.strerror}); choose another --out") from None
    with writing(out_dir, "the report's figures in", kept="the run folders are unchanged"):
        sections = build_report(runs, out_dir)
    write_text(out_dir / "report.md", to_markdown(runs, sections, out_dir), "the report")
    write_text(out_dir / "report.html", to_html(runs, sections), "the report")
    return out_dir
