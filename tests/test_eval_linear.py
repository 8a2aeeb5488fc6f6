import math
from types import SimpleNamespace

import pytest
import torch

from selfsup.data.datasets import ImageDataset
from selfsup.eval.finetune import Classifier, layer_scales, param_groups
from selfsup.eval.linear import (GridLinear, GridSGD, ProbeConfig, assert_unchanged, cosine_epoch_lr, make_classifier,
                                 probe_augmented, probe_features, snapshot)
from selfsup.instruments import KNNMonitor, OnlineLinearProbe
from selfsup.methods import DataInfo
from selfsup.models.backbones import build_backbone
from ssl_helpers import step_outputs


def tiny_dataset(n=48, classes=3, size=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 1, size, size), generator=g, dtype=torch.uint8)
    return ImageDataset("tiny", images, torch.arange(n) % classes, classes, (0.5,), (0.25,))


def separable_dataset(n=48, classes=3, seed=0):
    """Class c: pixel values 100·c + U{0..49}: any working probe on any backbone tells the classes apart."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % classes
    images = (labels.view(n, 1, 1, 1) * 100 + torch.randint(0, 50, (n, 1, 8, 8), generator=g)).to(torch.uint8)
    return ImageDataset("separable", images, labels, classes, (0.5,), (0.25,))


META = {"image_size": 8, "mean": [0.5], "std": [0.25]}


def test_probe_leaves_resnet_parameters_and_bn_buffers_unchanged():
    torch.manual_seed(0)
    backbone = build_backbone("resnet18", in_chans=1, image_size=8, small_stem=True)
    backbone.train()  # the probe must switch it to eval mode itself
    before = snapshot(backbone)
    assert any("running_mean" in k for k in before)
    res = probe_augmented(backbone, separable_dataset(), separable_dataset(seed=1), META,
                          ProbeConfig(epochs=2, batch_size=16), base_lr=0.1)
    after = backbone.state_dict()
    assert set(after) == set(before)
    for name in before:
        assert torch.equal(after[name], before[name]), name
    assert not backbone.training
    assert 0.0 <= res["test"]["top1"] <= 100.0 and math.isfinite(res["final_loss"])
    assert res["test"]["top1"] > 80  # it learnt (93.75 when written; chance 33.3): the probe trains, eval mode or not


def test_sanity_check_catches_a_moved_buffer():
    backbone = build_backbone("resnet18", in_chans=1, image_size=8, small_stem=True)
    before = snapshot(backbone)
    backbone.bn1.running_mean += 1e-3
    with pytest.raises(RuntimeError, match="bn1.running_mean"):
        assert_unchanged(backbone, before)


def test_classifier_init_and_cosine_schedule():
    torch.manual_seed(0)
    fc = make_classifier(512, 100)
    assert abs(fc.weight.std().item() - 0.01) < 1e-3 and torch.all(fc.bias == 0)
    assert cosine_epoch_lr(1.0, 0, 10) == 1.0
    assert cosine_epoch_lr(1.0, 5, 10) == pytest.approx(0.5)


def test_feature_probe_learns_separable_classes():
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(4, 32, generator=g) * 3
    y = torch.arange(400) % 4
    x = centres[y] + torch.randn(400, 32, generator=g)
    res = probe_features(x[:300], y[:300], x[300:], y[300:], 4, ProbeConfig(epochs=10, batch_size=64), base_lr=0.4)
    assert res["test"]["top1"] > 95 and res["test"]["top5"] == 100.0


def test_grid_heads_train_exactly_like_separate_linears_with_torch_sgd():
    """GridLinear + GridSGD == one nn.Linear per (lr, wd) point, each with torch.optim.SGD (momentum 0.9)."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(5, 40, 16, generator=g), torch.randint(0, 3, (5, 40), generator=g)
    lrs, wds = torch.tensor([0.5, 0.05, 0.2]), torch.tensor([0.0, 1e-3, 0.1])
    grid = GridLinear(16, 3, 3)
    with torch.no_grad():
        grid.bias.normal_(generator=g)
    refs = []
    for i in range(3):
        fc = torch.nn.Linear(16, 3)
        with torch.no_grad():
            fc.weight.copy_(grid.weight[i].T)
            fc.bias.copy_(grid.bias[i, 0])
        refs.append((fc, torch.optim.SGD(fc.parameters(), lr=float(lrs[i]), momentum=0.9, weight_decay=float(wds[i]))))
    opt = GridSGD(grid.parameters(), lrs, wds, 0.9)
    for step in range(5):
        opt.scale = cosine_epoch_lr(1.0, step, 5)
        loss = grid.loss(x[step], y[step])
        opt.zero_grad()
        loss.backward()
        opt.step()
        for i, (fc, ref_opt) in enumerate(refs):
            for group in ref_opt.param_groups:
                group["lr"] = float(lrs[i]) * opt.scale
            ref_loss = torch.nn.functional.cross_entropy(fc(x[step]), y[step])
            ref_opt.zero_grad()
            ref_loss.backward()
            ref_opt.step()
    for i, (fc, _) in enumerate(refs):
        torch.testing.assert_close(grid.weight[i].T, fc.weight, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grid.bias[i, 0], fc.bias, rtol=1e-5, atol=1e-6)


