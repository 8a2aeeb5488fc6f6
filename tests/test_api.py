"""selfsup.pretrain / selfsup.evaluate: the CLI's code from Python (tiny runs on the embedded digits)."""

from __future__ import annotations

import pytest
import torch

import selfsup
from selfsup.api import Run, override_items
from selfsup.errors import UserError

TINY = {"trainer": {"max_epochs": 1, "limit_train_batches": 2, "progress_bar": False, "accelerator": "cpu",
                    "devices": 1}, "data": {"batch_size": 32}}


def test_overrides_as_sections_mappings_or_items():
    assert override_items({"trainer.max_epochs": 2}, data={"batch_size": 8, "hflip": True}) == [
        "trainer.max_epochs=2", "data.batch_size=8", "data.hflip=true"]
    assert override_items(["optim.base_lr=0.1"]) == ["optim.base_lr=0.1"]
    assert override_items(augment={"global_crops_scale": [0.4, 1.0]}) == ["augment.global_crops_scale=[0.4, 1.0]"]
    with pytest.raises(UserError, match="mapping"):
        override_items(trainer=3)


def test_pretrain_then_evaluate(tmp_path):
    run = selfsup.pretrain("simclr-digits", {"output_dir": str(tmp_path)}, **TINY)
    assert isinstance(run, Run) and (run.path / "backbone.safetensors").exists()
    assert run.config.method_name == "simclr" and run.config.trainer.max_epochs == 1
    assert run.facts["global_step"] == 2 and run.metrics
    assert run.backbone(torch.zeros(2, 1, 8, 8)).shape[0] == 2
    knn = selfsup.evaluate(run, "knn", ks=(5,))
    assert 0 <= knn["results"]["k=5"]["top1"] <= 100
    with pytest.raises(UserError, match="unknown option"):
        selfsup.evaluate(run, "knn", k=5)
    with pytest.raises(UserError, match="protocol"):
        selfsup.evaluate(run, "nope")


def test_a_bad_override_is_the_clis_user_error():
    with pytest.raises(UserError, match="max_epoch"):
        selfsup.pretrain("simclr-digits", trainer={"max_epoch": 1})
