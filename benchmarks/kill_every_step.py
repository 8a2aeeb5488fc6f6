"""SIGKILL at every step of a short run, for every method of the registry: does the run still end as the one never
stopped?

For each method (its ``*-digits`` preset, heads narrowed, ``--epochs`` x ``--batches``, a checkpoint every step):
one uninterrupted run, then one run SIGKILLed right after the checkpoint of step 1, resumed and SIGKILLed after
the checkpoint of step 2, and so on: every session but the last trains one step and dies (so every epoch's last
and first batch is a resume point, after as many resumes as steps). The last session trains to the end. The
table says whether the final step count, weights and optimiser state equal the uninterrupted run's, bit for bit.
Kills are forks of this process (no interpreter start per session: ``forked_session`` of tests/ssl_helpers.py).
Too long for the test suite (about 15 CPU-s per method on the default 6 steps); tests/test_kill_resume.py kills at
the epoch boundaries.

    python -m benchmarks.kill_every_step [--methods moco_v3,dino] [--epochs 2] [--batches 3]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.harness import RESULTS, ROOT, write_report

NARROW = {"proj_hidden_dim": 32, "pred_hidden_dim": 32, "dim": 16, "out_dim": 32, "hidden_dim": 32,
          "bottleneck_dim": 16, "patch_out_dim": 32, "decoder_embed_dim": 16, "decoder_depth": 1,
          "decoder_num_heads": 2, "ema_warmup_steps": 2, "rep_warmup_steps": 2, "warmup_teacher_temp_epochs": 1}


def preset_of(name: str) -> str | None:
    import yaml

    from selfsup.config import PRESET_DIR

    for path in sorted(PRESET_DIR.glob("*-digits.yaml")):
        if ((yaml.safe_load(path.read_text()) or {}).get("method") or {}).get("name") == name:
            return path.stem
    return None


def overrides(name: str, epochs: int, batches: int, work: Path) -> list[str]:
    from selfsup.methods import METHODS

    fields = {f.name for f in dataclasses.fields(METHODS[name].Config)}
    out = ["data.batch_size=32", "trainer.accelerator=cpu", "trainer.devices=1", "trainer.progress_bar=false",
           f"trainer.max_epochs={epochs}", f"trainer.limit_train_batches={batches}",
           "trainer.checkpoint_every_n_steps=1", "trainer.log_every_n_steps=1", "optim.warmup_epochs=1",
           "trainer.loggers=csv"]
    out += [f"method.{k}={v}" for k, v in NARROW.items() if k in fields]
    if "encoder" in fields:  # REPA: a frozen random ViT from a file
        from selfsup.export import export_backbone
        from selfsup.models.backbones import build_backbone

        path = work / "encoder.safetensors"
        if not path.exists():
            kwargs = dict(in_chans=1, image_size=8, patch_size=4)
            torch.manual_seed(0)
            export_backbone(build_backbone("vit_micro", **kwargs), path,
                            {"backbone": "vit_micro", "kwargs": kwargs, "image_size": 8, "in_chans": 1,
                             "mean": [0.3], "std": [0.3], "dataset": "digits", "method": "moco_v3"})
        out.append(f"method.encoder={path}")
    return out


def final(run: Path) -> dict:
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


def same(a: dict, b: dict) -> bool:
    if a["state_dict"].keys() != b["state_dict"].keys():
        return False
    if not all(torch.equal(v, b["state_dict"][k]) for k, v in a["state_dict"].items()):
        return False
    oa, ob = a["optimizer_states"][0]["state"], b["optimizer_states"][0]["state"]
    return oa.keys() == ob.keys() and all(torch.equal(v, ob[i][n]) for i in oa for n, v in oa[i].items())


def forked_session(*args, **kwargs) -> int:
    """``tests/ssl_helpers.py``'s ``forked_session``: the kill tests' own forked, SIGKILLed sessions."""
    if "ssl_helpers" not in sys.modules:  # loaded once, from its file (tests/ is no package)
        spec = importlib.util.spec_from_file_location("ssl_helpers", ROOT / "tests" / "ssl_helpers.py")
        sys.modules["ssl_helpers"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules["ssl_helpers"])
    return sys.modules["ssl_helpers"].forked_session(*args, **kwargs)


def bench(name: str, epochs: int, batches: int, work: Path) -> dict:
    from selfsup.config import load_run_config

    preset = preset_of(name)
    if preset is None:
        return {"method": name, "error": "no *-digits preset"}
    ov = overrides(name, epochs, batches, work)
    steps = epochs * batches
    started = time.perf_counter()
    assert forked_session(load_run_config(preset, ov + [f"output_dir={work}", f"name={name}-A"]), quiet=True) == 0
    run_b = work / f"{name}-B"
    statuses = [forked_session(load_run_config(preset, ov + [f"output_dir={work}", f"name={name}-B"]), 1, quiet=True)]
    for k in range(2, steps):
        statuses.append(forked_session(run_b, k, quiet=True))
    statuses.append(forked_session(run_b, quiet=True))
    killed = sum(os.WIFSIGNALED(s) and os.WTERMSIG(s) == signal.SIGKILL for s in statuses[:-1])
    a, b = final(work / f"{name}-A"), final(run_b)
    return {"method": name, "preset": preset, "planned_steps": steps, "steps_straight": int(a["global_step"]),
            "steps_resumed": int(b["global_step"]), "sessions": len(statuses), "sigkilled": killed,
            "last_session_ok": statuses[-1] == 0, "bit_identical": same(a, b),
            "seconds": round(time.perf_counter() - started, 1)}


def main() -> None:
    from selfsup.methods import METHODS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--out", default=str(RESULTS / "kill_every_step.json"))
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.methods.split(","):
            rows.append(bench(name, args.epochs, args.batches, Path(tmp)))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    header = "| method | preset | steps planned | straight | resumed | sessions (SIGKILLed) | bit-identical |"
    lines = [header, "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['method']} | {r['error']} | | | | | |")
            continue
        lines.append(f"| {r['method']} | {r['preset']} | {r['planned_steps']} | {r['steps_straight']} | "
                     f"{r['steps_resumed']} | {r['sessions']} ({r['sigkilled']}) | "
                     f"{'yes' if r['bit_identical'] and r['last_session_ok'] else 'NO'} |")
    print("\n".join(lines))
    write_report({"epochs": args.epochs, "batches": args.batches, "torch": torch.__version__, "rows": rows,
                  "table": lines}, args.out)


if __name__ == "__main__":
    main()
