"""method.version v2 and v3 of method.name=distill (methods/distill.py): LightlyTrain's later distillations
(lightly-train 8f5a75c4 ``_methods/distillationv2``, ``_methods/distillationv3``). Each loss against a reference
written here from its source's lines; the feature maps of both networks (models/dense.py); the student's map
projected and resized bilinearly onto the teacher's grid; whole steps against a loop written here; the heads and
their init; the user errors. v1 is tests/test_distill.py's."""

from __future__ import annotations

import copy
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from ssl_helpers import tiny_method
from test_distill import teacher_file

from selfsup.errors import UserError
from selfsup.losses import distillation_mse_loss, local_distillation_loss
from selfsup.methods.distill import on_grid
from selfsup.models.backbones import build_backbone
from selfsup.models.dense import feature_maps
from selfsup.models.own import GlobalPool

B = 8


def versioned(tmp_path, version, extra=None, teacher="vit_micro", **sections):
    """A distill method of ``version`` on digits (the run's statistics 0.5 / 0.25; the teacher's file 0.3 / 0.3)."""
    path = teacher_file(tmp_path, teacher, patch_size=2) if teacher == "vit_micro" else teacher_file(tmp_path, teacher)
    return tiny_method("distill", {"teacher": {"weights": path}, "queue_size": 24, "version": version,
                                   **(extra or {})}, **sections)


def teacher_input(x):
    return (x * 0.25 + 0.5 - 0.3) / 0.3


def softmax(a, dim=-1):
    e = torch.exp(a - a.max(dim=dim, keepdim=True).values)
    return e / e.sum(dim=dim, keepdim=True)


def kl_rows(p, q):
    """Σ_rows KL(p_row ‖ q_row) / rows, with p, q (rows, K) probabilities (KLDivLoss batchmean)."""
    return (p * (p.log() - q.log())).sum() / p.shape[0]


def bilinear(fmap, out):
    """(B, C, h, w) → (B, C, out, out), align_corners False, written per output position: the source coordinate
    (i + ½)·h/out − ½ clamped at 0, its two neighbours (the upper one clamped at h − 1)."""
    def taps(n_in):
        rows = []
        for i in range(out):
            src = max((i + 0.5) * n_in / out - 0.5, 0.0)
            i0 = int(math.floor(src))
            rows.append((i0, min(i0 + 1, n_in - 1), src - i0))
        return rows
    result = torch.zeros(fmap.shape[0], fmap.shape[1], out, out)
    for i, (a0, a1, wa) in enumerate(taps(fmap.shape[2])):
        for j, (b0, b1, wb) in enumerate(taps(fmap.shape[3])):
            result[:, :, i, j] = ((1 - wa) * (1 - wb) * fmap[:, :, a0, b0] + (1 - wa) * wb * fmap[:, :, a0, b1]
                                  + wa * (1 - wb) * fmap[:, :, a1, b0] + wa * wb * fmap[:, :, a1, b1])
    return result


# --------------------------------------------------------------------------- the losses


def test_the_v2_loss_is_the_mean_squared_error_over_every_element():
    g = torch.Generator().manual_seed(0)
    s, t = torch.randn(3, 5, 7, generator=g), torch.randn(3, 5, 7, generator=g)
    expect = sum(float((s[b, n, d] - t[b, n, d]) ** 2) for b in range(3) for n in range(5) for d in range(7)) / 105
    assert float(distillation_mse_loss(s, t)) == pytest.approx(expect, rel=1e-6)


def test_the_v3_local_loss_is_the_kl_of_each_image_s_patch_to_patch_softmaxes():
    """Per image b and patch i: p = softmax_j(f_i · f_j / τ) over the image's own patches; KL(p_t ‖ p_s) summed
    over every (b, i) row and divided by B·N (distillationv3_loss.py:86-115)."""
    g = torch.Generator().manual_seed(1)
    s, t = (F.normalize(torch.randn(2, 5, 6, generator=g), dim=-1) for _ in range(2))
    tau, total = 0.5, 0.0  # at a small τ the diagonal dominates and a softmax over the wrong axis hides
    for b in range(2):
        for i in range(5):
            p_t = softmax(torch.stack([t[b, i] @ t[b, j] for j in range(5)]) / tau)
            p_s = softmax(torch.stack([s[b, i] @ s[b, j] for j in range(5)]) / tau)
            total += float((p_t * (p_t.log() - p_s.log())).sum())
    assert float(local_distillation_loss(s, t, tau)) == pytest.approx(total / 10, rel=1e-5)
    assert float(local_distillation_loss(t, t, tau)) == pytest.approx(0.0, abs=1e-6)
    s.requires_grad_(True)
    local_distillation_loss(s, t, tau).backward()
    assert s.grad.abs().sum() > 0


