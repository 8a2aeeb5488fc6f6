"""trainer.memory_format: which format auto picks, the same step in either format, a channels-last run end to end."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

import selfsup.engine as engine
from selfsup.config import load_run_config
from selfsup.export import load_exported
from selfsup.memory_format import match_optimizer_state, resolve_memory_format
from selfsup.methods import DataInfo
from selfsup.methods.build import build_method
from selfsup.models.backbones import build_backbone
from ssl_helpers import RESUME, StopAfterEpoch, assert_same_run, ckpt, mfu_benchmark, raises_user_error, tiny_config

CL, NCHW = torch.channels_last, torch.contiguous_format
RESNET = {"backbone": "resnet18", "small_stem": True}


def channels_last(t: torch.Tensor) -> bool:
    """Laid out NHWC (and not merely both, as a tensor with one channel or a 1×1 kernel is)."""
    return t.is_contiguous(memory_format=CL) and not t.is_contiguous()


def test_auto_is_channels_last_only_for_a_cnn_on_a_cuda_device():
    vit = build_backbone("vit_micro", in_chans=3, image_size=8, patch_size=2)
    resnet = build_backbone("resnet18", in_chans=3, image_size=8, small_stem=True)
    timm_cnn = build_backbone("timm:resnet10t", in_chans=3, image_size=8)
    for cnn in (resnet, timm_cnn):
        assert resolve_memory_format("auto", cnn, torch.device("cuda")) is CL
        assert resolve_memory_format("auto", cnn, "cuda:1") is CL
        assert resolve_memory_format("auto", cnn, "cpu") is NCHW
    for device in ("cpu", "cuda"):  # the ViT's patch projection alone (kernel == stride) does not count
        assert resolve_memory_format("auto", vit, device) is NCHW
        assert resolve_memory_format("channels_last", vit, device) is CL
        assert resolve_memory_format("contiguous", resnet, device) is NCHW


def test_a_bad_memory_format_is_a_one_line_user_error():
    with raises_user_error("trainer.memory_format='nhwc'", "channels_last"):
        tiny_config("moco_v3", trainer={"memory_format": "nhwc"})


def test_a_flow_run_refuses_channels_last_in_one_line_and_makes_no_folder(tmp_path):
    """A SiT's only convolution is its patch projection (auto keeps it NCHW): channels_last is refused for flow runs
    (exit 2, one line) before a run folder is made."""
    from ssl_helpers import assert_user_error, run_cli

    code, _, err = run_cli("pretrain", "flow-matching-digits", "trainer.memory_format=channels_last",
                           "trainer.accelerator=cpu", f"output_dir={tmp_path}", "name=r")
    assert_user_error(code, err, "trainer.memory_format=channels_last", "flow model", "auto or contiguous")
    assert not (tmp_path / "r").exists()


def _resnet_method(method: str, channels: int = 3):
    cfg = tiny_config(method, model=RESNET)
    return build_method(cfg, DataInfo(channels, 8, (0.5,) * channels, (0.25,) * channels))


def _step(model, views, memory_format, dtype):
    """Loss and gradients of one ``forward_views`` of a copy of ``model`` in ``memory_format`` and ``dtype``."""
    model = copy.deepcopy(model).to(dtype)
    model.use_memory_format(memory_format)
    model.momentum = 0.99
    loss = model.forward_views([v.to(dtype).contiguous(memory_format=memory_format) for v in views]).loss
    loss.backward()
    return model, loss.detach(), {k: p.grad for k, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("method", ["moco_v3", "simsiam"])
def test_channels_last_step_gives_the_same_loss_and_gradients(method):
    torch.manual_seed(0)
    model = _resnet_method(method)
    g = torch.Generator().manual_seed(1)
    views = [torch.randn(8, 3, 8, 8, generator=g) for _ in range(2)]
    # float64: the same function to rounding (the layouts change only the order of sums)
    _, ref_loss, ref = _step(model, views, NCHW, torch.float64)
    nhwc, loss, grads = _step(model, views, CL, torch.float64)
    online = nhwc.backbone.layer1[0].conv1.weight
    assert channels_last(online) and channels_last(online.grad)  # the gradient follows the weight's layout
    if method == "moco_v3":  # the momentum copy as well: the EMA pairs keep equal strides
        assert channels_last(nhwc.momentum_backbone.layer1[0].conv1.weight)
    assert grads.keys() == ref.keys() and len(ref) > 20
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
    for k, grad in ref.items():
        torch.testing.assert_close(grads[k], grad, rtol=1e-9, atol=1e-11, msg=lambda m: f"{k}: {m}")
    # float32 (the fast kernels): within fp32 rounding of each gradient's scale (BN over 8 samples amplifies it)
    _, loss32, grads32 = _step(model, views, CL, torch.float32)
    torch.testing.assert_close(loss32, ref_loss.float(), rtol=1e-5, atol=1e-5)
    for k, grad in ref.items():
        torch.testing.assert_close(grads32[k], grad.float(), rtol=1e-4, atol=1e-4 * grad.abs().max().item() + 1e-7,
                                   msg=lambda m: f"{k}: {m}")


def test_views_are_handed_over_in_the_method_format():
    model = _resnet_method("simsiam")
    model.trainer = SimpleNamespace(training=True, global_step=0)
    images = torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8)
    views, _ = model.on_after_batch_transfer((images, torch.zeros(4)), 0)
    assert all(v.is_contiguous() for v in views)
    model.use_memory_format(CL)
    cl_views, _ = model.on_after_batch_transfer((images, torch.zeros(4)), 0)
    assert all(channels_last(v) for v in cl_views)
    for a, b in zip(views, cl_views):  # the same augmentation, only laid out differently
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("fused", [True, False])
def test_optimizer_state_from_the_other_format_takes_the_parameter_layout(fused):
    """Resuming a run's checkpoint in the other format (auto on another device): CUDA's fused AdamW refuses
    parameters and states of different strides (CPU falls back), so the state takes the parameter's."""
    conv = torch.nn.Conv2d(3, 4, 3)
    opt = torch.optim.AdamW(conv.parameters(), lr=0.1, fused=fused)
    conv(torch.randn(2, 3, 5, 5)).sum().backward()
    opt.step()  # NCHW state, as a checkpoint of a contiguous run holds it
    state = {k: v.clone() for k, v in opt.state[conv.weight].items()}
    conv.to(memory_format=CL)  # the resumed run is channels-last
    match_optimizer_state(opt)
    for k, v in opt.state[conv.weight].items():
        torch.testing.assert_close(v, state[k], rtol=0, atol=0)
        if v.dim() == 4:
            assert v.stride() == conv.weight.stride()
    conv(torch.randn(2, 3, 5, 5).contiguous(memory_format=CL)).sum().backward()
    opt.step()
    assert channels_last(conv.weight) and torch.isfinite(conv.weight).all()


