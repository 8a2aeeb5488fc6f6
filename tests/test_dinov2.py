"""DINOv2 against facebookresearch/dinov2, written out here from its code (nothing of it is imported).

The reference below is the official forward_backward (dinov2/train/ssl_meta_arch.py:132-346) on the same modules,
crops and masks: the teacher's [CLS] tokens swapped so crop A meets crop B, the masked patch tokens taken with
``nonzero`` (a data-dependent shape, as the code), DINOLoss / iBOTPatchLoss / KoLeoLoss as their files, the
loss terms' normalisation ``2 + max(2L, 1)``; then the optimiser rules of train.py and utils/param_groups.py.
"""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from selfsup.data.masks import dinov2_masks, dinov2_upperbound
from selfsup.errors import UserError
from selfsup.losses import sinkhorn_knopp
from ssl_helpers import tiny_method

HEADS = dict(out_dim=64, hidden_dim=32, bottleneck_dim=16, ibot_out_dim=48, ibot_hidden_dim=32,
             ibot_bottleneck_dim=16)
LOCAL2 = {"local_crops_number": 2, "local_crops_size": 4}
B = 8


def dinov2(extra=None, local=True, **sections):
    sections.setdefault("augment", LOCAL2 if local else {"local_crops_number": 0})
    return tiny_method("dinov2", {**HEADS, "warmup_teacher_temp_epochs": 0, **(extra or {})},
                       data={"batch_size": B}, **sections).train()