# --------------------------------------------------------------------------- the feature maps


def test_feature_maps_of_a_vit_are_its_last_blocks_normed_patch_tokens():
    """DINOv2's get_intermediate_layers(x, n, norm=True, reshape=True): each of the last n blocks through the final
    norm, the class token dropped, the patches as a row-major grid; the pooled feature is forward's."""
    torch.manual_seed(0)
    vit = build_backbone("vit_micro", in_chans=1, image_size=8, patch_size=2).eval()
    x = torch.randn(2, 1, 8, 8)
    pooled, maps = feature_maps(vit, x, 2)
    tokens = vit._tokens(x)
    outs = []
    for block in vit.blocks:
        tokens = block(tokens)
        outs.append(vit.norm(tokens))
    for got, want in zip(maps, outs[-2:]):
        assert got.shape == (2, 128, 4, 4)
        for r in range(4):
            for c in range(4):
                torch.testing.assert_close(got[:, :, r, c], want[:, 1 + 4 * r + c])
    torch.testing.assert_close(pooled, vit(x))


@pytest.mark.parametrize("name", ["resnet18", "bn_cnn_tiny", "own", "timm:resnet10t"])
def test_feature_maps_of_a_convnet_are_its_last_map_and_its_own_pooled_output(name):
    torch.manual_seed(0)
    if name == "own":
        net = GlobalPool(torch.nn.Sequential(torch.nn.Conv2d(1, 5, 3, stride=2), torch.nn.ReLU()), 5)
    else:
        kwargs = {"small_stem": True} if name == "resnet18" else {}
        net = build_backbone(name, in_chans=1, **({"image_size": 16} if name.startswith("timm") else {}), **kwargs)
    net.eval()
    x = torch.randn(2, 1, 16, 16)
    pooled, (fmap,) = feature_maps(net, x)
    assert fmap.dim() == 4 and fmap.shape[1] == net.num_features
    torch.testing.assert_close(pooled, net(x), rtol=0, atol=0)
    torch.testing.assert_close(fmap.mean(dim=(2, 3)), pooled, rtol=1e-5, atol=1e-6)
    with pytest.raises(UserError, match="one feature map"):
        feature_maps(net, x, 2)


def _randomised(net, seed=0):
    torch.manual_seed(seed)
    with torch.no_grad():
        for t in net.parameters():
            t.normal_(0, 0.2)
    return net.eval()


def test_feature_maps_of_a_dinov3_vit_are_its_last_blocks_final_norm_patch_tokens():
    """The official get_intermediate_layers(x, n, norm=True, reshape=True) (dinov3 vision_transformer.py:285-308,
    lightly-train's copy :321-392) written as its block loop: [CLS, storage, patches], each block with the image's
    rotary (sin, cos); each of the last n through cls_norm (the class and storage tokens, untied) and norm (the
    patches); the storage tokens dropped; the patches a row-major grid (here 2 × 3: not square). The pooled feature
    is the final-norm [CLS] (LightlyTrain's forward_pool, dinov3_vit.py:86-87), forward's."""
    from selfsup.models.dinov3 import DINOv3ViT

    vit = _randomised(DINOv3ViT(image_size=32, patch_size=4, embed_dim=16, depth=3, num_heads=2, storage_tokens=2,
                                untie_cls_norm=True))
    x = torch.randn(2, 3, 8, 12, generator=torch.Generator().manual_seed(1))
    pooled, maps = feature_maps(vit, x, 2)
    patches = vit.patch_embed(x)
    t = torch.cat([vit.cls_token.expand(2, -1, -1), vit.storage_tokens.expand(2, -1, -1), patches], dim=1)
    rope, outs = vit.rope_embed(2, 3), []
    for block in vit.blocks:
        t = block(t, rope)
        outs.append(torch.cat([vit.cls_norm(t[:, :3]), vit.norm(t[:, 3:])], dim=1))
    assert len(maps) == 2
    for got, want in zip(maps, outs[-2:]):
        assert got.shape == (2, 16, 2, 3)
        for r in range(2):
            for c in range(3):
                torch.testing.assert_close(got[:, :, r, c], want[:, 3 + 3 * r + c])
    torch.testing.assert_close(pooled, outs[-1][:, 0])
    torch.testing.assert_close(pooled, vit(x))
    torch.testing.assert_close(vit.forward_last_blocks(x, 2), torch.cat([o[:, 0] for o in outs[-2:]], dim=-1))


