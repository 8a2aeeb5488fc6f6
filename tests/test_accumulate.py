"""trainer.accumulate_grad_batches: k micro-batches of B give the gradients of one batch of k·B, and every
per-iteration schedule (lr warmup + cosine, EMA momentum, the flow EMA's warm-up) counts optimiser steps, not
micro-batches; for both method families."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

import selfsup.engine as engine
from selfsup.config import load_run_config
from selfsup.data.datasets import load_dataset
from selfsup.errors import UserError
from selfsup.methods.base import SSLMethod
from selfsup.methods.build import data_info
from selfsup.methods.byol import BYOL
from selfsup.methods.flow import FlowMatching


class LayerNormBYOL(SSLMethod):
    """BYOL's algorithm (predictor, EMA target, regression loss) with no batch statistics anywhere (the micro
    ViT has LayerNorm only; the heads are Linear), so a sample's gradient does not depend on its batch-mates."""

    Config = BYOL.Config
    recipe = "byol"
    uses_momentum = True
    forward_views = BYOL.forward_views
    trainable = BYOL.trainable

    def __init__(self, cfg, info):
        super().__init__(cfg, info)
        self.projector = nn.Sequential(nn.Linear(self.backbone.num_features, 32), nn.GELU(), nn.Linear(32, 16))
        self.predictor = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16))
        self.target_backbone = self.momentum_target(self.backbone)
        self.target_projector = self.momentum_target(self.projector)


class Record(pl.Callback):
    """Per optimiser step: the accumulated gradients (before the step), each group's lr and the EMA momentum."""

    def __init__(self):
        self.grads, self.lrs, self.momenta, self.batches = [], [], [], 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batches += 1

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.grads.append({n: p.grad.clone() for n, p in pl_module.named_parameters() if p.grad is not None})
        self.lrs.append([g["lr"] for g in optimizer.param_groups])
        self.momenta.append(pl_module.momentum)


# deterministic views (whole-image crop, no flip / colour / blur / solarize), so both runs see the same pixels
SAME_VIEWS = ["augment.crop_min=1.0", "augment.hflip_p=0.0", "augment.jitter_p=0.0", "augment.grayscale_p=0.0",
              "augment.blur_p=0.0", "augment.solarize_p=0.0"]


def train(tmp_path, name, cls, preset, overrides):
    """``cls`` (a method class) trained on ``preset`` with the budget ``overrides``, a Record callback beside it."""
    cfg = load_run_config(preset, [*overrides, "trainer.accelerator=cpu", "trainer.devices=1",
                                   "trainer.progress_bar=false", "trainer.log_every_n_steps=1",
                                   "instruments.enabled=false", f"output_dir={tmp_path}", f"name={name}"])
    train_set = load_dataset(cfg.data, "train")
    pl.seed_everything(0, verbose=False)
    model = cls(cfg, data_info(cfg, train_set))
    record = Record()
    trainer = engine.make_trainer(cfg, tmp_path / name)
    trainer.callbacks.append(record)
    trainer.fit(model, datamodule=engine.PretrainData(cfg, train_set))
    return model, record, trainer


def fit(tmp_path, name, batch_size, accumulate, batches):
    return train(tmp_path, name, LayerNormBYOL, "byol-digits", [
        *SAME_VIEWS, f"data.batch_size={batch_size}", f"trainer.accumulate_grad_batches={accumulate}",
        f"trainer.limit_train_batches={batches}", "trainer.max_epochs=2", "optim.warmup_epochs=1",
        "optim.lr_scaling=linear"])


@pytest.mark.train
def test_accumulated_micro_batches_give_the_large_batch_gradients_and_schedules(tmp_path):
    big, rb, tb = fit(tmp_path, "big", 32, 1, 3)  # 3 steps of 32 per epoch
    acc, ra, ta = fit(tmp_path, "acc", 16, 2, 6)  # 6 micro-batches of 16 = the same 3 steps of the same samples
    assert rb.batches == 6 and ra.batches == 12 and tb.global_step == ta.global_step == 6
    assert len(rb.grads) == len(ra.grads) == 6 and acc.total_steps == big.total_steps == 6
    # lr: warmup + cosine per optimiser step, scaled by 32 not 16
    assert sum(ra.lrs, []) == pytest.approx(sum(rb.lrs, []), rel=1e-12)
    assert len(set(lr[0] for lr in rb.lrs)) == 6 and ra.momenta == pytest.approx(rb.momenta, rel=1e-12)
    for step, (ga, gb) in enumerate(zip(ra.grads, rb.grads)):
        assert ga.keys() == gb.keys() and len(ga) > 10
        for k in gb:
            torch.testing.assert_close(ga[k], gb[k], rtol=1e-4, atol=1e-6, msg=lambda m: f"step {step} {k}: {m}")
    sa, sb = acc.state_dict(), big.state_dict()
    assert any(k.startswith("target_backbone.") for k in sb)  # the EMA: once per optimiser step in both runs
    # (atol 1e-4: AdamW scales near-zero gradients, e.g. of the attention key bias, up to the lr)
    for k in sb:
        torch.testing.assert_close(sa[k], sb[k], rtol=1e-4, atol=1e-4, msg=lambda m: f"{k}: {m}")