def crops(local=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    sizes = (8, 8, 4, 4) if local else (8, 8)
    return [torch.randn(B, 1, s, s, generator=g) for s in sizes]


def masks_of(seed=1):
    return dinov2_masks(2 * B, (4, 4), torch.Generator().manual_seed(seed)).flatten(1)


# ----------------------------------------------------------------------------- the official formulas, written out
def sk_official(t, temp, iters=3, n=None):
    """dino_clstoken_loss.py:35-61 (ibot_patch_loss.py:62-90 with B = n_masked_patches), one process."""
    Q = torch.exp(t.float() / temp).t()
    Bn, K = (Q.shape[1] if n is None else n), Q.shape[0]
    Q /= Q.sum()
    for _ in range(iters):
        Q /= Q.sum(dim=1, keepdim=True)
        Q /= K
        Q /= Q.sum(dim=0, keepdim=True)
        Q /= Bn
    Q *= Bn
    return Q.t()


def koleo_official(x, eps=1e-8):
    """koleo_loss.py:25-48."""
    x = F.normalize(x.float(), eps=eps, p=2, dim=-1)
    dots = torch.mm(x, x.t())
    n = x.shape[0]
    dots.view(-1)[:: (n + 1)].fill_(-1)
    _, nn_index = torch.max(dots, dim=1)
    return -torch.log(F.pairwise_distance(x, x[nn_index], 2, eps=1e-8) + eps).mean()


def official_loss(m, views, masks, centering, center=None, center2=None):
    """ssl_meta_arch.py forward_backward's loss_accumulator on the method's own modules."""
    c, temp = m.cfg.method, m.teacher_temp
    n_local = len(views) - 2
    g = torch.cat(views[:2])
    mask_indices = masks.flatten().nonzero().flatten()
    n_masked = mask_indices.shape[0]
    masks_weight = (1 / masks.sum(-1).clamp(min=1.0)).unsqueeze(-1).expand_as(masks)[masks]
    separate = c.ibot_separate_head
    with torch.no_grad():
        tt = m.teacher_backbone(g, return_all_tokens=True)
        t_cls = torch.cat(tt[:, 0].chunk(2)[::-1])  # swapped: A meets B
        t_patch = tt[:, 1:].flatten(0, 1).index_select(0, mask_indices)
        t_cls_out = m.teacher_head(t_cls)
        t_patch_out = (m.teacher_ibot_head if separate else m.teacher_head)(t_patch)
        if centering == "centering":
            q_cls = F.softmax((t_cls_out - center) / temp, dim=-1).view(2, -1, t_cls_out.shape[-1])
            q_patch = F.softmax((t_patch_out.unsqueeze(0) - center2) / temp, dim=-1).squeeze(0)
        else:
            q_cls = sk_official(t_cls_out, temp).view(2, -1, t_cls_out.shape[-1])
            q_patch = sk_official(t_patch_out, temp, n=n_masked)
    sg = m.backbone(g, masks, return_all_tokens=True)
    s_cls_g = sg[:, 0]
    s_patch = sg[:, 1:].flatten(0, 1).index_select(0, mask_indices)
    s_local = m.backbone(torch.cat(views[2:])) if n_local else None
    lsm = lambda s: F.log_softmax(s / c.student_temp, dim=-1)  # noqa: E731
    local_terms, global_terms = max(n_local * 2, 1), 2
    total = 0
    if n_local:
        loss = 0
        for s in m.head(s_local).chunk(n_local):
            for t in q_cls:
                loss -= torch.sum(t * lsm(s), dim=-1).mean()
        total = total + c.dino_loss_weight * loss / (global_terms + local_terms)
    loss_g = -torch.sum(q_cls.flatten(0, 1) * lsm(m.head(s_cls_g)), dim=-1).mean()
    total = total + c.dino_loss_weight * loss_g * 2 / (global_terms + local_terms)
    total = total + c.koleo_loss_weight * sum(koleo_official(p) for p in s_cls_g.chunk(2))
    s_patch_out = (m.ibot_head if separate else m.head)(s_patch)
    ibot = -(torch.sum(q_patch * lsm(s_patch_out), dim=-1) * masks_weight).sum() / masks.shape[0]
    return total + c.ibot_loss_weight * ibot * 2 * 0.5, t_cls_out, t_patch_out


# ----------------------------------------------------------------------------- losses and targets
@pytest.mark.parametrize("centering", ["centering", "sinkhorn_knopp"])
@pytest.mark.parametrize("separate", [False, True])
@pytest.mark.parametrize("local", [True, False])
def test_the_loss_and_its_gradients_are_the_official_ones(centering, separate, local):
    m = dinov2({"centering": centering, "ibot_separate_head": separate}, local=local)
    with torch.no_grad():  # a non-zero centre, so that centring matters
        m.center.normal_(0, 0.3)
        m.center2.normal_(0, 0.3)
    center, center2 = m.center.clone(), m.center2.clone()
    views, masks = crops(local), masks_of()
    ref = copy.deepcopy(m)
    out = m.forward_views(views, masks)
    out.loss.backward()
    want, t_cls, t_patch = official_loss(ref, views, masks, centering, center, center2)
    want.backward()
    assert out.loss.item() == pytest.approx(want.item(), rel=1e-5)
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        if p.grad is not None or q.grad is not None:
            scale = float(q.grad.abs().max())  # float rounding relative to the tensor's largest entry
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6 + 1e-6 * scale, msg=name)
    if centering == "centering":  # C ← 0.9 C + 0.1 mean(t_cls); C2 over the masked patches
        torch.testing.assert_close(m.center, 0.9 * center + 0.1 * t_cls.mean(0, keepdim=True))
        torch.testing.assert_close(m.center2, 0.9 * center2 + 0.1 * t_patch.mean(0).view(1, 1, -1))
    else:  # the centres are neither used nor updated
        assert torch.equal(m.center, center) and torch.equal(m.center2, center2)


def test_without_local_crops_the_dino_term_is_two_thirds_of_the_pair_mean():
    """n_local_crops_loss_terms = max(0 · 2, 1) = 1: the global term over 3, not 2 (ssl_meta_arch.py:147-148)."""
    m = dinov2({"koleo_loss_weight": 0.0, "ibot_loss_weight": 0.0}, local=False)
    out = m.forward_views(crops(False), torch.zeros(2 * B, 16, dtype=torch.bool))
    s = m.head(m.backbone(torch.cat(crops(False))))
    t = m.teacher_head(m.teacher_backbone(torch.cat(crops(False))))
    q = F.softmax(t / m.teacher_temp, dim=-1)  # a zero centre
    lsm = F.log_softmax(s / 0.1, dim=-1)
    ce = lambda a, b: -(q[a * B:(a + 1) * B] * lsm[b * B:(b + 1) * B]).sum(-1).mean()  # noqa: E731
    assert out.loss.item() == pytest.approx(((ce(0, 1) + ce(1, 0)) / 3).item(), rel=1e-5)


