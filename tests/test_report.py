"""selfsup report: one model of sections rendered to markdown and HTML with the same content; the run header,
headline numbers (final kNN vs the random-init floor, every eval/*.json), events, plots (only for present
metrics, non-blank, sensible axes), overlays on shared axes, one self-contained page, one-line errors."""

import csv
import json
import math
import re
from html.parser import HTMLParser

import numpy as np
import torch
import yaml
from PIL import Image

import selfsup.report as report
from selfsup.config import load_run_config, to_dict
from selfsup.report import build_report, load_run, write_report
from ssl_helpers import assert_user_error, run_cli

KEYS = ("train/loss", "train/lr", "train/momentum", "instruments/grad_l2", "instruments/grad_l2_first_block",
        "instruments/norm_embedding_mean", "instruments/rankme_embedding", "monitor/knn_top1")


def fake_run(path, keys=KEYS, scale=1.0, events=True, evals=False):
    path.mkdir(parents=True)
    cfg = load_run_config("moco-v3-vit-digits", [f"output_dir={path.parent}", f"name={path.name}"])
    (path / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    with (path / "metrics.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["epoch", "step", *keys])
        w.writeheader()
        for step in range(0, 60, 2):
            row = {k: scale * (1 + math.sin(step / 7 + i)) + 0.1 for i, k in enumerate(keys)}
            if "train/loss" in keys:
                row["train/loss"] = 10.0 * 0.9 ** step  # 10 → 0.02: spans decades
            if "train/lr" in keys:
                row["train/lr"] = 1.5e-3 * step / 58
            w.writerow({"epoch": step // 20, "step": step, **row})
            w.writerow({"epoch": step // 20, "step": step})  # a sparse row, as CSVLogger writes
    (path / "knn.json").write_text(json.dumps({"k": 20, "temperature": 0.07, "train_size": 1438, "test_size": 359,
                                               "pretrained": {"top1": 81.62, "top5": 99.4},
                                               "random_init": {"top1": 58.5, "top5": 91.6}}))
    (path / "run.json").write_text(json.dumps({"global_step": 60, "epochs": 3, "fit_seconds": 125.4, "sessions": 2,
                                               "world_size": 2, "num_nodes": 1, "accelerator": "cuda",
                                               "device": "NVIDIA H200"}))
    if events:
        (path / "events.jsonl").write_text(
            json.dumps({"step": 20, "kind": "grad_spike", "value": 9.0, "baseline": 1.0, "group": "first_block"})
            + "\n" + json.dumps({"step": 40, "kind": "knn_dip", "value": 0.5, "baseline": 1.9}) + "\n")
        torch.save({"embedding": torch.rand(64) + 3, "projection": torch.full((64,), 2.0)}, path / "embedding_norms.pt")
    if evals:
        ev = path / "eval"
        ev.mkdir()
        head = {"backbone": "vit_micro", "method": "moco_v3", "dataset": "digits", "weights": "trained"}
        files = {
            "knn": {**head, "voting": "T=0.07", "results": {"k=20": {"top1": 80.5, "top5": 99.7},
                                                            "k=200": {"top1": 67.7, "top5": 99.2}}},
            "linear": {**head, "mode": "features", "epochs": 90, "lr": 0.3, "test": {"top1": 91.92, "top5": 99.2}},
            "finetune": {**head, "epochs": 1, "recipe": "plain", "test": {"top1": 24.51, "top5": 66.6}},
            "rankme": {**head, "rankme": 3.49, "effective_rank_99": 25, "dim": 128, "samples": 1438},
            "norms-ood-classes-8-9": {**head, "ood": "classes:8,9", "auroc": 0.4212, "in_size": 289, "ood_size": 70},
            # the random init's kNN (selfsup eval knn RUN/backbone_init.safetensors), written before results carried
            # their weights: told apart by its source
            "knn.init": {**{k: v for k, v in head.items() if k != "weights"},
                         "source": str(path / "backbone_init.safetensors"), "voting": "T=0.07",
                         "results": {"k=20": {"top1": 63.8, "top5": 95.0}}},
            "rankme-projector.step40": {**head, "weights": "checkpoint at step 40", "embedding": "projector",
                                        "rankme": 7.5, "effective_rank_99": 30, "dim": 128, "samples": 1438},
        }
        for name, data in files.items():
            (ev / f"{name}.json").write_text(json.dumps(data))
        Image.fromarray((np.arange(64 * 64).reshape(64, 64) % 251).astype(np.uint8)).save(
            ev / "norms-ood-classes-8-9.png")
    return path


def non_blank(png):
    pixels = np.asarray(Image.open(png).convert("L"), dtype=np.float32)
    return pixels.std() > 5 and (pixels < 128).mean() > 0.001


# --------------------------------------------------------------------------- the content of both renderings
class _HtmlText(HTMLParser):
    """The page's text in reading order: headings, paragraphs, table cells (one entry each) and image alts."""

    def __init__(self):
        super().__init__()
        self.items, self._buf, self._open = [], [], None

    def handle_starttag(self, tag, attrs):
        if tag in ("h1", "h2", "p", "td", "th"):
            self._open, self._buf = tag, []
        elif tag == "img":
            self.items.append(("img", dict(attrs)["alt"]))

    def handle_endtag(self, tag):
        if tag == self._open:
            self.items.append(("text", "".join(self._buf).strip()))
            self._open = None

    def handle_data(self, data):
        if self._open:
            self._buf.append(data)


def html_items(page: str) -> list:
    parser = _HtmlText()
    parser.feed(page)
    return [item for item in parser.items if item != ("text", "")]


def markdown_items(md: str) -> list:
    items = []
    for line in md.splitlines():
        if not line.strip() or re.fullmatch(r"\|(---\|)+|\| \| \|", line):
            continue
        if line.startswith("#"):
            items.append(("text", line.lstrip("#").strip()))
        elif line.startswith("|"):
            cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            for cell in cells:
                image = re.fullmatch(r"!\[(.*)\]\((.*)\)", cell)
                if image:
                    items.append(("img", image.group(1)))
                elif cell:
                    items.append(("text", cell))
        else:
            items.append(("text", line.strip().strip("*")))
    return items


def test_a_run_with_evaluations_and_events_has_every_section_in_both_renderings(tmp_path):
    run = fake_run(tmp_path / "run", evals=True)
    out = write_report([run])
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert markdown_items(md) == html_items(page)  # one model, two renderings: the same text in the same order
    titles = ["The run", "Headline numbers", "Events", "Training dynamics", "Every metric"]
    assert [line[3:] for line in md.splitlines() if line.startswith("## ")] == titles
    assert re.findall(r"<h2>(.*?)</h2>", page) == titles
    for words in (["method", "moco_v3"], ["dataset", "digits"], ["backbone", "vit_micro/2"], ["steps", "60"],
                  ["epochs", "3 of 50"], ["wall time", "2m 05s (fit) over 2 sessions (resumed)"],
                  ["devices", "2 × NVIDIA H200"], ["seed", "0"]):
        assert f"| {words[0]} | {words[1]} |" in md, words
    for row in ("| kNN top-1, trained | 81.62% |", "| kNN top-1, random init (floor) | 58.50% |",
                "| gain over the floor | +23.12 points |", "| eval kNN top-1 (k=20) [trained] | 80.50% |",
                "| eval kNN top-1 (k=20) [random init] | 63.80% |",
                "| linear probe top-1 [trained] | 91.92% |", "| fine-tuning top-1 [trained] | 24.51% |",
                "| RankMe [trained] | 3.49 |", "| RankMe [checkpoint at step 40, projector] | 7.5 |",
                "| effective rank (99%) [trained] | 25 |", "| norm OOD AUROC (classes:8,9) [trained] | 0.4212 |"):
        assert row in md, row
    assert "2 events: grad_spike × 1, knn_dip × 1." in md
    assert "| 20 | grad_spike | first_block | 9 | 1 | 9 |" in md and "| 40 | knn_dip |  | 0.5 | 1.9 | 0.263 |" in md
    assert "| train/loss | 10 |" in md and "| monitor/knn_top1 |" in md
    # the evaluation's own figure is in the grid too, linked from the markdown and embedded in the page
    assert "(../eval/norms-ood-classes-8-9.png)" in md and "eval/norms-ood-classes-8-9.png" in page
    refs = re.findall(r"""(?:src|href)\s*=\s*['"]([^'"]*)""", page)
    assert len(refs) == len(list(out.glob("*.png"))) + 1 and all(r.startswith("data:image/png;base64,") for r in refs)
    assert not re.search(r"https?://|url\(|<link|<script", page)


def test_single_run_report_from_the_cli(tmp_path):
    run = fake_run(tmp_path / "run")
    code, stdout, err = run_cli("report", run)
    assert code == 0, err
    out = run / "report"
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["embedding_norms.png", "grad_norms.png", "knn.png", "loss.png", "norm_histogram.png", "rank.png",
                    "schedules.png"]
    assert all(non_blank(out / p) for p in pngs)
    assert "report.html" in stdout
    md = (out / "report.md").read_text()
    assert "No kNN result" not in md and "| kNN top-1, trained | 81.62% |" in md
    assert "| eval kNN" not in md  # no eval folder: only the run's own kNN


def test_a_run_without_events_or_evaluations_says_so(tmp_path):
    run = fake_run(tmp_path / "run", keys=("train/loss",), events=False)
    (run / "knn.json").unlink()
    (run / "run.json").unlink()
    out = write_report([run])
    assert sorted(p.name for p in out.glob("*.png")) == ["loss.png"]
    md = (out / "report.md").read_text()
    assert "No events: no gradient spike, no kNN dip and no collapse was detected." in md
    assert "No kNN result or evaluation in this folder." in md
    assert "| wall time | not recorded |" in md and "| devices | auto (auto; not recorded) |" in md
    assert "| epochs | 3 of 50 |" in md  # from the metrics' epoch column when run.json is absent


def _figures(monkeypatch, runs, tmp_path):
    """Draw every plot of ``runs`` and keep the matplotlib figures (closed by the report) by plot name."""
    import matplotlib.pyplot as plt

    kept, close = {}, plt.close
    monkeypatch.setattr(plt, "close", lambda fig: kept.setdefault(fig.axes[0].get_title(), fig))
    sections = build_report(runs, tmp_path)
    monkeypatch.setattr(plt, "close", close)
    return {p.name: kept[p.title] for p in report.PLOTS if p.title in kept}, sections


def test_axes_lr_on_its_own_axis_log_where_values_span_decades(tmp_path, monkeypatch):
    figs, _ = _figures(monkeypatch, [load_run(fake_run(tmp_path / "run"))], tmp_path)
    lr_axis, momentum_axis = figs["schedules"].axes
    assert [line.get_label() for line in lr_axis.get_lines()] == ["lr"]
    assert [line.get_label() for line in momentum_axis.get_lines()] == ["momentum"]
    assert lr_axis.get_ylabel() == "learning rate" and momentum_axis.get_ylabel() == "EMA momentum"
    loss, grads, knn = figs["loss"].axes[0], figs["grad_norms"].axes[0], figs["knn"].axes[0]
    assert loss.get_yscale() == "log"  # 10 → 0.02
    assert grads.get_yscale() == "log" and figs["embedding_norms"].axes[0].get_yscale() == "linear"
    assert knn.get_yscale() == "linear"
    # the dense kNN curve: its dip marked at its step and value, the random-init floor as a line at 58.5
    (dip,) = [c for c in knn.collections if c.get_label().startswith("knn_dip")]
    assert dip.get_offsets().tolist() == [[40.0, 0.5]]
    assert any(list(line.get_ydata()) == [58.5, 58.5] for line in knn.get_lines())
    (spike,) = [c for c in grads.collections if c.get_label().startswith("grad_spike")]
    assert spike.get_offsets().tolist() == [[20.0, 9.0]]


def test_overlay_of_two_runs_shares_axes_and_tells_every_line_apart(tmp_path, monkeypatch):
    many = (tuple(f"instruments/grad_l2_{g}" for g in ("a", "b", "c", "d", "e", "f", "g", "h"))
            + ("instruments/grad_l2",))
    a = fake_run(tmp_path / "default", keys=many + ("train/loss",))
    b = fake_run(tmp_path / "cut-init", scale=2.0)
    runs = [load_run(a), load_run(b)]
    (tmp_path / "fig").mkdir()
    figs, sections = _figures(monkeypatch, runs, tmp_path / "fig")
    ax = figs["grad_norms"].axes[0]
    lines = ax.get_lines()
    assert len(lines) == len(many) + 2  # nine of run a, two of run b, one axis
    looks = {(line.get_color(), str(line._unscaled_dash_pattern), line.get_marker()) for line in lines}
    assert len(looks) == len(lines)  # no two lines look alike, though there are more keys than line styles
    assert {line.get_label().split(":")[0] for line in lines} == {"default", "cut-init"}
    colours = {line.get_label().split(":")[0]: set() for line in lines}
    for line in lines:
        colours[line.get_label().split(":")[0]].add(line.get_color())
    assert all(len(c) == 1 for c in colours.values()) and colours["default"] != colours["cut-init"]  # a colour per run
    assert len({figs[name].axes[0].get_xlim() for name in figs}) == 1  # every plot on the same step axis
    code, _, err = run_cli("report", a, b, "--out", tmp_path / "cmp")
    assert code == 0, err
    md = (tmp_path / "cmp" / "report.md").read_text()
    assert "## The runs" in md and "|  | default | cut-init |" in md and "| measure | default | cut-init |" in md
    assert "| run | step | kind |" in md and "| cut-init | 20 | grad_spike |" in md
    assert "| default | 40 | knn_dip |" in md
    # the metrics side by side: one table, a column per run (last value and range); a run's missing metric: –
    assert md.count("| metric | first | last |") == 0 and md.count("| metric | default | cut-init |") == 1
    row = next(line for line in md.splitlines() if line.startswith("| instruments/grad_l2_a |"))
    assert row.endswith("| – |")  # run b has no such group
    row = next(line for line in md.splitlines() if line.startswith("| train/loss |"))
    assert row.count("(") == 2 and row.count("…") == 2  # both runs log the loss
    # legends beside the axes, never over a curve
    for name in ("grad_norms", "loss"):
        fig = figs[name]
        fig.canvas.draw()
        legend, axes = fig.axes[0].get_legend().get_window_extent(), fig.axes[0].get_window_extent()
        assert legend.x0 >= axes.x1, name
    assert non_blank(tmp_path / "cmp" / "loss.png") and non_blank(tmp_path / "cmp" / "grad_norms.png")
    assert markdown_items(md) == html_items((tmp_path / "cmp" / "report.html").read_text())


def test_an_overlay_opens_with_the_settings_that_differ(tmp_path):
    a = fake_run(tmp_path / "a", events=False)
    b = fake_run(tmp_path / "b", events=False)
    cfg = yaml.safe_load((b / "config.yaml").read_text())
    cfg["optim"]["base_lr"], cfg["interventions"]["cut_init"] = 0.5, 3.0
    del cfg["data"]["imbalance"]
    (b / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    sections = build_report([load_run(a), load_run(b)], tmp_path)
    assert sections[0].title == "Settings that differ" and sections[1].title == "The runs"
    (table,) = sections[0].blocks
    base_lr = load_run_config("moco-v3-vit-digits").optim.base_lr
    assert table.header == ["setting", "a", "b"]
    assert table.rows == [["data.imbalance", "1", "–"], ["optim.base_lr", report._fmt(base_lr), "0.5"],
                          ["interventions.cut_init", "1", "3"]]  # name and output_dir differ too, but say nothing
    same = build_report([load_run(a), load_run(a)], tmp_path)[0]
    assert same.blocks == ["The runs' configs are the same (name and output_dir aside)."]
    assert build_report([load_run(a)], tmp_path)[0].title == "The run"  # one run: no such section


def test_report_errors_exit_2_with_one_line(tmp_path):
    (tmp_path / "empty").mkdir()
    assert_user_error(*run_cli("report", tmp_path / "empty")[::2], "has no metrics")
    assert_user_error(*run_cli("report", tmp_path / "missing")[::2], "is not a folder")
    a, b = fake_run(tmp_path / "a", events=False), fake_run(tmp_path / "b", events=False)
    assert_user_error(*run_cli("report", a, b)[::2], "--out")