# A ResNet-18 MoCo v3 (momentum backbone, BatchNorm) trained channels-last: 2 epochs of 3 batches of 16 (the layout
# kept, the export and the exact resume do not depend on the batch; 16 still gives BatchNorm a batch statistic)
CL_RUN = RESUME + ["data.batch_size=16", "model.backbone=resnet18", "model.small_stem=true",
                   "trainer.memory_format=channels_last"]


@pytest.mark.train
def test_channels_last_run_trains_exports_and_resumes_exactly(tmp_path):
    def cfg(name):
        return load_run_config("moco-v3-vit-digits", CL_RUN + [f"output_dir={tmp_path}", f"name={name}"])

    straight = engine.pretrain(cfg("A"))
    state = ckpt(straight)["state_dict"]
    assert channels_last(state["backbone.layer1.0.conv1.weight"])  # the checkpoint keeps the trained layout
    assert channels_last(state["momentum_backbone.layer1.0.conv1.weight"])
    backbone, meta = load_exported(straight / "backbone.safetensors")  # a plain NCHW ResNet-18 loads it
    assert meta["backbone"] == "resnet18" and backbone.layer1[0].conv1.weight.is_contiguous()
    for k, v in load_file(str(straight / "backbone.safetensors")).items():
        torch.testing.assert_close(v, state[f"backbone.{k}"], rtol=0, atol=0)
    run_b = engine.pretrain(cfg("B"), callbacks=[StopAfterEpoch()])
    assert ckpt(run_b)["global_step"] == 3
    engine.pretrain(engine.load_run(run_b), resume=run_b)
    assert_same_run(straight, run_b)


def test_mfu_benchmark_times_a_channels_last_resnet_step(tmp_path):
    import json

    out = tmp_path / "mfu.json"
    argv = ["--quick", "--methods", "simsiam", "--threads", "1", "--memory-format", "channels_last",
            "--set", "model.backbone=resnet18", "--set", "model.small_stem=true", "--out", str(out)]
    assert mfu_benchmark().main(argv) == 0
    report = json.loads(out.read_text())
    assert report["settings"]["memory_format"] == "channels_last"
    assert report["settings"]["overrides"] == ["model.backbone=resnet18", "model.small_stem=true"]
    r = report["results"]["simsiam/preset"]
    assert r["selfsup"]["flops_by_op"].get("aten.convolution", 0) > 0 and "lightly" not in r
