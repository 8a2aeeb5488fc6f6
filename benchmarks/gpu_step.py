"""The GPU step, part by part (issue 52): profile, batch sweep, attention kernel, the epoch-end step.

Each part writes one JSON into ``--out-dir`` (on the device machine: ``$OUT``), so a part cut short by its time limit
loses only itself:

* ``profile`` (``profile_<method>.json``): one profiled step of MoCo v3 and DINO ViT-S/16 (224 px; DINO 2 x 224 +
  10 x 96, bf16 autocast, fused AdamW, synthetic views): the top kernels by device time (CPU: by self time), the
  device's idle gaps between kernels inside the step (their sum, count and the largest), and the host syncs the step
  makes (``aten::item`` / ``_local_scalar_dense`` calls, ``cudaStreamSynchronize`` / ``cudaDeviceSynchronize``);
* ``sweep`` (``sweep_<method>.json``): step time, images/s and MFU (FLOPs counted by ``FlopCounterMode``, the peak a
  bf16 matmul measured in the same process) at batch 128 and doubling until the device runs out of memory: the
  largest batch that fits;
* ``sdpa`` (``sdpa.json``): which scaled-dot-product-attention kernel the ViT's attention takes (the kernels of a
  profiled forward + backward: flash, memory-efficient, cuDNN or the math fallback) and whether flash runs at all on
  the step's shapes when forced;
* ``epoch_end`` (``epoch_end.json``): the engine's loop (``selfsup pretrain``'s trainer, its per-epoch checkpoint)
  with free data, a few steps an epoch: each step's wall time, the steps that cross an epoch end against the median
  of the others, and the checkpoint writes timed apart (``checkpoints.write_checkpoint``).

``--dry-run`` runs every part on the CPU at toy size (a micro ViT, 32 px, batch 4 and 8) to check the script here;
tests/test_gpu_session.py runs it.

    python -m benchmarks.gpu_step --out-dir $OUT                    # on a GPU
    python -m benchmarks.gpu_step --dry-run --out-dir /tmp/gpu_step  # on a CPU, seconds
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from benchmarks.harness import machine_info, sync, timed, write_report

PRESETS = {"moco_v3": "moco-v3-vit-s-imagenet", "dino": "dino-vit-s-imagenet"}
TOY = ["data.image_size=32", "model.backbone=vit_micro", "model.patch_size=8", "trainer.precision=32-true",
       "trainer.strategy=auto"]
TOY_HEADS = {"moco_v3": ["method.proj_hidden_dim=64", "method.pred_hidden_dim=64", "method.dim=32"],
             "dino": ["method.out_dim=256", "method.hidden_dim=64", "method.bottleneck_dim=32",
                      "augment.local_crops_size=16", "augment.local_crops_number=2"]}
SYNC_OPS = ("aten::item", "aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize",
            "cudaEventSynchronize")


def config(method: str, batch: int, dry: bool, extra=()):
    from selfsup.config import load_run_config

    overrides = ["trainer.seed=0", f"data.batch_size={batch}", *(TOY + TOY_HEADS[method] if dry else []), *extra]
    return load_run_config(PRESETS[method], overrides)


class Step:
    """One training step as Lightning runs it, without Lightning: the module's ``forward_views`` (EMA update, the
    forwards, the loss), backward, the configured optimiser (fused AdamW on a GPU), ``zero_grad``, then the post-step
    hooks (DINO's teacher EMA)."""

    def __init__(self, cfg, device, bf16: bool):
        from selfsup.methods.base import DataInfo
        from selfsup.methods.build import build_method

        torch.manual_seed(0)
        info = DataInfo(3, cfg.data.image_size, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
        self.model = build_method(cfg, info).to(device).train()
        self.opt = self.model.configure_optimizers()
        self.opt = self.opt[0][0] if isinstance(self.opt, tuple) else self.opt
        self.opt = self.opt["optimizer"] if isinstance(self.opt, dict) else self.opt
        for group in self.opt.param_groups:
            group["lr"] = 1e-4
        self.autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if bf16 else nullcontext
        self.sizes = list(self.model.augment.sizes)
        self.device, self.batch = device, cfg.data.batch_size
        g = torch.Generator(device=device).manual_seed(0)
        self.views = [torch.randn(self.batch, 3, s, s, generator=g, device=device) for s in self.sizes]

    def loss(self, views):
        with self.autocast():
            return self.model.forward_views(views, **self.model.step_draws(views)).loss

    def __call__(self, views=None):
        self.loss(views or self.views).backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        for hook in self.model.post_step_hooks:
            hook()


def step_flops(step: Step) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        step.loss(step.views).backward()
    step.opt.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def peak_flops(device, dry: bool) -> float:
    """FLOP/s of a large matmul here (bf16 on a GPU, fp32 on the CPU): MFU's denominator."""
    n = 256 if dry else 8192
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    sync(device)
    reps = 3 if dry else 20
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync(device)
    return 2 * n ** 3 * reps / (time.perf_counter() - t)


def kernel_events(prof, cuda: bool) -> list:
    """The profiled kernels (device side) with their start and end in µs; on the CPU the top-level aten ops."""
    events = [e for e in prof.events() if (e.device_type.name == "CUDA") == cuda]
    if not cuda:
        events = [e for e in events if e.name.startswith("aten::") and e.cpu_parent is None]
    return sorted(events, key=lambda e: e.time_range.start)


def part_profile(method: str, device, args) -> dict:
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    step = Step(config(method, 8 if args.dry_run else 128, args.dry_run), device, cuda)
    for _ in range(2):
        step()
    sync(device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        t = time.perf_counter()
        step()
        sync(device)
        wall = time.perf_counter() - t
    averages = prof.key_averages()
    key = (lambda e: getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)) if cuda \
        else (lambda e: e.self_cpu_time_total)
    total = sum(key(e) for e in averages) or 1
    top = sorted(averages, key=lambda e: -key(e))[:20]
    kernels = kernel_events(prof, cuda)
    gaps = [b.time_range.start - a.time_range.end for a, b in zip(kernels, kernels[1:])]
    gaps = [g for g in gaps if g > 0]
    syncs = {e.key: e.count for e in averages if e.key in SYNC_OPS}
    busy = sum(e.time_range.end - e.time_range.start for e in kernels)
    return {"method": method, "preset": PRESETS[method], "batch": step.batch, "views": step.sizes,
            "step_ms_profiled": round(1000 * wall, 2),
            "top_kernels": [{"name": e.key[:120], "ms": round(key(e) / 1000, 3), "share": round(key(e) / total, 4),
                             "calls": e.count} for e in top],
            "kernels": len(kernels), "kernel_busy_ms": round(busy / 1000, 2),
            "idle_gaps": {"count": len(gaps), "sum_ms": round(sum(gaps) / 1000, 3),
                          "largest_ms": round(max(gaps, default=0) / 1000, 3),
                          "over_100us": sum(g > 100 for g in gaps)},
            "host_syncs": syncs, "host_syncs_total": sum(syncs.values())}


def part_sweep(method: str, device, args) -> dict:
    batches = [4, 8] if args.dry_run else [128, 256, 512, 1024, 2048]
    peak = peak_flops(device, args.dry_run)
    rows, largest = [], None
    for batch in batches:
        try:
            step = Step(config(method, batch, args.dry_run), device, device.type == "cuda")
            flops = step_flops(step)
            times = [wall for wall, _ in timed(step, 2 if args.dry_run else 8, 1 if args.dry_run else 3, device)]
        except torch.cuda.OutOfMemoryError:
            rows.append({"batch": batch, "oom": True})
            break
        finally:
            step = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
        med = statistics.median(times)
        rows.append({"batch": batch, "step_ms_median": round(1000 * med, 2), "images_per_s": round(batch / med, 1),
                     "tflops": round(flops / med / 1e12, 3), "mfu": round(flops / med / peak, 4),
                     "max_memory_gb": round(torch.cuda.max_memory_allocated(device) / 2 ** 30, 2)
                     if device.type == "cuda" else None})
        largest = batch
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
    return {"method": method, "preset": PRESETS[method], "peak_tflops": round(peak / 1e12, 2), "rows": rows,
            "largest_batch_that_fits": largest}


ATTENTION_KERNELS = {"flash": ("flash",), "efficient": ("efficient", "mem_eff", "fmha"), "cudnn": ("cudnn",),
                     "math": ("_scaled_dot_product_attention_math", "math")}


def part_sdpa(device, args) -> dict:
    """The attention kernel the ViT-S/16 step takes: the profiled kernels of one forward + backward of its attention
    at the step's shapes (batch 128, 6 heads, 197 tokens, 64 per head; bf16 on a GPU), and flash forced."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    b, h, n, d = (2, 2, 17, 8) if args.dry_run else (128, 6, 197, 64)
    dtype = torch.bfloat16 if cuda else torch.float32
    q, k, v = (torch.randn(b, h, n, d, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        F.scaled_dot_product_attention(q, k, v).sum().backward()
        sync(device)
    names = [e.key for e in prof.key_averages()]
    taken = {kind: [x for x in names if "attention" in x.lower() or any(t in x.lower() for t in tags)]
             for kind, tags in ATTENTION_KERNELS.items()}
    taken = {kind: [x for x in xs if any(t in x.lower() for t in ATTENTION_KERNELS[kind])][:6]
             for kind, xs in taken.items()}
    forced = {}
    for name, backend in (("flash", SDPBackend.FLASH_ATTENTION), ("efficient", SDPBackend.EFFICIENT_ATTENTION)):
        try:
            with sdpa_kernel([backend]):
                F.scaled_dot_product_attention(q, k, v).sum().backward()
            sync(device)
            forced[name] = "runs"
        except RuntimeError as e:
            forced[name] = f"refused: {str(e).splitlines()[0][:160]}"
    from selfsup.models.vit import VisionTransformer
    import inspect
    uses_sdpa = "scaled_dot_product_attention" in inspect.getsource(sys.modules[VisionTransformer.__module__])
    return {"shape": [b, h, n, d], "dtype": str(dtype), "kernels_by_kind": taken,
            "taken": [kind for kind, xs in taken.items() if xs], "forced": forced, "vit_calls_sdpa": uses_sdpa}


def part_epoch_end(device, args) -> dict:
    """The engine's loop with free data: the step that crosses an epoch end against the others, checkpoints apart."""
    import lightning.pytorch as pl

    import selfsup.checkpoints as checkpoints
    from selfsup.data.datasets import ImageDataset
    from selfsup.engine import PretrainData, make_trainer
    from selfsup.methods.build import build_method, data_info

    cuda = device.type == "cuda"
    per_epoch, epochs = (2, 2) if args.dry_run else (8, 3)
    batch = 2 if args.dry_run else 128
    size = 32 if args.dry_run else 224
    cfg = config("moco_v3", batch, args.dry_run, [
        "trainer.devices=1", "trainer.strategy=auto", "trainer.progress_bar=false", "trainer.log_every_n_steps=1000",
        "instruments.enabled=false",
        f"trainer.max_epochs={epochs}", f"trainer.accelerator={'gpu' if cuda else 'cpu'}",
        *(["trainer.precision=bf16-mixed"] if cuda else [])])
    images = torch.randint(0, 256, (per_epoch * batch, 3, size, size), dtype=torch.uint8)
    dataset = ImageDataset("synthetic", images, torch.zeros(len(images), dtype=torch.long), 1, (0.5,) * 3,
                           (0.25,) * 3)
    ends: list[float] = []
    writes: list[tuple[float, float]] = []  # (start, seconds) of each checkpoint write
    real_write = checkpoints.write_checkpoint

    def timed_write(checkpoint, path):
        t = time.perf_counter()
        real_write(checkpoint, path)
        writes.append((t, time.perf_counter() - t))

    class Clock(pl.Callback):
        def on_train_batch_end(self, trainer, module, *_):
            if cuda:
                torch.cuda.synchronize(device)
            ends.append(time.perf_counter())

    checkpoints.write_checkpoint = timed_write
    try:
        with tempfile.TemporaryDirectory(prefix="selfsup-epoch-end-") as tmp:
            cfg.output_dir = tmp
            run_dir = Path(tmp) / "run"
            run_dir.mkdir()
            trainer = make_trainer(cfg, run_dir)
            trainer.callbacks.append(Clock())
            trainer.fit(build_method(cfg, data_info(cfg, dataset)), datamodule=PretrainData(cfg, dataset))
    finally:
        checkpoints.write_checkpoint = real_write
    steps = [b - a for a, b in zip(ends, ends[1:])]  # step i+1's time: from step i's end to its own
    crossing = [i for i in range(len(steps)) if (i + 1) % per_epoch == 0]  # first step of a new epoch
    others = [t for i, t in enumerate(steps) if i not in crossing and i >= 1]
    median = statistics.median(others) if others else float("nan")
    return {"batch": batch, "steps_per_epoch": per_epoch, "epochs": epochs, "step_ms": [round(1000 * t, 2)
                                                                                      for t in steps],
            "crossing_step_ms": [round(1000 * steps[i], 2) for i in crossing], "other_steps_median_ms": round(
                1000 * median, 2), "crossing_over_median": [round(steps[i] / median, 2) for i in crossing],
            "checkpoint_writes_ms": [round(1000 * s, 2) for _, s in writes]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--parts", default="profile,sdpa,epoch_end,sweep")  # the sweep, longest, last
    p.add_argument("--methods", default="moco_v3,dino")
    p.add_argument("--out-dir", default="benchmarks/results/gpu_step")
    p.add_argument("--dry-run", action="store_true", help="every part on the CPU at toy size")
    args = p.parse_args(argv)
    device = torch.device("cpu" if args.dry_run or not torch.cuda.is_available() else "cuda")
    if args.dry_run:
        torch.set_num_threads(1)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    machine = machine_info(device) | {"dry_run": args.dry_run}
    for part in args.parts.split(","):
        t = time.perf_counter()
        if part in ("profile", "sweep"):
            for method in args.methods.split(","):
                result = (part_profile if part == "profile" else part_sweep)(method, device, args)
                write_report({**result, **machine}, out / f"{part}_{method}.json")
                print(part, method, json.dumps({k: v for k, v in result.items() if k != "top_kernels"})[:600],
                      flush=True)
        elif part == "sdpa":
            result = part_sdpa(device, args)
            write_report({**result, **machine}, out / "sdpa.json")
            print(part, json.dumps(result)[:600], flush=True)
        elif part == "epoch_end":
            result = part_epoch_end(device, args)
            write_report({**result, **machine}, out / "epoch_end.json")
            print(part, json.dumps(result)[:600], flush=True)
        else:
            raise SystemExit(f"unknown part {part!r}")
        print(f"{part}: {time.perf_counter() - t:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
