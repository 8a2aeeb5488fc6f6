"""What a DINO or iBOT teacher's [CLS] targets do with the images: how many of the K outputs they use.

The per-step instruments (``dino_teacher_entropy``, ``dino_teacher_spread``) tell a uniform teacher from a sharp
one, but not a sharp teacher that sends every image to one of a handful of outputs (a partial collapse of the K
prototypes). This reads a finished run's ``checkpoints/last.ckpt`` and its random init (the same seeded build) and
scores the teacher's targets softmax((t − C) / τt) on N test images, τt the run's final teacher temperature:

- ``argmax_used``: how many of the K outputs are some image's argmax; ``top_share``: the largest one's share;
- ``entropy``: the mean entropy of a target (0: one-hot, log K: uniform);
- ``purity``: the share of images whose argmax output's majority label is their own (10 classes: 0.1 if the
  outputs ignore the class, 1.0 if each output holds one class);
- ``feature_eff_rank``: RankMe without its ε (exp of the entropy of the normalised singular values) of the
  teacher's centred, L2-normalised [CLS] features, the ones kNN and the linear probe read (not the 99%-variance
  count of ``selfsup.eval.spectrum.effective_rank``).

::

    python -m benchmarks.teacher_usage runs/methods5/ibot-fmnist-s0 --out benchmarks/results/teacher_usage.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.harness import write_report
from selfsup.config import load_run
from selfsup.data.views import EvalTransform
from selfsup.errors import UserError
from selfsup.methods.build import build_method, data_info
from selfsup.runs.session import EvalSession


@torch.no_grad()
def teacher_outputs(model, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(teacher [CLS] logits, teacher [CLS] features) of a DINO or iBOT module (iBOT's head takes every token)."""
    model.eval()
    if hasattr(model, "center2"):  # iBOT: the head maps all tokens to ([CLS] logits, patch logits)
        tokens = model.teacher_backbone(x, return_all_tokens=True)
        return model.teacher_head(tokens)[0], tokens[:, 0]
    feats = model.teacher_backbone(x)
    return model.teacher_head(feats), feats


def entropy_rank(x: torch.Tensor) -> float:
    """exp(H(σ / Σσ)) over the non-zero singular values σ of ``x``: ``spectrum.rankme`` with ε = 0 (its ε would
    count each zero σ; that module stays as it is, its source is part of the norm claims' definition hash)."""
    s = torch.linalg.svdvals(x.double())
    p = s[s > 0] / s.sum()
    return math.exp(-(p * p.log()).sum().item())


def usage(logits: torch.Tensor, center: torch.Tensor, tau: float, feats: torch.Tensor, labels: torch.Tensor) -> dict:
    """The fields of the module docstring, from (N, K) teacher logits, the centre C, τt, (N, D) features, labels."""
    q = torch.softmax((logits.double() - center.double()) / tau, dim=-1)
    winner = q.argmax(-1)
    counts = torch.bincount(winner, minlength=q.shape[1])
    f = F.normalize(feats.double(), dim=-1)
    majority = sum(torch.bincount(labels[winner == k]).max().item() for k in winner.unique())
    return {"outputs": q.shape[1], "argmax_used": int((counts > 0).sum()),
            "top_share": round(counts.max().item() / len(winner), 4),
            "entropy": round(-(q * q.clamp_min(1e-300).log()).sum(-1).mean().item(), 4),
            "log_k": round(math.log(q.shape[1]), 4), "purity": round(majority / len(winner), 4),
            "feature_eff_rank": round(entropy_rank(f - f.mean(0)), 2)}


def score(run: Path, n: int) -> dict:
    cfg = load_run(run)
    if not hasattr(cfg.method, "teacher_temp"):
        raise UserError(f"{run} is a {cfg.method_name} run; this reads a DINO or iBOT teacher")
    test = EvalSession(str(run)).split("test", limit=n)
    info = data_info(cfg, test)
    ckpt = run / "checkpoints" / "last.ckpt"
    if not ckpt.exists():
        raise UserError(f"{ckpt} not found: score a finished run (its last checkpoint)")
    x, labels = EvalTransform(info.image_size, info.mean, info.std)(test.images), test.labels
    out = {"run": str(run), "method": cfg.method_name, "images": len(labels), "teacher_temp": cfg.method.teacher_temp}
    init = build_method(cfg, info)  # the same seeded build as the run's start (centre 0)
    trained = build_method(cfg, info)
    trained.load_state_dict(torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"])
    for tag, model in (("init", init), ("trained", trained)):
        logits, feats = teacher_outputs(model, x)
        out[tag] = usage(logits, model.center, cfg.method.teacher_temp, feats, labels)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="finished DINO / iBOT run folders")
    p.add_argument("--images", type=int, default=2000, help="test images scored (default 2000)")
    p.add_argument("--out", type=Path, help="JSON to write (default: print only)")
    args = p.parse_args()
    torch.set_num_threads(1)
    try:
        results = [score(run, args.images) for run in args.runs]
    except UserError as e:  # one line naming the thing and the fix, exit 2
        print(f"benchmarks.teacher_usage: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    for r in results:
        for tag in ("init", "trained"):
            print(r["run"], tag, json.dumps(r[tag]))
    if args.out:
        write_report(results, args.out, indent=1)


if __name__ == "__main__":
    main()
