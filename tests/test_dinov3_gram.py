"""DINOv3's Gram anchoring against facebookresearch/dinov3 (commit 6876159a; file:line in docs/DINOV3.md), each
official formula written out here from the facts, nothing of the official code imported: GramLoss
(loss/gram_loss.py:34-84), the weight schedule (train/cosine_lr_scheduler.py:54-85), the Gram teacher's load and
refreshes (train/train.py:441-452, 471-473, 534-544), and whole steps (ssl_meta_arch.py:402-420, 476-520, 652-666)."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from selfsup.errors import UserError
from selfsup.losses import gram_loss
from selfsup.schedules import gram_refresh_after, gram_refreshes_before, linear_warmup_cosine_decay
from ssl_helpers import tiny_method
from test_dinov2 import HEADS, B, crops, masks_of, official_loss, stand_in_trainer

GRAM = {"gram_img_level": True, "gram_it_load_ema_teacher": 0.0, "gram_rep_update": False}


def dinov3(extra=None, **sections):
    sections.setdefault("augment", {"local_crops_number": 2, "local_crops_size": 4})
    return tiny_method("dinov3", {**HEADS, "warmup_teacher_temp_epochs": 0, **GRAM, **(extra or {})},
                       data={"batch_size": B}, **sections).train()


# ----------------------------------------------------------------------------- GramLoss, written out
def gram_official(output_feats, target_feats, img_level, apply_norm=True, remove_neg=False,
                  remove_only_teacher_neg=False):
    """gram_loss.py:34-84 line by line (in-place masking included)."""
    output_feats, target_feats = output_feats.float(), target_feats.float()
    if apply_norm:
        target_feats = F.normalize(target_feats, dim=-1)
    if not img_level and len(target_feats.shape) == 3:
        target_feats = target_feats.flatten(0, 1)
    target_sim = torch.matmul(target_feats, target_feats.transpose(-1, -2))
    if apply_norm:
        output_feats = F.normalize(output_feats, dim=-1)
    if not img_level and len(output_feats.shape) == 3:
        output_feats = output_feats.flatten(0, 1)
    student_sim = torch.matmul(output_feats, output_feats.transpose(-1, -2))
    if remove_neg:
        target_sim[target_sim < 0] = 0.0
        student_sim[student_sim < 0] = 0.0
    elif remove_only_teacher_neg:
        target_sim[target_sim < 0] = 0.0
        student_sim[(student_sim < 0) & (target_sim < 0)] = 0.0
    return torch.nn.MSELoss()(student_sim, target_sim)


@pytest.mark.parametrize("img_level", [True, False])
@pytest.mark.parametrize("neg", ["keep", "remove_neg", "remove_only_teacher_neg"])
@pytest.mark.parametrize("normalized", [True, False])
def test_gram_loss_and_its_gradient_are_the_official_ones(img_level, neg, normalized):
    g = torch.Generator().manual_seed(0)
    s = torch.randn(3, 5, 7, generator=g, requires_grad=True)
    t = torch.randn(3, 5, 7, generator=g)
    flags = dict(remove_neg=neg == "remove_neg", remove_only_teacher_neg=neg == "remove_only_teacher_neg")
    s2 = s.detach().clone().requires_grad_(True)
    got = gram_loss(s, t, normalized=normalized, img_level=img_level, **flags)
    want = gram_official(s2, t, img_level, normalized, **flags)
    got.backward()
    want.backward()
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    torch.testing.assert_close(s.grad, s2.grad, rtol=1e-5, atol=1e-8)


def test_gram_loss_by_hand_on_two_patches():
    """One image, two 2-d patches: student (1, 0), (0, 1): Gram I; teacher (1, 0), (1, 1)/√2: off-diagonal 1/√2;
    the MSE over the 4 entries is 2 · (1/√2)² / 4 = 1/4; with the negatives removed a teacher's −1/√2 counts 0."""
    s = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    assert gram_loss(s, torch.tensor([[[1.0, 0.0], [1.0, 1.0]]])).item() == pytest.approx(0.25)
    t_neg = torch.tensor([[[1.0, 0.0], [-1.0, -1.0]]])
    assert gram_loss(s, t_neg).item() == pytest.approx(0.25)
    assert gram_loss(s, t_neg, remove_neg=True).item() == pytest.approx(0.0)
    with pytest.raises(ValueError, match="exclude each other"):
        gram_loss(s, s, remove_neg=True, remove_only_teacher_neg=True)


