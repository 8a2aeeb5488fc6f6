"""Barlow Twins and VICReg: each loss term by hand and against an independent reference, the heads and
optimiser groups of the official code, the step, exact resume, and the CLI presets."""

from __future__ import annotations

import csv

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import selfsup.engine as engine
from selfsup.config import load_run_config
from selfsup.errors import UserError
from selfsup.losses import (barlow_twins_loss, barlow_twins_terms, batch_standardize, cross_correlation,
                            off_diagonal, vicreg_loss, vicreg_terms)
from selfsup.methods.barlow_twins import BarlowTwins
from selfsup.methods.vicreg import VICReg
from ssl_helpers import filled_tensors, random_views, tiny_config, tiny_method

NAMES = ("barlow_twins", "vicreg")

# --------------------------------------------------------------------------- Barlow Twins loss


def test_off_diagonal_lists_the_entries_off_the_diagonal_in_row_order():
    m = torch.arange(9.0).view(3, 3)
    assert off_diagonal(m).tolist() == [1.0, 2.0, 3.0, 5.0, 6.0, 7.0]


def test_barlow_twins_terms_by_hand():
    # standardised (eps 0) these are already ±1 per dimension: C = a^T b / 2
    z1 = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    z2 = torch.tensor([[1.0, -1.0], [-1.0, 1.0]])
    c = cross_correlation(z1, z2, eps=0.0)
    torch.testing.assert_close(c, torch.tensor([[1.0, -1.0], [1.0, -1.0]]))
    on_diag, off_diag = barlow_twins_terms(c)
    assert on_diag.item() == pytest.approx((1 - 1) ** 2 + (1 - (-1)) ** 2)  # 4
    assert off_diag.item() == pytest.approx((-1) ** 2 + 1 ** 2)  # 2
    assert barlow_twins_loss(c, 0.5).item() == pytest.approx(4 + 0.5 * 2)


def test_barlow_twins_on_and_off_diagonal_terms_separately():
    c = torch.tensor([[0.5, 0.2, -0.1], [0.3, 1.0, 0.0], [0.0, -0.4, 2.0]])
    on_diag, off_diag = barlow_twins_terms(c)
    assert on_diag.item() == pytest.approx(0.5 ** 2 + 0 + 1.0 ** 2)
    assert off_diag.item() == pytest.approx(0.2 ** 2 + 0.1 ** 2 + 0.3 ** 2 + 0.4 ** 2)
    assert barlow_twins_loss(c, 0.0051).item() == pytest.approx(1.25 + 0.0051 * 0.30)


def test_cross_correlation_against_batchnorm_and_loops():
    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(12, 5, generator=g) * 3 + 1, torch.randn(12, 5, generator=g) * 0.5 - 2
    bn = nn.BatchNorm1d(5, affine=False).train()  # the official normalisation layer, training mode
    a, b = bn(z1), bn(z2)
    torch.testing.assert_close(batch_standardize(z1), a)
    expected = torch.zeros(5, 5)
    for i in range(5):
        for j in range(5):
            expected[i, j] = sum(a[n, i] * b[n, j] for n in range(12)) / 12
    c = cross_correlation(z1, z2)
    torch.testing.assert_close(c, expected)
    on = sum((1 - expected[i, i]) ** 2 for i in range(5))
    off = sum(expected[i, j] ** 2 for i in range(5) for j in range(5) if i != j)
    torch.testing.assert_close(barlow_twins_loss(c, 0.1), on + 0.1 * off)


def test_cross_correlation_shares_of_two_ranks_sum_to_the_whole_batch():
    """Each rank standardises with the global statistics and divides by the global N: the shares sum to C."""
    g = torch.Generator().manual_seed(1)
    z1, z2 = torch.randn(8, 4, generator=g), torch.randn(8, 4, generator=g)
    shares = [cross_correlation(z1[r * 4:(r + 1) * 4], z2[r * 4:(r + 1) * 4], all_z1=z1, all_z2=z2, batch_size=8)
              for r in range(2)]
    torch.testing.assert_close(shares[0] + shares[1], cross_correlation(z1, z2))
    # with local statistics (what a non-synchronised BN would give) the sum is not C
    local = [cross_correlation(z1[r * 4:(r + 1) * 4], z2[r * 4:(r + 1) * 4], batch_size=8) for r in range(2)]
    assert not torch.allclose(local[0] + local[1], cross_correlation(z1, z2), atol=1e-3)


