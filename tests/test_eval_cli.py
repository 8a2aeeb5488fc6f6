import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml

from selfsup.commands.main import main

from idx_files import fake_fashion
from ssl_helpers import assert_user_error, run_cli


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A digits run folder built directly (random-init MoCo v3 ViT): config, exported backbone, checkpoint."""
    from selfsup.config import load_run_config, to_dict
    from selfsup.data.datasets import load_dataset
    from selfsup.methods.build import backbone_meta, build_method, data_info
    from selfsup.export import export_backbone

    run_dir = tmp_path_factory.mktemp("runs") / "r"
    (run_dir / "checkpoints").mkdir(parents=True)
    cfg = load_run_config("moco-v3-vit-digits", [f"output_dir={run_dir.parent}", "name=r"])
    info = data_info(cfg, load_dataset(cfg.data, "train"))
    model = build_method(cfg, info)
    meta = backbone_meta(cfg, info)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    export_backbone(model.backbone, run_dir / "backbone.safetensors", meta)
    export_backbone(model.backbone, run_dir / "backbone_init.safetensors", meta)
    torch.save({"state_dict": model.state_dict(), "global_step": 0}, run_dir / "checkpoints" / "last.ckpt")
    return run_dir


def cached_features(run, n):
    """(features, labels) as numpy of the run's cached features of the split with ``n`` samples."""
    for path in sorted((run / "eval" / "cache").glob("features-digits-*.pt")):
        blob = torch.load(path, weights_only=True)
        if len(blob["labels"]) == n:
            return blob["features"].double().numpy(), blob["labels"].numpy()
    raise AssertionError(f"no cached features of {n} samples")


def ok(capsys, *argv):
    assert main(["eval", *map(str, argv)]) == 0
    return capsys.readouterr().out


def bad(*argv):
    """``selfsup eval ARGV``: a one-line user error (exit 2); its line."""
    code, _, err = run_cli("eval", *argv)
    return assert_user_error(code, err)


@pytest.mark.train
def test_knn_writes_json_and_reuses_feature_cache(run, capsys):
    out = ok(capsys, "knn", run, "--k", "5,20")
    assert "top-1" in out
    res = json.loads((run / "eval" / "knn.json").read_text())
    assert set(res["results"]) == {"k=5", "k=20"} and res["train_size"] == 1438 and res["test_size"] == 359
    cache = sorted((run / "eval" / "cache").glob("features-digits-*.pt"))
    assert len(cache) == 2
    stamps = [p.stat().st_mtime_ns for p in cache]
    ok(capsys, "knn", run, "--majority", "--k", "10")
    assert [p.stat().st_mtime_ns for p in cache] == stamps  # features came from the cache
    assert json.loads((run / "eval" / "knn.json").read_text())["voting"] == "majority"


@pytest.mark.train
def test_knn_from_checkpoint_and_exported_file_agree(run, capsys, tmp_path):
    ok(capsys, "knn", run / "checkpoints" / "last.ckpt", "--k", "20", "--out", tmp_path / "a")
    ok(capsys, "knn", run / "backbone.safetensors", "--k", "20", "--out", tmp_path / "b")
    a = json.loads((tmp_path / "a" / "knn.step0.json").read_text())  # keyed by the checkpoint's step
    b = json.loads((tmp_path / "b" / "knn.json").read_text())
    assert a["results"] == b["results"]
    assert (a["weights"], b["weights"]) == ("checkpoint at step 0", "trained")


