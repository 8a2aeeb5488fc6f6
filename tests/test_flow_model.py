"""The flow model and objective: per-token conditioning, the release's init, the path's convention, masking."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from selfsup.models.sit import SIT_SIZES, SiT, sincos_pos_embed, timestep_sinusoid
from selfsup.flow.objective import (SimpleHead, alignment_loss, noise_level_buckets, per_token_flow_loss,
                                    repa_loss, self_flow_levels, token_mask)
from selfsup.flow.path import interpolate, sample_t, velocity_target


def micro(**kw) -> SiT:
    torch.manual_seed(0)
    return SiT(**{"input_size": 8, "in_channels": 1, "patch_size": 2, "size": "micro", "num_classes": 10, **kw})


def randomise_modulation(model: SiT) -> None:
    """The release zero-inits every adaLN Linear; give them weights so the conditioning matters."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for m in [b.adaLN_modulation[-1] for b in model.blocks] + [model.final_layer.adaLN_modulation[-1],
                                                                   model.final_layer.linear]:
            m.weight.copy_(torch.randn(m.weight.shape, generator=g) * 0.2)
            m.bias.copy_(torch.randn(m.bias.shape, generator=g) * 0.2)


def test_sincos_pos_embed_by_hand():
    # dim 4: one frequency (1): token (row, col) -> [sin col, cos col, sin row, cos row], row-major order
    pe = sincos_pos_embed(2, 4)
    expect = torch.tensor([[math.sin(c), math.cos(c), math.sin(r), math.cos(r)] for r in (0, 1) for c in (0, 1)])
    assert torch.allclose(pe, expect, atol=1e-6)
    ts = timestep_sinusoid(torch.tensor([0.0, 0.5]), dim=4)  # freqs 1, 1e-2 -> [cos, cos, sin, sin]
    assert torch.allclose(ts[0], torch.tensor([1.0, 1.0, 0.0, 0.0]))
    assert torch.allclose(ts[1], torch.tensor([math.cos(0.5), math.cos(0.005), math.sin(0.5), math.sin(0.005)]),
                          atol=1e-6)


def test_sizes_and_patchify_roundtrip():
    m = micro()
    assert (m.hidden, m.depth, m.heads, m.num_tokens) == (64, 4, 2, 16)
    x = torch.randn(3, 1, 8, 8)
    assert torch.equal(m.unpatchify(m.patchify(x)), x)
    # token 1 is the patch at row 0, columns 2..3
    assert torch.equal(m.patchify(x)[:, 1], x[:, 0, 0:2, 2:4].reshape(3, 4))
    assert SIT_SIZES["XL"] == (1152, 28, 16) and SIT_SIZES["B"] == (768, 12, 12)  # SiT-XL / SiT-B
    xl = SiT(32, 4, patch_size=2, size="XL", num_classes=1000, depth=1)  # one block: the XL/2 width on 32x32x4
    assert (xl.hidden, xl.heads, xl.num_tokens, xl.final_layer.linear.out_features) == (1152, 16, 256, 16)


def test_release_init():
    m = micro()
    linears = [mod for mod in m.modules() if isinstance(mod, nn.Linear)]
    assert all(torch.count_nonzero(mod.bias) == 0 for mod in linears)
    for block in m.blocks:
        assert torch.count_nonzero(block.adaLN_modulation[-1].weight) == 0
        w = block.attn.qkv.weight  # xavier uniform: bound sqrt(6 / (fan_in + fan_out))
        assert w.abs().max() <= math.sqrt(6 / (w.shape[0] + w.shape[1])) + 1e-6 and w.std() > 0
    assert torch.count_nonzero(m.final_layer.linear.weight) == 0
    assert torch.count_nonzero(m.final_layer.adaLN_modulation[-1].weight) == 0
    for emb in (m.y_embedder.weight, m.t_embedder.mlp[0].weight, m.t_embedder.mlp[2].weight):
        assert abs(emb.std().item() - 0.02) < 0.004


