"""method.name=distill_dinov2 (methods/distill_dinov2.py): DINOv2's distillation of smaller models (§5). The loss
against a reference written here from the paper's four changes to DINOv2's loop; the teacher (a DINOv2 run's
backbone and heads) frozen, unchanged and in no checkpoint, checked by its sha256 on resume; the spare EMA exported;
each user error one line; two gloo processes as one. Kill-and-resume: tests/test_kill_resume.py's every-method test."""

from __future__ import annotations

import copy
import json
import os
import shutil

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from spawn import spawn_and_join
from ssl_helpers import (STUDENT_HEADS, assert_user_error, dinov2_teacher_run, raises_user_error, run_cli,
                         tiny_method)

B, WORLD = 8, 2
LOCAL2 = {"local_crops_number": 2, "local_crops_size": 4}


def student(teacher, extra=None, local=True, **sections):
    sections.setdefault("augment", LOCAL2 if local else {"local_crops_number": 0})
    return tiny_method("distill_dinov2", {"teacher": {"weights": str(teacher)}, **STUDENT_HEADS,
                                          "warmup_teacher_temp_epochs": 0, **(extra or {})},
                       data={"batch_size": B}, **sections).train()


def crops(local=True, seed=0, batch=B):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, 1, s, s, generator=g) for s in ((8, 8, 4, 4) if local else (8, 8))]


# ----------------------------------------------------------------------------- the paper's loss, written out
def sinkhorn(t, temp, iters=3):
    """Sinkhorn-Knopp as DINOv2's sinkhorn_knopp_teacher (dino_clstoken_loss.py:35-61), one process."""
    q = torch.exp(t.float() / temp).t()
    k, n = q.shape
    q /= q.sum()
    for _ in range(iters):
        q /= q.sum(dim=1, keepdim=True)
        q /= k
        q /= q.sum(dim=0, keepdim=True)
        q /= n
    return (q * n).t()


def koleo(x, eps=1e-8):
    """koleo_loss.py:25-48: −mean log distance to the nearest other row, on L2-normalised rows."""
    x = F.normalize(x.float(), eps=eps, p=2, dim=-1)
    dots = x @ x.t()
    dots.view(-1)[:: x.shape[0] + 1].fill_(-1)
    return -torch.log(F.pairwise_distance(x, x[dots.argmax(1)], 2, eps=1e-8) + eps).mean()


def reference(m, views, teacher_norm, center, center2):
    """DINOv2's loop with §5's changes, on the method's own modules: the teacher (its heads included) frozen on
    its own normalisation of the global crops; the student unmasked; DINO's [CLS] cross-entropy over the pairs of
    (teacher global crop, another student crop) summed over 2 + max(2L, 1); KoLeo on each global crop's student
    [CLS]; iBOT's term on every patch of the global crops, the mean over a crop's patches averaged over the crops."""
    c, temp = m.cfg.method, m.teacher_temp
    g = torch.cat(views[:2])
    local = views[2:]
    (mean,), (std,) = teacher_norm
    with torch.no_grad():
        tt = m.teacher_backbone((g * 0.25 + 0.5 - mean) / std, return_all_tokens=True)
        t_cls = m.teacher_head(tt[:, 0])
        t_patch = (m.teacher_ibot_head or m.teacher_head)(tt[:, 1:].flatten(0, 1))
        if c.centering == "centering":
            q_cls, q_patch = F.softmax((t_cls - center) / temp, -1), F.softmax((t_patch - center2[0]) / temp, -1)
        else:
            q_cls, q_patch = sinkhorn(t_cls, temp), sinkhorn(t_patch, temp)
    s = m.backbone(g, return_all_tokens=True)
    student_crops = [m.head(x) for x in s[:, 0].chunk(2)] + [m.head(m.backbone(x)) for x in local]
    log_p = [F.log_softmax(x / c.student_temp, -1) for x in student_crops]
    dino = 0
    for i, q in enumerate(q_cls.chunk(2)):
        for v, lp in enumerate(log_p):
            if v != i:
                dino = dino - (q * lp).sum(-1).mean()
    dino = dino / (2 + max(2 * len(local), 1))
    reg = c.koleo_loss_weight * sum(koleo(x) for x in s[:, 0].chunk(2))
    s_patch = (m.ibot_head if c.ibot_separate_head else m.head)(s[:, 1:].flatten(0, 1))
    ibot = -(q_patch * F.log_softmax(s_patch / c.student_temp, -1)).sum(-1).mean()
    return c.dino_loss_weight * dino + reg + c.ibot_loss_weight * ibot, t_cls, t_patch


