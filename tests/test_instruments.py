"""Instruments (measures, detectors, callbacks) and interventions (cut-init, GradScale, sqrt lr, LayerScale,
SimCLR EMA positives): formulas against hand-computed values, and training unchanged by the instruments."""

import csv
import math
from functools import partial
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from selfsup.config import load_run_config
from selfsup.errors import UserError
from selfsup.instruments.detectors import DipDetector, EventLog, SpikeDetector, read_events
from selfsup.instruments.dynamics import PredictorAlignment, layer_groups, square_weight
from selfsup.instruments.measures import misalignment, norm_summary, per_dim_std, predictor_alignment
from selfsup.interventions import grad_scale
from selfsup.losses import nt_xent
from selfsup.schedules import scaled_lr
from ssl_helpers import random_views, step_outputs, tiny_method


# ----------------------------------------------------------------------------- interventions
@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 2.0, -1.0])
def test_grad_scale_multiplies_each_sample_gradient_by_norm_power(p):
    torch.manual_seed(0)
    z = (torch.randn(6, 5) * torch.arange(1, 7)[:, None]).requires_grad_()
    w = torch.randn(6, 5)

    def loss_of(x):
        return (F.normalize(x, dim=1) * w).sum() + (x ** 2).sum()

    plain, = torch.autograd.grad(loss_of(z), z)
    scaled_out = grad_scale(z, p)
    assert torch.equal(scaled_out, z)  # identity forward
    scaled, = torch.autograd.grad(loss_of(scaled_out), z)
    expected = plain * z.detach().norm(dim=1, keepdim=True) ** p
    torch.testing.assert_close(scaled, expected, rtol=1e-5, atol=1e-6)


def test_cut_init_all_divides_every_parameter_and_keeps_targets_in_sync():
    base = tiny_method("byol")
    with pytest.warns(UserWarning, match=r"with LayerNorm, attention changes the network's function"):
        cut = tiny_method("byol", interventions={"cut_init": 3.0})  # the micro ViT: a warning
    for (name, p0), (_, p1) in zip(base.named_parameters(), cut.named_parameters()):
        torch.testing.assert_close(p1, p0 / 3.0, msg=name)
    for (name, b0), (_, b1) in zip(base.named_buffers(), cut.named_buffers()):
        assert torch.equal(b0, b1), name  # BN running statistics untouched
    for po, pt in zip(cut.backbone.parameters(), cut.target_backbone.parameters()):
        assert torch.equal(po, pt)


def test_cut_init_projector_last_divides_only_the_scale_setting_layer():
    """SimCLR's default head ends in a scale-only BN: its γ (and frozen zero β) are divided, nothing else; MoCo v3's
    projector ends in a BN without affine, which no cut can scale: refused."""
    base = tiny_method("simclr")
    cut = tiny_method("simclr", interventions={"cut_init": 3.0, "cut_init_scope": "projector_last"})
    last = len(cut.projector) - 1
    assert isinstance(cut.projector[last], nn.BatchNorm1d)
    changed = {n for (n, p0), (_, p1) in zip(base.named_parameters(), cut.named_parameters())
               if not torch.equal(p0, p1)}
    assert changed == {f"projector.{last}.weight"}  # β is 0 (frozen): divided, unchanged
    torch.testing.assert_close(cut.projector[last].weight, base.projector[last].weight / 3)
    with pytest.raises(UserError, match="projector_last cannot act: the projector ends in a BatchNorm without affine"):
        tiny_method("moco_v3", interventions={"cut_init": 3.0, "cut_init_scope": "projector_last"})


def test_cut_init_config_errors():
    with pytest.raises(UserError, match="interventions.cut_init_scope"):
        load_run_config("simclr-digits", ["interventions.cut_init_scope=first"])
    with pytest.raises(UserError, match="interventions.cut_init=0"):
        load_run_config("simclr-digits", ["interventions.cut_init=0"])


GRAD_SCALE_PLACE = {"simclr": "projector", "simsiam": "predictor", "byol": "predictor", "moco_v3": "predictor"}