def test_every_block_is_identity_at_init_and_output_zero():
    m = micro()
    x, t, y = torch.randn(4, 1, 8, 8), torch.rand(4), torch.randint(0, 11, (4,))
    v, feats = m(x, t, y, features=(1, 2, 3, 4))
    embedded = m.x_embedder(m.patchify(x)) + m.pos_embed
    for f in feats:
        assert torch.allclose(f, embedded, atol=1e-6)
    assert torch.count_nonzero(v) == 0


def test_per_token_conditioning():
    m = micro()
    randomise_modulation(m)
    x, y = torch.randn(2, 1, 8, 8), torch.tensor([3, 10])
    t = torch.tensor([0.2, 0.9])
    # equal levels in every token reproduce the per-sample model
    per_token = t[:, None].expand(2, m.num_tokens).contiguous()
    assert torch.allclose(m(x, per_token, y), m(x, t, y), atol=1e-5)
    # different levels: each token is modulated by its own level
    levels = per_token.clone()
    levels[:, :5] = 0.6
    c = m.condition(levels, y)
    mod = m.blocks[0].adaLN_modulation(c)
    assert mod.shape == (2, m.num_tokens, 6 * m.hidden)
    assert torch.allclose(mod[:, 0], mod[:, 4]) and torch.allclose(mod[:, 5], mod[:, 15])
    assert not torch.allclose(mod[:, 0], mod[:, 5])
    assert torch.allclose(mod[:, 5], m.blocks[0].adaLN_modulation(m.condition(t, y))[:, 0], atol=1e-6)
    assert not torch.allclose(m(x, levels, y), m(x, t, y), atol=1e-4)


def test_levels_with_a_token_index_give_the_per_token_model():
    """K levels per sample + each token's index into them: the same velocity, features and gradients
    as the (B, N) per-token levels, with the modulation computed per level (Self-Flow's student)."""
    m = micro()
    randomise_modulation(m)
    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(3, 1, 8, 8, generator=g), torch.tensor([3, 10, 0])
    t, s = torch.rand(3, generator=g), torch.rand(3, generator=g)
    mask = token_mask(3, m.num_tokens, 0.25, generator=g)
    dense, _ = self_flow_levels(t, s, mask)
    grads = []
    for levels, index in ((dense, None), (torch.stack([t, s], dim=1), mask.long())):
        m.zero_grad()
        v, (h,) = m(x, levels, y, features=(2,), token_index=index)
        (v.square().sum() + h.sum()).backward()
        grads.append((v.detach(), h.detach(), [p.grad.clone() for p in m.parameters()]))
    (v0, h0, g0), (v1, h1, g1) = grads
    torch.testing.assert_close(v1, v0, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h1, h0, rtol=1e-5, atol=1e-6)
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="token_index must be"):
        m(x, t, y, token_index=mask.long())


def test_interface_time_convention():
    m = micro()
    x, y = torch.randn(2, 1, 8, 8), torch.tensor([1, 2])
    t = torch.tensor([0.25, 0.75])
    # the network runs on 1 - t
    assert torch.allclose(m.condition(t, y), (m.t_embedder(1 - t) + m.y_embedder(y))[:, None])
    # the output is the negated network output
    randomise_modulation(m)
    h = m.x_embedder(m.patchify(x)) + m.pos_embed
    c = m.condition(t, y)
    for block in m.blocks:
        h = block(h, c)
    assert torch.allclose(m(x, t, y), -m.unpatchify(m.final_layer(h, c)), atol=1e-6)
    # block_tokens stops after block k and equals the full pass's block-k output
    _, (f2,) = m(x, t, y, features=(2,))
    assert torch.allclose(m.block_tokens(x, t, y, 2), f2)