# ----------------------------------------------------------------------------- the schedules
@pytest.mark.parametrize("start,peak,end,warm,total,cos", [(0, 0, 2.0, 6, 10, 2), (0.5, 1.0, 0.1, 3, 12, None),
                                                           (1.5, 1.5, 1.5, 0, 5, 0), (0, 1, 0.2, 2, 9, 1)])
def test_the_gram_weight_schedule_is_the_official_array(start, peak, end, warm, total, cos):
    """cosine_lr_scheduler.py:76-85 as numpy builds it, read at every iteration (and past its end: ``end``)."""
    linear = np.linspace(start, peak, warm, endpoint=False)
    n = total - warm if cos is None else cos
    cosine = (peak - end) * (np.cos(np.linspace(0, np.pi, n)) + 1) / 2 + end
    array = np.concatenate([linear, cosine, np.full((total - n - warm,), end)])
    for it in range(total + 3):
        want = array[it] if it < total else end
        assert linear_warmup_cosine_decay(it, start, peak, end, warm, total, cos) == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("first,every,max_updates", [(0, 3, -1), (5, 3, -1), (6, 3, 2), (1, 1, 4), (10, 4, 3)])
def test_the_gram_teacher_refreshes_at_the_official_iterations(first, every, max_updates):
    """train.py:534-544 run as a loop (its counter), against the pure functions at every iteration; a resume at
    every iteration counts the refreshes already done as the loop did."""
    num = 0
    for it in range(40):
        assert gram_refreshes_before(it, first, every, max_updates) == num, it
        due = ((it + 1) >= first and (it + 1) % every == 0 and (max_updates < 0 or num < max_updates))
        assert gram_refresh_after(it, first, every, max_updates) == due, it
        num += due


def test_the_method_loads_and_refreshes_its_gram_teacher_at_those_iterations():
    """A 2-iteration epoch: loaded from the EMA teacher before iteration 2 (epoch 1), refreshed after iterations
    3 and 5 (it + 1 = 4, 6: from epoch 2, every epoch) and no more (max_updates 2); between those it holds."""
    m = dinov3({"gram_it_load_ema_teacher": 1.0, "gram_rep_update": True, "gram_it_first_update": 2.0,
                "gram_update_frequency": 1.0, "gram_max_updates": 2, "momentum": 0.5},
               optim={"warmup_epochs": 0, "fused": False})
    m.total_steps, m.steps_per_epoch, m.max_epochs = 10, 2, 5
    m._opt = m.configure_optimizers()
    flat = lambda net: torch.cat([p.detach().flatten() for p in net.parameters()])  # noqa: E731
    init, held, seen = flat(m.gram_teacher), None, []
    for step in range(9):
        stand_in_trainer(m, step, step // 2)
        m.on_train_batch_start(None, step)
        assert m.gram_on == (step >= 2) and m.step_gram_weight.item() == (1.0 if step >= 2 else 0.0)
        if step == 2:
            assert torch.equal(flat(m.gram_teacher), flat(m.teacher_backbone))
            held = flat(m.teacher_backbone)
        elif step < 2:
            assert torch.equal(flat(m.gram_teacher), init)
        m._opt.zero_grad(set_to_none=True)
        m.forward_views(crops(seed=step), masks_of(seed=step)).loss.backward()
        m._opt.step()
        m.teacher_ema()
        if torch.equal(flat(m.gram_teacher), flat(m.teacher_backbone)):
            seen.append(step)
            held = flat(m.gram_teacher)
        else:
            assert held is None or torch.equal(flat(m.gram_teacher), held), step
    assert seen == [3, 5]
    assert any(k.startswith("gram_teacher.") for k in m.state_dict())  # in every checkpoint


# ----------------------------------------------------------------------------- whole steps
def gram_reference(m, views, masks, weight, tokens="all", teacher_size=0):
    """ssl_meta_arch.py:476-520 + 652-666: the student's patch tokens of its masked forward of the global crops
    against the Gram teacher's of the same crops (resized where ``teacher_size``, then its grid resized back),
    GramLoss as configured, times the weight."""
    c = m.cfg.method
    g = torch.cat(views[:2])
    s_patches = m.backbone(g, masks, return_all_tokens=True)[:, 1:]
    with torch.no_grad():
        x = F.interpolate(g, size=(teacher_size,) * 2, mode="bicubic", align_corners=False) if teacher_size else g
        t = m.gram_teacher(x, return_all_tokens=True)[:, 1:]
        n_t, n_s = int(math.isqrt(t.shape[1])), int(math.isqrt(s_patches.shape[1]))
        if n_t != n_s:
            hw = t.transpose(-2, -1).unflatten(-1, (n_t, n_t))
            t = F.interpolate(hw, size=(n_s, n_s), mode="bicubic", align_corners=False,
                              antialias=False).flatten(-2, -1).transpose(-2, -1)
    if tokens != "all":
        keep = masks if tokens == "masked" else ~masks
        s_patches, t = s_patches[keep], t[keep]
    return weight * gram_official(s_patches, t, c.gram_img_level, c.gram_normalized, c.gram_remove_neg,
                                  c.gram_remove_only_teacher_neg)


@pytest.mark.parametrize("extra,tokens,size", [({}, "all", 0), ({"gram_img_level": False}, "masked", 0),
                                               ({"gram_remove_neg": True}, "all", 16)])
def test_a_whole_step_is_dinov2s_loss_plus_the_weighted_gram_term(extra, tokens, size):
    """From the same state: the loss and every gradient equal DINOv2's official loss (test_dinov2's reference)
    plus w · GramLoss, with a Gram teacher unlike the EMA teacher (so that the targets are the Gram teacher's)."""
    m = dinov3({**extra, "gram_tokens_used": tokens, "gram_teacher_crop_size": size,
                "gram_loss_weight": 0.7, "centering": "sinkhorn_knopp"})
    with torch.no_grad():
        for p in m.gram_teacher.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    m.gram_on, m.gram_weight = True, 0.7
    views, masks = crops(), masks_of()
    ref = copy.deepcopy(m)
    out = m.forward_views(views, masks)
    out.loss.backward()
    dino, _, _ = official_loss(ref, views, masks, "sinkhorn_knopp")
    gram = gram_reference(ref, views, masks, 0.7, tokens, size)
    (dino + gram).backward()
    assert gram.item() > 1e-4 and out.scalars["loss_gram"].item() == pytest.approx(gram.item() / 0.7, rel=1e-5)
    assert out.loss.item() == pytest.approx((dino + gram).item(), rel=1e-5)
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        if p.grad is not None or q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6 + 1e-6 * float(q.grad.abs().max()),
                                       msg=name)


