"""method.name=distill (methods/distill.py): LightlyTrain's global distillation (v1) of a frozen teacher into any
student. The loss against a reference written here from its source's facts; the queue's update rule; mixup; the
teacher frozen, in eval mode and in no checkpoint, checked by its sha256 on resume; two gloo processes as one (v1 and
v3; v2 and v3 otherwise in tests/test_distill_versions.py)."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from spawn import spawn_and_join
from ssl_helpers import assert_user_error, run_cli, tiny_method

from selfsup.export import export_backbone
from selfsup.losses import global_distillation_loss
from selfsup.models.backbones import build_backbone

WORLD, BATCH = 2, 8


def teacher_file(tmp_path, backbone="vit_micro", seed=0, **kwargs):
    """A selfsup export (1 channel, 8 px) standing in for a trained teacher."""
    path = tmp_path / f"teacher-{backbone}-{seed}.safetensors"
    if not path.exists():
        kwargs = {"in_chans": 1, "image_size": 8, "patch_size": 4, **kwargs}
        torch.manual_seed(seed)
        meta = {"backbone": backbone, "kwargs": kwargs, "image_size": 8, "in_chans": 1, "mean": [0.3], "std": [0.3],
                "dataset": "digits", "method": "moco_v3"}
        export_backbone(build_backbone(backbone, **kwargs), path, meta)
    return str(path)


def distill(tmp_path, **extra):
    return tiny_method("distill", {"teacher": {"weights": teacher_file(tmp_path)}, "queue_size": 24, **extra})


def test_the_loss_is_lightlytrain_s_kl_of_the_queue_softmaxes():
    """KL(p_t ‖ p_s) averaged over the batch (KLDivLoss batchmean), p = softmax(· Qᵀ / τ): written out here."""
    g = torch.Generator().manual_seed(0)
    s, t, q = (F.normalize(torch.randn(n, 6, generator=g), dim=-1) for n in (5, 5, 11))
    tau = 0.07
    p_t = torch.exp(t @ q.T / tau) / torch.exp(t @ q.T / tau).sum(1, keepdim=True)
    p_s = torch.exp(s @ q.T / tau) / torch.exp(s @ q.T / tau).sum(1, keepdim=True)
    expect = (p_t * (p_t.log() - p_s.log())).sum() / 5
    torch.testing.assert_close(global_distillation_loss(s, t, q, tau), expect, rtol=1e-5, atol=1e-6)
    assert global_distillation_loss(t, t, q, tau).abs() < 1e-6  # the student on the teacher: no loss
    s.requires_grad_(True)
    global_distillation_loss(s, t, q, tau).backward()
    assert s.grad.abs().sum() > 0


def test_the_queue_takes_the_batch_first_and_shifts_the_rest(tmp_path):
    m = distill(tmp_path)
    rows = torch.arange(24 * 128, dtype=torch.float32).reshape(24, 128)
    m.queue.copy_(rows)
    new = torch.full((5, 128), -1.0)
    m.update_queue(new)
    assert torch.equal(m.queue[:5], new) and torch.equal(m.queue[5:], rows[:19])  # distillation.py:243-247
    m.update_queue(torch.full((30, 128), 7.0))  # a batch larger than the queue fills it with its first rows (:239-241)
    assert torch.equal(m.queue, torch.full((24, 128), 7.0))


def test_teacher_centre_takes_the_bias_corrected_running_mean_off_the_features(tmp_path):
    """method.teacher_centre=m: c ← m c + (1 − m) mean(batch), f − c / (1 − mⁿ) (the first batch minus its own mean);
    0 (LightlyTrain's): the features as they are, and no buffer."""
    assert not hasattr(distill(tmp_path), "centre")
    m = distill(tmp_path, teacher_centre=0.9)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 128, generator=g) + 5, torch.randn(6, 128, generator=g) - 1
    torch.testing.assert_close(m.centred(a), a - a.mean(0))
    c = 0.9 * 0.1 * a.mean(0) + 0.1 * b.mean(0)
    torch.testing.assert_close(m.centred(b), b - c / (1 - 0.9 ** 2))
    assert "centre" in m.state_dict() and int(m.centre_updates) == 2  # checkpointed: a resume is exact
    x = torch.rand(8, 1, 8, 8)
    t = m.teacher_embedding(x)
    torch.testing.assert_close(t.norm(dim=-1), torch.ones(8))


