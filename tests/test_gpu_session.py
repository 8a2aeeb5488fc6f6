"""benchmarks/gpu_session.sh's dry run: every part of the GPU session runs on the CPU at toy size and writes its JSON
into the packed results, so the one run a lent GPU gets is not spent on a broken script. Two groups, each one run of
the script, so that xdist runs them side by side: the open issues' parts (49 and 50) and issue 52's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.spawn  # tests/tiers.py

ROOT = Path(__file__).resolve().parents[1]
GROUPS = {"open_issues": ("distill", "folder"), "speed": ("step", "e2e", "mfu", "decode", "methods"),
          "gram": ("gram",)}


def dry_run(out: Path, parts: tuple[str, ...]) -> tuple[str, dict]:
    """``gpu_session.sh --dry-run PARTS`` into ``out``: parts.txt and the JSONs of the packed results by name."""
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "PYTHONPATH": str(ROOT / "src")}
    env.pop("SELFSUP_FASHION_MNIST_DIR", None)
    done = subprocess.run(["bash", "benchmarks/gpu_session.sh", "--dry-run", *parts], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1500)
    listed = (out / "parts.txt").read_text() if (out / "parts.txt").exists() else ""
    assert done.returncode == 0, listed + done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu.txt", "gpu_session.tar.gz", "parts.txt"]  # <= 8 come back
    with tarfile.open(out / "gpu_session.tar.gz") as tar:
        tar.extractall(out / "results", filter="data")
    return listed, {p.name: json.loads(p.read_text()) for p in (out / "results").glob("*.json")}


@pytest.mark.parametrize("group", GROUPS)
def test_the_gpu_session_dry_run_writes_every_part(tmp_path, group):
    parts, results = dry_run(tmp_path, GROUPS[group])
    if group == "open_issues":
        check_open_issues(parts, results)
    elif group == "gram":
        check_gram(parts, results)
    else:
        check_speed(parts, results)


def check_gram(parts: str, results: dict) -> None:
    """Issue 65's claim at a GPU budget: both arms of a seed trained, the kNN of each, the claim's rules judged
    (the dense rule undefined until selfsup eval segment is in the tree)."""
    assert "gram: rc=0" in parts, parts
    result = results["gram_anchoring_30ep.json"]
    assert result["claim"] == "gram-anchoring-keeps-dense-features" and [r["seed"] for r in result["rows"]] == [0]
    assert [run["name"] for run in result["rows"][0]["runs"]] == ["gram-s0", "no_gram-s0"]
    assert 0 < result["metrics"]["gram_knn"][0] <= 100 and len(result["statistics"]) == 2


def check_open_issues(parts: str, results: dict) -> None:
    for name in ("distill", "folder"):
        assert f"{name}: rc=0" in parts, parts
    assert {"distill_presets_gpu.json", "folder_recipe_gpu.json"} <= results.keys(), sorted(results)
    distill = results["distill_presets_gpu.json"]
    assert "random values" in distill["note"] and "not the weights' quality" in distill["note"]
    assert distill["teacher_file"]["pos_embed"] == [1, 37 * 37 + 1, 384] and distill["teacher_file"]["layer_scale"]
    assert [r["preset"] for r in distill["runs"]] == ["distill-dinov2-vits14-r18-imagefolder",
                                                     "distill-dinov2-vits14-vits-imagefolder"]
    for r in distill["runs"]:
        assert r["config"]["model.backbone"] in ("resnet18", "deit_small") and r["steps"] == 2
        assert r["teacher_recorded"]["kind"] == "dinov2-hub" and r["teacher_recorded"]["resampled"].startswith(
            "37x37 -> 2x2")
        assert r["teacher_sha256_in_run_json"] and r["teacher_sha256_matches_method"]
        t = r["teacher"]
        assert (t["device"], t["training"], t["requires_grad"], t["grad_enabled"], t["in_state_dict"]) == (
            "cpu", False, False, False, False)
        assert t["output_dtype"] == "torch.float32" and r["teacher_bf16"] is None  # bf16 autocast on a GPU only
        assert r["loss_finite"] and len(r["losses"]) == 2 and len(r["step_ms"]) == 2 and r["step_ms_median"] > 0
        assert r["teacher_forward_ms_median"] > 0 and r["peak_memory_gib"] is None
    folder = results["folder_recipe_gpu.json"]
    assert folder["side_by_side"] == 2 and folder["overrides"] == ["trainer.max_steps=2"] and not folder["gpu"]
    assert folder["as_gpu"] == "dry-run GPU"  # the GPU's recipe (its 8 x 8 grid target) trained on the CPU
    rows = {r["method"]: r for r in folder["rows"]}
    assert rows.keys() == {"simclr", "mae", "dinov2"}, rows.keys()
    for r in rows.values():
        assert r["images"] == 100 and r["seeds"] == [0]
        run = r["runs"][0]
        assert run["steps"] == 2 and run["fit_s"] is not None and run["gain"] == round(
            run["knn20_top1"] - run["random_init"], 2)
        recipe = run["recipe"]
        assert (recipe["trainer.accelerator"], recipe["data.image_size"], recipe["data.batch_size"]) == ("cpu", 27, 16)
        assert recipe.get("model.patch_size") == 3  # 28 px // GRID_GPU 8: a 9 x 9 grid, 27 px


def check_speed(parts: str, results: dict) -> None:
    for name in ("step", "e2e", "e2e_2workers", "mfu", "decode", "methods"):
        assert f"{name}: rc=0" in parts, parts
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
