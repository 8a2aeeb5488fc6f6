"""SwAV: the step's pieces against main_swav.py's order (prototypes renormalised before the forward, codes of the
global crops only, the queue used once full and filled after the scores, prototypes frozen with grad = None),
LARC against apex's formula, the collapse signs, and one-line config errors."""

from __future__ import annotations

import types

import torch
import torch.nn.functional as F

from selfsup.losses import sinkhorn_knopp, swav_loss
from selfsup.optim import LARC
from ssl_helpers import MULTICROP, raises_user_error, tiny_config, tiny_method


def views(batch=8, seed=0, local=2):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, 1, 8, 8, generator=g) for _ in range(2)] + [
        torch.randn(batch, 1, 4, 4, generator=g) for _ in range(local)]


def swav(**extra):
    return tiny_method("swav", extra, augment=MULTICROP, data={"batch_size": 8}).train()


def test_prototypes_renormalised_before_the_forward_and_loss_from_global_codes():
    m = swav()
    with torch.no_grad():
        m.prototypes.weight.mul_(3.0)
    v = views()
    out = m.forward_views(v)
    torch.testing.assert_close(m.prototypes.weight.norm(dim=1), torch.ones(24))
    # an independent recomputation: codes from crops 0 and 1 only, every other crop predicted
    with torch.no_grad():
        feats = [m.backbone(torch.cat(v[:2])), m.backbone(torch.cat(v[2:]))]
        z = F.normalize(m.projector(torch.cat(feats)), dim=1)
        scores = list((z @ m.prototypes.weight.t()).chunk(4))
        codes = [sinkhorn_knopp(scores[s], 0.05, 3) for s in (0, 1)]
        expected = swav_loss(scores, codes, (0, 1), 0.1)
    torch.testing.assert_close(out.loss.detach(), expected)
    assert set(out.instruments) == {"swav_code_entropy", "swav_code_entropy_over_log_k", "swav_prototype_usage",
                                    "swav_loss_over_log_k"}
    assert 0 < out.instruments["swav_prototype_usage"] <= 1


def test_queue_used_only_once_full_and_filled_after_the_scores(monkeypatch):
    import selfsup.methods.swav as swav_module

    m = swav(queue_length=16, epoch_queue_starts=0)  # 2 batches of 8
    assert m.queue.shape == (2, 16, 16)
    seen = []
    real = swav_module.sinkhorn_knopp
    monkeypatch.setattr(swav_module, "sinkhorn_knopp", lambda s, *a, **k: seen.append(s.shape[0]) or real(s, *a, **k))
    m.forward_views(views(seed=0))
    m.forward_views(views(seed=1))
    assert seen == [8, 8, 8, 8] and int(m.queue_rows) == 16  # not used before it is full
    queue_before = m.queue.clone()
    m.forward_views(views(seed=2))
    assert seen[4:] == [24, 24]  # the 16 queue rows prepended to the 8 of the batch
    # the newest batch went in front after its scores; the oldest fell out
    torch.testing.assert_close(m.queue[:, 8:], queue_before[:, :8])
    assert not torch.equal(m.queue[:, :8], queue_before[:, :8])


def test_queue_codes_are_sinkhorn_over_queue_and_batch():
    m = swav(queue_length=8, epoch_queue_starts=0)
    m.forward_views(views(seed=0))  # fills the queue
    with torch.no_grad():
        m.normalize_prototypes()
        queue = m.queue.clone()
        z = F.normalize(torch.randn(8, 16), dim=1)
        scores = z @ m.prototypes.weight.t()
        expected = sinkhorn_knopp(torch.cat([queue[0] @ m.prototypes.weight.t(), scores]), 0.05, 3)[-8:]
        torch.testing.assert_close(m.codes(0, scores, z), expected)


def test_no_queue_before_its_epoch():
    m = swav(queue_length=8, epoch_queue_starts=15)
    m.forward_views(views())
    assert int(m.queue_rows) == 0 and not m.queue.any()


def test_prototypes_frozen_with_grad_none_for_the_first_iterations():
    m = swav(freeze_prototypes_niters=3)
    m.forward_views(views()).loss.backward()
    assert m.prototypes.weight.grad is not None
    m._trainer = types.SimpleNamespace(global_step=2)
    m.on_before_optimizer_step(None)
    assert m.prototypes.weight.grad is None and m.projector[0].weight.grad is not None
    m.forward_views(views()).loss.backward()
    m._trainer = types.SimpleNamespace(global_step=3)
    m.on_before_optimizer_step(None)
    assert m.prototypes.weight.grad is not None
    m._trainer = None


