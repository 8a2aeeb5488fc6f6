"""The claim gram-anchoring-keeps-dense-features (issue 65 part 3): its arms differ by the Gram term only, its Gram
phase is dinov3-fmnist's in proportion to the run, and its dense score comes from one function that reads
``runs.evaluate.run_segment`` (seg65's ``selfsup eval segment``) where it exists, undefined otherwise."""

from __future__ import annotations

import math

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


def test_the_dense_score_is_undefined_without_the_segment_eval_and_read_from_it_with(monkeypatch, tmp_path):
    monkeypatch.delattr(gram_anchoring.evaluate, "run_segment", raising=False)
    assert math.isnan(gram_anchoring.dense_miou(tmp_path))
    seen = []
    monkeypatch.setattr(gram_anchoring.evaluate, "run_segment",
                        lambda run, dataset: seen.append((run, dataset)) or {"linear_miou": 41.5, "knn": 3.0},
                        raising=False)
    assert gram_anchoring.dense_miou(tmp_path) == 41.5 and seen == [(tmp_path, "fashion-mnist")]


@pytest.mark.train
def test_the_quick_claim_trains_both_arms_and_judges_the_knn_without_a_dense_score(tmp_path, monkeypatch):
    from idx_files import fashion_overrides
    from ssl_helpers import quick_claim

    monkeypatch.delattr(gram_anchoring.evaluate, "run_segment", raising=False)
    claim = "gram-anchoring-keeps-dense-features"
    tiny = ["trainer.limit_train_batches=2", "data.batch_size=32", "eval.knn_every_n_steps=0",
            "method.out_dim=32", "method.ibot_out_dim=32", "method.hidden_dim=32", "method.bottleneck_dim=16",
            "method.ibot_hidden_dim=32", "method.ibot_bottleneck_dim=16"]
    result = quick_claim(claim, tmp_path, [*tiny, *fashion_overrides(claim, tmp_path / "fmnist")])
    assert [r["name"] for r in result["runs"]] == ["gram-s0", "no_gram-s0"]
    assert all(len(v) == 1 for v in result["metrics"].values()) and math.isnan(result["metrics"]["miou_gain"][0])
    assert result["verdict"] == INCONCLUSIVE and "undefined" in result["statistics"][0]["why"]
    runs = {r["name"]: load_run_config(str(tmp_path / r["name"] / "config.yaml")).method for r in result["runs"]}
    assert runs["gram-s0"].gram_use_loss and not runs["no_gram-s0"].gram_use_loss
    assert runs["gram-s0"] == type(runs["gram-s0"])(**{**vars(runs["no_gram-s0"]), "gram_use_loss": True})