@pytest.mark.parametrize("centering,separate,local", [("centering", False, True), ("sinkhorn_knopp", True, True),
                                                      ("sinkhorn_knopp", False, False)])
def test_the_loss_and_its_gradients_are_the_papers(tmp_path, centering, separate, local):
    norm = ((0.3,), (0.3,))  # the teacher's data statistics, not the student's (0.5, 0.25)
    run = dinov2_teacher_run(tmp_path, norm=norm, **({"ibot_separate_head": True} if separate else {}))
    m = student(run, {"centering": centering, "ibot_separate_head": separate}, local=local)
    center, center2 = m.center.clone(), m.center2.clone()
    assert center.abs().sum() > 0  # the teacher run's last centres
    views = crops(local)
    ref = copy.deepcopy(m)
    out = m.forward_views(views, **m.step_draws(views))
    out.loss.backward()
    want, t_cls, t_patch = reference(ref, views, norm, center, center2)
    want.backward()
    assert set(out.scalars) == {"loss_dino", "loss_koleo", "loss_ibot"}
    assert out.loss.item() == pytest.approx(want.item(), rel=1e-5)
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        assert (p.grad is None) == (q.grad is None), name
        if p.grad is not None:
            scale = float(q.grad.abs().max())
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6 + 1e-6 * scale, msg=name)
    if centering == "centering":  # C and C2 over the [CLS] rows and over every patch row
        torch.testing.assert_close(m.center, 0.9 * center + 0.1 * t_cls.mean(0, keepdim=True))
        torch.testing.assert_close(m.center2, 0.9 * center2 + 0.1 * t_patch.mean(0).view(1, 1, -1))
    else:
        assert torch.equal(m.center, center) and torch.equal(m.center2, center2)


def test_no_mask_token_no_drop_path_and_the_teachers_prototypes(tmp_path):
    m = student(dinov2_teacher_run(tmp_path, "vit_tiny"))  # a ViT-tiny teacher (192 wide) into the micro ViT (128)
    assert not hasattr(m.backbone, "masked_embed") and m.step_draws(crops()) == {}
    assert m.teacher_backbone.num_features == 192 and m.backbone.num_features == 128
    assert m.head.last_layer.weight_v.shape == (32, 8) and m.center.shape == (1, 32)  # K = the teacher's 32
    assert not any(getattr(mod, "p", 0) for mod in m.backbone.modules() if type(mod).__name__ == "DropPath")


# ----------------------------------------------------------------------------- the teacher, the EMA, the checkpoint
def test_the_teacher_is_the_runs_backbone_and_heads_and_never_changes(tmp_path):
    from selfsup.weights import state_sha256

    run = dinov2_teacher_run(tmp_path)
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    m = student(run)
    teacher = {f"{prefix}.{k}": v for prefix, mod in (("backbone", m.teacher_backbone), ("head", m.teacher_head))
               for k, v in mod.state_dict().items()}
    for key, value in teacher.items():
        assert torch.equal(value, saved[f"teacher_{key}"]), key
    assert m.run_facts["teacher"]["sha256"] == state_sha256(teacher)
    assert torch.equal(m.center, saved["center"]) and torch.equal(m.center2, saved["center2"])
    before = {k: v.clone() for k, v in teacher.items()}
    assert not m.teacher_backbone.training and not m.teacher_head.training
    assert not any(p.requires_grad for p in m.teacher.parameters())
    assert not any(k.startswith("teacher") for k in m.state_dict())
    trained = {id(p) for mod in m.trainable().values() for p in mod.parameters()}
    assert not any(id(p) in trained for p in m.teacher.parameters())
    optimizer = m.configure_optimizers()
    for group in optimizer.param_groups:
        group["lr"] = 0.05
    ema = {k: v.clone() for k, v in m.ema_backbone.state_dict().items()}
    for _ in range(2):
        optimizer.zero_grad()
        m.forward_views(crops()).loss.backward()
        assert all(p.grad is None for p in m.teacher.parameters())
        optimizer.step()
        m.momentum = 0.9
        m.teacher_ema()  # the post-step hook: the spare EMA of the student
        ema = {k: 0.9 * v + 0.1 * m.backbone.state_dict()[k] for k, v in ema.items()}
    now = {f"{prefix}.{k}": v for prefix, mod in (("backbone", m.teacher_backbone), ("head", m.teacher_head))
           for k, v in mod.state_dict().items()}
    assert all(torch.equal(now[k], before[k]) for k in before)
    for k, v in m.ema_backbone.state_dict().items():
        torch.testing.assert_close(v, ema[k], rtol=1e-5, atol=1e-7)
    assert not torch.equal(m.ema_backbone.blocks[0].attn.qkv.weight, m.backbone.blocks[0].attn.qkv.weight)