def test_feature_maps_of_a_dinov3_convnext_are_its_normed_last_stage_pooled_by_the_mean():
    """LightlyTrain's DINOv3 ConvNeXt (dinov3_convnext.py:63-78): the last stage's map, the final LayerNorm at each
    position (x_norm_patchtokens as a grid), pooled by an average pool (not the official [CLS], the norm of the mean);
    one map only (the stages' widths differ)."""
    from selfsup.models.dinov3 import DINOv3ConvNeXt

    net = _randomised(DINOv3ConvNeXt(depths=(1, 1, 1, 1), dims=(4, 8, 8, 12)))
    x = torch.randn(2, 3, 64, 32, generator=torch.Generator().manual_seed(1))
    pooled, (fmap,) = feature_maps(net, x)
    y = x
    for down, stage in zip(net.downsample_layers, net.stages):
        y = stage(down(y))
    mu, var = y.mean(1, keepdim=True), y.var(1, unbiased=False, keepdim=True)
    want = (y - mu) / torch.sqrt(var + 1e-6) * net.norm.weight[:, None, None] + net.norm.bias[:, None, None]
    assert fmap.shape == (2, 12, 2, 1)
    torch.testing.assert_close(fmap, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pooled, want.mean(dim=(2, 3)), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fmap.flatten(2).transpose(1, 2), net.forward_dict(x)["x_norm_patchtokens"])
    with pytest.raises(UserError, match="a DINOv3 ConvNeXt gives its last stage's map, not its last 2"):
        feature_maps(net, x, 2)
    assert feature_maps(net, x[..., :32, :32])[1][0].shape == (2, 12, 1, 1)
    with pytest.raises(UserError, match=r"at least 32 px a side \(its stride\), got \(31, 32\); set data.image_size"):
        net(x[..., :31, :32])


def dinov3_hub_file(tmp_path, name="dinov3_vitb16_pretrain_lvd1689m-73cec8be.pth", **kwargs) -> str:
    """A tiny random DINOv3 ViT in the official hub layout (its state dict and the file's (1, D) mask token), patch
    16 (the releases')."""
    from selfsup.models.dinov3 import DINOv3ViT

    net = _randomised(DINOv3ViT(**{"image_size": 32, "patch_size": 16, "embed_dim": 16, "depth": 2, "num_heads": 2,
                                   **kwargs}))
    torch.save({**net.state_dict(), "mask_token": torch.zeros(1, net.embed_dim)}, tmp_path / name)
    return str(tmp_path / name)


def test_v2_and_v3_read_a_dinov3_teacher_file_s_grid(tmp_path):
    """A DINOv3 hub file as the teacher (its architecture read from the file), in its own input normalisation:
    v3's pooled feature is its [CLS] and its map the 2 × 2 grid of a 32-px view at patch 16; v2 reads its last two
    blocks (2 × 16 channels); a step of each trains."""
    from ssl_helpers import tiny_config

    from selfsup.methods import DataInfo
    from selfsup.methods.build import build_method
    from selfsup.models.dinov3 import DINOv3ViT

    path = dinov3_hub_file(tmp_path)
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    for version, n in (("v3", 1), ("v2", 2)):
        cfg = tiny_config("distill", {"teacher": {"weights": path}, "queue_size": 8, "version": version},
                          data={"image_size": 32}, model={"patch_size": 8})
        m = build_method(cfg, DataInfo(3, 32, (0.5,) * 3, (0.25,) * 3))
        assert isinstance(m.teacher.network, DINOv3ViT)
        pooled, fmap = m.teacher_maps(x, n)
        assert pooled.shape == (2, 16) and fmap.shape == (2, 16 * n, 2, 2)
        want_pooled, want_maps = feature_maps(m.teacher.network, m.teacher.input_map(x), n)
        torch.testing.assert_close(fmap, torch.cat(want_maps, dim=1))
        torch.testing.assert_close(pooled, m.teacher.network(m.teacher.input_map(x)))
        loss = m.forward_views([x]).loss
        loss.backward()
        assert torch.isfinite(loss) and m.backbone.cls_token.grad is not None


