"""The collapse alarm: its rule by hand, its measure against the spectrum module's, its event and console line,
its checkpointed state, and a run that collapses by construction (VICReg with only its invariance term)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from selfsup.eval.spectrum import effective_rank
from selfsup.instruments.collapse import SIGNS, CollapseAlarm, Sign, collapse_signs
from selfsup.instruments.detectors import read_events
from selfsup.instruments.measures import batch_effective_rank
from selfsup.step import StepOutput


def test_a_sign_fires_once_after_window_measurements_in_a_row_past_its_threshold():
    alarm = CollapseAlarm(window=3, signs=(Sign("s", 0.05),))
    fired = [bool(alarm.observe({"s": v})) for v in (1.0, 0.01, 0.02, 0.9, 0.01, 0.01, 0.01, 0.01, 0.0)]
    assert fired == [False, False, False, False, False, False, True, False, False]  # the break at 0.9 resets
    assert alarm.fired == {"s"}


def test_a_relative_sign_compares_with_its_first_value_and_an_above_sign_with_its_threshold():
    alarm = CollapseAlarm(window=2, signs=(Sign("rank", 0.25, relative=True), Sign("cond", 1e6, above=True)))
    assert alarm.observe({"rank": 16.0, "cond": 2e6, "other": 0.0}) == []
    out = alarm.observe({"rank": 3.0, "cond": 5e6})
    assert [(s.name, v, c) for s, v, c in out] == [("cond", 5e6, 5e6)]
    out = alarm.observe({"rank": 3.0})
    assert [(s.name, v, c) for s, v, c in out] == [("rank", 3.0, 3.0 / 16.0)]
    assert not alarm.observe({"rank": 4.5})  # 4.5 / 16 = 0.28: past nothing, and fired signs stay quiet
    assert not CollapseAlarm(1, (Sign("s", 1.0),)).observe({"s": float("nan")})


def test_the_alarm_state_resumes_where_it_stopped():
    series = [16.0, 3.0, 2.0, 5.0, 2.0, 2.0, 2.0]
    whole = CollapseAlarm(window=3, signs=collapse_signs())
    fired_whole = [bool(whole.observe({"eff_rank_batch": v})) for v in series]
    first = CollapseAlarm(window=3, signs=collapse_signs())
    fired = [bool(first.observe({"eff_rank_batch": v})) for v in series[:4]]
    resumed = CollapseAlarm(window=3, signs=collapse_signs())
    resumed.load_state_dict(first.state_dict())
    fired += [bool(resumed.observe({"eff_rank_batch": v})) for v in series[4:]]
    assert fired == fired_whole == [False] * 6 + [True]


def test_a_dip_in_the_warm_up_that_recovers_is_no_collapse_and_the_replay_is_the_runs_alarm():
    """The shape the healthy 5-epoch dino-fmnist seeds (Sinkhorn-Knopp) logged: effective rank 16, down to 3 in the
    117 warm-up steps, back to 17 after; judged from step 0 it fired at step 70. The same dip after the warm-up
    fires; ``replay`` of the logged series gives what the run raised."""
    dip = [16, 10, 5, 3, 3, 3, 3, 3, 4, 4, 5, 6, 8, 9, 11, 13, 15, 17, 17, 17]
    series = {"eff_rank_batch": [(10 * i, float(v)) for i, v in enumerate(dip)]}
    assert CollapseAlarm(5, collapse_signs()).replay(series, warmup_steps=117) == []
    fired = CollapseAlarm(5, collapse_signs()).replay(series, warmup_steps=0)
    assert [(e["step"], e["sign"], e["raw"]) for e in fired] == [(70, "eff_rank_batch", 3.0)]
    late = {"eff_rank_batch": [(0, 16.0)] + [(200 + 10 * i, 3.0) for i in range(6)]}
    assert [e["step"] for e in CollapseAlarm(5, collapse_signs()).replay(late, warmup_steps=117)] == [240]


def test_the_rank_fraction_is_configurable_and_the_default_signs_are_named_as_the_instruments_log_them():
    assert {s.name: s.threshold for s in collapse_signs(0.1)}["eff_rank_batch"] == 0.1
    assert {s.name for s in SIGNS} == {"eff_rank_batch", "dim_std_projection_batch", "knn_over_init",
                                       "dino_teacher_spread", "swav_code_entropy_over_log_k", "wmse_cov_condition",
                                       "ijepa_target_std", "ijepa_prediction_std", "lejepa_sigreg_over_point_mass",
                                       "moco_queue_similarity", "tico_covariance_concentration"}


def test_the_moco_v2_and_tico_signs_on_the_digits_runs_curves():
    """MoCo v2's keys' mean cosine to its queue and TiCo's ||C||_F^2 / tr(C)^2, above 0.9: the series of the digits
    runs (docs/contrastive.md, seed 0, steps 0-110): MoCo v2 with the code's head (+4.2 kNN, inside the noise) holds
    its keys at 0.93-0.98 and fires; with the BatchNorm head (+30.6) and TiCo (+23.4) the alarm stays silent."""
    code_head = [(0, -0.003), (10, 0.981), (20, 0.97), (30, 0.964), (40, 0.967), (50, 0.965), (60, 0.963),
                 (70, 0.958), (80, 0.95), (90, 0.947), (100, 0.943), (110, 0.932)]
    bn_head = [(0, -0.003), (10, 0.39), (20, 0.444), (30, 0.45), (40, 0.429), (50, 0.395), (60, 0.36), (70, 0.325),
               (80, 0.291), (90, 0.26), (100, 0.229), (110, 0.201)]
    tico = [(0, 0.235), (10, 0.065), (20, 0.064), (30, 0.056), (40, 0.069), (50, 0.07), (60, 0.086), (70, 0.077),
            (80, 0.068), (90, 0.077), (100, 0.069), (110, 0.074)]
    fired = CollapseAlarm(5, collapse_signs()).replay({"moco_queue_similarity": code_head}, warmup_steps=0)
    assert [(e["sign"], e["step"]) for e in fired] == [("moco_queue_similarity", 50)]
    healthy = {"moco_queue_similarity": bn_head, "tico_covariance_concentration": tico}
    assert CollapseAlarm(5, collapse_signs()).replay(healthy, warmup_steps=0) == []
    collapsed = {"tico_covariance_concentration": [(0, 0.235)] + [(10 * i, 0.97) for i in range(1, 8)]}
    fired = CollapseAlarm(5, collapse_signs()).replay(collapsed)
    assert [e["sign"] for e in fired] == ["tico_covariance_concentration"]


def test_the_jepa_signs_fire_on_a_collapse_and_not_on_the_pilots_curves():
    """The I-JEPA spreads are judged against their first value, the LeJEPA statistic against 0.5 of a point mass's:
    series shaped as the digits pilots' (benchmarks/jepa_choice.py) stay silent, a fall to a point fires."""
    healthy = {"ijepa_target_std": [(0, 0.124)] + [(10 * i, 0.08) for i in range(1, 8)],
               "ijepa_prediction_std": [(0, 0.041)] + [(10 * i, 0.018) for i in range(1, 8)],
               "lejepa_sigreg_over_point_mass": [(0, 0.74)] + [(10 * i, 0.1) for i in range(1, 8)]}
    assert CollapseAlarm(5, collapse_signs()).replay(healthy, warmup_steps=0) == []
    collapsed = {"ijepa_target_std": [(0, 0.124)] + [(10 * i, 0.001) for i in range(1, 8)],
                 "lejepa_sigreg_over_point_mass": [(0, 0.74)] + [(10 * i, 0.97) for i in range(1, 8)]}
    fired = CollapseAlarm(5, collapse_signs()).replay(collapsed, warmup_steps=0)
    assert sorted(e["sign"] for e in fired) == ["ijepa_target_std", "lejepa_sigreg_over_point_mass"]


