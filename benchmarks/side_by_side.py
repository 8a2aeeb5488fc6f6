"""One benchmark of this tree beside the same benchmark of another checkout, in alternating fresh processes.

Each round runs benchmark ``BENCH`` of the other tree (``--old``, e.g. a ``git worktree`` of the previous
main) and then of this one, each on its own ``src/``, and reads one figure per method from the JSON they
write. Per-round ratios new / old cancel drift in the machine's speed; the report gives them with their
median and writes JSON.

    git worktree add --detach /tmp/old <commit>
    python -m benchmarks.side_by_side --old /tmp/old --bench throughput --rounds 3 \
        --args "--methods moco_v3,simclr --steps 10 --reps 2"
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.harness import RESULTS, ROOT, write_report

FIGURES = {  # benchmark → (path of the per-method figure in its JSON, what it is)
    "throughput": (("engine", "step_ms_min"), "engine step ms (best repetition)"),
    "mfu": (("selfsup", "step_ms_best"), "selfsup step ms (best repetition)"),
}


def run(tree: Path, bench: str, args: list[str], out: Path) -> dict:
    """Benchmark ``bench`` of the checkout ``tree`` on its own ``src/``: ``python -m benchmarks.BENCH`` where its
    benchmarks are a package, else the script ``benchmarks/BENCH.py`` of a checkout from before."""
    package = (tree / "benchmarks" / "__init__.py").exists()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree / "src"), str(tree)]),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    how = ["-m", f"benchmarks.{bench}"] if package else [str(tree / "benchmarks" / f"{bench}.py")]
    subprocess.run([sys.executable, *how, *args, "--out", str(out)], env=env, cwd=tree, check=True,
                   capture_output=True, text=True)
    return json.loads(out.read_text())


def figures(report: dict, path: tuple[str, ...]) -> dict[str, float]:
    cases = report.get("results") or report.get("cases") or {}
    out = {}
    for name, case in cases.items():
        value = case
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, (int, float)):
            out[name] = float(value)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", required=True, help="the other checkout (its benchmarks/ and src/)")
    p.add_argument("--bench", default="throughput", type=lambda name: name.removesuffix(".py"),
                   choices=sorted(FIGURES))
    p.add_argument("--args", default="", help="arguments for both runs of the benchmark")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", default=str(RESULTS / "side_by_side.json"))
    a = p.parse_args()
    path, what = FIGURES[a.bench]
    args, old = shlex.split(a.args), Path(a.old).resolve()
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.rounds):
            before = figures(run(old, a.bench, args, Path(tmp) / f"old{i}.json"), path)
            after = figures(run(ROOT, a.bench, args, Path(tmp) / f"new{i}.json"), path)
            rounds.append({"old": before, "new": after,
                           "ratio_new_over_old": {k: after[k] / before[k] for k in after if k in before}})
            print(f"round {i + 1}: " + ", ".join(f"{k} {r:.3f}" for k, r in rounds[-1]["ratio_new_over_old"].items()),
                  flush=True)
    names = sorted({k for r in rounds for k in r["ratio_new_over_old"]})
    summary = {k: {"median_ratio": statistics.median(r["ratio_new_over_old"][k] for r in rounds),
                   "ratios": [round(r["ratio_new_over_old"][k], 4) for r in rounds]} for k in names}
    report = {"benchmark": a.bench, "figure": what, "args": args, "old": str(old), "rounds": rounds,
              "summary": summary, "loadavg": os.getloadavg()}
    write_report(report, a.out)
    for k, v in summary.items():
        print(f"{k:10s} {what}: new / old median {v['median_ratio']:.3f} (per round {v['ratios']})")


if __name__ == "__main__":
    main()