def test_sinkhorn_over_the_valid_rows_equals_the_official_on_those_rows():
    g = torch.Generator().manual_seed(0)
    t = torch.randn(12, 10, generator=g)
    valid = torch.tensor([1, 1, 0, 1, 0, 0, 1, 1, 1, 0, 1, 1.0])
    got = sinkhorn_knopp(t, 0.07, 3, valid=valid)
    want = sk_official(t[valid.bool()], 0.07, n=int(valid.sum()))
    torch.testing.assert_close(got[valid.bool()], want)
    assert torch.equal(got[~valid.bool()], torch.zeros(4, 10))
    torch.testing.assert_close(sinkhorn_knopp(t, 0.07, 3), sk_official(t, 0.07))  # SwAV's path unchanged


# ----------------------------------------------------------------------------- masks
def test_the_masks_follow_the_collate():
    """Half the crops masked (int(n · p)), the i-th masked crop's count in [int(N p_i), int(N p_i+1)] of
    linspace(0.1, 0.5, k + 1) (blocks may stop short, never pass it), at most int(0.5 N) each; U = upperbound."""
    n, grid = 64, (8, 8)
    m = dinov2_masks(n, grid, torch.Generator().manual_seed(0)).flatten(1)
    counts = m.sum(1)
    assert int((counts > 0).sum()) <= 32 and int((counts > 0).sum()) >= 28  # a count can round down to 0 blocks
    assert int(counts.max()) <= 32
    p = torch.linspace(0.1, 0.5, 33)
    assert dinov2_upperbound(n, grid) == int(sum(int(64 * float(x)) for x in p[1:]))
    assert int(counts.sum()) <= dinov2_upperbound(n, grid)
    # the stratified targets: sorted, the counts of the masked crops never exceed the sorted upper ends
    ends = sorted(int(64 * float(x)) for x in p[1:])
    assert all(a <= b for a, b in zip(sorted(counts[counts > 0].tolist()), ends[-int((counts > 0).sum()):]))


def test_the_masks_are_drawn_from_the_steps_generator():
    a = dinov2_masks(16, (4, 4), torch.Generator().manual_seed(5))
    assert torch.equal(a, dinov2_masks(16, (4, 4), torch.Generator().manual_seed(5)))
    assert not torch.equal(a, dinov2_masks(16, (4, 4), torch.Generator().manual_seed(6)))


# ----------------------------------------------------------------------------- the optimiser and three steps
def official_groups(model: dict, decay: float, patch_mult: float, depth: int) -> list[dict]:
    """utils/param_groups.py get_params_groups_with_decay on the student's modules (names as the code's)."""
    out = []
    for key, module in model.items():
        for name, p in module.named_parameters():
            if not p.requires_grad:
                continue
            layer_id = depth + 1
            if key == "backbone":
                if any(k in name for k in ("pos_embed", "patch_embed", "masked_embed", "cls_token", "register_tokens")):
                    layer_id = 0
                elif "blocks." in name:
                    layer_id = int(name.split(".")[1]) + 1
            lr_mult = decay ** (depth + 1 - layer_id) if key == "backbone" else 1.0
            if "patch_embed" in name:
                lr_mult *= patch_mult
            wd_mult = 0.0 if (name.endswith(".bias") or "norm" in name or "gamma" in name) else 1.0
            out.append({"params": [p], "lr_multiplier": lr_mult, "wd_multiplier": wd_mult,
                        "is_last_layer": "last_layer" in name})
    return out