def test_batch_dim_std_is_the_per_dim_std_measure():
    from selfsup.instruments.measures import batch_dim_std, per_dim_std

    x = torch.randn(64, 16, generator=torch.Generator().manual_seed(1))
    assert float(batch_dim_std(x)) == pytest.approx(per_dim_std(x), rel=1e-6)
    assert float(batch_dim_std(torch.ones(8, 4) + 1e-3 * x[:8, :4])) < 1e-3  # a collapsed batch: every row alike


def test_projections_that_fall_together_fire_the_dim_std_sign(tmp_path):
    """SimSiam §4.1: the per-dimension std of the L2-normalised projections falls to 0 when they collapse, while
    the backbone features here keep their rank."""
    from selfsup.instruments import StepInstruments

    trainer = SimpleNamespace(is_global_zero=True, loggers=[], global_step=0, default_root_dir=str(tmp_path))
    module = SimpleNamespace(family="joint", collapse_remedy="a predictor", warmup_steps=lambda: 0)
    cb = StepInstruments(every_n_steps=1, alarm=CollapseAlarm(window=3, signs=collapse_signs()))
    g = torch.Generator().manual_seed(0)
    for step in range(8):
        trainer.global_step = step + 1
        z = torch.randn(32, 16, generator=g)
        if step >= 2:  # the projections collapse towards one direction: their spread 0.3 x, then less
            z = torch.ones(32, 16) + 0.3 ** (step - 1) * z
        cb.on_train_batch_end(trainer, module, {"loss": torch.tensor(0.0), "step": StepOutput(
            torch.tensor(0.0), embedding=torch.randn(32, 16, generator=g), projection=z)}, None, step)
    events = read_events(tmp_path / "events.jsonl")
    assert [(e["sign"], e["step"]) for e in events] == [("dim_std_projection_batch", 4)]
    assert events[0]["value"] < 0.4 and events[0]["baseline"] == 0.4


