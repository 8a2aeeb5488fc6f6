"""Model-FLOP utilisation (MFU) of each method's training step, next to the same step built from lightly.

For every method and head width the script builds the model, counts the FLOPs of one training step
with ``torch.utils.flop_counter.FlopCounterMode`` (forward + backward of the online branches, forward
of the momentum / target branches, the loss: matrix products, convolutions and attention, the
convention MFU uses), times the step, and measures this machine's peak in the same process (a large
fp32 matmul on the same threads; bf16 on a GPU). It prints and writes images/s, achieved FLOP/s and
MFU = achieved / peak.

The timed step is the bare training step on ready views: ``forward_views`` (EMA update, forwards,
loss), ``loss.backward()``, ``optimizer.step()``, ``zero_grad``. The on-device augmentation that makes
the views is timed on its own (``augment_ms``) and folded into a second, end-to-end MFU.
The peer step is the same algorithm assembled from lightly's building blocks (its projection /
prediction heads of the same widths, its losses, ``update_momentum``), the same backbone and the same
views; step and peer alternate ``--reps`` times so drift in machine load hits both.

    python -m benchmarks.mfu                          # the four methods (preset + 1024-wide heads) and the flow steps
    python -m benchmarks.mfu --methods moco_v3 --heads wide --reps 5
    python -m benchmarks.mfu --quick                  # smoke test (digits, batch 16, 1 step)
    python -m benchmarks.mfu --recipe vit_s16_224     # GPU: MoCo v3 ViT-S/16 224 px on a synthetic batch, bf16
    python -m benchmarks.mfu --methods self_flow,flow_matching   # the flow steps (SiT; no lightly peer)

The flow methods (``self_flow``, ``flow_matching``; presets ``self-flow-fmnist`` / ``flow-matching-fmnist``)
time the bare step of ``FlowStep``: ``forward_flow`` on a batch the method prepared itself (its
``on_after_batch_transfer``: uint8 → [−1, 1], fitted; that preparation is the row's ``augment_ms``),
backward, the preset's gradient clipping, the optimiser, ``zero_grad`` and the EMA update. Their FLOPs
include the EMA teacher's forward (Self-Flow), which runs inside the loss. ``--heads`` does not apply.

Flags that change the step (``--compile``, ``--threads``, ``--attention``, ``--memory-format``) are the levers
measured in the README's MFU section; ``--set`` overrides the selfsup step's config (a ResNet:
``--set model.backbone=resnet18 --set model.small_stem=true``; lightly's twin is a ViT, so no peer row);
``--profile`` prints the profiler's table of the step (and its ``copy_`` count). ``--compare-compile`` times the
step compiled by ``trainer.compile`` beside the eager one (compile time, break-even step); ``--methods dino,mae``
adds DINO's multi-crop and MAE's steps (no peer); ``--device cuda`` is the GPU run (ViT-S/16 224 px, bf16,
compiled beside eager).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import statistics
import sys
import time
import warnings
from contextlib import nullcontext
from functools import partial

import torch

from benchmarks.harness import RESULTS, machine_info, mean_ms, summarize, timed, write_report

METHODS = ("moco_v3", "byol", "simsiam", "simclr")
FLOW_METHODS = ("self_flow", "flow_matching")  # SiT steps (selfsup.flow); preset heads only, no lightly peer
# more joint-embedding / masked steps, preset heads only, no lightly peer: DINO's multi-crop step (2 global crops and
# the preset's local crops, two resolutions in one step), MAE's (the encoder on the kept 25% of the patches)
OTHER_METHODS = ("dino", "ibot", "mae")
PRESETS = {  # the CPU recipes (Fashion-MNIST; digits where the Fashion-MNIST files are absent)
    "moco_v3": "moco-v3-vit-{}", "byol": "byol-{}", "simsiam": "simsiam-{}", "simclr": "simclr-{}",
    "dino": "dino-{}", "ibot": "ibot-{}", "mae": "mae-{}",
    "self_flow": "self-flow-{}", "flow_matching": "flow-matching-{}",
}
# 1024-wide heads (lightly's default MoCo/BYOL widths scaled to the micro ViT): hidden 1024, output 256
# (SimSiam keeps its bottleneck predictor: 1024 -> 256 -> 1024; SimCLR its 128-d output).
WIDE_HEADS = {
    "moco_v3": dict(proj_hidden_dim=1024, dim=256, pred_hidden_dim=1024),
    "byol": dict(proj_hidden_dim=1024, dim=256, pred_hidden_dim=1024),
    "simsiam": dict(proj_hidden_dim=1024, dim=1024, pred_hidden_dim=256),
    "simclr": dict(proj_hidden_dim=1024, dim=128),
}


def measure_peak(device: torch.device, dtype: torch.dtype, size: int, reps: int) -> tuple[float, float]:
    """Best FLOP/s of ``size``-square matmuls (2·n³ FLOPs each) on the current threads / device, per
    second of wall time and per second of process CPU time (all threads; the latter is less disturbed
    by other processes sharing the cores)."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    c = torch.empty(size, size, device=device, dtype=dtype)
    inner = 10 if device.type == "cuda" else 1

    def matmuls():
        for _ in range(inner):
            torch.mm(a, b, out=c)

    times = timed(matmuls, reps, warmup=1, device=device)
    best = min(w for w, _ in times) / inner
    best_cpu = min(max(cpu, 1e-9) for _, cpu in times) / inner
    return 2 * size**3 / best, 2 * size**3 / best_cpu