def test_the_teacher_is_frozen_in_eval_mode_and_in_no_checkpoint(tmp_path):
    m = distill(tmp_path)
    m.train()
    assert not m.teacher.network.training and not any(p.requires_grad for p in m.teacher.network.parameters())
    assert not any(k.startswith("teacher") for k in m.state_dict()) and "queue" in m.state_dict()
    params = {id(p) for module in m.trainable().values() for p in module.parameters()}
    assert not any(id(p) in params for p in m.teacher.network.parameters())
    assert m.projector.out_features == m.teacher.network.num_features == 128 and m.projector.in_features == 128
    x = torch.randn(BATCH, 1, 8, 8)
    out = m.forward_views([x], **m.step_draws([x]))
    out.loss.backward()
    assert torch.isfinite(out.loss) and m.projector.weight.grad is not None
    assert all(p.grad is None for p in m.teacher.network.parameters())
    assert torch.count_nonzero(m.queue.abs().sum(1)) == BATCH
    ckpt: dict = {}
    m.on_save_checkpoint(ckpt)
    assert ckpt["distill_teacher_sha256"] == m.teacher.sha256
    ckpt["distill_teacher_sha256"] = "0" * 64
    with pytest.raises(Exception, match="is not the teacher this run trained with"):
        m.on_load_checkpoint(ckpt)


def test_mixup_is_a_convex_combination_with_a_permutation_of_the_batch(tmp_path):
    m = distill(tmp_path)
    x = torch.randn(BATCH, 1, 8, 8)
    draws = m.step_draws([x])
    lam, perm = draws["lam"], draws["perm"]
    assert 0 <= float(lam) <= 1 and sorted(perm.tolist()) == list(range(BATCH))
    torch.testing.assert_close(m.mix(x, lam, perm), lam * x + (1 - lam) * x[perm])


def test_the_teacher_sees_the_images_in_its_own_normalisation(tmp_path):
    m = distill(tmp_path)  # the run's digits statistics (0.5, 0.25) against the teacher's file (0.3, 0.3)
    x = torch.randn(2, 1, 8, 8)
    pixels = x * 0.25 + 0.5
    expect = F.normalize(m.teacher.network((pixels - 0.3) / 0.3), dim=-1)
    torch.testing.assert_close(m.teacher_embedding(x), expect, rtol=1e-5, atol=1e-5)


def test_a_named_teacher_of_another_architecture_and_a_convnet_student(tmp_path):
    path = teacher_file(tmp_path, "bn_cnn_micro")
    m = tiny_method("distill", {"teacher": {"weights": path}, "queue_size": 16}, model={"backbone": "bn_cnn_tiny"})
    assert m.teacher.network.num_features == 128 and m.backbone.num_features == 64 and m.projector.out_features == 128
    x = torch.randn(BATCH, 1, 8, 8)
    assert torch.isfinite(m.forward_views([x]).loss)


# --------------------------------------------------------------------------- two processes as one


