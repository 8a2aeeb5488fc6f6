"""The embedding-norm wing's claims (1, 3 with its DINO half, 4, 5, 6, 7) in quick mode on tiny settings, and their
helpers by hand."""

from __future__ import annotations

import pytest

from selfsup.claims.registry import CLAIMS
from selfsup.claims.suite import plot_result
from ssl_helpers import quick_claim

TINY = ["trainer.limit_train_batches=3", "data.batch_size=32", "instruments.rank_every_n_steps=1",
        "instruments.rank_samples=64", "instruments.every_n_steps=1", "eval.knn_every_n_steps=0"]
OURS = ["norms-grow", "norm-ood-held-out", "cut-init-speedup", "gradscale-imbalanced", "rank-grows-when-norms-stop",
        "norm-effect-adam", "cut-init-hurts-dino"]


def test_the_wing_s_claims_are_registered_after_claim_2():
    from selfsup.claims import embedding_norms

    ids = [c.id for c in embedding_norms.CLAIMS]
    assert ids[0] == "norm-convergence-quadratic" and set(OURS) <= set(ids)
    for claim_id in OURS:
        c = CLAIMS[claim_id]
        assert c.seed.startswith("001") and c.statement and c.paper and c.rules and c.why_different


def test_speed_up_and_curve_helpers_by_hand(tmp_path):
    from selfsup.claims.embedding_norms import _steps_to, plateau_step, rank_start_step, speedup

    curve = [(0, 5.0), (1, 4.0), (2, 3.0), (3, 2.0), (4, 1.0)]
    assert _steps_to(curve, 3.0, window=1) == 2 and _steps_to(curve, 3.5, window=2) == 2  # (4 + 3) / 2 = 3.5
    assert _steps_to(curve, 0.5, window=1) is None
    assert plateau_step([[0, 1.0], [10, 9.6], [20, 10.0], [30, 9.0]]) == 10  # 9.6 >= 0.95 * 10
    assert rank_start_step([[0, 50.0], [10, 20.0], [20, 20.0], [30, 40.0]]) == 20
    for name, values in (("base", [6.0, 5.0, 4.0, 3.0, 2.0, 1.0]), ("fast", [6.0, 3.0, 2.0, 1.0, 1.0, 1.0]),
                         ("stuck", [6.0] * 6)):
        (tmp_path / name).mkdir()
        rows = "\n".join(f"{i},{v}" for i, v in enumerate(values))
        (tmp_path / name / "metrics.csv").write_text(f"step,train/loss\n{rows}\n")
    # the threshold: base's mean of its values up to halfway, (6 + 5 + 4) / 3 = 5; base's trailing moving average
    # reaches it at step 2 (6, 5.5, 5.0), fast's at step 1 ((6 + 3) / 2 = 4.5): speed-up (2 + 1) / (1 + 1)
    up, steps_base, steps_fast = speedup(tmp_path / "base", tmp_path / "fast")
    assert (steps_base, steps_fast) == (2, 1) and up == pytest.approx(1.5)
    up, _, never = speedup(tmp_path / "base", tmp_path / "stuck")
    assert never is None and up == pytest.approx(3 / 7)  # never: its 6 steps + 1


@pytest.mark.parametrize("claim_id", OURS)
def test_each_claim_runs_in_quick_mode(claim_id, tmp_path):
    result = quick_claim(claim_id, tmp_path, TINY)
    assert all(len(v) == 1 for v in result["metrics"].values())
    plot_result(result, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 5000


def test_cut_init_byol_moco_claim_pairs_each_method_with_its_cut(tmp_path):
    """The rebuttal's BYOL / MoCo v3 result: per seed the cut and the default run of each method, same seed, the
    gain their kNN difference; BYOL on the BN ConvNet, MoCo v3 on the micro ViT."""
    import json

    import yaml

    assert CLAIMS["cut-init-helps-byol-moco-v3"].seed.startswith("001")
    result = quick_claim("cut-init-helps-byol-moco-v3", tmp_path, [*TINY, "trainer.limit_train_batches=1"])
    m = result["metrics"]
    for method, backbone in (("byol", "bn_cnn_micro"), ("moco_v3", "vit_micro")):
        assert m[f"knn_gain_{method}"] == [m[f"{method}_cut"][0] - m[f"{method}_default"][0]]
        for arm, cut in (("cut", 3.0), ("default", 1.0)):
            run = tmp_path / f"{method}_{arm}-s0"
            cfg = yaml.safe_load((run / "config.yaml").read_text())
            assert cfg["model"]["backbone"] == backbone and float(cfg["interventions"]["cut_init"]) == cut
            assert cfg["trainer"]["seed"] == 0
            assert json.loads((run / "knn.json").read_text())["pretrained"]["top1"] == m[f"{method}_{arm}"][0]
    assert {s["rule"] for s in result["statistics"]} == {"knn_gain_byol > 0", "knn_gain_moco_v3 > 0"}
    assert [s["paper_effect"] for s in result["statistics"]] == [28.0, 4.0]