# ---------------------------------------------------------------------------------------- the selfsup step
def selfsup_config(method: str, dataset: str, heads: str, args):
    from selfsup.config import load_run_config

    overrides = ["trainer.seed=0", f"data.batch_size={args.batch_size}", f"trainer.memory_format={args.memory_format}"]
    overrides += args.set or []
    if heads == "wide" and method in WIDE_HEADS:
        overrides += [f"method.{k}={v}" for k, v in WIDE_HEADS[method].items()]
    return load_run_config(preset_name(method, dataset, args), overrides)


def preset_name(method: str, dataset: str, args) -> str:
    if args.recipe == "vit_s16_224":
        return "moco-v3-vit-s-imagenet"  # ViT-S/16, 224 px, 4096-wide heads, stop-grad patch projection
    return PRESETS[method].format("fmnist" if dataset == "fashion-mnist" else "digits")


class SelfsupStep:
    """selfsup's own step: the method's ``forward_views`` + backward + its configured optimiser; with
    ``trainer.compile`` the step forward compiled whole, as ``selfsup pretrain`` does (``compile_step``), or
    module by module (``compile_scope="modules"``: the earlier behaviour, for comparison)."""

    name = "selfsup"

    def __init__(self, cfg, info, device, autocast, compile_scope: str = "step"):
        from selfsup.methods.build import build_method

        self.model = build_method(cfg, info).to(device).train()
        from selfsup.memory_format import resolve_memory_format
        self.model.use_memory_format(resolve_memory_format(cfg.trainer.memory_format, self.model.backbone, device))
        if args_compile(cfg):
            from selfsup.methods.compiled import compile_step, compile_step_modules
            if compile_scope == "modules":
                compile_step_modules(self.model, cfg.trainer.compile_backend)
            else:
                compile_step(self.model, cfg.trainer.compile_backend, cfg.trainer.compile_mode)
        self.opt = self.model.configure_optimizers()
        for group in self.opt.param_groups:  # the schedule's peak lr, held constant
            group["lr"] = cfg.optim.base_lr * cfg.data.batch_size / 256 * group["lr_scale"]
        self.model.momentum = getattr(cfg.method, "momentum", 0.0)
        self.autocast = autocast

    def loss(self, views):
        if self.model.memory_format != torch.contiguous_format:  # as on_after_batch_transfer hands them over
            from selfsup.memory_format import images_in
            views = [images_in(v, self.model.memory_format) for v in views]
        with self.autocast():  # (MAE's noise, iBOT's masks: drawn before the step, as in training_step)
            return self.model.forward_views(views, **self.model.step_draws(views)).loss

    def __call__(self, views):
        self.loss(views).backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def args_compile(cfg) -> bool:
    return bool(getattr(cfg.trainer, "compile", False))


# ---------------------------------------------------------------------------------------- the flow step
class FlowStep:
    """A flow method's step (``selfsup.methods.flow``) as Lightning runs it, without Lightning:
    ``forward_flow`` (student; Self-Flow's EMA teacher and head) + backward, the preset's gradient
    clipping, the optimiser at the schedule's peak lr (held constant), ``zero_grad``, then the EMA update
    the method makes after each optimiser step (``update_ema``)."""

    name = "selfsup"

    def __init__(self, cfg, info, device, autocast):
        from selfsup.methods.build import build_method
        from selfsup.schedules import scaled_lr

        torch.manual_seed(cfg.trainer.seed)
        self.model = build_method(cfg, info).to(device).train()
        if cfg.trainer.compile:
            from selfsup.methods.compiled import compile_step
            compile_step(self.model, cfg.trainer.compile_backend, cfg.trainer.compile_mode)
        self.opt = self.model.configure_optimizers()
        lr = scaled_lr(cfg.optim.base_lr, cfg.data.batch_size, cfg.optim.lr_scaling)
        for group in self.opt.param_groups:
            group["lr"] = lr * group["lr_scale"]
        self.params = [p for g in self.opt.param_groups for p in g["params"]]
        self.clip, self.seed, self.autocast, self.steps = cfg.trainer.gradient_clip_val, cfg.trainer.seed, autocast, 0

    def prepare(self, images, labels):
        """The method's own batch preparation (uint8 → [−1, 1], fitted to the model size)."""
        return self.model.on_after_batch_transfer((images, labels), 0)

    def loss(self, batch):
        x0, labels = batch
        # noise, t, masks: per step, as in fit
        self.model.rng(x0.device).manual_seed(self.seed * 1_000_003 + self.steps)
        with self.autocast():
            return self.model.forward_flow(x0, self.model.class_labels(labels)).loss

    def __call__(self, batch):
        self.loss(batch).backward()
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.steps += 1
        self.model.update_ema(self.steps)