def test_a_dinov3_convnext_teacher_file_gives_its_last_map_to_v2_and_v3(tmp_path):
    """A DINOv3 ConvNeXt hub file as the teacher: v3's pooled feature is the mean of its normed last map (2 × 2 at
    64 px), and a step trains; v2 takes its last map only (n_teacher_blocks=1), its last two stages are one line."""
    from ssl_helpers import tiny_config

    from selfsup.methods import DataInfo
    from selfsup.methods.build import build_method
    from selfsup.models.dinov3 import DINOv3ConvNeXt

    torch.save(_randomised(DINOv3ConvNeXt(depths=(1, 1, 1, 1), dims=(4, 8, 8, 12))).state_dict(), tmp_path / "c.pth")
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(3))

    def method(version, **extra):
        cfg = tiny_config("distill", {"teacher": {"weights": str(tmp_path / "c.pth")}, "queue_size": 8,
                                      "version": version, **extra}, data={"image_size": 64}, model={"patch_size": 16})
        return build_method(cfg, DataInfo(3, 64, (0.5,) * 3, (0.25,) * 3))

    for m in (method("v3"), method("v2", n_teacher_blocks=1)):
        assert isinstance(m.teacher.network, DINOv3ConvNeXt)
        pooled, fmap = m.teacher_maps(x)
        assert pooled.shape == (2, 12) and fmap.shape == (2, 12, 2, 2)
        torch.testing.assert_close(pooled, fmap.mean(dim=(2, 3)))
        assert torch.isfinite(m.forward_views([x]).loss)
    with pytest.raises(UserError, match="method.n_teacher_blocks=2: a DINOv3ConvNeXt teacher gives its last feature"):
        method("v2", n_teacher_blocks=2)


