"""selfsup report: plots only for present metrics, non-blank PNGs, one self-contained HTML, overlays, errors."""

import csv
import json
import math
import re

import numpy as np
import torch
from PIL import Image

from selfsup.cli import main
from selfsup.report import write_report


def fake_run(path, keys=("train/loss", "train/lr", "instruments/grad_l2", "instruments/grad_l2_first_block",
                         "instruments/norm_embedding_mean", "instruments/rankme_embedding", "monitor/knn_top1"),
             scale=1.0, events=True):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text("method:\n  name: simclr\n")
    with (path / "metrics.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["epoch", "step", *keys])
        w.writeheader()
        for step in range(0, 60, 2):
            w.writerow({"epoch": 0, "step": step, **{k: scale * (1 + math.sin(step / 7 + i)) + 0.1
                                                    for i, k in enumerate(keys)}})
            w.writerow({"epoch": 0, "step": step})  # a sparse row, as CSVLogger writes
    if events:
        (path / "events.jsonl").write_text(
            json.dumps({"step": 20, "kind": "grad_spike", "value": 9.0, "baseline": 1.0, "group": "first_block"})
            + "\n" + json.dumps({"step": 40, "kind": "knn_dip", "value": 0.5, "baseline": 1.9}) + "\n")
        torch.save({"embedding": torch.rand(64) + 3, "projection": torch.full((64,), 2.0)}, path / "embedding_norms.pt")
    return path


def non_blank(png):
    pixels = np.asarray(Image.open(png).convert("L"), dtype=np.float32)
    return pixels.std() > 5 and (pixels < 128).mean() > 0.001


def test_single_run_report(tmp_path, capsys):
    run = fake_run(tmp_path / "run")
    assert main(["report", str(run)]) == 0
    out = run / "report"
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["embedding_norms.png", "grad_norms.png", "knn.png", "loss.png", "norm_histogram.png", "rank.png",
                    "schedules.png"]
    assert all(non_blank(out / p) for p in pngs)
    page = (out / "report.html").read_text()
    refs = re.findall(r"""(?:src|href)\s*=\s*['"]([^'"]*)""", page)
    assert len(refs) == len(pngs) and all(r.startswith("data:image/png;base64,") for r in refs)
    assert not re.search(r"https?://|url\(|<link|<script", page)
    md = (out / "report.md").read_text()
    assert "grad_spike [first_block]" in md and "| train/loss |" in md
    assert "report.html" in capsys.readouterr().out


def test_only_present_metrics_are_plotted(tmp_path):
    run = fake_run(tmp_path / "run", keys=("train/loss",), events=False)
    out = write_report([run])
    assert sorted(p.name for p in out.glob("*.png")) == ["loss.png"]


def test_overlay_of_two_runs(tmp_path):
    many = tuple(f"instruments/grad_l2_{g}" for g in ("", "a", "b", "c", "d", "e", "f", "g", "h"))  # > line styles
    a, b = fake_run(tmp_path / "default", keys=many), fake_run(tmp_path / "cut-init", scale=2.0)
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "cmp")]) == 0
    page = (tmp_path / "cmp" / "report.html").read_text()
    assert "default" in page and "cut-init" in page
    assert non_blank(tmp_path / "cmp" / "loss.png")


def test_report_errors_exit_2_with_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has no metrics" in err
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    a, b = fake_run(tmp_path / "a", events=False), fake_run(tmp_path / "b", events=False)
    assert main(["report", str(a), str(b)]) == 2
    assert "--out" in capsys.readouterr().err