# ---------------------------------------------------------------------------------------- the lightly step
class LightlyStep:
    """The same algorithm from lightly's building blocks: its heads (same widths), losses and EMA update.

    Written as lightly's own examples write a step: each view forwarded on its own, keys / targets under
    ``no_grad``, ``update_momentum`` on backbone and projection head. The backbone is the same ViT.
    """

    name = "lightly"

    def __init__(self, method: str, cfg, backbone: torch.nn.Module, device, autocast):
        from lightly.loss import NegativeCosineSimilarity, NTXentLoss
        from lightly.models import utils
        from lightly.models.modules import heads as lh

        c, d = cfg.method, backbone.num_features
        self.method, self.utils, self.autocast = method, utils, autocast
        self.backbone = timm_twin(backbone)
        if method == "moco_v3":
            self.projector = lh.MoCoProjectionHead(d, c.proj_hidden_dim, c.dim, num_layers=c.proj_layers,
                                                   batch_norm=True)
            self.predictor = lh.BYOLPredictionHead(c.dim, c.pred_hidden_dim, c.dim)
            self.criterion = NTXentLoss(temperature=c.temperature)
        elif method == "byol":
            self.projector = lh.BYOLProjectionHead(d, c.proj_hidden_dim, c.dim)
            self.predictor = lh.BYOLPredictionHead(c.dim, c.pred_hidden_dim, c.dim)
            self.criterion = NegativeCosineSimilarity()
        elif method == "simsiam":
            self.projector = lh.SimSiamProjectionHead(d, c.proj_hidden_dim, c.dim)
            self.predictor = lh.SimSiamPredictionHead(c.dim, c.pred_hidden_dim, c.dim)
            self.criterion = NegativeCosineSimilarity()
        else:
            self.projector = lh.SimCLRProjectionHead(d, c.proj_hidden_dim, c.dim, num_layers=c.proj_layers)
            self.predictor = None
            self.criterion = NTXentLoss(temperature=c.temperature)
        online = [self.backbone, self.projector] + ([self.predictor] if self.predictor is not None else [])
        self.modules = torch.nn.ModuleList(online).to(device).train()
        self.momentum = hasattr(c, "momentum")
        if self.momentum:
            self.backbone_m, self.projector_m = copy.deepcopy(self.backbone), copy.deepcopy(self.projector)
            utils.deactivate_requires_grad(self.backbone_m)
            utils.deactivate_requires_grad(self.projector_m)
            self.m = c.momentum
        lr = cfg.optim.base_lr * cfg.data.batch_size / 256
        self.opt = torch.optim.AdamW([p for p in self.modules.parameters() if p.requires_grad], lr=lr,
                                     weight_decay=cfg.optim.weight_decay)

    def loss(self, views):
        x0, x1 = views
        with self.autocast():
            if self.method == "simclr":
                z0, z1 = self.projector(self.backbone(x0)), self.projector(self.backbone(x1))
                return self.criterion(z0, z1)
            if self.momentum:
                self.utils.update_momentum(self.backbone, self.backbone_m, m=self.m)
                self.utils.update_momentum(self.projector, self.projector_m, m=self.m)
            z0, z1 = self.projector(self.backbone(x0)), self.projector(self.backbone(x1))
            p0, p1 = self.predictor(z0), self.predictor(z1)
            if self.momentum:
                with torch.no_grad():
                    z0 = self.projector_m(self.backbone_m(x0))
                    z1 = self.projector_m(self.backbone_m(x1))
            else:
                z0, z1 = z0.detach(), z1.detach()
            if self.method == "moco_v3":
                return self.criterion(p0, z1) + self.criterion(p1, z0)
            return 0.5 * (self.criterion(p0, z1) + self.criterion(p1, z0))

    def __call__(self, views):
        self.loss(views).backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def timm_twin(vit: torch.nn.Module) -> torch.nn.Module:
    """The backbone a lightly user would take: timm's VisionTransformer of the same size, loaded with
    the same weights (selfsup's ViT keeps timm's parameter names), patch projection trainable as in timm."""
    import timm

    twin = timm.models.vision_transformer.VisionTransformer(
        img_size=vit.image_size, patch_size=vit.patch_size, in_chans=vit.in_chans, embed_dim=vit.embed_dim,
        depth=vit.depth, num_heads=vit.blocks[0].attn.num_heads, num_classes=0, global_pool="token",
        norm_layer=partial(torch.nn.LayerNorm, eps=1e-6))
    twin.load_state_dict(vit.state_dict())
    return twin


# ---------------------------------------------------------------------------------------- measuring
def flop_twin(step, cfg, info, device, autocast):
    """The step whose FLOPs are counted: ``step`` itself, or for a compiled selfsup step (``--compile``) its eager
    twin with the same weights: FlopCounterMode is a torch dispatch mode, which torch.compile refuses to trace
    under ("non-infra torch dispatch mode present"), and the compiled graph runs the same operators."""
    if not (isinstance(step, (SelfsupStep, FlowStep)) and args_compile(cfg)):
        return step
    eager_cfg = copy.deepcopy(cfg)
    eager_cfg.trainer.compile = False
    twin = type(step)(eager_cfg, info, device, autocast)
    twin.model.load_state_dict(step.model.state_dict())
    return twin


