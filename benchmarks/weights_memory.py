"""Peak memory of loading weights (``selfsup.weights``): a ViT-B-sized file loaded into a ViT-B backbone.

Each case runs in a fresh interpreter: the backbone is built (but in ``auto`` and ``auto-pth``, where
``build_from_weights`` builds it from the file inside the load), the peak resident set is reset
(``/proc/self/clear_refs`` 5), the weights are loaded, and two peaks over the load are read, each over the file's
size:

- ``peak_anon``: the process's own allocations (``RssAnon``, sampled every millisecond): the copies held;
- ``peak_rss``: the whole resident set (``VmHWM``), which also counts the file's pages the process maps while it
  reads them (page cache the kernel can drop and read again).

The backbone's own parameters are there before and after the load and are not counted, but in ``auto*``.

    python -m benchmarks.weights_memory             # ViT-B at 224 px: .pth, .safetensors, a checkpoint, auto, auto-pth,
                                                    # DINOv3's hub .pth (loaded, auto) and transformers folder (auto)
    python -m benchmarks.weights_memory --quick     # a ViT-S instead (a smoke test)
    python -m benchmarks.weights_memory --src /tmp/old/src --out /tmp/before.json   # another revision's selfsup

Writes ``results/weights_memory.json`` (``--quick``: ``weights_memory_quick.json``). Linux only (/proc).
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from benchmarks.harness import RESULTS, child_env, machine_info, write_report

CASES = ("pth", "safetensors", "checkpoint", "auto", "auto-pth", "dinov3-pth", "auto-dinov3-pth", "auto-dinov3-hf")


def _status(field: str) -> int:
    """A /proc/self/status figure in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


class AnonPeak:
    """The peak anonymous resident memory (``RssAnon``: the process's own allocations, not the file pages it maps,
    which the kernel can drop and read again) over a block, sampled every millisecond by a thread."""

    def __enter__(self):
        self.peak, self.done = _status("RssAnon"), threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _watch(self):
        while not self.done.wait(0.001):
            self.peak = max(self.peak, _status("RssAnon"))

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()
        self.peak = max(self.peak, _status("RssAnon"))


def write_files(folder: Path, size: str) -> dict[str, Path]:
    """The files of each case: timm's ViT (random values) as a state dict (.pth, .safetensors), the same under a
    DINO-style ``teacher`` wrapper with ``backbone.`` keys and a head, a selfsup export (read by ``auto``) and a
    DINOv2 hub file of that size (``auto-pth``: its network built from its shapes); DINOv3's ViT of that size as its
    hub ``.pth`` (loaded into the built network, and built from its file) and as a transformers folder."""
    import timm
    import torch
    from safetensors.torch import save_file

    from benchmarks.hub_layout import hub_layout
    from selfsup.export import export_backbone
    from selfsup.models.backbones import build_backbone

    name = {"base": "vit_base_patch16_224", "small": "vit_small_patch16_224"}[size]
    state = timm.create_model(name, pretrained=False, num_classes=0).state_dict()
    paths = {case: folder / f"vit.{case}" for case in CASES}
    torch.save(state, paths["pth"])
    save_file({k: v.contiguous() for k, v in state.items()}, str(paths["safetensors"]))
    head = {"head.mlp.0.weight": torch.zeros(2048, state["cls_token"].shape[-1]), "head.last_layer.weight_v":
            torch.zeros(4096, 256)}
    torch.save({"teacher": {**{f"backbone.{k}": v for k, v in state.items()}, **head}, "epoch": 1},
               paths["checkpoint"])
    paths["checkpoint"] = paths["checkpoint"].rename(folder / "checkpoint.pth")
    dinov2 = {"base": "vit_base_patch14_dinov2", "small": "vit_small_patch14_dinov2"}[size]
    paths["auto-pth"] = folder / "dinov2_pretrain.pth"
    torch.save(hub_layout(timm.create_model(dinov2, pretrained=False, num_classes=0).state_dict()), paths["auto-pth"])
    selfsup_name = {"base": "vit_base", "small": "deit_small"}[size]
    own = build_backbone(selfsup_name, in_chans=3, image_size=224, patch_size=16, pos_embed="learned")
    kwargs = {"in_chans": 3, "image_size": 224, "patch_size": 16, "pos_embed": "learned"}
    paths["auto"] = export_backbone(own, folder / "export.safetensors",
                                    {"backbone": selfsup_name, "in_chans": 3, "kwargs": kwargs, "image_size": 224,
                                     "mean": [0.5] * 3, "std": [0.5] * 3})
    paths.update(_dinov3_files(folder, size))
    return paths


