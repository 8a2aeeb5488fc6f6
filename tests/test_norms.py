"""The embedding-norm wing: the BatchNorm ConvNet, the embedding-norm code's heads, cut-init on them, held-out and
long-tailed data, GradScale's own schedule, eval-mode norms in the rank instrument, and norms-ood's defaults."""

import json

import pytest
import torch
import yaml
from torch import nn

from selfsup.config import load_run_config
from selfsup.errors import UserError
from ssl_helpers import assert_user_error, run_cli, tiny_method

CNN = {"model": {"backbone": "bn_cnn_tiny", "stop_grad_conv1": False}}
SIMCLR_NORM_HEAD = {"proj_bn": False, "proj_bias": True}


def test_bn_cnn_is_registered_exported_and_rebuilt(tmp_path):
    from selfsup.export import export_backbone, load_exported
    from selfsup.models.backbones import BACKBONE_NAMES, build_backbone

    assert {"bn_cnn_micro", "bn_cnn_tiny"} <= set(BACKBONE_NAMES)
    model = build_backbone("bn_cnn_micro", in_chans=1, image_size=28)
    kinds = [type(m) for m in model.features]
    assert kinds == [nn.Conv2d, nn.BatchNorm2d, nn.ReLU] * 4 and model.num_features == 128
    with torch.no_grad():
        for m in model.modules():  # trained-like BN statistics and affine, so the round trip checks all of them
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-1, 1), m.running_var.uniform_(0.5, 2), m.weight.uniform_(0.5, 2)
    export_backbone(model, tmp_path / "b.safetensors", {"backbone": "bn_cnn_micro",
                                                         "kwargs": dict(in_chans=1, image_size=28)})
    rebuilt, meta = load_exported(tmp_path / "b.safetensors")
    assert meta["architecture"]["family"] == "selfsup" and meta["architecture"]["num_features"] == 128
    x = torch.randn(3, 1, 28, 28)
    torch.testing.assert_close(rebuilt.eval()(x), model.eval()(x), rtol=0, atol=0)
    with pytest.raises(UserError, match="model.pos_embed / model.init / model.final_norm apply to the selfsup ViTs"):
        tiny_method("simclr", model={"backbone": "bn_cnn_tiny", "pos_embed": "learned"})


def test_cut_init_of_a_bn_network_is_an_exact_rescale_without_warning(recwarn):
    """Every conv/Linear of the backbone and the no-BN head followed by BN or nothing: dividing every parameter by
    c divides each BN output by c, so the backbone feature (train mode, batch statistics) is f / c and the
    direction is unchanged; no LayerNorm / attention, so no warning."""
    x = torch.randn(16, 1, 8, 8)
    base = tiny_method("simclr", model=CNN["model"]).train()
    cut = tiny_method("simclr", model=CNN["model"], interventions={"cut_init": 3.0}).train()
    assert not [w for w in recwarn if "changes the network" in str(w.message)]
    with torch.no_grad():
        f, f_cut = base.backbone(x), cut.backbone(x)
    assert torch.nn.functional.cosine_similarity(f, f_cut).min() > 0.99999  # the same direction for every image
    # ‖f_cut‖ / ‖f‖ = 1/3 up to BN's ε (pre-BN variances of ~0.004 / 9 next to ε = 1e-5)
    torch.testing.assert_close(f_cut.norm(dim=1) / f.norm(dim=1), torch.full((16,), 1 / 3), rtol=2e-3, atol=0)
    vit = tiny_method("simclr")
    with pytest.warns(UserWarning, match=r"cut-init \(interventions.cut_init=3\) on a model with LayerNorm, attention"):
        from selfsup.interventions import cut_init
        cut_init(vit, 3.0)


def test_simclr_norm_head_and_projector_last_scales_its_output():
    """The embedding-norm code's SimCLR head: Linear(bias) -> ReLU -> Linear(bias), no BN; projector_last divides
    the last Linear's weight and bias, so z becomes exactly z / c."""
    base = tiny_method("simclr", SIMCLR_NORM_HEAD, model=CNN["model"])
    kinds = [type(m) for m in base.projector]
    assert kinds == [nn.Linear, nn.ReLU, nn.Linear] and all(m.bias is not None for m in base.projector[::2])
    cut = tiny_method("simclr", SIMCLR_NORM_HEAD, model=CNN["model"],
                      interventions={"cut_init": 4.0, "cut_init_scope": "projector_last"})
    changed = {n for (n, p0), (_, p1) in zip(base.named_parameters(), cut.named_parameters())
               if not torch.equal(p0, p1)}
    assert changed == {"projector.2.weight", "projector.2.bias"}
    h = torch.randn(5, base.backbone.num_features)
    with torch.no_grad():
        torch.testing.assert_close(cut.projector(h), base.projector(h) / 4, rtol=1e-6, atol=1e-7)