def count_flops(step, views) -> tuple[int, dict[str, int]]:
    """FLOPs of one forward + backward of ``step`` (no optimiser step), total and per operator."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False, custom_mapping=cpu_attention_formulas())
    with counter:
        step.loss(views).backward()
    for p in _params(step):
        p.grad = None
    per_op = {str(op): n
              for op, n in counter.get_flop_counts().get("Global", {}).items()}
    return counter.get_total_flops(), per_op


def cpu_attention_formulas() -> dict:
    """FLOP formulas for CPU's fused attention, which ``FlopCounterMode`` has none for (it counts the CUDA
    kernels only, so on CPU attention was 0 FLOPs): forward q·kᵀ and a·v, 2·B·H·Nq·Nk·(d + d_v);
    backward the four products of their gradients, twice that."""
    aten = torch.ops.aten

    def forward(q, k, v, *args, out_shape=None, **kwargs) -> int:
        *batch, n_q, d = q
        return 2 * n_q * k[-2] * (d + v[-1]) * int(torch.Size(batch).numel())

    def backward(grad_out, q, k, v, *args, out_shape=None, **kwargs) -> int:
        return 2 * forward(q, k, v)

    ops = {"_scaled_dot_product_flash_attention_for_cpu": forward,
           "_scaled_dot_product_flash_attention_for_cpu_backward": backward}
    return {getattr(aten, name): f for name, f in ops.items() if hasattr(aten, name)}


def _params(step):
    return step.model.parameters() if hasattr(step, "model") else step.modules.parameters()


def cycling(step, batches):
    """A call of ``step`` on the next of ``batches`` each time, from the first."""
    it = itertools.cycle(batches)
    return lambda: step(next(it))


def time_step(step, batches, warmup: int, steps: int, device) -> list[tuple[float, float]]:
    """(wall, process CPU) seconds of each of ``steps`` steps after ``warmup`` untimed ones, cycling
    over ``batches``."""
    return timed(cycling(step, batches), steps, warmup, device)


def time_augment(model, images, device, n: int) -> float:
    """Median seconds of making one step's views (selfsup's batched on-device augmentation)."""
    gen, seeds = torch.Generator(device=device), itertools.count()

    def augment():
        gen.manual_seed(next(seeds))
        model.augment(images, gen)

    with torch.no_grad():
        return statistics.median(w for w, _ in timed(augment, n, warmup=1, device=device))


def profile_step(step, views, device) -> dict:
    """The profiler's view of one step: top operators by self time and the number of ``copy_`` calls."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    step(views)
    with profile(activities=acts) as prof:
        timed(lambda: step(views), 1, device=device)
    events = prof.key_averages()
    print(events.table(sort_by="self_cpu_time_total", row_limit=25), file=sys.stderr)
    total = sum(e.self_cpu_time_total for e in events) or 1
    copies = {e.key: e.count for e in events if e.key in ("aten::copy_", "aten::to", "aten::_to_copy", "aten::item",
                                                          "aten::_local_scalar_dense")}
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:12]
    return {"calls": copies, "self_cpu_share": {e.key: round(e.self_cpu_time_total / total, 4) for e in top}}


# The kernels of the operators FlopCounterMode counts (matrix products, convolutions, attention), as the
# profiler names them on CPU.
FLOP_KERNELS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::mkldnn_convolution",
                "aten::convolution_backward", "aten::_scaled_dot_product_flash_attention_for_cpu",
                "aten::_scaled_dot_product_flash_attention_for_cpu_backward")


def flop_kernel_time(step, batches, device, n: int = 2) -> dict | None:
    """How much of a step the kernels that do the counted FLOPs take (CPU only; None on a GPU, where the
    profiler's CPU self time is launch time): their summed self time per step, the profiled step's
    wall time, and the share (stable across machine-speed drift, unlike the times). The best step's MFU
    over that share bounds MFU from above: the ceiling if every other operator (elementwise,
    normalisation, copies, optimiser) took no time and the kernels kept their speed."""
    if device.type != "cpu":
        return None
    from torch.profiler import ProfilerActivity, profile

    step(batches[0])
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        wall = sum(w for w, _ in time_step(step, batches, 0, n, device)) / n
    kernels = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in FLOP_KERNELS) / 1e6 / n
    return {"flop_kernels_ms": 1000 * kernels, "profiled_step_ms": 1000 * wall, "flop_kernels_share": kernels / wall}


def make_views(cfg, info, device, n_batches: int, args):
    """``n_batches`` pairs of views: selfsup's augmentation of real images, or a synthetic batch."""
    from selfsup.methods.build import build_method

    model = build_method(cfg, info).to(device)
    if args.synthetic:
        g = torch.Generator(device=device).manual_seed(0)
        shape = (args.batch_size, info.channels, info.image_size, info.image_size)
        return ([[torch.randn(shape, generator=g, device=device) for _ in range(2)] for _ in range(n_batches)],
                None, model)
    from selfsup.data.datasets import load_dataset

    data = load_dataset(cfg.data, "train")
    gen = torch.Generator(device=device)
    batches = []
    for i in range(n_batches):
        images = data.images[i * args.batch_size:(i + 1) * args.batch_size].to(device)
        gen.manual_seed(i)
        with torch.no_grad():
            batches.append(model.augment(images, gen))
    return batches, images, model


