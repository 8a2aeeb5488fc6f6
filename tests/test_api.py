"""selfsup.pretrain / selfsup.evaluate: the CLI's code from Python (tiny runs on the embedded digits)."""

from __future__ import annotations

import re

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
def test_evaluate_takes_the_clis_options_as_keywords_and_its_errors_name_them(tmp_path):
    """``selfsup.evaluate`` has ``selfsup eval``'s options as keywords: another labelled folder (``data=``,
    ``root=``; its 24 px images read at the run's 16), ``out=``, ``train_limit=``, linear's ``mode=``; a mistake
    names the keyword (``root=``, ``train_limit=``, ``device=``), never the command line's flag."""
    from PIL import Image

    def folder(name, size):
        for split, n in (("train", 6), ("val", 3)):
            for c, cls in enumerate(("cat", "dog")):
                (tmp_path / name / split / cls).mkdir(parents=True)
                for i in range(n):
                    image = Image.new("RGB", (size, size), (40 * c + 5 * i, 9, 90))
                    image.save(tmp_path / name / split / cls / f"{i}.png")
        return tmp_path / name

    theirs, mine = folder("theirs", 16), folder("mine", 24)
    run = selfsup.pretrain("simclr", {"output_dir": str(tmp_path), "name": "r"}, report=False,
                           data={"root": str(theirs), "batch_size": 4, "num_workers": 0}, trainer=TINY["trainer"])
    folder = mine
    out = tmp_path / "results"
    knn = selfsup.evaluate(run, "knn", data="imagefolder", root=folder, out=out, ks=(3,), cache=False)
    assert knn["dataset"] == "imagefolder" and knn["train_size"] == 12 and knn["test_size"] == 6
    assert (out / "knn.json").exists() and not (run.path / "eval" / "knn.json").exists()
    probe = selfsup.evaluate(run, "linear", mode="features", train_limit=200, epochs=1)
    assert probe["mode"] == "features" and probe["protocol"] == "moco_v3" and probe["epochs"] == 1
    for call, named in ((dict(data="images"), "data=imagefolder root=<"),
                        (dict(train_limit=0), "train_limit=0"), (dict(device="nope"), "device='nope'"),
                        (dict(mode="features"), "mode=")):
        with pytest.raises(UserError, match=re.escape(named)) as e:
            selfsup.evaluate(run, "knn", **call)
        assert "--" not in str(e.value) and "\n" not in str(e.value), str(e.value)


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


@pytest.mark.train
def test_a_resume_that_changes_the_runs_length_says_its_schedules_jump(tmp_path, capsys):
    """A run made for 3 epochs, stopped after 1, resumed shortened to 2: one line says the schedules were made for
    3 epochs and now follow 2's curves; resumed again at the length it now has, nothing is said."""
    from ssl_helpers import StopAfterEpoch

    trainer = {**TINY["trainer"], "max_epochs": 3, "limit_train_batches": 1}
    run = selfsup.pretrain("simclr-digits", {"output_dir": str(tmp_path), "name": "r"}, callbacks=[StopAfterEpoch()],
                           report=False, trainer=trainer, data=TINY["data"])
    assert run.facts["epochs"] == 1
    capsys.readouterr()
    selfsup.pretrain(resume=run.path, trainer={"max_epochs": 2}, report=False)
    lines = [line for line in capsys.readouterr().out.splitlines() if "schedules" in line]
    assert len(lines) == 1 and "made for trainer.max_epochs=3" in lines[0] and "trainer.max_epochs=2" in lines[0]
    assert run.facts["epochs"] == 2 and run.config.trainer.max_epochs == 2
    selfsup.pretrain(resume=run.path, trainer={"max_epochs": 2}, report=False)
    assert "schedules" not in capsys.readouterr().out


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