def test_a_run_that_ends_under_its_init_says_so_once(tmp_path, capsys):
    from selfsup.runs.finish import not_learning
    from selfsup.runs.learning import knn_noise_band

    knn = {"test_size": 359, "pretrained": {"top1": 50.4}, "random_init": {"top1": 58.5}}  # W-MSE at 10x its lr
    band = knn_noise_band(knn)  # 7.26 points on the 359 digits test images: 8.1 under is past it
    lines = not_learning(knn, tmp_path, 100, "a lower optim.base_lr")
    assert lines == ["  not learning: the trained backbone is 8.10 points under its random init, past the noise "
                     f"(±{band:.2f}: 1.96 binomial standard errors on 359 test images) (try: a lower optim.base_lr)"]
    event, = read_events(tmp_path / "events.jsonl")
    assert (event["kind"], event["sign"], event["step"]) == ("collapse", "knn_over_init", 100)
    assert event["baseline"] == pytest.approx(-band)  # the threshold of a loss: the band a gain must pass, negated
    assert event["value"] == pytest.approx(-8.1) and "collapse at step 100: knn_over_init" in capsys.readouterr().err
    assert not_learning(knn, tmp_path, 100, "") == []  # already said (by the kNN monitor or before)
    assert not_learning({"test_size": 359, "pretrained": {"top1": 60.0}, "random_init": {"top1": 58.5}},
                        tmp_path / "b", 9, "") == []
    assert not (tmp_path / "b" / "events.jsonl").exists()