# --------------------------------------------------------------------------- VICReg loss


def test_vicreg_terms_by_hand():
    z1 = torch.tensor([[0.0, 0.0], [2.0, 2.0]])
    z2 = torch.tensor([[1.0, 0.0], [1.0, 2.0]])
    invariance, variance, covariance = vicreg_terms(z1, z2)
    assert invariance.item() == pytest.approx((1 + 0 + 1 + 0) / 4)
    # z1: unbiased var 2 in both dims -> no hinge; z2: dim 0 constant -> relu(1 - sqrt(1e-4)), dim 1 var 2
    assert variance.item() == pytest.approx(0 / 2 + ((1 - 0.01) + 0) / 2 / 2)
    # z1 centred [[-1,-1],[1,1]]: Cov [[2,2],[2,2]] -> (2² + 2²) / D=2; z2 centred [[0,-1],[0,1]]: Cov off-diag 0
    assert covariance.item() == pytest.approx(8 / 2 + 0)
    assert vicreg_loss(z1, z2).item() == pytest.approx(25 * 0.5 + 25 * 0.2475 + 1 * 4)
    assert vicreg_loss(z1, z2, sim_coeff=1, std_coeff=2, cov_coeff=3).item() == pytest.approx(0.5 + 0.495 + 12)


def test_vicreg_terms_against_an_independent_reference():
    g = torch.Generator().manual_seed(2)
    z1, z2 = torch.randn(10, 6, generator=g) * 0.7, torch.randn(10, 6, generator=g) * 1.5
    invariance, variance, covariance = vicreg_terms(z1, z2, eps=1e-3)
    torch.testing.assert_close(invariance, ((z1 - z2) ** 2).sum() / 60)
    ref_var, ref_cov = 0.0, 0.0
    for z in (z1, z2):
        std = torch.tensor([z[:, j].std() for j in range(6)])  # torch.std: unbiased
        ref_var += torch.clamp(1 - torch.sqrt(std ** 2 + 1e-3), min=0).mean() / 2
        cov = torch.cov(z.T)  # unbiased, centred: an independent covariance
        ref_cov += (cov ** 2).sum() - (torch.diagonal(cov) ** 2).sum()
    torch.testing.assert_close(variance, ref_var)
    torch.testing.assert_close(covariance, ref_cov / 6)


def test_vicreg_invariance_is_local_and_the_regularisers_global():
    g = torch.Generator().manual_seed(3)
    z1, z2 = torch.randn(8, 4, generator=g), torch.randn(8, 4, generator=g)
    whole = vicreg_terms(z1, z2)
    parts = [vicreg_terms(z1[r * 4:(r + 1) * 4], z2[r * 4:(r + 1) * 4], all_z1=z1, all_z2=z2) for r in range(2)]
    for r in range(2):
        torch.testing.assert_close(parts[r][0], F.mse_loss(z1[r * 4:(r + 1) * 4], z2[r * 4:(r + 1) * 4]))
        torch.testing.assert_close(parts[r][1], whole[1])
        torch.testing.assert_close(parts[r][2], whole[2])
    torch.testing.assert_close((parts[0][0] + parts[1][0]) / 2, whole[0])


# --------------------------------------------------------------------------- the methods


@pytest.mark.parametrize("name", NAMES)
def test_forward_views_outputs_and_gradients(name):
    m = tiny_method(name)
    out = m.forward_views(random_views(8))
    assert set(filled_tensors(out)) == {"loss", "embedding", "embedding2", "projection"}
    assert out.loss.ndim == 0 and torch.isfinite(out.loss) and out.loss.requires_grad
    assert out.embedding.shape == (8, m.backbone.num_features) and out.projection.shape == (8, 32)
    assert not any(v.requires_grad for k, v in filled_tensors(out).items() if k != "loss")
    out.loss.backward()
    for n, p in m.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad).all(), n


