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
        "norm-effect-adam", "cut-init-hurts-dino", "norms-grow-swav-wmse-nnclr", "cut-init-speedup-swav-wmse-nnclr"]


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


@pytest.mark.train
@pytest.mark.parametrize("claim_id", OURS)
def test_each_claim_runs_in_quick_mode(claim_id, tmp_path):
    # W-MSE whitens sub-batches of 128 > its 64 dimensions: the presets' batch of 256, one batch an epoch
    tiny = [*TINY, "data.batch_size=256", "trainer.limit_train_batches=1"] if "wmse" in claim_id else TINY
    result = quick_claim(claim_id, tmp_path, tiny)
    assert all(len(v) == 1 for v in result["metrics"].values())
    plot_result(result, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 5000


@pytest.mark.train
def test_cut_init_byol_moco_claim_pairs_each_method_with_its_cut(tmp_path, monkeypatch):
    """The rebuttal's BYOL / MoCo v3 result: per seed the cut and the default run of each method, same seed, the
    gain their kNN difference; BYOL on the BN ConvNet and digits, MoCo v3 on the micro ViT and Fashion-MNIST (here
    IDX files written by the test), each rule's accuracies with the test images of its own split."""
    import json

    import yaml

    from idx_files import fake_fashion
    from selfsup.claims import embedding_norms

    fake_fashion(tmp_path, n_train=64, n_test=16)
    preset, extra = embedding_norms.CUT_ARMS["moco_v3"]
    assert preset == "moco-v3-vit-fmnist" and "trainer.limit_train_batches=100" in extra  # 100 steps
    monkeypatch.setitem(embedding_norms.CUT_ARMS, "moco_v3", (preset, [*extra, f"data.root={tmp_path}"]))
    assert CLAIMS["cut-init-helps-byol-moco-v3"].seed.startswith("001")
    said = []
    from selfsup.claims.suite import Context, run_claim

    result = run_claim(CLAIMS["cut-init-helps-byol-moco-v3"],
                       Context(quick=True, seeds=1, work=tmp_path, progress=said.append,
                               overrides=[*TINY, "trainer.limit_train_batches=1"]))
    m = result["metrics"]
    for method, backbone, data in (("byol", "bn_cnn_micro", "digits"), ("moco_v3", "vit_micro", "fashion-mnist")):
        assert m[f"knn_gain_{method}"] == [m[f"{method}_cut"][0] - m[f"{method}_default"][0]]
        for arm, cut in (("cut", 3.0), ("default", 1.0)):
            run = tmp_path / f"{method}_{arm}-s0"
            cfg = yaml.safe_load((run / "config.yaml").read_text())
            assert cfg["model"]["backbone"] == backbone and float(cfg["interventions"]["cut_init"]) == cut
            assert cfg["trainer"]["seed"] == 0 and cfg["data"]["name"] == data
            assert json.loads((run / "knn.json").read_text())["pretrained"]["top1"] == m[f"{method}_{arm}"][0]
    assert {s["rule"] for s in result["statistics"]} == {"knn_gain_byol > 0", "knn_gain_moco_v3 > 0"}
    assert [s["paper_effect"] for s in result["statistics"]] == [28.0, 4.0]
    assert [s["test_images"] for s in result["statistics"]] == [359, 10_000]  # the declared splits
    # the runs read 16 fake test images, not the 10,000 declared: the result records it and the run says so
    assert result["knn_test_images"] == [16, 359] and any("not the declared" in line for line in said)


@pytest.mark.train
def test_the_norm_claims_share_their_default_runs_in_one_process(tmp_path, monkeypatch):
    """norms-grow, cut-init-speedup and rank-grows-when-norms-stop measure the same default SimCLR run per seed:
    trained once, reused by the later claims of the process (a seeded run is reproducible)."""
    from selfsup.claims import suite
    from selfsup.claims.suite import Context, run_claim

    monkeypatch.setattr(suite, "_SHARED_RUNS", {})  # a fresh process's

    ctx = {cid: Context(quick=True, seeds=1, work=tmp_path / cid, overrides=list(TINY), progress=lambda m: None)
           for cid in ("norms-grow", "cut-init-speedup", "rank-grows-when-norms-stop")}
    first = run_claim(CLAIMS["norms-grow"], ctx["norms-grow"])
    second = run_claim(CLAIMS["cut-init-speedup"], ctx["cut-init-speedup"])
    third = run_claim(CLAIMS["rank-grows-when-norms-stop"], ctx["rank-grows-when-norms-stop"])
    assert [r["name"] for r in first["runs"]] == ["simclr-default-s0", "simsiam-default-s0"]
    assert not any(r.get("shared") for r in first["runs"])
    shared = [r["name"] for r in second["runs"] if r.get("shared")]
    assert shared == ["simclr-default-s0", "simsiam-default-s0"]  # the cut runs are its own
    assert [r for r in third["runs"] if not r.get("shared")] == []
    assert not (tmp_path / "cut-init-speedup" / "simclr-cut-default-s0").exists()
    # the growth cut-init-speedup reports for its defaults is norms-grow's, from the same runs
    assert second["metrics"]["growth_simclr"] == first["metrics"]["growth_simclr"]


def test_the_rebuttal_s_answer_runs_swav_wmse_nnclr_on_the_simclr_setup():
    """Issue 24 item 5: the presets of the answer's claims change only the method against simclr-cnn-digits."""
    from selfsup.claims.embedding_norms import LOSS_SIDE, NORM_PRESETS, OTHER_METHODS
    from selfsup.config import load_run_config

    simclr = load_run_config("simclr-cnn-digits", [])
    for method in OTHER_METHODS:
        cfg = load_run_config(NORM_PRESETS[method], [])
        assert type(cfg.method).__module__ == f"selfsup.methods.{method}"
        assert cfg.model.backbone == simclr.model.backbone == "bn_cnn_micro"
        assert (cfg.optim.name, cfg.optim.base_lr, cfg.optim.momentum, cfg.optim.weight_decay) == \
            (simclr.optim.name, simclr.optim.base_lr, simclr.optim.momentum, simclr.optim.weight_decay)
        assert cfg.data.batch_size == simclr.data.batch_size and cfg.trainer.max_epochs == 200  # 1,000 steps
        assert LOSS_SIDE[method] in ("projection", "prediction")
    c = CLAIMS["norms-grow-swav-wmse-nnclr"]
    assert [str(r) for r in c.rules] == ["growth_swav > 2", "growth_wmse > 2", "growth_nnclr > 2"]
    assert [str(r) for r in CLAIMS["cut-init-speedup-swav-wmse-nnclr"].rules] == [
        "speedup_swav > 1", "speedup_wmse > 1", "speedup_nnclr > 1"]
