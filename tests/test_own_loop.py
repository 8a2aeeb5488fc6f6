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


def test_a_plain_loop_of_views_a_head_and_a_loss():
    scope: dict = {}
    exec(compile(page_blocks()[1], str(PAGE), "exec"), scope)
    assert torch.isfinite(scope["loss"]) and scope["step"] == 2


def test_method_errors_are_one_line():
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 4))  # (B, 3, 8, 8) -> (B, 4)
    with pytest.raises(UserError, match="neither a method"):
        selfsup.method("byl", net, num_features=4, image_size=8, batch_size=8)
    with pytest.raises(UserError, match="joint-embedding"):
        selfsup.method("flow_matching", net, num_features=4, image_size=8, batch_size=8)
    with pytest.raises(UserError, match="num_features=5, but the backbone returns 4 features"):
        selfsup.method("byol", net, num_features=5, image_size=8, batch_size=8)
    net.num_features = 5
    with pytest.raises(UserError, match="num_features"):
        selfsup.method("byol", net, num_features=4, image_size=8, batch_size=8)


def test_sigreg_alone_in_a_plain_loop():
    """The page's third block: SIGReg and the predictive term on a plain encoder, three steps."""
    scope: dict = {}
    exec(compile(page_blocks()[2], str(PAGE), "exec"), scope)
    assert torch.isfinite(scope["loss"]) and scope["step"] == 2
