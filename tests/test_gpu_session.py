"""benchmarks/gpu_session.sh's dry run (issue 52): every part of the GPU session runs on the CPU at toy size and
writes its JSON, so the one run a lent GPU gets is not spent on a broken script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
import pytest

pytestmark = pytest.mark.spawn  # tests/tiers.py

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_session_dry_run_writes_every_part(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "PYTHONPATH": str(ROOT / "src")}
    env.pop("SELFSUP_FASHION_MNIST_DIR", None)
    done = subprocess.run(["bash", "benchmarks/gpu_session.sh", "--dry-run"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=1500)
    parts = (tmp_path / "parts.txt").read_text() if (tmp_path / "parts.txt").exists() else ""
    assert done.returncode == 0, parts + done.stdout[-3000:] + done.stderr[-3000:]
    for name in ("step", "e2e", "e2e_2workers", "mfu", "decode", "methods"):
        assert f"{name}: rc=0" in parts, parts
    results = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    expected = {"profile_moco_v3.json", "profile_dino.json", "sweep_moco_v3.json", "sweep_dino.json", "sdpa.json",
                "epoch_end.json", "end_to_end_cuda.json", "end_to_end_cuda_2workers.json", "mfu_cuda.json",
                "decode_realistic_cuda.json", "methods_fmnist_5ep_short.json"}
    assert expected <= results.keys(), sorted(results)
    profile = results["profile_dino.json"]
    assert profile["dry_run"] and profile["top_kernels"] and {"count", "sum_ms", "largest_ms"} <= profile[
        "idle_gaps"].keys() and "host_syncs_total" in profile
    sweep = results["sweep_moco_v3.json"]
    assert [r["batch"] for r in sweep["rows"]] == [4, 8] and all(r["mfu"] > 0 for r in sweep["rows"])
    assert results["sdpa.json"]["taken"] and results["sdpa.json"]["vit_calls_sdpa"]
    epoch_end = results["epoch_end.json"]
    assert len(epoch_end["crossing_step_ms"]) >= 1 and epoch_end["checkpoint_writes_ms"]
    arms = results["end_to_end_cuda.json"]["arms"]
    assert {"step_only", "device", "cpu"} <= arms.keys() and arms["device"]["of_step_only"] > 0
