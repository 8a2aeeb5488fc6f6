"""Claim 8 (Barlow Twins / VICReg with normalised embeddings): the quick mode on tiny settings, and its rule."""

from __future__ import annotations

import math

from selfsup.claims.embedding_norms import COLLAPSE_SHARE
from selfsup.claims.registry import CLAIMS
from selfsup.claims.suite import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Context, plot_result, run_claim, verdict
import pytest

TINY = ["trainer.limit_train_batches=2", "data.batch_size=32", "trainer.log_every_n_steps=1",
        "method.proj_hidden_dim=32", "method.dim=32"]
CLAIM = CLAIMS["normalized-redundancy-collapse"]


def test_rule_is_collapse_of_both_methods_stated_before_the_run():
    assert {str(r) for r in CLAIM.rules} == {f"barlow_twins_gain_kept < {COLLAPSE_SHARE:g}",
                                             f"vicreg_gain_kept < {COLLAPSE_SHARE:g}"}
    collapsed = {"barlow_twins_gain_kept": [0.1, 0.12, 0.08], "vicreg_gain_kept": [0.0, 0.01, 0.02]}
    kept = [0.9, 0.85, 0.95]
    assert verdict(CLAIM.rules, collapsed) == REPRODUCED
    assert verdict(CLAIM.rules, {**collapsed, "vicreg_gain_kept": kept}) == NOT_REPRODUCED
    assert verdict(CLAIM.rules, {**collapsed, "vicreg_gain_kept": [0.1, math.nan, 0.1]}) == INCONCLUSIVE
    assert verdict(CLAIM.rules, {"barlow_twins_gain_kept": [0.1], "vicreg_gain_kept": [0.0]}) == INCONCLUSIVE  # 1 seed


@pytest.mark.train
def test_quick_mode_runs_four_pretrainings_and_judges_them(tmp_path):
    result = run_claim(CLAIM, Context(quick=True, seeds=1, work=tmp_path, overrides=TINY, progress=lambda m: None))
    m = result["metrics"]
    assert result["verdict"] == verdict(CLAIM.rules, m)
    for method in ("barlow_twins", "vicreg"):
        plain, normed, floor = (m[f"{method}_knn_{k}"][0] for k in ("plain", "normalised", "random_init"))
        gain = plain - floor
        assert math.isnan(m[f"{method}_gain_kept"][0]) if gain < 1.0 else \
            math.isclose(m[f"{method}_gain_kept"][0], (normed - floor) / gain)
        assert m[f"{method}_rankme_ratio"][0] > 0
        assert set(result["series"]) >= {f"{method} plain", f"{method} normalised"}
    assert len(list(tmp_path.iterdir())) == 4
    plot_result(result, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 5000