def test_the_student_map_is_projected_per_position_then_resized_bilinearly_to_the_teacher_grid():
    g = torch.Generator().manual_seed(2)
    fmap = torch.randn(2, 3, 2, 2, generator=g)
    head = torch.nn.Linear(3, 4)
    projected = torch.einsum("bchw,dc->bdhw", fmap, head.weight) + head.bias[None, :, None, None]
    expect = bilinear(projected, 5)  # (B, 4, 5, 5), rows flattened row-major
    got = on_grid(fmap, head, (5, 5))
    assert got.shape == (2, 25, 4)
    torch.testing.assert_close(got, expect.flatten(2).transpose(1, 2), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(on_grid(fmap, head, (2, 2)), projected.flatten(2).transpose(1, 2))


# --------------------------------------------------------------------------- heads


def test_the_heads_of_each_version(tmp_path):
    v1, v2, v3 = (versioned(tmp_path, v) for v in ("v1", "v2", "v3"))
    assert set(v1.trainable()) == {"backbone", "projector"} and hasattr(v1, "queue")
    assert set(v2.trainable()) == {"backbone", "local_projector"} and not hasattr(v2, "queue")
    assert set(v3.trainable()) == {"backbone", "projector", "local_projector"} and v3.queue.shape == (24, 128)
    # v2: one Linear to n_teacher_blocks × the teacher's width, trunc-normal .02, zero bias (distillationv2.py:116-152)
    head = v2.local_projector
    assert (head.in_features, head.out_features) == (128, 256) and not head.bias.any()
    assert 0.018 < float(head.weight.detach().std()) < 0.022  # torch's trunc_normal_(std=.02) truncates at ±2: a normal
    deep = versioned(tmp_path, "v2", {"projection_layers": 3, "projection_hidden_dim": 32}).local_projector
    kinds = [type(m).__name__ for m in deep]
    assert kinds == ["Linear", "LayerNorm", "GELU", "Linear", "LayerNorm", "GELU", "Linear"]
    assert [deep[i].out_features for i in (0, 3, 6)] == [32, 32, 256] and not any(deep[i].bias.any() for i in (0, 3, 6))
    # v3: two Linears to the teacher's width, trunc-normal .02, biases PyTorch's default (distillationv3.py:203-214)
    for head in (v3.projector, v3.local_projector):
        assert (head.in_features, head.out_features) == (128, 128) and head.bias.abs().max() > 0
        assert 0.017 < float(head.weight.detach().std()) < 0.023


# --------------------------------------------------------------------------- whole steps


def reference_v3(m, x, lam, perm, queue):
    """distillationv3.py's training_step_impl written out on the method's own modules: (loss, the new queue)."""
    mixed = lam * x + (1 - lam) * x[perm]
    with torch.no_grad():
        tokens = m.teacher.network.forward_features(teacher_input(mixed))
        t = F.normalize(tokens[:, 0], dim=-1)
        t_local = F.normalize(tokens[:, 1:], dim=-1)
    grid = int(round(t_local.shape[1] ** 0.5))
    student = m.backbone
    if hasattr(student, "forward_features"):  # a ViT student: its [CLS] and its patch tokens
        st = student.forward_features(mixed)
        h, smap = st[:, 0], st[:, 1:].transpose(1, 2).reshape(B, st.shape[-1], 4, 4)
    else:  # the ConvNet: its last stage and its mean
        smap = student.features(mixed)
        h = smap.mean(dim=(2, 3))
    s = F.normalize(m.projector(h), dim=-1)
    local = torch.einsum("bchw,dc->bdhw", smap, m.local_projector.weight) + m.local_projector.bias[:, None, None]
    s_local = F.normalize(F.interpolate(local, size=(grid, grid), mode="bilinear").flatten(2).transpose(1, 2), dim=-1)
    queue = torch.cat([t, queue[:-B]])
    tau = m.cfg.method.temperature
    global_loss = kl_rows(softmax(t @ queue.T / tau), softmax(s @ queue.T / tau))
    tl = m.cfg.method.temperature_local
    p_t = softmax(t_local @ t_local.transpose(1, 2) / tl).flatten(0, 1)
    p_s = softmax(s_local @ s_local.transpose(1, 2) / tl).flatten(0, 1)
    return global_loss + m.cfg.method.local_weight * kl_rows(p_t, p_s), queue


def draws(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, 1, 8, 8, generator=g), torch.rand((), generator=g), torch.randperm(B, generator=g)


def test_a_v3_step_is_lightlytrain_s_loss_and_gradients(tmp_path):
    m = versioned(tmp_path, "v3", {"local_weight": 0.7, "temperature_local": 0.2})
    ref = copy.deepcopy(m)
    x, lam, perm = draws(3)
    m.queue.copy_(F.normalize(torch.randn(24, 128), dim=-1))
    before = m.queue.clone()
    out = m.forward_views([x], lam=lam, perm=perm)
    out.loss.backward()
    expect, queue = reference_v3(ref, x, lam, perm, before)
    expect.backward()
    torch.testing.assert_close(out.loss, expect, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m.queue, queue)
    assert set(out.scalars) >= {"global_loss", "local_loss"}
    for name in ("projector.weight", "local_projector.weight", "backbone.blocks.0.attn.qkv.weight"):
        got, want = m.get_parameter(name).grad, ref.get_parameter(name).grad
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7, msg=name)


def test_a_v2_step_is_the_mse_of_the_projected_student_map_against_the_teacher_s_last_two_blocks(tmp_path):
    m = versioned(tmp_path, "v2")
    x, lam, perm = draws(4)
    out = m.forward_views([x], lam=lam, perm=perm)
    mixed = lam * x + (1 - lam) * x[perm]
    with torch.no_grad():
        t_tokens = m.teacher.network.last_blocks_tokens(teacher_input(mixed), 2)
        target = torch.cat([tk[:, 1:] for tk in t_tokens], dim=-1)  # (B, 16, 256), the blocks concatenated
    s = m.backbone.forward_features(mixed)[:, 1:] @ m.local_projector.weight.T + m.local_projector.bias
    torch.testing.assert_close(out.loss, ((s - target) ** 2).mean(), rtol=1e-5, atol=1e-6)
    assert out.projection is None and out.embedding.shape == (B, 128)