@pytest.mark.parametrize("name", ["simclr", "simsiam", "byol", "moco_v3"])
def test_grad_scale_acts_at_its_documented_place_with_its_power(name):
    """interventions.py: GradScale multiplies the gradient of each sample's output of the documented head
    (SimCLR: projector outputs; MoCo v3 queries, BYOL, SimSiam: predictor outputs) by ‖z_i‖^p. The forward is
    the identity, so the loss and the gradient arriving from the loss are the same for every p: the gradient
    at the head's output must be p = 0's times ‖z_i‖^p, sample by sample (another place or power fails)."""
    views = random_views(8)
    runs = {}
    for p in (0.0, 1.0, 2.0):
        m = tiny_method(name, interventions={"grad_scale_p": p})
        outputs, grads = [], {}

        def capture(module, args, out, outputs=outputs, grads=grads):
            i = len(outputs)
            outputs.append(out.detach())
            out.register_hook(lambda g, i=i: grads.__setitem__(i, g.detach()))

        getattr(m, GRAD_SCALE_PLACE[name]).register_forward_hook(capture)
        loss = m.forward_views(views).loss
        loss.backward()
        runs[p] = (loss.detach(), outputs, [grads[i] for i in range(len(outputs))],
                   m.backbone.blocks[0].mlp.fc1.weight.grad.clone())
    loss0, outs0, grads0, backbone0 = runs[0.0]
    assert len(grads0) >= 1
    for p in (1.0, 2.0):
        loss, outs, grads, backbone = runs[p]
        torch.testing.assert_close(loss, loss0)
        for z, g, g0, z0 in zip(outs, grads, grads0, outs0):
            torch.testing.assert_close(z, z0)
            torch.testing.assert_close(g, g0 * z.norm(dim=1, keepdim=True) ** p, rtol=1e-4, atol=1e-7)
        assert not torch.allclose(backbone, backbone0)  # and it reaches the backbone


def test_sqrt_lr_scaling_boundaries():
    assert scaled_lr(0.3, 256, "sqrt") == scaled_lr(0.3, 256, "linear") == pytest.approx(0.3)
    assert scaled_lr(0.3, 1024, "sqrt") == pytest.approx(0.6)
    assert scaled_lr(0.3, 1024, "linear") == pytest.approx(1.2)
    assert scaled_lr(0.3, 64, "sqrt") == pytest.approx(0.15)
    assert scaled_lr(0.3, 1, "sqrt") == pytest.approx(0.3 / 16)
    with pytest.raises(ValueError, match="unknown lr scaling rule"):
        scaled_lr(0.3, 256, "log")
    with pytest.raises(UserError, match="optim.lr_scaling='log'"):
        load_run_config("simclr-digits", ["optim.lr_scaling=log"])


def test_layer_scale_blocks_load_into_timm():
    import timm

    from selfsup.models.backbones import build_backbone

    ours = build_backbone("vit_micro", in_chans=1, image_size=8, patch_size=2, layer_scale=0.1).eval()
    assert torch.equal(ours.blocks[0].ls1.gamma, torch.full((128,), 0.1))
    ref = timm.models.vision_transformer.VisionTransformer(
        img_size=8, patch_size=2, in_chans=1, embed_dim=128, depth=4, num_heads=4, num_classes=0,
        global_pool="token", init_values=0.1, norm_layer=partial(nn.LayerNorm, eps=1e-6)).eval()
    ref.load_state_dict(ours.state_dict(), strict=True)
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(ours(x), ref(x), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="LayerScale"):
        build_backbone("resnet18", in_chans=1, image_size=8, layer_scale=0.1)


def test_nt_xent_positives_replace_the_online_positive():
    torch.manual_seed(0)
    z1, z2 = torch.randn(5, 4), torch.randn(5, 4)
    same = nt_xent(z1, z2, 0.2, positives=torch.cat([z2, z1]))
    torch.testing.assert_close(same, nt_xent(z1, z2, 0.2))
    e = torch.randn(10, 4)  # by hand: anchor i, positive e_i, other candidates as before
    a = F.normalize(torch.cat([z1, z2]), dim=1)
    sims = a @ a.T / 0.2
    pos = (a * F.normalize(e, dim=1)).sum(1) / 0.2
    idx = torch.cat([torch.arange(5) + 5, torch.arange(5)])
    sims[torch.arange(10), idx] = pos
    sims.fill_diagonal_(float("-inf"))
    expected = (torch.logsumexp(sims, 1) - pos).mean()
    torch.testing.assert_close(nt_xent(z1, z2, 0.2, positives=e), expected)


def test_simclr_ema_projector_positives():
    m = tiny_method("simclr", {"projector_momentum": 0.99})
    assert all(not p.requires_grad for p in m.target_projector.parameters())
    out = m.forward_views(random_views(8))
    out.loss.backward()
    assert all(p.grad is None for p in m.target_projector.parameters())
    assert m.projector[0].weight.grad is not None
    with pytest.raises(UserError, match="projector_momentum"):
        load_run_config("simclr-digits", ["method.projector_momentum=1.0"])