def step_figures(times: list[list[tuple[float, float]]], flops: int, batch: int, peak: float) -> dict:
    """``harness.summarize`` of the repetitions (the lowest as ``*_best``) with the achieved FLOP/s and MFU."""
    s = summarize(times, batch, lowest="best")
    best, med = s["step_ms_best"] / 1000, s["step_ms_median"] / 1000
    return {**s, "tflops_best": flops / best / 1e12, "mfu_best": flops / best / peak, "mfu_median": flops / med / peak}


def autocast_for(device, args):
    """The step's autocast: bf16 on a GPU, none on the CPU (fp32)."""
    return (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if args.bf16 else nullcontext


def time_reps(steps: dict, batches, device, args, peaks: list[float], label: str) -> dict[str, list]:
    """``--reps`` repetitions, each after a fresh peak measurement; with several steps their order
    alternates per repetition so drift in machine load hits all of them. Per step: each repetition's times."""
    times = {k: [] for k in steps}
    for rep in range(args.reps):
        wall_peak, cpu_peak = measure_peak(device, torch.bfloat16 if args.bf16 else torch.float32, args.peak_size, 3)
        peaks.append(wall_peak)
        args.cpu_peaks.append(cpu_peak)
        for k in (list(steps) if rep % 2 == 0 else list(steps)[::-1]):
            times[k].append(time_step(steps[k], batches, args.warmup, args.steps, device))
            wall, cpu = mean_ms(times[k][-1])
            print(f"[{label} rep {rep + 1}/{args.reps}] {k:<8} {wall:8.1f} ms/step wall {cpu:8.1f} CPU",
                  file=sys.stderr, flush=True)
    return times


def first_steps(step, batches, device, n: int = 3) -> list[float]:
    """Wall seconds of a fresh compiled step's first ``n`` calls: the first holds the forward's and the
    backward's compilation (dynamo, AOTAutograd, inductor's code generation and C++ builds)."""
    return [w for w, _ in time_step(step, batches, 0, n, device)]


def rep_ratios(slow: list, fast: list) -> list[float]:
    """Per repetition, the ratio of mean step times (the two measured back to back in that repetition)."""
    return [round(sum(w for w, _ in a) / sum(w for w, _ in b) * len(b) / len(a), 3) for a, b in zip(slow, fast)]


def compile_summary(first: list[float], eager: list, compiled: list) -> dict:
    """Compile time (the first call less a compiled step), the speed-up over eager per repetition and its
    median, and the break-even step: where the compile time is paid back by the median saving per step."""
    each = rep_ratios(eager, compiled)
    step_eager = statistics.median(sum(w for w, _ in t) / len(t) for t in eager)
    step_compiled = statistics.median(sum(w for w, _ in t) / len(t) for t in compiled)
    compile_s = first[0] - step_compiled
    saving = step_eager - step_compiled
    return {"first_calls_s": [round(x, 3) for x in first], "compile_s": compile_s,
            "speedup_vs_eager_each_rep": each, "speedup_vs_eager_median": statistics.median(each),
            "break_even_steps": compile_s / saving if saving > 0 else None}


def run_case(method: str, heads: str, dataset: str, device, args, peaks: list[float]) -> dict:
    from selfsup.methods.build import data_info

    cfg = selfsup_config(method, dataset, heads, args)
    if args.compile:
        cfg.trainer.compile = True
    cfg.trainer.compile_mode = args.compile_mode
    if args.synthetic:  # an ImageNet-shaped random batch; no dataset is read
        from selfsup.methods.base import DataInfo
        info = DataInfo(3, args.image_size, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    else:
        from selfsup.data.datasets import load_dataset
        info = data_info(cfg, load_dataset(cfg.data, "train"))
    batches, images, aug_model = make_views(cfg, info, device, args.batches, args)
    autocast = autocast_for(device, args)
    steps = {"selfsup": SelfsupStep(cfg, info, device, autocast, args.compile_scope)}
    from selfsup.models.vit import VisionTransformer
    if (args.lightly and method in METHODS
            and isinstance(steps["selfsup"].model.backbone, VisionTransformer)):  # the peer's twin: timm's ViT
        steps["lightly"] = LightlyStep(method, cfg, steps["selfsup"].model.backbone, device, autocast)
    flops = {k: count_flops(flop_twin(s, cfg, info, device, autocast), batches[0]) for k, s in steps.items()}
    compile_info = None
    if args.compare_compile:  # the compiled step beside the eager one, the same weights (trainer.compile=true)
        compiled_cfg = copy.deepcopy(cfg)
        compiled_cfg.trainer.compile = True
        steps["compiled"] = SelfsupStep(compiled_cfg, info, device, autocast, args.compile_scope)
        steps["compiled"].model.load_state_dict(steps["selfsup"].model.state_dict())
        compile_info = first_steps(steps["compiled"], batches, device)
        flops["compiled"] = flops["selfsup"]  # the same operators (FlopCounterMode does not trace a compiled graph)
    times = time_reps(steps, batches, device, args, peaks, f"{method} {heads}")
    peak = max(peaks)
    out = {"preset": preset_name(method, dataset, args),
           "heads": {k: getattr(cfg.method, k) for k in ("proj_hidden_dim", "dim", "pred_hidden_dim")
                     if hasattr(cfg.method, k)}}
    for k, step in steps.items():
        out[k] = {"flops_per_step": flops[k][0], "flops_per_image": flops[k][0] / args.batch_size,
                  "flops_by_op": flops[k][1], **step_figures(times[k], flops[k][0], args.batch_size, peak)}
    if images is not None:
        aug = time_augment(aug_model, images, device, max(args.steps, 2))
        s = out["selfsup"]
        s["augment_ms"] = 1000 * aug
        s["mfu_with_augment"] = flops["selfsup"][0] / (s["step_ms_best"] / 1000 + aug) / peak
    for k, step in steps.items():
        out[k]["flop_kernels"] = flop_kernel_time(step, batches, device)
    if "lightly" in out:
        out["speedup_vs_lightly_best"] = out["lightly"]["step_ms_best"] / out["selfsup"]["step_ms_best"]
        out["speedup_vs_lightly_median"] = out["lightly"]["step_ms_median"] / out["selfsup"]["step_ms_median"]
    if compile_info is not None:
        out["compiled"].update(compile_summary(compile_info, times["selfsup"], times["compiled"]))
        if "lightly" in out:
            out["compiled_speedup_vs_lightly_median"] = (out["lightly"]["step_ms_median"]
                                                         / out["compiled"]["step_ms_median"])
            out["compiled_speedup_vs_lightly_each_rep"] = rep_ratios(times["lightly"], times["compiled"])
    if args.profile:
        for k in ("selfsup", "compiled"):
            if k in steps:
                out[k]["profile"] = profile_step(steps[k], batches[0], device)
    return out


def run_flow_case(method: str, dataset: str, device, args, peaks: list[float]) -> dict:
    """The flow step of ``method``'s preset: FLOPs, step times and MFU (no lightly peer; no head widths)."""
    from selfsup.config import load_run_config
    from selfsup.data.datasets import load_dataset
    from selfsup.methods.build import data_info

    cfg = load_run_config(preset_name(method, dataset, args), ["trainer.seed=0", f"data.batch_size={args.batch_size}"])
    if args.compile:
        cfg.trainer.compile = True  # as for every family: torch.compile of the step's modules in place
    train = load_dataset(cfg.data, "train")
    info, autocast = data_info(cfg, train), autocast_for(device, args)
    step = FlowStep(cfg, info, device, autocast)
    raw = [[t.to(device) for t in train[i * args.batch_size:(i + 1) * args.batch_size]] for i in range(args.batches)]
    batches = [step.prepare(*b) for b in raw]
    flops, by_op = count_flops(flop_twin(step, cfg, info, device, autocast), batches[0])
    times = time_reps({"selfsup": step}, batches, device, args, peaks, method)["selfsup"]
    sit = step.model.student
    out = {"preset": preset_name(method, dataset, args),
           "model": {"size": cfg.method.size, "hidden": sit.hidden, "depth": sit.depth, "heads": sit.heads,
                     "patch_size": sit.patch_size, "tokens": sit.num_tokens},
           "selfsup": {"flops_per_step": flops, "flops_per_image": flops / args.batch_size, "flops_by_op": by_op,
                       **step_figures(times, flops, args.batch_size, max(peaks))}}
    prep = timed(lambda: step.prepare(*raw[0]), max(args.steps, 2), warmup=1, device=device)
    out["selfsup"]["augment_ms"] = 1000 * statistics.median(w for w, _ in prep)  # the batch preparation
    out["selfsup"]["flop_kernels"] = flop_kernel_time(step, batches, device)
    if args.profile:
        out["selfsup"]["profile"] = profile_step(step, batches[0], device)
    return out


def device_defaults(args, device: torch.device) -> None:
    """The settings a device gives a run. A GPU run (unless ``--quick``) is the ViT-S/16 224 px recipe, eager
    beside compiled (``--compare-compile``, unless ``--compile`` alone asked for the compiled step only); the
    step is in bf16 autocast (``autocast_for``) on a GPU, fp32 on the CPU; the optimiser is the presets' fused
    AdamW and the memory format ``auto`` (channels-last for a CNN on a GPU) either way."""
    if device.type == "cuda" and not args.quick:
        args.recipe = args.recipe or "vit_s16_224"
        args.compare_compile = args.compare_compile or not args.compile
    args.bf16 = device.type == "cuda"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", default=",".join(METHODS + FLOW_METHODS),
                   help="comma-separated subset of " + ",".join(METHODS + OTHER_METHODS + FLOW_METHODS))
    p.add_argument("--heads", default="preset,wide", help="preset (the recipe's heads), wide (1024-wide), or both")
    p.add_argument("--dataset", default="fashion-mnist", choices=("fashion-mnist", "digits"),
                   help="digits is used when the Fashion-MNIST files are absent")
    p.add_argument("--recipe", default=None, choices=(None, "vit_s16_224"),
                   help="vit_s16_224: MoCo v3 ViT-S/16 at 224 px, ImageNet heads, synthetic batch (for GPUs)")
    p.add_argument("--batch-size", type=int, default=None, help="default 256 (vit_s16_224: 128)")
    p.add_argument("--steps", type=int, default=4, help="timed steps per repetition")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before each repetition")
    p.add_argument("--reps", type=int, default=3, help="repetitions; selfsup and lightly alternate")
    p.add_argument("--batches", type=int, default=4, help="distinct view batches cycled through")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's own)")
    p.add_argument("--peak-size", type=int, default=None, help="side of the peak matmul (default 2048 CPU, 8192 GPU)")
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda when available)")
    p.add_argument("--no-lightly", dest="lightly", action="store_false", help="skip the lightly-assembled step")
    p.add_argument("--compile", action="store_true",
                   help="trainer.compile=true: torch.compile the whole step forward (and so its backward)")
    p.add_argument("--compare-compile", action="store_true",
                   help="time the compiled step beside the eager one (alternating), with compile time and break-even"
                        " (default on a GPU)")
    p.add_argument("--compile-mode", default=None,
                   help="trainer.compile_mode, e.g. max-autotune-no-cudagraphs (default: torch.compile's default)")
    p.add_argument("--compile-scope", default="step", choices=("step", "modules"),
                   help="step: the whole step forward as one graph (trainer.compile); modules: each module on its own")
    p.add_argument("--memory-format", default="auto", choices=("auto", "channels_last", "contiguous"),
                   help="trainer.memory_format of the selfsup step (auto: channels_last for a CNN on a GPU)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="a config override of the selfsup step, e.g. --set model.backbone=resnet18 (repeatable)")
    p.add_argument("--attention", default=None, choices=("sdpa", "matmul"),
                   help="the ViT attention path (default sdpa)")
    p.add_argument("--profile", action="store_true", help="print and record the profiler table of one step")
    p.add_argument("--host-allocator", default="cached", choices=("cached", "system"),
                   help="cached (what selfsup pretrain sets on CPU: selfsup.host) or glibc's own; process-wide, "
                        "so the lightly step runs under the same setting")
    p.add_argument("--out", default=str(RESULTS / "mfu.json"))
    p.add_argument("--quick", action="store_true", help="smoke test: digits, batch 16, 1 warm-up + 1 step, 1 rep")
    args = p.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("mfu.py: error: --device cuda: no CUDA GPU is visible to torch (torch.cuda.is_available() is False); "
              "run it on a GPU machine, or use --device cpu", file=sys.stderr)
        return 2
    device_defaults(args, device)
    args.synthetic = args.recipe is not None
    args.image_size = 224
    if args.recipe:
        args.methods, args.heads = "moco_v3", "preset"
    if args.quick:
        args.dataset, args.batch_size, args.steps, args.warmup, args.reps, args.batches = "digits", 16, 1, 1, 1, 1
        args.peak_size = args.peak_size or 256
        args.heads = "preset" if args.heads == "preset,wide" else args.heads
    args.batch_size = args.batch_size or (128 if args.recipe else 256)
    args.peak_size = args.peak_size or (8192 if device.type == "cuda" else 2048)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    heads = [h.strip() for h in args.heads.split(",") if h.strip()]
    known = METHODS + OTHER_METHODS + FLOW_METHODS
    if any(m not in known for m in methods) or any(h not in ("preset", "wide") for h in heads):
        p.error(f"--methods takes {','.join(known)}; --heads takes preset,wide")
    if args.lightly:
        try:
            import lightly  # noqa: F401
        except ImportError:
            print("lightly is not installed (pip install lightly): the peer step is skipped", file=sys.stderr)
            args.lightly = False
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.host_allocator == "cached" and device.type == "cpu":
        from selfsup import host
        host.cache_freed_memory()
    if args.attention:
        from selfsup.models import vit
        vit.set_attention(args.attention)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    dataset = args.dataset
    if dataset == "fashion-mnist" and not args.synthetic:
        from selfsup.config import DataConfig
        from selfsup.data.datasets import load_dataset
        from selfsup.errors import UserError
        try:
            load_dataset(DataConfig(name="fashion-mnist"), "train")
        except UserError as e:
            print(f"Fashion-MNIST unavailable ({e}); using digits", file=sys.stderr)
            dataset = "digits"

    started = time.perf_counter()
    peaks: list[float] = []
    args.cpu_peaks = []
    results = {}
    for method in methods:
        if method in FLOW_METHODS:  # preset only: --heads does not apply
            results[f"{method}/preset"] = run_flow_case(method, dataset, device, args, peaks)
            continue
        if method in OTHER_METHODS:
            results[f"{method}/preset"] = run_case(method, "preset", dataset, device, args, peaks)
            continue
        for h in heads:
            results[f"{method}/{h}"] = run_case(method, h, dataset, device, args, peaks)
    peak, cpu_peak = max(peaks), max(args.cpu_peaks)
    for r in results.values():  # all MFUs against the one best peak measured in this run
        for k in ("selfsup", "compiled", "lightly"):
            if k in r:
                r[k]["mfu_best"] = r[k]["tflops_best"] * 1e12 / peak
                r[k]["mfu_median"] = r[k]["flops_per_step"] / (r[k]["step_ms_median"] / 1000) / peak
                if device.type == "cpu":  # FLOPs per CPU-second over the matmul's FLOPs per CPU-second
                    r[k]["mfu_cpu_time_best"] = r[k]["flops_per_step"] / (r[k]["cpu_step_ms_best"] / 1000) / cpu_peak
            kern = r[k].get("flop_kernels") if k in r else None
            if kern:  # the best step with everything outside the FLOP kernels taking no time
                r[k]["mfu_ceiling"] = r[k]["mfu_best"] / kern["flop_kernels_share"]
        if "lightly" in r and r["lightly"].get("flop_kernels"):
            # the speed-up over the peer of a step that was nothing but the same FLOPs' kernels
            r["speedup_vs_lightly_bound"] = 1 / r["lightly"]["flop_kernels"]["flop_kernels_share"]
        if "lightly" in r:
            r["speedup_vs_lightly_cpu_time"] = r["lightly"]["cpu_step_ms_best"] / r["selfsup"]["cpu_step_ms_best"]
        if "augment_ms" in r["selfsup"]:
            s = r["selfsup"]
            s["mfu_with_augment"] = s["flops_per_step"] / ((s["step_ms_best"] + s["augment_ms"]) / 1000) / peak
    from selfsup.models import vit

    report = {
        "benchmark": "mfu",
        "settings": {"dataset": "synthetic" if args.synthetic else dataset, "recipe": args.recipe or "presets",
                     "batch_size": args.batch_size, "steps": args.steps, "warmup": args.warmup, "reps": args.reps,
                     "threads": torch.get_num_threads(), "device": str(device), "bf16": args.bf16,
                     "compile": args.compile, "compare_compile": args.compare_compile,
                     "compile_mode": args.compile_mode, "compile_scope": args.compile_scope,
                     "memory_format": args.memory_format, "overrides": args.set or [],
                     "attention": vit.attention_mode(), "quick": args.quick,
                     "host_allocator": args.host_allocator if device.type == "cpu" else None,
                     "peak_matmul": f"{args.peak_size}x{args.peak_size} {'bf16' if args.bf16 else 'fp32'}"},
        "peak_flops": peak, "peak_flops_each_rep": peaks,
        "peak_flops_per_cpu_s": cpu_peak, "peak_flops_per_cpu_s_each_rep": args.cpu_peaks,
        "machine": machine_info(device),
        "wall_s": time.perf_counter() - started,
        "results": results,
    }
    write_report(report, args.out)

    print(f"\n{report['settings']['dataset']}, batch {args.batch_size}, {device}, {torch.get_num_threads()} threads; "
          f"peak {peak / 1e9:.1f} GFLOP/s ({report['settings']['peak_matmul']} matmul, best of the run)")
    print(f"{'case':<20} {'GFLOP/step':>10} {'img/s':>8} {'GFLOP/s':>8} {'MFU':>6} {'MFU+aug':>8}"
          f" {'lightly img/s':>13} {'MFU':>6} {'speed-up':>9}   by CPU time: {'MFU':>6} {'lightly':>7} {'speed-up':>8}"
          f"   {'in FLOP kernels':>15} {'ceiling':>7}")
    for name, r in results.items():
        s, lt = r["selfsup"], r.get("lightly")
        line = (f"{name:<20} {s['flops_per_step'] / 1e9:>10.2f} {s['images_per_s_best']:>8.1f} "
                f"{s['tflops_best'] * 1e3:>8.1f} {100 * s['mfu_best']:>5.1f}% "
                f"{100 * s.get('mfu_with_augment', float('nan')):>7.1f}%")
        if lt:
            line += (f" {lt['images_per_s_best']:>13.1f} {100 * lt['mfu_best']:>5.1f}% "
                     f"{r['speedup_vs_lightly_best']:>8.2f}x")
        else:  # a row without a peer (the flow steps, --no-lightly): keep the columns
            line += " " * 31
        if "mfu_cpu_time_best" in s:
            line += f"   {'':>12} {100 * s['mfu_cpu_time_best']:>5.1f}%"
            if lt:
                line += f" {100 * lt['mfu_cpu_time_best']:>6.1f}% {r['speedup_vs_lightly_cpu_time']:>7.2f}x"
            else:
                line += " " * 17
        if s.get("flop_kernels"):
            line += f"   {100 * s['flop_kernels']['flop_kernels_share']:>14.1f}% {100 * s['mfu_ceiling']:>6.1f}%"
        print(line)
    for name, r in results.items():
        c = r.get("compiled")
        if c:
            line = (f"{name:<20} compiled: {c['images_per_s_best']:.1f} img/s, MFU {100 * c['mfu_best']:.1f}%"
                    f" (ceiling {100 * c.get('mfu_ceiling', float('nan')):.1f}%), x{c['speedup_vs_eager_median']:.2f}"
                    f" eager (each rep {c['speedup_vs_eager_each_rep']}), compile {c['compile_s']:.1f} s")
            if c["break_even_steps"] is not None:
                line += f", break-even after {c['break_even_steps']:.0f} steps"
            if "compiled_speedup_vs_lightly_median" in r:
                line += f", x{r['compiled_speedup_vs_lightly_median']:.2f} lightly"
            print(line)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
