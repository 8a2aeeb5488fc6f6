"""The engine's DDP path end to end: `selfsup pretrain` with two CPU processes (gloo).

Lightning's launcher re-runs the command once per extra device; the children must join the run
folder of the parent, each process must train on its own half of every global batch, and rank 0
alone exports and evaluates. (Loss and gradient equality with one process is pinned in test_ddp_two_view.py.)
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

from ssl_helpers import TINY
import pytest

pytestmark = pytest.mark.spawn  # tests/tiers.py

SELFSUP = Path(sys.executable).with_name("selfsup")


def test_two_process_cpu_ddp_run(tmp_path):
    overrides = [o for o in TINY if not o.startswith(("trainer.devices", "trainer.limit_train_batches"))]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [str(SELFSUP), "pretrain", "moco-v3-vit-digits", *overrides, "trainer.devices=2", "trainer.strategy=ddp",
         "data.batch_size=256", "model.backbone=vit_nano", f"output_dir={tmp_path}", "name=ddp"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    assert [p.name for p in tmp_path.iterdir()] == ["ddp"]  # the child joined the parent's run folder
    run_dir = tmp_path / "ddp"
    for name in ("config.yaml", "checkpoints/last.ckpt", "backbone.safetensors", "backbone_init.safetensors"):
        assert (run_dir / name).exists(), name
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    steps = sorted({int(r["step"]) for r in rows if r.get("train/loss")})
    assert steps == list(range(1437 // 256)), steps  # 5 global batches of 256 = 2 × 128 per process
    assert json.loads((run_dir / "run.json").read_text())["world_size"] == 2  # Lightning's banner is quiet now
    report = json.loads((run_dir / "knn.json").read_text())
    assert set(report) >= {"pretrained", "random_init"}
    assert run.stdout.count("kNN (k=20") == 1  # rank 0 alone evaluates