@pytest.mark.train
def test_results_are_keyed_by_the_weights_they_evaluated(run, capsys, tmp_path):
    """The random init's results never replace the trained backbone's: knn.init.json beside knn.json, each saying
    what it evaluated, and the report labels each."""
    import shutil

    from safetensors.torch import load_file

    from selfsup.export import export_backbone, read_meta
    from selfsup.models.backbones import build_backbone
    from selfsup.report import headline_rows, load_run

    folder = tmp_path / "r"
    shutil.copytree(run, folder, ignore=shutil.ignore_patterns("eval"))
    meta = read_meta(folder / "backbone.safetensors")  # a trained backbone that differs from its init
    trained = build_backbone(meta["backbone"], **meta["kwargs"])
    trained.load_state_dict({k: v + 0.5 * torch.randn_like(v) if v.is_floating_point() else v
                             for k, v in load_file(str(folder / "backbone.safetensors")).items()})
    export_backbone(trained, folder / "backbone.safetensors", {k: v for k, v in meta.items() if k != "format"})
    ok(capsys, "knn", folder, "--k", "20")
    before = (folder / "eval" / "knn.json").read_text()
    ok(capsys, "knn", folder / "backbone_init.safetensors", "--k", "20")
    ok(capsys, "rankme", folder / "backbone_init.safetensors")
    assert (folder / "eval" / "knn.json").read_text() == before  # the trained result is intact
    init = json.loads((folder / "eval" / "knn.init.json").read_text())
    assert init["weights"] == "random init" and json.loads(before)["weights"] == "trained"
    assert init["results"] != json.loads(before)["results"]
    assert json.loads((folder / "eval" / "rankme.init.json").read_text())["weights"] == "random init"
    assert not (folder / "eval" / "rankme.json").exists()
    # the heads in last.ckpt are not the init's: refused, and the loss-side default falls back to the backbone
    assert "--embedding backbone" in bad("rankme", folder / "backbone_init.safetensors", "--embedding", "projector")
    (folder / "metrics.csv").write_text("epoch,step,train/loss\n0,0,1.0\n")
    measures = {m: v for m, v, _ in headline_rows(load_run(folder))}
    assert measures["eval kNN top-1 (k=20) [trained]"] == f"{json.loads(before)['results']['k=20']['top1']:.2f}%"
    assert measures["eval kNN top-1 (k=20) [random init]"] == f"{init['results']['k=20']['top1']:.2f}%"
    assert "RankMe [random init]" in measures and "RankMe [trained]" not in measures


@pytest.mark.train
def test_linear_rankme_norms_all(run, capsys):
    out = ok(capsys, "linear", run, "--epochs", "3")
    lin = json.loads((run / "eval" / "linear.json").read_text())
    assert lin["mode"] == "features" and len(lin["grid"]) == 7 and lin["val_size"] == 144  # 10% of 1438
    assert lin["chosen"]["val_top1"] == max(p["val_top1"] for p in lin["grid"])
    assert lin["lr"] == lin["chosen"]["lr"] and lin["test"]["top1"] == lin["chosen"]["test_top1"]
    assert 10 < lin["test"]["top1"] <= 100 and "<- chosen" in out and "base lr" in out
    ok(capsys, "linear", run, "--epochs", "1", "--lr", "3", "--out", run / "one")
    one = json.loads((run / "one" / "linear.json").read_text())
    assert len(one["grid"]) == 1 and one["lr"] == pytest.approx(3.0 * 256 / 256)
    assert "--lr-grid" in bad("linear", run, "--lr-grid", "0.1,fast")
    assert "--val-fraction" in bad("linear", run, "--val-fraction", "1.5")
    ok(capsys, "rankme", run)
    rk = json.loads((run / "eval" / "rankme.json").read_text())
    assert 1 <= rk["rankme"] <= rk["dim"] and 1 <= rk["effective_rank_99"] <= rk["dim"]
    # the values, recomputed with numpy from the cached train features the evaluations share
    train_f, train_y = cached_features(run, 1438)
    s = np.linalg.svd(train_f.astype(np.float64), compute_uv=False)
    p = s / s.sum() + 1e-7
    assert rk["rankme"] == pytest.approx(float(np.exp(-(p * np.log(p)).sum())), rel=1e-6)
    centred = np.linalg.svd(train_f - train_f.mean(0), compute_uv=False) ** 2
    assert rk["effective_rank_99"] == int(np.searchsorted(np.cumsum(centred) / centred.sum(), 0.99 - 1e-12) + 1)
    ok(capsys, "norms-ood", run, "--ood", "classes:8,9", "--embedding", "backbone")
    ood = json.loads((run / "eval" / "norms-ood-classes-8-9.json").read_text())
    assert 0 <= ood["auroc"] <= 1 and (run / "eval" / "norms-ood-classes-8-9.png").stat().st_size > 1000
    # AUROC (in-distribution test scores positive) against sklearn on the cached features' norms
    from sklearn.metrics import roc_auc_score

    test_f, test_y = cached_features(run, 359)
    held = np.isin(test_y, [8, 9])
    # norms in float32 as the scores are (a final LayerNorm makes them nearly equal: ties decide the area)
    mean_norm = float(torch.from_numpy(train_f[~np.isin(train_y, [8, 9])]).float().norm(dim=1).mean())
    scores = (torch.from_numpy(test_f).float().norm(dim=1) / mean_norm).double().numpy()
    assert ood["auroc"] == pytest.approx(roc_auc_score(~held, scores), abs=1e-9)
    assert (ood["in_size"], ood["ood_size"]) == (int((~held).sum()), int(held.sum()))
    ok(capsys, "all", run)
    summary = json.loads((run / "eval" / "all.json").read_text())
    assert {"knn", "linear", "rankme", "effective_rank_99", "norms"} <= set(summary)