def test_accumulation_is_validated():
    with pytest.raises(UserError, match="trainer.accumulate_grad_batches=0 must be >= 1"):
        load_run_config("byol-digits", ["trainer.accumulate_grad_batches=0"])


class OwnDrawsFlow(FlowMatching):
    """Plain flow matching whose noise and level of a sample are functions of that sample's own pixels instead of
    the step's generator (label dropout 0), so a sample's loss and gradient do not depend on its batch-mates or on
    the micro-batch it falls in (the SiT normalises with LayerNorm only): what is left to compare is accumulation."""

    def draw_noise(self, x0):
        self._levels = torch.sigmoid(4 * x0.flatten(1).mean(1))  # each sample's own t in (0, 1)
        return torch.sin(3 * x0 + torch.arange(x0[0].numel(), dtype=x0.dtype, device=x0.device).view_as(x0[0]))

    def draw_t(self, n, device):
        return self._levels


def fit_flow(tmp_path, name, batch_size, accumulate, batches):
    return train(tmp_path, name, OwnDrawsFlow, "flow-matching-digits", [
        f"data.batch_size={batch_size}", f"trainer.accumulate_grad_batches={accumulate}",
        f"trainer.limit_train_batches={batches}", "trainer.max_epochs=2", "optim.warmup_epochs=1",
        "method.label_dropout=0", "method.ema_decay=0.9", "method.ema_warmup_steps=4"])


@pytest.mark.train
def test_accumulated_flow_micro_batches_give_the_large_batch_gradients_schedules_and_ema(tmp_path):
    """The flow family accumulates as the joint one: its EMA is a post-step hook (once per optimiser step, its
    warm-up counted in optimiser steps), its lr schedule counts optimiser steps, and k micro-batches of B give the
    gradients of one batch of k·B (the per-micro-batch seeds change only the generator's draws, which this
    method does not use)."""
    big, rb, tb = fit_flow(tmp_path, "big", 32, 1, 3)
    acc, ra, ta = fit_flow(tmp_path, "acc", 16, 2, 6)
    assert rb.batches == 6 and ra.batches == 12 and tb.global_step == ta.global_step == 6
    assert len(rb.grads) == len(ra.grads) == 6 and acc.total_steps == big.total_steps == 6
    assert sum(ra.lrs, []) == pytest.approx(sum(rb.lrs, []), rel=1e-12) and len(set(lr[0] for lr in rb.lrs)) == 6
    for step, (ga, gb) in enumerate(zip(ra.grads, rb.grads)):
        assert ga.keys() == gb.keys() and len(ga) > 10
        for k in gb:
            torch.testing.assert_close(ga[k], gb[k], rtol=1e-4, atol=1e-6, msg=lambda m: f"step {step} {k}: {m}")
    assert acc.ema_decay == big.ema_decay == pytest.approx(0.9)  # the warm-up's 4 optimiser steps are over
    sa, sb = acc.state_dict(), big.state_dict()
    assert any(k.startswith("ema.") for k in sb)
    for k in sb:
        torch.testing.assert_close(sa[k], sb[k], rtol=1e-4, atol=1e-4, msg=lambda m: f"{k}: {m}")


@pytest.mark.spawn
def test_instruments_measure_once_per_optimiser_step(tmp_path):
    """7 batches, k = 2: 4 optimiser steps (the epoch's last takes one batch); one metrics.csv row per step,
    each with the step-output instruments (never a row labelled with the previous step by a later batch)."""
    import csv

    from ssl_helpers import TINY

    cfg = load_run_config("byol-digits", [*TINY, "data.batch_size=32", "trainer.limit_train_batches=7",
                                          "trainer.accumulate_grad_batches=2", "instruments.every_n_steps=1",
                                          "instruments.rank_every_n_steps=2", f"output_dir={tmp_path}", "name=r"])
    run = engine.pretrain(cfg)
    with (run / "metrics.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [0, 1, 2, 3]
    assert all(r["instruments/norm_embedding_mean"] and r["instruments/align_prediction_target"]
               and r["instruments/grad_l2"] and r["train/loss"] for r in rows)
    assert [bool(r["instruments/rankme_embedding"]) for r in rows] == [True, False, True, False]
