"""I-JEPA against an independent re-implementation of facebookresearch/ijepa written here from its code's facts
(docs/JEPA.md §1): nothing of the official code is imported. The reference keeps the official structure (Python
loops over the batch and the attempts, lists of masks, ``apply_masks`` and ``repeat_interleave_batch`` as
loops, explicit attention), so a vectorised shortcut in selfsup that changes a value shows here.

- the multi-block masks: the official collator's loop replayed on the same random numbers (sizes, positions,
  refused attempts, the dropped restrictions, the truncation);
- the sin-cos table, the context encoder on the kept patches, the predictor, the loss on layer-normalised targets;
- the schedules (lr, weight decay, momentum) at every iteration, ``ipe_scale`` included;
- three whole training steps (AdamW with the code's four groups, the schedules, the EMA after the step).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from selfsup.data.jepa_masks import TIMEOUT, block_size, draw_multiblock, multiblock_masks
from selfsup.losses import ijepa_loss
from selfsup.models.jepa import ijepa_sincos_position_embedding

from ssl_helpers import raises_user_error, tiny_method


# ----------------------------------------------------------------------------- the reference (official facts)
def ref_block_size(u, scale, aspect, H, W):
    """multiblock.py:55-72."""
    s = scale[0] + u * (scale[1] - scale[0])
    max_keep = int(H * W * s)
    a = aspect[0] + u * (aspect[1] - aspect[0])
    h = int(round(math.sqrt(max_keep * a)))
    w = int(round(math.sqrt(max_keep / a)))
    while h >= H:
        h -= 1
    while w >= W:
        w -= 1
    return h, w


def ref_collate(draws, H, W, pred_scale, enc_scale, aspect, min_keep, allow_overlap):
    """multiblock.py:74-170, ``torch.randint`` replaced by the recorded draws in the order the loop asks for them."""
    B, npred = draws.pred_top.shape
    nenc = draws.enc_top.shape[1]
    p_size = ref_block_size(float(draws.u[0]), pred_scale, aspect, H, W)
    e_size = ref_block_size(float(draws.u[1]), enc_scale, (1.0, 1.0), H, W)

    def sample(b_size, positions, acceptable_regions=None):
        h, w = b_size
        tries, timeout, attempt = 0, TIMEOUT, 0
        while True:
            top, left = positions(attempt)
            attempt += 1
            mask = torch.zeros((H, W), dtype=torch.int32)
            mask[top:top + h, left:left + w] = 1
            if acceptable_regions is not None:
                for k in range(max(int(len(acceptable_regions) - tries), 0)):
                    mask *= acceptable_regions[k]
            mask = torch.nonzero(mask.flatten())
            if len(mask) > min_keep:
                break
            timeout -= 1
            if timeout == 0:
                tries += 1
                timeout = TIMEOUT
        complement = torch.ones((H, W), dtype=torch.int32)
        complement[top:top + h, left:left + w] = 0
        return mask.squeeze(), complement

    masks_pred, masks_enc = [], []
    min_keep_pred = min_keep_enc = H * W
    for b in range(B):
        mp, mc = [], []
        for i in range(npred):
            m, c = sample(p_size, lambda a, b=b, i=i: (int(draws.pred_top[b, i]), int(draws.pred_left[b, i])))
            mp.append(m)
            mc.append(c)
            min_keep_pred = min(min_keep_pred, len(m))
        masks_pred.append(mp)
        regions = None if allow_overlap else mc
        me = []
        for j in range(nenc):
            m, _ = sample(e_size, lambda a, b=b, j=j: (int(draws.enc_top[b, j, a]), int(draws.enc_left[b, j, a])),
                          regions)
            me.append(m)
            min_keep_enc = min(min_keep_enc, len(m))
        masks_enc.append(me)
    pred = [torch.stack([masks_pred[b][i][:min_keep_pred] for b in range(B)]) for i in range(npred)]
    enc = [torch.stack([masks_enc[b][j][:min_keep_enc] for b in range(B)]) for j in range(nenc)]
    return enc, pred


def ref_sincos(embed_dim, grid_size):
    """vision_transformer.py:22-82 (numpy, float64)."""
    def one_d(dim, pos):
        omega = np.arange(dim // 2, dtype=float)
        omega /= dim / 2.0
        omega = 1.0 / 10000 ** omega
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    g = np.arange(grid_size, dtype=float)
    grid = np.stack(np.meshgrid(g, g), axis=0).reshape([2, 1, grid_size, grid_size])
    return np.concatenate([one_d(embed_dim // 2, grid[0]), one_d(embed_dim // 2, grid[1])], axis=1)


def ref_apply_masks(x, masks):
    """src/masks/utils.py:11-20."""
    return torch.cat([torch.gather(x, 1, m.unsqueeze(-1).repeat(1, 1, x.size(-1))) for m in masks], dim=0)


def ref_repeat_interleave_batch(x, B, repeat):
    """src/utils/tensors.py:65-71."""
    N = len(x) // B
    return torch.cat([torch.cat([x[i * B:(i + 1) * B] for _ in range(repeat)], dim=0) for i in range(N)], dim=0)


class RefAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.num_heads, self.scale = heads, (dim // heads) ** -0.5
        self.qkv, self.proj = nn.Linear(dim, dim * 3), nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B, N, C))


class RefBlock(nn.Module):
    """vision_transformer.py:153-171 (no drop path)."""

    def __init__(self, dim, heads):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim, eps=1e-6), RefAttention(dim, heads)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Module()
        self.mlp.fc1, self.mlp.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp.fc2(F.gelu(self.mlp.fc1(self.norm2(x))))


class RefEncoder(nn.Module):
    """VisionTransformer.forward (vision_transformer.py:401-425), no class token."""

    def __init__(self, dim, depth, heads, patch, chans, grid):
        super().__init__()
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(chans, dim, patch, patch)
        self.pos_embed = nn.Parameter(torch.from_numpy(ref_sincos(dim, grid)).float()[None], requires_grad=False)
        self.blocks = nn.ModuleList([RefBlock(dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x, masks=None):
        x = self.patch_embed.proj(x).flatten(2).transpose(1, 2) + self.pos_embed
        if masks is not None:
            x = ref_apply_masks(x, masks)
        for blk in self.blocks:
            x = blk(x)
        return self.norm(x)


class RefPredictor(nn.Module):
    """VisionTransformerPredictor.forward (vision_transformer.py:285-326)."""

    def __init__(self, dim, pdim, depth, heads, grid):
        super().__init__()
        self.predictor_embed = nn.Linear(dim, pdim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, pdim))
        self.predictor_pos_embed = nn.Parameter(torch.from_numpy(ref_sincos(pdim, grid)).float()[None],
                                                requires_grad=False)
        self.predictor_blocks = nn.ModuleList([RefBlock(pdim, heads) for _ in range(depth)])
        self.predictor_norm = nn.LayerNorm(pdim, eps=1e-6)
        self.predictor_proj = nn.Linear(pdim, dim)

    def forward(self, x, masks_x, masks):
        B = len(x) // len(masks_x)
        x = self.predictor_embed(x)
        x = x + ref_apply_masks(self.predictor_pos_embed.repeat(B, 1, 1), masks_x)
        _, n_ctxt, _ = x.shape
        pos_embs = ref_apply_masks(self.predictor_pos_embed.repeat(B, 1, 1), masks)
        pos_embs = ref_repeat_interleave_batch(pos_embs, B, repeat=len(masks_x))
        pred_tokens = self.mask_token.repeat(pos_embs.size(0), pos_embs.size(1), 1) + pos_embs
        x = torch.cat([x.repeat(len(masks), 1, 1), pred_tokens], dim=1)
        for blk in self.predictor_blocks:
            x = blk(x)
        return self.predictor_proj(self.predictor_norm(x)[:, n_ctxt:])


def ref_train_loss(encoder, predictor, target_encoder, imgs, masks_enc, masks_pred):
    """train.py:295-313 (one process: AllReduce is the identity)."""
    with torch.no_grad():
        h = target_encoder(imgs)
        h = F.layer_norm(h, (h.size(-1),))
        B = len(h)
        h = ref_repeat_interleave_batch(ref_apply_masks(h, masks_pred), B, repeat=len(masks_enc))
    z = predictor(encoder(imgs, masks_enc), masks_enc, masks_pred)
    return F.smooth_l1_loss(z, h)


class RefWarmupCosine:
    """utils/schedulers.py:11-45."""

    def __init__(self, warmup_steps, start_lr, ref_lr, T_max, final_lr):
        self.start_lr, self.ref_lr, self.final_lr = start_lr, ref_lr, final_lr
        self.warmup_steps, self.T_max, self._step = warmup_steps, T_max - warmup_steps, 0.0

    def step(self):
        self._step += 1
        if self._step < self.warmup_steps:
            progress = float(self._step) / float(max(1, self.warmup_steps))
            return self.start_lr + progress * (self.ref_lr - self.start_lr)
        progress = float(self._step - self.warmup_steps) / float(max(1, self.T_max))
        return max(self.final_lr,
                   self.final_lr + (self.ref_lr - self.final_lr) * 0.5 * (1.0 + math.cos(math.pi * progress)))


class RefCosineWD:
    """utils/schedulers.py:48-76."""

    def __init__(self, ref_wd, T_max, final_wd):
        self.ref_wd, self.T_max, self.final_wd, self._step = ref_wd, T_max, final_wd, 0.0

    def step(self):
        self._step += 1
        progress = self._step / self.T_max
        new_wd = self.final_wd + (self.ref_wd - self.final_wd) * 0.5 * (1.0 + math.cos(math.pi * progress))
        return max(self.final_wd, new_wd) if self.final_wd <= self.ref_wd else min(self.final_wd, new_wd)


def ref_momentum(ema, ipe, epochs, ipe_scale):
    """train.py:227-229."""
    n = ipe * epochs * ipe_scale
    return (ema[0] + i * (ema[1] - ema[0]) / n for i in range(int(n) + 1))


# ----------------------------------------------------------------------------- the masks
GRID_CASES = [  # (grid, pred scale, enc scale, aspect, npred, nenc, min_keep, overlap)
    ((14, 14), (0.15, 0.2), (0.85, 1.0), (0.75, 1.5), 4, 1, 10, False),  # configs/in1k_vith14_ep300.yaml
    ((14, 14), (0.15, 0.2), (0.85, 1.0), (0.75, 1.5), 4, 1, 10, True),
    ((8, 8), (0.15, 0.3), (0.4, 0.6), (0.3, 3.0), 3, 2, 4, False),  # multiblock.py's own defaults, a small grid
    ((6, 6), (0.2, 0.4), (0.5, 0.7), (0.5, 2.0), 4, 1, 4, False),  # tight: refused attempts and dropped restrictions
    ((4, 4), (0.2, 0.3), (0.85, 1.0), (0.75, 1.5), 2, 1, 1, False),  # the digits preset's grid
]


@pytest.mark.parametrize("case", range(len(GRID_CASES)))
def test_the_masks_replay_the_official_collator_on_the_same_draws(case):
    grid, ps, es, ar, npred, nenc, min_keep, overlap = GRID_CASES[case]
    for seed in range(12):
        d = draw_multiblock(16, grid, torch.Generator().manual_seed(seed), ps, es, ar, npred, nenc, overlap)
        enc, pred = multiblock_masks(d, grid, ps, es, ar, min_keep, overlap)
        ref_enc, ref_pred = ref_collate(d, *grid, ps, es, ar, min_keep, overlap)
        assert enc.shape[0] == nenc and pred.shape[0] == npred
        for j in range(nenc):
            torch.testing.assert_close(enc[j], ref_enc[j], rtol=0, atol=0)
        for i in range(npred):
            torch.testing.assert_close(pred[i], ref_pred[i], rtol=0, atol=0)


def test_the_tight_case_needs_dropped_restrictions():
    """The 6x6 case refuses attempts until restrictions are dropped (else the replay above would not test them)."""
    grid, ps, es, ar, npred, nenc, min_keep, overlap = GRID_CASES[3]
    firsts = []
    for seed in range(12):
        d = draw_multiblock(16, grid, torch.Generator().manual_seed(seed), ps, es, ar, npred, nenc, overlap)
        pred_h, pred_w = block_size(float(d.u[0]), ps, ar, grid)
        eh, ew = block_size(float(d.u[1]), es, (1.0, 1.0), grid)
        rows, cols = torch.arange(6).view(6, 1), torch.arange(6).view(1, 6)
        for b in range(16):
            free = torch.ones(6, 6, dtype=torch.bool)
            for i in range(npred):
                t, le = int(d.pred_top[b, i]), int(d.pred_left[b, i])
                free &= ~((rows >= t) & (rows < t + pred_h) & (cols >= le) & (cols < le + pred_w))
            for a in range(d.enc_top.shape[2]):
                t, le = int(d.enc_top[b, 0, a]), int(d.enc_left[b, 0, a])
                block = (rows >= t) & (rows < t + eh) & (cols >= le) & (cols < le + ew)
                allowed = free if a < TIMEOUT else None
                if allowed is None or int((block & allowed).sum()) > min_keep:
                    firsts.append(a)
                    break
    assert max(firsts) >= TIMEOUT  # some context block needed a restriction dropped


def test_block_size_and_the_never_ending_configurations():
    for u in torch.linspace(0, 1, 41).tolist():
        assert block_size(u, (0.15, 0.2), (0.75, 1.5), (14, 14)) == ref_block_size(u, (0.15, 0.2), (0.75, 1.5), 14, 14)
        assert block_size(u, (0.85, 1.0), (1.0, 1.0), (14, 14)) == ref_block_size(u, (0.85, 1.0), (1.0, 1.0), 14, 14)
    d = draw_multiblock(4, (4, 4), torch.Generator().manual_seed(0), (0.15, 0.2), (0.85, 1.0), (0.75, 1.5), 4, 1,
                        False)
    with pytest.raises(ValueError, match="target block"):
        multiblock_masks(d, (4, 4), (0.15, 0.2), (0.85, 1.0), (0.75, 1.5), 5, False)


# ----------------------------------------------------------------------------- the networks and the loss
def ijepa(extra=None, **sections):
    return tiny_method("ijepa", extra, **sections)


def reference_of(m):
    """The reference networks holding the method's weights (the official parameter names load strictly)."""
    vit, pred = m.backbone, m.predictor
    heads = vit.blocks[0].attn.num_heads
    enc = RefEncoder(vit.embed_dim, vit.depth, heads, vit.patch_size, vit.in_chans, m.grid[0])
    enc.load_state_dict({k: v for k, v in vit.state_dict().items()}, strict=True)
    rp = RefPredictor(vit.embed_dim, pred.predictor_embed.out_features, len(pred.predictor_blocks),
                      pred.predictor_blocks[0].attn.num_heads, m.grid[0])
    rp.load_state_dict(pred.state_dict(), strict=True)
    target = RefEncoder(vit.embed_dim, vit.depth, heads, vit.patch_size, vit.in_chans, m.grid[0])
    target.load_state_dict(m.target_encoder.state_dict(), strict=True)
    for p in target.parameters():
        p.requires_grad_(False)
    return enc, rp, target


