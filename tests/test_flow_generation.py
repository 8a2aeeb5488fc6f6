"""selfsup.flow.sampler's sampling helpers on a stand-in velocity model (no training)."""

from __future__ import annotations

import torch
from torch import nn

from selfsup.flow.sampler import generate, sample_labels, save_grid, to_dataset_size, to_uint8
from ssl_helpers import raises_user_error


class PointModel(nn.Module):
    """The exact velocity of the path to the class's constant image: (x − μ_y)/t (null class: μ = 0)."""

    in_channels, input_size, num_classes = 1, 8, 3

    def __init__(self):
        super().__init__()
        self.mu = nn.Parameter(torch.linspace(-0.9, 0.9, 4).view(4, 1, 1, 1).expand(4, 1, 8, 8).clone())
        self.mu.data[3] = 0

    def forward(self, x, t, y):
        return (x - self.mu[y]) / t.view(-1, 1, 1, 1)


def test_generate_lands_on_each_class_point_in_batches_and_is_seeded():
    model = PointModel()
    labels = sample_labels(7, 3)
    assert labels.tolist() == [0, 1, 2, 0, 1, 2, 0]
    x = generate(model, labels, steps=3, batch_size=3)
    torch.testing.assert_close(x, model.mu.data[labels], atol=1e-5, rtol=0)
    s1 = generate(model, labels, steps=5, method="sde", seed=1, batch_size=4)
    s2 = generate(model, labels, steps=5, method="sde", seed=1, batch_size=4)
    torch.testing.assert_close(s1, s2, rtol=0, atol=0)
    # guidance 2 pushes beyond the class point away from the null point: v = v_u + 2(v_c − v_u)
    g = generate(model, torch.tensor([2]), steps=4, cfg_scale=2.0)
    torch.testing.assert_close(g, 2 * model.mu.data[2:3], atol=1e-5, rtol=0)


def test_sample_labels_checks_the_class():
    assert sample_labels(3, 10, 4).tolist() == [4, 4, 4]
    assert sample_labels(2, 0).tolist() == [0, 0]
    for cls, n_classes, words in ((10, 10, ["--class 10", "classes 0..9"]), (-1, 10, ["--class -1", "classes 0..9"]),
                                  (0, 0, ["--class 0", "an unconditional model"])):
        with raises_user_error(*words):
            sample_labels(2, n_classes, cls)


def test_to_uint8_and_the_inverse_fit():
    x = torch.tensor([-1.5, -1.0, 0.0, 1.0]).view(1, 1, 1, 4)
    assert to_uint8(x).flatten().tolist() == [0, 0, 128, 255]
    assert to_uint8(x, (0.2,), (0.1,)).flatten().tolist() == [13, 26, 51, 76]  # (x·0.1 + 0.2)·255, half to even
    x = torch.arange(36.0).view(1, 1, 6, 6)
    torch.testing.assert_close(to_dataset_size(x, 4, "pad"), x[..., 1:5, 1:5])
    from selfsup.models.sit import fit_images

    small = torch.rand(2, 1, 28, 28)
    torch.testing.assert_close(to_dataset_size(fit_images(small, 32, "pad"), 28, "pad"), small)
    assert to_dataset_size(torch.rand(2, 1, 16, 16), 8, "resize").shape == (2, 1, 8, 8)


def test_save_grid_writes_a_png(tmp_path):
    from PIL import Image

    path = save_grid(torch.randint(0, 256, (5, 1, 8, 8), dtype=torch.uint8), tmp_path / "g.png")
    img = Image.open(path)
    assert img.size == (3 * 10 + 2, 2 * 10 + 2) and img.mode == "L"
    rgb = save_grid(torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8), tmp_path / "c.png")
    assert Image.open(rgb).mode == "RGB"
