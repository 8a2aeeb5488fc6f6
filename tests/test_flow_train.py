"""The flow methods' training side: Self-Flow's teacher and gradients, REPA's encoder, data, bad input, the CLI."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from selfsup.config import load_run_config
from selfsup.data.datasets import load_dataset
from selfsup.errors import UserError
from selfsup.export import export_backbone
from selfsup.flow.objective import noise_level_buckets
from selfsup.flow.path import interpolate
from selfsup.methods.build import build_method, data_info
from selfsup.models.backbones import build_backbone
from ssl_helpers import StopAfterEpoch, assert_user_error, ckpt, run_cli, tiny_run

MICRO = tiny_run(batch_size=32, heads=False)  # tests set their own epochs and batches


def make(preset="self-flow-digits", *overrides):
    cfg = load_run_config(preset, [*MICRO, *overrides])
    train = load_dataset(cfg.data, "train")
    return build_method(cfg, data_info(cfg, train)), train


def batch(model, train, n=8):
    return model.on_after_batch_transfer(train[torch.arange(n)], 0)


def vit_encoder(tmp_path, in_chans=1, name="vit_micro"):
    kwargs = (dict(in_chans=in_chans, image_size=8, patch_size=4) if name.startswith("vit")
              else dict(in_chans=in_chans, image_size=8))
    torch.manual_seed(0)
    backbone = build_backbone(name, **kwargs)
    meta = {"backbone": name, "kwargs": kwargs, "image_size": 8, "in_chans": in_chans, "mean": [0.3] * in_chans,
            "std": [0.3] * in_chans, "dataset": "digits", "method": "moco_v3"}
    return export_backbone(backbone, tmp_path / f"{name}-{in_chans}.safetensors", meta)


def test_data_in_model_space():
    model, train = make()
    x, y = batch(model, train)
    assert x.dtype == torch.float32 and x.shape == (8, 1, 8, 8)
    assert torch.allclose(x, train.images[:8].float() / 127.5 - 1)
    assert model.info.mean == (0.5,) and model.info.num_classes == 10
    # data.image_size resizes (or pads) to a patch-divisible size
    padded, _ = make("self-flow-digits", "data.image_size=12", "method.fit=pad")
    x12, _ = batch(padded, train)
    assert x12.shape == (8, 1, 12, 12) and torch.equal(x12[:, :, 2:10, 2:10], x)
    assert (x12[:, :, :2] == -1).all()


def test_teacher_sees_min_t_s_and_the_same_noise():
    model, train = make()
    x0, y = batch(model, train)
    seen = {}
    student, teacher_tokens = model.student.forward, model.ema.block_tokens

    def student_spy(x, t, y, **kw):
        seen["student"] = (x, t.gather(1, kw["token_index"]))  # (t, s) per sample -> each token's level
        seen["y"] = [y]
        return student(x, t, y, **kw)

    def teacher_spy(x, t, y, block):
        seen["teacher"] = (x, t, block)
        seen["y"].append(y)
        return teacher_tokens(x, t, y, block)

    model.student.forward = student_spy
    model.ema.block_tokens = teacher_spy
    y = model.class_labels(torch.cat([y[:4], torch.full((4,), -1)]))  # unlabelled samples get the null class
    assert torch.equal(y[4:], torch.full((4,), 10))
    out = model.forward_flow(x0, y)
    assert seen["y"][0] is seen["y"][1] is y  # condition dropout shared by student and teacher
    xs, levels = seen["student"]
    xt, tt, block = seen["teacher"]
    assert block == model.k == 3 and model.l == 1  # round(0.7 * 4), round(0.3 * 4)
    # two levels per sample, exactly round(0.25 * 16) = 4 tokens at the second one
    for row in levels:
        values, counts = row.unique(return_counts=True)
        assert len(values) == 2 and sorted(counts.tolist()) == [4, 12]
    assert torch.allclose(tt, levels.min(dim=1).values)  # min(t, s) for every sample, the whole image
    # the same noise: recover it from the student's input and rebuild the teacher's
    lv = model.student.unpatchify(levels[:, :, None].expand(-1, -1, 4))
    noise = (xs - (1 - lv) * x0) / lv
    assert torch.allclose(xt, interpolate(x0, noise, tt), atol=1e-4)
    assert out.prediction.shape == out.target.shape == (8 * 16, 64)


def test_init_alignment_starts_near_one_and_features_differ_only_by_input():
    model, train = make()
    x0, y = batch(model, train, 32)
    out = model.forward_flow(x0, y)
    assert 0.8 < out.scalars["rep_loss"].item() < 1.2  # the thread: 1 - cos starts near 1
    t = torch.rand(32)
    xt = interpolate(x0, torch.randn_like(x0), t)
    # every block is the identity at step 0: raw student and teacher tokens are the same function of the input
    assert torch.allclose(model.student.block_tokens(xt, t, y, model.l), model.ema.block_tokens(xt, t, y, model.k),
                          atol=1e-6)


def test_no_gradient_reaches_teacher_or_repa_encoder(tmp_path):
    model, train = make()
    x0, y = batch(model, train)
    model.forward_flow(x0, y).loss.backward()
    assert all(p.grad is None and not p.requires_grad for p in model.ema.parameters())
    assert all(p.grad is not None for p in model.head.parameters())
    assert model.student.x_embedder.weight.grad.abs().sum() > 0  # through the alignment loss
    repa, _ = make("repa-digits", f"method.encoder={vit_encoder(tmp_path)}")
    out = repa.forward_flow(x0, y)
    out.loss.backward()
    assert out.target.shape == (8 * 16, 128)  # vit_micro: width 128
    # REPA's loss is mean(−cos(mlp(student tokens), encoder tokens)) over every token
    expected = -F.cosine_similarity(out.prediction, out.target, dim=-1).mean()
    torch.testing.assert_close(out.scalars["rep_loss"].detach(), expected, rtol=1e-5, atol=1e-6)
    encoder = repa.encoder.network.encoder
    assert all(p.grad is None and not p.requires_grad for p in encoder.parameters())
    assert all(p.grad is not None for p in repa.projector.parameters())
    assert "encoder" not in " ".join(repa.state_dict())  # frozen and never checkpointed


def test_repa_tokens_resized_to_the_student_grid(tmp_path):
    repa, train = make("repa-digits", f"method.encoder={vit_encoder(tmp_path)}")  # encoder grid 2x2, student 4x4
    x0, _ = batch(repa, train)
    tokens = repa.encoder(x0)
    assert tokens.shape == (8, 16, 128)
    corner = repa.encoder.network.encoder.forward_features((((x0 + 1) / 2 - 0.3) / 0.3))[:, 1:]
    assert not torch.allclose(tokens[:, 0], tokens[:, 15])
    assert torch.allclose(tokens.mean(1), corner.mean(1), atol=0.3)


def test_plain_flow_matching_step_and_buckets():
    model, train = make("flow-matching-digits")
    x0, y = batch(model, train)
    seen, flow_output = {}, model.flow_output

    def spy(per_token, levels, h):
        seen.update(per_token=per_token, levels=levels)
        return flow_output(per_token, levels, h)

    model.flow_output = spy
    out = model.forward_flow(x0, y)
    assert out.embedding is not None and out.prediction is None and out.target is None
    assert seen["per_token"].shape == (8, 16) and seen["levels"].shape == (8,)
    # the logged scalars: the flow loss (plain flow matching's loss), its mean per noise-level bucket, the EMA decay
    means, _ = noise_level_buckets(seen["per_token"], seen["levels"], 4)
    buckets = [f"flow_loss_t{i / 4:.2f}-{(i + 1) / 4:.2f}" for i in range(4)]
    assert list(out.scalars) == ["flow_loss", *buckets, "ema_decay"] and out.scalars["ema_decay"] == model.ema_decay
    assert torch.equal(out.scalars["flow_loss"], out.loss.detach())
    torch.testing.assert_close(torch.stack([out.scalars[k] for k in buckets]), means, equal_nan=True, rtol=0, atol=0)
    # at init the model outputs 0, so the loss is E||eps - x0||^2
    assert 1.0 < out.loss.item() < 3.0


def test_ema_update_and_warmup():
    model, train = make("self-flow-digits", "method.ema_warmup_steps=10", "method.ema_decay=0.9")
    with torch.no_grad():
        for p in model.student.parameters():
            p.add_(1.0)
    before = [p.clone() for p in model.ema.parameters()]
    model.update_ema(5)
    assert model.ema_decay == pytest.approx(0.45)  # 0.9 * 5 / 10
    for b, e, s in zip(before, model.ema.parameters(), model.student.parameters()):
        assert torch.allclose(e, 0.45 * b + 0.55 * s, atol=1e-6)


def test_latent_dataset(tmp_path):
    torch.manual_seed(0)
    latents = torch.randn(40, 4, 8, 8)
    torch.save({"latents": latents}, tmp_path / "nolabels.pt")
    with pytest.raises(UserError, match="no labels"):
        make("self-flow-digits", "data.name=latents", f"data.root={tmp_path / 'nolabels.pt'}")
    model, train = make("self-flow-digits", "data.name=latents", f"data.root={tmp_path / 'nolabels.pt'}",
                        "method.class_conditional=false")
    assert model.student.num_classes == 0 and model.student.in_channels == 4
    (tmp_path / "lat").mkdir()
    torch.save({"latents": latents, "labels": torch.arange(40) % 5}, tmp_path / "lat" / "train.pt")
    torch.save({"latents": latents[:10], "labels": torch.arange(10) % 5}, tmp_path / "lat" / "test.pt")
    model, train = make("self-flow-digits", "data.name=latents", f"data.root={tmp_path / 'lat'}")
    x0, y = batch(model, train)
    assert torch.equal(x0, latents[:8]) and model.student.num_classes == 5
    assert torch.isfinite(model.forward_flow(x0, model.class_labels(y)).loss)


@pytest.mark.parametrize("override,words", [
    ("method.mask_ratio=1.5", ("mask_ratio", "[0, 1]")),
    ("method.student_block=9", ("student_block", "1..4")),
    ("method.teacher_block=0", ("teacher_block", "1..4")),
    ("data.image_size=9", ("divide", "patch size 2")),
    ("method.size=huge", ("method.size",)),
])
def test_bad_config_is_one_line(tmp_path, override, words):
    code, out, err = run_cli("pretrain", "self-flow-digits", override, f"output_dir={tmp_path}", "name=bad")
    assert_user_error(code, err, *words)
    assert not (tmp_path / "bad").exists()


def test_bad_repa_encoder(tmp_path):
    for encoder, words in ((tmp_path / "missing", ("does not exist",)),
                           (vit_encoder(tmp_path, in_chans=3), ("3-channel",)),
                           (vit_encoder(tmp_path, name="resnet18"), ("no patch tokens",))):
        code, out, err = run_cli("pretrain", "repa-digits", f"method.encoder={encoder}", f"output_dir={tmp_path}",
                                 "name=bad")
        assert_user_error(code, err, "method.encoder", *words)
        assert not (tmp_path / "bad").exists()


@pytest.mark.train
def test_cli_end_to_end_then_eval_features(tmp_path):
    run = tmp_path / "sf"
    code, out, err = run_cli("pretrain", "self-flow-digits", *MICRO, "trainer.max_epochs=1",
                             "trainer.limit_train_batches=3", "trainer.log_every_n_steps=1",
                             f"output_dir={tmp_path}", "name=sf")
    assert code == 0, err
    assert "kNN of the EMA model's block-3 tokens at t=0.1" in out
    assert "20 EMA samples" in out and (run / "samples_end.png").exists()
    header = (run / "metrics.csv").read_text().splitlines()[0]
    for key in ("train/flow_loss", "train/rep_loss", "train/ema_decay", "train/flow_loss_t0.75-1.00"):
        assert key in header
    from selfsup.runs.source import load_flow_run

    model, cfg, info = load_flow_run(run)
    assert info["num_classes"] == 10 and info["image_size"] == 8
    assert not any(p.requires_grad for p in model.parameters())
    code, out, err = run_cli("eval", "knn", str(run), "--k", "5")
    assert code == 0, err
    result = json.loads((run / "eval" / "knn.json").read_text())
    assert result["backbone"] == "flow_encoder"
    code, out, err = run_cli("eval", "knn", str(run), "--k", "5", "--flow-t", "0.5", "--flow-block", "2")
    assert code == 0, err
    assert json.loads((run / "eval" / "knn-flow-t0.5-block2.json").read_text())["embedding"] == "flow-t0.5-block2"
    code, out, err = run_cli("eval", "knn", str(run), "--flow-block", "7")
    assert_user_error(code, err, "--flow-block=7", "1..4")
    code, out, err = run_cli("eval", "finetune", str(run))
    assert_user_error(code, err, "finetune", "flow_encoder", "knn, linear")
    # without the exported file, the EMA weights come from the checkpoint (same features)
    exported = load_flow_run(run)[0].state_dict()
    (run / "backbone.safetensors").unlink()
    from_ckpt = load_flow_run(run)[0].state_dict()
    assert all(torch.equal(exported[k], from_ckpt[k]) for k in exported)
    code, out, err = run_cli("eval", "knn", str(run), "--k", "5", "--no-cache", "--out", str(tmp_path / "ev"))
    assert code == 0, err
    from_ckpt_result, = (tmp_path / "ev").glob("knn.step*.json")  # keyed by the checkpoint's step
    assert json.loads(from_ckpt_result.read_text())["results"] == result["results"]
    (tmp_path / "moco").mkdir()
    (tmp_path / "moco" / "config.yaml").write_text("method:\n  name: moco_v3\n")
    with pytest.raises(UserError, match="not a flow run"):
        load_flow_run(tmp_path / "moco")


def test_paper_scale_preset():
    cfg = load_run_config("self-flow-sit-xl2-latents")
    m = cfg.method
    assert (m.size, m.patch_size, m.student_block, m.teacher_block, m.mask_ratio, m.rep_weight) == (
        "XL", 2, 8, 20, 0.25, 0.8)
    assert m.ema_decay == 0.9999 and m.ema_warmup_steps == 0 and cfg.data.name == "latents"
    assert cfg.optim.name == "adamw" and cfg.trainer.gradient_clip_val == 1.0 and cfg.trainer.precision == "bf16-mixed"
    # defaults l, k for depth 28 are the same blocks
    from selfsup.methods.flow import default_block

    assert (default_block(28, 0.3), default_block(28, 0.7)) == (8, 20)


@pytest.mark.train
def test_resume_equals_uninterrupted_run(tmp_path):
    import selfsup.engine as engine
    args = [*MICRO, "trainer.max_epochs=2", "trainer.limit_train_batches=2", "optim.warmup_epochs=1",
            "method.ema_warmup_steps=3", f"output_dir={tmp_path}"]
    straight = engine.pretrain(load_run_config("self-flow-digits", [*args, "name=A"]))
    run_b = engine.pretrain(load_run_config("self-flow-digits", [*args, "name=B"]), callbacks=[StopAfterEpoch()])
    assert ckpt(run_b)["global_step"] == 2
    engine.pretrain(engine.load_run(run_b), resume=run_b)
    sa, sb = ckpt(straight)["state_dict"], ckpt(run_b)["state_dict"]
    assert ckpt(run_b)["global_step"] == 4 and sa.keys() == sb.keys() and any(k.startswith("ema.") for k in sa)
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], atol=1e-6, rtol=0, msg=lambda msg: f"{k}: {msg}")


@pytest.mark.train
def test_cli_repa_trains_with_an_exported_encoder(tmp_path):
    code, out, err = run_cli("pretrain", "repa-digits", *MICRO, f"method.encoder={vit_encoder(tmp_path)}",
                             "trainer.max_epochs=1", "trainer.limit_train_batches=2",
                             "trainer.log_every_n_steps=1", f"output_dir={tmp_path}", "name=run")
    assert code == 0, err
    header = (tmp_path / "run" / "metrics.csv").read_text().splitlines()[0]
    assert "train/flow_loss" in header and "train/rep_loss" in header
    assert (tmp_path / "run" / "backbone.safetensors").exists()


def test_label_dropout_and_unconditional():
    model, _ = make("self-flow-digits", "method.label_dropout=0.3")
    y = model.class_labels(torch.arange(20000) % 10)
    assert abs((y == 10).float().mean().item() - 0.3) < 0.02
    kept = y != 10
    assert torch.equal(y[kept], (torch.arange(20000) % 10)[kept])
    uncond, _ = make("self-flow-digits", "method.class_conditional=false")
    assert uncond.student.num_classes == 0 and (uncond.class_labels(torch.arange(10)) == 0).all()


@pytest.mark.train
def test_a_latents_run_is_evaluated_like_any_backbone(tmp_path):
    """Precomputed latents (float, 4 channels) train a flow model and its features go through eval knn / rankme."""
    g = torch.Generator().manual_seed(0)
    (tmp_path / "lat").mkdir()
    for split, n in (("train", 64), ("test", 16)):
        y = torch.arange(n) % 4
        z = torch.randn(n, 4, 8, 8, generator=g) + 3 * y[:, None, None, None].float()
        torch.save({"latents": z, "labels": y}, tmp_path / "lat" / f"{split}.pt")
    code, out, err = run_cli("pretrain", "flow-matching-digits", *MICRO, "data.name=latents",
                             f"data.root={tmp_path / 'lat'}", "trainer.max_epochs=1",
                             f"output_dir={tmp_path}", "name=lat")
    assert code == 0, err
    code, out, err = run_cli("eval", "knn", str(tmp_path / "lat"), "--k", "5")
    assert code == 0, err
    assert json.loads((tmp_path / "lat" / "eval" / "knn.json").read_text())["backbone"] == "flow_encoder"
    code, out, err = run_cli("eval", "rankme", str(tmp_path / "lat"))
    assert code == 0, err


# --------------------------------------------------------------------------- the representation weight's ramp


def at_step(model, step):
    """The module as the engine sees it at optimiser step ``step``: its schedule's extras set (the ramp's weight)."""
    from types import SimpleNamespace

    model._trainer = SimpleNamespace(global_step=step)
    for name, value in model.schedule(step, 0).extras.items():
        setattr(model, name, value)
    return model


def test_linear_ramp_by_hand():
    from selfsup.schedules import linear_ramp

    assert [linear_ramp(s, 0.8, 300) for s in (0, 75, 150, 300, 301, 10_000)] == [0.0, 0.2, 0.4, 0.8, 0.8, 0.8]
    assert linear_ramp(0, 0.8, 0) == 0.8  # no ramp: the official full weight from step 0


def test_rep_warmup_ramps_the_weight_of_self_flow_and_repa(tmp_path):
    for preset, extra, full in (("self-flow-digits", [], 0.8),
                                ("repa-digits", [f"method.encoder={vit_encoder(tmp_path)}"], 0.5)):
        model, train = make(preset, *extra, "method.rep_warmup_steps=300")
        x0, y = batch(model, train)
        assert [at_step(model, s).rep_weight for s in (0, 150, 300, 900)] == [0.0, full / 2, full, full]
        model.rng("cpu").manual_seed(3)
        out = at_step(model, 150).forward_flow(x0, y)
        # loss = flow + (w / 2) · rep at half the ramp, exactly
        assert model.rep_weight == full / 2
        assert torch.equal(out.loss, out.scalars["flow_loss"] + full / 2 * out.scalars["rep_loss"])
        official, _ = make(preset, *extra, "method.rep_warmup_steps=0")
        assert at_step(official, 0).rep_weight == full  # rep_warmup_steps 0: the full weight at step 0


def test_zero_weight_skips_the_teacher_and_keeps_the_loss(tmp_path):
    """rep_weight 0 (or step 0 of a ramp): no teacher / encoder forward, no head; the loss is bit for bit the flow
    loss the full objective computes from the same draws."""
    for preset, extra, teacher in (("self-flow-digits", [], "block_tokens"),
                                   ("repa-digits", [f"method.encoder={vit_encoder(tmp_path)}"], "forward_features")):
        full, train = make(preset, *extra)
        x0, y = batch(full, train)
        full.rng("cpu").manual_seed(5)
        reference = full.forward_flow(x0, y)
        for override in ("method.rep_weight=0", "method.rep_warmup_steps=10"):
            model, _ = make(preset, *extra, override)
            assert all(torch.equal(a, b) for a, b in zip(model.student.state_dict().values(),
                                                           full.student.state_dict().values()))
            module = model.ema if preset.startswith("self") else model.encoder.network.encoder

            def refuse(*a, **k):
                raise AssertionError("the teacher ran at weight 0")

            setattr(module, teacher, refuse)
            model.rng("cpu").manual_seed(5)
            out = at_step(model, 0).forward_flow(x0, y)
            assert "rep_loss" not in out.scalars and out.target is None
            assert torch.equal(out.loss, reference.scalars["flow_loss"])
            out.loss.backward()
            head = model.head if preset.startswith("self") else model.projector
            assert all(p.grad is None for p in head.parameters())


def test_rep_warmup_must_be_non_negative():
    with pytest.raises(UserError, match=r"method.rep_warmup_steps=-1 must be >= 0"):
        make("self-flow-digits", "method.rep_warmup_steps=-1")


def test_repa_projector_is_xavier_with_zero_bias(tmp_path):
    """REPA's ``_basic_init`` (models/sit.py:206-219): xavier-uniform weights, zero biases on the projector too."""
    repa, _ = make("repa-digits", f"method.encoder={vit_encoder(tmp_path)}")
    linears = [m for m in repa.projector.net if isinstance(m, torch.nn.Linear)]
    assert [tuple(m.weight.shape) for m in linears] == [(256, 64), (256, 256), (128, 256)]
    for m in linears:
        bound = (6 / sum(m.weight.shape)) ** 0.5
        assert torch.count_nonzero(m.bias) == 0
        assert 0.97 * bound < m.weight.abs().max() <= bound  # PyTorch's default is ±1/√fan_in (0.0625 for 256)
        assert abs(m.weight.std().item() - bound / 3 ** 0.5) < 0.1 * bound
