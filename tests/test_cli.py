"""The ``selfsup`` command line end to end: presets, a tiny pretraining run, and every bad input → exit 2."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image

import selfsup.methods.moco_v3 as moco_v3
from selfsup.commands.main import main
from selfsup.config import load_run_config, preset_names, to_dict
from ssl_helpers import TINY, assert_user_error, run_cli

PRESET = "moco-v3-vit-digits"
SELFSUP = Path(sys.executable).with_name("selfsup")


@pytest.fixture(scope="module")
def e2e(tmp_path_factory):
    out = tmp_path_factory.mktemp("e2e")
    code, stdout, stderr = run_cli("pretrain", PRESET, *TINY, f"output_dir={out}", "name=run")
    assert code == 0, stderr
    return out / "run", stdout


# --------------------------------------------------------------------------- good paths


def test_presets_lists_every_preset_with_a_summary(capsys):
    assert main(["presets"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = preset_names()
    assert len(lines) == len(names) and len(names) >= 1
    for name, line in zip(names, lines):
        listed, summary = line.split(None, 1)
        assert listed == name and len(summary.strip()) > 10


@pytest.mark.train
def test_pretrain_run_folder(e2e):
    run, stdout = e2e
    for f in ("config.yaml", "checkpoints/last.ckpt", "metrics.csv", "backbone.safetensors",
              "backbone_init.safetensors", "knn.json"):
        assert (run / f).is_file(), f
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    # config.yaml is the resolved config: it gives back the run's config
    cfg = load_run_config(PRESET, [*TINY, f"output_dir={run.parent}", "name=run"])
    assert yaml.safe_load((run / "config.yaml").read_text()) == to_dict(cfg)
    metrics = (run / "metrics.csv").read_text().splitlines()
    assert "train/loss" in metrics[0] and len(metrics) == 1 + 2  # a row per step (log_every_n_steps=1)
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 2
    facts = json.loads((run / "run.json").read_text())  # what the report's header reads
    assert {k: facts[k] for k in ("global_step", "epochs", "sessions", "world_size", "num_nodes", "accelerator")} == \
        {"global_step": 2, "epochs": 1, "sessions": 1, "world_size": 1, "num_nodes": 1, "accelerator": "cpu"}
    assert facts["device"] == "cpu" and 0 < facts["fit_seconds"] < 600
    knn = json.loads((run / "knn.json").read_text())
    for key in ("pretrained", "random_init"):
        assert 0 <= knn[key]["top1"] <= knn[key]["top5"] <= 100
        assert knn[key]["top1"] > 30  # a random or 2-step micro ViT's features still carry the digit (chance: 10%)
    assert knn["test_size"] == 359 and knn["train_size"] == 1438
    assert "on digits test (359 images)" in stdout
    for key in ("pretrained", "random_init"):
        assert f"{key}" in stdout and f"top-1 {knn[key]['top1']:6.2f}%" in stdout
        assert f"top-5 {knn[key]['top5']:6.2f}%" in stdout
    assert f"run folder: {run}" in stdout


@pytest.mark.train
def test_exported_backbone_loads_into_timm_without_selfsup(e2e):
    import timm.models.vision_transformer as tv
    from safetensors import safe_open
    from safetensors.torch import load_file
    from torch import nn

    from selfsup.export import load_exported

    path = e2e[0] / "backbone.safetensors"
    with safe_open(str(path), framework="pt") as f:
        meta = json.loads(f.metadata()["selfsup"])
    assert meta["backbone"] == "vit_micro" and meta["image_size"] == 8 and meta["in_chans"] == 1
    assert meta["timm"]["kwargs"] | {"drop_path_rate": 0.0} == dict(  # the pretrain run's file carries its recipe
        img_size=8, patch_size=2, in_chans=1, embed_dim=128, depth=4, num_heads=4, mlp_ratio=4.0, qkv_bias=True,
        num_classes=0, global_pool="token", fc_norm=False, class_token=True, no_embed_class=False, pre_norm=False,
        init_values=None, drop_path_rate=0.0)
    ref = tv.VisionTransformer(img_size=8, patch_size=2, in_chans=1, embed_dim=128, depth=4, num_heads=4,
                               mlp_ratio=4.0, qkv_bias=True, num_classes=0, global_pool="token", fc_norm=False,
                               norm_layer=partial(nn.LayerNorm, eps=1e-6)).eval()
    state = load_file(str(path))
    ref.load_state_dict(state, strict=True)
    ours, _ = load_exported(path)
    x = torch.randn(5, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(ref(x), ours.eval()(x), atol=1e-5, rtol=1e-5)
    init = load_file(str(e2e[0] / "backbone_init.safetensors"))
    assert not torch.equal(init["blocks.0.attn.qkv.weight"], state["blocks.0.attn.qkv.weight"])  # it trained


# --------------------------------------------------------------------------- bad inputs


@pytest.mark.parametrize("args, words", [
    (["moco-v3-vit-digit"], ["no preset or YAML file named 'moco-v3-vit-digit'", "did you mean moco-v3-vit-digits"]),
    ([PRESET, "optim.base_rl=0.1"], ["unknown config key 'optim.base_rl'", "optim.base_lr"]),
    ([PRESET, "trainer.max_epochs=abc"], ["trainer.max_epochs='abc'", "expected an integer"]),
    ([PRESET, "trainer.max_epochs=0"], ["trainer.max_epochs=0 must be >= 1"]),
    ([PRESET, "method.momentum=1.5"], ["method.momentum=1.5 must be in [0, 1]"]),
    ([PRESET, "max_epochs"], ["not of the form dotted.key=value"]),
    ([], ["needs a preset name"]),
])
def test_config_mistakes_exit_2_with_one_line(args, words):
    code, _, err = run_cli("pretrain", *args)
    assert_user_error(code, err, *words)


DINO_TINY = ["trainer.max_epochs=1", "trainer.limit_train_batches=1", "trainer.progress_bar=false",
             "trainer.accelerator=cpu", "trainer.devices=1", "data.batch_size=16", "method.out_dim=64",
             "method.hidden_dim=32", "method.bottleneck_dim=16"]


@pytest.mark.parametrize("preset, args, words", [
    # each names the key the user typed and its fix (issue 22: these were tracebacks, hangs or other keys)
    (PRESET, ["trainer.accelerator=gpu"], ["trainer.accelerator=gpu", "no CUDA GPU", "trainer.accelerator=cpu"]),
    (PRESET, ["trainer.accelerator=cpu", "trainer.devices=4096"], ["trainer.devices=4096", "CPU cores", "or fewer"]),
    (PRESET, ["trainer.accelerator=cpu", "trainer.devices=0"], ["trainer.devices=0", ">= 1"]),
    (PRESET, ["data.num_workers=-2"], ["data.num_workers=-2", ">= 0"]),
    (PRESET, ["data.channels=3"], ["data.channels=3", "leave data.channels unset"]),
    (PRESET, ["data.channels=2"], ["data.channels=2", "1 (grayscale) or 3 (RGB)"]),
    ("dino-digits", ["augment.local_crops_number=4", "augment.local_crops_size=5"],
     ["augment.local_crops_size=5", "model.patch_size=2", "e.g. 4"]),
    ("dino-digits", ["augment.global_crops_scale=[0.9,0.2]"], ["augment.global_crops_scale=[0.9, 0.2]", "min first"]),
    ("dino-digits", ["augment.local_crops_number=4", "augment.local_crops_scale=[0.5,0.1]"],
     ["augment.local_crops_scale=[0.5, 0.1]"]),
    (PRESET, ["augment.branch2.crop_min=0.9", "augment.branch2.crop_max=0.2"], ["augment.branch2.crop_min"]),
    (PRESET, ["data.name=webdataset", "data.root=/nonexistent/train-*.tar"],
     ["no file matches data.root=/nonexistent/train-*.tar", "brace pattern"]),
    (PRESET, ["data.name=webdataset", "data.root=/nonexistent/train-{0..3}.tar"],
     ["no file matches data.root=/nonexistent/train-{0..3}.tar"]),
])
def test_edge_mistakes_exit_2_with_one_line(preset, args, words, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same answer on a machine with a GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    tiny = TINY if preset == PRESET else DINO_TINY
    code, _, err = run_cli("pretrain", preset, *tiny, *args, f"output_dir={tmp_path}", "name=r")
    assert_user_error(code, err, *words)
    assert not (tmp_path / "r").exists()


def test_an_output_dir_that_cannot_be_made_is_one_line(tmp_path):
    (tmp_path / "file").write_text("x")
    code, _, err = run_cli("pretrain", PRESET, *TINY, f"output_dir={tmp_path / 'file' / 'runs'}", "name=r")
    assert_user_error(code, err, f"output_dir={tmp_path / 'file' / 'runs'}", "cannot hold run folders",
                      "set output_dir")


def test_a_run_killed_before_its_first_checkpoint_is_called_so(tmp_path):
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.yaml").write_text("method:\n  name: moco_v3\n")
    (run / "backbone_init.safetensors").write_bytes(b"")
    code, _, err = run_cli("eval", "knn", str(run))
    assert_user_error(code, err, "stopped before its first checkpoint", "backbone_init.safetensors", "train it again")
    (run / "config.yaml").unlink()
    (run / "metrics.csv").write_text("epoch,step,train/loss\n0,0,1.0\n")
    from selfsup.config import read_run_config
    from selfsup.errors import UserError

    with pytest.raises(UserError, match="holds a run's metrics.csv but no config.yaml"):
        read_run_config(run)


@pytest.mark.train
def test_image_size_and_channels_of_a_grayscale_folder(tmp_path):
    """data.image_size unset: the first images' size (28 px), printed and recorded in config.yaml; data.channels=1
    decodes them to one channel, with the luma of ImageNet's statistics."""
    root = tmp_path / "gray"
    root.mkdir()
    for i in range(8):
        Image.new("L", (28, 28), 30 * i).save(root / f"{i}.png")
    code, out, err = run_cli("pretrain", PRESET, *TINY, "data.name=images", f"data.root={root}", "data.channels=1",
                             "data.batch_size=4", "model.patch_size=7", f"output_dir={tmp_path}", "name=r")
    assert code == 0, err
    assert "data.image_size unset: using 28 px" in err
    cfg = yaml.safe_load((tmp_path / "r" / "config.yaml").read_text())
    assert cfg["data"]["image_size"] == 28 and cfg["data"]["channels"] == 1
    from selfsup.export import read_meta

    meta = read_meta(tmp_path / "r" / "backbone.safetensors")
    assert (meta["image_size"], meta["in_chans"], meta["mean"], meta["std"]) == (28, 1, [0.459], [0.2256])