# ----------------------------------------------------------------------------- measures
def test_norm_summary_and_misalignment_and_dim_std():
    x = torch.tensor([[3.0, 4.0], [0.0, 1.0], [6.0, 8.0]])
    s = norm_summary(x)
    assert s[0].item() == pytest.approx(16 / 3)
    assert s[2].item() == pytest.approx(5.0)  # median
    assert misalignment(x, x).item() == pytest.approx(0.0, abs=1e-6)
    assert misalignment(x, -x).item() == pytest.approx(2.0)
    assert misalignment(torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 2.0]])).item() == pytest.approx(1.0)
    assert per_dim_std(torch.ones(10, 4)) == pytest.approx(0.0)  # collapsed


def test_predictor_alignment_known_commutator_and_eigenvectors():
    f = torch.diag(torch.tensor([1.0, 2.0]))
    w = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    out = predictor_alignment(w, f, top_k=2)
    assert out["asymmetry"] == pytest.approx(math.sqrt(2))
    assert out["commutator"] == pytest.approx(1 / math.sqrt(5))  # FW − WF = [[0, −1], [0, 0]]
    assert out["eig_cos_1"] == pytest.approx(0.0)  # W e2 = e1 ⟂ e2 (top eigenvector of F)
    torch.manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(6, 6, dtype=torch.float64))
    f = q @ torch.diag(torch.tensor([6.0, 5, 4, 3, 2, 1], dtype=torch.float64)) @ q.T
    # same eigenvectors, symmetric
    w = q @ torch.diag(torch.tensor([0.5, 2.0, 1.0, 3.0, 0.1, 0.2], dtype=torch.float64)) @ q.T
    out = predictor_alignment(w, f, top_k=3)
    assert out["asymmetry"] == pytest.approx(0.0, abs=1e-9)
    assert out["commutator"] == pytest.approx(0.0, abs=1e-9)
    for j in (1, 2, 3):
        assert out[f"eig_cos_{j}"] == pytest.approx(1.0)


# ----------------------------------------------------------------------------- detectors
def test_spike_detector_finds_known_spikes_and_no_false_alarm_on_smooth_series():
    g = torch.Generator().manual_seed(0)
    steps = 600
    smooth = [2.0 + 0.5 * math.sin(t / 40) - t / 1000 + 0.02 * float(torch.randn(1, generator=g)) for t in range(steps)]
    d = SpikeDetector(k=10, window=100, min_history=20)
    assert [t for t, v in enumerate(smooth) if d.update(v) is not None] == []
    spiky = list(smooth)
    for t in (150, 151, 400):
        spiky[t] *= 8
    d = SpikeDetector(k=10, window=100, min_history=20)
    assert [t for t, v in enumerate(spiky) if d.update(v) is not None] == [150, 151, 400]
    d = SpikeDetector(k=10, window=10, min_history=5)  # a flat series: no alarm; nan is a spike
    assert [d.update(v) for v in [1.0] * 20] == [None] * 20
    assert d.update(float("nan")) is not None


def test_dip_detector_one_event_per_dip():
    series = [10, 30, 50, 60, 61, 55, 40, 45, 62, 64, 63, 61.5, 70, 50]
    d = DipDetector(threshold=3.0)
    events = [(i, d.update(v)) for i, v in enumerate(series)]
    assert [(i, b) for i, b in events if b is not None] == [(5, 61), (13, 70)]
    d = DipDetector(threshold=3.0)
    assert all(d.update(float(v)) is None for v in range(0, 100, 5))


def test_event_log_round_trip(tmp_path):
    log = EventLog(tmp_path / "events.jsonl")
    log.write(12, "grad_spike", 9.5, 1.0, group="patch_embed")
    log.write(40, "knn_dip", 50.0, 61.0)
    events = read_events(tmp_path / "events.jsonl")
    assert events == [{"step": 12, "kind": "grad_spike", "value": 9.5, "baseline": 1.0, "group": "patch_embed"},
                      {"step": 40, "kind": "knn_dip", "value": 50.0, "baseline": 61.0}]


# ----------------------------------------------------------------------------- callbacks
def test_layer_groups_of_a_vit_method():
    m = tiny_method("moco_v3", model={"stop_grad_conv1": False})
    groups = layer_groups(m)
    assert set(groups) == {"all", "patch_embed", "first_block", "last_block", "projector", "predictor"}
    ids = {id(p) for p in m.backbone.blocks[-1].parameters()}
    assert {id(p) for p in groups["last_block"]} == ids
    assert len(groups["all"]) == sum(1 for p in m.parameters() if p.requires_grad)