def test_grid_point_is_chosen_on_validation_and_test_reported_there():
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(4, 32, generator=g) * 3
    y = torch.arange(500) % 4
    x = centres[y] + torch.randn(500, 32, generator=g)
    cfg = ProbeConfig(epochs=5, batch_size=64, lr_grid=(1e-7, 0.4), wd_grid=(0.0, 1e-4), val_fraction=0.2)
    res = probe_features(x[:400], y[:400], x[400:], y[400:], 4, cfg, base_lr=99.0)
    assert [(p["base_lr"], p["weight_decay"]) for p in res["grid"]] == [(1e-7, 0.0), (0.4, 0.0), (1e-7, 1e-4),
                                                                        (0.4, 1e-4)]
    assert res["val_size"] == 80 and all("val_top1" in p for p in res["grid"])
    assert res["chosen"]["base_lr"] == 0.4  # the lr that learns, not the one that barely moves
    assert res["test"]["top1"] == res["chosen"]["test_top1"] > 95
    assert res["grid"][0]["val_top1"] < 60


def test_layer_decay_scales_vit_and_not_resnet():
    vit = build_backbone("vit_micro", in_chans=1, image_size=8, patch_size=2)
    scales = layer_scales(Classifier(vit, 10), 0.5)
    d = vit.depth
    assert scales["head.weight"] == 1.0 and scales["backbone.norm.weight"] == 1.0
    assert scales["backbone.blocks.0.attn.qkv.weight"] == 0.5 ** d
    assert scales["backbone.patch_embed.proj.weight"] == 0.5 ** (d + 1)
    groups = param_groups(Classifier(vit, 10), 0.05, 0.5)
    assert all(g["weight_decay"] == 0 for g in groups if any(p.ndim <= 1 for p in g["params"]))
    resnet = build_backbone("resnet18", in_chans=1, image_size=8, small_stem=True)
    assert set(layer_scales(Classifier(resnet, 10), 0.5).values()) == {1.0}


# ------------------------------------------------------------------ online evaluators (no Trainer needed)


class Logger:
    def __init__(self):
        self.logged = {}

    def __call__(self, name, value, **kw):
        self.logged[name] = float(value)

    def log_metrics(self, metrics, step):  # the kNN monitor writes to the run's loggers directly
        self.logged.update(metrics)


def fake(dataset, step=4):
    backbone = build_backbone("vit_micro", in_chans=1, image_size=8, patch_size=2)
    # a method declares the backbone it is judged by (TrainingBase.eval_backbone)
    module = SimpleNamespace(backbone=backbone, eval_backbone=backbone, info=DataInfo(1, 8, (0.5,), (0.25,)),
                             device=torch.device("cpu"), log=Logger())
    trainer = SimpleNamespace(global_step=step, is_global_zero=True, datamodule=SimpleNamespace(dataset=dataset),
                              loggers=[module.log])
    return trainer, module


def test_knn_monitor_logs_and_restores_train_mode():
    train = tiny_dataset(60)
    trainer, module = fake(train)
    mon = KNNMonitor(every_n_steps=2, k=5, train_size=40, test_size=20, train=train, test=tiny_dataset(30, seed=1))
    mon.setup(trainer, module, "fit")
    module.backbone.train()
    mon.on_train_batch_end(trainer, module, {}, None, 0)
    assert module.backbone.training
    assert 0 <= module.log.logged["monitor/knn_top1"] <= 100 and mon.history[0][0] == 4
    trainer.global_step = 5  # not a multiple of 2: no measurement
    mon.on_train_batch_end(trainer, module, {}, None, 0)
    assert len(mon.history) == 1
    # a value that tells a working monitor from a broken one: every test image is also a train image, its own
    # nearest neighbour, so 1-NN must be 100% (about 33% if features and labels were mismatched)
    same = KNNMonitor(every_n_steps=2, k=1, train_size=60, test_size=60, train=train, test=train)
    same.setup(trainer, module, "fit")
    trainer.global_step = 4
    same.on_train_batch_end(trainer, module, {}, None, 0)
    assert module.log.logged["monitor/knn_top1"] == 100.0


def test_online_probe_trains_on_detached_embeddings():
    trainer, module = fake(tiny_dataset())
    probe = OnlineLinearProbe(lr=0.05, num_classes=3)
    probe.on_fit_start(trainer, module)
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(3, module.backbone.num_features, generator=g) * 3
    for _ in range(30):
        y = torch.randint(0, 3, (32,), generator=g)
        emb = (centres[y] + torch.randn(32, centres.shape[1], generator=g)).requires_grad_(True)
        probe.on_train_batch_end(trainer, module, step_outputs(embedding=emb, labels=y), None, 0)
    assert emb.grad is None  # nothing flows back into the embedding
    assert module.log.logged["monitor/probe_acc"] > 90
    state = probe.state_dict()
    other = OnlineLinearProbe(num_classes=3)
    other.load_state_dict(state)
    other.on_fit_start(trainer, module)
    assert torch.equal(other.probe.weight, probe.probe.weight)