def test_larc_matches_apex_formula_and_skips_zero_norms():
    p = torch.nn.Parameter(torch.tensor([[3.0, 4.0]]))  # ‖p‖ = 5
    b = torch.nn.Parameter(torch.zeros(2))  # ‖p‖ = 0: raw gradient, no decay
    opt = LARC([{"params": [p, b], "weight_decay": 0.1}], lr=0.5, momentum=0.9, trust_coefficient=0.01)
    p.grad, b.grad = torch.tensor([[0.6, 0.8]]), torch.tensor([1.0, -2.0])  # ‖g‖ = 1
    opt.step()
    a = 0.01 * 5 / (1 + 0.1 * 5 + 1e-8)
    g = (torch.tensor([[0.6, 0.8]]) + 0.1 * torch.tensor([[3.0, 4.0]])) * a
    torch.testing.assert_close(p.detach(), torch.tensor([[3.0, 4.0]]) - 0.5 * g)
    torch.testing.assert_close(b.detach(), -0.5 * torch.tensor([1.0, -2.0]))
    p0 = p.detach().clone()
    p.grad, b.grad = torch.tensor([[0.6, 0.8]]), torch.tensor([1.0, -2.0])
    opt.step()  # momentum: μ ← 0.9 μ + g'
    a2 = 0.01 * p0.norm() / (1 + 0.1 * p0.norm() + 1e-8)
    g2 = (torch.tensor([[0.6, 0.8]]) + 0.1 * p0) * a2
    torch.testing.assert_close(p.detach(), p0 - 0.5 * (0.9 * g + g2))


def test_larc_adapts_biases_and_norms_too():
    from selfsup.optim import OptimConfig, build_optimizer, param_groups

    m = swav()
    opt = build_optimizer(param_groups(m.trainable(), OptimConfig(name="larc", weight_decay=1e-6)),
                          OptimConfig(name="larc"))
    assert isinstance(opt, LARC) and all(g["weight_decay"] == 1e-6 for g in opt.param_groups)
    n = sum(p.numel() for g in opt.param_groups for p in g["params"])
    assert n == sum(p.numel() for p in m.parameters() if p.requires_grad)


def test_config_errors_are_one_line():
    with raises_user_error("method.crops_for_assign", "[0, 1]"):
        tiny_method("swav", {"crops_for_assign": [0, 5]}, augment=MULTICROP)
    with raises_user_error("method.queue_length", "data.batch_size"):
        tiny_method("swav", {"queue_length": 8}, augment=MULTICROP)  # below the batch of 16
    with raises_user_error("method.epsilon"):
        tiny_config("swav", {"epsilon": 0})


def test_the_floor_sweep_variants_resolve_and_an_unknown_one_is_one_line(capsys):
    """benchmarks/floor_sweep.py: every variant's overrides are valid keys of its preset (a typo would only
    surface an hour into the sweep), and ``--only`` naming no variant exits 2 before any training."""
    from pathlib import Path

    import benchmarks.floor_sweep as sweep
    from selfsup.config import load_run_config

    for name, (preset, overrides) in sweep.VARIANTS.items():
        cfg = load_run_config(preset, sweep.engine_overrides(Path("/tmp"), name, 2) + overrides)
        assert cfg.trainer.max_epochs == 2 and cfg.trainer.seed == 0
    assert sweep.main(["--only", "S9", "--out", "/nonexistent/x.json"]) == 2
    assert "no such variant" in capsys.readouterr().err


def test_the_floor_sweep_keeps_a_variant_that_collapsed(tmp_path, monkeypatch, capsys):
    """A variant whose run stops itself (W-MSE's whitening failing: ``TrainingCollapsed``) is recorded by the sweep
    with the step it stopped at, its reason and the curves it logged, and no score; the other variants go on."""
    import json

    import pytest

    import benchmarks.floor_sweep as sweep
    from selfsup.methods.base import TrainingCollapsed

    def collapsing(run, preset, overrides):
        run.mkdir(parents=True)
        (run / "metrics.csv").write_text("step,train/loss,instruments/wmse_cov_condition\n9,1.8,\n10,,3.5e5\n"
                                         "19,1.7,\n")
        (run / "run.json").write_text(json.dumps({"status": "collapsed", "stopped_at_step": 19, "reason":
                                                  "W-MSE's whitening failed at step 19: not positive definite; try"}))
        raise TrainingCollapsed("W-MSE's whitening failed at step 19")

    monkeypatch.setattr(sweep, "train_variant", collapsing)
    monkeypatch.setattr(sweep, "knn_10k", lambda run: pytest.fail("a stopped run has no backbone to score"))
    out = tmp_path / "sweep.json"
    assert sweep.main(["--only", "W12_crop0.3", "--epochs", "5", "--seed", "100", "--runs", str(tmp_path / "runs"),
                       "--out", str(out)]) == 0
    (v,) = json.loads(out.read_text())["variants"]
    assert v["name"] == "W12_crop0.3" and v["stopped_at_step"] == 19 and v["gain_val"] is None
    assert v["stopped_by"] == "collapsed: W-MSE's whitening failed at step 19: not positive definite"
    assert v["loss"] == [[9, 1.8], [19, 1.7]] and v["wmse_cov_condition"] == [[10, 350000.0]]
    assert '"stopped_at_step": 19' in capsys.readouterr().out