def _worker(rank: int, init_file: str, out_dir: str, teacher: str, version: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        from ssl_helpers import ViewsLoss  # noqa: F401 (the test's helpers on the path of the spawned worker)

        m = tiny_method("distill", {"teacher": {"weights": teacher}, "queue_size": 12, "teacher_centre": 0.9,
                                    "version": version})
        x = torch.randn(2 * BATCH, 1, 8, 8, generator=torch.Generator().manual_seed(5))
        lam, perm = torch.tensor(0.3), torch.randperm(2 * BATCH, generator=torch.Generator().manual_seed(6))

        class Loss(torch.nn.Module):
            def __init__(self, method):
                super().__init__()
                self.method = method

            def forward(self, v):
                return self.method.forward_views([v], lam=lam, perm=perm).loss

        ddp = torch.nn.parallel.DistributedDataParallel(Loss(m), broadcast_buffers=False)
        for _ in range(2):  # the second step reads the queue the first filled with both processes' rows
            ddp.zero_grad()
            loss = ddp(x[rank * BATCH:(rank + 1) * BATCH])
            loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in m.named_parameters() if p.grad is not None}
        torch.save({"loss": loss.detach(), "grads": grads, "queue": m.queue.clone()},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.spawn
@pytest.mark.parametrize("version", ["v1", "v3"])
def test_two_gloo_processes_equal_one_process_on_the_concatenated_batch(tmp_path, version):
    """The queue, the mixup partners and the teacher's running mean (method.teacher_centre) over the global batch
    (v3: its local term per image, averaged over the processes as over one batch)."""
    teacher = teacher_file(tmp_path)
    spawn_and_join(_worker, (str(tmp_path / "init"), str(tmp_path), teacher, version), WORLD, 240)
    m = tiny_method("distill", {"teacher": {"weights": teacher}, "queue_size": 12, "teacher_centre": 0.9,
                                "version": version})
    x = torch.randn(2 * BATCH, 1, 8, 8, generator=torch.Generator().manual_seed(5))
    lam, perm = torch.tensor(0.3), torch.randperm(2 * BATCH, generator=torch.Generator().manual_seed(6))
    for _ in range(2):
        m.zero_grad()
        loss = m.forward_views([x], lam=lam, perm=perm).loss
        loss.backward()
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(WORLD)]
    torch.testing.assert_close((ranks[0]["loss"] + ranks[1]["loss"]) / 2, loss.detach(), rtol=1e-5, atol=1e-6)
    for r in ranks:
        torch.testing.assert_close(r["queue"], m.queue)
        for name, p in m.named_parameters():
            if p.grad is not None:
                torch.testing.assert_close(r["grads"][name], p.grad, rtol=1e-4, atol=1e-6)


# --------------------------------------------------------------------------- a run, from the command line


@pytest.mark.train
def test_a_distill_run_records_its_teacher_and_resume_refuses_another(tmp_path):
    teacher = teacher_file(tmp_path)
    args = ["pretrain", "distill-digits", f"method.teacher.weights={teacher}", "method.queue_size=64",
            "data.batch_size=32", "trainer.accelerator=cpu", "trainer.devices=1", "trainer.progress_bar=false",
            "trainer.max_epochs=1", "trainer.limit_train_batches=2", f"output_dir={tmp_path}", "name=d"]
    code, out, err = run_cli(*args)
    assert code == 0, err
    run = tmp_path / "d"
    facts = json.loads((run / "run.json").read_text())
    assert facts["teacher"]["source"] == teacher and len(facts["teacher"]["sha256"]) == 64
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert not any(k.startswith("teacher") for k in ckpt["state_dict"]) and "queue" in ckpt["state_dict"]
    other = teacher_file(tmp_path, seed=1)
    os.replace(other, teacher)  # the teacher's file changed under the run
    code, _, err = run_cli("pretrain", "--resume", run, "trainer.max_epochs=2")
    assert_user_error(code, err, "is not the teacher this run trained with", "sha256")


@pytest.mark.train
def test_the_distill_beats_scratch_claim_runs_quick_and_writes_the_teacher_beside(tmp_path):
    """The claim on (fake) Fashion-MNIST files, 2 steps a run: its metrics, verdict and the teacher's kNN and linear
    probe written beside; the teacher is the claim's vit_tiny and its run is shared by the seeds."""
    from idx_files import fashion_overrides
    from ssl_helpers import quick_claim

    tiny = ["trainer.max_epochs=1", "trainer.limit_train_batches=2", "data.batch_size=32",
            "trainer.log_every_n_steps=1", "eval.knn_every_n_steps=0", "instruments.rank_samples=64"]
    result = quick_claim("distill-beats-scratch", tmp_path,
                         [*tiny, *fashion_overrides("distill-beats-scratch", tmp_path / "fmnist")])
    m = result["metrics"]
    assert set(m) >= {"distilled", "scratch", "knn_gain", "distilled_linear", "scratch_linear", "linear_gain",
                      "teacher_knn", "teacher_linear"}
    assert len(set(m["teacher_linear"])) == 1 and 0 <= m["teacher_linear"][0] <= 100  # one teacher for every seed
    assert result["ours"].count("the teacher") == 2  # its kNN and its linear probe
    import yaml

    teacher = yaml.safe_load((tmp_path / "teacher" / "config.yaml").read_text())
    assert (teacher["model"]["backbone"], teacher["data"]["name"]) == ("vit_tiny", "fashion-mnist")
    assert yaml.safe_load((tmp_path / "scratch-s0" / "config.yaml").read_text())["method"]["name"] == "lejepa"