def _dinov3_files(folder: Path, size: str) -> dict[str, Path]:
    """DINOv3's ViT-B/16 (or S/16) at random: its hub state dict (the official names) and a transformers folder."""
    import torch
    from transformers import DINOv3ViTConfig, DINOv3ViTModel

    from selfsup.models.backbones import build_backbone

    name = {"base": "dinov3_vitb16", "small": "dinov3_vits16"}[size]
    torch.save(build_backbone(name, in_chans=3, image_size=224).state_dict(), folder / f"{name}_pretrain.pth")
    width, heads = {"base": (768, 12), "small": (384, 6)}[size]
    DINOv3ViTModel(DINOv3ViTConfig(hidden_size=width, num_attention_heads=heads, intermediate_size=4 * width,
                                   num_register_tokens=4)).save_pretrained(folder / f"{name}-hf")
    return {"dinov3-pth": folder / f"{name}_pretrain.pth", "auto-dinov3-pth": folder / f"{name}_pretrain.pth",
            "auto-dinov3-hf": folder / f"{name}-hf"}


def _file_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.glob("*.safetensors")) if path.is_dir() else path.stat().st_size


def measure(case: str, path: str, size: str) -> dict:
    """In this (fresh) process: the backbone built, then the file loaded; the load's peak over the file's size."""
    import torch

    from selfsup.models.backbones import build_backbone
    from selfsup.weights import build_from_weights, load_weights

    torch.set_num_threads(1)
    name = {"base": "vit_base", "small": "deit_small"}[size]
    module = None
    if case == "dinov3-pth":
        module = build_backbone({"base": "dinov3_vitb16", "small": "dinov3_vits16"}[size], in_chans=3, image_size=224)
    elif not case.startswith("auto"):
        module = build_backbone(name, in_chans=3, image_size=224, patch_size=16, pos_embed="learned")
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # the peak resident set starts again from here
    before, anon_before = _status("VmRSS"), _status("RssAnon")
    with AnonPeak() as anon:
        if case.startswith("auto"):  # the frozen-network path: the module is built from the file inside
            module, _, _ = build_from_weights(path, "auto", {}, 3, 224, "the checkpoint")
        else:
            load_weights(module, path)
    peak = _status("VmHWM")
    file_bytes = _file_bytes(Path(path))
    params = sum(t.numel() * t.element_size() for t in module.state_dict().values())
    return {"case": case, "file_mb": round(file_bytes / 2**20, 1), "backbone_mb": round(params / 2**20, 1),
            "built_in_load": case.startswith("auto"), "peak_rss_over_load_mb": round((peak - before) / 2**20, 1),
            "peak_rss_over_file": round((peak - before) / file_bytes, 2),
            "peak_anon_over_load_mb": round((anon.peak - anon_before) / 2**20, 1),
            "peak_anon_over_file": round((anon.peak - anon_before) / file_bytes, 2)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.weights_memory", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a ViT-S instead of a ViT-B (a smoke test)")
    parser.add_argument("--child", nargs=3, metavar=("CASE", "PATH", "SIZE"), help=argparse.SUPPRESS)
    parser.add_argument("--src", default=None, help="the selfsup source folder measured (default this repository's)")
    parser.add_argument("--out", default=None, help="the JSON written (default results/weights_memory[_quick].json)")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(*args.child)))
        return
    size = "small" if args.quick else "base"
    rows, env = [], child_env()
    if args.src:
        env["PYTHONPATH"] = f"{args.src}:{env['PYTHONPATH']}"
    with tempfile.TemporaryDirectory() as tmp:
        paths = write_files(Path(tmp), size)
        for case in CASES:
            done = subprocess.run([sys.executable, "-m", "benchmarks.weights_memory", "--child", case,
                                   str(paths[case]), size], capture_output=True, text=True, env=env, check=True)
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(rows[-1])
    import torch

    out = args.out or RESULTS / f"weights_memory{'_quick' if args.quick else ''}.json"
    write_report({"benchmark": "weights_memory", "size": size, "src": args.src or "src",
                  "machine": machine_info(torch.device("cpu")), "rows": rows}, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