def test_predictor_alignment_callback_on_a_linear_predictor():
    torch.manual_seed(0)
    module = SimpleNamespace(predictor=nn.Linear(4, 4, bias=False), logged={})
    logger = SimpleNamespace(log_metrics=lambda metrics, step: module.logged.update(metrics))

    def trainer(step):
        return SimpleNamespace(global_step=step, is_global_zero=True, loggers=[logger])
    assert square_weight(module.predictor) is module.predictor.weight
    assert square_weight(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))) is None
    from selfsup.predictors import DirectPredConfig, TrackedLinearPredictor

    symmetric = TrackedLinearPredictor(4, "symmetric", DirectPredConfig())
    torch.testing.assert_close(square_weight(symmetric), 0.5 * (symmetric.weight + symmetric.weight.T))
    cb = PredictorAlignment(every_n_steps=2, top_k=2, rho=0.3)
    cb.on_fit_start(None, module)
    assert cb.active
    fs = [torch.randn(16, 4) for _ in range(3)]
    for step, f in enumerate(fs, start=1):
        cb.on_train_batch_end(trainer(step), module, step_outputs(projection=f), None, 0)
    expected_f = fs[0].T @ fs[0] / 16
    for f in fs[1:]:
        expected_f = 0.3 * expected_f + 0.7 * f.T @ f / 16
    torch.testing.assert_close(cb.correlation, expected_f)
    ref = predictor_alignment(module.predictor.weight, expected_f, 2)
    for key, value in ref.items():
        assert module.logged[f"instruments/pred_{key}"] == pytest.approx(value, rel=1e-5)
    module.predictor.register_buffer("correlation", torch.eye(4))  # a DirectPred-style predictor's own F
    cb.on_train_batch_end(trainer(5), module, step_outputs(projection=fs[0]), None, 0)
    own = predictor_alignment(module.predictor.weight, torch.eye(4), 2)
    assert module.logged["instruments/pred_commutator"] == pytest.approx(own["commutator"], abs=1e-9)


def _losses(run_dir):
    with (run_dir / "metrics.csv").open() as f:
        return [(int(r["step"]), float(r["train/loss"])) for r in csv.DictReader(f) if r.get("train/loss")]


@pytest.mark.train
def test_instruments_leave_a_seeded_run_unchanged(tmp_path, tiny):
    from selfsup.commands.main import main

    common = tiny + ["trainer.limit_train_batches=4", f"output_dir={tmp_path}", "eval.knn_monitor_train=200",
                     "eval.knn_monitor_test=100", "data.batch_size=32"]
    on = ["name=with", "instruments.every_n_steps=1", "instruments.rank_every_n_steps=1", "instruments.rank_samples=64",
          "instruments.spike_min_history=2", "instruments.spike_window=2", "instruments.spike_k=0.01",
          "eval.knn_every_n_steps=1", "instruments.knn_dip=0.01"]
    assert main(["pretrain", "byol-digits", *common, *on]) == 0
    assert main(["pretrain", "byol-digits", *common, "name=without", "instruments.enabled=false"]) == 0
    with_instruments, without = _losses(tmp_path / "with"), _losses(tmp_path / "without")
    assert len(without) == 4 and with_instruments == without
    header = (tmp_path / "with" / "metrics.csv").read_text().splitlines()[0]
    for key in ("instruments/grad_l2", "instruments/grad_l2_first_block", "instruments/norm_prediction_q90",
                "instruments/align_prediction_target", "instruments/rankme_embedding",
                "instruments/eff_rank_projection"):
        assert key in header, key
    assert "instruments/" not in (tmp_path / "without" / "metrics.csv").read_text()
    assert (tmp_path / "with" / "embedding_norms.pt").exists()
    events = read_events(tmp_path / "with" / "events.jsonl")  # hair triggers: the detectors must fire
    assert {e["kind"] for e in events} >= {"grad_spike"}
    assert all(set(e) >= {"step", "kind", "value", "baseline"} for e in events)
    assert main(["report", str(tmp_path / "with")]) == 0  # the report reads a real run folder
    assert (tmp_path / "with" / "report" / "grad_norms.png").exists()


