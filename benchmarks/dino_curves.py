"""The collapse signs of a DINO run over its steps, beside its schedules: a PNG and a JSON of the curves.

Reads the run's ``metrics.csv`` (the instruments are logged every ``instruments.every_n_steps``): the teacher's
entropy against log K (uniform targets), the KL between teacher and student, the teacher logits' spread over the
batch in units of τt (``dino_teacher_spread``: under 1, what the centre leaves of the logits is too small for any
target to be sharp), the centre's norm, and the lr, teacher momentum and τt of each step. The JSON holds the
series and a summary by fifths of the run, so a README paragraph can quote where the teacher turns uniform::

    python -m benchmarks.methods_fmnist --presets dino-fmnist --epochs 5 --steps-per-epoch 0 --seeds 0 \\
        --resume --runs runs/methods5 --instruments --out benchmarks/results/methods_fmnist_5ep.json
    python -m benchmarks.dino_curves runs/methods5/dino-fmnist-s0 --out benchmarks/results/dino_fmnist_5ep_curves
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

from benchmarks.harness import write_report

SIGNS = {"entropy": "instruments/dino_teacher_entropy", "kl": "instruments/dino_kl_teacher_student",
         "spread_over_tau": "instruments/dino_teacher_spread", "center_norm": "instruments/dino_center_norm",
         "feature_dim_std": "instruments/dim_std_embedding", "feature_eff_rank": "instruments/eff_rank_embedding",
         "feature_rankme": "instruments/rankme_embedding"}
SCHEDULES = {"lr": "train/lr", "momentum": "train/momentum", "teacher_temp": "train/teacher_temp"}


def series(rows: list[dict], key: str) -> list[tuple[int, float]]:
    """(step, value) of every row that logged ``key``, in step order."""
    return sorted((int(r["step"]), float(r[key])) for r in rows if r.get(key) not in (None, ""))


def at(points: list[tuple[int, float]], step: int) -> float | None:
    """The value logged at the last step ≤ ``step`` (None before the first)."""
    before = [v for s, v in points if s <= step]
    return before[-1] if before else None


def curves(run: Path) -> dict:
    import yaml

    rows = list(csv.DictReader(open(run / "metrics.csv")))
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    log_k = math.log(cfg["method"]["out_dim"])
    out = {"run": str(run), "log_K": log_k, "series": {}}
    for name, key in {**SIGNS, **SCHEDULES}.items():
        out["series"][name] = series(rows, key)
    entropy = out["series"]["entropy"]
    if not entropy:
        raise SystemExit(f"{run}: no instruments/dino_teacher_entropy in metrics.csv (run with the instruments on)")
    last = entropy[-1][0]
    out["steps"] = last + 1
    out["by_fifth"] = [{"step": s, **{name: at(out["series"][name], s) for name in out["series"]}}
                       for s in (round(last * f / 5) for f in range(6))]
    out["entropy_min"] = min(entropy, key=lambda p: p[1])
    out["entropy_over_log_K_last"] = entropy[-1][1] / log_k
    return out


def plot(c: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(13, 6.5))
    panels = [("entropy", "teacher entropy (dashed: log K)"), ("spread_over_tau", "teacher logit spread / τt"),
              ("kl", "KL(teacher || student)"), ("center_norm", "centre norm"),
              ("feature_dim_std", "per-dim sd of the L2-normalised CLS"), ("lr", "lr, momentum, τt (scaled)")]
    for ax, (name, title) in zip(axes.flat, panels):
        if name == "lr":
            for key, style in (("lr", "-"), ("momentum", "--"), ("teacher_temp", ":")):
                pts = c["series"][key]
                if pts:
                    top = max(abs(v) for _, v in pts) or 1
                    ax.plot([s for s, _ in pts], [v / top for _, v in pts], style, label=f"{key} / {top:.3g}")
            ax.legend(fontsize=8)
        else:
            pts = c["series"][name]
            ax.plot([s for s, _ in pts], [v for _, v in pts])
            if name == "entropy":
                ax.axhline(c["log_K"], ls="--", c="k", lw=0.8)
            if name == "spread_over_tau":
                ax.axhline(1.0, ls="--", c="k", lw=0.8)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
    fig.suptitle(f"DINO collapse signs: {c['run']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="a DINO run folder with its instruments logged")
    p.add_argument("--out", default="benchmarks/results/dino_curves", help="writes OUT.json and OUT.png")
    args = p.parse_args(argv)
    c = curves(Path(args.run))
    out = Path(args.out)
    write_report(c, out.with_suffix(".json"), indent=1)
    plot(c, out.with_suffix(".png"))
    for row in c["by_fifth"]:
        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