def test_data_root_without_the_dataset(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run_cli("pretrain", PRESET, *TINY, "data.name=fashion-mnist", f"data.root={empty}",
                           "model.patch_size=7", f"output_dir={tmp_path}", "name=r")
    assert_user_error(code, err, str(empty), "apt-get install dataset-fashion-mnist", "data.download=true")


def test_a_model_that_does_not_fit_the_images_leaves_no_run_folder(tmp_path, tiny):
    code, _, err = run_cli("pretrain", PRESET, *tiny, "model.patch_size=3", f"output_dir={tmp_path}", "name=r")
    assert_user_error(code, err, "patch size 3", "set data.image_size to a multiple of 3 (e.g. 6 or 9)",
                      "model.patch_size")
    assert not (tmp_path / "r").exists()


@pytest.mark.train
def test_corrupt_image_in_an_imagefolder(tmp_path):
    root = tmp_path / "images"
    for split in ("train", "val"):
        for cls in ("a", "b"):
            (root / split / cls).mkdir(parents=True)
            for i in range(12):  # 24 training images: the end-of-run kNN's k = 20 fits
                Image.new("RGB", (10, 10), (20 * i, 90, 30)).save(root / split / cls / f"{i}.png")
    bad = root / "train" / "b" / "2.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    folder = [*TINY, "data.name=imagefolder", f"data.root={root}", "data.image_size=8", "data.batch_size=8"]
    code, _, err = run_cli("pretrain", PRESET, *folder, "data.on_bad_file=error", f"output_dir={tmp_path}", "name=r")
    assert_user_error(code, err, str(bad), "corrupt", only_line=False)
    # the default, data.on_bad_file=skip: the next readable file stands in, the run ends and names the file
    code, out, err = run_cli("pretrain", PRESET, *folder, "trainer.limit_train_batches=3",  # every image once
                             f"output_dir={tmp_path}", "name=s")
    assert code == 0, err
    assert f"skipped an unreadable image: unreadable image file {bad}" in err
    assert "1 unreadable training image(s) were skipped" in out and str(bad) in out
    assert [json.loads(line)["path"] for line in (tmp_path / "s" / "bad_files.jsonl").read_text().splitlines()][0] \
        == str(bad)
    events = [e for e in map(json.loads, (tmp_path / "s" / "events.jsonl").read_text().splitlines())
              if e["kind"] == "bad_file"]  # each skipped file once, as an event of the run
    assert [(e["path"], e["value"]) for e in events] == [(str(bad), 1.0)] and "corrupt" in events[0]["reason"]
    assert "(1 skipped, at most 10 of 24: the larger of 10 and data.max_bad_fraction=0.001 of them)" in err
    assert err.count("skipped an unreadable image") == 1  # one line per skipped file, whatever reads it
    # past the cap (at least 10 files; here 13 of 24): one line naming the count and the files
    for i in range(12):
        (root / "train" / "a" / f"{i}.png").write_bytes(b"")
    code, _, err = run_cli("pretrain", PRESET, *folder, f"output_dir={tmp_path}", "name=t")
    assert_user_error(code, err, "of 24 images could not be read", "more than the 10", "data.max_bad_fraction",
                      "selfsup data check", only_line=False)  # after the skipped files' lines


@pytest.mark.train
def test_the_skipped_file_count_is_the_runs_across_a_resume(tmp_path):
    """A file found unreadable after a resume is counted with the ones the run skipped before it: its line says
    2 skipped, not 1, and its bad_file event's value is 2 (the count over the whole run, not this session's)."""
    root = tmp_path / "images"
    for split in ("train", "val"):
        for cls in ("a", "b"):
            (root / split / cls).mkdir(parents=True)
            for i in range(12):
                Image.new("RGB", (10, 10), (20 * i, 90, 30)).save(root / split / cls / f"{i}.png")
    first, second = root / "train" / "b" / "2.png", root / "train" / "a" / "5.png"
    first.write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    folder = [*TINY, "data.name=imagefolder", f"data.root={root}", "data.image_size=8", "data.batch_size=8",
              "trainer.limit_train_batches=3", "eval.knn_at_end=false"]  # every image once an epoch
    code, _, err = run_cli("pretrain", PRESET, *folder, f"output_dir={tmp_path}", "name=r")
    assert code == 0, err
    assert "(1 skipped, at most 10 of 24" in err
    second.write_bytes(b"")  # broken while the run was stopped
    code, _, err = run_cli("pretrain", "--resume", tmp_path / "r", "trainer.max_epochs=2")
    assert code == 0, err
    lines = [line for line in err.splitlines() if "skipped an unreadable image" in line]
    assert len(lines) == 1 and str(second) in lines[0] and "(2 skipped, at most 10 of 24" in lines[0], err
    events = [e for e in map(json.loads, (tmp_path / "r" / "events.jsonl").read_text().splitlines())
              if e["kind"] == "bad_file"]
    assert [(e["path"], e["value"]) for e in events] == [(str(first), 1.0), (str(second), 2.0)]


@pytest.mark.train
def test_resume_with_a_checkpoint_of_another_model(e2e, tmp_path):
    run, _ = e2e
    other = tmp_path / "other"
    (other / "checkpoints").mkdir(parents=True)
    cfg = load_run_config(PRESET, [*TINY, "method.dim=16", f"output_dir={tmp_path}", "name=other"])
    (other / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    shutil.copy(run / "checkpoints" / "last.ckpt", other / "checkpoints" / "last.ckpt")
    code, _, err = run_cli("pretrain", "--resume", str(other))
    assert_user_error(code, err, "does not fit this run's model", "another config", only_line=False)
    # a damaged checkpoint too
    (other / "checkpoints" / "last.ckpt").write_bytes(b"nonsense")
    code, _, err = run_cli("pretrain", "--resume", str(other))
    assert_user_error(code, err, "not a readable selfsup checkpoint", only_line=False)


@pytest.mark.train
def test_resume_of_a_folder_that_is_not_a_run(tmp_path, e2e):
    code, _, err = run_cli("pretrain", "--resume", str(tmp_path))
    assert_user_error(code, err, str(tmp_path), "is not a selfsup run folder")
    (tmp_path / "config.yaml").write_text((e2e[0] / "config.yaml").read_text())
    code, _, err = run_cli("pretrain", "--resume", str(tmp_path))
    assert_user_error(code, err, "has no checkpoints/last.ckpt")
    code, _, err = run_cli("pretrain", "--resume", str(e2e[0]), "optim.base_lr=5")
    assert_user_error(code, err, "optim.base_lr=5.0 contradicts")
    # the preset (here the run's own YAML) before --resume and the overrides after it: they still reach the check
    code, _, err = run_cli("pretrain", e2e[0] / "config.yaml", "--resume", str(e2e[0]), "optim.base_lr=5")
    assert_user_error(code, err, "optim.base_lr=5.0 where the run has")
    with pytest.raises(SystemExit) as exit_, contextlib.redirect_stderr(io.StringIO()) as err:
        main(["pretrain", PRESET, "--resume", str(e2e[0]), "--bogus"])
    assert exit_.value.code == 2 and "unrecognized arguments: --bogus" in err.getvalue()


@pytest.mark.train
def test_a_new_run_into_an_existing_run_folder(e2e):
    run, _ = e2e
    code, _, err = run_cli("pretrain", PRESET, *TINY, f"output_dir={run.parent}", f"name={run.name}")
    assert_user_error(code, err, "already holds a run", "--resume")


@pytest.mark.train
def test_nan_loss_from_a_huge_lr_names_the_step(tmp_path):
    """A huge lr makes the weights non-finite a step before the loss is: the stop names the step, and the kept
    checkpoint, whose step the message names, holds finite weights only."""
    code, _, err = run_cli("pretrain", PRESET, *TINY, "trainer.max_epochs=3", "optim.base_lr=1e30",
                           "trainer.checkpoint_every_n_steps=1", f"output_dir={tmp_path}", "name=r")
    line = assert_user_error(code, err, "optim.base_lr", "the last checkpoint, with finite weights, is step",
                             only_line=False)
    assert "the loss became nan at step" in line or "the weights became non-finite by step" in line
    kept = int(line.split("finite weights, is step ")[1].split(":")[0])
    state = torch.load(tmp_path / "r" / "checkpoints" / "last.ckpt", weights_only=False)
    assert state["global_step"] == kept >= 1
    assert all(torch.isfinite(v).all() for v in state["state_dict"].values() if v.is_floating_point())
    assert not (tmp_path / "r" / "backbone.safetensors").exists()


@pytest.mark.train
@pytest.mark.parametrize("log_every", [1, 100])
def test_nan_loss_keeps_the_previous_checkpoint_byte_identical(tmp_path, monkeypatch, log_every):
    """The loss turns NaN at step 3 (4th step, epoch 2): last.ckpt stays what it was after step 2. The loss
    is read back to the host at logging steps only: with log_every_n_steps=100 the bad step is caught
    when the checkpoint after it is about to be written, and still named."""
    forward, seen = moco_v3.MoCoV3.forward_views, {}
    ckpt = tmp_path / "r" / "checkpoints" / "last.ckpt"

    def nan_at_step_3(self, views):
        out = forward(self, views)
        if self.trainer.global_step == 3:
            seen["bytes"] = ckpt.read_bytes()  # the checkpoint as it stands before the bad step
            out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(moco_v3.MoCoV3, "forward_views", nan_at_step_3)
    code, _, err = run_cli("pretrain", PRESET, *TINY, "trainer.max_epochs=3", "trainer.checkpoint_every_n_steps=1",
                           f"trainer.log_every_n_steps={log_every}", f"output_dir={tmp_path}", "name=r")
    assert_user_error(code, err, "the loss became nan at step 3", "the last checkpoint, with finite weights, is step 3",
                      only_line=False)
    assert ckpt.read_bytes() == seen["bytes"]
    assert torch.load(ckpt, weights_only=False)["global_step"] == 3


# --------------------------------------------------------------------------- the real executable


def test_a_broken_eval_import_is_not_hidden(monkeypatch):
    """cli.py once caught ImportError around the eval front end, so a broken import read "invalid choice: 'eval'";
    the whole parser imports every command module, and ``main`` imports the family it runs (``presets`` and
    ``--help`` import none), so a broken one fails its own commands with the ImportError."""
    from selfsup.commands.main import build_parser, main

    assert "eval" in build_parser()._subparsers._group_actions[0].choices
    monkeypatch.setitem(sys.modules, "selfsup.commands.eval", None)  # any import of it now raises ImportError
    with pytest.raises(ImportError, match="selfsup.commands.eval"):
        build_parser()
    with pytest.raises(ImportError, match="selfsup.commands.eval"):
        main(["eval", "--help"])
    with pytest.raises(ImportError, match="selfsup.commands.eval"):
        main(["eval", "knn", "RUN"])


@pytest.mark.spawn
def test_real_executable_exit_code_and_no_traceback(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    bad_key = subprocess.run([str(SELFSUP), "pretrain", PRESET, "optim.base_rl=0.1"], capture_output=True,
                             text=True, env=env, cwd=tmp_path, timeout=120)
    assert_user_error(bad_key.returncode, bad_key.stderr, "did you mean optim.base_lr")
    assert bad_key.stdout == ""
    nan = subprocess.run([str(SELFSUP), "pretrain", PRESET, *TINY, "trainer.max_epochs=3", "optim.base_lr=1e30",
                          f"output_dir={tmp_path}", "name=r"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240)
    assert_user_error(nan.returncode, nan.stderr, "the loss became nan at step", only_line=False)


@pytest.mark.spawn
def test_ctrl_c_exits_130_with_the_resume_hint(tmp_path):
    import lightning.pytorch as pl

    class CtrlC(pl.Callback):
        def on_train_batch_start(self, trainer, *args):
            if trainer.global_step == 1:
                raise KeyboardInterrupt

    code, out, err = run_cli("pretrain", PRESET, *TINY, "trainer.checkpoint_every_n_steps=1",
                             f"output_dir={tmp_path}", "name=r", callbacks=[CtrlC()])
    assert code == 130 and "Traceback" not in err
    assert f"interrupted; continue with: selfsup pretrain --resume {tmp_path / 'r'}" in err
    assert err.strip().endswith("selfsup: interrupted") and "kNN" not in out


@pytest.mark.train
def test_pretrain_on_an_unlabelled_nested_folder_and_eval_asks_for_labels(tmp_path):
    root = tmp_path / "photos"
    for i in range(10):
        path = root / ("a/b" if i % 2 else "c") / f"{i}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (12 + i, 10), (25 * i, 90, 30)).save(path)
    (root / "c" / "broken.jpg").write_bytes(b"no image here")
    images = ["data.name=images", f"data.root={root}", "data.image_size=8", "data.batch_size=4"]
    code, out, err = run_cli("pretrain", PRESET, *TINY, *images, f"output_dir={tmp_path}", "name=r")
    assert code == 0, err
    line, = [x for x in err.splitlines() if "skipped an unreadable image" in x]  # one line for the one bad file
    assert str(root / "c" / "broken.jpg") in line and "(1 skipped, at most 10 of 11" in line
    events = [json.loads(x) for x in (tmp_path / "r" / "events.jsonl").read_text().splitlines()]
    assert [e["path"] for e in events if e["kind"] == "bad_file"] == [str(root / "c" / "broken.jpg")]
    assert "no kNN report: data.name=images has no labels" in out and (tmp_path / "r" / "backbone.safetensors").exists()
    code, _, err = run_cli("eval", "knn", str(tmp_path / "r"))
    assert_user_error(code, err, "data.name=images has no labels and evaluation needs them", "--data imagefolder")
    code, _, err = run_cli("pretrain", PRESET, *TINY, *images, "eval.knn_every_n_steps=1", f"output_dir={tmp_path}",
                           "name=r2")
    assert_user_error(code, err, "need labels", "eval.knn_every_n_steps=0")


def test_version_and_the_package_says_what_it_is(capsys):
    import selfsup
    from selfsup.commands.main import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"selfsup {selfsup.__version__}"
    assert "DINO" in selfsup.__doc__ and "MAE" in selfsup.__doc__ and "Self-Flow" in selfsup.__doc__
    assert (Path(selfsup.__file__).parent / "py.typed").exists()


def test_the_bad_file_cap_counts_every_worker(tmp_path):
    """Workers each see unreadable files (under their own cap of 10); together 11 of 24 pass it: the main process
    stops the run in one line, after logging each file once as an event."""
    from types import SimpleNamespace

    from selfsup.runs.data import BadFileEvents
    from selfsup.errors import UserError

    lines = [{"index": i, "path": f"/d/a/{i}.png", "reason": "corrupt"} for i in range(11)]
    (tmp_path / "bad_files.jsonl").write_text("".join(json.dumps(x) + "\n" for x in [lines[0], *lines[:10]]))
    events = BadFileEvents(tmp_path)
    events.cap(24, 0.001)
    trainer = SimpleNamespace(is_global_zero=True, global_step=5, loggers=[], default_root_dir=tmp_path)
    events.on_train_batch_end(trainer, None, None, None, 0)  # 10 files, one twice (two workers): 10 events, no stop
    with (tmp_path / "bad_files.jsonl").open("a") as f:
        f.write(json.dumps(lines[10]) + "\n")
    trainer.global_step = 6
    with pytest.raises(UserError, match="11 of 24 images could not be read"):
        events.on_train_batch_end(trainer, None, None, None, 1)
    logged = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [(e["step"], e["path"], e["value"]) for e in logged] == [
        *((5, f"/d/a/{i}.png", float(i + 1)) for i in range(10)), (6, "/d/a/10.png", 11.0)]
    assert events.state_dict() == {"offset": (tmp_path / "bad_files.jsonl").stat().st_size,
                                   "seen": [f"/d/a/{i}.png" for i in range(11)]}