def test_path_convention():
    x0, eps = torch.randn(3, 1, 4, 4), torch.randn(3, 1, 4, 4)
    assert torch.allclose(interpolate(x0, eps, torch.zeros(3)), x0)
    assert torch.allclose(interpolate(x0, eps, torch.ones(3)), eps)  # t = 1 is noise
    t, dt = torch.full((3,), 0.3), 1e-3
    fd = (interpolate(x0, eps, t + dt) - interpolate(x0, eps, t - dt)) / (2 * dt)
    assert torch.allclose(fd, velocity_target(x0, eps), atol=1e-3)  # target = eps - x0 = dx_t/dt
    # per-token levels sit on their own patches
    levels = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    xt = interpolate(x0[:1], eps[:1], levels, patch_size=2)
    close = lambda a, b: torch.allclose(a, b, atol=1e-6)  # noqa: E731
    assert close(xt[0, 0, :2, :2], x0[0, 0, :2, :2]) and close(xt[0, 0, :2, 2:], eps[0, 0, :2, 2:])
    assert close(xt[0, 0, 2:, :2], eps[0, 0, 2:, :2]) and close(xt[0, 0, 2:, 2:], x0[0, 0, 2:, 2:])


def test_t_sampling():
    g = torch.Generator().manual_seed(0)
    u = sample_t(20000, "uniform", generator=g)
    assert 0 <= u.min() and u.max() <= 1 and abs(u.mean() - 0.5) < 0.01
    ln = sample_t(20000, "logit_normal", 0.0, 1.0, generator=g)
    logit = torch.log(ln / (1 - ln))
    assert abs(logit.mean()) < 0.03 and abs(logit.std() - 1) < 0.03
    with pytest.raises(ValueError):
        sample_t(3, "cosine")


@pytest.mark.parametrize("ratio,expect", [(0.0, 0), (0.25, 4), (0.3, 5), (0.5, 8), (1.0, 16)])
def test_mask_has_exactly_round_ratio_tokens(ratio, expect):
    mask = token_mask(64, 16, ratio, generator=torch.Generator().manual_seed(0))
    assert (mask.sum(1) == expect).all()
    t, s = torch.rand(64) * 0.5, torch.rand(64) * 0.5 + 0.5
    levels, teacher = self_flow_levels(t, s, mask)
    assert ((levels == s[:, None]).sum(1) == expect).all()
    assert torch.equal(teacher, torch.minimum(t, s))
    if 0 < expect < 16:  # the masked positions vary from sample to sample
        assert not (mask == mask[:1]).all()


def test_losses_by_hand():
    v, target = torch.zeros(1, 1, 4, 4), torch.ones(1, 1, 4, 4)
    target[0, 0, :2, :2] = 3.0  # token 0 error 9, others 1
    assert torch.allclose(per_token_flow_loss(v, target, 2), torch.tensor([[9.0, 1.0, 1.0, 1.0]]))
    a = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    b = torch.tensor([[0.0, 2.0], [2.0, 2.0]])
    assert torch.allclose(alignment_loss(a, b), torch.tensor(0.5))  # cos 0 and 1 -> mean(1 - cos) = 0.5
    assert torch.allclose(repa_loss(a, b), torch.tensor(-0.5))
    means, counts = noise_level_buckets(torch.tensor([[1.0, 3.0], [5.0, 7.0]]),
                                        torch.tensor([[0.1, 0.9], [0.2, 0.95]]), 2)
    assert torch.equal(means, torch.tensor([3.0, 5.0])) and torch.equal(counts, torch.tensor([2.0, 2.0]))


def test_simple_head_shape_and_orthogonal_at_init():
    torch.manual_seed(0)
    head = SimpleHead(64)
    assert [type(m).__name__ for m in head.net] == ["Linear", "SiLU", "Linear"]
    assert head.net[0].weight.shape == (128, 64) and head.net[2].weight.shape == (64, 128)
    h = torch.randn(8, 16, 64)
    assert abs(alignment_loss(head(h), h).item() - 1.0) < 0.15  # a random head is nearly orthogonal