def stand_in_trainer(method, step, epoch):
    method._trainer = SimpleNamespace(global_step=step, current_epoch=epoch, optimizers=[method._opt],
                                      accumulate_grad_batches=1,
                                      fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(
                                          batch_progress=SimpleNamespace(current=SimpleNamespace(completed=0)))))


def test_three_v3_steps_with_a_convnet_student_are_a_plain_loop_s(tmp_path):
    """LightlyTrain v3's default AdamW (its no-decay group: the ConvNet's BatchNorm and every bias), gradients
    clipped at norm 1 (Lightning's clipping, configure_gradient_clipping :400-410), the queue carried over the steps,
    the student's 2×2 map resized to the teacher's 4×4 grid; the reference: its own copy, torch's AdamW."""
    m = versioned(tmp_path, "v3", model={"backbone": "bn_cnn_tiny"},
                  optim={"base_lr": 2e-3, "weight_decay": 0.04, "decay_1d": False, "warmup_epochs": 1,
                         "min_lr": 2e-6, "fused": False, "lr_scaling": "sqrt"})
    m.total_steps, m.steps_per_epoch, m.max_epochs = 6, 2, 3
    ref = copy.deepcopy(m)
    m._opt = m.configure_optimizers()
    params = [p for name in ("backbone", "projector", "local_projector") for p in getattr(ref, name).parameters()]
    opt = torch.optim.AdamW([{"params": [p for p in params if p.ndim > 1], "weight_decay": 0.04},
                             {"params": [p for p in params if p.ndim <= 1], "weight_decay": 0.0}], lr=0.0)
    queue = ref.queue.clone()
    peak = 2e-3 * math.sqrt(16 / 256)  # optim.lr_scaling sqrt at the batch of 16
    for step in range(3):
        x, lam, perm = draws(10 + step)
        stand_in_trainer(m, step, step // 2)
        m.on_train_batch_start(None, step)
        m._opt.zero_grad(set_to_none=True)
        loss = m.forward_views([x], lam=lam, perm=perm).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for g in m._opt.param_groups for p in g["params"]], 1.0)
        m._opt.step()
        # the reference: linear warm-up over epoch 0 (2 steps), then cosine to min_lr scaled as the peak
        final = 2e-6 * math.sqrt(16 / 256)
        lr = peak * step / 2 if step < 2 else final + (peak - final) * 0.5 * (1 + math.cos(math.pi * (step - 2) / 4))
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        ref_loss, queue = reference_v3(ref, x, lam, perm, queue)
        ref_loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
        assert m._opt.param_groups[0]["lr"] == pytest.approx(lr, rel=1e-12)
    for (name, p), (_, q) in zip(m.state_dict().items(), ref.state_dict().items()):
        torch.testing.assert_close(p, q if name != "queue" else queue, rtol=1e-4, atol=1e-6, msg=name)


# --------------------------------------------------------------------------- user errors


def test_user_errors(tmp_path):
    with pytest.raises(UserError, match="method.version='v4' is not known"):
        versioned(tmp_path, "v4")
    with pytest.raises(UserError, match="method.local_weight applies to method.version v3, not v1"):
        versioned(tmp_path, "v1", {"local_weight": 2.0})
    with pytest.raises(UserError, match="method.teacher_centre applies to method.version v1 or v3, not v2"):
        versioned(tmp_path, "v2", {"teacher_centre": 0.9})
    with pytest.raises(UserError, match="method.n_teacher_blocks=2: a ConvNet teacher gives its last feature map"):
        versioned(tmp_path, "v2", teacher="bn_cnn_micro")
    import selfsup

    flat = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16))  # a user's network: (B, D), no map
    with pytest.raises(UserError, match="method.version=v3 reads the student's feature map; a Sequential"):
        selfsup.method("distill", flat, channels=1, image_size=8, batch_size=8,
                       method={"teacher": {"weights": teacher_file(tmp_path)}, "version": "v3"})
    m = versioned(tmp_path, "v3", model={"backbone": "bn_cnn_tiny"})  # a ConvNet teacher's map works with v3
    assert torch.isfinite(m.forward_views([torch.randn(B, 1, 8, 8)]).loss)


