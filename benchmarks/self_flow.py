"""Plain flow matching vs Self-Flow vs REPA on Fashion-MNIST (digits where absent): an experiment.

The three methods run their dataset's presets (``flow-matching-fmnist``, ``self-flow-fmnist``, ``repa-fmnist``;
the ``*-digits`` ones on digits): the same SiT, batch, steps, schedule, EMA and seed, as the presets set them
(``--steps`` shortens all three alike, keeping the lr warmup's and Self-Flow's rep-weight ramp's share of the
run; ``--size``, ``--patch``, ``--batch-size``, ``--ema-decay`` override them). Each trains through
``selfsup.engine.pretrain`` (what ``selfsup pretrain`` runs) with one extra callback that records the
per-step losses and saves the EMA weights at fixed steps. Reported per method:

* at each fixed checkpoint, from ``--n`` class-balanced samples (Euler ODE, ``--sample-steps``) for each of
  ``--sampling-seeds`` noise seeds (their mean and each): the **Fréchet distance in a supervised classifier's
  features** (``flow.metrics.fit_metric_classifier`` on the labelled training set: one trained space for every
  method; its kNN gain over its random init is reported) and that classifier's **class fidelity** (share of
  samples it assigns to the requested class); the **held-out velocity error** (``heldout_velocity_error`` on
  ``--val-n`` test images at fixed noise and levels), the low-noise companion; and, as before, the encoder
  Fréchet distance in a BYOL space and in the MoCo v3 space REPA aligned to;
* the **kNN accuracy of the model's own features** (the EMA model's block-k tokens at t = 0.1,
  what ``selfsup eval knn RUN`` reads), trained and at init;
* the **representation-loss curve** (Self-Flow: 1 − cos; REPA: −cos) and the flow loss;
* **training images/s**: the engine's step vs a bare PyTorch loop of the same step (same model
  objects, data order, fitting, loss, gradient clipping, AdamW and EMA update), alternating.

The encoders (MoCo v3 for REPA, BYOL for the metrics) are pretrained here unless given.

    python -m benchmarks.self_flow                     # Fashion-MNIST, 1200 steps per method
    python -m benchmarks.self_flow --quick             # smoke test (digits, a few steps)
    python -m benchmarks.self_flow --repa-encoder runs/moco --eval-encoder runs/byol --steps 3000

Results: ``benchmarks/results/self_flow.json``, sample grids and a loss plot next to it.
Timing on a shared machine is disturbed by other processes: read the CPU-time columns too.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from pathlib import Path

import torch

from benchmarks.harness import RESULTS, Times, fit_step_times, pretrain, summarize, timed, write_report

METHODS = ("flow_matching", "self_flow", "repa")
PRESETS = {"fashion-mnist": {"flow_matching": "flow-matching-fmnist", "self_flow": "self-flow-fmnist",
                             "repa": "repa-fmnist"},
           "digits": {"flow_matching": "flow-matching-digits", "self_flow": "self-flow-digits",
                      "repa": "repa-digits"}}
DATASETS = {"fashion-mnist": ("moco-v3-vit-fmnist", "byol-fmnist"),  # encoder presets (REPA's, the metrics')
            "digits": ("moco-v3-vit-digits", "byol-digits")}


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------- configs


def flow_overrides(args, method: str, encoder: Path | None) -> list[str]:
    """The preset's recipe with this benchmark's step budget (and any --size/--patch/--batch-size/--ema-decay)."""
    given = {"data.batch_size": args.batch_size, "method.size": args.size, "method.patch_size": args.patch,
             "method.ema_decay": args.ema_decay}
    o = [f"{k}={v}" for k, v in given.items() if v is not None]
    o += [f"trainer.max_epochs={args.epochs}", f"trainer.limit_train_batches={args.per_epoch}",
          f"optim.warmup_epochs={args.warmup_epochs}", "trainer.progress_bar=false", "trainer.log_every_n_steps=50",
          "trainer.accelerator=cpu", "trainer.devices=1", f"trainer.seed={args.seed}", f"output_dir={args.runs}",
          f"name={method}"]
    if method == "self_flow":
        o.append(f"method.rep_warmup_steps={args.rep_warmup_steps}")
    if method == "repa":
        o.append(f"method.encoder={encoder}")
    return o


def plan_steps(args, n_train: int) -> None:
    """Epochs × batches per epoch = the step budget (so the lr schedule ends at the last step): the presets' own
    (``--steps`` unset) or ``--steps``, keeping the presets' lr-warmup and rep-weight-ramp shares of the run."""
    from selfsup.config import load_run_config

    preset = load_run_config(PRESETS[args.dataset]["self_flow"], [])
    full = n_train // (args.batch_size or preset.data.batch_size)
    preset_steps = preset.trainer.max_epochs * (n_train // preset.data.batch_size)
    steps = args.steps or preset.trainer.max_epochs * full
    args.epochs = max(1, math.ceil(steps / full))
    args.per_epoch = steps // args.epochs
    args.steps = args.epochs * args.per_epoch
    args.warmup_epochs = round(preset.optim.warmup_epochs / preset.trainer.max_epochs * args.epochs, 4)
    args.rep_warmup_steps = round(preset.method.rep_warmup_steps * args.steps / preset_steps)
    args.checkpoints = sorted({min(args.steps, int(c)) for c in args.checkpoints.split(",")} | {args.steps})


# --------------------------------------------------------------------------- training


def recorder(checkpoints: list[int], snap_dir: Path):
    """A callback: per-step losses from the step's outputs; EMA weights saved at the checkpoint steps."""
    import lightning.pytorch as pl

    class Recorder(pl.Callback):
        def __init__(self):
            self.curves: dict[str, list[float]] = {"step": [], "flow_loss": [], "rep_loss": []}
            self.t0 = None

        def on_train_start(self, trainer, module):
            self.t0 = time.perf_counter()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            step = trainer.global_step  # (the logged metrics are written every log_every_n_steps only)
            self.curves["step"].append(step)
            for key in ("flow_loss", "rep_loss"):
                v = outputs["step"].scalars.get(key)
                self.curves[key].append(float(v) if v is not None else float("nan"))
            if step in checkpoints:
                snap_dir.mkdir(parents=True, exist_ok=True)
                torch.save({k: v.detach().cpu().clone() for k, v in module.ema.state_dict().items()},
                           snap_dir / f"ema-step{step}.pt")
            if step % 100 == 0:
                _log(f"  step {step}: flow {self.curves['flow_loss'][-1]:.4f} rep {self.curves['rep_loss'][-1]:.4f} "
                     f"({time.perf_counter() - self.t0:.0f} s)")

    return Recorder()


def pretrain_encoder(args, preset: str, name: str) -> Path:
    run = args.runs / name
    if (run / "backbone.safetensors").exists():
        _log(f"encoder {name}: reusing {run}")
        return run
    _log(f"encoder {name}: selfsup pretrain {preset} ({args.encoder_steps} steps)")
    done = pretrain(preset, ["trainer.max_epochs=1", f"trainer.limit_train_batches={args.encoder_steps}",
                             "optim.warmup_epochs=0.1", "trainer.progress_bar=false", "trainer.accelerator=cpu",
                             "trainer.devices=1", f"trainer.seed={args.seed}",
                             *([f"data.batch_size={args.batch_size}"] if args.quick else [])], run)
    _log(f"encoder {name}: {done.wall_s:.0f} s")
    return run


# --------------------------------------------------------------------------- evaluation


def real_features(source, train, test, args):
    from selfsup.eval.cache import features

    key = json.dumps([args.dataset, "self_flow_bench"])
    return (features(source, train, "train", key, 512, "cpu"), features(source, test, "test", key, 512, "cpu"))


def sample_quality(model, info, labels, spaces, metric, val_set, train, args) -> dict:
    """Per sampling seed: the Fréchet distance in the classifier's features and its class fidelity, the encoder
    Fréchet distance in each encoder space and kNN class fidelity in BYOL's; their means over the sampling seeds;
    and the held-out velocity error."""
    from selfsup.flow.metrics import (class_fidelity, classifier_features, feature_frechet_distance,
                                      heldout_velocity_error, image_features)
    from selfsup.flow.sampler import generate, sample_images

    t0 = time.perf_counter()
    per_seed = []
    for seed in range(args.sampling_seeds):
        x = generate(model, labels, args.sample_steps, "ode", 1.0, seed, "cpu", 500)
        images = sample_images(x, info, train.image_size)
        q = {"frechet_classifier": feature_frechet_distance(classifier_features(metric["model"], images),
                                                            metric["train"]),
             "class_fidelity_classifier": 100.0 * float((metric["model"](images).argmax(1) == labels).float().mean())}
        for name, (source, (ftr, ytr), _) in spaces.items():
            f = image_features(source, images, 512, "cpu")
            q[f"frechet_{name}"] = feature_frechet_distance(f, ftr)
            if name == "eval":
                q["class_fidelity"] = class_fidelity(ftr, ytr, f, labels, 20, 0.07, train.num_classes)["class_fidelity"]
        per_seed.append(q)
        if seed == 0:
            first = images
    out = {k: sum(q[k] for q in per_seed) / len(per_seed) for k in per_seed[0]}
    out["per_sampling_seed"] = per_seed
    out["sample_seconds"] = time.perf_counter() - t0
    out["val"] = heldout_velocity_error(model, *val_set, seed=0)["val"]
    return out, first


def own_knn(run: Path, train, test, args) -> dict:
    """kNN (k = 20, T = 0.07) of the EMA model's own features, trained and at init."""
    from selfsup.eval.features import extract_features
    from selfsup.eval.knn import knn_accuracy
    from selfsup.export import load_exported

    tr = train.subset(args.knn_train)
    out = {"train_size": len(tr), "test_size": len(test)}
    for tag, file in (("trained", "backbone.safetensors"), ("init", "backbone_init.safetensors")):
        backbone, meta = load_exported(run / file)
        ftr, ytr = extract_features(backbone, tr, meta["image_size"], meta["mean"], meta["std"], 512, "cpu")
        fte, yte = extract_features(backbone, test, meta["image_size"], meta["mean"], meta["std"], 512, "cpu")
        out[tag] = knn_accuracy(ftr, ytr, fte, yte, 20, 0.07)["top1"]
    return out


def curve_summary(curves: dict, checkpoints: list[int]) -> dict:
    """The representation loss's shape: first value, first step below 0.1, values at the checkpoints, tail mean."""
    logged = [(s, r) for s, r in zip(curves["step"], curves["rep_loss"]) if not math.isnan(r)]
    if not logged:  # (a step at rep weight 0, the ramp's first, has no rep loss)
        return {}
    steps, rep = [s for s, _ in logged], [r for _, r in logged]
    at = {s: r for s, r in zip(steps, rep)}
    below = next((s for s, r in zip(steps, rep) if r < 0.1), None)
    tail = rep[-max(1, len(rep) // 10):]
    return {"first": rep[0], "first_step_below_0.1": below,
            "at_checkpoints": {str(c): at.get(c) for c in checkpoints},
            "mean_first_10pct": sum(rep[: max(1, len(rep) // 10)]) / max(1, len(rep) // 10),
            "mean_last_10pct": sum(tail) / len(tail), "min": min(rep)}


def plot_curves(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for method, r in results.items():
        c = r["curves"]
        w = max(1, len(c["step"]) // 100)  # a running mean over ~1% of the run

        def smooth(v):
            return [sum(v[max(0, i - w + 1): i + 1]) / len(v[max(0, i - w + 1): i + 1]) for i in range(len(v))]

        axes[0].plot(c["step"], smooth(c["flow_loss"]), label=method)
        if not all(math.isnan(v) for v in c["rep_loss"]):
            axes[1].plot(c["step"], c["rep_loss"], label=method, lw=0.8)
    axes[0].set(title="flow loss (running mean)", xlabel="step", yscale="log")
    axes[1].set(title="representation loss (Self-Flow: 1 − cos; REPA: −cos)", xlabel="step")
    for a in axes:
        a.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# --------------------------------------------------------------------------- throughput


def bare_steps(cfg, dataset, warmup: int, steps: int) -> Times:
    """The same step without Lightning: fit + labels, forward_flow, backward, clip 1.0, AdamW, EMA lerp."""
    from selfsup.methods.build import build_method, data_info
    from selfsup.schedules import scaled_lr

    torch.manual_seed(cfg.trainer.seed)
    model = build_method(cfg, data_info(cfg, dataset))
    model.train()
    opt = model.configure_optimizers()
    for group in opt.param_groups:
        group["lr"] = scaled_lr(cfg.optim.base_lr, cfg.data.batch_size) * group["lr_scale"]
    params = [p for g in opt.param_groups for p in g["params"]]
    ema = (list(model.student.parameters()), list(model.ema.parameters()))
    b = cfg.data.batch_size

    def one_step_each():  # one training step per next(); an epoch's reshuffle falls in the step that crosses it
        epoch = 0
        while True:
            order = torch.randperm(len(dataset),
                                   generator=torch.Generator().manual_seed(cfg.trainer.seed * 100_003 + epoch))
            for i in range(len(dataset) // b):
                x, labels = model.on_after_batch_transfer(dataset[order[i * b:(i + 1) * b]], 0)
                loss = model.forward_flow(x, model.class_labels(labels)).loss
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, cfg.trainer.gradient_clip_val)
                opt.step()
                opt.zero_grad(set_to_none=True)
                with torch.no_grad():
                    torch._foreach_lerp_(ema[1], ema[0], 1.0 - cfg.method.ema_decay)
                yield
            epoch += 1

    loop = one_step_each()
    return timed(lambda: next(loop), steps, warmup)


def throughput(method: str, encoder, args, dataset) -> dict:
    import tempfile

    from selfsup.config import load_run_config

    with tempfile.TemporaryDirectory(prefix="selfsup-flow-bench-") as tmp:
        o = [x for x in flow_overrides(args, method, encoder)
             if not x.startswith(("trainer.max_epochs", "trainer.limit_train", "output_dir"))]
        cfg = load_run_config(PRESETS[args.dataset][method], o + ["trainer.max_epochs=100", f"output_dir={tmp}"])
        reps = {"engine": [], "bare": []}
        for _ in range(args.reps):
            reps["engine"].append(fit_step_times(cfg, dataset, Path(tmp) / f"clock-{time.time_ns()}", args.warmup,
                                                 args.timed_steps, seed=cfg.trainer.seed))
            reps["bare"].append(bare_steps(cfg, dataset, args.warmup, args.timed_steps))
    out = {k: summarize(v, args.batch_size) for k, v in reps.items()}
    out["overhead_median"] = out["engine"]["step_ms_median"] / out["bare"]["step_ms_median"] - 1
    out["overhead_cpu_median"] = out["engine"]["cpu_step_ms_median"] / out["bare"]["cpu_step_ms_median"] - 1
    return out


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", choices=sorted(DATASETS),
                   help="default: fashion-mnist when its files exist, else digits")
    p.add_argument("--steps", type=int, help="training steps per method (default: the presets' whole run)")
    p.add_argument("--checkpoints", default="300,600", help="steps at which samples are scored (the last is added)")
    p.add_argument("--batch-size", type=int, help="default: the presets' (128)")
    p.add_argument("--size", help="SiT size (default: the presets', micro: hidden 64, depth 4)")
    p.add_argument("--patch", type=int, help="SiT patch size (default: the presets', 4 on 28x28, 2 on 8x8)")
    p.add_argument("--ema-decay", type=float,
                   help="EMA decay of every method (Self-Flow's teacher, the sampling model); default: the presets' "
                        "0.99 (with 0.999 the EMA of a ~1k-step run still averages in its early weights)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n", type=int, default=1000, help="samples per checkpoint and sampling seed (classes in turn)")
    p.add_argument("--sampling-seeds", type=int, default=3, help="noise seeds of the samples (default 3: 0, 1, 2)")
    p.add_argument("--sample-steps", type=int, default=20, help="Euler ODE steps of the samples")
    p.add_argument("--val-n", type=int, default=2000, help="test images of the held-out velocity error")
    p.add_argument("--classifier-epochs", type=int, default=5, help="epochs of the metric classifier")
    p.add_argument("--knn-train", type=int, default=20000, help="training subset of the own-feature kNN")
    p.add_argument("--repa-encoder", help="REPA's ViT encoder (run / .safetensors); default: MoCo v3 pretrained here")
    p.add_argument("--eval-encoder", help="the metrics' encoder; default: BYOL pretrained here")
    p.add_argument("--encoder-steps", type=int, default=150,
                   help="steps (one epoch's first batches, 10%% warmup) of the encoders pretrained here")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--timed-steps", type=int, default=10, help="throughput: timed steps per repetition")
    p.add_argument("--warmup", type=int, default=3, help="throughput: untimed steps first")
    p.add_argument("--reps", type=int, default=2, help="throughput: repetitions (engine and bare alternate)")
    p.add_argument("--skip-throughput", action="store_true")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1: a shared machine)")
    p.add_argument("--out", default=str(RESULTS / "self_flow.json"))
    p.add_argument("--quick", action="store_true", help="smoke test: digits, 12 steps, 100 samples")
    args = p.parse_args(argv)

    from selfsup.data.datasets import FASHION_MNIST_DEFAULT

    if args.dataset is None:
        has_fmnist = (FASHION_MNIST_DEFAULT / "train-images-idx3-ubyte.gz").exists()
        args.dataset = "fashion-mnist" if has_fmnist and not args.quick else "digits"
    if args.quick:
        args.steps, args.checkpoints, args.n, args.sample_steps, args.batch_size = 12, "6", 100, 4, 64
        args.timed_steps, args.warmup, args.reps, args.knn_train, args.encoder_steps = 2, 1, 1, 1000, 3
        args.sampling_seeds, args.val_n, args.classifier_epochs = 2, 200, 1
    methods = [m for m in args.methods.split(",") if m]
    if any(m not in METHODS for m in methods):
        p.error(f"--methods: use a subset of {','.join(METHODS)}")
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)

    from selfsup.config import DataConfig
    from selfsup.data.datasets import load_dataset
    from selfsup.runs.source import load_source
    from selfsup.runs.source import load_flow_run
    from selfsup.flow.sampler import sample_labels, save_grid
    from selfsup.flow.metrics import feature_frechet_distance

    out_path = Path(args.out)
    out_dir = out_path.parent
    stem = out_path.stem
    args.runs = out_dir / f"{stem}_runs"
    moco_preset, byol_preset = DATASETS[args.dataset]
    train = load_dataset(DataConfig(name=args.dataset), "train")
    test = load_dataset(DataConfig(name=args.dataset), "test")
    plan_steps(args, len(train))
    _log(f"{args.dataset}: {len(train)} train / {len(test)} test; presets {PRESETS[args.dataset]}, {args.steps} steps "
         f"({args.epochs} x {args.per_epoch}), lr warmup {args.warmup_epochs} epochs, Self-Flow rep-weight ramp "
         f"{args.rep_warmup_steps} steps, checkpoints {args.checkpoints}")

    t_start = time.perf_counter()
    repa_encoder = Path(args.repa_encoder) if args.repa_encoder else pretrain_encoder(args, moco_preset, "encoder-moco")
    eval_encoder = Path(args.eval_encoder) if args.eval_encoder else pretrain_encoder(args, byol_preset, "encoder-byol")
    spaces = {}
    for name, loc in (("eval", eval_encoder), ("repa", repa_encoder)):
        source = load_source(loc)
        source.out_dir = args.runs / f"features-{name}"
        spaces[name] = (source, *real_features(source, train, test, args))
    ref = torch.randperm(len(test), generator=torch.Generator().manual_seed(0))[: min(args.n, len(test))]
    reference = {f"frechet_{name}": feature_frechet_distance(fte[ref], ftr)
                 for name, (_, (ftr, _), (fte, _)) in spaces.items()}
    from selfsup.eval.knn import knn_accuracy

    for name, (_, (ftr, ytr), (fte, yte)) in spaces.items():
        reference[f"knn_top1_{name}_encoder"] = knn_accuracy(ftr, ytr, fte, yte, 20, 0.07)["top1"]
    metric = metric_classifier(train, test, args)
    reference["frechet_classifier"] = feature_frechet_distance(metric["test"][ref], metric["train"])
    _log(f"reference (real test, n={len(ref)}): {reference}; metric classifier: test accuracy "
         f"{metric['test_accuracy']:.1f}%, kNN {metric['knn_trained']:.1f}% (random init {metric['knn_init']:.1f}%)")
    from selfsup.models.sit import fit_images

    val_idx = torch.randperm(len(test), generator=torch.Generator().manual_seed(1))[: min(args.val_n, len(test))]

    labels = sample_labels(args.n, train.num_classes)
    results = {}
    for method in methods:
        run = args.runs / method
        if run.exists():
            import shutil

            shutil.rmtree(run)
        rec = recorder(args.checkpoints, run / "snapshots")
        _log(f"{method}: training")
        train_seconds = pretrain(PRESETS[args.dataset][method], flow_overrides(args, method, repa_encoder),
                                 callbacks=[rec]).wall_s
        model, _, info = load_flow_run(run)
        val_set = (fit_images(test.images[val_idx].float() / 127.5 - 1, model.input_size, info["fit"]),
                   test.labels[val_idx])
        per_ckpt = {}
        for step in args.checkpoints:
            model.load_state_dict(torch.load(run / "snapshots" / f"ema-step{step}.pt"))
            q, images = sample_quality(model, info, labels, spaces, metric, val_set, train, args)
            per_ckpt[str(step)] = q
            save_grid(images[:100], out_dir / f"{stem}_{method}_step{step}.png")
            _log(f"{method} @ {step}: {q}")
        knn = own_knn(run, train, test, args)
        _log(f"{method}: own-feature kNN {knn}")
        results[method] = {"train_seconds": train_seconds, "checkpoints": per_ckpt, "own_feature_knn": knn,
                           "rep_loss_curve": curve_summary(rec.curves, args.checkpoints), "curves": rec.curves}
        if not args.skip_throughput:
            results[method]["throughput"] = throughput(method, repa_encoder, args, train)
            tp = results[method]["throughput"]
            _log(f"{method}: engine {tp['engine']['images_per_s_median']:.0f} img/s, bare "
                 f"{tp['bare']['images_per_s_median']:.0f} img/s, overhead {100 * tp['overhead_median']:+.1f}% "
                 f"(CPU time {100 * tp['overhead_cpu_median']:+.1f}%)")
        write(out_path, args, reference, results, repa_encoder, eval_encoder, time.perf_counter() - t_start,
              {k: v for k, v in metric.items() if k in ("test_accuracy", "knn_trained", "knn_init", "epochs")})
    plot_curves(results, out_dir / f"{stem}_losses.png")
    print_summary(results, reference)
    return 0


def metric_classifier(train, test, args) -> dict:
    """The metrics' classifier trained on the labelled training set, its features, and its gain over random init."""
    from selfsup.eval.knn import knn_accuracy
    from selfsup.flow.metrics import MetricClassifier, classifier_features, fit_metric_classifier

    t0 = time.perf_counter()
    clf = fit_metric_classifier(train.images, train.labels, train.num_classes, epochs=args.classifier_epochs,
                                seed=args.seed)
    torch.manual_seed(args.seed)
    init = MetricClassifier(train.images.shape[1], train.num_classes).eval()
    knn_tr = train.subset(args.knn_train)
    knn = {tag: knn_accuracy(classifier_features(m, knn_tr.images), knn_tr.labels, classifier_features(m, test.images),
                             test.labels, 20, 0.07)["top1"] for tag, m in (("trained", clf), ("init", init))}
    _log(f"metric classifier: {time.perf_counter() - t0:.0f} s")
    return {"model": clf, "train": classifier_features(clf, train.images),
            "test": classifier_features(clf, test.images),
            "test_accuracy": 100.0 * float((clf(test.images).argmax(1) == test.labels).float().mean()),
            "knn_trained": knn["trained"], "knn_init": knn["init"], "epochs": args.classifier_epochs}


def write(path: Path, args, reference, results, repa_encoder, eval_encoder, seconds, metric) -> None:
    import platform

    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    blob = {"benchmark": "self_flow", "settings": settings, "repa_encoder": str(repa_encoder),
            "eval_encoder": str(eval_encoder), "torch": torch.__version__, "platform": platform.platform(),
            "threads": torch.get_num_threads(), "seconds": seconds,
            "metric_note": "frechet_classifier: Fréchet distance of a supervised CNN's pooled features (one trained "
                           "space for every method); frechet_*: of encoder features (eval: BYOL, not seen by REPA; "
                           "repa: the MoCo v3 encoder REPA aligns to); means over the sampling seeds; not FID; val: "
                           "held-out velocity error", "metric_classifier": metric,
            "reference_real_test": reference, "results": results}
    write_report(blob, path, indent=1)


def print_summary(results: dict, reference: dict) -> None:
    print("\nmethod          ckpt   Fréchet(clf)  val     Fréchet(BYOL)  Fréchet(MoCo)  class fid %  own kNN %  "
          "rep loss first→last")
    print(f"{'real test':<15} {'-':>5}  {reference['frechet_classifier']:12.3f}  {'-':>6}  "
          f"{reference['frechet_eval']:13.3f}  {reference['frechet_repa']:13.3f}  "
          f"{reference['knn_top1_eval_encoder']:11.1f}")
    for method, r in results.items():
        c = r["rep_loss_curve"]
        rep = f"{c['first']:.3f}→{c['mean_last_10pct']:.3f}" if c else "-"
        for step, q in r["checkpoints"].items():
            print(f"{method:<15} {step:>5}  {q['frechet_classifier']:12.3f}  {q['val']:.4f}  "
                  f"{q['frechet_eval']:13.3f}  {q['frechet_repa']:13.3f}  {q['class_fidelity_classifier']:11.1f}  "
                  f"{r['own_feature_knn']['trained']:9.1f}  {rep}")


if __name__ == "__main__":
    sys.exit(main())