def test_instrument_callbacks_follow_config():
    """The one test of ``monitor_callbacks``' choice and order (online evaluators first, then the instruments)."""
    from selfsup.instruments import (Alignment, EmbeddingNorms, GradientNorms, KNNMonitor, OnlineLinearProbe,
                                     PredictorAlignment, RankCollapse, StepInstruments, monitor_callbacks)

    assert monitor_callbacks(load_run_config("moco-v3-vit-digits", ["instruments.enabled=false"])) == []
    cfg = load_run_config("moco-v3-vit-digits", ["eval.knn_every_n_steps=50", "eval.online_probe=true",
                                                 "instruments.enabled=false"])
    assert [type(c) for c in monitor_callbacks(cfg)] == [KNNMonitor, OnlineLinearProbe]
    kinds = [type(c) for c in monitor_callbacks(load_run_config("simsiam-digits", []))]
    assert kinds == [StepInstruments, EmbeddingNorms, GradientNorms, Alignment, RankCollapse, PredictorAlignment]
    cfg = load_run_config("simsiam-digits", ["instruments.gradients=false", "instruments.rank_every_n_steps=0",
                                             "eval.knn_every_n_steps=5", "instruments.knn_dip=2"])
    callbacks = monitor_callbacks(cfg)
    assert [type(c) for c in callbacks] == [KNNMonitor, StepInstruments, EmbeddingNorms, Alignment, PredictorAlignment]
    assert callbacks[0].dips.threshold == 2
    with pytest.raises(UserError, match="instruments.spike_min_history"):
        load_run_config("simsiam-digits", ["instruments.spike_min_history=500"])
    with pytest.raises(UserError, match="unknown config key 'instruments.every'"):
        load_run_config("simsiam-digits", ["instruments.every=5"])


def test_rank_collapse_measures_a_fixed_subset_of_joint_embedding_runs_only():
    """Its batch is ``dataset.subset(samples, seed)`` (the draw it always made); a module whose ``family`` is not
    ``joint`` (a flow method: its own feature extractor) is left alone, without importing any method class."""
    from selfsup.data.datasets import ImageDataset
    from selfsup.instruments import RankCollapse

    n = 40
    data = ImageDataset("numbered", torch.arange(n).view(n, 1, 1, 1), torch.arange(n), n, (0.0,), (1.0,))
    g = torch.Generator().manual_seed(3)
    expected = torch.randperm(n, generator=g)[:16].sort().values.tolist()
    joint = RankCollapse(every_n_steps=1, samples=16, seed=3, dataset=data)
    joint.setup(SimpleNamespace(), SimpleNamespace(family="joint"), "fit")
    assert joint._batch.images.flatten().tolist() == expected
    flow = RankCollapse(every_n_steps=1, samples=16, seed=3, dataset=data)
    flow.setup(SimpleNamespace(), SimpleNamespace(family="flow"), "fit")
    assert flow._batch is None


def test_a_run_of_spikes_is_one_console_line_and_every_step_an_event(tmp_path, capsys):
    from selfsup.instruments.dynamics import GradientNorms

    cb = GradientNorms(every_n_steps=1, spike_k=1.0, spike_window=5, spike_min_history=2, run_dir=tmp_path)
    cb.groups = {"all": []}
    cb.detectors = {"all": SpikeDetector(k=1.0, window=5, min_history=2)}
    series = [1.0, 1.1, 0.9, 1.0, 9.0, 9.5, 10.0, 1.0, 1.0, 1.0, 1.0, 1.0, 30.0]  # a run of 3, later one more
    cb.buffer = [(step, torch.tensor([v])) for step, v in enumerate(series)]
    cb.flush(SimpleNamespace(is_global_zero=True))
    steps = [e["step"] for e in read_events(tmp_path / "events.jsonl")]
    assert steps[:3] == [4, 5, 6] and steps[-1] == 12
    lines = [line for line in capsys.readouterr().err.splitlines() if "grad_spike" in line]
    assert len(lines) == len([s for i, s in enumerate(steps) if i == 0 or steps[i - 1] != s - 1])
    assert "at step 4" in lines[0] and "at step 12" in lines[-1]


def test_step_instruments_log_a_methods_own_scalars_at_their_steps():
    from selfsup.instruments import StepInstruments
    from selfsup.step import StepOutput

    logged = []
    logger = SimpleNamespace(log_metrics=lambda metrics, step: logged.append((step, metrics)))
    trainer = SimpleNamespace(is_global_zero=True, loggers=[logger], global_step=0)
    cb = StepInstruments(every_n_steps=2)
    for step in range(4):
        trainer.global_step = step + 1  # on_train_batch_end runs after the optimiser step
        signs = {"dino_center_norm": torch.tensor(float(step))}
        out = {"loss": torch.tensor(1.0), "step": StepOutput(torch.tensor(1.0), instruments=signs)}
        cb.on_train_batch_end(trainer, None, out, None, step)
    assert logged == [(0, {"instruments/dino_center_norm": 0.0}), (2, {"instruments/dino_center_norm": 2.0})]
