"""The training step's speed levers and the MFU benchmark: FLOP count, batched views, attention paths, compile."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from selfsup.methods import moco_v3 as moco_module
from selfsup.methods.base import encode_views, has_batch_statistics
from selfsup.methods.compiled import compile_step, compile_step_modules
from selfsup.models import vit
from ssl_helpers import checks_in_one_fresh_interpreter, mfu_benchmark, random_views, tiny_config, tiny_method

def test_flop_count_of_a_moco_v3_vit_step_matches_a_hand_count():
    model = tiny_method("moco_v3")  # vit_micro (D 128, depth 4, 4 heads), 8x8 patch 2, heads 128-64-64-32 / 32-64-32
    c = model.cfg.method
    B, D, depth, n = 16, 128, 4, 17  # images per view, width, blocks, tokens (16 patches + class)
    blocks = depth * (2 * n * D * D * (3 + 1 + 4 + 4) + 2 * 2 * n * n * D)  # qkv, proj, fc1, fc2; q·kᵀ and a·v
    patch = 16 * 2 * (2 * 2) * D  # frozen projection (stop_grad_conv1): forward only
    proj = 2 * (D * c.proj_hidden_dim + c.proj_hidden_dim**2 + c.proj_hidden_dim * c.dim)
    pred = 2 * (c.dim * c.pred_hidden_dim + c.pred_hidden_dim * c.dim)
    per_view = B * (patch + 3 * (blocks + proj + pred) + patch + blocks + proj)  # online fwd+bwd, momentum fwd
    loss = 2 * (2 * B * B * c.dim) * 2  # two directions: q·kᵀ forward and its gradient w.r.t. q
    hand = 2 * per_view + loss

    step = mfu_benchmark().SelfsupStep(model.cfg, model.info, torch.device("cpu"), __import__("contextlib").nullcontext)
    counted, by_op = mfu_benchmark().count_flops(step, random_views(B))
    assert abs(counted - hand) / hand < 0.05, (counted, hand, by_op)


def test_fused_attention_is_counted_like_the_plain_product():
    """FlopCounterMode has no formula for CPU's fused attention; the benchmark's equals the bmm count."""
    from torch.utils.flop_counter import FlopCounterMode

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 17, 16, generator=g, requires_grad=True) for _ in range(3))
    counts = []
    try:
        for mode in ("sdpa", "matmul"):
            vit.set_attention(mode)
            counter = FlopCounterMode(display=False, custom_mapping=mfu_benchmark().cpu_attention_formulas())
            with counter:
                torch.autograd.grad(vit.attention(q, k, v).sum(), (q, k, v))
            counts.append(counter.get_total_flops())
    finally:
        vit.set_attention("sdpa")
    assert counts[0] == counts[1] == 3 * 2 * 2 * (2 * 3) * 17 * 17 * 16  # forward q·kᵀ, a·v; backward twice that

def test_batched_views_give_the_per_view_loss_and_gradients_for_the_vit(monkeypatch):
    model = tiny_method("moco_v3")
    twin = copy.deepcopy(model)
    views = random_views(16)
    calls = []
    backbone_forward = type(model.backbone).forward

    def counting(self, x):
        calls.append(x.shape[0])
        return backbone_forward(self, x)

    monkeypatch.setattr(type(model.backbone), "forward", counting)
    loss = model.forward_views(views).loss
    assert calls == [32, 32]  # online and momentum backbone: each view pair in one call
    loss.backward()
    monkeypatch.setattr(moco_module, "encode_views", lambda enc, vs: [enc(v) for v in vs])
    ref = twin.forward_views(views).loss
    ref.backward()
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        if p.grad is not None or q.grad is not None:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_batchnorm_backbones_keep_one_call_per_view():
    bn = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten())
    assert has_batch_statistics(bn) and not has_batch_statistics(tiny_method("moco_v3").backbone)
    calls = []
    bn.register_forward_pre_hook(lambda m, args: calls.append(args[0].shape[0]))
    views = random_views(8)
    out = encode_views(bn.train(), views)
    assert calls == [8, 8]
    torch.testing.assert_close(out[1], bn(views[1]))  # the second view normalised by its own statistics


@pytest.mark.parametrize("tokens", [5, 17, 50])
def test_every_attention_path_matches_the_reference(tokens):
    g = torch.Generator().manual_seed(tokens)
    q, k, v = (torch.randn(3, 4, tokens, 16, generator=g, requires_grad=True) for _ in range(3))
    ref = (q @ k.transpose(-2, -1) / 4.0).softmax(-1) @ v  # softmax(q kᵀ / √16) v
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    try:
        for mode in vit.ATTENTION_MODES:
            vit.set_attention(mode)
            out = vit.attention(q, k, v)
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5, msg=mode)
            for a, b in zip(torch.autograd.grad(out.square().sum(), (q, k, v)), ref_grads):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=mode)
    finally:
        vit.set_attention("sdpa")
    with pytest.raises(ValueError, match="attention must be one of"):
        vit.set_attention("flash")


COMPILED_CHECKS = ["check_trainer_compile", "check_mfu_compile"]


@pytest.fixture(scope="module")
def compiled_checks(tmp_path_factory) -> dict:
    """The checks that run a compiled backward, in one new interpreter: after a compiled backward this process could
    not fork (ssl_helpers.in_fresh_interpreter); one interpreter's start for both (checks_in_one_fresh_interpreter)."""
    return checks_in_one_fresh_interpreter("test_mfu", COMPILED_CHECKS, tmp_path_factory.mktemp("compiled"))


