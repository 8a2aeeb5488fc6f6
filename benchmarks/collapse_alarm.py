"""The collapse alarm both ways (issue 37 item 4): it fires on runs that collapse by construction, and stays
silent on healthy ones.

Collapse by construction (each at its digits preset, one change):

* ``vicreg-inv``: VICReg with only its invariance term (``method.std_coeff=0 method.cov_coeff=0``): the loss is
  minimal at a constant; ``vicreg-digits`` ends at kNN 37.9% against its init's 58.5%.
* ``simsiam-nosg``: SimSiam without stop-gradient and predictor (SimSiam §4.1: it collapses at once).
* ``dino-nocenter``: DINO with sharpening only (``method.centering=none``; the DINO paper's Fig. 7: one output wins).
* ``wmse-10lr``: W-MSE at 10x its lr.

Healthy: every SSL micro-ViT ``*-digits`` preset with its own defaults (the false alarms; 0 is the goal), and
with ``--fmnist`` the changed ``*-fmnist`` presets at their 5-epoch budget are read from the methods table's run
folders instead (``--runs-from``). Each run records its events, the end-of-run kNN against its random init,
and the alarm's overhead is measured separately by ``instrument_overhead.py``.

    python -m benchmarks.collapse_alarm                     # all (~25 CPU-min on one thread)
    python -m benchmarks.collapse_alarm --only vicreg-inv,dino-digits
    python -m benchmarks.collapse_alarm --scan runs/methods_fmnist   # read the alarm events of finished runs
    python -m benchmarks.collapse_alarm --cost simclr-fmnist,dino-fmnist   # its cost beside the training step

``--cost``: the alarm's own work at a measurement step (the effective rank of the step's backbone features, a
(batch, width) SVD on the device, then ``observe``) timed against the preset's training step (``mfu.py``'s
SelfsupStep: forward, backward, optimiser) in the same process, alternating, in process CPU time; amortised over
``instruments.every_n_steps`` (10). Its one host read rides on the instruments' existing one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import nullcontext
from pathlib import Path

from benchmarks.harness import pretrain, read_report, timed, write_report

COLLAPSES = {
    "vicreg-inv": ("vicreg-digits", ["method.std_coeff=0", "method.cov_coeff=0"]),
    "simsiam-nosg": ("simsiam-digits", ["method.stop_gradient=false", "method.predictor=none"]),
    "dino-nocenter": ("dino-digits", ["method.centering=none"]),
    "wmse-10lr": ("wmse-digits", ["optim.base_lr=1.5e-2"]),
}
HEALTHY = ("moco-v3-vit-digits", "byol-digits", "simsiam-digits", "simclr-digits", "barlow-twins-digits",
           "vicreg-digits", "nnclr-digits", "dino-digits", "ibot-digits", "mae-digits", "swav-digits", "wmse-digits")


def run_one(name: str, preset: str, overrides: list[str], root: Path, seed: int) -> dict:
    """``selfsup pretrain`` in this process (one thread); the collapse events and the kNN it wrote."""
    from selfsup.instruments.detectors import read_events

    run = root / name
    wall = None
    if not (run / "knn.json").exists():
        done = pretrain(preset, [*overrides, f"trainer.seed={seed}", "trainer.progress_bar=false"], run)
        wall = round(done.wall_s, 1)
    return scored(run, name, preset, overrides, wall, read_events)


def scored(run: Path, name: str, preset: str, overrides: list[str], wall, read_events) -> dict:
    events = [e for e in read_events(run / "events.jsonl") if e.get("kind") == "collapse"]
    knn = json.loads((run / "knn.json").read_text()) if (run / "knn.json").exists() else {}
    top1 = {k: v.get("top1") for k, v in knn.items() if isinstance(v, dict) and "top1" in v}
    return {"name": name, "preset": preset, "overrides": overrides, "fired": bool(events),
            "collapse_events": [{k: e[k] for k in ("step", "sign", "value", "baseline")} for e in events],
            "knn_top1": top1, "train_wall_s": wall}


def scan(folder: Path) -> list[dict]:
    """The alarm's current rule replayed (``CollapseAlarm.replay``) over the logged series of every finished run
    under ``folder`` (the values it observes are the ones a run logs), judged from the run's warm-up on, and its
    end-of-run rule on the run's ``knn.json`` (``runs.learning.knn_verdict``: a loss past the noise band, as
    ``runs.finish`` judges it); beside the collapse events the run itself wrote (an older rule's, where it ran with
    one)."""
    import csv

    import yaml

    from selfsup.instruments.collapse import KNN_OVER_INIT, CollapseAlarm, collapse_signs
    from selfsup.instruments.detectors import read_events
    from selfsup.runs.learning import knn_verdict

    out = []
    for run in sorted(p.parent for p in folder.rglob("run.json")):
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        facts = json.loads((run / "run.json").read_text())
        if facts.get("status") != "finished":
            continue
        spe = facts["global_step"] / max(facts["epochs"], 1)
        warmup = int(round(float(cfg["optim"]["warmup_epochs"]) * spe))
        ins = cfg.get("instruments", {})
        alarm = CollapseAlarm(ins.get("collapse_window", 5), collapse_signs(ins.get("collapse_rank_fraction", 0.25)))
        series: dict = {}
        with (run / "metrics.csv").open(newline="") as f:
            for row in csv.DictReader(f):
                for name in alarm.names():
                    if row.get(f"instruments/{name}"):
                        series.setdefault(name, []).append((int(row["step"]), float(row[f"instruments/{name}"])))
        logged = [{k: e[k] for k in ("step", "sign", "value")} for e in read_events(run / "events.jsonl")
                  if e.get("kind") == "collapse"]
        fired = alarm.replay(series, warmup)
        if (run / "knn.json").exists():  # the end-of-run half of knn_over_init (runs/finish.py not_learning)
            knn = json.loads((run / "knn.json").read_text())
            verdict, over, band = knn_verdict(knn)  # a loss past the noise band, as runs/finish.py judges it
            if verdict == "loss" and not any(e["sign"] == KNN_OVER_INIT.name for e in fired):
                fired.append({"step": facts["global_step"], "sign": KNN_OVER_INIT.name, "value": over,
                              "raw": knn["pretrained"]["top1"], "baseline": -band})
        out.append({"name": run.name, "method": cfg["method"]["name"], "warmup_steps": warmup,
                    "measured": {k: len(v) for k, v in series.items()}, "fired": bool(fired), "replayed": fired,
                    "events_the_run_wrote": logged})
    return out


def alarm_cost(preset: str, reps: int = 5) -> dict:
    """Process-CPU seconds of one alarm measurement and of one training step of ``preset``, side by side."""
    import argparse as ap

    import torch

    from benchmarks.mfu import SelfsupStep, make_views
    from selfsup.config import load_run_config
    from selfsup.data.datasets import load_dataset
    from selfsup.instruments.collapse import CollapseAlarm
    from selfsup.instruments.measures import batch_effective_rank
    from selfsup.methods.build import data_info

    cfg = load_run_config(preset, ["trainer.seed=0"])
    info = data_info(cfg, load_dataset(cfg.data, "train"))
    args = ap.Namespace(synthetic=False, batch_size=cfg.data.batch_size, dataset=cfg.data.name)
    batches, _, _ = make_views(cfg, info, torch.device("cpu"), 2, args)
    step = SelfsupStep(cfg, info, torch.device("cpu"), nullcontext)
    with torch.no_grad():
        embedding = step.model.forward_views(batches[0], **step.model.step_draws(batches[0])).embedding
    alarm = CollapseAlarm()
    steps, checks = [], []
    step(batches[0])  # warm-up
    for i in range(reps):  # alternating: the step, then the alarm's measurement; process CPU seconds of each
        steps.append(timed(lambda: step(batches[i % 2]), 1)[0][1])
        check = timed(lambda: alarm.observe({"eff_rank_batch": float(batch_effective_rank(embedding))}), 10)
        checks.append(sum(c for _, c in check) / len(check))
    step_s, check_s = sorted(steps)[len(steps) // 2], sorted(checks)[len(checks) // 2]
    return {"preset": preset, "embedding": list(embedding.shape), "step_cpu_ms": round(1000 * step_s, 2),
            "alarm_measurement_cpu_ms": round(1000 * check_s, 3),
            "overhead_at_every_10_steps": round(check_s / step_s / 10, 6)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", help="comma list of case names (the collapses' names, or healthy preset names)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", default="runs/collapse_alarm", help="folder of the runs (a finished run is re-read)")
    p.add_argument("--scan", metavar="FOLDER", help="only read the collapse events of the finished runs under it")
    p.add_argument("--cost", metavar="PRESETS", help="only time the alarm against these presets' training steps")
    p.add_argument("--out", default="benchmarks/results/collapse_alarm.json")
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.cost:
        import torch

        torch.set_num_threads(1)
        rows = [alarm_cost(preset) for preset in args.cost.split(",")]
        for row in rows:
            print(json.dumps(row), flush=True)
        cost_out = out.with_name(out.stem + "_cost.json")
        write_report({"note": "process CPU time, one thread, medians of 5 alternating repetitions", "rows": rows},
                     cost_out)
        print(f"wrote {cost_out}")
        return 0
    if args.scan:
        rows = scan(Path(args.scan))
        write_report({"scanned": args.scan, "runs": rows, "fired": sum(r["fired"] for r in rows)}, out)
        print(json.dumps({r["name"]: r["fired"] for r in rows}))
        return 0
    import torch

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cases = {**COLLAPSES, **{n: (n, []) for n in HEALTHY}}
    names = args.only.split(",") if args.only else list(cases)
    unknown = [n for n in names if n not in cases]
    if unknown:
        print(f"error: --only {','.join(unknown)}: no such case; choose from {', '.join(cases)}", file=sys.stderr)
        return 2
    results = read_report(out)
    done = {r["name"]: r for r in results.get("collapse", []) + results.get("healthy", [])}
    for name in names:
        preset, overrides = cases[name]
        done[name] = run_one(name, preset, overrides, Path(args.runs), args.seed)
        print(json.dumps({k: done[name][k] for k in ("name", "fired", "collapse_events", "knn_top1")}), flush=True)
    collapse = [done[n] for n in COLLAPSES if n in done]
    healthy = [done[n] for n in HEALTHY if n in done]
    write_report({"note": f"seed {args.seed}, digits presets, one thread on a 2-core machine shared with other work",
                  "collapse": collapse, "healthy": healthy,
                  "fired_on_collapse": f"{sum(r['fired'] for r in collapse)} of {len(collapse)}",
                  "false_alarms": f"{sum(r['fired'] for r in healthy)} of {len(healthy)}"}, out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
