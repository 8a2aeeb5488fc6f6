"""Presets (base: inheritance), dotted overrides, typed validation with suggestions, to_dict ↔ resolve."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from selfsup.config import (RunConfig, load_preset, load_run_config, parse_overrides, preset_names, resolve,
                            to_dict)
from selfsup.errors import UserError
from selfsup.methods import registered_name
from ssl_helpers import raises_user_error


def test_parse_overrides_types_and_nesting():
    out = parse_overrides([
        "trainer.max_epochs=5", "optim.base_lr=0.5", "optim.min_lr=1.5e-3", "trainer.progress_bar=false",
        "data.unlabeled=true", "optim.betas=[0.9, 0.95]", "data.root=null", "name=my run", "description=",
        "augment.branch1.blur_p=0.3", "augment.branch1.solarize_p=0", "trainer.devices=[0, 1]",
    ])
    assert out == {
        "trainer": {"max_epochs": 5, "progress_bar": False, "devices": [0, 1]},
        "optim": {"base_lr": 0.5, "min_lr": 0.0015, "betas": [0.9, 0.95]},
        "data": {"unlabeled": True, "root": None},
        "name": "my run", "description": "",
        "augment": {"branch1": {"blur_p": 0.3, "solarize_p": 0}},
    }
    assert type(out["trainer"]["max_epochs"]) is int and type(out["optim"]["base_lr"]) is float
    assert parse_overrides(["a=x=y"]) == {"a": "x=y"}  # only the first '=' splits


def test_overrides_reach_the_typed_config():
    cfg = load_run_config("moco-v3-vit-digits", [
        "trainer.max_epochs=3", "optim.base_lr=1e-3", "optim.min_lr=2", "optim.betas=[0.9, 0.95]",
        "data.root=null", "data.image_size=16", "trainer.progress_bar=false", "method.temperature=0.5",
        "trainer.limit_train_batches=0.25", "trainer.limit_train_batches=4",
    ])
    assert cfg.trainer.max_epochs == 3 and cfg.optim.base_lr == 1e-3 and isinstance(cfg.optim.base_lr, float)
    assert cfg.optim.min_lr == 2.0 and isinstance(cfg.optim.min_lr, float)  # ints are accepted for floats
    assert cfg.optim.betas == (0.9, 0.95) and cfg.data.root is None and cfg.data.image_size == 16
    assert cfg.trainer.progress_bar is False and cfg.method.temperature == 0.5
    assert cfg.trainer.limit_train_batches == 4  # the last of repeated overrides wins
    assert registered_name(cfg.method) == "moco_v3"


@pytest.mark.parametrize("override, words", [
    ("optim.base_rl=0.1", ["unknown config key 'optim.base_rl'", "did you mean optim.base_lr"]),
    ("trainer.max_epoch=3", ["'trainer.max_epoch'", "trainer.max_epochs"]),
    ("method.temprature=0.1", ["'method.temprature'", "method.temperature"]),
    ("trainr.max_epochs=3", ["unknown config key 'trainr'", "did you mean trainer"]),
    ("data.zzzzzz=1", ["'data.zzzzzz'", "valid keys:", "batch_size"]),
])
def test_unknown_keys_suggest_close_ones(override, words):
    with raises_user_error(*words):
        load_run_config("moco-v3-vit-digits", [override])


@pytest.mark.parametrize("override, words", [
    ("trainer.max_epochs=abc", ["trainer.max_epochs='abc'", "expected an integer"]),
    ("trainer.max_epochs=2.5", ["trainer.max_epochs=2.5", "integer"]),
    ("trainer.max_epochs=true", ["expected an integer"]),  # a bool is not an int here
    ("optim.base_lr=fast", ["optim.base_lr='fast'", "expected a number"]),
    ("trainer.progress_bar=yes please", ["expected true or false"]),
    ("optim.betas=0.9", ["optim.betas", "list"]),
    ("optim.betas=[0.9]", ["needs 2 values"]),
    ("data.name=5", ["expected a string"]),
    ("data=3", ["data must be a mapping"]),
    ("trainer.max_epochs=0", ["trainer.max_epochs=0 must be >= 1"]),
    ("data.batch_size=0", ["data.batch_size=0 must be >= 1"]),
    ("optim.base_lr=-1", ["optim.base_lr=-1.0 must be >= 0"]),
    ("method.temperature=0", ["method.temperature=0.0 must be > 0"]),
    ("model.drop_path_rate=1.5", ["model.drop_path_rate=1.5 must be in [0, 1)"]),
    ("model.zero_init_residual=true", ["model.zero_init_residual", "torchvision ResNets", "vit_micro"]),
    ("data.name=mnist-ish", ["data.name='mnist-ish' is not known"]),
    ("method.name=mocov3", ["method.name='mocov3' is not known", "moco_v3"]),
    ("trainer.max_epochs", ["not of the form dotted.key=value"]),
])
def test_type_and_range_errors_are_one_line_user_errors(override, words):
    with raises_user_error(*words):
        load_run_config("moco-v3-vit-digits", [override])


def test_unknown_preset_suggests_close_names():
    with pytest.raises(UserError, match=r"did you mean moco-v3-vit-digits"):
        load_preset("moco-v3-vit-digit")
    with pytest.raises(UserError, match=r"selfsup presets"):
        load_preset("qqqqqqqqqqq")


def test_base_inheritance_from_a_yaml_file(tmp_path):
    parent = tmp_path / "parent.yaml"
    parent.write_text("base: moco-v3-vit-digits\nsummary: mine\noptim:\n  base_lr: 0.01\ntrainer:\n  max_epochs: 7\n")
    child = tmp_path / "child.yaml"
    child.write_text(f"base: {parent}\ntrainer:\n  max_epochs: 3\nmethod:\n  dim: 64\n")
    merged = load_preset(str(child))
    assert "base" not in merged and "summary" not in merged
    shipped = load_preset("moco-v3-vit-digits")
    # child over parent over the shipped preset, merged key by key inside sections
    assert merged["trainer"] == {**shipped["trainer"], "max_epochs": 3}
    assert merged["optim"] == {**shipped["optim"], "base_lr": 0.01}
    assert merged["method"] == {**shipped["method"], "dim": 64}
    cfg = load_run_config(str(child), ["trainer.max_epochs=4"])
    assert cfg.trainer.max_epochs == 4 and cfg.optim.base_lr == 0.01 and cfg.method.dim == 64
    assert cfg.optim.weight_decay == shipped["optim"]["weight_decay"]


def test_shipped_presets_with_a_base_inherit_it():
    with_base = []
    for name in preset_names():
        from selfsup.config import PRESET_DIR
        raw = yaml.safe_load((PRESET_DIR / f"{name}.yaml").read_text())
        if raw.get("base"):
            with_base.append(name)
            merged, parent = load_preset(name), load_preset(raw["base"])
            for section, value in raw.items():
                if section in ("base", "summary"):
                    continue
                if isinstance(value, dict):
                    for key, v in value.items():
                        assert merged[section][key] == v
                else:
                    assert merged[section] == value
            # what the child does not set comes from the base
            for section, value in parent.items():
                if isinstance(value, dict):
                    for key, v in value.items():
                        if key not in (raw.get(section) or {}):
                            assert merged[section][key] == v, (name, section, key)
    assert with_base  # the Fashion-MNIST and ImageNet presets build on others


def test_bad_yaml_and_non_mapping_files(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: [1, 2\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_preset(str(bad))
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n- 2\n")
    with pytest.raises(UserError, match="must be a mapping"):
        load_preset(str(lst))


@pytest.mark.parametrize("name", preset_names())
def test_every_preset_resolves_and_round_trips(name):
    cfg = resolve(load_preset(name))
    assert isinstance(cfg, RunConfig)
    plain = to_dict(cfg)
    # to_dict is plain YAML: dumping and reading it back gives the same config
    again = resolve(yaml.safe_load(yaml.safe_dump(plain, sort_keys=False)))
    assert again == cfg
    assert to_dict(again) == plain
    assert plain["method"]["name"] == registered_name(cfg.method) == cfg.method_name
    assert all((f.name in plain) == f.init for f in dataclasses.fields(RunConfig))  # the derived fields: not saved


def test_the_method_class_is_resolved_once_on_the_config_and_is_no_config_key():
    """RunConfig.method_cls / method_name: the registry's answer for the run, what the builder, the engine and
    evaluation ask; never written to config.yaml, and refused as a key."""
    from selfsup.methods import METHODS

    cfg = load_run_config("byol-digits")
    assert cfg.method_cls is METHODS["byol"] and cfg.method_name == "byol"
    assert "method_cls" not in to_dict(cfg) and "method_name" not in to_dict(cfg)
    assert RunConfig(method=METHODS["mae"].Config()).method_cls is METHODS["mae"]  # built by hand: the same lookup
    with raises_user_error("unknown config key 'method_cls'"):
        resolve({**load_preset("byol-digits"), "method_cls": "BYOL"})


def test_there_are_presets_for_each_method():
    from selfsup.methods import METHODS

    names = preset_names()
    assert "moco-v3-vit-digits" in names
    used = {registered_name(resolve(load_preset(n)).method) for n in names}
    assert used <= set(METHODS)


# --------------------------------------------------------------------------- a ViT preset given another backbone
DINO_RESNET = ["model.backbone=resnet18", "trainer.max_epochs=1", "trainer.limit_train_batches=1",
               "trainer.accelerator=cpu", "trainer.devices=1", "trainer.progress_bar=false", "data.batch_size=16",
               "method.out_dim=64", "method.hidden_dim=32", "method.bottleneck_dim=16", "eval.knn_at_end=false"]


@pytest.mark.train
def test_a_vit_preset_moved_to_a_resnet_trains_at_the_first_try(tmp_path):
    """``selfsup pretrain dino-digits model.backbone=resnet18``: one line lists the ViT settings put back (patch
    size, drop path), and the run trains (before: a traceback from the memory estimate's one-image BatchNorm)."""
    from ssl_helpers import run_cli

    code, out, err = run_cli("pretrain", "dino-digits", *DINO_RESNET, f"output_dir={tmp_path}", "name=r")
    assert code == 0, err
    lines = [line for line in out.splitlines() if "is not a selfsup ViT" in line]
    assert len(lines) == 1 and "model.patch_size=2 → 16" in lines[0] and "model.drop_path_rate=0.1 → 0.0" in lines[0]


def test_a_vit_preset_moved_to_a_resnet_puts_back_every_vit_key_and_the_patch_term_at_once(capsys):
    """DINOv2's distillation to a ResNet took three tries (pos_embed / init, then the iBOT term); now one line says
    all that goes back. A key the user sets with it is theirs (the backbone's refusal names it); a method that
    trains a ViT only is refused in one line naming the method."""
    cfg = load_run_config("distill-dinov2-digits", ["model.backbone=resnet18"])
    assert (cfg.model.pos_embed, cfg.model.init, cfg.method.ibot_loss_weight) == ("sincos", "moco_v3", 0)
    line, = [x for x in capsys.readouterr().out.splitlines() if "is not a selfsup ViT" in x]
    for said in ("model.pos_embed=learned → sincos", "model.init=trunc_normal → moco_v3",
                 "method.ibot_loss_weight=1 → 0 (no patch tokens"):
        assert said in line, line
    cfg = load_run_config("distill-dinov2-digits", ["model.backbone=resnet18", "method.ibot_loss_weight=0.5",
                                                    "model.init=trunc_normal"])
    assert cfg.method.ibot_loss_weight == 0.5 and cfg.model.init == "trunc_normal" and cfg.model.pos_embed == "sincos"
    assert load_run_config("dino-digits", ["model.backbone=vit_tiny"]).model.patch_size == 2  # a ViT keeps them
    with raises_user_error("model.backbone=resnet18", "method dinov2 trains a selfsup ViT", "choose a method"):
        load_run_config("dinov2-digits", ["model.backbone=resnet18"])
