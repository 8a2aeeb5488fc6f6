"""Inputs checked at the door (issue 49): the defects a user met with their own backbone and DataLoader through
``selfsup.method`` replayed, each a working run or one line naming the fix (``UserError``)."""

from __future__ import annotations

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader, Dataset

import selfsup
from selfsup.data.inputs import check_images, collate_batch
from selfsup.errors import UserError


def one_line(e: pytest.ExceptionInfo) -> str:
    text = str(e.value)
    assert "\n" not in text
    return text


def fit_one_step(model, loader) -> pl.Trainer:
    trainer = pl.Trainer(max_epochs=1, limit_train_batches=1, accelerator="cpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader)
    return trainer


class Images(Dataset):
    """``n`` random images as the user's dataset returns them: ``kind`` uint8, float01, float255, normalised,
    gray (1 channel, uint8) or pil."""

    def __init__(self, kind: str, n: int = 8, size: int = 16):
        g = np.random.default_rng(0)
        self.pixels = g.integers(0, 256, (n, size, size, 3), dtype=np.uint8)
        self.kind = kind

    def __len__(self) -> int:
        return len(self.pixels)

    def __getitem__(self, i):
        a = self.pixels[i]
        if self.kind == "pil":
            return Image.fromarray(a), 0
        x = torch.from_numpy(a).permute(2, 0, 1).contiguous()
        if self.kind == "gray":
            x = x[:1]
        elif self.kind == "float255":  # PILToTensor() then .float()
            x = x.float()
        elif self.kind == "float01":
            x = x.float() / 255
        elif self.kind == "normalised":  # ToTensor() + Normalize(ImageNet)
            mean, std = torch.tensor([0.485, 0.456, 0.406]), torch.tensor([0.229, 0.224, 0.225])
            x = (x.float() / 255 - mean[:, None, None]) / std[:, None, None]
        return x, 0


def small_cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())


@pytest.mark.train
def test_a_torchvision_resnet_without_num_features_trains():
    import torchvision

    backbone = torchvision.models.resnet18()
    backbone.fc = nn.Identity()
    assert not hasattr(backbone, "num_features")
    model = selfsup.method("simclr", backbone, image_size=16, batch_size=4)
    assert model.backbone is backbone and backbone.num_features == 512
    assert model.projector[0].in_features == 512
    before = backbone.conv1.weight.detach().clone()
    trainer = fit_one_step(model, DataLoader(Images("uint8"), batch_size=4, drop_last=True))
    assert trainer.global_step == 1 and not torch.equal(before, backbone.conv1.weight)


@pytest.mark.train
def test_a_feature_map_backbone_is_pooled_and_trains():
    backbone = nn.Sequential(nn.Conv2d(3, 6, 3, 2, 1), nn.ReLU())  # (B, 6, H/2, W/2)
    model = selfsup.method("byol", backbone, image_size=16, batch_size=4)
    assert model.backbone.net is backbone and model.backbone.num_features == 6
    fit_one_step(model, DataLoader(Images("float01"), batch_size=4, drop_last=True))
    with pytest.raises(UserError) as e:
        selfsup.method("byol", nn.Sequential(nn.Conv2d(3, 6, 3)), image_size=16, batch_size=4, num_features=512)
    assert "num_features=6" in one_line(e)


def test_backbone_errors_are_one_line():
    tokens = nn.Sequential(nn.Flatten(2))  # (B, C, H*W): tokens, not features
    with pytest.raises(UserError) as e:
        selfsup.method("byol", tokens, image_size=8, batch_size=4)
    assert "(B, D)" in one_line(e)
    with pytest.raises(UserError) as e:
        selfsup.method("byol", nn.Conv2d(1, 4, 3), image_size=8, batch_size=4)  # takes 1 channel, given 3
    assert "channels=" in one_line(e)
    classifier = nn.Sequential(small_cnn(), nn.Linear(8, 10))
    classifier.num_features = 8  # a timm model with its classifier head left on
    with pytest.raises(UserError) as e:
        selfsup.method("byol", classifier, image_size=8, batch_size=4)
    assert "classifier" in one_line(e)


def test_method_names_get_did_you_mean_and_the_list_holds_joint_methods_only():
    with pytest.raises(UserError) as e:
        selfsup.method("byl", small_cnn(), image_size=8, batch_size=4)
    line = one_line(e)
    assert "did you mean byol" in line and "flow_matching" not in line and "self_flow" not in line
    with pytest.raises(UserError) as e:
        selfsup.method("repa", small_cnn(), image_size=8, batch_size=4)
    assert "joint-embedding" in one_line(e) and "repa," not in str(e.value)


