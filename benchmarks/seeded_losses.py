"""Seeded runs' per-step losses and exported-backbone digests, to show a refactor changed no result.

Runs a few steps of each listed preset through the ``selfsup`` command line (so it works whatever the
package's internal layout), records every logged loss exactly (as the CSV's text) and a SHA-256 of the
exported backbone's tensors, and writes JSON. ``--compare OLD.json`` also reports, per preset, whether
the losses and the backbone are bit-identical to an earlier recording (exit 1 if any differs).

Bit-identity holds on one CPU kind only: oneDNN and ATen choose other kernels on AVX2, AVX-512 and AMX machines, so
the last bits of float32 results differ between kinds. The JSON records the CPU kind; compared with a recording from
another kind, the losses are compared with a relative tolerance of ``LOSS_RTOL`` and the digests are not compared.

    python -m benchmarks.seeded_losses --out benchmarks/results/seeded_losses.json
    python -m benchmarks.seeded_losses --compare benchmarks/results/seeded_losses_before.json
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import cpu_model_and_flags, selfsup_cli, write_report

# every method's digits preset (and the predictor options'), teachers before their students
PRESETS = ("moco-v3-vit-digits", "byol-digits", "simsiam-digits", "simclr-digits", "simclr-cnn-digits",
           "simsiam-cnn-digits", "barlow-twins-digits", "vicreg-digits", "wmse-digits", "wmse-cnn-digits",
           "nnclr-digits", "nnclr-cnn-digits", "swav-digits", "swav-cnn-digits", "dino-digits", "ibot-digits",
           "dinov2-digits", "mae-digits", "ijepa-digits", "lejepa-digits", "distill-digits", "distill-cnn-digits",
           "distill-dinov2-digits", "byol-directpred-fmnist", "self-flow-digits", "flow-matching-digits",
           "repa-digits")
TINY = ["data.batch_size=64", "trainer.max_epochs=1", "trainer.limit_train_batches=6",
        "trainer.log_every_n_steps=1", "trainer.progress_bar=false", "trainer.accelerator=cpu",
        "trainer.devices=1", "eval.knn_at_end=false"]
LOSS_RTOL = 1e-4  # across CPU kinds only; after a few steps seeded losses agree to ~1e-6 there
# the frozen networks: runs of this script (repa's encoder and distill's teacher: the moco-v3 run); W-MSE's batch
EXTRA = {
    "repa-digits": lambda out: [f"method.encoder={out / 'moco-v3-vit-digits'}"],
    "distill-digits": lambda out: [f"method.teacher.weights={out / 'moco-v3-vit-digits'}"],
    "distill-cnn-digits": lambda out: [f"method.teacher.weights={out / 'moco-v3-vit-digits'}"],
    "distill-dinov2-digits": lambda out: [f"method.teacher.weights={out / 'dinov2-digits'}"],
    "wmse-digits": lambda out: ["data.batch_size=128"],  # its whitening window (w_size 128) divides the batch
    "wmse-cnn-digits": lambda out: ["data.batch_size=128"],
}


def digest(path: Path) -> str:
    from safetensors.torch import load_file

    h = hashlib.sha256()
    for key, value in sorted(load_file(str(path)).items()):
        h.update(key.encode())
        h.update(value.contiguous().numpy().tobytes())
    return h.hexdigest()


def state_digest(path: Path) -> str:
    """SHA-256 of every tensor of a checkpoint's ``state_dict`` (heads, queues, centres, EMA copies)."""
    import torch

    h = hashlib.sha256()
    for key, value in sorted(torch.load(path, map_location="cpu", weights_only=False)["state_dict"].items()):
        h.update(key.encode())
        h.update(value.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def cpu_record() -> dict:
    """The processor's name and the widest vector ISA it has (what decides the kernels oneDNN picks)."""
    name, flags = cpu_model_and_flags()
    isa = next((isa for isa, flag in (("amx", "amx_tile"), ("avx512", "avx512f"), ("avx2", "avx2")) if flag in flags),
               "other")
    return {"model": name, "isa": isa}


def same_run(old: dict, new: dict, exact: bool) -> bool:
    if "error" in new or "error" in old:
        return False
    if exact:
        return old == new
    a, b = [float(x) for x in old["loss"]], [float(x) for x in new["loss"]]
    return len(a) == len(b) and all(abs(x - y) <= LOSS_RTOL * abs(x) for x, y in zip(a, b))


def record(preset: str, out: Path) -> dict:
    proc, _ = selfsup_cli("pretrain", preset, *TINY, f"output_dir={out}", f"name={preset}",
                          *EXTRA.get(preset, lambda _: [])(out), capture=True, check=False, OMP_NUM_THREADS="1")
    if proc.returncode:
        return {"error": proc.stderr.strip().splitlines()[-1:]}
    with (out / preset / "metrics.csv").open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/loss")]
    return {"loss": [r["train/loss"] for r in rows],
            "backbone_sha256": digest(out / preset / "backbone.safetensors"),
            "state_sha256": state_digest(out / preset / "checkpoints" / "last.ckpt")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="*", default=list(PRESETS))
    ap.add_argument("--out", default="benchmarks/results/seeded_losses.json")
    ap.add_argument("--compare", help="an earlier JSON of this script")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {p: record(p, Path(tmp)) for p in args.presets}
    report = {"presets": runs, "overrides": TINY, "cpu": cpu_record()}
    if args.compare:
        before = json.loads(Path(args.compare).read_text())
        old = before["presets"]
        exact = before.get("cpu", {}).get("isa") == report["cpu"]["isa"]
        if not exact:
            print(f"recorded on another CPU kind ({before.get('cpu', {}).get('isa', 'unknown')}, here "
                  f"{report['cpu']['isa']}): losses compared within rtol {LOSS_RTOL}, digests not compared")
        report["identical_to"] = args.compare
        report["comparison"] = "bit-identical" if exact else f"losses within rtol {LOSS_RTOL}"
        report["identical"] = {p: p in old and same_run(old[p], r, exact) for p, r in runs.items()}
    write_report(report, args.out)
    for p, r in runs.items():
        same = report.get("identical", {}).get(p)
        print(f"{p:24s} steps={len(r.get('loss', []))} {r.get('error') or r['backbone_sha256'][:12]}"
              + ("" if same is None else f" identical={same}"))
    if args.compare and not all(report["identical"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