@pytest.mark.train
def test_linear_augmented_and_finetune(run, capsys):
    ok(capsys, "linear", run, "--mode", "augmented", "--epochs", "1", "--train-limit", "200")
    lin = json.loads((run / "eval" / "linear.json").read_text())
    assert lin["hflip_p"] == 0.0  # the run's augment.hflip_p
    assert lin["crop_min"] == 0.08  # main_lincls.py's crop, whatever the pretraining crop (0.3 here)
    ok(capsys, "finetune", run, "--epochs", "1", "--ft-batch", "64", "--train-limit", "128")
    ft = json.loads((run / "eval" / "finetune.json").read_text())
    assert ft["layer_decay"] == 0.75 and ft["steps"] == 2 and (run / "eval" / "finetuned_backbone.safetensors").exists()
    assert ft["recipe"] == "plain"  # the digits default: the plain crop + flip, not the MAE recipe


@pytest.mark.train
def test_finetune_with_the_mae_recipe(run, capsys, tmp_path):
    """Also: an --out folder that does not exist yet is made (the fine-tuned backbone is its first file)."""
    out = ok(capsys, "finetune", run, "--epochs", "1", "--ft-batch", "64", "--train-limit", "128", "--recipe", "mae",
             "--out", tmp_path / "new" / "folder")
    assert (tmp_path / "new" / "folder" / "finetuned_backbone.safetensors").exists()
    ft = json.loads((tmp_path / "new" / "folder" / "finetune.json").read_text())
    assert ft["recipe"]["rand_augment"] == "rand-m9-mstd0.5-inc1" and ft["recipe"]["mixup"] == 0.8
    assert ft["recipe"]["cutmix"] == 1.0 and ft["recipe"]["reprob"] == 0.25 and ft["recipe"]["smoothing"] == 0.1
    assert ft["steps"] == 2 and ft["min_lr"] == ft["final_lr"] == 1e-6 and "MAE recipe" in out
    assert "even" in bad("finetune", run, "--recipe", "mae", "--ft-batch", "63")
    assert "--rand-augment" in bad("finetune", run, "--recipe", "mae", "--rand-augment", "strong")
    assert "--reprob" in bad("finetune", run, "--recipe", "mae", "--reprob", "1.5")