def test_the_knn_monitor_names_a_backbone_that_stays_under_its_init(tmp_path):
    from selfsup.instruments import KNNMonitor
    from selfsup.instruments.collapse import KNN_OVER_INIT

    trainer = SimpleNamespace(is_global_zero=True, loggers=[], global_step=0, default_root_dir=str(tmp_path))
    module = SimpleNamespace(collapse_remedy="a lower optim.base_lr", warmup_steps=lambda: 20)
    monitor = KNNMonitor(10, alarm=CollapseAlarm(3, (KNN_OVER_INIT,)))
    monitor._data = "measured"
    scores = iter([58.5, 50.0, 57.0, 59.0, 55.0, 54.0, 53.0, 52.0])  # init, then steps 10 .. 70
    monitor.measure = lambda pl_module: next(scores)
    monitor.on_train_start(trainer, module)
    assert monitor.init_top1 == 58.5
    for step in range(10, 80, 10):
        trainer.global_step = step
        monitor.on_train_batch_end(trainer, module, None, None, step)
    # step 10 is in the warm-up (not judged); 20 under the init, 30 over it; 40, 50, 60 under: the event at 60
    # (its CSV step 59), 53.0 - 58.5
    event, = [e for e in read_events(tmp_path / "events.jsonl") if e["kind"] == "collapse"]
    assert (event["sign"], event["step"], event["value"]) == ("knn_over_init", 59, -5.5)
    state = monitor.state_dict()
    again = KNNMonitor(10, alarm=CollapseAlarm(3, (KNN_OVER_INIT,)))
    again.load_state_dict(state)
    assert again.init_top1 == 58.5 and again.alarm.fired == {"knn_over_init"}


def test_batch_effective_rank_is_the_spectrum_modules_measure():
    g = torch.Generator().manual_seed(0)
    for x in (torch.randn(64, 32, generator=g), torch.randn(64, 3, generator=g) @ torch.randn(3, 32, generator=g),
              torch.randn(64, 32, generator=g) * torch.logspace(0, -4, 32)):
        assert int(batch_effective_rank(x)) == effective_rank(x)
    assert float(batch_effective_rank(torch.ones(8, 4))) == 0.0


def test_step_instruments_write_one_collapse_event_and_line_with_the_methods_remedy(tmp_path, capsys):
    from selfsup.instruments import StepInstruments

    trainer = SimpleNamespace(is_global_zero=True, loggers=[], global_step=0, default_root_dir=str(tmp_path))
    module = SimpleNamespace(family="joint", collapse_remedy="keep method.std_coeff > 0", warmup_steps=lambda: 0)
    cb = StepInstruments(every_n_steps=1, alarm=CollapseAlarm(window=2, signs=collapse_signs()))
    g = torch.Generator().manual_seed(0)
    for step in range(6):  # full-rank features, then every row the same direction (rank 1)
        trainer.global_step = step + 1
        h = torch.randn(32, 16, generator=g) if step < 2 else torch.randn(32, 1, generator=g) * torch.ones(1, 16)
        cb.on_train_batch_end(trainer, module, {"loss": torch.tensor(0.0), "step": StepOutput(
            torch.tensor(0.0), embedding=h)}, None, step)
    events = read_events(tmp_path / "events.jsonl")
    assert [(e["kind"], e["step"], e["sign"], e["remedy"]) for e in events] == [
        ("collapse", 3, "eff_rank_batch", "keep method.std_coeff > 0")]
    assert events[0]["value"] < 0.25 and events[0]["baseline"] == 0.25
    lines = [line for line in capsys.readouterr().err.splitlines() if "collapse" in line]
    assert len(lines) == 1 and "at step 3: eff_rank_batch" in lines[0] and "try: keep method.std_coeff" in lines[0]
    assert cb.state_dict()["alarm"]["fired"] == ["eff_rank_batch"]


def test_every_ssl_method_names_its_remedies():
    from selfsup.methods import METHODS
    from selfsup.methods.base import TrainingBase

    for name, cls in METHODS.items():
        if cls.family == "joint":
            assert cls.collapse_remedy != TrainingBase.collapse_remedy, name


@pytest.mark.train
def test_the_alarm_fires_on_invariance_only_vicreg_and_the_report_shows_it_first(tmp_path, capsys):
    """VICReg with only its invariance term collapses by construction (vicreg-digits: kNN 37.9% against its
    init's 58.5%); at batch 64 its features' effective rank falls 10 → 2 within 20 steps."""
    from selfsup.commands.main import main

    run = tmp_path / "inv"
    assert main(["pretrain", "vicreg-digits", "method.std_coeff=0", "method.cov_coeff=0", "data.batch_size=64",
                 "trainer.max_steps=30", "optim.warmup_epochs=0", "instruments.every_n_steps=2",
                 "instruments.collapse_window=3", "instruments.rank_every_n_steps=0", "instruments.gradients=false",
                 "trainer.progress_bar=false", f"output_dir={tmp_path}", "name=inv"]) == 0
    events = [e for e in read_events(run / "events.jsonl") if e["kind"] == "collapse"]
    assert [e["sign"] for e in events] == ["eff_rank_batch", "knn_over_init"]  # and it ends under its init
    assert "selfsup: collapse at step" in capsys.readouterr().err
    assert main(["report", str(run)]) == 0
    md = (run / "report" / "report.md").read_text()
    assert md.index("## Collapse") < md.index("## The run")
    assert "method.std_coeff and method.cov_coeff > 0" in md


