"""The floor sweep's variants side by side: one panel per collapse sign, one line per variant, and a table.

Reads the variants of ``benchmarks/floor_sweep.py``'s result JSONs (each holds the series it read from its run's
``metrics.csv``: ``loss``, ``eff_rank_embedding``, ``wmse_cov_condition``, ...), keeps those of one preset, and
plots each sign against the step (a log axis for the condition number). A variant that stopped (a collapse, or
stopped by hand) ends where its run ended; its legend says so. The table printed beside it gives each variant's
validation gain and its signs at the last logged step::

    python -m benchmarks.floor_curves --preset wmse-vit-fmnist --epochs 5 \\
        --signs eff_rank_embedding,wmse_cov_condition,loss --out benchmarks/results/wmse_fmnist_5ep_curves.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from benchmarks.harness import RESULTS

LOG_SIGNS = ("wmse_cov_condition",)  # spans decades: plotted on a log axis


def variants(files: list[Path], preset: str, epochs: int, seed: int) -> dict[str, dict]:
    """Every finished or stopped variant of ``preset`` at this budget and seed, by name (a later file wins)."""
    out = {}
    for f in files:
        for v in json.loads(f.read_text()).get("variants", []):
            if v["preset"] == preset and v["epochs"] == epochs and v["seed"] == seed:
                out[v["name"]] = v
    return dict(sorted(out.items()))


def label(v: dict) -> str:
    if v.get("gain_val") is not None:
        return f"{v['name']} ({v['gain_val']:+.2f})"
    return f"{v['name']} (stopped at step {v.get('stopped_at_step', '?')})"


def table(vs: dict[str, dict], signs: list[str]) -> str:
    head = "| variant | overrides | val gain | " + " | ".join(f"{s} (last)" for s in signs) + " |"
    lines = [head, "|" + "---|" * (3 + len(signs))]
    for v in vs.values():
        last = [f"{v[s][-1][1]:.3g} @ {v[s][-1][0]}" if v.get(s) else "–" for s in signs]
        gain = f"{v['gain_val']:+.2f}" if v.get("gain_val") is not None else "stopped"
        lines.append(f"| {v['name']} | {' '.join(v['overrides']) or '(preset)'} | {gain} | " + " | ".join(last) + " |")
    return "\n".join(lines)


def plot(vs: dict[str, dict], signs: list[str], title: str, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(signs), figsize=(5 * len(signs), 4), squeeze=False)
    colours = plt.get_cmap("tab20").colors  # one colour per variant up to 20 (tab10 repeats after 10)
    for ax, sign in zip(axes[0], signs):
        for i, v in enumerate(vs.values()):
            if v.get(sign):
                steps, values = zip(*v[sign])
                stopped = v.get("gain_val") is None  # a stopped run: dashed, as its legend says
                ax.plot(steps, values, label=label(v), lw=1.2, color=colours[i % len(colours)],
                        ls="--" if stopped else "-")
        ax.set_title(sign)
        ax.set_xlabel("step")
        if sign in LOG_SIGNS:
            ax.set_yscale("log")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", required=True)
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--seed", type=int, default=100)
    p.add_argument("--signs", default="eff_rank_embedding,loss", help="comma list of the series to plot")
    p.add_argument("--files", nargs="*", help="result JSONs (default: results/floor_sweep*.json)")
    p.add_argument("--out", required=True, help="the PNG; its table goes beside it as .md")
    args = p.parse_args(argv)
    files = [Path(f) for f in args.files] if args.files else sorted(RESULTS.glob("floor_sweep*.json"))
    vs = variants(files, args.preset, args.epochs, args.seed)
    if not vs:
        print(f"error: no {args.preset} variant at {args.epochs} epochs, seed {args.seed} in {len(files)} files; "
              "run python -m benchmarks.floor_sweep first", file=sys.stderr)
        return 2
    signs = args.signs.split(",")
    out = Path(args.out)
    plot(vs, signs, f"{args.preset}, {args.epochs} epochs, seed {args.seed}: floor_sweep variants", out)
    text = table(vs, signs)
    out.with_suffix(".md").write_text(text + "\n")
    print(text)
    print(f"wrote {out} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
