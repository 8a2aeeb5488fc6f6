"""Seeded runs' per-step losses and exported-backbone digests, to show a refactor changed no result.

Runs a few steps of each listed preset through the ``selfsup`` command line (so it works whatever the
package's internal layout), records every logged loss exactly (as the CSV's text) and a SHA-256 of the
exported backbone's tensors, and writes JSON. ``--compare OLD.json`` also reports, per preset, whether
the losses and the backbone are bit-identical to an earlier recording (exit 1 if any differs).

    python benchmarks/seeded_losses.py --out benchmarks/results/seeded_losses.json
    python benchmarks/seeded_losses.py --compare benchmarks/results/seeded_losses_before.json
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PRESETS = ("moco-v3-vit-digits", "byol-digits", "simsiam-digits", "simclr-digits",
           "byol-directpred-fmnist", "self-flow-digits", "flow-matching-digits", "repa-digits")
TINY = ["data.batch_size=64", "trainer.max_epochs=1", "trainer.limit_train_batches=6",
        "trainer.log_every_n_steps=1", "trainer.progress_bar=false", "trainer.accelerator=cpu",
        "trainer.devices=1"]
EXTRA = {  # repa needs a frozen encoder: the moco-v3 run of this script
    "repa-digits": lambda out: [f"method.encoder={out / 'moco-v3-vit-digits'}"],
}


def digest(path: Path) -> str:
    from safetensors.torch import load_file

    h = hashlib.sha256()
    for key, value in sorted(load_file(str(path)).items()):
        h.update(key.encode())
        h.update(value.contiguous().numpy().tobytes())
    return h.hexdigest()


def record(preset: str, out: Path) -> dict:
    cmd = [str(Path(sys.executable).with_name("selfsup")), "pretrain", preset, *TINY,
           f"output_dir={out}", f"name={preset}", *EXTRA.get(preset, lambda _: [])(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        return {"error": proc.stderr.strip().splitlines()[-1:]}
    with (out / preset / "metrics.csv").open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/loss")]
    return {"loss": [r["train/loss"] for r in rows],
            "backbone_sha256": digest(out / preset / "backbone.safetensors")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="*", default=list(PRESETS))
    ap.add_argument("--out", default="benchmarks/results/seeded_losses.json")
    ap.add_argument("--compare", help="an earlier JSON of this script")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = {p: record(p, Path(tmp)) for p in args.presets}
    report = {"presets": runs, "overrides": TINY}
    if args.compare:
        old = json.loads(Path(args.compare).read_text())["presets"]
        report["identical_to"] = args.compare
        report["identical"] = {p: p in old and old[p] == r and "error" not in r for p, r in runs.items()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    for p, r in runs.items():
        same = report.get("identical", {}).get(p)
        print(f"{p:22s} steps={len(r.get('loss', []))} {r.get('error') or r['backbone_sha256'][:12]}"
              + ("" if same is None else f" identical={same}"))
    if args.compare and not all(report["identical"].values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