def test_the_evaluated_and_exported_backbone_is_the_ema(tmp_path):
    m = student(dinov2_teacher_run(tmp_path))
    assert m.eval_backbone is m.ema_backbone
    state = {**m.state_dict(), "ema_backbone.cls_token": torch.full_like(m.backbone.cls_token, 7.0)}
    exported = type(m).backbone_state(state)
    assert exported.keys() == m.backbone.state_dict().keys() and torch.all(exported["cls_token"] == 7.0)


def test_a_wrong_teacher_on_resume_is_one_line(tmp_path):
    m = student(dinov2_teacher_run(tmp_path))
    ckpt: dict = {}
    m.on_save_checkpoint(ckpt)
    assert ckpt["distill_teacher_sha256"] == m.teacher.sha256
    other = student(dinov2_teacher_run(tmp_path, seed=1))
    with raises_user_error("is not the teacher this run trained with", "method.teacher.weights", "sha256"):
        other.on_load_checkpoint(ckpt)


# ----------------------------------------------------------------------------- what a user can get wrong
def test_user_errors_are_one_line(tmp_path):
    run = dinov2_teacher_run(tmp_path)
    with raises_user_error("method.teacher.weights is required"):
        tiny_method("distill_dinov2")
    with raises_user_error("not a finished selfsup DINOv2 run folder", "method.name=distill"):
        student(run / "backbone.safetensors")
    dino = tmp_path / "dino-run"
    shutil.copytree(run, dino)
    from selfsup.export import export_backbone, read_meta
    from selfsup.models.backbones import build_backbone

    meta = read_meta(run / "backbone.safetensors")
    export_backbone(build_backbone(meta["backbone"], **meta["kwargs"]), dino / "backbone.safetensors",
                    {**meta, "method": "dino"})
    with raises_user_error("is a dino run, not a dinov2 one", "method.name=distill"):
        student(dino)
    headless = tmp_path / "headless-run"
    shutil.copytree(run, headless)
    state = torch.load(headless / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    torch.save({"state_dict": {k: v for k, v in state.items() if not k.startswith("teacher_head.")}},
               headless / "checkpoints" / "last.ckpt")
    with raises_user_error("holds no teacher_backbone / teacher_head", "method.name=distill"):
        student(headless)
    with raises_user_error("model.patch_size=4", "the teacher's patches are 2 px", "method.ibot_loss_weight=0"):
        student(run, model={"patch_size": 4})
    with raises_user_error("model.backbone='bn_cnn_tiny'", "method.ibot_loss_weight=0"):
        student(run, model={"backbone": "bn_cnn_tiny"})
    with raises_user_error("model.drop_path_rate=0.1", "removes stochastic depth", "model.drop_path_rate=0"):
        student(run, model={"drop_path_rate": 0.1})
    with raises_user_error("method.out_dim=64", "32 prototypes", "method.out_dim=32"):
        student(run, {"out_dim": 64})
    with raises_user_error("method.ibot_separate_head=true", "method.ibot_separate_head=false"):
        student(run, {"ibot_separate_head": True})
    with raises_user_error("method.mask_sample_probability=0.5", "removes masking"):
        student(run, {"mask_sample_probability": 0.5})


@pytest.mark.parametrize("separate", [False, True])
def test_a_convnet_student_trains_the_cls_term_only(tmp_path, separate):
    """Its pooled feature is its [CLS]; a teacher with a separate iBOT head needs none in the student (no patch term:
    every student parameter takes a gradient, as DDP wants)."""
    run = dinov2_teacher_run(tmp_path, **({"ibot_separate_head": True} if separate else {}))
    m = student(run, {"ibot_loss_weight": 0.0}, model={"backbone": "bn_cnn_tiny"})
    out = m.forward_views(crops())
    out.loss.backward()
    assert set(out.scalars) == {"loss_dino", "loss_koleo"} and torch.isfinite(out.loss)
    assert all(p.grad is not None for p in m.parameters() if p.requires_grad)
    assert m.backbone.num_features == 64 and m.ema_backbone is m.eval_backbone


# ----------------------------------------------------------------------------- two processes as one
def _worker(rank: int, init_file: str, out_dir: str, teacher: str, centering: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        from ssl_helpers import ViewsLoss

        torch.manual_seed(0)
        m = student(teacher, {"centering": centering, "koleo_loss_weight": 0.0})
        views = crops(batch=WORLD * B)
        ddp = torch.nn.parallel.DistributedDataParallel(ViewsLoss(m), broadcast_buffers=False)
        loss = ddp(*[v[rank * B:(rank + 1) * B] for v in views])
        loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
        torch.save({"loss": loss.detach(), "grads": grads, "center": m.center.clone(), "center2": m.center2.clone()},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.spawn
@pytest.mark.parametrize("centering", ["sinkhorn_knopp", "centering"])
def test_two_gloo_processes_equal_one_process_on_the_concatenated_batch(tmp_path, centering):
    """Sinkhorn-Knopp over the global batch's [CLS] and patch rows, or the EMA centres over it: the mean of the
    ranks' losses, the averaged gradients and the centres are one process's (KoLeo is per process: off)."""
    teacher = str(dinov2_teacher_run(tmp_path))
    spawn_and_join(_worker, (str(tmp_path / "init"), str(tmp_path), teacher, centering), WORLD, 240)
    torch.manual_seed(0)
    m = student(teacher, {"centering": centering, "koleo_loss_weight": 0.0})
    loss = m.forward_views(crops(batch=WORLD * B)).loss
    loss.backward()
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    torch.testing.assert_close((ranks[0]["loss"] + ranks[1]["loss"]) / 2, loss.detach(), rtol=1e-5, atol=1e-6)
    for r in ranks:
        torch.testing.assert_close(r["center"], m.center, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(r["center2"], m.center2, rtol=1e-5, atol=1e-6)
        for name, p in m.named_parameters():
            if p.grad is not None:
                torch.testing.assert_close(r["grads"][name], p.grad, rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------- a run, from the command line
@pytest.mark.train
def test_a_run_exports_its_ema_records_its_teacher_and_resume_refuses_another(tmp_path):
    teacher = dinov2_teacher_run(tmp_path)
    args = ["pretrain", "distill-dinov2-digits", f"method.teacher.weights={teacher}", "method.hidden_dim=32",
            "method.bottleneck_dim=16", "data.batch_size=32", "trainer.accelerator=cpu", "trainer.devices=1",
            "trainer.progress_bar=false", "trainer.max_epochs=1", "trainer.limit_train_batches=2",
            f"output_dir={tmp_path}", "name=d"]
    code, out, err = run_cli(*args)
    assert code == 0, err
    run = tmp_path / "d"
    facts = json.loads((run / "run.json").read_text())
    assert facts["teacher"]["source"] == str(teacher) and len(facts["teacher"]["sha256"]) == 64
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    state = ckpt["state_dict"]
    assert not any(k.startswith("teacher") for k in state) and ckpt["distill_teacher_sha256"] == \
        facts["teacher"]["sha256"]
    from safetensors.torch import load_file

    exported = load_file(str(run / "backbone.safetensors"))
    assert all(torch.equal(v, state[f"ema_backbone.{k}"]) for k, v in exported.items())
    assert not all(torch.equal(v, state[f"backbone.{k}"]) for k, v in exported.items())
    shutil.rmtree(teacher)
    shutil.copytree(dinov2_teacher_run(tmp_path / "other", seed=1), teacher)  # the teacher changed under the run
    code, _, err = run_cli("pretrain", "--resume", run, "trainer.max_epochs=2")
    assert_user_error(code, err, "is not the teacher this run trained with", "sha256")