def test_before_the_gram_phase_the_step_is_dinov2s():
    m = dinov3({"centering": "sinkhorn_knopp", "gram_it_load_ema_teacher": 3.0})
    m.total_steps, m.steps_per_epoch = 10, 2
    assert m.gram_loss_weight(5) == 0.0 and m.gram_loss_weight(6) == 1.0
    ref = copy.deepcopy(m)
    views, masks = crops(), masks_of()
    out = m.forward_views(views, masks)
    assert "loss_gram" not in out.scalars
    assert out.loss.item() == pytest.approx(official_loss(ref, views, masks, "sinkhorn_knopp")[0].item(), rel=1e-5)


def test_the_ema_teachers_own_tokens_as_targets():
    """gram.ema_teacher: no Gram teacher; the targets are the EMA teacher's patch tokens (ssl_meta_arch.py:481-482)."""
    m = dinov3({"gram_ema_teacher": True, "centering": "sinkhorn_knopp"})
    assert not hasattr(m, "gram_teacher")
    m.gram_on, m.gram_weight = True, 1.0
    views, masks = crops(), masks_of()
    ref = copy.deepcopy(m)
    out = m.forward_views(views, masks)
    g = torch.cat(views[:2])
    with torch.no_grad():
        t = ref.teacher_backbone(g, return_all_tokens=True)[:, 1:]
    want = gram_official(ref.backbone(g, masks, return_all_tokens=True)[:, 1:], t, True)
    assert out.scalars["loss_gram"].item() == pytest.approx(want.item(), rel=1e-5)


def test_user_errors():
    for extra, match in [({"gram_remove_neg": True, "gram_remove_only_teacher_neg": True}, "exclude each other"),
                         ({"gram_tokens_used": "masked"}, "gram_img_level=false"),
                         ({"gram_tokens_used": "some"}, "gram_tokens_used"),
                         ({"gram_ema_teacher": True, "gram_rep_update": True}, "gram_ema_teacher"),
                         ({"gram_loss_weight_schedule": [0.0, 1.0]}, "gram_loss_weight_schedule"),
                         ({"gram_update_frequency": 0.0}, "gram_update_frequency")]:
        with pytest.raises(UserError, match=match):
            dinov3(extra)
