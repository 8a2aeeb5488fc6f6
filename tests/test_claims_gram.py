"""The claim gram-anchoring-keeps-dense-features (issue 65 part 3): its arms differ by the Gram term only, its Gram
phase is dinov3-fmnist's in proportion to the run, and its dense score comes from one function: ``selfsup eval
segment``'s linear protocol on the fmnist-canvas task, from the run's own Fashion-MNIST files."""

from __future__ import annotations

import pytest

from selfsup.claims import gram_anchoring
from selfsup.claims.suite import INCONCLUSIVE
from selfsup.config import load_run_config


def test_the_claims_gram_phase_at_5_epochs_is_the_presets():
    cfg = load_run_config(gram_anchoring.PRESET, gram_anchoring.gram_phase(5))
    preset = load_run_config(gram_anchoring.PRESET)
    assert cfg.method == preset.method and cfg.trainer.max_epochs == preset.trainer.max_epochs == 5
    longer = load_run_config(gram_anchoring.PRESET, gram_anchoring.gram_phase(30)).method
    assert (longer.gram_it_load_ema_teacher, longer.gram_it_first_update, longer.gram_update_frequency) == (21, 24, 3)
    assert tuple(longer.gram_loss_weight_schedule) == (0, 0, 2, 21, 1.5)


def test_the_dense_score_is_the_linear_miou_of_the_canvas_task_from_the_runs_files(monkeypatch, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(f"method: {{name: dinov3}}\ndata: {{name: fashion-mnist, root: {tmp_path}}}\n")
    seen = []
    monkeypatch.setattr(gram_anchoring.evaluate, "run_segment",
                        lambda run, cfg: seen.append((run, cfg)) or {"linear": {"miou": 41.5}, "knn": {"miou": 3.0}})
    assert gram_anchoring.dense_miou(run) == 41.5
    ((where, cfg),) = seen
    assert where == run and (cfg.task, cfg.root, cfg.protocols) == ("fmnist-canvas", str(tmp_path), ("linear",))


@pytest.mark.train
def test_the_quick_claim_trains_both_arms_and_judges_both_rules(tmp_path, monkeypatch):
    """The dense evaluation is stubbed (its own tests are in test_eval_segment.py): a fixed mIoU per arm."""
    from idx_files import fashion_overrides
    from ssl_helpers import quick_claim

    monkeypatch.setattr(gram_anchoring.evaluate, "run_segment",
                        lambda run, cfg: {"linear": {"miou": 42.0 if "no_gram" in str(run) else 43.0}})
    claim = "gram-anchoring-keeps-dense-features"
    tiny = ["trainer.limit_train_batches=2", "data.batch_size=32", "eval.knn_every_n_steps=0",
            "method.out_dim=32", "method.ibot_out_dim=32", "method.hidden_dim=32", "method.bottleneck_dim=16",
            "method.ibot_hidden_dim=32", "method.ibot_bottleneck_dim=16"]
    result = quick_claim(claim, tmp_path, [*tiny, *fashion_overrides(claim, tmp_path / "fmnist")])
    assert [r["name"] for r in result["runs"]] == ["gram-s0", "no_gram-s0"]
    assert all(len(v) == 1 for v in result["metrics"].values()) and result["metrics"]["miou_gain"] == [1.0]
    assert result["verdict"] == INCONCLUSIVE  # one seed: no interval
    runs = {r["name"]: load_run_config(str(tmp_path / r["name"] / "config.yaml")).method for r in result["runs"]}
    assert runs["gram-s0"].gram_use_loss and not runs["no_gram-s0"].gram_use_loss
    assert runs["gram-s0"] == type(runs["gram-s0"])(**{**vars(runs["no_gram-s0"]), "gram_use_loss": True})
