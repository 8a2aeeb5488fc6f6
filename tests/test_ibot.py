"""iBOT: the block-wise mask generator against the official loop, the patch loss by hand, the mask token, the
step against the official formulas, the head options, the centres under two-process DDP."""

from __future__ import annotations

import math
import os
import random

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from selfsup.data.masks import block_masks, default_max_blocks, ibot_masks, prediction_ratios, random_masks
from selfsup.errors import UserError
from selfsup.losses import ibot_patch_loss
from spawn import spawn_and_join
from ssl_helpers import MULTICROP, ViewsLoss, tiny_config

RECIPE = {"pred_ratio": [0.0, 0.3], "pred_ratio_var": [0.0, 0.2]}  # the README's masking


def tiny_ibot(method_extra=None, **sections):
    from selfsup.methods import DataInfo
    from selfsup.methods.build import build_method

    sections.setdefault("augment", MULTICROP)
    return build_method(tiny_config("ibot", method_extra, **sections), DataInfo(1, 8, (0.5,), (0.25,)))


# ----------------------------------------------------------------------------- the mask generator

def official_block_mask(H, W, ratio, rng, aspect=(0.3, 1 / 0.3)):
    """The official block loop (ibot loader.py:67-100), written out with Python's random from its description."""
    la = (math.log(aspect[0]), math.log(aspect[1]))
    high, mask, count = ratio * H * W, [[False] * W for _ in range(H)], 0
    while count < high:
        remaining, delta = high - count, 0
        for _ in range(10):
            area = rng.uniform((min(H, W) // 3) ** 2, remaining)
            ar = math.exp(rng.uniform(*la))
            h, w = int(round(math.sqrt(area * ar))), int(round(math.sqrt(area / ar)))
            if w < W and h < H:
                top, left = rng.randint(0, H - h), rng.randint(0, W - w)
                new = sum(not mask[i][j] for i in range(top, top + h) for j in range(left, left + w))
                if 0 < new <= remaining:
                    for i in range(top, top + h):
                        for j in range(left, left + w):
                            mask[i][j] = True
                    delta = new
            if delta > 0:
                break
        if delta == 0:
            break
        count += delta
    return torch.tensor(mask)


def boundary(masks: torch.Tensor) -> torch.Tensor:
    """Masked / unmasked neighbour pairs per mask: small for blocks, large for scattered patches."""
    m = masks.int()
    return (m[:, 1:] != m[:, :-1]).sum((1, 2)) + (m[:, :, 1:] != m[:, :, :-1]).sum((1, 2))


def test_prediction_ratios_of_the_recipe_and_of_a_fixed_ratio():
    g = torch.Generator().manual_seed(0)
    r = prediction_ratios(20000, (0.0, 0.3), (0.0, 0.2), g)
    zero = r == 0
    assert abs(zero.float().mean().item() - 0.5) < 0.015  # random.choice between the two entries
    assert r[~zero].min() >= 0.1 and r[~zero].max() <= 0.5
    assert abs(r[~zero].mean().item() - 0.3) < 0.005 and abs(r[~zero].std().item() - 0.4 / math.sqrt(12)) < 0.005
    assert torch.equal(prediction_ratios(50, (0.3,), (0.0,), g), torch.full((50,), 0.3))


@pytest.mark.parametrize("grid,ratio", [((14, 14), 0.3), ((4, 4), 0.4), ((7, 7), 0.25)])
def test_block_masks_match_the_official_loop_in_distribution(grid, ratio):
    """Masked count and block shape (boundary length) of 2000 masks against the official loop's 2000."""
    n = 2000
    ours = block_masks(torch.full((n,), ratio), grid, torch.Generator().manual_seed(1),
                       max_blocks=default_max_blocks(grid, (ratio,), (0.0,)))
    rng = random.Random(2)
    ref = torch.stack([official_block_mask(*grid, ratio, rng) for _ in range(n)])
    assert ours.shape == ref.shape == (n, *grid) and ours.dtype == torch.bool
    high = ratio * grid[0] * grid[1]
    assert ours.flatten(1).sum(1).max() <= high  # a block never takes more than what remains
    for stat in (lambda m: m.flatten(1).sum(1).float(), lambda m: boundary(m).float()):
        a, b = stat(ours), stat(ref)
        se = math.sqrt((a.var() + b.var()).item() / n)
        assert abs(a.mean().item() - b.mean().item()) < 4 * se + 1e-6, (a.mean(), b.mean())
        assert abs(a.std().item() - b.std().item()) < 0.15 * b.std().item() + 0.05
    scattered = random_masks(torch.full((n,), ratio), grid, torch.Generator().manual_seed(3))
    assert boundary(scattered).float().mean() > 1.3 * boundary(ours).float().mean()  # the statistic tells shapes apart


def test_the_default_number_of_rounds_is_the_whole_loop():
    """ceil(max ratio · H · W) rounds give the masks of H · W rounds (every later round is a no-op), fewer do not."""
    ratio = prediction_ratios(512, (0.0, 0.3), (0.0, 0.2), torch.Generator().manual_seed(0))
    rounds = default_max_blocks((14, 14), (0.0, 0.3), (0.0, 0.2))
    assert rounds == 98
    full = block_masks(ratio, (14, 14), torch.Generator().manual_seed(5), max_blocks=196)
    assert torch.equal(block_masks(ratio, (14, 14), torch.Generator().manual_seed(5), max_blocks=rounds), full)
    assert not torch.equal(block_masks(ratio, (14, 14), torch.Generator().manual_seed(5), max_blocks=1), full)


def test_recipe_masks_half_the_crops_and_rand_masks_exactly_int_ratio():
    g = torch.Generator().manual_seed(0)
    m = ibot_masks(4000, (14, 14), g, (0.0, 0.3), (0.0, 0.2))
    share = m.flatten(1).float().mean(1)
    assert abs((share > 0).float().mean().item() - 0.5) < 0.03  # the share of masked crops
    assert share.max() <= 0.5
    assert abs(share[share > 0].mean().item() - 0.294) < 0.01  # the official loop's 0.2935 (2·10⁴ draws)
    ratio = torch.tensor([0.0, 0.1, 0.3, 0.55])
    r = random_masks(ratio, (14, 14), g)
    assert r.flatten(1).sum(1).tolist() == [int(x * 196) for x in ratio.tolist()]
    a, b = (ibot_masks(64, (4, 4), torch.Generator().manual_seed(7), (0.0, 0.3), (0.0, 0.2)) for _ in range(2))
    assert torch.equal(a, b)  # one generator state, one set of masks


# ----------------------------------------------------------------------------- the patch loss

def test_patch_loss_by_hand():
    """K = 2, two global crops of one image each, two patches. Crop 1 masks patch 0 only, crop 2 nothing:
    the loss is (CE at crop 1's patch 0 + 0) / 2."""
    t = torch.tensor([[[1.0, 0.0], [0.0, 3.0]], [[2.0, 2.0], [5.0, 0.0]]])
    s = torch.tensor([[[0.2, 0.0], [0.9, 0.0]], [[0.0, 1.0], [0.0, 0.0]]])
    c2 = torch.tensor([[[0.5, 0.0]]])
    q0 = 1 / (1 + math.exp(-(1.0 - 0.5) / 0.5))  # softmax((t − c2) / τt2), τt2 = 0.5, prototype 0
    p0 = 1 / (1 + math.exp(-0.2 / 0.1))  # softmax(s / τs), τs = 0.1
    ce = -(q0 * math.log(p0) + (1 - q0) * math.log(1 - p0))
    masks = torch.tensor([[True, False], [False, False]])
    assert ibot_patch_loss(s, t, c2, masks, 0.1, 0.5).item() == pytest.approx(ce / 2, rel=1e-6)
    # both patches of crop 1 masked: their mean; crop 2 still counts 0
    q1 = 1 / (1 + math.exp(-(0.0 - 0.5 - 3.0) / 0.5))
    p1 = 1 / (1 + math.exp(-0.9 / 0.1))
    ce1 = -(q1 * math.log(p1) + (1 - q1) * math.log(1 - p1))
    both = torch.tensor([[True, True], [False, False]])
    assert ibot_patch_loss(s, t, c2, both, 0.1, 0.5).item() == pytest.approx((ce + ce1) / 2 / 2, rel=1e-6)
    assert ibot_patch_loss(s, t, c2, torch.zeros(2, 2, dtype=torch.bool), 0.1, 0.5).item() == 0.0


def reference_patch_loss(s, t, c2, masks, ts, tt, n_global=2):
    """The official loop's v == q terms (main_ibot.py:530-548) in float64."""
    sp, tp = (s.double() / ts).chunk(n_global), F.softmax((t.double() - c2.double()) / tt, dim=-1).chunk(n_global)
    total = 0.0
    for q, m in zip(range(n_global), masks.chunk(n_global)):
        loss = torch.sum(-tp[q] * F.log_softmax(sp[q], dim=-1), dim=-1)
        total = total + (torch.sum(loss * m.double(), dim=-1) / m.double().sum(-1).clamp(min=1.0)).mean()
    return total / n_global


def test_patch_loss_matches_the_official_loop_and_spares_the_teacher():
    g = torch.Generator().manual_seed(0)
    s = (torch.randn(10, 6, 9, generator=g) * 3).requires_grad_()
    t = (torch.randn(10, 6, 9, generator=g) * 3).requires_grad_()
    c2, masks = torch.randn(1, 1, 9, generator=g), torch.rand(10, 6, generator=g) < 0.4
    masks[3] = False
    loss = ibot_patch_loss(s, t, c2, masks, 0.1, 0.07)
    torch.testing.assert_close(loss.double(), reference_patch_loss(s, t, c2, masks, 0.1, 0.07), rtol=1e-6, atol=1e-6)
    loss.backward()
    assert t.grad is None and torch.equal(s.grad[~masks], torch.zeros_like(s.grad[~masks]))  # masked patches only


# ----------------------------------------------------------------------------- the mask token

def test_masked_patches_take_the_mask_token_before_the_positions():
    m = tiny_ibot(model={"pos_embed": "learned", "init": "trunc_normal"})
    vit = m.backbone
    assert torch.equal(vit.masked_embed, torch.zeros(1, vit.embed_dim))  # zero-initialised
    assert not hasattr(m.teacher_backbone, "masked_embed")  # the student's only
    with torch.no_grad():
        vit.masked_embed.copy_(torch.randn(1, vit.embed_dim))
    x = torch.randn(3, 1, 8, 8)
    mask = torch.zeros(3, 16, dtype=torch.bool)
    mask[0, [0, 5, 15]] = True
    mask[2, 7] = True
    seen = []
    hook = vit.blocks.register_forward_hook(lambda mod, inp, out: seen.append(inp[0]))
    vit.eval()
    plain, masked = vit.forward_features(x), vit.forward_features(x, mask)
    hook.remove()
    pos = vit.position_embedding(8)
    assert torch.equal(seen[1][:, 0], seen[0][:, 0])  # the class token as it was
    patches_in, plain_in = seen[1][:, 1:], seen[0][:, 1:]
    assert torch.equal(patches_in[~mask], plain_in[~mask])  # unmasked patches untouched
    torch.testing.assert_close(patches_in[mask], (vit.masked_embed + pos[0, 1:][mask.nonzero()[:, 1]]).detach())
    assert torch.equal(masked[1], plain[1])  # an image with no masked patch gives the same tokens
    assert not torch.equal(masked[0], plain[0])
    # the token is trained and decayed (a 2-D tensor, as the official param groups)
    opt = m.configure_optimizers()
    decayed = [p for grp in opt.param_groups if grp["weight_decay"] > 0 for p in grp["params"]]
    assert any(p is vit.masked_embed for p in decayed)


# ----------------------------------------------------------------------------- the step and the heads

def plan_views(model, batch=8, seed=0):
    x = torch.randint(0, 256, (batch, 1, 8, 8), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    return model.augment(x, torch.Generator().manual_seed(seed + 1))


def test_step_against_the_official_formulas():
    """2 globals + 2 locals: the teacher sees the globals unmasked, the student the masked globals (class and
    patch logits) and the locals (class only); loss = λ1 DINO's cross-view term + λ2 the same-view patch term;
    both centres from the teacher's outputs, after the loss."""
    m = tiny_ibot({"lambda1": 0.7, "lambda2": 1.3, "shared_head": True, **RECIPE})
    views = plan_views(m)
    b = views[0].shape[0]
    masks = m.draw_masks(2 * b, "cpu")
    assert masks.shape == (2 * b, 16) and masks.any()
    c0, c20 = torch.randn(1, 64) * 0.1, torch.randn(1, 1, 64) * 0.1
    m.center.copy_(c0)
    m.center2.copy_(c20)
    with torch.no_grad():
        x = torch.cat(views[:2])
        t_cls, t_patch = m.teacher_head(m.teacher_backbone.forward_features(x))
        s_cls, s_patch = m.head(m.backbone.forward_features(x, masks))
        s_loc = m.head(m.backbone(torch.cat(views[2:])))
    seen = []
    m.teacher_backbone.register_forward_hook(lambda mod, inp, out: seen.append(tuple(inp[0].shape)))
    out = m.forward_views(views, masks)
    s_all = torch.cat([s_cls, s_loc]).double() / 0.1
    q = F.softmax((t_cls.double() - c0.double()) / m.teacher_temp, dim=-1).chunk(2)
    terms = [torch.sum(-q[i] * F.log_softmax(s_all.chunk(4)[v], dim=-1), dim=-1).mean()
             for i in range(2) for v in range(4) if v != i]
    cls = sum(terms) / len(terms)
    patch = reference_patch_loss(s_patch, t_patch, c20, masks, 0.1, m.teacher_patch_temp)
    torch.testing.assert_close(out.scalars["loss_cls"].double(), 0.7 * cls, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.scalars["loss_patch"].double(), 1.3 * patch, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.loss.double(), 0.7 * cls + 1.3 * patch, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m.center, 0.9 * c0 + 0.1 * t_cls.mean(0, keepdim=True), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(m.center2, 0.9 * c20 + 0.1 * t_patch.mean(1).mean(0).view(1, 1, -1), rtol=1e-5,
                               atol=1e-7)  # over all patches of both global crops, masked or not
    assert {"center", "center2"} <= set(m.state_dict())


def test_the_student_patch_head_runs_on_the_patches_a_mask_can_hold_only():
    """k = ceil(max ratio · N) patches per crop (8 of 16 for the recipe), every masked one among them; the loss and
    every gradient equal the official head's on all N patches (issue 37: iBOT's step spent most of its head on
    patches whose loss weight is 0)."""
    m = tiny_ibot(RECIPE)
    assert m.max_masked == 8
    masks = m.draw_masks(4096, "cpu")
    index = m.loss_patches(masks)
    assert index.shape == (4096, 8) and masks.sum(1).max() <= 8
    assert torch.equal(masks.gather(1, index).sum(1), masks.sum(1))  # every masked patch is projected
    views = plan_views(m)
    masks = m.draw_masks(2 * views[0].shape[0], "cpu")

    def loss_and_grads(k):
        m.zero_grad(set_to_none=True)
        m.max_masked = k
        loss = m.forward_views(views, masks).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}

    state = {k: v.clone() for k, v in m.state_dict().items()}
    full_loss, full = loss_and_grads(16)  # every patch: the official head
    m.load_state_dict(state)  # the step moved the centres
    part_loss, part = loss_and_grads(8)
    torch.testing.assert_close(part_loss, full_loss, rtol=1e-6, atol=1e-7)
    assert part.keys() == full.keys()
    for name in full:
        torch.testing.assert_close(part[name], full[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("student,teacher", [(False, True), (True, False), (True, True), (False, False)])
def test_head_sharing_and_the_teacher_ema_over_common_names(student, teacher):
    m = tiny_ibot({"shared_head": student, "shared_head_teacher": teacher})
    h, t = m.head, m.teacher_head
    assert (h.last_layer2 is h.last_layer) is student and (t.last_layer2 is t.last_layer) is teacher
    patch_dim = 64 if (student or teacher) else 48  # patch_out_dim is out_dim once either head is shared
    assert h.last_layer2.weight_v.shape[0] == patch_dim and m.center2.shape == (1, 1, patch_dim)
    tokens = torch.randn(3, 17, m.backbone.embed_dim)
    cls, patch = h(tokens)
    assert cls.shape == (3, 64) and patch.shape == (3, 16, patch_dim)
    torch.testing.assert_close(h(tokens[:, 0]), cls)  # 2-D input: DINO's head on the class token
    # the teacher starts from the student's state_dict loaded non-strictly (main_ibot.py:263): a teacher
    # projection shared by both tokens holds the student's last_layer2, loaded after last_layer
    assert torch.equal(t.last_layer.weight_v, h.last_layer2.weight_v if teacher else h.last_layer.weight_v)
    assert not any(p.requires_grad for p in t.parameters())
    with torch.no_grad():
        for p in h.parameters():
            p.add_(1.0)
    before = {n: p.clone() for n, p in t.named_parameters()}
    m.ema_step(0.75)
    student_params = dict(h.named_parameters())
    for n, p in t.named_parameters():  # the EMA over the names both have; a teacher-only layer stays
        expected = 0.75 * before[n] + 0.25 * student_params[n] if n in student_params else before[n]
        torch.testing.assert_close(p, expected)


def test_no_masks_before_pred_start_epoch_and_patch_temperature_shifted():
    m = tiny_ibot({"pred_start_epoch": 2, **RECIPE})
    assert not m.draw_masks(64, "cpu").any()  # epoch 0 < 2
    assert m.teacher_patch_temp == m.cfg.method.warmup_teacher_patch_temp
    out = m.forward_views(plan_views(m))
    assert out.scalars["loss_patch"].item() == 0.0 and out.instruments["ibot_masked_share"].item() == 0.0


def test_ibot_config_errors():
    with pytest.raises(UserError, match=r"method.pred_ratio 0.3 ± 0.4 must satisfy"):
        tiny_config("ibot", {"pred_ratio": [0.3], "pred_ratio_var": [0.4]})
    with pytest.raises(UserError, match=r"method.pred_ratio_var=\[0.1, 0.1, 0.1\] needs one value or one per"):
        tiny_config("ibot", {"pred_ratio": [0.3, 0.2], "pred_ratio_var": [0.1, 0.1, 0.1]})
    assert tiny_config("ibot", {"pred_ratio": [0.3, 0.2], "pred_ratio_var": [0.1]}).method.pred_ratio_var == (0.1, 0.1)
    with pytest.raises(UserError, match=r"method.pred_shape='grid'; use block or rand"):
        tiny_config("ibot", {"pred_shape": "grid"})
    with pytest.raises(UserError, match=r"method.teacher_patch_temp=0.0 must be > 0"):
        tiny_config("ibot", {"teacher_patch_temp": 0.0})
    with pytest.raises(UserError, match=r"method ibot needs a selfsup ViT backbone with model.pool=cls"):
        tiny_ibot(model={"pool": "avg"})
    m = tiny_ibot()
    with pytest.raises(UserError, match="iBOT needs the 2 global crops"):
        m.forward_views(plan_views(m)[:1])


# ----------------------------------------------------------------------------- two-process DDP

WORLD, BATCH = 2, 16


def fixed_views_and_masks():
    g = torch.Generator().manual_seed(99)
    views = [torch.randn(BATCH, 1, s, s, generator=g) for s in (8, 8, 4, 4)]
    masks = ibot_masks(2 * BATCH, (4, 4), g, (0.0, 0.3), (0.0, 0.2)).flatten(1)
    return views, masks


def ddp_method():
    torch.manual_seed(0)
    m = tiny_ibot({"shared_head": True, **RECIPE}).train()
    with torch.no_grad():
        m.center.copy_(torch.linspace(-0.1, 0.1, m.center.shape[1]))
        m.center2.copy_(torch.linspace(0.1, -0.1, m.center2.shape[-1]).view(1, 1, -1))
        for p in m.teacher_head.parameters():  # a teacher other than the student
            p.mul_(0.9)
    return m


def rank_slice(views, masks, rank):
    part = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
    crops = masks.view(2, BATCH, -1)[:, part].reshape(-1, masks.shape[1])  # crop-major, this rank's images
    return [v[part] for v in views], crops


class MaskedViewsLoss(ViewsLoss):
    def forward(self, *views, masks=None):
        return self.method.forward_views(list(views), masks).loss


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        import selfsup.methods.ibot as ibot_module

        views, masks = rank_slice(*fixed_views_and_masks(), rank)
        for variant in ("ibot", "no_all_reduce"):
            correct = ibot_module.all_reduce_sum
            if variant == "no_all_reduce":
                ibot_module.all_reduce_sum = lambda x: x
            m = ddp_method()
            ddp = nn.parallel.DistributedDataParallel(MaskedViewsLoss(m), broadcast_buffers=False)
            loss = ddp(*views, masks=masks)
            loss.backward()
            ibot_module.all_reduce_sum = correct
            grads = {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
            torch.save({"loss": loss.detach(), "grads": grads, "center": m.center.clone(),
                        "center2": m.center2.clone()}, os.path.join(out_dir, f"{variant}-{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.spawn
def test_ibot_ddp_centres_and_gradients_match_one_process(tmp_path):
    """The global batch split over 2 gloo processes: the mean loss, the DDP gradients and both centres equal
    one process on the whole batch (the centres' sums all-reduced, main_ibot.py:559-572); without the
    all-reduce each rank keeps its own centres."""
    spawn_and_join(_worker, (str(tmp_path / "rendezvous"), str(tmp_path)), WORLD, 240, poll_s=2)
    results = {v: [torch.load(tmp_path / f"{v}-{r}.pt") for r in range(WORLD)] for v in ("ibot", "no_all_reduce")}
    views, masks = fixed_views_and_masks()
    m = ddp_method()
    ref = m.forward_views(views, masks).loss
    ref.backward()
    ref_grads = {n: p.grad for n, p in m.named_parameters() if p.grad is not None}
    assert "backbone.masked_embed" in ref_grads
    torch.testing.assert_close(sum(r["loss"] for r in results["ibot"]) / WORLD, ref.detach(), rtol=1e-5, atol=1e-6)
    for r in results["ibot"]:
        assert sorted(r["grads"]) == sorted(ref_grads)
        for n, g in ref_grads.items():
            torch.testing.assert_close(r["grads"][n], g, rtol=1e-4, atol=1e-5 * g.abs().max().item() + 1e-9)
        torch.testing.assert_close(r["center"], m.center, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(r["center2"], m.center2, rtol=1e-5, atol=1e-7)
    wrong = results["no_all_reduce"]
    assert not torch.allclose(wrong[0]["center2"], m.center2, rtol=1e-3, atol=1e-6)
    assert not torch.allclose(wrong[0]["center2"], wrong[1]["center2"])
    assert not torch.allclose(wrong[0]["center"], wrong[1]["center"])


@pytest.mark.train
def test_patch_temperature_and_masking_start_as_applied_in_training(tmp_path):
    """3 epochs × 2 steps, ``pred_start_epoch`` 1, warm-up over 2 epochs: τt2 is the warm-up value in epoch 0
    (no masks, no patch loss), then linspace(0.02, 0.06, 2) from epoch 1 (main_ibot.py:503-512); τt warms up
    from epoch 0."""
    import lightning.pytorch as pl

    from selfsup.data.datasets import load_dataset
    from selfsup.engine import PretrainData, make_trainer
    from selfsup.methods.build import build_method, data_info

    rows = []

    class Record(pl.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            out = outputs["step"]
            rows.append((trainer.current_epoch, pl_module.teacher_temp, pl_module.teacher_patch_temp,
                         out.instruments["ibot_masked_share"].item(), out.scalars["loss_patch"].item()))

    cfg = tiny_config("ibot", {"warmup_teacher_temp": 0.03, "teacher_temp": 0.05, "warmup_teacher_patch_temp": 0.02,
                               "teacher_patch_temp": 0.06, "warmup_teacher_temp_epochs": 2, "pred_start_epoch": 1,
                               "pred_ratio": [0.3], "pred_ratio_var": [0.1]},
                      augment=MULTICROP, trainer={"max_epochs": 3, "limit_train_batches": 2, "log_every_n_steps": 1},
                      instruments={"enabled": False}, output_dir=str(tmp_path), name="run")
    train = load_dataset(cfg.data, "train")
    model = build_method(cfg, data_info(cfg, train))
    trainer = make_trainer(cfg, tmp_path / "run")
    trainer.callbacks.insert(0, Record())
    trainer.fit(model, datamodule=PretrainData(cfg, train))
    assert [r[0] for r in rows] == [0, 0, 1, 1, 2, 2]
    assert [r[1] for r in rows] == pytest.approx([0.03, 0.03, 0.05, 0.05, 0.05, 0.05])
    assert [r[2] for r in rows] == pytest.approx([0.02, 0.02, 0.02, 0.02, 0.06, 0.06])
    assert all(share == 0 and patch == 0 for epoch, _, _, share, patch in rows if epoch == 0)
    assert all(share > 0.1 and patch > 0 for epoch, _, _, share, patch in rows if epoch > 0)


def sinkhorn_by_hand(logits: torch.Tensor, eps: float, iterations: int, rows: torch.Tensor) -> torch.Tensor:
    """Sinkhorn-Knopp as DINOv2's sinkhorn_knopp_teacher describes it, over the chosen rows only, in float64:
    Q = exp(t / ε) / ΣQ; each prototype's column to 1/K, each row to 1/B; then × B (rows sum to 1)."""
    q = torch.exp(logits[rows].double() / eps)
    q = q / q.sum()
    b, k = q.shape
    for _ in range(iterations):
        q = q / q.sum(0, keepdim=True) / k
        q = q / q.sum(1, keepdim=True) / b
    out = torch.zeros(logits.shape, dtype=torch.float64)
    out[rows] = q * b
    return out


def test_sinkhorn_knopp_targets_for_both_terms():
    """method.centering=sinkhorn_knopp (DINOv2's targets, an option iBOT's code does not have): the [CLS] targets
    Sinkhorn-Knopp at ε = τt over the batch, the patch targets at ε = τt2 over the masked patches only; the
    centres neither used nor updated."""
    m = tiny_ibot({"centering": "sinkhorn_knopp", "shared_head": True, **RECIPE})
    views = plan_views(m)
    b = views[0].shape[0]
    masks = m.draw_masks(2 * b, "cpu")
    masks[0, :3] = True  # at least one masked crop
    with torch.no_grad():
        x = torch.cat(views[:2])
        t_cls, t_patch = m.teacher_head(m.teacher_backbone.forward_features(x))
        s_cls, s_patch = m.head(m.backbone.forward_features(x, masks))
        s_loc = m.head(m.backbone(torch.cat(views[2:])))
    out = m.forward_views(views, masks)
    q = sinkhorn_by_hand(t_cls, m.teacher_temp, 3, torch.ones(2 * b, dtype=torch.bool)).chunk(2)
    s_all = torch.cat([s_cls, s_loc]).double() / 0.1
    terms = [torch.sum(-q[i] * F.log_softmax(s_all.chunk(4)[v], dim=-1), dim=-1).mean()
             for i in range(2) for v in range(4) if v != i]
    torch.testing.assert_close(out.scalars["loss_cls"].double(), sum(terms) / len(terms), rtol=1e-5, atol=1e-6)
    k = t_patch.shape[-1]
    q2 = sinkhorn_by_hand(t_patch.reshape(-1, k), m.teacher_patch_temp, 3, masks.reshape(-1)).view(2 * b, -1, k)
    ce = -(q2 * F.log_softmax(s_patch.double() / 0.1, dim=-1)).sum(-1)
    patch = ((ce * masks).sum(-1) / masks.sum(-1).clamp(min=1)).mean()
    torch.testing.assert_close(out.scalars["loss_patch"].double(), patch, rtol=1e-5, atol=1e-6)
    assert not m.center.any() and not m.center2.any()
    with pytest.raises(UserError, match="method.centering=none: iBOT centres with its EMA centres"):
        tiny_config("ibot", {"centering": "none"})
