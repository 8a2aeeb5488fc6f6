"""Every CPU self-supervised ``*-fmnist`` preset on Fashion-MNIST for one fixed budget: kNN@20, linear probe
(and fine-tuning for MAE), beside the random-init floor.

The budget is the same for every preset: ``--epochs`` epochs of ``--steps-per-epoch`` batches of
``--batch-size`` (each epoch a fresh seeded permutation of the 60k training images, cut to its batches;
warm-up 10% of the run), seed 0, through ``selfsup.engine.pretrain`` with each preset's own method,
heads, augmentation and optimiser (the budget overrides as ``benchmarks/redundancy.py``'s, with epochs
instead of one cut epoch, so DINO's per-epoch schedules, the teacher temperature and the frozen last
layer, have epochs to count). The engine's end-of-run kNN on the whole dataset is skipped to keep the budget.

Then each exported backbone (DINO: the teacher), and each distinct random-init backbone
(``backbone_init.safetensors``; presets with the same architecture and init share one), is evaluated by the
``selfsup eval`` runners, run in this process on the command line a user would type, on a fixed seeded
subset of the training split (``--eval-train`` images) against the whole 10k test split:
``selfsup eval knn --k 20`` (weighted, T = 0.07, DINO's protocol), ``selfsup eval linear`` (cached features,
the default (lr, wd) grid chosen on a held-out 10%, ``--probe-epochs``) and, for MAE only,
``selfsup eval finetune --epochs --ft-epochs`` of the pretrained encoder and of its random init; and the dense
score, ``selfsup eval segment`` on the canvas task of the run's dataset (fmnist-canvas, digits-canvas for --quick):
``segment_linear_miou`` / ``segment_knn_miou`` per row and per random init.
Writes ``benchmarks/results/methods_fmnist.json`` and prints the table (markdown).

    python -m benchmarks.methods_fmnist                          # every preset (~3 min training each, loaded CPU)
    python -m benchmarks.methods_fmnist --presets dino-fmnist --merge   # re-run one preset into the same JSON
    python -m benchmarks.methods_fmnist --quick                  # smoke test: digits, a few steps
    python -m benchmarks.methods_fmnist --table                  # print the table of the existing JSON
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.harness import cpu_kind, has_fashion_mnist, pretrain, trained, write_report
from benchmarks.redundancy import overrides as budget_overrides  # the shared fixed-budget overrides

PRESETS = ("simclr-fmnist", "byol-fmnist", "simsiam-fmnist", "moco-v3-vit-fmnist", "barlow-twins-fmnist",
           "vicreg-fmnist", "dino-fmnist", "ibot-fmnist", "dinov2-fmnist", "dinov3-fmnist", "mae-fmnist", "swav-fmnist",
           "wmse-vit-fmnist", "wmse-fmnist", "nnclr-fmnist", "ijepa-fmnist", "lejepa-fmnist",
           "moco-v2-fmnist", "tico-fmnist")
FINETUNED = ("MAE",)  # methods judged by fine-tuning (issue 16): their encoder and its random init are fine-tuned


def available(presets) -> list[str]:
    from selfsup.config import preset_names

    names = set(preset_names())
    return [p for p in presets if p.split("+")[0] in names]


def eval_cli(args, *argv: str) -> dict:
    """One ``selfsup eval`` command in this process; its JSON (the runner's own output file)."""
    from selfsup.commands.main import main as selfsup

    command, source, out = argv[0], argv[1], Path(argv[-1])
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        device = "cuda" if args.accelerator == "gpu" else "cpu"
        rc = selfsup(["eval", *argv[:-1], "--out", str(out), "--device", device])
    if rc:
        raise RuntimeError(f"selfsup eval {command} {source} exited {rc}")
    if args.verbose:
        print(buf.getvalue(), flush=True)
    init = Path(source).name == "backbone_init.safetensors"  # results keyed by the weights: the random init's .init
    return json.loads((out / f"{command}{'.init' if init else ''}.json").read_text())


def evaluate(backbone_file: Path, out: Path, args, finetune: bool) -> dict:
    common = ["--train-limit", str(args.eval_train)]
    t0 = time.perf_counter()
    knn = eval_cli(args, "knn", str(backbone_file), "--k", "20", *common, str(out))
    lin = eval_cli(args, "linear", str(backbone_file), "--mode", "features", "--epochs", str(args.probe_epochs),
                   *common, str(out))
    row = {"knn20_top1": round(knn["results"]["k=20"]["top1"], 2), "linear_top1": round(lin["test"]["top1"], 2),
           "linear_chosen_lr": lin["lr"], "eval_train_size": knn["train_size"], "test_size": knn["test_size"]}
    seg = eval_cli(args, "segment", str(backbone_file), str(out))  # the canvas of the run's dataset, its defaults
    row.update({f"segment_{p}_miou": round(seg[p]["miou"], 2) for p in ("linear", "knn")})
    if finetune:
        ft = eval_cli(args, "finetune", str(backbone_file), "--epochs", str(args.ft_epochs), *common, str(out))
        row["finetune_top1"] = round(ft["test"]["top1"], 2)
        row["finetune_epochs"] = ft["epochs"]
    row["eval_s"] = round(time.perf_counter() - t0, 1)
    return row


def finished_run(run: Path, cfg) -> Path | None:
    """``run`` when it holds a finished pretraining of exactly ``cfg`` (its backbone exported), else None."""
    from dataclasses import asdict

    from selfsup.config import load_run

    if trained(run).facts.get("status") != "finished" or not (run / "backbone.safetensors").exists():
        return None
    return run if asdict(load_run(run)) == asdict(cfg) else None


def digest(path: Path) -> str:
    """The weights' digest (names and bytes; not the metadata, which names the method): one floor per network."""
    from safetensors.torch import load_file

    h = hashlib.sha256()
    for name, t in sorted(load_file(str(path)).items()):
        h.update(name.encode())
        h.update(t.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())  # 1-D: a BN's 0-d counter too
    return h.hexdigest()[:16]


def ci(values: list[float]) -> str:
    """mean ± the 95% interval's half-width over seeds (Student t, n − 1 dof); one seed: its value alone."""
    from selfsup.claims.stats import interval, summary

    n, mean, sd = summary(values)
    if n < 2:
        return f"{mean:.1f}"
    lo, hi = interval(mean, sd, n)
    return f"{mean:.1f} ± {(hi - lo) / 2:.1f}"


def binomial_sd(top1: float, n: int) -> float:
    """The sampling sd, in points, of one top-1 figure p measured on n test images: 100·sqrt(p(1 − p)/n)."""
    p = top1 / 100
    return 100 * math.sqrt(p * (1 - p) / n)


def groups(results: dict) -> list[tuple[str, list[dict]]]:
    """The rows grouped by (preset, overrides), in PRESETS order, each group's rows in seed order."""
    out: dict[str, list[dict]] = {}
    for r in results["runs"]:
        name = r["preset"] + ("+" + "+".join(r["overrides"]) if r["overrides"] else "")
        out.setdefault(name, []).append(r)
    order = {p: i for i, p in enumerate(PRESETS)}
    return sorted(((k, sorted(v, key=lambda r: r.get("seed", 0))) for k, v in out.items()),
                  key=lambda kv: order.get(kv[1][0]["preset"], len(order)))


def machine(row: dict) -> str:
    """Where a row trained, short: torch's CPU ISA (AVX2, AVX512, ...), the GPU's name, or ? for rows measured
    before rows recorded it."""
    where = row.get("machine", "?")
    return where.split("torch ISA ")[1].split(";")[0] if "torch ISA " in where else where


def wall(rows: list[dict]) -> str:
    """The mean training wall time per seed, one figure per machine kind the rows ran on (they differ ×2-3)."""
    kinds: dict[str, list[float]] = {}
    for r in rows:
        kinds.setdefault(machine(r), []).append(r["train_wall_s"])
    return ", ".join(f"{sum(v) / len(v):.0f} ({k})" for k, v in sorted(kinds.items()))


def dense(rows: list[dict], floors: list[dict]) -> str:
    """The dense column: linear / kNN mIoU on the run's canvas task (``selfsup eval segment``), the random init's in
    brackets; "—" for rows measured before the column existed."""
    keys = ("segment_linear_miou", "segment_knn_miou")
    if not all(k in r for r in rows for k in keys):
        return "—"
    cell = " / ".join(ci([r[k] for r in rows]) for k in keys)
    if all(k in f for f in floors for k in keys):
        cell += " (" + " / ".join(ci([f[k] for f in floors]) for k in keys) + ")"
    return cell


def table(results: dict) -> str:
    budget = results["budget"]
    data = "Fashion-MNIST" if results["dataset"] == "fashion-mnist" else results["dataset"]
    per_epoch = budget["steps_per_epoch"] or "all"
    n_test = results["test_size"] or 1
    lines = [f"{data}, {budget['epochs']} epochs x {per_epoch} steps of {budget['batch_size']}, micro ViT "
             f"(`*-cnn-*`: the BN ConvNet); "
             f"kNN@20 and linear probe fit on {results['eval_train_size']} training images (the probe's lr chosen "
             f"on a held-out 10% of them), tested on {results['test_size']}; mean ± 95% interval over the seeds "
             f"(`benchmarks/methods_fmnist.py`)", "",
             "| preset | seeds | kNN@20 top-1 | linear top-1 | fine-tune top-1 | random init kNN / linear "
             "(/ fine-tune) | kNN gain over init | binomial sd | dense mIoU linear / kNN (init) | train s / seed |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, rows in groups(results):
        floors = [results["random_init"][r["random_init"]] for r in rows]
        knn = [r["knn20_top1"] for r in rows]
        ft = ci([r["finetune_top1"] for r in rows]) if all("finetune_top1" in r for r in rows) else "–"
        ref = f"{ci([f['knn20_top1'] for f in floors])} / {ci([f['linear_top1'] for f in floors])}"
        if ft != "–" and all("finetune_top1" in f for f in floors):
            ref += f" / {ci([f['finetune_top1'] for f in floors])}"
        gain = ci([r["knn20_top1"] - f["knn20_top1"] for r, f in zip(rows, floors)])
        sd = binomial_sd(sum(knn) / len(knn), n_test)
        lines.append(f"| `{name}` | {len(rows)} | {ci(knn)} | {ci([r['linear_top1'] for r in rows])} | {ft} | "
                     f"{ref} | {gain} | {sd:.2f} | {dense(rows, floors)} | {wall(rows)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", default=",".join(PRESETS),
                   help="comma list (those not in this tree are skipped); preset+key=value+... adds overrides")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--steps-per-epoch", type=int, default=20, help="0: every batch of the training split")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--eval-train", type=int, default=10000, help="training images the kNN / probe / fine-tune fit on")
    p.add_argument("--probe-epochs", type=int, default=30)
    p.add_argument("--ft-epochs", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seeds", default="0", help="comma list of training seeds; each (preset, seed) is one row")
    p.add_argument("--accelerator", default="cpu", choices=("cpu", "gpu"), help="trainer.accelerator of the runs")
    p.add_argument("--quick", action="store_true", help="digits, 2 x 3 steps, small evaluation")
    p.add_argument("--merge", action="store_true", help="replace / add these presets' rows in the existing JSON")
    p.add_argument("--resume", action="store_true",
                   help="like --merge, but skip the (preset, seed) rows the JSON already holds at this budget")
    p.add_argument("--table", action="store_true", help="only print the table of the existing JSON")
    p.add_argument("--combine", nargs="+", metavar="JSON",
                   help="merge the rows of these JSONs (one budget; e.g. one process a seed) into --out")
    p.add_argument("--verbose", action="store_true", help="print the eval runners' tables")
    p.add_argument("--runs", default="", metavar="DIR",
                   help="keep the run folders in DIR (PRESET-sSEED), e.g. to plot their instruments with selfsup "
                        "report (default: a temporary folder)")
    p.add_argument("--instruments", action="store_true",
                   help="log the instruments (off by default here); a seeded run is unchanged by them "
                        "(tests/test_instruments.py), so the rows stay the same rows")
    p.add_argument("--out", default="benchmarks/results/methods_fmnist.json")
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.table:
        print(table(json.loads(out.read_text())))
        return 0
    if args.combine:
        parts = [json.loads(Path(f).read_text()) for f in args.combine]
        results = parts[0]
        for part in parts[1:]:
            if part["budget"] != results["budget"]:
                raise SystemExit(f"--combine: the JSONs were measured with other budgets: {part['budget']}")
            keys = {(r["preset"], tuple(r["overrides"]), r.get("seed", 0)) for r in part["runs"]}
            results["runs"] = [r for r in results["runs"]
                               if (r["preset"], tuple(r["overrides"]), r.get("seed", 0)) not in keys] + part["runs"]
            results["random_init"].update(part["random_init"])
            results["total_wall_s"] = max(results.get("total_wall_s", 0), part.get("total_wall_s", 0))
        order = {p: i for i, p in enumerate(PRESETS)}
        results["runs"].sort(key=lambda r: (order.get(r["preset"], len(order)), r.get("seed", 0)))
        write_report(results, out)
        print(table(results))
        return 0
    if args.quick:
        args.epochs, args.steps_per_epoch, args.batch_size, args.eval_train, args.probe_epochs, args.ft_epochs = \
            2, 3, 32, 300, 2, 1
    seeds = [int(s) for s in args.seeds.split(",")]
    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))

    from selfsup.config import load_run_config

    fallback = args.quick or not has_fashion_mnist()
    if fallback and not args.quick:
        print("Fashion-MNIST files not found: running on digits instead", file=sys.stderr)
    results = {"dataset": "digits" if fallback else "fashion-mnist", "fallback_to_digits": fallback and not args.quick,
               "budget": {"epochs": args.epochs, "steps_per_epoch": args.steps_per_epoch,
                          "batch_size": args.batch_size, "warmup": "10% of the run"},
               "eval_train_size": args.eval_train, "test_size": None,
               "knn": {"k": 20, "temperature": 0.07}, "probe_epochs": args.probe_epochs,
               "finetune_epochs": args.ft_epochs, "threads": args.threads, "accelerator": args.accelerator,
               "host": platform.node(), "cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
               "note": "wall times on a 2-core machine shared with other work", "runs": [], "random_init": {}}
    if (args.merge or args.resume) and out.exists():
        old = json.loads(out.read_text())
        if old["budget"] != results["budget"]:
            raise SystemExit(f"--merge/--resume: {out} was measured with another budget {old['budget']}")
        results = old
    done = {(r["preset"], tuple(r["overrides"]), r.get("seed", 0)) for r in results["runs"]} if args.resume else set()

    started = time.perf_counter()
    presets = available(args.presets.split(","))
    todo = [(e, s) for s in seeds for e in presets if (e.split("+")[0], tuple(e.split("+")[1:]), s) not in done]
    with tempfile.TemporaryDirectory() as tmp:
        for i, (entry, seed) in enumerate(todo):
            preset, *extra = entry.split("+")
            budget = argparse.Namespace(steps=args.steps_per_epoch, batch_size=args.batch_size, seed=seed)
            o = budget_overrides(budget, fallback, args.runs or tmp, f"{preset}-s{seed}" if args.runs else f"run{i}")
            o = [x for x in o if not x.startswith(("trainer.max_epochs", "optim.warmup_epochs", "trainer.accelerator"))
                 and not (args.steps_per_epoch == 0 and x.startswith("trainer.limit_train_batches"))]
            o += [f"trainer.max_epochs={args.epochs}", f"optim.warmup_epochs={args.epochs / 10:g}",
                  f"trainer.accelerator={args.accelerator}"]
            if fallback:  # digits are 8 px: patch 2 (redundancy.py's fallback), local crops of 4 px
                o += ["augment.local_crops_size=4"] if "dino" in preset or "ibot" in preset else []
            if load_run_config(preset, []).augment.global_crops_scale is not None:  # the preset's scale sets the crop
                o = [x for x in o if not x.startswith("augment.crop_min=")]
            if args.instruments:
                o = [x for x in o if not x.startswith("instruments.enabled=")]
            cfg = load_run_config(preset, o + extra)
            method = type(cfg.method).__name__.removesuffix("Config")
            run = finished_run(Path(args.runs) / f"{preset}-s{seed}", cfg) if args.runs else None
            if run is not None:  # trained by an earlier call whose evaluation did not finish: scored, not retrained
                train_s = trained(run).facts["fit_seconds"]
            else:  # the end-of-run kNN skipped: evaluated below, on the fixed subsets, instead
                done = pretrain(preset, o + extra, report=False)
                run, train_s = done.run, done.wall_s
            finetune = method in FINETUNED
            where = torch.cuda.get_device_name(0) if args.accelerator == "gpu" else cpu_kind()
            row = {"preset": preset, "overrides": extra, "seed": seed, "method": method,
                   "train_wall_s": round(train_s, 1), "machine": where,
                   **evaluate(run / "backbone.safetensors", Path(tmp) / f"eval{i}", args, finetune)}
            key = digest(run / "backbone_init.safetensors")
            floor = results["random_init"].get(key)
            if floor is None or (finetune and "finetune_top1" not in floor):
                floor = {"first_preset": preset, "seed": seed, **evaluate(run / "backbone_init.safetensors",
                                                                          Path(tmp) / f"init{i}", args, finetune)}
                results["random_init"][key] = floor
            row["random_init"] = key
            results["test_size"] = row["test_size"]
            results["runs"] = [r for r in results["runs"]
                               if (r["preset"], r["overrides"], r.get("seed", 0)) != (preset, extra, seed)]
            results["runs"].append(row)
            elapsed = time.perf_counter() - started
            print(json.dumps(row), f"[{i + 1}/{len(todo)}, about {elapsed / (i + 1) * (len(todo) - i - 1) / 60:.0f} "
                  "min left]", flush=True)
            write_report(results, out)  # after every run: a stopped benchmark keeps its rows
    order = {p: i for i, p in enumerate(PRESETS)}
    results["runs"].sort(key=lambda r: (order.get(r["preset"], len(order)), r.get("seed", 0)))
    results["total_wall_s"] = round(results.get("total_wall_s", 0) * bool(done) + time.perf_counter() - started, 1)
    write_report(results, out)
    print(table(results))
    print(f"wrote {out} ({results['total_wall_s']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