def test_simsiam_affine_last_bn_and_projector_last_scales_its_gamma_and_beta():
    base = tiny_method("simsiam", {"proj_last_affine": True}, model=CNN["model"])
    last = base.projector[-1]
    assert isinstance(last, nn.BatchNorm1d) and last.affine and last.weight.requires_grad
    assert not tiny_method("simsiam", model=CNN["model"]).projector[-1].affine  # the official SimSiam default
    with torch.no_grad():
        last.bias.fill_(0.5)
    cut = tiny_method("simsiam", {"proj_last_affine": True}, model=CNN["model"],
                      interventions={"cut_init": 2.0, "cut_init_scope": "projector_last"})
    with torch.no_grad():
        cut.projector[-1].bias.fill_(0.25)  # the same β as base's, halved (base's was set after its build)
    n = len(base.projector) - 1
    changed = {k for (k, p0), (_, p1) in zip(base.named_parameters(), cut.named_parameters())
               if not torch.equal(p0, p1)}
    assert changed == {f"projector.{n}.weight", f"projector.{n}.bias"}
    z = torch.randn(8, base.projector[0].in_features)
    with torch.no_grad():
        torch.testing.assert_close(cut.projector.train()(z), base.projector.train()(z) / 2, rtol=1e-5, atol=1e-6)


def test_exclude_classes_and_long_tail(tmp_path):
    from selfsup.config import DataConfig
    from selfsup.data.datasets import load_dataset, long_tail_counts

    assert long_tail_counts([100, 100, 100], 4.0) == [100, 50, 25]  # 4^-0, 4^-1/2, 4^-1
    assert long_tail_counts([150, 140], 10.0) == [150, 14] and long_tail_counts([7], 5.0) == [7]
    full_train, full_test = load_dataset(DataConfig(), "train"), load_dataset(DataConfig(), "test")
    held = DataConfig(exclude_classes=[8, 9])
    train, test = load_dataset(held, "train"), load_dataset(held, "test")
    for full, part in ((full_train, train), (full_test, test)):
        assert not torch.isin(part.labels, torch.tensor([8, 9])).any()
        assert len(part) == int((full.labels < 8).sum())
    lt = DataConfig(exclude_classes=[0], imbalance=10.0)
    a, b = load_dataset(lt, "train"), load_dataset(lt, "train")
    counts = torch.bincount(a.labels, minlength=10).tolist()
    expected = long_tail_counts(torch.bincount(full_train.labels, minlength=10).tolist()[1:], 10.0)
    assert counts == [0] + expected and counts[1] / counts[9] == pytest.approx(10, rel=0.1)
    assert torch.equal(a.images, b.images)  # fixed by imbalance_seed
    other = load_dataset(DataConfig(exclude_classes=[0], imbalance=10.0, imbalance_seed=1), "train")
    assert torch.bincount(other.labels, minlength=10).tolist() == counts and not torch.equal(other.images, a.images)
    assert len(load_dataset(lt, "test")) == int((full_test.labels != 0).sum())  # the test split stays balanced
    with pytest.raises(UserError, match=r"data.exclude_classes=\[10\] must name some but not all of the classes 0..9"):
        load_dataset(DataConfig(exclude_classes=[10]), "train")
    with pytest.raises(UserError, match=r"data.exclude_classes=\[8, 8\] must list distinct class indices"):
        load_run_config("simclr-cnn-digits", ["data.exclude_classes=[8,8]"])
    with pytest.raises(UserError, match="data.imbalance=0.5 must be >= 1"):
        load_run_config("simclr-cnn-digits", ["data.imbalance=0.5"])


def test_grad_scale_runs_at_its_own_lr_and_warmup():
    plain = load_run_config("simclr-cnn-digits")
    scaled = load_run_config("simclr-cnn-digits", ["interventions.grad_scale_p=1"])
    assert (plain.optim.name, plain.optim.base_lr, plain.optim.warmup_epochs) == ("sgd", 0.36, 2)
    assert (scaled.optim.base_lr, scaled.optim.warmup_epochs) == (0.01, 10)
    own = load_run_config("simclr-cnn-digits", ["interventions.grad_scale_p=1", "interventions.grad_scale_lr=null"])
    assert own.optim.base_lr == 0.36
    with pytest.raises(UserError, match="interventions.grad_scale_lr=-1.0 must be >= 0"):
        load_run_config("simclr-cnn-digits", ["interventions.grad_scale_lr=-1"])