def test_online_probe_ignores_unlabelled_samples():
    """A batch with unlabelled (-1) samples updates the probe as its labelled samples alone would."""
    trainer, module = fake(tiny_dataset())
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(16, module.backbone.num_features, generator=g)
    labels = torch.randint(0, 3, (16,), generator=g)
    labels[::3] = -1
    probes = [OnlineLinearProbe(lr=0.05, num_classes=3) for _ in range(2)]
    for probe in probes:
        probe.on_fit_start(trainer, module)
    probes[0].on_train_batch_end(trainer, module, step_outputs(embedding=emb, labels=labels), None, 0)
    logged = dict(module.log.logged)
    keep = labels >= 0
    probes[1].on_train_batch_end(trainer, module, step_outputs(embedding=emb[keep], labels=labels[keep]), None, 0)
    torch.testing.assert_close(probes[0].probe.weight, probes[1].probe.weight)
    assert logged["monitor/probe_acc"] == pytest.approx(module.log.logged["monitor/probe_acc"])
    assert logged["monitor/probe_loss"] == pytest.approx(module.log.logged["monitor/probe_loss"])


# ------------------------------------------------------------------ fine-tuning: MAE recipe


def test_mae_recipe_finetune_on_an_rgb_folder(tmp_path):
    """timm RandAugment + erasing in the loader, Mixup / CutMix soft targets; head std 2e-5; min_lr absolute."""
    from PIL import Image

    from selfsup.data.datasets import FolderImages
    from selfsup.eval.finetune import FinetuneConfig, finetune
    from selfsup.eval.mae_recipe import MAERecipe

    g = torch.Generator().manual_seed(0)
    files = []
    for i in range(16):
        f = tmp_path / f"{i}.png"
        Image.fromarray(torch.randint(0, 256, (12, 10, 3), generator=g, dtype=torch.uint8).numpy()).save(f)
        files.append(f)
    train = ImageDataset("imagefolder", FolderImages(files, 8), torch.arange(16) % 2, 2, (0.5,) * 3, (0.25,) * 3)
    torch.manual_seed(0)
    assert abs(Classifier(build_backbone("vit_micro", in_chans=3, image_size=8, patch_size=2), 10).head.weight.std()
               - 2e-5) < 5e-6
    backbone = build_backbone("vit_micro", in_chans=3, image_size=8, patch_size=2)
    cfg = FinetuneConfig(epochs=2, batch_size=8, recipe=MAERecipe(), min_lr=1e-6)
    res = finetune(backbone, train, train, {"image_size": 8, "mean": [0.5] * 3, "std": [0.25] * 3}, cfg)
    assert res["steps"] == 4 and math.isfinite(res["final_loss"]) and res["final_lr"] == 1e-6
    assert res["peak_lr"] == pytest.approx(1e-3 * 8 / 256)


def test_mae_transform_is_timms_with_a_posterize_that_takes_zero_bits():
    from PIL import Image

    from selfsup.eval.mae_recipe import MAERecipe, _posterize, train_transform

    t = train_transform(8, (0.5,), (0.25,), MAERecipe())
    names = [type(x).__name__ for x in t.transforms]
    assert names[:3] == ["RandomResizedCropAndInterpolation", "RandomHorizontalFlip", "RandAugment"]
    assert names[-1] == "RandomErasing" and t.transforms[-1].probability == 0.25
    assert t.transforms[0].scale == (0.08, 1.0)
    assert all(op.aug_fn is _posterize for op in t.transforms[2].ops if op.name.startswith("Posterize"))
    grey = Image.new("L", (6, 6), 200)
    assert max(_posterize(grey, 0).getdata()) == 0 and _posterize(grey, 8) is grey
    torch.manual_seed(0)
    for _ in range(300):  # RandAugment on a 1-channel image (m9 ± noise reaches 0-bit posterize)
        assert t(grey).shape == (1, 8, 8)


def test_feature_bn_makes_the_probe_indifferent_to_feature_offset_and_scale():
    """MAE's BatchNorm1d(affine=False) before the heads: shifted, scaled features give the same accuracy."""
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(4, 32, generator=g)
    y = torch.arange(400) % 4
    x = centres[y] + torch.randn(400, 32, generator=g)
    cfg = ProbeConfig(epochs=10, batch_size=64, lr_grid=(0.3,), val_fraction=0.0)
    plain = probe_features(x[:300], y[:300], x[300:], y[300:], 4, cfg, base_lr=0.0)
    shifted = probe_features(x[:300] * 50 + 200, y[:300], x[300:] * 50 + 200, y[300:], 4, cfg, base_lr=0.0)
    assert abs(plain["test"]["top1"] - shifted["test"]["top1"]) <= 2 and plain["test"]["top1"] > 80
    assert not GridLinear(8, 2, 3, feature_bn=True).norm.affine
    assert len(list(GridLinear(8, 2, 3, True).parameters())) == 2