def stand_in_trainer(method, step, epoch):
    method._trainer = SimpleNamespace(global_step=step, current_epoch=epoch, optimizers=[method._opt],
                                      accumulate_grad_batches=1,
                                      fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(
                                          batch_progress=SimpleNamespace(current=SimpleNamespace(completed=0)))))


def test_three_training_steps_over_an_epoch_boundary_are_the_official_ones():
    """Steps 0-2 with 2 steps an epoch: the last layer at lr 0 in epoch 0 (moments still accumulate), layer-wise
    decay and the patch-embedding multiplier, per-module clipping, the wd / momentum schedules, the EMA of every
    student module; the reference steps a plain AdamW with the official groups, its own copy of every module."""
    extra = {"ibot_separate_head": True, "clip_grad": 0.05, "freeze_last_layer": 1, "layerwise_decay": 0.7,
             "momentum": 0.9}
    m = dinov2(extra, optim={"base_lr": 0.05, "weight_decay": 0.04, "warmup_epochs": 0, "lr_scaling": "sqrt_1024",
                             "fused": False}, model={"stop_grad_conv1": False, "layer_scale": 1e-5})
    m.total_steps, m.steps_per_epoch, m.max_epochs = 6, 2, 3
    ref = copy.deepcopy(m)
    m._opt = m.configure_optimizers()
    student = {"backbone": ref.backbone, "head": ref.head, "ibot_head": ref.ibot_head}
    groups = official_groups(student, 0.7, 0.2, ref.backbone.depth)
    opt = torch.optim.AdamW(groups, lr=0.0, betas=(0.9, 0.999))
    teachers = {"backbone": ref.teacher_backbone, "head": ref.teacher_head, "ibot_head": ref.teacher_ibot_head}
    peak = 0.05 * math.sqrt(B / 1024)
    for step in range(3):
        epoch = step // 2
        views, masks = crops(seed=step), masks_of(seed=10 + step)
        stand_in_trainer(m, step, epoch)
        m.on_train_batch_start(None, step)
        m._opt.zero_grad(set_to_none=True)
        m.forward_views(views, masks).loss.backward()
        m.on_before_optimizer_step(m._opt)
        m._opt.step()
        m.teacher_ema()
        # the reference: train.py's loop body
        lr = 0.5 * peak * (1 + math.cos(math.pi * step / 6)) + 0.0 * 0.5  # min_lr 0, no warm-up
        wd = 0.4 + 0.5 * (0.04 - 0.4) * (1 + math.cos(math.pi * step / 6))
        mom = 1 + 0.5 * (0.9 - 1) * (1 + math.cos(math.pi * step / 6))
        for gr in opt.param_groups:
            gr["weight_decay"] = wd * gr["wd_multiplier"]
            gr["lr"] = (0.0 if (gr["is_last_layer"] and step < 2) else lr) * gr["lr_multiplier"]
        opt.zero_grad(set_to_none=True)
        ref.teacher_temp = m.teacher_temp
        official_loss(ref, views, masks, "centering", ref.center.clone(), ref.center2.clone())[0].backward()
        ref.update_centers(*official_targets_for_centres(ref, views, masks))
        for module in student.values():  # FSDP clip_grad_norm_ per module
            torch.nn.utils.clip_grad_norm_(module.parameters(), 0.05)
        opt.step()
        with torch.no_grad():
            for key in student:  # update_teacher over the names both hold (the mask token is the student's)
                shadow = dict(teachers[key].named_parameters())
                for n, p in student[key].named_parameters():
                    if n in shadow:
                        shadow[n].mul_(mom).add_(p.detach(), alpha=1 - mom)
        assert m.momentum == pytest.approx(mom, rel=1e-12)
    for (name, p), (_, q) in zip(m.state_dict().items(), ref.state_dict().items()):  # noqa: B007
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)  # Adam: rounding moves ~1e-6 (lr 4e-3)


