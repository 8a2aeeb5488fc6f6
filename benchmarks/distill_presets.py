"""The GPU distillation presets run (issue 50): ``distill-dinov2-vits14-r18-imagefolder`` and
``distill-dinov2-vits14-vits-imagefolder`` for a few steps each, as ``selfsup pretrain PRESET data.root=FOLDER
method.teacher.weights=FILE`` runs them, on a folder of synthetic JPEGs written here.

The teacher file is written here too: the DINOv2 torch.hub layout of ``dinov2_vits14_pretrain.pth`` (its keys and
shapes: LayerScale ``ls1/ls2``, ``mask_token``, the 518-px ``pos_embed`` of 37 x 37 + 1 rows; ``benchmarks.hub_layout``)
with timm's random init for values, since a device with no network cannot fetch the real file. So the run checks the
loading path, the position table's resampling to the run's size, the frozen teacher's placement and precision
(eval mode, no gradient, bf16 autocast on a GPU: the dtype of its output), the step time and the peak GPU memory;
not what the real weights would teach. Per preset: the teacher's facts as ``run.json`` records them (source, kind,
resampled, sha256) and whether that sha256 is the one the method holds; the teacher's parameter and output dtype,
device, mode and gradient; each step's wall time (the device synchronised at its start and end) and the time between
steps (the loader's wait and the loop); the teacher's forward alone on the step's batch; the peak memory the
process allocated on the GPU; every step's loss and whether all are finite.

The v3 presets (LightlyTrain's current distillation, a DINOv2 ViT-B/14 or a DINOv3 ViT-B/16 teacher: ``MORE``; the
DINOv3 stand-in is selfsup's ``dinov3_vitb16`` in the official hub layout, random values) run with ``--presets``; the
GPU session's ``distill`` part runs the two v1 presets.

    python -m benchmarks.distill_presets --out distill_presets_gpu.json       # on a GPU host
    python -m benchmarks.distill_presets --presets distill-v3-dinov2-vitb14-r18-imagefolder,\
        distill-v3-dinov2-vitb14-vits-imagefolder --out distill_v3_presets_gpu.json
    python -m benchmarks.distill_presets --presets distill-dinov3-vitb16-r18-imagefolder,\
        distill-dinov3-vitb16-vits-imagefolder --out distill_dinov3_presets_gpu.json
    python -m benchmarks.distill_presets --dry-run --out /tmp/distill.json    # on a CPU, toy size
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import yaml

from benchmarks.harness import default_device, machine_info, pretrain, sync, write_report

CONFIG_KEYS = ("model.backbone", "model.patch_size", "data.image_size", "data.batch_size", "data.num_workers",
               "data.decode", "trainer.precision", "trainer.accelerator", "optim.name", "method.queue_size",
               "method.version")
PRESETS = ("distill-dinov2-vits14-r18-imagefolder", "distill-dinov2-vits14-vits-imagefolder")
# the other GPU distillation presets (--presets): LightlyTrain's v3 from a DINOv2 ViT-B/14 and a DINOv3 ViT-B/16
MORE = ("distill-v3-dinov2-vitb14-r18-imagefolder", "distill-v3-dinov2-vitb14-vits-imagefolder",
        "distill-dinov3-vitb16-r18-imagefolder", "distill-dinov3-vitb16-vits-imagefolder")
# a preset's teacher file → timm's DINOv2 model whose shapes its hub-layout stand-in takes (a DINOv3 file: selfsup's
# own DINOv3 ViT of that name, whose state dict is the official module's, with the file's (1, D) mask token)
TEACHERS = {"dinov2_vits14_pretrain.pth": "vit_small_patch14_dinov2",
            "dinov2_vitb14_pretrain.pth": "vit_base_patch14_dinov2",
            "dinov3_vitb16_pretrain_lvd1689m-73cec8be.pth": "dinov3_vitb16"}
NOTE = ("teacher: a checkpoint written on the device in DINOv2's torch.hub layout (the preset's file's keys and "
        "shapes, dinov2_vits14_pretrain.pth or dinov2_vitb14_pretrain.pth: LayerScale ls1/ls2, mask_token, a 518-px "
        "pos_embed of 37x37+1) with random values (timm's vit_small / vit_base_patch14_dinov2 init), the real file "
        "being out of reach of a device with no network: this checks "
        "the loading path, the position table's resampling, the frozen teacher's bf16 autocast, the step time and the "
        "peak memory on the GPU, not the weights' quality. Data: synthetic JPEGs (smooth colour fields, "
        "benchmarks.decode.make_jpegs), an unlabelled folder as the presets take it. A DINOv3 preset's teacher: "
        "selfsup's dinov3_vitb16 (random init) in DINOv3's hub layout (the official module's keys, a (1, D) "
        "mask_token)")


def write_images(folder: Path, n: int, side: int, unique: int = 256) -> Path:
    """``n`` JPEGs of ``side`` px in ``folder``: ``unique`` distinct ones, hard-linked over to make ``n`` (the
    loader decodes each file; their pixels only have to look like photos)."""
    from benchmarks.decode import make_jpegs

    (folder / "0").mkdir(parents=True, exist_ok=True)
    files = make_jpegs(folder / "0", min(n, unique), side, side)
    for i in range(len(files), n):
        link = folder / f"{i // unique}" / f"{i:05d}.jpg"
        link.parent.mkdir(exist_ok=True)
        os.link(files[i % unique], link)
    return folder


def probe(device: torch.device):
    """A Lightning callback that times each step (the device synchronised at its start and end), keeps each
    step's loss, reads the frozen teacher's placement and precision at the first step's end (a forward hook
    records its output's dtype and whether grad was on), resets the peak memory at the fit's start and times the
    teacher's forward alone at the fit's end."""
    import lightning.pytorch as pl

    class Probe(pl.Callback):
        def __init__(self):
            self.starts, self.ends, self.losses = [], [], []
            self.seen: dict = {}
            self.teacher: dict = {}
            self.teacher_forward_ms: list[float] = []

        def on_train_start(self, trainer, module):
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)

            def hook(_, args, out):  # the network's forward (v1: its pooled feature)
                self.seen.setdefault("output_dtype", str(out.dtype))

            def first_layer(_, args, out):  # what the network computes in (v2 / v3 call its feature maps)
                self.seen.setdefault("compute_dtype", str(out.dtype))

            def view(_, args, out):  # the teacher's input: the student's view, every version
                if "input_shape" not in self.seen:
                    self.seen.update(grad_enabled=torch.is_grad_enabled(), input_shape=list(args[0].shape))
            net = module.teacher.network  # a FrozenNetwork's module
            layer = next(m for m in net.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)))
            self.handles = [net.register_forward_hook(hook), layer.register_forward_hook(first_layer),
                            module.teacher.input_map.register_forward_hook(view)]

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            sync(device)
            self.starts.append(time.perf_counter())

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            sync(device)
            self.ends.append(time.perf_counter())
            step = outputs.get("step") if isinstance(outputs, dict) else None
            self.losses.append(float(step.loss if step is not None else outputs["loss"]))
            if not self.teacher:
                p = next(module.teacher.parameters())
                self.teacher = {"param_dtype": str(p.dtype), "device": str(p.device),
                                "training": module.teacher.network.training,
                                "requires_grad": any(q.requires_grad for q in module.teacher.parameters()),
                                "in_state_dict": any(k.startswith("teacher") for k in module.state_dict()),
                                "sha256_held": module.teacher.facts["sha256"], **self.seen}

        def on_train_end(self, trainer, module):
            for handle in self.handles:
                handle.remove()
            x = torch.randn(self.seen["input_shape"], device=device)
            c = module.cfg.method  # the method's own teacher call of its version (v2 / v3: the feature maps)
            blocks = c.n_teacher_blocks if c.version == "v2" else 1
            call = module.teacher_embedding if c.version == "v1" else lambda y: module.teacher_maps(y, blocks)
            for _ in range(6):  # the method's own teacher call: input map, bf16 autocast on a GPU, normalise
                sync(device)
                start = time.perf_counter()
                call(x)
                sync(device)
                self.teacher_forward_ms.append(1000 * (time.perf_counter() - start))
            self.peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None

    return Probe()


def run_preset(preset: str, overrides: list[str], run: Path, warmup: int, device: torch.device) -> dict:
    p = probe(device)
    start = time.perf_counter()
    done = pretrain(preset, overrides, run, report=False, callbacks=[p], fresh=True)
    wall = time.perf_counter() - start
    recorded = json.loads((done.run / "run.json").read_text()).get("teacher") or {}
    cfg = yaml.safe_load((done.run / "config.yaml").read_text())
    config = {key: (cfg.get(key.split(".")[0]) or {}).get(key.split(".")[1]) for key in CONFIG_KEYS}
    steps = [1000 * (e - s) for s, e in zip(p.starts, p.ends)]
    between = [1000 * (s - e) for e, s in zip(p.ends, p.starts[1:])]
    timed = steps[warmup:]
    batch = p.seen["input_shape"][0]
    sha = recorded.get("sha256", "")
    return {
        "preset": preset, "overrides": overrides, "config": config, "wall_s": round(wall, 1), "steps": len(steps),
        "teacher_recorded": recorded,
        "teacher_sha256_in_run_json": len(sha) == 64 and all(c in "0123456789abcdef" for c in sha),
        "teacher_sha256_matches_method": sha == p.teacher.get("sha256_held"),
        "teacher": {k: v for k, v in p.teacher.items() if k != "sha256_held"},
        "teacher_bf16": (p.teacher.get("output_dtype") or p.teacher.get("compute_dtype")) == "torch.bfloat16"
        if device.type == "cuda" else None,
        "step_ms": [round(t, 2) for t in steps], "between_steps_ms": [round(t, 2) for t in between],
        "warmup_steps": warmup, "step_ms_median": round(statistics.median(timed), 2) if timed else None,
        "step_images_per_s_median": round(1000 * batch / statistics.median(timed), 1) if timed else None,
        "between_steps_ms_median": round(statistics.median(between[warmup:]), 2) if between[warmup:] else None,
        "teacher_forward_ms_median": round(statistics.median(p.teacher_forward_ms[1:]), 2),
        "batch": batch, "peak_memory_gib": round(p.peak / 2**30, 3) if p.peak is not None else None,
        "losses": [round(x, 5) for x in p.losses], "loss_finite": all(math.isfinite(x) for x in p.losses),
    }


def teacher_of(preset: str) -> str:
    """The file name of ``preset``'s teacher (one of ``TEACHERS``)."""
    from selfsup.config import load_run_config

    name = Path(load_run_config(preset, []).method.teacher.weights).name
    if name not in TEACHERS:
        raise SystemExit(f"{preset}: its teacher {name} has no stand-in here (known: {', '.join(TEACHERS)})")
    return name


