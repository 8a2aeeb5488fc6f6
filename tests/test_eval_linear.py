import math
from types import SimpleNamespace

import pytest
import torch

from selfsup.data.datasets import ImageDataset
from selfsup.eval.finetune import Classifier, layer_scales, param_groups
from selfsup.eval.linear import (ProbeConfig, assert_unchanged, cosine_epoch_lr, make_classifier, probe_augmented,
                                 probe_features, snapshot)
from selfsup.instruments import KNNMonitor, OnlineLinearProbe, monitor_callbacks
from selfsup.methods import DataInfo
from selfsup.models.backbones import build_backbone


def tiny_dataset(n=48, classes=3, size=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 1, size, size), generator=g, dtype=torch.uint8)
    return ImageDataset("tiny", images, torch.arange(n) % classes, classes, (0.5,), (0.25,))


META = {"image_size": 8, "mean": [0.5], "std": [0.25]}


def test_probe_leaves_resnet_parameters_and_bn_buffers_unchanged():
    torch.manual_seed(0)
    backbone = build_backbone("resnet18", in_chans=1, image_size=8, small_stem=True)
    backbone.train()  # the probe must switch it to eval mode itself
    before = snapshot(backbone)
    assert any("running_mean" in k for k in before)
    res = probe_augmented(backbone, tiny_dataset(), tiny_dataset(seed=1), META, ProbeConfig(epochs=2, batch_size=16),
                          lr=0.1)
    after = backbone.state_dict()
    assert set(after) == set(before)
    for name in before:
        assert torch.equal(after[name], before[name]), name
    assert not backbone.training
    assert 0.0 <= res["test"]["top1"] <= 100.0 and math.isfinite(res["final_loss"])


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
    res = probe_features(x[:300], y[:300], x[300:], y[300:], 4, ProbeConfig(epochs=10, batch_size=64), lr=0.1)
    assert res["test"]["top1"] > 95 and res["test"]["top5"] == 100.0


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
    module = SimpleNamespace(backbone=backbone, info=DataInfo(1, 8, (0.5,), (0.25,)), device=torch.device("cpu"),
                             log=Logger())
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


def test_online_probe_trains_on_detached_embeddings():
    trainer, module = fake(tiny_dataset())
    probe = OnlineLinearProbe(lr=0.05, num_classes=3)
    probe.on_fit_start(trainer, module)
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(3, module.backbone.num_features, generator=g) * 3
    for _ in range(30):
        y = torch.randint(0, 3, (32,), generator=g)
        emb = (centres[y] + torch.randn(32, centres.shape[1], generator=g)).requires_grad_(True)
        probe.on_train_batch_end(trainer, module, {"loss": None, "embedding": emb, "labels": y}, None, 0)
    assert emb.grad is None  # nothing flows back into the embedding
    assert module.log.logged["monitor/probe_acc"] > 90
    state = probe.state_dict()
    other = OnlineLinearProbe(num_classes=3)
    other.load_state_dict(state)
    other.on_fit_start(trainer, module)
    assert torch.equal(other.probe.weight, probe.probe.weight)


def test_monitor_callbacks_follow_config():
    from selfsup.config import load_run_config

    assert monitor_callbacks(load_run_config("moco-v3-vit-digits", ["instruments.enabled=false"])) == []
    cfg = load_run_config("moco-v3-vit-digits", ["eval.knn_every_n_steps=50", "eval.online_probe=true",
                                                 "instruments.enabled=false"])
    kinds = [type(c) for c in monitor_callbacks(cfg)]
    assert kinds == [KNNMonitor, OnlineLinearProbe]
