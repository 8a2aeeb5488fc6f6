"""DINO: the loss and centre against an independent reference, the head, the schedules, clipping, freezing, EMA."""

from __future__ import annotations

import math

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from selfsup.errors import UserError
from selfsup.losses import dino_center, dino_loss
from selfsup.models.heads import DINOHead
from selfsup.schedules import dino_cosine, teacher_temperature
from ssl_helpers import MULTICROP, tiny_config
from ssl_helpers import tiny_dino as dino


def plan_views(model, batch=8, seed=0):
    x = torch.randint(0, 256, (batch, 1, 8, 8), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    return model.augment(x, torch.Generator().manual_seed(seed + 1))


def reference_loss(student, teacher, center, student_temp, teacher_temp, n_crops):
    """The official loop (main_dino.py:380-402) written out in float64: per pair a batch mean, then the mean."""
    s = (student.double() / student_temp).chunk(n_crops)
    q = F.softmax((teacher.double() - center.double()) / teacher_temp, dim=-1).chunk(2)
    total, n = 0.0, 0
    for iq in range(2):
        for v in range(n_crops):
            if v == iq:
                continue
            total = total + torch.sum(-q[iq] * F.log_softmax(s[v], dim=-1), dim=-1).mean()
            n += 1
    return total / n, n


# ----------------------------------------------------------------------------- the loss and the centre

def test_dino_loss_matches_the_official_loop_on_2_global_2_local_crops():
    g = torch.Generator().manual_seed(0)
    b, k = 5, 7
    student, teacher = torch.randn(4 * b, k, generator=g) * 3, torch.randn(2 * b, k, generator=g) * 3
    center = torch.randn(1, k, generator=g)
    ours = dino_loss(student, teacher, center, 0.1, 0.04)
    ref, pairs = reference_loss(student, teacher, center, 0.1, 0.04, 4)
    assert pairs == 6  # 2 * 4 - 2: (global i, any other crop)
    torch.testing.assert_close(ours.double(), ref, rtol=1e-6, atol=1e-6)
    # by hand: student logits all equal -> log softmax = -log K for every pair, whatever the teacher
    torch.testing.assert_close(dino_loss(torch.zeros(4 * b, k), teacher, center, 0.1, 0.04), torch.tensor(math.log(k)))
    # by hand, K = 2, one sample, 2 globals + 1 local: the teacher puts q on prototype 0, the student p on it
    q = [1 / (1 + math.exp(-(1.0 - 0.5) / 0.5)), 1 / (1 + math.exp(-(-1.0 - 0.5) / 0.5))]  # softmax((t - c) / τt)
    p = [1 / (1 + math.exp(-2.0 / 0.1)), 1 / (1 + math.exp(0.0)), 1 / (1 + math.exp(-1.0 / 0.1))]
    ce = lambda qi, pv: -(qi * math.log(pv) + (1 - qi) * math.log(1 - pv))  # noqa: E731
    hand = (ce(q[0], p[1]) + ce(q[0], p[2]) + ce(q[1], p[0]) + ce(q[1], p[2])) / 4
    got = dino_loss(torch.tensor([[2.0, 0.0], [0.0, 0.0], [1.0, 0.0]]), torch.tensor([[1.0, 0.0], [-1.0, 0.0]]),
                    torch.tensor([[0.5, 0.0]]), 0.1, 0.5)
    assert got.item() == pytest.approx(hand, rel=1e-5)


def test_the_loss_carries_no_gradient_to_the_teacher():
    student = torch.randn(8, 5, requires_grad=True)
    teacher = torch.randn(4, 5, requires_grad=True)
    dino_loss(student, teacher, torch.zeros(1, 5), 0.1, 0.04).backward()
    assert student.grad is not None and teacher.grad is None


def test_method_step_uses_the_old_centre_then_updates_it_from_the_teacher_globals():
    m = dino()
    views = plan_views(m)
    assert [tuple(v.shape[-2:]) for v in views] == [(8, 8), (8, 8), (4, 4), (4, 4)]
    seen = []
    m.teacher_backbone.register_forward_hook(lambda mod, inp, out: seen.append(tuple(inp[0].shape)))
    c0 = torch.randn(1, 64) * 0.1
    m.center.copy_(c0)
    with torch.no_grad():
        t = m.teacher_head(m.teacher_backbone(torch.cat(views[:2])))
        s = m.head(torch.cat([m.backbone(torch.cat(views[:2])), m.backbone(torch.cat(views[2:]))]))
    seen.clear()
    out = m.forward_views(views)
    assert seen == [(16, 1, 8, 8)]  # the teacher sees the two global crops only, in one call
    ref, _ = reference_loss(s, t, c0, 0.1, m.teacher_temp, 4)
    torch.testing.assert_close(out.loss.double(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m.center, 0.9 * c0 + 0.1 * t.mean(0, keepdim=True), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(dino_center(c0, t.sum(0, keepdim=True), 16, 0.9), m.center, rtol=1e-5, atol=1e-7)
    # collapse signs: the teacher's entropy and KL(teacher || student) = loss - entropy
    q = F.softmax((t - c0) / m.teacher_temp, dim=-1)
    entropy = -(q * q.log()).sum(-1).mean()
    signs = out.instruments
    torch.testing.assert_close(signs["dino_teacher_entropy"], entropy, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(signs["dino_kl_teacher_student"], out.loss.detach() - entropy, rtol=1e-4, atol=1e-5)
    assert signs["dino_center_norm"].item() == pytest.approx(c0.norm().item(), rel=1e-6)
    # the logits' spread over the batch in units of τt: per output the sd over the 16 teacher rows, then the mean
    spread = sum((t[:, k] - t[:, k].mean()).pow(2).sum().div(15).sqrt() for k in range(64)) / 64 / m.teacher_temp
    torch.testing.assert_close(signs["dino_teacher_spread"], spread, rtol=1e-4, atol=1e-6)
    assert "center" in m.state_dict()  # checkpointed with the weights


def reference_sinkhorn(teacher, teacher_temp, iterations=3):
    """DINOv2's sinkhorn_knopp_teacher (dinov2/loss/dino_clstoken_loss.py) written out in float64 for one
    process: Q = exp(t / τt)ᵀ, Q /= ΣQ; per round rows to 1/K, columns to 1/B; Q · B, transposed."""
    q = torch.exp(teacher.double() / teacher_temp).t()
    k, b = q.shape
    q = q / q.sum()
    for _ in range(iterations):
        q = q / q.sum(dim=1, keepdim=True) / k
        q = q / q.sum(dim=0, keepdim=True) / b
    return (q * b).t()


def logits_with_a_centre(m):
    """The 2 + 2 crop views, a random centre set on ``m``, and the teacher's and student's logits before the step."""
    views = plan_views(m)
    c0 = torch.randn(1, 64) * 0.1
    m.center.copy_(c0)
    with torch.no_grad():
        t = m.teacher_head(m.teacher_backbone(torch.cat(views[:2])))
        s = m.head(torch.cat([m.backbone(torch.cat(views[:2])), m.backbone(torch.cat(views[2:]))]))
    return views, c0, t, s


def test_sinkhorn_knopp_centring_equals_dinov2s_targets_and_leaves_the_centre():
    m = dino({"centering": "sinkhorn_knopp"})
    views, c0, t, s = logits_with_a_centre(m)
    out = m.forward_views(views)
    q = reference_sinkhorn(t, m.teacher_temp)  # over the 2B teacher rows at once (ssl_meta_arch.py)
    assert q.sum(1).sub(1).abs().max() < 1e-9  # each target a distribution
    ls = F.log_softmax(s.double() / 0.1, dim=-1).chunk(4)
    qs = q.chunk(2)
    ref = sum(-(qs[i] * ls[v]).sum(-1).mean() for i in range(2) for v in range(4) if v != i) / 6
    torch.testing.assert_close(out.loss.double(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m.center, c0)  # DINOv2 neither uses nor updates the centre under Sinkhorn-Knopp
    entropy = -(q * q.log()).sum(-1).mean()
    torch.testing.assert_close(out.instruments["dino_teacher_entropy"].double(), entropy, rtol=1e-4, atol=1e-5)


def test_no_centring_is_sharpening_only_and_leaves_the_centre():
    m = dino({"centering": "none"})
    views, c0, t, s = logits_with_a_centre(m)
    ref, _ = reference_loss(s, t, torch.zeros(1, 64), 0.1, m.teacher_temp, 4)
    torch.testing.assert_close(m.forward_views(views).loss.double(), ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m.center, c0)


def reference_koleo(x, eps=1e-8):
    """DINOv2's KoLeoLoss (dinov2/loss/koleo_loss.py) written out row by row in float64: normalise, the nearest
    other row by inner product, −mean log(‖x_i − x_nn + eps‖ + eps)."""
    x = x.double() / x.double().norm(dim=1, keepdim=True).clamp_min(eps)
    total = 0.0
    for i in range(len(x)):
        j = max((k for k in range(len(x)) if k != i), key=lambda k: float(x[i] @ x[k]))
        total += -math.log(float((x[i] - x[j] + eps).norm()) + eps)
    return total / len(x)


def test_koleo_is_dinov2s_and_adds_its_weighted_sum_over_the_global_crops():
    from selfsup.losses import koleo_loss

    x = torch.randn(12, 6, generator=torch.Generator().manual_seed(0))
    loss, dist = koleo_loss(x)
    assert loss.item() == pytest.approx(reference_koleo(x), rel=1e-5)
    assert 0 < dist.item() < 2
    m = dino({"koleo_loss_weight": 0.1})
    views = plan_views(m)
    state = {k: v.clone() for k, v in m.state_dict().items()}
    out = m.forward_views(views)
    with torch.no_grad():
        g = [m.backbone(v) for v in views[:2]]
    koleo = 0.1 * sum(reference_koleo(f) for f in g)
    assert out.instruments["koleo_loss"].item() == pytest.approx(koleo, rel=1e-4)
    m.load_state_dict(state)
    m.cfg.method.koleo_loss_weight = 0.0
    plain = m.forward_views(views)
    assert (out.loss - plain.loss).item() == pytest.approx(koleo, rel=1e-4)
    assert "koleo_loss" not in plain.instruments and "koleo_nn_distance" in out.instruments


def test_centering_is_checked():
    with pytest.raises(UserError, match="method.centering='sinkhorn'"):
        dino({"centering": "sinkhorn"})


# ----------------------------------------------------------------------------- the head

@pytest.mark.parametrize("norm_last_layer", [True, False])
def test_head_weight_normalised_last_layer(norm_last_layer):
    torch.manual_seed(0)
    head = DINOHead(12, 40, hidden_dim=24, bottleneck_dim=6, norm_last_layer=norm_last_layer)
    layer = head.last_layer
    assert layer.weight_g.shape == (40, 1) and layer.weight_v.shape == (40, 6)
    assert torch.equal(layer.weight_g, torch.ones(40, 1))
    assert layer.weight_g.requires_grad is (not norm_last_layer) and layer.weight_v.requires_grad
    with torch.no_grad():
        layer.weight_v.mul_(torch.rand(40, 1) * 5 + 0.1)  # rows of any norm: the applied weight has norm g
        layer.weight_g.copy_(torch.rand(40, 1) + 0.5)
    w = layer.weight
    torch.testing.assert_close(w.norm(dim=1, keepdim=True), layer.weight_g.detach())
    torch.testing.assert_close(w, layer.weight_g * layer.weight_v / layer.weight_v.norm(dim=1, keepdim=True))
    x = torch.randn(3, 12)
    z = F.normalize(head.mlp(x), dim=-1)
    torch.testing.assert_close(head(x), z @ w.T)
    # the MLP: 3 Linears with GELUs, std-.02 weights and zero biases; the last layer has no bias
    linears = [mod for mod in head.mlp if isinstance(mod, torch.nn.Linear)]
    assert [tuple(lin.weight.shape) for lin in linears] == [(24, 12), (24, 24), (6, 24)]
    assert sum(isinstance(mod, torch.nn.GELU) for mod in head.mlp) == 2
    assert all(torch.equal(lin.bias, torch.zeros_like(lin.bias)) for lin in linears)
    assert not hasattr(layer, "bias")


def test_teacher_has_no_drop_path_and_starts_as_the_student():
    m = dino(model={"drop_path_rate": 0.3})
    assert m.backbone.blocks[-1].drop_path.p == pytest.approx(0.3)
    assert all(b.drop_path.p == 0 for b in m.teacher_backbone.blocks)
    for (n, p), (_, q) in zip(m.backbone.state_dict().items(), m.teacher_backbone.state_dict().items()):
        assert torch.equal(p, q), n
    assert not any(p.requires_grad for p in m.teacher_backbone.parameters())
    assert m.eval_backbone is m.teacher_backbone


def test_parameter_groups_decay_no_bias_nor_1d_tensor():
    m = dino(model={"pos_embed": "learned", "stop_grad_conv1": False}, optim={"decay_1d": False},
             method_extra={"norm_last_layer": False})
    opt = m.configure_optimizers()
    names = {id(p): n for n, p in m.named_parameters()}
    decayed = {names[id(p)] for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    free = {names[id(p)] for g in opt.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    trainable = {n for n, p in m.named_parameters() if p.requires_grad}
    assert decayed | free == trainable and not decayed & free
    assert free == {n for n, p in m.named_parameters() if p.requires_grad and (n.endswith(".bias") or p.ndim <= 1)}
    assert {"backbone.pos_embed", "backbone.cls_token",
            "head.last_layer.weight_g", "head.last_layer.weight_v"} <= decayed
    assert all(g["decayed"] == (g["weight_decay"] > 0) for g in opt.param_groups)


# ----------------------------------------------------------------------------- clipping

def test_gradients_are_clipped_per_tensor_then_the_last_layer_dropped():
    m = dino(method_extra={"clip_grad": 1.0})
    g = torch.Generator().manual_seed(0)
    params = [p for p in m.parameters() if p.requires_grad]
    for i, p in enumerate(params):
        p.grad = torch.randn(p.shape, generator=g) * (0.001 if i % 2 else 10.0)  # half far below, half far above
    before = {id(p): p.grad.clone() for p in params}
    m.on_before_optimizer_step(None)  # epoch 0 (no trainer): the last layer is frozen
    for n, p in m.named_parameters():
        if not p.requires_grad:
            continue
        if "last_layer" in n:
            assert p.grad is None, n  # dropped (None, not zero: AdamW skips it)
            continue
        g0 = before[id(p)]
        norm = g0.norm()
        expected = g0 * min(1.0, 1.0 / (norm.item() + 1e-6))  # utils.clip_gradients
        torch.testing.assert_close(p.grad, expected, rtol=1e-6, atol=0)
        if norm < 1.0:
            assert torch.equal(p.grad, g0), n  # untouched, bit for bit
        assert p.grad.norm() <= 1.0 + 1e-5
    # one global norm would have scaled the small gradients too
    small = [p for i, p in enumerate(params) if i % 2 and p.grad is not None]
    assert any(torch.equal(p.grad, before[id(p)]) for p in small)


# ----------------------------------------------------------------------------- schedules

def official_cosine(base, final, epochs, niter, warmup_epochs=0, start_warmup=0.0):
    """DINO utils.cosine_scheduler, written from its definition with numpy."""
    warm = np.linspace(start_warmup, base, warmup_epochs * niter) if warmup_epochs else np.array([])
    iters = np.arange(epochs * niter - warmup_epochs * niter)
    return np.concatenate((warm, final + 0.5 * (base - final) * (1 + np.cos(np.pi * iters / len(iters)))))


def test_schedules_at_chosen_steps():
    ref = official_cosine(5e-4, 1e-6, 100, 50, warmup_epochs=10)
    for step in (0, 1, 250, 499, 500, 501, 3000, 4999):
        assert dino_cosine(step, 5000, 500, 5e-4, 1e-6) == pytest.approx(ref[step], rel=1e-12, abs=1e-15)
    wd = official_cosine(0.04, 0.4, 100, 50)
    for step in (0, 1, 2500, 4999):
        assert dino_cosine(step, 5000, 0, 0.04, 0.4) == pytest.approx(wd[step], rel=1e-12)
    assert dino_cosine(0, 5000, 0, 0.04, 0.4) == pytest.approx(0.04, rel=1e-12)
    assert dino_cosine(4999, 5000, 0, 0.04, 0.4) < 0.4  # never quite the final value
    temps = np.concatenate((np.linspace(0.04, 0.07, 30), np.ones(270) * 0.07))
    for epoch in (0, 1, 15, 29, 30, 299):
        assert teacher_temperature(epoch, 0.04, 0.07, 30) == pytest.approx(temps[epoch], rel=1e-12)
    assert teacher_temperature(0, 0.04, 0.07, 0) == 0.07  # code default: no warm-up


class Record(pl.Callback):
    """Per step: the schedules as applied, the last layer and the teacher/student parameters around the step."""

    def __init__(self):
        self.rows = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.teacher_before = [p.detach().clone() for p in pl_module.teacher_backbone.parameters()]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        opt = trainer.optimizers[0]
        self.rows.append(dict(
            epoch=trainer.current_epoch, lr=[g["lr"] for g in opt.param_groups],
            wd=[g["weight_decay"] for g in opt.param_groups], decayed=[g["decayed"] for g in opt.param_groups],
            momentum=pl_module.momentum, temp=pl_module.teacher_temp,
            last_v=pl_module.head.last_layer.weight_v.detach().clone(),
            last_g=pl_module.head.last_layer.weight_g.detach().clone(),
            last_state=len(opt.state.get(pl_module.head.last_layer.weight_v, {})),
            teacher_before=self.teacher_before,
            teacher=[p.detach().clone() for p in pl_module.teacher_backbone.parameters()],
            student=[p.detach().clone() for p in pl_module.backbone.parameters()]))


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """3 epochs x 2 steps: lr warm-up over epoch 0, τt 0.02 -> 0.06 over 3 epochs, last layer frozen 1 epoch."""
    from selfsup.data.datasets import load_dataset
    from selfsup.engine import PretrainData, make_trainer
    from selfsup.methods.build import build_method, data_info

    cfg = tiny_config("dino", {"warmup_teacher_temp": 0.02, "teacher_temp": 0.06, "warmup_teacher_temp_epochs": 3,
                               "norm_last_layer": False, "momentum": 0.9, "weight_decay_end": 0.3},
                      augment=MULTICROP, optim={"warmup_epochs": 1, "decay_1d": False, "weight_decay": 0.04,
                                                "min_lr": 1e-5},
                      trainer={"max_epochs": 3, "limit_train_batches": 2, "log_every_n_steps": 1},
                      instruments={"enabled": False}, output_dir=str(tmp_path_factory.mktemp("dino")), name="run")
    train = load_dataset(cfg.data, "train")
    model = build_method(cfg, data_info(cfg, train))
    initial = model.head.last_layer.weight_v.detach().clone()
    record = Record()
    trainer = make_trainer(cfg, tmp_path_factory.mktemp("run"))
    trainer.callbacks.insert(0, record)
    trainer.fit(model, datamodule=PretrainData(cfg, train))
    return cfg, record.rows, initial


@pytest.mark.train
def test_schedules_as_applied_in_training(fitted):
    cfg, rows, _ = fitted
    assert len(rows) == 6
    peak = cfg.optim.base_lr * cfg.data.batch_size / 256
    lr = official_cosine(peak, 1e-5, 3, 2, warmup_epochs=1)  # min_lr as given (main_dino.py:238-243)
    wd = official_cosine(0.04, 0.3, 3, 2)
    mom = official_cosine(0.9, 1.0, 3, 2)
    for step, row in enumerate(rows):
        assert row["lr"] == pytest.approx([lr[step]] * len(row["lr"]), rel=1e-9, abs=1e-15)
        assert row["wd"] == pytest.approx([wd[step] if d else 0.0 for d in row["decayed"]], rel=1e-9)
        assert row["momentum"] == pytest.approx(mom[step], rel=1e-12)
        assert row["temp"] == pytest.approx([0.02, 0.04, 0.06][row["epoch"]], rel=1e-12)  # per epoch
    assert any(row["decayed"]) and not all(rows[0]["decayed"])


@pytest.mark.train
def test_last_layer_frozen_for_the_first_epoch_only(fitted):
    _, rows, initial = fitted
    for row in rows:
        if row["epoch"] == 0:  # no update, no decay, no optimiser state: the gradient was None
            assert torch.equal(row["last_v"], initial) and torch.equal(row["last_g"], torch.ones_like(row["last_g"]))
            assert row["last_state"] == 0
    assert not torch.equal(rows[-1]["last_v"], initial) and rows[-1]["last_state"] > 0
    assert not torch.equal(rows[-1]["last_g"], torch.ones_like(rows[-1]["last_g"]))  # norm_last_layer=False: g learns


@pytest.mark.train
def test_teacher_ema_follows_each_optimiser_step(fitted):
    _, rows, _ = fitted
    for row in rows:
        m = row["momentum"]
        for t0, s1, t1 in zip(row["teacher_before"], row["student"], row["teacher"]):
            torch.testing.assert_close(t1, m * t0 + (1 - m) * s1, rtol=1e-5, atol=1e-7)


def test_dino_config_errors():
    with pytest.raises(UserError, match=r"method.teacher_temp=0.0 must be > 0"):
        tiny_config("dino", {"teacher_temp": 0.0})
    with pytest.raises(UserError, match=r"method.center_momentum=1.0 must be in \[0, 1\)"):
        tiny_config("dino", {"center_momentum": 1.0})
    m = dino()
    with pytest.raises(UserError, match="DINO needs the 2 global crops"):
        m.forward_views(plan_views(m)[:1])


# ----------------------------------------------------------------------------- exact resume

@pytest.mark.train
def test_multicrop_dino_resumed_mid_epoch_equals_the_uninterrupted_run(tmp_path):
    """2 globals + 2 locals, 2 epochs x 3 steps (lr warm-up, τt warm-up, the last layer frozen in epoch 0):
    killed (Ctrl-C) before step 4 and resumed, the run ends as the straight one: weights, teacher, centre,
    optimiser state, losses."""
    import selfsup.engine as engine
    from selfsup.config import load_run_config
    from ssl_helpers import ckpt, interrupt_at, losses

    def cfg(out, name, *extra):
        return load_run_config("dino-digits", [
            "method.out_dim=64", "method.hidden_dim=32", "method.bottleneck_dim=16", "method.teacher_temp=0.06",
            "method.warmup_teacher_temp_epochs=2", "method.freeze_last_layer=1", "data.batch_size=32",
            "augment.local_crops_number=2",
            "trainer.max_epochs=2", "trainer.limit_train_batches=3", "optim.warmup_epochs=1",
            "trainer.progress_bar=false", "trainer.log_every_n_steps=1", "trainer.accelerator=cpu",
            "trainer.devices=1", "trainer.checkpoint_every_n_steps=1", "instruments.rank_every_n_steps=0",
            "eval.knn_k=5", f"output_dir={out}", f"name={name}", *extra])

    straight = engine.pretrain(cfg(tmp_path, "A"))
    interrupt_at(cfg(tmp_path, "B"))
    run_b = tmp_path / "B"
    assert ckpt(run_b)["global_step"] == 4
    engine.pretrain(engine.load_run(run_b), resume=run_b)
    ca, cb = ckpt(straight), ckpt(run_b)
    assert ca["global_step"] == cb["global_step"] == 6
    assert "center" in ca["state_dict"] and any(k.startswith("teacher_backbone.") for k in ca["state_dict"])
    for k in ca["state_dict"]:  # bit for bit (drop path draws from the global RNG, restored with the checkpoint)
        assert torch.equal(ca["state_dict"][k], cb["state_dict"][k]), k
    oa, ob = ca["optimizer_states"][0], cb["optimizer_states"][0]
    assert oa["state"].keys() == ob["state"].keys() and len(oa["state"]) > 0
    for i in oa["state"]:
        for name, value in oa["state"][i].items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(ob["state"][i][name]))
    assert [g["weight_decay"] for g in oa["param_groups"]] == [g["weight_decay"] for g in ob["param_groups"]]
    la, lb = losses(straight), losses(run_b)
    assert sorted(la) == sorted(lb) == list(range(6)) and lb == la


def teacher_init_left(momentum: float, total_steps: int) -> float:
    """Π_t m_t: the weight of the random init left in the EMA teacher after ``total_steps`` of the cosine ramp."""
    return math.exp(sum(math.log(dino_cosine(t, total_steps, 0, momentum, 1.0)) for t in range(total_steps)))


def test_teacher_init_left_by_hand():
    # one step at m keeps m; two steps of the ramp 0.9 -> 1 (cos(0) = 1, cos(pi/2) = 0): 0.9 · 0.95
    assert teacher_init_left(0.9, 1) == pytest.approx(0.9)
    assert teacher_init_left(0.9, 2) == pytest.approx(0.9 * 0.95)
    # ~exp(-(1 - m) · n / 2) for long ramps: 0.99 over 100 steps keeps 60% (benchmarks/results/dino_cpu.json)
    assert teacher_init_left(0.99, 100) == pytest.approx(0.602, abs=1e-3)


@pytest.mark.parametrize("preset", ["dino-digits", "dino-fmnist"])
def test_cpu_presets_teacher_forgets_its_random_init(preset):
    """The CPU presets' evaluated teacher keeps under 1% of its random init by the end of the preset's own run:
    at the official 0.996 (or 0.99) over a few hundred steps it keeps most of it, and its kNN stays at the floor."""
    from selfsup.config import load_run_config

    cfg = load_run_config(preset)
    train_size = {"digits": 1438, "fashion-mnist": 60000}[cfg.data.name]  # the 80% digits split; FMNIST train
    steps = train_size // cfg.data.batch_size * cfg.trainer.max_epochs
    assert teacher_init_left(cfg.method.momentum, steps) < 0.01
    assert teacher_init_left(0.996, steps) > 0.01  # the official momentum would not do at this length


def test_the_curves_benchmark_reads_the_collapse_signs_at_each_fifth_of_a_run(tmp_path):
    import math

    import benchmarks.dino_curves as bench

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("method:\n  out_dim: 64\n")
    header = ["step", "instruments/dino_teacher_entropy", "instruments/dino_teacher_spread", "train/lr"]
    rows = [[s, 4.0 - s / 100, 2.0 - s / 50, ""] for s in range(0, 101, 10)] + [[s, "", "", 0.1] for s in (0, 55)]
    (run / "metrics.csv").write_text("\n".join(",".join(map(str, r)) for r in [header, *rows]) + "\n")
    c = bench.curves(run)
    assert c["steps"] == 101 and c["log_K"] == pytest.approx(math.log(64))
    assert [r["step"] for r in c["by_fifth"]] == [0, 20, 40, 60, 80, 100]
    assert [r["entropy"] for r in c["by_fifth"]] == pytest.approx([4.0, 3.8, 3.6, 3.4, 3.2, 3.0])
    assert c["by_fifth"][3]["spread_over_tau"] == pytest.approx(0.8) and c["by_fifth"][2]["lr"] == 0.1
    assert c["entropy_min"] == (100, 3.0) and c["entropy_over_log_K_last"] == pytest.approx(3.0 / math.log(64))
    assert c["series"]["kl"] == []  # not logged: an empty series, not an error


def test_the_teacher_usage_benchmark_counts_the_outputs_the_targets_use():
    import benchmarks.teacher_usage as bench

    winners = torch.tensor([0, 0, 0, 1, 1, 2])
    logits = 10.0 * F.one_hot(winners, 4).float()
    labels = torch.tensor([5, 5, 3, 3, 3, 7])
    v = torch.tensor([1.0, 2.0, 3.0])
    feats = torch.stack([v, -v, 2 * v, -3 * v, v, -v])  # one direction: effective rank 1
    u = bench.usage(logits, torch.zeros(1, 4), 1.0, feats, labels)
    assert u["outputs"] == 4 and u["argmax_used"] == 3 and u["top_share"] == 0.5
    assert u["purity"] == pytest.approx(5 / 6, abs=1e-4)  # outputs {5,5,3}, {3,3}, {7}: 2 + 2 + 1 of 6
    h = torch.distributions.Categorical(logits=torch.tensor([10.0, 0, 0, 0])).entropy().item()
    assert u["entropy"] == pytest.approx(h, abs=1e-4) and u["log_k"] == pytest.approx(math.log(4), abs=1e-4)
    assert u["feature_eff_rank"] == pytest.approx(1.0)
    shifted = bench.usage(logits, torch.tensor([[20.0, 0, 0, 0]]), 1.0, feats, labels)  # the centre is subtracted
    assert shifted["argmax_used"] == 2 and shifted["top_share"] == pytest.approx(5 / 6, abs=1e-4)  # 0,1,2 tie to 1
