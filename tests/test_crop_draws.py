"""The decode-time crop boxes (issue 52): drawn for a whole batch at once (``decode.crop_box_batch``) from counter-
based uniforms (``decode.box_uniforms``), the same distribution as torchvision's RandomResizedCrop, reproducible."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

from selfsup.data.decode import box_uniforms, crop_box_batch, crop_boxes

M64 = (1 << 64) - 1
G = 0x9E3779B97F4A7C15


def splitmix_finaliser(x: int) -> int:
    """SplitMix64's output function, written from its definition in plain Python integers."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def reference_uniforms(seed: int, epoch: int, index: int, n: int) -> list[float]:
    key = splitmix_finaliser((seed + G) & M64)
    key = splitmix_finaliser((key + epoch + G) & M64)
    key = splitmix_finaliser((key + index + G) & M64)
    return [(splitmix_finaliser((key + (k + 1) * G) & M64) >> 11) / 2.0 ** 53 for k in range(n)]


def reference_box(u: list[float], height: int, width: int, scale, ratio=(3 / 4, 4 / 3), tries: int = 10):
    """torchvision's RandomResizedCrop.get_params (v0.29 transforms.py), one view, its random draws given as u."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for t in range(tries):
        target_area = area * (scale[0] + (scale[1] - scale[0]) * u[t])
        aspect_ratio = math.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * u[tries + t])
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            return int(u[-2] * (height - h + 1)), int(u[-1] * (width - w + 1)), h, w
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def test_uniforms_match_a_plain_python_splitmix64():
    got = box_uniforms(7, 3, [0, 5, 123456], 44)
    for row, index in zip(got, [0, 5, 123456]):
        assert row.tolist() == reference_uniforms(7, 3, index, 44)
    assert got.dtype == np.float64 and ((got >= 0) & (got < 1)).all()


def test_boxes_follow_get_params_on_the_drawn_uniforms():
    """Every box (fits, retries, the centre-crop fallback for very wide and tall images) as torchvision's rule gives it
    on the same numbers."""
    rng = random.Random(0)
    sizes = [(rng.randint(1, 700), rng.randint(1, 700)) for _ in range(300)] + [(10, 400), (400, 10), (1, 1)]
    scales = [(0.08, 1.0), (0.05, 0.32), (0.9, 1.0)]
    index = list(range(len(sizes)))
    boxes = crop_box_batch(11, 2, index, [h for h, _ in sizes], [w for _, w in sizes], scales)
    u = box_uniforms(11, 2, index, len(scales) * 22).reshape(len(sizes), len(scales), 22)
    for b, (h, w) in enumerate(sizes):
        for v, scale in enumerate(scales):
            assert tuple(boxes[b, v]) == reference_box(u[b, v].tolist(), h, w, scale), (h, w, scale)
            top, left, bh, bw = boxes[b, v]
            assert 0 <= top <= h - bh and 0 <= left <= w - bw and bh >= 1 and bw >= 1


def ks(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic."""
    grid = np.sort(np.concatenate([a, b]))
    fa = np.searchsorted(np.sort(a), grid, side="right") / len(a)
    fb = np.searchsorted(np.sort(b), grid, side="right") / len(b)
    return float(np.abs(fa - fb).max())


@pytest.mark.parametrize("height,width,scale", [(375, 500, (0.08, 1.0)), (240, 320, (0.05, 0.32)),
                                                (100, 400, (0.08, 1.0))])
def test_the_distribution_is_torchvisions(height, width, scale):
    """20,000 draws against torchvision's own RandomResizedCrop.get_params: KS of the area fraction, the log aspect,
    the top and the left below the 0.1% critical value (1.95 · sqrt(2 / n)), and the same fallback share."""
    from torchvision.transforms import RandomResizedCrop

    n = 20_000
    ours = crop_box_batch(1, 0, np.arange(n), [height] * n, [width] * n, [scale])[:, 0].astype(np.float64)
    torch.manual_seed(0)
    image = torch.empty(3, height, width)
    ref = np.array([RandomResizedCrop.get_params(image, list(scale), [3 / 4, 4 / 3]) for _ in range(n)],
                   dtype=np.float64)
    critical = 1.95 * math.sqrt(2 / n)
    features = {"area": lambda x: x[:, 2] * x[:, 3] / (height * width),
                "log_ratio": lambda x: np.log(x[:, 3] / x[:, 2]),
                "top": lambda x: x[:, 0] / height, "left": lambda x: x[:, 1] / width}
    for name, f in features.items():
        assert ks(f(ours), f(ref)) < critical, name
    full = lambda x: np.mean((x[:, 2] == height) | (x[:, 3] == width))  # noqa: E731
    assert abs(full(ours) - full(ref)) < 4 * math.sqrt(max(full(ref), 1e-3) / n) + 1e-3


def test_seeded_draws_are_reproducible_and_independent_of_the_batch():
    heights, widths = [48, 300, 77, 500], [64, 200, 90, 375]
    scales = [(0.32, 1.0)] * 2 + [(0.05, 0.32)] * 3
    a = crop_box_batch(4, 1, [9, 3, 5, 0], heights, widths, scales)
    assert np.array_equal(a, crop_box_batch(4, 1, [9, 3, 5, 0], heights, widths, scales))
    for b, (i, h, w) in enumerate(zip([9, 3, 5, 0], heights, widths)):
        assert [tuple(x) for x in a[b]] == crop_boxes(4, 1, i, h, w, scales)  # any batch, any order, any worker
    assert not np.array_equal(a, crop_box_batch(5, 1, [9, 3, 5, 0], heights, widths, scales))
    assert not np.array_equal(a, crop_box_batch(4, 2, [9, 3, 5, 0], heights, widths, scales))
    assert len({tuple(x) for x in a.reshape(-1, 4).tolist()}) > 15  # the views differ


def test_the_light_decode_gives_pils_pixels_and_header(tmp_path):
    """An RGB or grey JPEG (baseline, progressive, with restart markers and EXIF) is sized from its own frame header
    and decoded by torchvision's libjpeg-turbo: PIL's size and exactly PIL's pixels; other files go through PIL."""
    from PIL import Image

    from selfsup.data.decode import Opened, _pixels, jpeg_header

    rng = np.random.default_rng(0)
    rgb = (rng.integers(0, 256, (37, 53, 3)) // 2 + 60).astype(np.uint8)
    cases = {"base.jpg": ("RGB", {}), "prog.jpg": ("RGB", {"progressive": True}),
             "restart.jpg": ("RGB", {"restart_marker_blocks": 1}), "grey.jpg": ("L", {}),
             "exif.jpg": ("RGB", {"exif": b"Exif\x00\x00" + b"\x00" * 40}), "cmyk.jpg": ("CMYK", {}),
             "png.png": ("RGB", {})}
    for name, (mode, kwargs) in cases.items():
        image = Image.fromarray(rgb).convert(mode)
        image.save(tmp_path / name, **kwargs)
        opened = Opened(tmp_path / name, 3)
        with Image.open(tmp_path / name) as f:
            expected = torch.from_numpy(np.array(f.convert("RGB"))).permute(2, 0, 1)
            assert (opened.width, opened.height) == f.size
        assert opened.light == (name.endswith(".jpg") and mode != "CMYK")  # CMYK: PIL's conversion
        assert torch.equal(_pixels(opened)[0], expected), name
    assert jpeg_header(b"\x89PNG....") is None and jpeg_header(b"\xff\xd8\xff") is None
    assert jpeg_header((tmp_path / "base.jpg").read_bytes()) == (53, 37, 3)