def images(seed, batch=8):
    return torch.randn(batch, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


def test_the_sincos_tables_are_the_official_ones():
    for dim, grid in ((128, 4), (384, 14), (64, 7)):
        torch.testing.assert_close(ijepa_sincos_position_embedding(grid, dim)[0],
                                   torch.from_numpy(ref_sincos(dim, grid)).float(), rtol=0, atol=1e-6)
    m = ijepa()
    torch.testing.assert_close(m.backbone.pos_embed[0], torch.from_numpy(ref_sincos(128, 4)).float(), atol=1e-6,
                               rtol=0)
    assert not m.backbone.pos_embed.requires_grad and not m.predictor.predictor_pos_embed.requires_grad
    assert m.backbone.cls_token is None


def test_the_init_is_the_codes():
    """helper.py:86-99 after the constructors: trunc-normal .02 Linear weights (no depth rescaling left), zero
    biases, LayerNorm 1 / 0, the patch convolution trunc-normal .02 with a zero bias, the mask token .02."""
    m = ijepa(model={"backbone": "vit_small", "patch_size": 2, "stop_grad_conv1": False})
    for name, p in (*m.backbone.named_parameters(), *m.predictor.named_parameters()):
        if name.endswith("bias"):
            assert p.abs().max() == 0, name
        elif "norm" in name:
            assert torch.all(p == 1), name
        elif p.requires_grad and p.numel() > 1000:
            assert abs(p.std().item() - 0.02) < 0.0015, name  # fc2 / proj of deep blocks: not rescaled
    assert abs(m.predictor.mask_token.std().item() - 0.02) < 0.008


def test_the_step_is_the_official_forward_and_loss():
    m = ijepa()
    enc, rp, target = reference_of(m)
    x = images(0)
    e, p = m.masks(8, 3)
    with torch.no_grad():
        for j in range(e.shape[0]):  # the context encoder on the kept patches
            torch.testing.assert_close(m.backbone.forward_visible(x, e[j]), enc(x, [e[j]]), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(m.target_encoder.forward_features(x), target(x), rtol=1e-5, atol=1e-5)
        z = m.backbone.forward_visible(x, e.flatten(0, 1))
        torch.testing.assert_close(m.predictor(z, e, p), rp(enc(x, list(e)), list(e), list(p)), rtol=1e-5, atol=1e-5)
    out = m.forward_views([x], e, p)
    ref = ref_train_loss(enc, rp, target, x, list(e), list(p))
    torch.testing.assert_close(out.loss, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.embedding, m.target_encoder(x), rtol=1e-5, atol=1e-6)  # the eval features


def test_two_context_masks_and_their_order():
    """nenc = 2: the predictor's batch is target-mask-major, each holding every context mask's batch."""
    m = ijepa({"num_enc_masks": 2, "enc_mask_scale": [0.4, 0.6]})
    enc, rp, target = reference_of(m)
    x = images(1)
    e, p = m.masks(8, 5)
    assert e.shape[0] == 2
    torch.testing.assert_close(m.forward_views([x], e, p).loss, ref_train_loss(enc, rp, target, x, list(e), list(p)),
                               rtol=1e-5, atol=1e-6)


def test_the_loss_is_smooth_l1_on_layer_normed_targets():
    g = torch.Generator().manual_seed(0)
    z, h = torch.randn(6, 5, 16, generator=g) * 3, torch.randn(6, 5, 16, generator=g) * 4 + 1
    hn = (h - h.mean(-1, keepdim=True)) / (h.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
    d = (z - hn).abs()
    by_hand = torch.where(d < 1, 0.5 * d ** 2, d - 0.5).mean()
    torch.testing.assert_close(ijepa_loss(z, h), by_hand, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- the schedules
@pytest.mark.parametrize("ipe,epochs,warmup,ipe_scale", [(7, 5, 2, 1.0), (5, 4, 1.5, 1.25), (3, 10, 0, 1.0)])
def test_the_schedules_are_the_codes_at_every_iteration(ipe, epochs, warmup, ipe_scale):
    m = ijepa({"ipe_scale": ipe_scale, "start_lr": 2e-4, "momentum": 0.996, "momentum_end": 1.0,
               "final_weight_decay": 0.4},
              optim={"base_lr": 1e-3, "min_lr": 1e-6, "weight_decay": 0.04, "warmup_epochs": warmup,
                     "lr_scaling": "linear"}, data={"batch_size": 256})
    m.total_steps, m.steps_per_epoch, m.max_epochs = ipe * epochs, ipe, epochs
    T = int(ipe_scale * epochs * ipe)
    lr = RefWarmupCosine(int(warmup * ipe), 2e-4, 1e-3, T, 1e-6)
    wd = RefCosineWD(0.04, T, 0.4)
    mom = ref_momentum((0.996, 1.0), ipe, epochs, ipe_scale)
    for step in range(ipe * epochs):
        v = m.schedule(step, step // ipe)
        assert v.lr == pytest.approx(lr.step(), rel=1e-12, abs=1e-15)
        assert v.weight_decay == pytest.approx(wd.step(), rel=1e-12)
        assert v.momentum == pytest.approx(next(mom), rel=1e-12)


# ----------------------------------------------------------------------------- three training steps
def official_groups(encoder, predictor):
    """helper.py:121-139: (weights, biases and 1-D tensors without weight decay) of the encoder and predictor."""
    def split(module, decayed):
        return [p for n, p in module.named_parameters() if p.requires_grad and
                ((("bias" not in n) and len(p.shape) != 1) == decayed)]
    return [{"params": split(encoder, True)}, {"params": split(predictor, True)},
            {"params": split(encoder, False), "WD_exclude": True, "weight_decay": 0},
            {"params": split(predictor, False), "WD_exclude": True, "weight_decay": 0}]


def stand_in_trainer(method, step, epoch):
    method._trainer = SimpleNamespace(global_step=step, current_epoch=epoch, optimizers=[method._opt],
                                      accumulate_grad_batches=1,
                                      fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(
                                          batch_progress=SimpleNamespace(current=SimpleNamespace(completed=0)))))


def test_three_training_steps_are_the_official_ones():
    """Steps 0-2 (warm-up from start_lr, the wd cosine, the momentum ramp; ema (0.9, 1.0) so the EMA moves): the
    method through its own hook, optimiser and post-step EMA; the reference: train.py's loop body with
    torch.optim.AdamW over the code's four groups."""
    m = ijepa({"momentum": 0.9, "momentum_end": 1.0, "start_lr": 1e-4},
              optim={"base_lr": 2e-3, "min_lr": 1e-5, "weight_decay": 0.04, "warmup_epochs": 1, "decay_1d": False,
                     "fused": False, "lr_scaling": "linear"}, model={"stop_grad_conv1": False},
              data={"batch_size": 256})
    m.total_steps, m.steps_per_epoch, m.max_epochs = 6, 2, 3
    enc, rp, target = reference_of(m)
    m._opt = m.configure_optimizers()
    opt = torch.optim.AdamW(official_groups(enc, rp))
    lr_s, wd_s = RefWarmupCosine(2, 1e-4, 2e-3, 6, 1e-5), RefCosineWD(0.04, 6, 0.4)
    mom = ref_momentum((0.9, 1.0), 2, 3, 1.0)
    for step in range(3):
        x = images(10 + step)
        e, p = m.masks(8, 100 + step)
        stand_in_trainer(m, step, step // 2)
        m.on_train_batch_start(None, step)
        m._opt.zero_grad(set_to_none=True)
        loss = m.forward_views([x], e, p).loss
        loss.backward()
        m._opt.step()
        for hook in m.post_step_hooks:
            hook()
        # the reference (train.py:290-337)
        new_lr, new_wd = lr_s.step(), wd_s.step()
        for group in opt.param_groups:
            group["lr"] = new_lr
            if not group.get("WD_exclude"):
                group["weight_decay"] = new_wd
        ref_loss = ref_train_loss(enc, rp, target, x, list(e), list(p))
        opt.zero_grad()
        ref_loss.backward()
        opt.step()
        with torch.no_grad():
            mm = next(mom)
            for q, k in zip(enc.parameters(), target.parameters()):
                k.data.mul_(mm).add_((1.0 - mm) * q.detach().data)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
        assert m._opt.param_groups[0]["lr"] == pytest.approx(new_lr, rel=1e-12)
    for name, p in m.backbone.state_dict().items():
        torch.testing.assert_close(p, enc.state_dict()[name], rtol=1e-4, atol=1e-6, msg=name)
    for name, p in m.predictor.state_dict().items():
        torch.testing.assert_close(p, rp.state_dict()[name], rtol=1e-4, atol=1e-6, msg=name)
    for name, p in m.target_encoder.state_dict().items():
        torch.testing.assert_close(p, target.state_dict()[name], rtol=1e-4, atol=1e-6, msg=name)


# ----------------------------------------------------------------------------- wiring
def test_masks_come_from_the_steps_seed_and_the_eval_backbone_is_the_target():
    m = ijepa({"pred_mask_scale": [0.2, 0.4], "enc_mask_scale": [0.6, 1.0]})
    a, b = m.masks(8, 7), m.masks(8, 7)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    # two processes (other position seeds), one size seed: the same block sizes, as the code's counter-seeded sizes
    sizes = {tuple(t.shape[-1] for t in m.masks(8, 100 + rank, 5)[1:]) for rank in range(4)}
    assert len(sizes) == 1
    assert len({m.masks(8, 3, s)[1].shape[-1] for s in range(12)}) > 1  # and they change from step to step
    assert m.eval_backbone is m.target_encoder
    assert set(m.trainable()) == {"backbone", "predictor"}
    assert all(not p.requires_grad for p in m.target_encoder.parameters())
    out = m.forward_views([images(0)], *m.masks(8, 1))
    assert set(out.instruments) == {"ijepa_target_std", "ijepa_prediction_std"}
    assert out.embedding.shape == (8, 128)


def test_user_errors():
    with raises_user_error("model.class_token=false"):
        tiny_method("ijepa", {"min_keep": 1}, model={"class_token": True, "pool": "cls"})
    with raises_user_error("method.min_keep=1", "method.pred_mask_scale"):
        ijepa({"pred_mask_scale": [0.15, 0.2]})  # a 4x4 grid: a target block of 1 patch at some draws
    with raises_user_error("method.min_keep=0"):
        ijepa({"min_keep": 0})
    with raises_user_error("model.pool=avg"):
        tiny_method("ijepa", {"min_keep": 1}, model={"class_token": False, "pool": "cls"})
    with raises_user_error("method.ipe_scale"):
        ijepa({"ipe_scale": 0.5})
    from ssl_helpers import tiny_config
    with raises_user_error("model.class_token=false", "resnet18"):
        tiny_config("simclr", model={"backbone": "resnet18", "class_token": False, "pool": "avg"})


def test_the_target_encoder_starts_as_the_context_encoder():
    """train.py:169: ``target_encoder = copy.deepcopy(encoder)``, after the init."""
    m = ijepa()
    assert all(torch.equal(a, b) for a, b in zip(m.target_encoder.parameters(), m.backbone.parameters()))
    assert all(a.data_ptr() != b.data_ptr() for a, b in zip(m.target_encoder.parameters(), m.backbone.parameters()))


# ----------------------------------------------------------------------------- two processes
WORLD, TIMEOUT_S = 2, 240


class _Loss(nn.Module):
    def __init__(self, method, enc, pred):
        super().__init__()
        self.method, self.enc, self.pred = method, enc, pred

    def forward(self, x):
        return self.method.forward_views([x], self.enc, self.pred).loss


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    import os

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        m = ijepa()
        e, p = m.masks(16, 3)
        rows = slice(rank * 8, (rank + 1) * 8)
        ddp = nn.parallel.DistributedDataParallel(_Loss(m, e[:, rows], p[:, rows]), broadcast_buffers=False)
        loss = ddp(images(0, batch=16)[rows])
        loss.backward()
        grads = {n: q.grad.detach().clone() for n, q in m.named_parameters() if q.grad is not None}
        torch.save({"loss": loss.detach(), "grads": grads}, os.path.join(out_dir, f"{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.spawn
def test_a_step_of_two_processes_is_one_processs(tmp_path):
    """Each process its half of the batch and of the step's masks (the code's collator truncates within a process's
    batch; here both halves share the whole batch's lengths): the mean loss and DDP's averaged gradients equal one
    process's on the whole batch (the smooth L1 is a mean over equal halves; train.py:312 all-reduces the loss for
    its log only)."""
    from spawn import spawn_and_join

    spawn_and_join(_worker, (str(tmp_path / "rendezvous"), str(tmp_path)), WORLD, TIMEOUT_S, poll_s=2)
    results = [torch.load(tmp_path / f"{r}.pt") for r in range(WORLD)]
    m = ijepa()
    e, p = m.masks(16, 3)
    loss = m.forward_views([images(0, batch=16)], e, p).loss
    loss.backward()
    torch.testing.assert_close(sum(r["loss"] for r in results) / WORLD, loss.detach(), rtol=1e-5, atol=1e-6)
    scale = max(q.grad.abs().max().item() for q in m.parameters() if q.grad is not None)
    for r in results:
        for n, q in m.named_parameters():
            if q.grad is not None:
                torch.testing.assert_close(r["grads"][n], q.grad, rtol=1e-4, atol=1e-5 * scale, msg=n)
