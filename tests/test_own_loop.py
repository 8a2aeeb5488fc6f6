"""docs/own-loop.md's two blocks run: BYOL around a torchvision ResNet-18 on an ImageFolder under a plain Lightning
Trainer (the backbone trained in place), and a plain PyTorch loop of views, a head and a loss."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import selfsup
from selfsup.errors import UserError

PAGE = Path(__file__).resolve().parents[1] / "docs" / "own-loop.md"


def page_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)


def tiny_folder(root: Path, n: int = 36) -> None:
    g = np.random.default_rng(0)
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(n // 2):
            Image.fromarray(g.integers(0, 255, (40 + i, 48, 3), dtype=np.uint8)).save(root / c / f"{i}.png")


@pytest.mark.train
def test_byol_around_a_torchvision_resnet_on_an_image_folder(tmp_path, monkeypatch):
    tiny_folder(tmp_path / "data" / "my_images")
    monkeypatch.chdir(tmp_path)
    code = page_blocks()[0].replace("max_epochs=1", "max_epochs=1, limit_train_batches=1, enable_progress_bar=False")
    code = code.replace('accelerator="auto"', 'accelerator="cpu"')
    import torchvision

    scope: dict = {}
    torch.manual_seed(0)
    before = torchvision.models.resnet18().state_dict()  # the same init as the page's (same seed, same order)
    torch.manual_seed(0)
    exec(compile(code, str(PAGE), "exec"), scope)
    assert scope["trainer"].global_step == 1
    saved = torch.load(tmp_path / "byol_resnet18.pt")
    assert saved.keys() == {k for k in before if not k.startswith("fc.")}
    model = scope["model"]
    assert model.backbone is scope["backbone"] and type(model).__name__ == "BYOL"
    assert model.peak_lr() == pytest.approx(1e-3 * 32 / 256)  # BYOL's rule on the batch given
    assert all(torch.equal(v, model.backbone.state_dict()[k]) for k, v in saved.items())  # the file is the backbone
    assert not torch.equal(saved["conv1.weight"], before["conv1.weight"])  # ... trained in place by the step


@pytest.mark.train
def test_distillation_of_a_frozen_teacher_into_your_own_module_and_loader(tmp_path, monkeypatch):
    """The page's distillation block, with a tiny selfsup ViT export for DINOv2 and 16 px images: ``selfsup.method
    ("distill", ...)`` trains your own module in place against the frozen teacher under your own Trainer."""
    from selfsup.export import export_backbone
    from selfsup.models.backbones import build_backbone

    monkeypatch.chdir(tmp_path)
    kwargs = {"in_chans": 3, "image_size": 16, "patch_size": 4}
    torch.manual_seed(1)
    teacher = tmp_path / "teacher.safetensors"
    export_backbone(build_backbone("vit_micro", **kwargs), teacher,
                    {"backbone": "vit_micro", "kwargs": kwargs, "image_size": 16, "in_chans": 3,
                     "mean": [0.5] * 3, "std": [0.25] * 3, "dataset": "imagefolder", "method": "dino"})
    code = page_blocks()[1]
    for written, tiny in (("dinov2_vits14_pretrain.pth", str(teacher)), ("112", "16"), ("256", "32"),
                          ("batch_size=64", "batch_size=8"), ('"queue_size": 1024', '"queue_size": 16'),
                          ("max_epochs=1", "max_epochs=1, limit_train_batches=2, enable_progress_bar=False"),
                          ('accelerator="auto"', 'accelerator="cpu"')):
        assert written in code, written
        code = code.replace(written, tiny)
    scope: dict = {}
    torch.manual_seed(0)
    exec(compile(code, str(PAGE), "exec"), scope)
    model, student = scope["model"], scope["student"]
    assert type(model).__name__ == "Distill" and model.backbone is student and scope["trainer"].global_step == 2
    assert not any(p.requires_grad for p in model.teacher.network.parameters())
    saved = torch.load(tmp_path / "student.pt")
    assert all(torch.equal(v, student.state_dict()[k]) for k, v in saved.items())


def test_a_plain_loop_of_views_a_head_and_a_loss():
    scope: dict = {}
    exec(compile(page_blocks()[2], str(PAGE), "exec"), scope)
    assert torch.isfinite(scope["loss"]) and scope["step"] == 2


def test_method_errors_are_one_line():
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4))  # (B, 3, 8, 8) -> (B, 4)
    with pytest.raises(UserError, match="neither a method"):
        selfsup.method("byl", net, num_features=4, image_size=8, batch_size=8)
    with pytest.raises(UserError, match="the flow family trains its own SiT, not your backbone"):
        selfsup.method("flow_matching", net, num_features=4, image_size=8, batch_size=8)
    with pytest.raises(UserError, match="num_features=5, but the backbone returns 4 features"):
        selfsup.method("byol", net, num_features=5, image_size=8, batch_size=8)
    net.num_features = 5
    with pytest.raises(UserError, match="num_features"):
        selfsup.method("byol", net, num_features=4, image_size=8, batch_size=8)


def test_sigreg_alone_in_a_plain_loop():
    """The page's third block: SIGReg and the predictive term on a plain encoder, three steps."""
    scope: dict = {}
    exec(compile(page_blocks()[3], str(PAGE), "exec"), scope)
    assert torch.isfinite(scope["loss"]) and scope["step"] == 2
