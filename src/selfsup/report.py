"""``selfsup report``: the training dynamics of one run, or of several overlaid, at a glance.

Reads a run folder's ``metrics.csv`` (CSVLogger), ``events.jsonl`` (detector events), ``knn.json`` and
``embedding_norms.pt``, and writes PNG plots (matplotlib), ``report.md`` and ``report.html``, one page
with every image embedded as base64 (no external file, script, style sheet or network reference).
A plot is drawn only when its metrics are present; a folder without metrics is a UserError.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from selfsup.errors import UserError
from selfsup.instruments.detectors import read_events


@dataclass
class Run:
    """One run folder's series (metric → [(step, value)]), events and final files."""

    path: Path
    name: str
    series: dict[str, list[tuple[int, float]]]
    events: list[dict] = field(default_factory=list)
    knn: dict | None = None
    final_norms: dict | None = None
    method: str = "?"


def read_metrics(path: Path) -> dict[str, list[tuple[int, float]]]:
    """metric → [(step, value)] from a CSVLogger file (empty cells skipped)."""
    series: dict[str, list[tuple[int, float]]] = {}
    try:
        with path.open(newline="") as f:
            for row in csv.DictReader(f):
                step = row.get("step", "")
                if not step.strip().lstrip("-").isdigit():
                    continue
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
    return series


def load_run(run_dir: str | Path) -> Run:
    """A run folder's metrics and events, or a one-line UserError."""
    path = Path(run_dir)
    if not path.is_dir():
        raise UserError(f"{path} is not a folder; pass a run folder made by selfsup pretrain")
    metrics = path / "metrics.csv"
    series = read_metrics(metrics) if metrics.exists() else {}
    if not series:
        raise UserError(f"{path} has no metrics (metrics.csv missing or empty); train it with selfsup pretrain first")
    run = Run(path, path.name, series, read_events(path / "events.jsonl"))
    if (path / "knn.json").exists():
        try:
            run.knn = json.loads((path / "knn.json").read_text())
        except json.JSONDecodeError:
            pass
    if (path / "embedding_norms.pt").exists():
        import torch

        try:
            run.final_norms = {k: v.float().numpy() for k, v in torch.load(path / "embedding_norms.pt").items()}
        except Exception:  # a corrupt optional file only loses its histogram
            run.final_norms = None
    config = path / "config.yaml"
    if config.exists():
        m = re.search(r"^method:\s*\n\s+name:\s*(\S+)", config.read_text(), re.M)
        run.method = m.group(1) if m else "?"
    return run


# --------------------------------------------------------------------------- plots
@dataclass
class Plot:
    """A figure: the metrics matching ``pattern`` (regex on the metric name), optional events to mark."""

    name: str
    title: str
    pattern: str
    ylabel: str
    log: bool = False
    events: str | None = None


PLOTS = [
    Plot("loss", "Training loss", r"^train/loss$", "loss"),
    Plot("schedules", "Learning rate and EMA momentum", r"^train/(lr|momentum)$", "value"),
    Plot("knn", "kNN top-1 during training (dips marked)", r"^monitor/knn_top1$", "top-1 (%)", events="knn_dip"),
    Plot("probe", "Online linear probe", r"^monitor/probe_acc$", "accuracy (%)"),
    Plot("grad_norms", "Gradient L2 norm by layer group (spikes marked)", r"^instruments/grad_l2(_.*)?$", "‖g‖₂",
         log=True, events="grad_spike"),
    Plot("embedding_norms", "Mean embedding norm", r"^instruments/norm_.*_mean$", "‖·‖", log=True),
    Plot("rank", "RankMe and effective rank (fixed batch)", r"^instruments/(rankme|eff_rank)_.*$", "rank"),
    Plot("dim_std", "Per-dimension std of L2-normalised embeddings", r"^instruments/dim_std_.*$", "std"),
    Plot("alignment", "Misalignment 1 − cos", r"^instruments/align_.*$", "1 − cos"),
    Plot("predictor_alignment", "Predictor alignment (DirectPred)", r"^instruments/pred_.*$", "value"),
    Plot("dino_collapse", "DINO collapse signs: teacher entropy, KL(teacher ‖ student), centre norm",
         r"^instruments/dino_.*$", "value"),
]


def _short(key: str) -> str:
    return key.split("/", 1)[-1]