@pytest.mark.spawn
def test_trainer_compile_trains_a_few_steps_on_cpu(compiled_checks):
    """trainer.compile=true through the engine (aot_eager backend: graph capture and AOTAutograd's backward
    without the minutes of C++ code generation inductor needs on 2 cores); losses match eager. In a new
    interpreter (``compiled_checks``)."""
    assert compiled_checks["check_trainer_compile"] is None, compiled_checks["check_trainer_compile"]


def check_trainer_compile(tmp: str) -> None:
    tmp_path = Path(tmp)
    from selfsup.engine import PretrainData, make_trainer
    from selfsup.data.datasets import load_dataset
    from selfsup.methods.build import build_method, data_info

    losses = {}
    for compiled in (False, True):
        cfg = tiny_config("moco_v3", trainer={"compile": compiled, "compile_backend": "aot_eager",
                                             "limit_train_batches": 3, "log_every_n_steps": 1},
                          model={"backbone": "vit_nano"},  # tracing time grows with depth; 2 blocks show the path
                          output_dir=str(tmp_path), name=f"c{int(compiled)}")
        train = load_dataset(cfg.data, "train")
        model = build_method(cfg, data_info(cfg, train))
        trainer = make_trainer(cfg, tmp_path / f"c{int(compiled)}")
        trainer.fit(model, datamodule=PretrainData(cfg, train))
        assert trainer.global_step == 3
        assert ("forward_views" in vars(model)) == compiled  # the whole step forward, not module by module
        losses[compiled] = [float(r) for r in _column(tmp_path / f"c{int(compiled)}" / "metrics.csv", "train/loss")]
    assert len(losses[True]) == 3
    torch.testing.assert_close(torch.tensor(losses[True]), torch.tensor(losses[False]), rtol=1e-4, atol=1e-5)


def _column(path: Path, key: str) -> list[str]:
    import csv

    with path.open() as f:
        return [r[key] for r in csv.DictReader(f) if r.get(key)]


def test_fused_adamw_gives_the_per_parameter_update():
    model = tiny_method("byol")
    twin = copy.deepcopy(model)
    fused = model.configure_optimizers()
    twin.cfg.optim.fused = False
    plain = twin.configure_optimizers()
    assert fused.defaults["fused"] and not plain.defaults["fused"]
    for step in range(3):  # the same gradients into both (Adam would amplify rounding in near-zero gradients)
        model.forward_views(random_views(16, step)).loss.backward()
        for p, q in zip(model.parameters(), twin.parameters()):
            q.grad = None if p.grad is None else p.grad.clone()
        for opt in (fused, plain):
            for group in opt.param_groups:
                group["lr"] = 1e-2 * (step + 1)
            opt.step()
            opt.zero_grad()
        for (name, p), q in zip(model.named_parameters(), twin.parameters()):
            if p.requires_grad:  # (the EMA targets move in forward_views, which only the model ran)
                torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def test_compile_keeps_parameter_names():
    for compile in (compile_step, compile_step_modules):
        model = tiny_method("moco_v3")
        names, keys = [n for n, _ in model.named_parameters()], list(model.state_dict())
        compile(model)
        assert [n for n, _ in model.named_parameters()] == names and list(model.state_dict()) == keys


