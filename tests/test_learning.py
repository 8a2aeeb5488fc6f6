"""Schedules that fit the run, and a run that says when it learned nothing (issue 49): a warm-up longer than the
run is shortened with one line and recorded; a run whose lr never left 0, whose backbone did not move, or whose kNN
gain is inside the noise is a ``not_learning`` event, a console line and a line of the report."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
from torch import nn

from selfsup.config import load_run_config
from selfsup.instruments.detectors import read_events
from selfsup.runs.learning import backbone_moved, knn_noise_band
from selfsup.schedules import PHASE_SHARE, PHASES, fit_phases, fitted_line
from ssl_helpers import run_cli, tiny_run

TINY = tiny_run(heads=False)  # simclr-digits: a micro ViT, 2 steps


def test_fit_phases_shortens_every_phase_longer_than_the_run():
    cfg = load_run_config("dinov2-digits", ["optim.warmup_epochs=5", "method.warmup_teacher_temp_epochs=3",
                                            "method.freeze_last_layer=1"])
    fitted = fit_phases(cfg, total_steps=20, epoch_steps=10)  # a 2-epoch run
    by_key = {r["key"]: r for r in fitted}
    assert by_key["optim.warmup_epochs"]["now"] == pytest.approx(PHASE_SHARE * 2) == cfg.optim.warmup_epochs
    assert by_key["method.warmup_teacher_temp_epochs"]["now"] == 0 == cfg.method.warmup_teacher_temp_epochs
    assert "method.freeze_last_layer" not in by_key and cfg.method.freeze_last_layer == 1  # 1 < 2 epochs: kept
    swav = load_run_config("swav-digits", ["method.freeze_prototypes_niters=313"])
    (record,) = [r for r in fit_phases(swav, total_steps=40, epoch_steps=4) if r["unit"] == "steps"]
    assert record == {"key": "method.freeze_prototypes_niters", "was": 313, "now": 4, "run": 40, "unit": "steps"}
    assert fit_phases(load_run_config("simclr-digits", ["optim.warmup_epochs=2"]), 20, 10) == []  # as long: kept
    long = load_run_config("simclr-digits", [])
    assert fit_phases(long, total_steps=500, epoch_steps=10) == [] and long.optim.warmup_epochs == 5
    assert {p[1] for p in PHASES} >= {"warmup_epochs", "warmup_iters", "rep_warmup_steps", "ema_warmup_steps"}
    wmse = load_run_config("wmse-digits", [])  # its selfsup schedule: the code's 500 warm-up iterations unused
    assert [r["key"] for r in fit_phases(wmse, total_steps=100, epoch_steps=5)] == []
    wmse = load_run_config("wmse-digits", ["method.lr_schedule=step"])  # the code's: its warm-up, not optim.*'s
    assert [r["key"] for r in fit_phases(wmse, total_steps=100, epoch_steps=5)] == ["method.warmup_iters"]



def test_keep_phases_keeps_an_official_warm_up_in_a_short_run():
    """A 4-step run of wmse-r18-cifar10 (W-MSE's 500 warm-up iterations, train.py:43, :50-54): shortened to 0 by
    default, kept as configured with optim.keep_phases=true (and then the code's ramp lr·(k + 1)/500)."""
    short = load_run_config("wmse-r18-cifar10", ["trainer.max_steps=4"])
    assert [r["key"] for r in fit_phases(short, total_steps=4, epoch_steps=97)] == ["method.warmup_iters"]
    assert short.method.warmup_iters == 0
    kept = load_run_config("wmse-r18-cifar10", ["trainer.max_steps=4", "optim.keep_phases=true"])
    assert fit_phases(kept, total_steps=4, epoch_steps=97) == [] and kept.method.warmup_iters == 500
    assert "optim.keep_phases=true" in fitted_line({"key": "method.warmup_iters", "was": 500, "now": 0, "run": 4,
                                                    "unit": "steps"})


@pytest.mark.train
def test_a_short_run_follows_the_configured_warm_up_with_keep_phases(tmp_path):
    # W-MSE's own schedule (method.lr_schedule=step) with its 500-iteration warm-up in a 4-step run
    args = [*tiny_run(batches=4, batch_size=32, heads=False), "method.head_size=32", "method.emb=4", "method.w_size=8",
            "method.lr_schedule=step", "method.warmup_iters=500", f"output_dir={tmp_path}"]
    lrs = {}
    for keep in ("true", "false"):
        code, out, err = run_cli("pretrain", "wmse-digits", *args, f"optim.keep_phases={keep}", f"name=keep-{keep}")
        assert code == 0, err
        assert ("method.warmup_iters=500 is longer than the run" in out) == (keep == "false"), out
        rows = (tmp_path / f"keep-{keep}" / "metrics.csv").read_text().splitlines()
        column = rows[0].split(",").index("train/lr")
        lrs[keep] = [float(r.split(",")[column]) for r in rows[1:] if r.split(",")[column]]
    peak = lrs["false"][0]
    assert lrs["false"] == pytest.approx([peak] * 4)  # shortened to 0 iterations: the peak from the first step
    assert lrs["true"] == pytest.approx([peak * (k + 1) / 500 for k in range(4)])  # the code's ramp, lr·(k + 1)/500

def test_knn_noise_band_is_two_binomial_standard_errors():
    knn = {"test_size": 400, "pretrained": {"top1": 60.0}, "random_init": {"top1": 50.0}}
    by_hand = 100 * 1.96 * math.sqrt((0.6 * 0.4 + 0.5 * 0.5) / 400)
    assert knn_noise_band(knn) == pytest.approx(by_hand)  # 6.86 points: a 10-point gain on 400 images is past it


def test_backbone_moved_reads_parameters_not_buffers():
    a = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    b = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    b.load_state_dict(a.state_dict())
    b[1].running_mean += 1  # BatchNorm statistics move without learning
    assert not backbone_moved(b, a)
    b[0].weight.data[0, 0] += 1e-6
    assert backbone_moved(b, a)


@pytest.mark.train
def test_a_warm_up_longer_than_the_run_is_shortened_and_recorded(tmp_path):
    # the replay: a 5-epoch warm-up in a 1-epoch run was every step at lr 0 (the preset's 5 epochs)
    code, out, err = run_cli("pretrain", "simclr-digits", *TINY, f"output_dir={tmp_path}", "name=run")
    assert code == 0, err
    lines = [line for line in out.splitlines() if "optim.warmup_epochs" in line]  # stdout: stderr is for errors
    assert len(lines) == 1 and "shortened to 0.1" in lines[0] and "warmup" not in err, out
    facts = json.loads((tmp_path / "run" / "run.json").read_text())
    assert facts["phases_fitted"][0] == {"key": "optim.warmup_epochs", "was": 5, "now": 0.1, "run": 1, "unit": "epochs"}
    events = [e for e in read_events(tmp_path / "run" / "events.jsonl") if e["kind"] == "not_learning"]
    assert all(e["cause"] == "knn_noise" for e in events)  # 2 steps may not show a gain; the lr left 0
    rows = (tmp_path / "run" / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    lrs = [float(r.split(",")[header.index("train/lr")]) for r in rows[1:] if r.split(",")[header.index("train/lr")]]
    assert lrs and lrs[0] > 0


@pytest.mark.train
def test_a_run_at_lr_0_says_it_did_not_learn(tmp_path):
    code, out, err = run_cli("pretrain", "simclr-digits", *TINY, "optim.base_lr=0", f"output_dir={tmp_path}",
                             "name=run")
    assert code == 0, err
    events = [e for e in read_events(tmp_path / "run" / "events.jsonl") if e["kind"] == "not_learning"]
    causes = {e["cause"] for e in events}
    assert "lr" in causes and "knn_noise" in causes, events
    line = next(line for line in out.splitlines() if "not learning: the lr was 0" in line)
    assert "equal its init" in line
    code, _, err = run_cli("report", tmp_path / "run")
    assert code == 0, err
    report = (tmp_path / "run" / "report" / "report.md").read_text()
    assert "Not learning" in report and "the lr was 0" in report


@pytest.mark.train
def test_without_the_end_of_run_knn_the_lr_check_still_speaks(tmp_path):
    # eval.knn_at_end=false (a sweep that evaluates later): no knn.json and no kNN verdict, the lr and movement checks
    # still run
    code, out, err = run_cli("pretrain", "simclr-digits", *TINY, "optim.base_lr=0", "eval.knn_at_end=false",
                             f"output_dir={tmp_path}", "name=run")
    assert code == 0, err
    assert "no kNN report: eval.knn_at_end=false" in out and not (tmp_path / "run" / "knn.json").exists()
    causes = {e["cause"] for e in read_events(tmp_path / "run" / "events.jsonl") if e["kind"] == "not_learning"}
    assert causes == {"lr"}, causes


def test_learning_checks_on_a_model_that_moved_and_gained(tmp_path):
    from selfsup.runs.learning import learning_checks

    init, trained = nn.Linear(2, 2), nn.Linear(2, 2)
    model = SimpleNamespace(global_step=10, max_lr=0.1, eval_backbone=trained,
                            cfg=SimpleNamespace(optim=SimpleNamespace(base_lr=0.1, warmup_epochs=1)))
    knn = {"test_size": 10000, "pretrained": {"top1": 80.0}, "random_init": {"top1": 70.0}}
    (tmp_path / "knn.json").write_text(json.dumps(knn))
    assert learning_checks(model, init, tmp_path) == []
    knn["pretrained"]["top1"] = 70.5  # +0.5 on 10,000 images: inside ±1.3
    (tmp_path / "knn.json").write_text(json.dumps(knn))
    assert [c["cause"] for c in learning_checks(model, init, tmp_path)] == ["knn_noise"]


def _judged(tmp_path, pretrained: float, start: float, n: int = 100, labels: dict | None = None):
    """The end-of-run verdicts on a kNN of ``n`` test images: the collapse alarm's lines, then the learning causes."""
    from selfsup.runs.finish import not_learning
    from selfsup.runs.learning import knn_checks

    tmp_path.mkdir(parents=True, exist_ok=True)
    knn = {"test_size": n, "pretrained": {"top1": pretrained}, "random_init": {"top1": start}, "labels": labels or {}}
    lines = not_learning(knn, tmp_path, 10, "a lower optim.base_lr")
    return lines, [c for c in knn_checks(knn, tmp_path)]


def test_one_noise_rule_judges_a_drop_and_a_gain_alike(tmp_path):
    # issue 62: 2 points down on 100 test images fired the collapse alarm while 13 points up was noise
    from selfsup.runs.learning import knn_verdict

    assert knn_noise_band({"test_size": 100, "pretrained": {"top1": 50.0}, "random_init": {"top1": 50.0}}) == \
        pytest.approx(13.86, abs=0.01)
    for diff in (-13.0, -2.0, 2.0, 13.0):  # inside ±13.9 either way: neither a collapse nor learning shown
        lines, causes = _judged(tmp_path / f"in{diff}", 50.0 + diff, 50.0)
        assert lines == [] and [c["cause"] for c in causes] == ["knn_noise"], diff
        assert "inside the noise (±" in causes[0]["line"] and "on 100 test images" in causes[0]["line"]
        assert not [e for e in read_events(tmp_path / f"in{diff}" / "events.jsonl") if e["kind"] == "collapse"]
    lines, causes = _judged(tmp_path / "down", 30.0, 50.0)  # 20 under: past the band, a loss
    assert len(lines) == 1 and "20.00 points under its random init, past the noise" in lines[0] and causes == []
    lines, causes = _judged(tmp_path / "up", 70.0, 50.0)  # 20 over: a gain
    assert lines == [] and causes == []
    knn = {"test_size": 100, "pretrained": {"top1": 50.0}, "random_init": {"top1": 50.0}}
    for top1, verdict in ((64.0, "gain"), (36.0, "loss"), (50.0, "noise")):  # the same threshold both ways
        knn["pretrained"]["top1"] = top1
        assert knn_verdict(knn)[0] == verdict


def test_a_loss_past_the_noise_with_the_alarm_off_is_its_own_cause(tmp_path):
    from selfsup.runs.learning import knn_checks

    knn = {"test_size": 1000, "pretrained": {"top1": 40.0}, "random_init": {"top1": 50.0}}
    (cause,) = knn_checks(knn, tmp_path)  # no collapse event in events.jsonl: the alarm was off
    assert cause["cause"] == "knn_drop" and "10.00 points under its random init, past the noise" in cause["line"]
    assert cause["baseline"] == pytest.approx(-knn_noise_band(knn))


def test_a_run_from_weights_is_compared_with_its_start_not_a_random_init(tmp_path):
    from selfsup.runs.facts import start_label
    from selfsup.runs.finish import knn_lines

    (tmp_path / "run.json").write_text(json.dumps({"weights": {"source": "runs/teacher", "sha256": "ab" * 32}}))
    assert start_label(tmp_path) == "start (weights: runs/teacher)" and start_label(tmp_path / "none") == "random init"
    labels = {"pretrained": "pretrained", "random_init": start_label(tmp_path, "random_init")}
    out = {"k": 20, "temperature": 0.07, "train_size": 50, "test_size": 100, "labels": labels,
           "pretrained": {"top1": 30.0, "top5": 90.0}, "random_init": {"top1": 50.0, "top5": 95.0}}
    lines = knn_lines(out, SimpleNamespace(data=SimpleNamespace(name="imagefolder"), eval=SimpleNamespace(knn_k=20)))
    assert lines[2].split() == ["start", "(weights:", "runs/teacher)", "top-1", "50.00%", "top-5", "95.00%"]
    assert not any("random" in line for line in lines)
    said, _ = _judged(tmp_path / "drop", 30.0, 50.0, labels=labels)
    assert "points under its start (weights: runs/teacher), past the noise" in said[0]
    (event,) = read_events(tmp_path / "drop" / "events.jsonl")
    assert "under that of its start (weights: runs/teacher)" in event["meaning"]
    _, (noise,) = _judged(tmp_path / "noise", 52.0, 50.0, labels=labels)
    assert "the kNN difference from its start (weights: runs/teacher), +2.00 points" in noise["line"]
