"""``selfsup export --format onnx``'s file in onnxruntime on the CPU beside eager PyTorch: images per second of the
same backbone on the same batches, the same thread count for both, timed in turn (the best of each).

    python -m benchmarks.onnx_speed [--quick] [--threads N]   → benchmarks/results/onnx_speed.json
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import onnxruntime
import torch

from benchmarks.harness import RESULTS, machine_info, timed, write_report
from selfsup.export import export_backbone
from selfsup.models.backbones import build_backbone
from selfsup.runs.portable import export_portable

# name, build_backbone kwargs: the families selfsup export is checked on
MODELS = {
    "resnet18@64": ("resnet18", dict(in_chans=3, image_size=64)),
    "vit_tiny@64/p8": ("vit_tiny", dict(in_chans=3, image_size=64, patch_size=8)),
    "bn_cnn_micro@28": ("bn_cnn_micro", dict(in_chans=1, image_size=28)),
}


def one(name: str, kwargs: dict, root: Path, batch: int, repeat: int, threads: int) -> dict:
    """Eager and onnxruntime images/s of one backbone (normalisation in the graph for both)."""
    torch.manual_seed(0)
    backbone = build_backbone(name, **kwargs).eval()
    c = kwargs["in_chans"]
    meta = {"backbone": name, "kwargs": kwargs, "image_size": kwargs["image_size"], "in_chans": c,
            "mean": [0.5] * c, "std": [0.25] * c}
    source = export_backbone(backbone, root / f"{name}.safetensors", meta)
    done = export_portable(source, root / f"{name}.onnx")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # idle threads leave the cores to torch
    session = onnxruntime.InferenceSession(str(done.path), options, providers=["CPUExecutionProvider"])
    s = kwargs["image_size"]
    x = torch.rand(batch, c, s, s, generator=torch.Generator().manual_seed(0))
    mean, std = torch.full((1, c, 1, 1), 0.5), torch.full((1, c, 1, 1), 0.25)

    def eager():
        with torch.no_grad():
            return backbone((x - mean) / std)

    arr = x.numpy()
    runs = {"eager": eager, "ort": lambda: session.run(["features"], {"images": arr})}
    best = {k: min(w for w, _ in timed(fn, 1, warmup=2)) for k, fn in runs.items()}
    for _ in range(repeat - 1):  # interleaved, so that both see the same load on shared cores
        best = {k: min(best[k], timed(fn, 1)[0][0]) for k, fn in runs.items()}
    t_eager, t_ort = best["eager"], best["ort"]
    return {"eager_images_per_s": batch / t_eager, "onnxruntime_images_per_s": batch / t_ort,
            "onnxruntime_over_eager": t_eager / t_ort, "check_max_rel_diff": done.max_rel_diff}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="batch 8, one model, two repeats (smoke run)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    batch, repeat = (8, 2) if args.quick else (args.batch, args.repeat)
    models = dict(list(MODELS.items())[:1]) if args.quick else MODELS
    report = {"batch": batch, "threads": args.threads, "onnxruntime": onnxruntime.__version__,
              "machine": machine_info(torch.device("cpu")), "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for label, (name, kwargs) in models.items():
            r = report["models"][label] = one(name, kwargs, Path(tmp), batch, repeat, args.threads)
            print(f"{label:<18} eager {r['eager_images_per_s']:8.1f} img/s   onnxruntime "
                  f"{r['onnxruntime_images_per_s']:8.1f} img/s   ×{r['onnxruntime_over_eager']:.2f}")
    print(f"wrote {write_report(report, RESULTS / 'onnx_speed.json')}")


if __name__ == "__main__":
    main()