def test_mfu_benchmark_quick_writes_its_json(tmp_path):
    out = tmp_path / "mfu.json"
    assert mfu_benchmark().main(["--quick", "--methods", "moco_v3", "--threads", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    r = report["results"]["moco_v3/preset"]
    assert report["peak_flops"] > 0 and r["selfsup"]["flops_per_step"] > 0
    assert 0 < r["selfsup"]["mfu_best"] < 1.5
    assert 0 < r["selfsup"]["mfu_cpu_time_best"] < 1.5 and report["peak_flops_per_cpu_s"] > 0
    # the kernels doing the counted FLOPs take part of the step; FLOPs over their time alone bound MFU
    kernels = r["selfsup"]["flop_kernels"]
    assert 0 < kernels["flop_kernels_ms"] < kernels["profiled_step_ms"]
    share = kernels["flop_kernels_ms"] / kernels["profiled_step_ms"]
    assert kernels["flop_kernels_share"] == pytest.approx(share)
    assert r["selfsup"]["mfu_ceiling"] == pytest.approx(r["selfsup"]["mfu_best"] / share)
    assert report["settings"]["host_allocator"] == "cached"
    if importlib.util.find_spec("lightly") is not None:
        assert r["lightly"]["flops_per_step"] > 0 and r["speedup_vs_lightly_best"] > 0
        assert r["speedup_vs_lightly_bound"] == pytest.approx(1 / r["lightly"]["flop_kernels"]["flop_kernels_share"])


@pytest.mark.spawn
def test_mfu_benchmark_compile_counts_flops_on_the_eager_twin_and_times_the_compiled_step(compiled_checks):
    """``mfu.py --compile`` (it crashed: FlopCounterMode is a dispatch mode torch.compile refuses to trace under):
    the FLOPs are the eager step's, the timed step is the compiled one. In a fresh interpreter (``compiled_checks``:
    compiled backward)."""
    assert compiled_checks["check_mfu_compile"] is None, compiled_checks["check_mfu_compile"]


def check_mfu_compile(tmp: str) -> None:
    out = Path(tmp) / "mfu.json"
    common = ["--quick", "--methods", "moco_v3", "--threads", "1", "--no-lightly"]
    assert mfu_benchmark().main(common + ["--out", str(out.with_name("eager.json"))]) == 0
    assert mfu_benchmark().main(common + ["--compile", "--set", "trainer.compile_backend=aot_eager",
                                          "--out", str(out)]) == 0
    eager = json.loads(out.with_name("eager.json").read_text())["results"]["moco_v3/preset"]["selfsup"]
    report = json.loads(out.read_text())
    compiled = report["results"]["moco_v3/preset"]["selfsup"]
    assert compiled["flops_per_step"] == eager["flops_per_step"] > 0
    assert compiled["step_ms_best"] > 0 and report["settings"]["compile"] is True


def test_flop_count_of_a_self_flow_step_matches_a_hand_count():
    """Self-Flow on the micro SiT (D 64, depth 4, 2 heads; 8x8 patch 2: 16 tokens): the student's forward
    and backward with its two levels per sample, the head, and the EMA teacher's forward of blocks 1..k."""
    from contextlib import nullcontext

    from selfsup.config import load_run_config
    from selfsup.methods.base import DataInfo

    cfg = load_run_config("self-flow-digits", ["data.batch_size=16"])
    step = mfu_benchmark().FlowStep(cfg, DataInfo(1, 8, (0.5,), (0.5,), 10), torch.device("cpu"), nullcontext)
    B, N, D, depth, k, P = 16, 16, 64, 4, step.model.k, 4  # P: p·p·C values per token
    assert k == 3 and step.model.student.num_tokens == N and step.model.student.hidden == D
    attention = 2 * 2 * N * N * D  # per sample and block: q·kᵀ and a·v
    # per token, forward: qkv 3D², proj D², MLP 8D²; the conditioning (timestep MLP, adaLN 6D² per block,
    # final adaLN 2·D²·2) once per level: Self-Flow's two levels per sample (t, s), gathered to the tokens
    block_tok = 2 * D * D * (3 + 1 + 8)
    K = 2
    student = (B * N * (2 * (2 * P * D)  # patch embedding: forward + weight gradient (its input needs none)
                        + 3 * depth * block_tok + 3 * (2 * D * P)  # blocks, final linear
                        + 3 * 2 * (2 * D * D + 2 * D * D))  # head D → 2D → D
               + B * K * (2 * (2 * 256 * D) + 3 * (2 * D * D)  # timestep MLP (per level)
                          + 3 * depth * (2 * D * 6 * D) + 3 * (2 * D * 2 * D))  # adaLN of the blocks, final adaLN
               + 2 * B * N * (2 * K * 6 * D * depth + 2 * K * 2 * D)  # one-hot selection of the levels' rows
               + 3 * depth * B * attention)
    teacher = (B * N * 2 * P * D + B * (2 * 256 * D + 2 * D * D)  # patch and timestep embedding (one level each)
               + k * (B * 2 * 6 * D * D + B * N * 2 * D * D * 12 + B * attention))  # blocks 1..k, adaLN per sample
    hand = student + teacher
    g = torch.Generator().manual_seed(0)
    batch = (torch.rand(B, 1, 8, 8, generator=g) * 2 - 1, torch.randint(0, 10, (B,), generator=g))
    counted, by_op = mfu_benchmark().count_flops(step, batch)
    assert abs(counted - hand) / hand < 0.05, (counted, hand, by_op)
    assert any("attention" in op for op in by_op)  # CPU's fused attention is counted too


def test_mfu_benchmark_quick_covers_the_flow_steps(tmp_path):
    out = tmp_path / "mfu.json"
    assert mfu_benchmark().main(["--quick", "--methods", "self_flow,flow_matching", "--threads", "1",
                                 "--out", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"self_flow/preset", "flow_matching/preset"}
    for r in results.values():
        s = r["selfsup"]
        assert r["preset"].endswith("-digits") and "lightly" not in r
        assert s["flops_per_step"] > 0 and s["flops_per_image"] * 16 == s["flops_per_step"]
        assert 0 < s["mfu_best"] <= 1 and 0 < s["mfu_cpu_time_best"] <= 1 and s["augment_ms"] > 0
    # the teacher's forward and the head: Self-Flow's step costs more than plain flow matching's
    assert (results["self_flow/preset"]["selfsup"]["flops_per_step"]
            > results["flow_matching/preset"]["selfsup"]["flops_per_step"])


@pytest.mark.spawn
def test_levers_benchmark_quick_puts_a_lever_beside_the_baseline(tmp_path):
    """levers.py: the baseline and each lever in fresh mfu.py processes, per-round ratios in its JSON."""
    import benchmarks.levers as levers

    out = tmp_path / "levers.json"
    assert levers.main(["--quick", "--levers", "plain attention=--attention matmul", "--out", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"baseline", "plain attention"}
    assert results["plain attention"]["flags"] == ["--attention", "matmul"]
    for r in results.values():
        assert r["step_ms_median"] > 0 and len(r["speedup_each_round"]) == 1
    assert results["baseline"]["speedup_median"] == 1.0
    with pytest.raises(SystemExit):
        levers.main(["--quick", "--levers", "no equals sign"])


def test_mfu_benchmark_on_cuda_without_a_gpu_stops_with_one_line(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert mfu_benchmark().main(["--device", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--device cuda: no CUDA GPU is visible" in err and "--device cpu" in err


def test_a_gpu_run_is_vit_s16_in_bf16_with_compiled_beside_eager():
    """What ``mfu.py --device cuda`` runs, checked without a GPU: the ViT-S/16 224 px recipe, bf16 autocast,
    the compiled step beside the eager one; the recipe's optimiser is fused AdamW and its ViT stays NCHW."""
    import argparse

    from selfsup.memory_format import resolve_memory_format
    from selfsup.models.vit import VisionTransformer

    bench = mfu_benchmark()
    args = argparse.Namespace(quick=False, recipe=None, compile=False, compare_compile=False, memory_format="auto",
                              set=None, batch_size=128)
    bench.device_defaults(args, torch.device("cuda"))
    assert args.recipe == "vit_s16_224" and args.bf16 and args.compare_compile
    assert bench.autocast_for(torch.device("cuda"), args)().fast_dtype == torch.bfloat16
    cfg = bench.selfsup_config("moco_v3", "fashion-mnist", "preset", args)
    assert (cfg.model.backbone, cfg.model.patch_size, cfg.data.image_size) == ("vit_small", 16, 224)
    assert cfg.optim.name == "adamw" and cfg.optim.fused
    vit = VisionTransformer(image_size=32, patch_size=16, embed_dim=64, depth=1, num_heads=2)
    assert resolve_memory_format("auto", vit, torch.device("cuda")) == torch.contiguous_format
    cpu = argparse.Namespace(quick=False, recipe=None, compile=False, compare_compile=False)
    bench.device_defaults(cpu, torch.device("cpu"))
    assert cpu.recipe is None and not cpu.bf16 and not cpu.compare_compile