@pytest.mark.parametrize("override", ["instruments.collapse_window=0", "instruments.collapse_rank_fraction=1.5"])
def test_alarm_config_errors(override):
    from selfsup.config import load_run_config
    from selfsup.errors import UserError

    with pytest.raises(UserError, match=override.split("=")[0]):
        load_run_config("vicreg-digits", [override])


def test_the_alarm_benchmarks_cases_resolve_and_an_unknown_one_is_one_line(capsys):
    """benchmarks/collapse_alarm.py: each collapse-by-construction case's overrides are valid keys of its preset,
    and ``--only`` naming no case exits 2 before any training."""
    import benchmarks.collapse_alarm as bench
    from selfsup.config import load_run_config

    for name, (preset, overrides) in bench.COLLAPSES.items():
        assert load_run_config(preset, overrides).instruments.collapse_alarm, name
    for preset in bench.HEALTHY:
        load_run_config(preset, [])
    assert bench.main(["--only", "nothing", "--out", "/nonexistent/x.json"]) == 2
    assert "no such case" in capsys.readouterr().err


def test_the_ijepa_target_spread_names_every_recorded_collapse_and_no_other_run():
    """The digits runs of benchmarks/results/ijepa_collapse_series.json, labelled by their loss (collapsed: the last
    under 1% of the first), replayed through the alarm as each run would have raised it (after its warm-up)."""
    import json
    from pathlib import Path

    runs = json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "results" /
                       "ijepa_collapse_series.json").read_text())["runs"]
    assert sum(r["collapsed"] for r in runs) >= 8 and sum(not r["collapsed"] for r in runs) >= 2
    for r in runs:
        series = {name: [tuple(p) for p in points] for name, points in r["series"].items()}
        fired = CollapseAlarm(5, collapse_signs()).replay(series, warmup_steps=r["warmup_steps"])
        assert ("ijepa_target_std" in {e["sign"] for e in fired}) == r["collapsed"], r["run"]


def test_the_scan_judges_a_finished_runs_knn_with_the_runs_own_noise_band(tmp_path):
    """``--scan``'s end-of-run rule is ``runs.learning.knn_verdict``: a 2-point drop on 100 test images is noise (no
    event), a 30-point drop is past the band (a ``knn_over_init`` event at −band)."""
    import json

    import yaml

    import benchmarks.collapse_alarm as bench
    from selfsup.runs.learning import knn_noise_band

    for name, top1 in (("small", 48.0), ("large", 20.0)):
        run = tmp_path / name
        run.mkdir()
        (run / "config.yaml").write_text(yaml.safe_dump({"method": {"name": "simclr"}, "optim": {"warmup_epochs": 0},
                                                          "instruments": {}}))
        (run / "run.json").write_text(json.dumps({"status": "finished", "global_step": 10, "epochs": 1}))
        (run / "metrics.csv").write_text("step\n")
        knn = {"pretrained": {"top1": top1}, "random_init": {"top1": 50.0}, "test_size": 100}
        (run / "knn.json").write_text(json.dumps(knn))
    rows = {r["name"]: r for r in bench.scan(tmp_path)}
    assert not rows["small"]["fired"]
    (event,) = rows["large"]["replayed"]
    band = knn_noise_band({"pretrained": {"top1": 20.0}, "random_init": {"top1": 50.0}, "test_size": 100})
    assert event["sign"] == "knn_over_init" and event["value"] == -30.0 and event["baseline"] == -band