def _figure(plot: Plot, runs: list[Run], out: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({k for r in runs for k in r.series if re.match(plot.pattern, k)})
    if not keys:
        return None
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    styles = ["-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 3)), (0, (8, 2))]
    fig, ax = plt.subplots(figsize=(7, 4))
    for i, run in enumerate(runs):
        for j, key in enumerate(keys):
            points = run.series.get(key)
            if not points:
                continue
            steps, values = zip(*points)
            if len(runs) > 1:
                colour, style, label = colours[i % len(colours)], styles[j % len(styles)], f"{run.name}: {_short(key)}"
            else:
                colour, style, label = colours[j % len(colours)], "-", _short(key)
            ax.plot(steps, values, linestyle=style, color=colour, label=label, lw=1.4,
                    marker="." if len(points) < 30 else None)
        if plot.events:
            marks = [e for e in run.events if e.get("kind") == plot.events]
            if marks:
                ax.scatter([e["step"] for e in marks], [e["value"] for e in marks], marker="v", s=40, zorder=5,
                           color=colours[i % len(colours)] if len(runs) > 1 else "red",
                           label=f"{run.name + ': ' if len(runs) > 1 else ''}{plot.events} ({len(marks)})")
    if plot.log and all(v > 0 for r in runs for k in keys for _, v in r.series.get(k, [])):
        ax.set_yscale("log")
    ax.set(title=plot.title, xlabel="step", ylabel=plot.ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    path = out / f"{plot.name}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _histogram(runs: list[Run], out: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    have = [(r, k, v) for r in runs if r.final_norms for k, v in r.final_norms.items() if len(v)]
    if not have:
        return None
    keys = sorted({k for _, k, _ in have})
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.4), squeeze=False)
    for ax, key in zip(axes[0], keys):
        chosen = [(run, v) for run, k, v in have if k == key]
        lo, hi = min(float(v.min()) for _, v in chosen), max(float(v.max()) for _, v in chosen)
        pad = max(hi - lo, 1e-3 * abs(hi), 1e-6) * 0.05  # a shared range, finite even when all norms are equal
        for run, values in chosen:
            ax.hist(values, bins=30, range=(lo - pad, hi + pad), alpha=0.55, label=run.name)
        ax.set(title=f"final ‖{key}‖", xlabel="norm", ylabel="samples")
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "norm_histogram.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- summary
def _fmt(v: float) -> str:
    return "nan" if v != v else (f"{v:.4g}" if abs(v) < 1e4 else f"{v:.3e}")


def summary_rows(run: Run) -> list[list[str]]:
    """One row per metric: first, last, min, max and the step of the last value."""
    rows = []
    for key in sorted(run.series):
        values = [v for _, v in run.series[key]]
        finite = [v for v in values if math.isfinite(v)] or [float("nan")]
        rows.append([key, _fmt(values[0]), _fmt(values[-1]), _fmt(min(finite)), _fmt(max(finite)),
                     str(run.series[key][-1][0])])
    return rows


HEADER = ["metric", "first", "last", "min", "max", "last step"]


def _markdown(runs: list[Run], images: list[Path]) -> str:
    lines = ["# selfsup training report", ""]
    for run in runs:
        steps = max(s for pts in run.series.values() for s, _ in pts)
        lines += [f"## {run.name}", "", f"- folder: `{run.path}`", f"- method: {run.method}, last step {steps}"]
        if run.knn:
            for key in ("pretrained", "random_init"):
                if isinstance(run.knn.get(key), dict):
                    lines.append(f"- final kNN ({key}): top-1 {run.knn[key].get('top1', float('nan')):.2f}%")
        kinds: dict[str, int] = {}
        for e in run.events:
            kinds[e.get("kind", "?")] = kinds.get(e.get("kind", "?"), 0) + 1
        lines.append("- events: " + (", ".join(f"{k} × {n}" for k, n in sorted(kinds.items())) or "none"))
        for e in run.events[:10]:
            group = f" [{e['group']}]" if "group" in e else ""
            lines.append(f"  - step {e['step']}: {e['kind']}{group} {_fmt(e['value'])} (baseline {_fmt(e['baseline'])})")
        lines += ["", "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
        lines += ["| " + " | ".join(r) + " |" for r in summary_rows(run)]
        lines.append("")
    lines += ["## Plots", ""] + [f"![{p.stem}]({p.name})" for p in images]
    return "\n".join(lines) + "\n"


def _html(runs: list[Run], images: list[Path]) -> str:
    esc = html.escape
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>selfsup report</title>",
             "<style>body{font-family:sans-serif;max-width:1100px;margin:auto;padding:1em}"
             "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px}"
             "img{max-width:100%;margin:6px 0}</style></head><body>",
             f"<h1>selfsup training report: {esc(', '.join(r.name for r in runs))}</h1>"]
    for run in runs:
        parts.append(f"<h2>{esc(run.name)}</h2><p>method {esc(run.method)}; folder {esc(str(run.path))}</p>")
        if run.knn and isinstance(run.knn.get("pretrained"), dict):
            parts.append(f"<p>final kNN top-1: {run.knn['pretrained'].get('top1', float('nan')):.2f}%</p>")
        if run.events:
            parts.append("<p>events:</p><ul>" + "".join(
                f"<li>step {e['step']}: {esc(str(e['kind']))} {esc(str(e.get('group', '')))} {_fmt(e['value'])} "
                f"(baseline {_fmt(e['baseline'])})</li>" for e in run.events[:20]) + "</ul>")
        parts.append("<table><tr>" + "".join(f"<th>{h}</th>" for h in HEADER) + "</tr>" + "".join(
            "<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in summary_rows(run)) + "</table>")
    for path in images:
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        parts.append(f"<h3>{esc(path.stem)}</h3><img alt='{esc(path.stem)}' src='data:image/png;base64,{data}'>")
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
    for i, run in enumerate(runs):  # two folders with the same name: tell them apart by their parent
        if names.count(run.name) > 1:
            run.name = f"{run.path.parent.name}/{run.name}"
    out_dir = Path(out) if out is not None else runs[0].path / "report"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"cannot create the report folder {out_dir} ({e.strerror}); choose another --out") from None
    images = [p for p in (_figure(plot, runs, out_dir) for plot in PLOTS) if p is not None]
    hist = _histogram(runs, out_dir)
    if hist is not None:
        images.insert(images.index(out_dir / "embedding_norms.png") + 1 if out_dir / "embedding_norms.png" in images
                      else len(images), hist)
    (out_dir / "report.md").write_text(_markdown(runs, images))
    (out_dir / "report.html").write_text(_html(runs, images))
    return out_dir
