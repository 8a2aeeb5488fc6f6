"""imagefolder decoding: training crops from the whole image at decode time, evaluation = Resize + CenterCrop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from selfsup.data.datasets import FolderImages, ImageDataset
from selfsup.data.decode import FolderCrops, crop_boxes, eval_resize
from selfsup.data.loader import EpochBatchSampler, batch_loader
from selfsup.data.views import AugmentConfig, MultiViewAugment

CORNERS = {(0, 0): (255, 0, 0), (0, 1): (0, 255, 0), (1, 0): (0, 0, 255), (1, 1): (255, 255, 0)}


def corners_image(path, width=96, height=48, c=14):
    """Grey, with a coloured c×c square in each corner: all four lie outside the central 48×48 square."""
    a = np.full((height, width, 3), 128, np.uint8)
    for (r, col), colour in CORNERS.items():
        a[r * (height - c):r * (height - c) + c, col * (width - c):col * (width - c) + c] = colour
    Image.fromarray(a).save(path)
    return path


def has_colour(view, colour, tol=40):
    """Whether some pixel of a uint8 (3, S, S) view is close to ``colour``."""
    diff = (view.int() - torch.tensor(colour).view(3, 1, 1)).abs().amax(0)
    return bool((diff < tol).any())


def test_training_crops_reach_outside_the_centre_square(tmp_path):
    f = corners_image(tmp_path / "c.png")
    crops = FolderCrops([f], 16, [(0.08, 1.0), (0.08, 1.0)], seed=0)
    seen = {colour: False for colour in CORNERS.values()}
    differ = 0
    for epoch in range(40):
        views = crops.crops(torch.tensor([0]), epoch)[0]  # (V, 3, 16, 16)
        assert views.shape == (2, 3, 16, 16) and views.dtype == torch.uint8
        a, b = crop_boxes(0, epoch, 0, 48, 96, crops.scales)
        differ += a != b
        for colour in CORNERS.values():
            seen[colour] |= any(has_colour(v, colour) for v in views)
    assert all(seen.values()), seen  # every corner appears in some crop
    assert differ == 40  # two different crops per image
    centre = FolderImages([f], 16, resize=16)[0]  # evaluation: the centre square only
    assert not any(has_colour(centre, colour) for colour in CORNERS.values())


@pytest.mark.parametrize("size", [24, 32])
def test_eval_transform_equals_torchvision_resize_centercrop(tmp_path, size):
    from torchvision import transforms
    from torchvision.transforms.functional import pil_to_tensor

    rng = np.random.default_rng(0)
    files = []
    for i, (w, h, fmt) in enumerate([(50, 37, "png"), (37, 50, "jpg"), (64, 64, "png"), (81, 45, "jpg"),
                                     (29, 40, "png")]):
        files.append(tmp_path / f"{i}.{fmt}")
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(files[-1])
    ours = FolderImages(files, size)
    assert ours.resize == eval_resize(size) == round(size / 0.875)
    reference = transforms.Compose([transforms.Resize(eval_resize(size)), transforms.CenterCrop(size)])
    for i, f in enumerate(files):
        with Image.open(f) as im:
            expected = pil_to_tensor(reference(im.convert("RGB")))
        assert torch.equal(ours[i], expected), f


@pytest.mark.spawn
def test_crops_depend_only_on_seed_epoch_and_index(tmp_path):
    files = [corners_image(tmp_path / f"{i}.png", width=60 + 4 * i) for i in range(6)]
    labels = torch.arange(6)
    ds = ImageDataset("imagefolder", FolderCrops(files, 12, [(0.2, 1.0), (0.08, 0.5)], seed=3), labels, 6,
                      (0.5,) * 3, (0.25,) * 3)
    batches = {}
    for workers in (0, 2):
        sampler = EpochBatchSampler(6, 3, seed=1, tag_epoch=True)
        sampler.set_epoch(2)
        batches[workers] = list(batch_loader(ds, sampler, num_workers=workers))
    for (a, ya), (b, yb) in zip(batches[0], batches[2]):
        assert a.shape == (3, 2, 3, 12, 12) and torch.equal(a, b) and torch.equal(ya, yb)
    assert crop_boxes(3, 2, 4, 48, 76, [(0.08, 1)]) == crop_boxes(3, 2, 4, 48, 76, [(0.08, 1)])
    assert crop_boxes(3, 2, 4, 48, 76, [(0.08, 1)]) != crop_boxes(3, 3, 4, 48, 76, [(0.08, 1)])
    assert crop_boxes(3, 2, 4, 48, 76, [(0.08, 1)]) != crop_boxes(3, 2, 5, 48, 76, [(0.08, 1)])


def test_jpeg_draft_decode_is_close_to_a_full_decode(tmp_path):
    yy, xx = np.mgrid[0:400, 0:600]
    smooth = np.stack([xx * 255 // 600, yy * 255 // 400, (xx + yy) * 255 // 1000], -1).astype(np.uint8)
    f = tmp_path / "big.jpg"
    Image.fromarray(smooth).save(f, quality=95)
    fast = FolderCrops([f], 32, [(0.08, 1.0)] * 2, seed=0, draft=True).crops(torch.tensor([0]), 0)
    full = FolderCrops([f], 32, [(0.08, 1.0)] * 2, seed=0, draft=False).crops(torch.tensor([0]), 0)
    assert (fast.float() - full.float()).abs().mean() < 3


def test_decoded_views_are_not_cropped_again():
    g = torch.Generator().manual_seed(0)
    views = torch.randint(0, 256, (4, 2, 3, 8, 8), dtype=torch.uint8, generator=g)
    plain = AugmentConfig(crop_min=0.08, hflip_p=0.0, jitter_p=0.0, grayscale_p=0.0, blur_p=0.0, solarize_p=0.0)
    flip = AugmentConfig(crop_min=0.08, hflip_p=1.0, jitter_p=0.0, grayscale_p=0.0, blur_p=0.0, solarize_p=0.0)
    out = MultiViewAugment([plain, flip], 8, (0.0,) * 3, (1.0,) * 3)(views, torch.Generator().manual_seed(1))
    torch.testing.assert_close(out[0], views[:, 0].float() / 255)
    torch.testing.assert_close(out[1], views[:, 1].float().flip(-1) / 255)


def test_augmented_probe_on_a_folder_crops_the_whole_image(tmp_path, monkeypatch):
    """The linear probe's RandomResizedCrop (scale 0.08–1) comes from the whole file, as main_lincls.py."""
    import selfsup.data.decode as decode
    from selfsup.eval.linear import ProbeConfig, probe_augmented
    from selfsup.models.backbones import build_backbone

    files = [corners_image(tmp_path / f"{i}.png") for i in range(4)]
    train = ImageDataset("imagefolder", FolderImages(files, 8), torch.arange(4) % 2, 2, (0.5,) * 3, (0.25,) * 3)
    seen = []
    real = decode.crop_box_batch
    monkeypatch.setattr(decode, "crop_box_batch", lambda *a, **k: seen.extend(
        [tuple(map(tuple, image)) for image in real(*a, **k).tolist()]) or real(*a, **k))
    backbone = build_backbone("vit_micro", in_chans=3, image_size=8, patch_size=2)
    probe_augmented(backbone, train, train, {"image_size": 8, "mean": [0.5] * 3, "std": [0.25] * 3},
                    ProbeConfig(epochs=2, batch_size=4, val_fraction=0.0), base_lr=0.1)
    assert len(seen) == 8 and len(set(map(tuple, seen))) > 1  # 4 images x 2 epochs, each its own box
    assert any(left < 24 or left + w > 72 for (top, left, h, w), in seen)  # reaches outside the centre square
