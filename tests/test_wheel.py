"""A real install: the wheel ``pip`` builds from this tree, installed (not editable) into a fresh virtual
environment, gives a working ``selfsup`` with every data file (presets) as package data.

Offline and without reinstalling torch: ``venv --system-site-packages`` would expose the *base* interpreter's
packages, and where the test runs from a virtual environment (as here) torch is not there. So the fresh
environment is made without pip and given one ``.pth`` line per site-packages folder of this interpreter:
plain path lines, so that interpreter's own ``.pth`` files (an editable selfsup among them) are not run.
This interpreter's pip installs the wheel into it (``pip --python``; ``--ignore-installed`` so that pip
never touches a selfsup it sees on those paths) and ``pip check`` confirms the wheel's requirements.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import torch
import pytest

pytestmark = pytest.mark.spawn  # tests/tiers.py

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "selfsup"
ONE_STEP = ["method.proj_hidden_dim=64", "method.pred_hidden_dim=64", "method.dim=32", "data.batch_size=1024",
            "trainer.max_epochs=1", "trainer.progress_bar=false", "trainer.accelerator=cpu", "trainer.devices=1"]


END_OF_PRESETS = "=== end of selfsup presets ===\n"
LIST_BOTH = f"""import sys
from selfsup.commands.main import main
if main(["presets"]):
    sys.exit(1)
print({END_OF_PRESETS!r}, end="", flush=True)
sys.exit(main(["claims", "list"]))
"""


def run(cmd, cwd, timeout=180):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")} | {"OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_the_wheel_installs_into_a_fresh_venv_and_pretrains_one_step(tmp_path):
    src = tmp_path / "tree"  # a clean copy, so the build writes no build/ or egg-info into the checkout
    shutil.copytree(PACKAGE, src / "src" / "selfsup", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w",
         tmp_path / "dist", src], cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("selfsup-*.whl")
    data_files = {p.relative_to(PACKAGE.parent).as_posix() for p in PACKAGE.rglob("*")
                  if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}
    assert any(f.startswith("selfsup/presets/") for f in data_files)
    assert data_files - set(zipfile.ZipFile(wheel).namelist()) == set(), "add them to [tool.setuptools.package-data]"

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path)
    python = venv / "bin" / "python"
    site = Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp_path).strip())
    here = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "outer-site-packages.pth").write_text("".join(f"{p}\n" for p in here))
    run([sys.executable, "-m", "pip", "--python", python, "install", "--no-index", "--no-deps", "--ignore-installed",
         wheel], cwd=tmp_path)
    run([sys.executable, "-m", "pip", "--python", python, "check"], cwd=tmp_path)

    work = tmp_path / "work"
    work.mkdir()
    where = run([python, "-c", "import selfsup, sys; print(selfsup.__file__); print(sys.path)"], work)
    assert where.splitlines()[0].startswith(str(site / "selfsup")), where
    assert str(ROOT / "src") not in where and str(Path(sys.prefix).parents[0] / "src") not in where
    selfsup = venv / "bin" / "selfsup"
    # the presets and the committed verdicts are package data: both listed by the venv's selfsup in one interpreter
    # (the one start of torch and Lightning); the console script itself runs the pretraining below
    listed = run([python, "-c", LIST_BOTH], work)
    presets, claims = listed.split(END_OF_PRESETS)
    assert "moco-v3-vit-digits" in presets and "byol-r50-imagenet" in presets
    assert re.search(r"last: (reproduced|not reproduced|inconclusive)", claims), claims[:2000]
    out = run([selfsup, "pretrain", "moco-v3-vit-digits", *ONE_STEP, f"output_dir={work}", "name=r"], work)
    assert f"run folder: {work / 'r'}" in out
    assert torch.load(work / "r" / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 1
    assert (work / "r" / "backbone.safetensors").exists()
