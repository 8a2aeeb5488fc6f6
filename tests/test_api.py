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


@pytest.mark.train
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


@pytest.mark.train
def test_pretrain_calls_your_callbacks_and_report_false_makes_no_report(tmp_path, capsys):
    """``selfsup.pretrain(..., callbacks=[cb], report=False)``: ``cb`` is first on the Trainer and sees each step,
    the run is exported and finished without its end-of-run report (no knn.json, no kNN lines); a resume takes its
    own callbacks and ``report`` the same way."""
    import lightning.pytorch as pl

    class Steps(pl.Callback):
        def __init__(self):
            self.steps, self.places = [], set()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self.steps.append(trainer.global_step)
            self.places.add(trainer.callbacks.index(self))

    first, then = Steps(), Steps()
    run = selfsup.pretrain("simclr-digits", {"output_dir": str(tmp_path), "name": "r"}, callbacks=[first],
                           report=False, **TINY)
    assert first.steps == [0, 1] and first.places == {0}
    assert run.facts["status"] == "finished" and (run.path / "backbone.safetensors").exists()
    assert not (run.path / "knn.json").exists() and "kNN" not in capsys.readouterr().out
    selfsup.pretrain(resume=run.path, trainer={"max_epochs": 2}, callbacks=[then], report=False)
    assert then.steps == [2, 3] and then.places == {0} and first.steps == [0, 1]
    assert run.facts["global_step"] == 4 and not (run.path / "knn.json").exists()


def test_a_bad_override_is_the_clis_user_error():
    with pytest.raises(UserError, match="max_epoch"):
        selfsup.pretrain("simclr-digits", trainer={"max_epoch": 1})


# --------------------------------------------------------------------------- resume from Python
@pytest.mark.train
def test_pretrain_resume_is_the_clis_resume(tmp_path, capsys):
    """``selfsup.pretrain(resume=RUN)``: the rules of ``--resume`` (the same function): an interrupted run continued
    ends bit-identical to the uninterrupted one; a contradicting override is refused; a finished run has nothing to
    train until ``trainer.max_epochs`` extends it."""
    from ssl_helpers import RESUME, StopAfterEpoch, assert_same_run, ckpt

    def run(name, callbacks=()):
        return selfsup.pretrain("moco-v3-vit-digits", [*RESUME, f"output_dir={tmp_path}", f"name={name}"],
                                callbacks=callbacks)

    straight = run("A").path
    b = run("B", [StopAfterEpoch()]).path
    assert ckpt(b)["global_step"] == 3 and Run(b).facts["status"] == "finished"
    # the run's facts say finished after epoch 1 of 2: its config's 2 epochs extend it, as the CLI reads them
    with pytest.raises(UserError, match="contradicts"):
        selfsup.pretrain(resume=b, optim={"base_lr": 5})
    with pytest.raises(UserError, match="drop the preset"):
        selfsup.pretrain("simclr-digits", resume=b)
    resumed = selfsup.pretrain(resume=str(b))
    assert isinstance(resumed, Run) and resumed.path == b
    assert_same_run(straight, b)
    capsys.readouterr()
    selfsup.pretrain(resume=b)
    assert "nothing to train" in capsys.readouterr().out
    selfsup.pretrain(resume=b, trainer={"max_epochs": 3})
    assert ckpt(b)["global_step"] == 9 and Run(b).config.trainer.max_epochs == 3 and Run(b).facts["epochs"] == 3