@pytest.mark.train
def test_ood_dataset_is_resized(run, capsys, tmp_path):
    fake_fashion(tmp_path, n_test=300)  # 28x28 IDX files written here: the backbone takes 8x8
    ok(capsys, "norms-ood", run, "--ood", "fashion-mnist", "--ood-root", tmp_path, "--ood-limit", "300",
       "--embedding", "backbone")
    ood = json.loads((run / "eval" / "norms-ood-fashion-mnist.json").read_text())
    assert ood["ood_size"] == 300 and ood["in_size"] == 359


@pytest.mark.train
def test_bad_inputs(run, capsys, tmp_path):
    junk = tmp_path / "junk.txt"
    junk.write_text("x")
    assert "not a selfsup run or exported backbone" in bad("knn", junk)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "not a selfsup run folder" in bad("knn", empty)
    fake = tmp_path / "fake.safetensors"
    fake.write_bytes(b"not safetensors")
    assert "fake.safetensors" in bad("rankme", fake)
    assert "larger than the 1438 training samples" in bad("knn", run, "--k", "5000")
    assert "--temperature" in bad("knn", run, "--temperature", "warm")
    (tmp_path / "fmnist").mkdir()
    fake_fashion(tmp_path / "fmnist")
    assert "--resize" in bad("knn", run, "--data", "fashion-mnist", "--root", tmp_path / "fmnist")
    assert "classes:99" in bad("norms-ood", run, "--ood", "classes:99")
    # an RGB image folder does not fit a 1-channel backbone, even for the OOD set
    from PIL import Image

    for split in ("train", "val"):
        (tmp_path / "rgb" / split / "a").mkdir(parents=True)
        Image.new("RGB", (8, 8), (255, 0, 0)).save(tmp_path / "rgb" / split / "a" / "x.png")
    # (the folder's size, unset, comes from its first images and is said on the line before)
    for argv in (("knn", run, "--data", "imagefolder", "--root", tmp_path / "rgb", "--resize"),
                 ("norms-ood", run, "--ood", "imagefolder", "--ood-root", tmp_path / "rgb")):
        code, _, err = run_cli("eval", *argv)
        assert_user_error(code, err, "channel", only_line=False)
        lines = err.splitlines()
        assert lines[0].startswith("selfsup: data.image_size unset: using 8 px") and len(lines) == 2