@pytest.mark.train
@pytest.mark.parametrize("kind,words", [
    ("float255", "not [0, 1]; pass uint8"),
    ("normalised", "drop transforms.Normalize"),
    ("gray", "channels=3; convert them to RGB"),
])
def test_wrong_images_stop_at_the_first_batch_in_one_line(kind, words):
    model = selfsup.method("simclr", small_cnn(), image_size=16, batch_size=4)
    with pytest.raises(UserError) as e:
        fit_one_step(model, DataLoader(Images(kind), batch_size=4, drop_last=True))
    assert words in one_line(e)
    assert model.global_step == 0


@pytest.mark.train
def test_grayscale_with_channels_1_trains():
    backbone = nn.Sequential(nn.Conv2d(1, 8, 3, 2, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    model = selfsup.method("simclr", backbone, image_size=16, batch_size=4, channels=1)
    assert fit_one_step(model, DataLoader(Images("gray"), batch_size=4, drop_last=True)).global_step == 1


@pytest.mark.train
def test_a_list_batch_of_pil_images_is_collated_and_trains():
    model = selfsup.method("simclr", small_cnn(), image_size=16, batch_size=4)
    loader = DataLoader(Images("pil"), batch_size=4, drop_last=True, collate_fn=lambda items: items)
    assert fit_one_step(model, loader).global_step == 1


@pytest.mark.train
def test_a_dataset_of_pil_images_under_the_default_collate_trains():
    model = selfsup.method("simclr", small_cnn(), image_size=16, batch_size=4)
    loader = DataLoader(Images("pil"), batch_size=4, drop_last=True)  # torch's default_collate refuses PIL images
    assert fit_one_step(model, loader).global_step == 1


def test_collate_and_check_directly():
    pil = [Image.fromarray(np.full((5, 6, 3), 7, np.uint8)) for _ in range(3)]
    x = collate_batch(pil)
    assert x.shape == (3, 3, 5, 6) and x.dtype == torch.uint8 and int(x[0, 0, 0, 0]) == 7
    x, y = collate_batch([(p, i) for i, p in enumerate(pil)])
    assert x.shape == (3, 3, 5, 6) and y.tolist() == [0, 1, 2]
    batch = (torch.zeros(2, 3, 4, 4), torch.zeros(2))
    assert collate_batch(batch) is batch  # a collated batch passes untouched
    with pytest.raises(UserError, match="different shapes"):
        collate_batch([Image.new("RGB", (4, 4)), Image.new("RGB", (5, 4))])
    check_images(torch.rand(2, 3, 4, 4), 3)
    check_images(torch.full((2, 3, 4, 4), 1.0005), 3)  # a bicubic overshoot is no error
    with pytest.raises(UserError, match="channels-last"):
        check_images(torch.zeros(2, 8, 8, 3, dtype=torch.uint8), 3)
    with pytest.raises(UserError, match="int64"):
        check_images(torch.zeros(2, 3, 4, 4, dtype=torch.int64), 3)


@pytest.mark.train
def test_an_error_line_starts_on_a_clean_line_after_a_progress_bar(tmp_path, caplog, monkeypatch):
    """Issue 49: `selfsup: error:` landed on the progress bar's line; and Lightning's chatter is off by default.
    On a terminal (stdout here is captured: it is said to be one), Lightning's redrawn bar."""
    import selfsup.runs.progress as progress
    from ssl_helpers import run_cli, tiny_run

    monkeypatch.setattr(progress, "on_terminal", lambda: True)

    args = ["pretrain", "moco-v3-vit-digits", *tiny_run(), "trainer.progress_bar=true", "trainer.max_epochs=3",
            "optim.base_lr=1e30", f"output_dir={tmp_path}"]  # the loss becomes NaN after the bar has started
    code, out, err = run_cli(*args, "name=a")
    assert code == 2 and "the loss became nan" in err and "it/s" in out  # Lightning's bar (stdout) had started
    # the error line starts on a line of its own, after exactly one line break: where the bar's line (stdout, on the
    # same screen) was left open (rich < 15), a newline ends it first; where the bar ended its line (rich 15), none
    expected = "selfsup: error: " if out.endswith("\n") else "\nselfsup: error: "
    assert err.startswith(expected) and err.count("selfsup: error:") == 1
    chatter = ("GPU available", "TPU available", "limit_train_batches=1.0", "Loading `train_dataloader`")
    assert not any(c in caplog.text for c in chatter)  # Lightning's loggers below INFO
    code, _, err = run_cli(*args, "name=b", "trainer.verbose=true")
    assert code == 2 and "GPU available" in caplog.text


def test_line_start_tracks_the_last_write():
    import io

    from selfsup.commands.main import LineStart

    screen = {"at_start": True}
    out, err = LineStart(io.StringIO(), screen), LineStart(io.StringIO(), screen)
    out.write("Epoch 0:  50%|#####     | 1/2\r")  # stdout's bar: the screen's line is open for stderr too
    assert not err.at_start
    err.write("done\n")
    assert out.at_start and err.stream.getvalue() == "done\n"