# --------------------------------------------------------------------------- the presets


DINOV2_B14, DINOV3_B16 = "dinov2_vitb14_pretrain.pth", "dinov3_vitb16_pretrain_lvd1689m-73cec8be.pth"


@pytest.mark.parametrize("preset, wd, teacher", [("distill-v3-dinov2-vitb14-r18-imagefolder", 1e-6, DINOV2_B14),
                                                 ("distill-v3-dinov2-vitb14-vits-imagefolder", 0.04, DINOV2_B14),
                                                 ("distill-dinov3-vitb16-r18-imagefolder", 1e-6, DINOV3_B16),
                                                 ("distill-dinov3-vitb16-vits-imagefolder", 0.04, DINOV3_B16)])
def test_the_v3_gpu_presets_are_lightlytrain_v3_s_defaults(preset, wd, teacher):
    """distillationv3.py:83-168 and method.py:89-121: τ 0.07 twice, local weight 1, the queue for 20,000+ images,
    AdamW 5e-4 at a batch of 1536 scaled by its square root, wd "auto" (1e-6 for a BatchNorm ConvNet, 0.04 for a
    ViT), none on biases and norms, warm-up min(10, epochs / 10), the end at 0.001 of the peak, clip 1, bf16 on a
    GPU; the teacher DINOv3 ViT-B/16 (v3's default, :96; the official file name, dinov3 hub/backbones.py:57,
    :277-285) or DINOv2 ViT-B/14 (v1 / v2's) at the student's 224 px; the ViT student DeiT-S/16 with learned
    positions and truncated-normal init. The teacher's file need not exist for the preset to resolve."""
    from selfsup.config import load_run_config

    c = load_run_config(preset, [])
    m, o = c.method, c.optim
    assert (c.method_name, m.version, m.teacher.weights) == ("distill", "v3", teacher)
    assert (c.trainer.precision, c.trainer.accelerator, c.trainer.max_epochs) == ("bf16-mixed", "gpu", 100)
    vit = (c.model.backbone, c.model.patch_size, c.model.pos_embed, c.model.init)
    assert vit == (("deit_small", 16, "learned", "trunc_normal") if wd == 0.04 else ("resnet18",) + vit[1:])
    assert (m.temperature, m.temperature_local, m.local_weight, m.queue_size, m.mixup) == (0.07, 0.07, 1.0, 8192, True)
    assert (o.name, o.lr_scaling, o.weight_decay, o.decay_1d, tuple(o.betas)) == ("adamw", "sqrt", wd, False,
                                                                                  (0.9, 0.999))
    assert o.base_lr == pytest.approx(5e-4 * math.sqrt(256 / 1536), rel=1e-4)
    assert o.min_lr == pytest.approx(1e-3 * o.base_lr, rel=1e-4)
    assert o.warmup_epochs == min(10, c.trainer.max_epochs / 10) and c.trainer.gradient_clip_val == 1.0
    assert (c.data.image_size, c.data.batch_size, c.augment.recipe or c.method_cls.recipe) == (224, 256, "distillation")


def test_the_teacher_sees_the_student_s_view_at_the_run_s_size(tmp_path):
    """LightlyTrain's teacher takes the student's one view (its transform's image size, 224 px): here the run's
    8 px through a teacher of patch 2, a 4 × 4 grid (a 2 × 2 one through patch 4)."""
    x = torch.randn(2, 1, 8, 8)
    pooled, fmap = versioned(tmp_path, "v3").teacher_maps(x)
    assert pooled.shape == (2, 128) and fmap.shape == (2, 128, 4, 4)
    (tmp_path / "p4").mkdir()
    coarse = tiny_method("distill", {"teacher": {"weights": teacher_file(tmp_path / "p4")}, "version": "v3"})
    assert coarse.teacher_maps(x)[1].shape == (2, 128, 2, 2)