def test_rank_instrument_logs_eval_mode_norms_of_every_head():
    """RankCollapse's norms: the mean ‖·‖ of backbone, projector and predictor outputs of the fixed batch in eval
    mode (recomputed here by hand), the heads' train mode restored."""
    from types import SimpleNamespace

    from selfsup.data.datasets import ImageDataset
    from selfsup.instruments import RankCollapse

    m = tiny_method("simsiam", {"proj_last_affine": True}, model=CNN["model"]).train()
    images = torch.randint(0, 256, (12, 1, 8, 8), dtype=torch.uint8)
    cb = RankCollapse(every_n_steps=1, samples=12, dataset=ImageDataset("x", images, torch.zeros(12), 1, (0.5,),
                                                                          (0.25,)))
    cb.setup(SimpleNamespace(), m, "fit")
    out = cb.measure(m)
    assert m.projector.training and m.predictor.training and m.backbone.training
    m.eval()
    with torch.no_grad():
        h = m.backbone((images.float() / 255 - 0.5) / 0.25)
        z = m.projector(h)
        p = m.predictor(z)
    for key, x in (("embedding", h), ("projection", z), ("prediction", p)):
        assert out[f"eval_norm_{key}_mean"] == pytest.approx(float(x.norm(dim=1).mean()), rel=1e-4)
        assert 1 <= out[f"eff_rank_{key}"] <= x.shape[1]


# ----------------------------------------------------------------------------- norms-ood
def make_run(root, preset, overrides):
    """A random-init run folder (config, exported backbone, checkpoint) as a pretrain run leaves it."""
    from selfsup.config import to_dict
    from selfsup.data.datasets import load_dataset
    from selfsup.export import export_backbone
    from selfsup.methods.build import backbone_meta, build_method, data_info

    run_dir = root / preset
    (run_dir / "checkpoints").mkdir(parents=True)
    cfg = load_run_config(preset, [f"output_dir={root}", f"name={preset}", *overrides])
    info = data_info(cfg, load_dataset(cfg.data, "train"))
    model = build_method(cfg, info)
    meta = backbone_meta(cfg, info)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    export_backbone(model.backbone, run_dir / "backbone.safetensors", meta)
    torch.save({"state_dict": model.state_dict(), "global_step": 0}, run_dir / "checkpoints" / "last.ckpt")
    return run_dir, model, info


def test_norms_ood_defaults_to_held_out_classes_on_the_loss_side_embedding(tmp_path):
    from sklearn.metrics import roc_auc_score

    from selfsup.config import DataConfig
    from selfsup.data.datasets import load_dataset
    from selfsup.eval.features import extract_features

    run, model, info = make_run(tmp_path, "simclr-cnn-digits", ["data.exclude_classes=[8,9]"])
    code, out, err = run_cli("eval", "norms-ood", run)
    assert code == 0, err
    res = json.loads((run / "eval" / "norms-ood-classes-8-9-projector.json").read_text())
    assert res["embedding"] == "projector" and res["held_out"] is True and res["ood"] == "classes:8,9"
    # independently: backbone + projector in eval mode on the un-augmented images
    chain = nn.Sequential(model.backbone, model.projector)
    ftr, _ = extract_features(chain, load_dataset(DataConfig(exclude_classes=[8, 9]), "train"), 8, info.mean,
                              info.std, device="cpu")
    fte, yte = extract_features(chain, load_dataset(DataConfig(), "test"), 8, info.mean, info.std, device="cpu")
    held = torch.isin(yte, torch.tensor([8, 9]))
    scores = fte.norm(dim=1) / ftr.norm(dim=1).mean()
    assert res["auroc"] == pytest.approx(roc_auc_score((~held).numpy(), scores.double().numpy()), abs=1e-6)
    assert (res["in_size"], res["ood_size"]) == (int((~held).sum()), int(held.sum()))
    assert res["train_mean_norm"] == pytest.approx(float(ftr.norm(dim=1).mean()), rel=1e-5)
    # classes the run pretrained on: scored with a warning, not held out
    code, out, err = run_cli("eval", "norms-ood", run, "--ood", "classes:1", "--embedding", "backbone")
    assert code == 0 and "not OOD in the paper's sense" in err
    assert json.loads((run / "eval" / "norms-ood-classes-1.json").read_text())["held_out"] is False


def test_norms_ood_without_held_out_classes_names_the_fix(tmp_path):
    run, _, _ = make_run(tmp_path, "simsiam-cnn-digits", [])
    code, _, err = run_cli("eval", "norms-ood", run)
    assert_user_error(code, err, "--ood DATASET", "data.exclude_classes")
    code, out, err = run_cli("eval", "norms-ood", run, "--ood", "classes:8,9")
    assert code == 0 and "not OOD" in err
    res = json.loads((run / "eval" / "norms-ood-classes-8-9-predictor.json").read_text())
    assert res["embedding"] == "predictor"  # SimSiam's loss normalises the predictions
    lonely = tmp_path / "lonely.safetensors"
    lonely.write_bytes((run / "backbone.safetensors").read_bytes())
    code, out, err = run_cli("eval", "norms-ood", lonely, "--ood", "classes:8,9")
    assert code == 0 and "no loss-side embedding" in err  # no heads: the backbone, said so