def test_the_step_loss_is_the_pure_loss_of_its_projections():
    views = random_views(8, seed=4)
    bt, vic = tiny_method("barlow_twins"), tiny_method("vicreg")
    for m in (bt, vic):
        torch.manual_seed(0)
        loss = m.forward_views(views).loss
        h1, h2 = m.backbone(views[0]), m.backbone(views[1])
        z1, z2 = m.projector(h1), m.projector(h2)
        ref = (barlow_twins_loss(cross_correlation(z1, z2), 0.0051) if m is bt else vicreg_loss(z1, z2))
        torch.testing.assert_close(loss, ref)


def test_projectors_follow_the_official_layouts():
    bt = tiny_method("barlow_twins", {"proj_layers": 3})
    kinds = [type(m).__name__ for m in bt.projector]
    assert kinds == ["Linear", "BatchNorm1d", "ReLU", "Linear", "BatchNorm1d", "ReLU", "Linear"]
    assert all(m.bias is None for m in bt.projector if isinstance(m, nn.Linear))  # main.py:198, :201
    assert [m.out_features for m in bt.projector if isinstance(m, nn.Linear)] == [64, 64, 32]
    vic = tiny_method("vicreg", {"proj_layers": 3})
    linears = [m for m in vic.projector if isinstance(m, nn.Linear)]
    assert [m.bias is not None for m in linears] == [True, True, False]  # main_vicreg.py:227, :231
    assert type(vic.projector[-1]).__name__ == "Linear"  # no final BN
    for cls in (BarlowTwins, VICReg):
        c = cls.Config()
        assert (c.proj_hidden_dim, c.dim, c.proj_layers) == (8192, 8192, 3)
    assert BarlowTwins.Config().lambd == 0.0051
    v = VICReg.Config()
    assert (v.sim_coeff, v.std_coeff, v.cov_coeff, v.eps) == (25.0, 25.0, 1.0, 1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_normalize_embeddings_puts_unit_vectors_into_the_loss(name, monkeypatch):
    import selfsup.methods.barlow_twins as bt_module
    import selfsup.methods.vicreg as vic_module

    seen = []
    module, fn = (bt_module, "cross_correlation") if name == "barlow_twins" else (vic_module, "vicreg_loss")
    original = getattr(module, fn)
    monkeypatch.setattr(module, fn, lambda z1, z2, **kw: seen.append(z1.norm(dim=1)) or original(z1, z2, **kw))
    tiny_method(name).forward_views(random_views(8))
    tiny_method(name, {"normalize_embeddings": True}).forward_views(random_views(8))
    assert not torch.allclose(seen[0], torch.ones(8))
    torch.testing.assert_close(seen[1], torch.ones(8))


def test_barlow_twins_lars_groups_biases_and_bn_at_their_own_lr():
    cfg = tiny_config("barlow_twins", optim={"name": "lars", "base_lr": 0.2, "lr_1d_mult": 0.024,
                                              "weight_decay": 1e-6})
    from selfsup.methods.build import build_method
    from selfsup.methods import DataInfo

    m = build_method(cfg, DataInfo(1, 8, (0.5,), (0.25,)))
    opt = m.configure_optimizers()
    one_d = [g for g in opt.param_groups if g["lr_scale"] == pytest.approx(0.024)]
    rest = [g for g in opt.param_groups if g["lr_scale"] == 1.0]
    assert one_d and rest and len(one_d) + len(rest) == len(opt.param_groups)
    # LARS's exempt group (LightlyTrain's no-decay group): the ndim <= 1 tensors and, on this ViT, its class token
    assert all(p.ndim <= 1 or p is m.backbone.cls_token for g in one_d for p in g["params"])
    assert any(p is m.backbone.cls_token for g in one_d for p in g["params"])
    assert all(g.get("exclude") and g["weight_decay"] == 0.0 for g in one_d)
    assert all(p.ndim > 1 for g in rest for p in g["params"])
    projector_bn = {id(p) for mod in m.projector if isinstance(mod, nn.BatchNorm1d) for p in mod.parameters()}
    assert projector_bn <= {id(p) for g in one_d for p in g["params"]}


@pytest.mark.parametrize("key,value,words", [
    ("ddp_gradient", "mean", "method.ddp_gradient='mean' is not known; use official or global"),
    ("lambd", -1.0, "method.lambd=-1.0 must be >= 0"),
])
def test_barlow_twins_config_mistakes(key, value, words):
    with pytest.raises(UserError, match=words.replace("(", r"\(").replace(".", r"\.")):
        tiny_config("barlow_twins", {key: value})


def test_vicreg_config_mistake():
    with pytest.raises(UserError, match=r"method\.std_coeff=-1\.0 must be >= 0"):
        tiny_config("vicreg", {"std_coeff": -1.0})


def test_imagenet_presets_are_the_official_commands():
    bt = load_run_config("barlow-twins-r50-imagenet", ["data.root=/x"])
    assert (bt.method.lambd, bt.method.dim, bt.method.proj_hidden_dim, bt.method.ddp_gradient) == (
        0.0051, 8192, 8192, "official")
    assert (bt.optim.name, bt.optim.base_lr, bt.optim.weight_decay, bt.data.batch_size, bt.trainer.max_epochs) == (
        "lars", 0.2, 1e-6, 2048, 1000)
    assert bt.optim.base_lr * bt.optim.lr_1d_mult == pytest.approx(0.0048)
    assert bt.optim.min_lr == pytest.approx(0.001 * bt.optim.base_lr) and bt.optim.warmup_epochs == 10
    vic = load_run_config("vicreg-r50-imagenet", ["data.root=/x"])
    assert (vic.method.sim_coeff, vic.method.std_coeff, vic.method.cov_coeff, vic.method.dim) == (25, 25, 1, 8192)
    assert (vic.optim.name, vic.optim.base_lr, vic.optim.weight_decay, vic.optim.lr_1d_mult) == ("lars", 0.2, 1e-6, 1.0)
    assert (vic.data.batch_size, vic.trainer.max_epochs, vic.optim.min_lr) == (2048, 1000, pytest.approx(2e-4))
    for cfg in (bt, vic):
        assert cfg.model.backbone == "resnet50" and cfg.model.zero_init_residual and cfg.trainer.sync_batchnorm


# --------------------------------------------------------------------------- exact resume and the CLI

SMALL = ["method.proj_hidden_dim=64", "method.dim=32", "data.batch_size=64", "trainer.progress_bar=false",
         "trainer.log_every_n_steps=1", "trainer.accelerator=cpu", "trainer.devices=1"]
RESUME = SMALL + ["trainer.max_epochs=2", "trainer.limit_train_batches=3", "optim.warmup_epochs=1",
                  "trainer.checkpoint_every_n_steps=1"]


@pytest.mark.train
@pytest.mark.parametrize("preset", ["barlow-twins-digits", "vicreg-digits"])
def test_resume_after_a_stop_mid_epoch_equals_the_uninterrupted_run(preset, tmp_path):
    from safetensors.torch import load_file

    from ssl_helpers import ckpt, interrupt_at, nano

    overrides = RESUME + nano(preset, RESUME)
    straight = engine.pretrain(load_run_config(preset, overrides + [f"output_dir={tmp_path}", "name=A"]))
    cfg = load_run_config(preset, overrides + [f"output_dir={tmp_path}", "name=B"])
    interrupt_at(cfg)
    run_b = tmp_path / "B"
    assert ckpt(run_b)["global_step"] == 4  # one batch into the second epoch
    engine.pretrain(engine.load_run(run_b), resume=run_b)
    ca, cb = ckpt(straight), ckpt(run_b)
    assert ca["global_step"] == cb["global_step"] == 6
    assert ca["state_dict"].keys() == cb["state_dict"].keys()
    for k in ca["state_dict"]:
        assert torch.equal(ca["state_dict"][k], cb["state_dict"][k]), k
    for i, state in ca["optimizer_states"][0]["state"].items():
        for key, value in state.items():
            assert torch.equal(value, cb["optimizer_states"][0]["state"][i][key])
    ba, bb = load_file(str(straight / "backbone.safetensors")), load_file(str(run_b / "backbone.safetensors"))
    assert all(torch.equal(ba[k], bb[k]) for k in ba)

    def losses(run):
        with (run / "metrics.csv").open(newline="") as f:
            return {int(r["step"]): float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")}

    assert losses(straight) == losses(run_b) and sorted(losses(straight)) == list(range(6))


@pytest.mark.train
@pytest.mark.parametrize("preset", ["barlow-twins-digits", "vicreg-digits", "barlow-twins-fmnist", "vicreg-fmnist"])
def test_cli_pretrain_of_the_cpu_presets(preset, tmp_path):
    import json

    from idx_files import fake_fashion
    from ssl_helpers import run_cli

    extra = []
    if preset.endswith("fmnist"):
        fake_fashion(tmp_path, n_train=32, n_test=8)
        extra = [f"data.root={tmp_path}", "data.batch_size=16"]
    code, stdout, stderr = run_cli("pretrain", preset, *SMALL, "trainer.max_epochs=1", "trainer.limit_train_batches=2",
                                   *extra, f"output_dir={tmp_path}", "name=run")
    assert code == 0, stderr
    run = tmp_path / "run"
    assert (run / "backbone.safetensors").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    knn = json.loads((run / "knn.json").read_text())
    assert 0 <= knn["pretrained"]["top1"] <= 100 and "kNN (k=20" in stdout


@pytest.mark.parametrize("decay_1d", [True, False])
def test_lr_1d_mult_with_adamw_keeps_the_decay_choice(decay_1d):
    from selfsup.optim import OptimConfig, param_groups

    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    groups = param_groups({"projector": model}, OptimConfig(weight_decay=0.1, decay_1d=decay_1d, lr_1d_mult=0.5))
    assert [(len(g["params"]), g["lr_scale"], g["weight_decay"]) for g in groups] == [
        (1, 1.0, 0.1), (3, 0.5, 0.1 if decay_1d else 0.0)]
    default = param_groups({"projector": model}, OptimConfig(weight_decay=0.1))
    assert [(len(g["params"]), g["lr_scale"]) for g in default] == [(4, 1.0)]  # unchanged without the multiplier


@pytest.mark.parametrize("preset", ["barlow-twins-r50-imagenet", "vicreg-r50-imagenet"])
def test_lr_schedule_is_the_official_adjust_learning_rate(preset):
    """The per-step lr of every group against the official formula (BT main.py:155-168, VICReg :167-181),
    written out here: warmup over 10 epochs from 0, then cosine from base to 0.001 · base; BT's biases/BN ×0.0048."""
    import math
    from types import SimpleNamespace

    cfg = load_run_config(preset, ["data.root=/x", "method.proj_hidden_dim=16", "method.dim=16",
                                   "model.backbone=resnet18", "model.zero_init_residual=false"])
    from selfsup.methods.build import build_method
    from selfsup.methods import DataInfo

    m = build_method(cfg, DataInfo(3, 32, (0.5,) * 3, (0.25,) * 3))
    opt = m.configure_optimizers()
    steps_per_epoch = 625  # 1.28M images / 2048
    m.steps_per_epoch, m.total_steps = steps_per_epoch, steps_per_epoch * cfg.trainer.max_epochs
    weights, biases = (0.2, 0.0048) if preset.startswith("barlow") else (0.2, 0.2)

    def official(step):
        max_steps, warmup_steps, base_lr = m.total_steps, 10 * steps_per_epoch, 2048 / 256
        if step < warmup_steps:
            return base_lr * step / warmup_steps
        step, max_steps = step - warmup_steps, max_steps - warmup_steps
        q = 0.5 * (1 + math.cos(math.pi * step / max_steps))
        return base_lr * q + base_lr * 0.001 * (1 - q)

    for step in (0, 1, 3000, 6250, 100_000, m.total_steps - 1):
        m._trainer = SimpleNamespace(global_step=step, current_epoch=step // steps_per_epoch, optimizers=[opt])
        m.on_train_batch_start(None, 0)
        for group in opt.param_groups:
            expected = official(step) * (biases if group["params"][0].ndim <= 1 else weights)
            assert group["lr"] == pytest.approx(expected, rel=1e-9, abs=1e-15), (step, group["name"])