def write_dinov3_teacher(path: Path, name: str, seed: int = 0) -> Path:
    """DINOv3's hub layout: selfsup's ``name`` (random init; the official module's keys) and a (1, D) mask token."""
    from selfsup.models.backbones import build_backbone

    torch.manual_seed(seed)
    net = build_backbone(name, in_chans=3, image_size=224)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({**net.state_dict(), "mask_token": torch.zeros(1, net.embed_dim)}, path)
    return path


def write_teacher(path: Path) -> dict:
    """The hub-layout stand-in of the file ``path.name`` (``TEACHERS``), written to ``path``: its layout's facts."""
    from benchmarks.hub_layout import write_hub_checkpoint

    model = TEACHERS[path.name]
    if model.startswith("dinov3"):
        hub = torch.load(write_dinov3_teacher(path, model), map_location="cpu", weights_only=True)
        return {"keys": len(hub), "rope_periods": list(hub["rope_embed.periods"].shape),
                "storage_tokens": list(hub["storage_tokens"].shape), "mask_token": list(hub["mask_token"].shape),
                "layer_scale": "blocks.0.ls1.gamma" in hub, "mib": round(path.stat().st_size / 2**20, 1)}
    teacher = write_hub_checkpoint(path, model)
    hub = torch.load(teacher, map_location="cpu", weights_only=True)
    return {"keys": len(hub), "pos_embed": list(hub["pos_embed"].shape), "mask_token": list(hub["mask_token"].shape),
            "layer_scale": "blocks.0.ls1.gamma" in hub and "blocks.0.ls2.gamma" in hub,
            "mib": round(teacher.stat().st_size / 2**20, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default=",".join(PRESETS), help=f"comma-separated; also {', '.join(MORE)}")
    p.add_argument("--steps", type=int, default=12, help="training steps a preset (one epoch of that many batches)")
    p.add_argument("--warmup", type=int, default=4, help="the first steps left out of the medians")
    p.add_argument("--work", default=None, help="where the teacher, images and runs go (default: a temporary folder)")
    p.add_argument("--dry-run", action="store_true",
                   help="a CPU at toy size: 28 px (the ViT-S student at patch 14), batch 4, 2 steps, fp32")
    p.add_argument("--out", default="benchmarks/results/distill_presets_gpu.json")
    args = p.parse_args(argv)
    device = default_device()
    if args.dry_run:
        steps, warmup, batch, size = 2, 1, 4, 28  # the teacher's 2 x 2 patches of 14 px (the ViT-S student's too)
        toy = [f"data.image_size={size}", f"data.batch_size={batch}", "data.num_workers=0", "method.queue_size=16",
               "trainer.accelerator=cpu", "trainer.precision=32-true"]
    else:
        steps, warmup, toy, batch, size = args.steps, args.warmup, [], 256, 224  # the presets' batch and size
    presets = [s for s in args.presets.split(",") if s]
    with tempfile.TemporaryDirectory(prefix="selfsup-distill-") as tmp:
        work = Path(args.work or tmp)
        start = time.perf_counter()
        teachers = {preset: teacher_of(preset) for preset in presets}
        layout = {name: write_teacher(work / name) for name in sorted(set(teachers.values()))}
        images = write_images(work / "images", batch * steps, 256 if not args.dry_run else 128)
        setup_s = time.perf_counter() - start
        print(f"teachers {layout}, {batch * steps} images, {setup_s:.1f} s", flush=True)
        rows = []
        for preset in presets:
            teacher = work / teachers[preset]
            overrides = [f"data.root={images}", f"method.teacher.weights={teacher}", "trainer.max_epochs=1",
                         f"trainer.limit_train_batches={steps}", "trainer.progress_bar=false", "trainer.seed=0", *toy]
            if args.dry_run and teachers[preset].startswith("dinov3"):
                overrides.append("data.image_size=32")  # the DINOv3 teacher's 2 x 2 patches of 16 px
            elif args.dry_run and "vits" in preset.split("-")[-2]:
                overrides.append("model.patch_size=14")  # 28 px: the ViT-S/16 student at the teacher's patch
            rows.append(run_preset(preset, overrides, work / "runs" / preset, warmup, device))
            r = rows[-1]
            print(f"{preset}: teacher {r['teacher']} resampled {r['teacher_recorded'].get('resampled')}; step "
                  f"{r['step_ms_median']} ms median ({r['step_images_per_s_median']} images/s in the step), teacher "
                  f"forward {r['teacher_forward_ms_median']} ms, peak {r['peak_memory_gib']} GiB, losses {r['losses']}",
                  flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            write_report({"note": NOTE, "dry_run": args.dry_run, "machine": machine_info(device),
                          "teacher_file": layout[teachers[presets[0]]], "teacher_files": layout,
                          "images": batch * steps, "image_size": size, "setup_s": round(setup_s, 1), "runs": rows},
                         args.out)
    ok = all(r["loss_finite"] and r["teacher_sha256_in_run_json"] and r["teacher_sha256_matches_method"]
             and not r["teacher"]["training"] and not r["teacher"]["requires_grad"] and not r["teacher"]["grad_enabled"]
             and r["teacher_bf16"] is not False for r in rows)
    print(f"wrote {args.out}" + ("" if ok else "; a check failed (see the JSON)"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