@pytest.mark.spawn
def test_exit_code_and_single_line_in_a_real_process(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "selfsup", "eval", "knn", str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


@pytest.mark.train
def test_projector_embedding_for_norms_and_rankme(run, capsys, tmp_path):
    """--embedding projector scores the backbone + projector output (what the loss sees), cached apart."""
    from selfsup.runs.source import load_source, with_projector

    out = tmp_path / "p"
    ok(capsys, "rankme", run, "--embedding", "projector", "--out", out)
    res = json.loads((out / "rankme-projector.json").read_text())
    assert res["embedding"] == "projector"
    source = with_projector(load_source(run))
    x = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        projected, feature = source.backbone(x), load_source(run).backbone.eval()(x)
    assert isinstance(source.backbone[1][-1], torch.nn.BatchNorm1d)  # ends in the projector's last BN
    assert projected.shape == (4, 128) and not torch.allclose(projected, feature)
    assert source.fingerprint != load_source(run / "checkpoints" / "last.ckpt").fingerprint
    ok(capsys, "norms-ood", run, "--ood", "classes:8,9", "--embedding", "projector", "--out", out)
    assert (out / "norms-ood-classes-8-9-projector.json").exists()
    exported_only = tmp_path / "lonely.safetensors"
    exported_only.write_bytes((run / "backbone.safetensors").read_bytes())
    assert "needs the run's checkpoints/last.ckpt" in bad("rankme", exported_only, "--embedding", "projector")


@pytest.mark.train
def test_load_backbone_reads_a_run_folder_or_its_file(run, tmp_path):
    from selfsup.errors import UserError
    from selfsup.export import load_backbone

    folder, meta = load_backbone(run)
    file, _ = load_backbone(run / "backbone.safetensors")
    assert meta["method"] == "moco_v3"
    assert all(torch.equal(a, b) for a, b in zip(folder.state_dict().values(), file.state_dict().values()))
    with pytest.raises(UserError, match="holds no backbone.safetensors"):
        load_backbone(tmp_path)
    with pytest.raises(UserError, match="is not a .safetensors file"):
        load_backbone(run / "checkpoints" / "last.ckpt")
    with pytest.raises(UserError, match="does not exist"):
        load_backbone(tmp_path / "missing.safetensors")


def test_an_image_folder_run_is_evaluated_at_the_size_it_trained_at(tmp_path):
    """A run's own image folder without data.image_size (made before the size was recorded) is evaluated at the
    backbone's input size; another folder at its first images' size."""
    from types import SimpleNamespace

    from selfsup.config import DataConfig
    from selfsup.runs.session import data_config

    run_cfg = SimpleNamespace(data=DataConfig(name="imagefolder", root=str(tmp_path)))
    source = SimpleNamespace(run_cfg=run_cfg, meta={"image_size": 16, "dataset": "imagefolder"})
    assert data_config(source).image_size == 16 and run_cfg.data.image_size is None
    digits_run = SimpleNamespace(run_cfg=SimpleNamespace(data=DataConfig()), meta={"image_size": 8})
    assert data_config(digits_run, "imagefolder", str(tmp_path)).image_size is None  # another: inferred on loading


@pytest.mark.parametrize("pool,registers,class_token", [("cls", 0, True), ("avg", 2, True), ("avg", 0, False)])
def test_last_blocks_concatenates_each_normalised_block_pooled(pool, registers, class_token):
    """``forward_last_blocks``: 1 block is ``forward``; N blocks are each block's tokens, through the final norm,
    without the registers, pooled, concatenated in block order (checked against a hand-run of the blocks)."""
    from selfsup.models.vit import LastBlocks, VisionTransformer

    torch.manual_seed(0)
    vit = VisionTransformer(image_size=8, patch_size=2, in_chans=1, embed_dim=16, depth=3, num_heads=2, pool=pool,
                            registers=registers, class_token=class_token).eval()
    x = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        assert torch.allclose(vit.forward_last_blocks(x, 1), vit(x), atol=1e-6)
        tokens = vit.patch_embed(x)
        if class_token:
            tokens = torch.cat([vit.cls_token.expand(4, -1, -1), tokens], dim=1)
        tokens = tokens + vit.pos_embed
        p = 1 if class_token else 0
        if registers:
            tokens = torch.cat([tokens[:, :p], vit.register_tokens.expand(4, -1, -1), tokens[:, p:]], dim=1)
        want = []
        for block in vit.blocks:
            tokens = block(tokens)
            normed = vit.norm(tokens)
            want.append(normed[:, 0] if pool == "cls" else normed[:, p + registers:].mean(dim=1))
        got = LastBlocks(vit, 2)(x)
    assert got.shape == (4, 32) and torch.allclose(got, torch.cat(want[1:], dim=-1), atol=1e-5)


@pytest.mark.train
def test_eval_last_blocks_scores_the_concatenation_and_refuses_what_it_cannot(run, capsys, tmp_path):
    out = ok(capsys, "knn", run, "--k", "5", "--last-blocks", "2")
    assert "top-1" in out
    res = json.loads((run / "eval" / "knn-last2blocks.json").read_text())
    assert res["embedding"] == "last2blocks"
    feats = [torch.load(p, weights_only=True)["features"] for p in (run / "eval" / "cache").glob("*.pt")]
    assert {f.shape[1] for f in feats} >= {256}  # two blocks of the micro ViT's 128
    assert "--last-blocks=9 is outside the ViT's blocks 1..4" in bad("knn", run, "--last-blocks", "9")
    assert "give one of the two" in bad("rankme", run, "--last-blocks", "2", "--embedding", "projector")