def official_targets_for_centres(m, views, masks):
    """The teacher logits the centres are updated with (the step's, before its optimiser step)."""
    with torch.no_grad():
        tt = m.teacher_backbone(torch.cat(views[:2]), return_all_tokens=True)
        idx = masks.flatten().nonzero().flatten()
        t_patch = (m.teacher_ibot_head if m.cfg.method.ibot_separate_head else m.teacher_head)(
            tt[:, 1:].flatten(0, 1).index_select(0, idx))
        padded = torch.zeros(dinov2_upperbound(masks.shape[0], (4, 4)), t_patch.shape[1])
        padded[:t_patch.shape[0]] = t_patch
        valid = torch.zeros(padded.shape[0])
        valid[:t_patch.shape[0]] = 1
        return m.teacher_head(tt[:, 0]), padded, valid


def test_the_last_layer_moves_only_after_the_frozen_epoch():
    m = dinov2({"freeze_last_layer": 1})
    m.total_steps, m.steps_per_epoch, m.max_epochs = 6, 2, 3
    m._opt = m.configure_optimizers()
    last = [g for g in m._opt.param_groups if g["name"] == "last_layer"]
    assert last and all(p.ndim >= 1 for g in last for p in g["params"])
    for step, frozen in ((0, True), (1, True), (2, False)):
        stand_in_trainer(m, step, step // 2)
        m.on_train_batch_start(None, step)
        assert all((g["lr"] == 0.0) == frozen for g in last), step


def test_user_errors():
    with pytest.raises(UserError, match="centering"):
        dinov2({"centering": "none"})
    with pytest.raises(UserError, match="mask_ratio_min_max"):
        dinov2({"mask_ratio_min_max": [0.5, 0.1]})
    with pytest.raises(UserError, match="selfsup ViT"):
        dinov2(model={"backbone": "bn_cnn_tiny"})


def test_registers_and_swiglu_leave_the_outputs_shaped_as_before():
    from selfsup.models.vit import VisionTransformer

    torch.manual_seed(0)
    v = VisionTransformer(image_size=8, patch_size=2, in_chans=1, embed_dim=32, depth=2, num_heads=2, registers=4,
                          ffn="swiglu", drop_path_rate=0.2, drop_path_uniform=True, init="trunc_normal")
    x = torch.randn(3, 1, 8, 8)
    assert v(x, return_all_tokens=True).shape == (3, 17, 32) and v(x).shape == (3, 32)
    assert v.register_tokens.shape == (1, 4, 32) and v.layer_id("register_tokens") == 0
    assert [b.drop_path.p for b in v.blocks] == [0.2, 0.2]
    assert v.blocks[0].mlp.w3.in_features == (int(128 * 2 / 3) + 7) // 8 * 8


def test_the_instruments_of_both_heads_and_of_koleo():
    m = dinov2()
    out = m.forward_views(crops(), masks_of())
    signs = out.instruments
    for key in ("dino_teacher_entropy", "dino_teacher_spread", "dino_center_norm", "dinov2_patch_teacher_entropy",
                "dinov2_patch_teacher_spread", "dinov2_center2_norm", "koleo_loss", "koleo_nn_distance"):
        assert key in signs and torch.isfinite(signs[key]), key
    masks = masks_of()
    with torch.no_grad():
        tt = m.teacher_backbone(torch.cat(crops()[:2]), return_all_tokens=True)
        t_patch = m.teacher_head(tt[:, 1:][masks])
    torch.testing.assert_close(signs["dinov2_patch_teacher_spread"], t_patch.std(0).mean() / m.teacher_temp)
    assert 0 < float(signs["dinov2_patch_teacher_entropy"]) <= math.log(64) + 1e-4
    assert set(out.scalars) == {"loss_dino", "loss_koleo", "loss_ibot"}


def test_cut_init_copies_the_student_into_the_teacher_by_name():
    """The student has a mask token the teacher lacks: cut-init's copy into the EMA targets matches names (a zip
    of the parameter lists would shift every tensor after it)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        m = tiny_method("dinov2", {**HEADS}, data={"batch_size": B}, interventions={"cut_init": 3.0})
    teacher = dict(m.teacher_backbone.named_parameters())
    for name, p in m.backbone.named_parameters():
        if name in teacher:
            assert torch.equal(p, teacher[name]), name
