"""The finishing work of a trained run (rank 0), after fit or at the resume of a run killed in it (``finish_run``):
the export of the evaluated backbone and its heads, then the end-of-run report, from what the method declares: the
weighted kNN of its ``eval_backbone`` trained and at its random init (``knn.json``), the label-free measures and
verdict of the same two (``runs.label_free``: ``label_free.json``; an unlabelled run's only one), and for a flow
run a grid of its EMA model's samples (``samples_end.png``). Each step is idempotent and recorded in run.json once
done. A method holds its algorithm only; this module evaluates it."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from selfsup.data.datasets import HELD_OUT, UNLABELLED, has_test_split, load_dataset
from selfsup.diskspace import DiskFull, write_text
from selfsup.eval.features import extract_features
from selfsup.eval.knn import knn_accuracy
from selfsup.eval.splits import val_split
from selfsup.flow.sampler import generate, sample_images, sample_labels, save_grid
from selfsup.instruments.collapse import KNN_OVER_INIT
from selfsup.instruments.detectors import EventLog, read_events, report_collapse
from selfsup.export import HEADS_FILE, export_backbone, export_heads
from selfsup.methods.base import DataInfo, TrainingBase
from selfsup.runs.data import BAD_FILES, bad_files
from selfsup.runs.facts import mark_run, out_of_space, read_run_facts, start_label
from selfsup.runs.label_free import label_free_report
from selfsup.runs.learning import knn_verdict, learning_report, noise_words, start_words

_INIT_KNN: dict[str, dict] = {}  # random-init kNN results of this process, by init_knn_key


def init_knn_key(model: nn.Module, train, test, info: DataInfo, cfg) -> str | None:
    """A digest of everything a kNN result depends on: the weights and buffers (and the module's class), the
    model config (what the weights do not say: a ViT's ``pool``, its class token...), the in-memory train and test
    images and labels, and the evaluation settings; None for data not held in memory.
    Runs that start from the same init (the arms of a seed whose change leaves the backbone's init alone) share
    one random-init kNN per process."""
    if not all(isinstance(d.images, Tensor) for d in (train, test)):
        return None
    h = hashlib.sha256(type(model).__qualname__.encode())
    h.update(repr((info.image_size, info.mean, info.std, cfg.eval.knn_k, cfg.eval.knn_temperature,
                   cfg.eval.batch_size, dataclasses.asdict(cfg.model))).encode())
    tensors = [t for _, t in sorted(model.state_dict().items())]
    for t in [*tensors, train.images, train.labels, test.images, test.labels]:
        h.update(repr((t.dtype, tuple(t.shape))).encode())
        h.update(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def knn_sets(cfg, train) -> tuple[object | None, dict | None, str | None]:
    """The end-of-run kNN's test split, or where there is none (an image folder without ``val/`` or ``test/``) the
    seeded held-out share of ``train`` (``HELD_OUT``, seed ``trainer.seed``: ``eval.splits.val_split``) as
    {"fraction", "seed", "fit", "val"}; or a line saying why the kNN is skipped."""
    if not has_test_split(cfg.data):
        fit, val = val_split(len(train), HELD_OUT, cfg.trainer.seed)
        if len(val) < 1 or len(fit) < 1:
            return None, None, (f"no kNN report: {cfg.data.root} has no val/ or test/ folder and its {len(train)} "
                                "training images leave none to hold out (add val/<class>/ images)")
        return None, {"fraction": HELD_OUT, "seed": cfg.trainer.seed, "fit": fit, "val": val}, None
    return load_dataset(cfg.data, "test"), None, None


def knn_scores(model: nn.Module, train, test, held: dict | None, info: DataInfo, cfg) -> dict:
    """The weighted kNN top-1 / top-5 of ``model``'s features: fit on ``train``, scored on ``test``, or on the held-out
    share of ``train`` (``held``) fit on the rest; k at most the images it is fit on."""
    ftr, ytr = extract_features(model, train, info.image_size, info.mean, info.std, cfg.eval.batch_size)
    if held is None:
        fte, yte = extract_features(model, test, info.image_size, info.mean, info.std, cfg.eval.batch_size)
    else:
        (ftr, ytr), (fte, yte) = (ftr[held["fit"]], ytr[held["fit"]]), (ftr[held["val"]], ytr[held["val"]])
    return knn_accuracy(ftr, ytr, fte, yte, k=min(cfg.eval.knn_k, len(ytr)), temperature=cfg.eval.knn_temperature)


def knn_report(backbone: nn.Module, init_backbone: nn.Module, cfg, info: DataInfo, train, run_dir) -> list[str]:
    """The weighted kNN (k, T from ``cfg.eval``; k at most the training images) of the trained and of the starting
    backbone (its random init, or the ``model.weights`` it started from: ``runs.facts.start_label``), on the test
    split or, for an image folder without one, a seeded held-out share of train/ (``knn_sets``), written to
    ``run_dir/knn.json`` (``labels`` names what each key holds); the lines the engine prints. The random init's
    result is computed once per process for the same weights and data (``init_knn_key``)."""
    if not cfg.eval.knn_at_end:
        return [f"no kNN report: eval.knn_at_end=false (selfsup eval knn {run_dir})"]
    if cfg.data.name in UNLABELLED:
        return [f"no kNN report: data.name={cfg.data.name} has no labels "
                "(selfsup eval knn RUN --data ... on labelled data)"]
    test, held, skipped = knn_sets(cfg, train)
    if skipped:
        return [skipped]
    n_fit, n_test = (len(train), len(test)) if held is None else (len(held["fit"]), len(held["val"]))
    k, temperature = min(cfg.eval.knn_k, n_fit), cfg.eval.knn_temperature
    labels = {"pretrained": "pretrained", "random_init": start_label(run_dir, "random_init")}
    out = {"k": k, "temperature": temperature, "train_size": n_fit, "test_size": n_test, "labels": labels,
           "scored_on": "test" if held is None else "held_out_train"}
    if held is not None:
        out["held_out"] = {"fraction": held["fraction"], "seed": held["seed"], "images": n_test}
    for key, model in (("pretrained", backbone), ("random_init", init_backbone)):
        cache = init_knn_key(model, train, test, info, cfg) if key == "random_init" and held is None else None
        if cache in _INIT_KNN:
            out[key] = copy.deepcopy(_INIT_KNN[cache])
            continue
        out[key] = knn_scores(model, train, test, held, info, cfg)
        if cache is not None:
            _INIT_KNN[cache] = copy.deepcopy(out[key])
    write_text(run_dir / "knn.json", json.dumps(out, indent=2), "the end-of-run kNN")
    return knn_lines(out, cfg)


def knn_lines(out: dict, cfg) -> list[str]:
    """The printed kNN lines: what it was scored on, then each backbone by its label."""
    k, where = out["k"], f"on {cfg.data.name} test ({out['test_size']} images)"
    if "held_out" in out:
        h = out["held_out"]
        where = (f"on {h['images']} images held out of {cfg.data.root}/train/ ({h['fraction']:.0%}, seed {h['seed']}: "
                 f"no val/ or test/ folder), fit on the other {out['train_size']}")
    lowered = f" (eval.knn_k={cfg.eval.knn_k} lowered to the {k} training images)" if k < cfg.eval.knn_k else ""
    labels = out["labels"]
    width = max(12, *(len(v) for v in labels.values()))
    return [f"kNN (k={k}, T={out['temperature']}) {where}{lowered}:"] + [
        f"  {labels[key]:<{width}} top-1 {out[key]['top1']:6.2f}%   top-5 {out[key]['top5']:6.2f}%"
        for key in ("pretrained", "random_init")]


def joint_report(model: TrainingBase, train, init_backbone: nn.Module, run_dir, step: int) -> list[str]:
    """A joint-embedding run: :func:`knn_report` of the trained and the random-init ``eval_backbone``,
    :func:`not_learning` on it (an event at ``step``, the run's last), then the label-free measures and verdict
    (``runs.label_free``; beside the kNN verdict where the run has one)."""
    cfg = model.cfg
    lines = knn_report(model.eval_backbone, init_backbone, cfg, model.info, train, run_dir)
    knn = json.loads((run_dir / "knn.json").read_text()) if (run_dir / "knn.json").exists() else None
    if knn is not None and cfg.instruments.enabled and cfg.instruments.collapse_alarm:
        lines += not_learning(knn, run_dir, step, model.collapse_remedy)
    if cfg.eval.label_free_at_end:
        said = knn_verdict(knn)[0] if knn is not None and cfg.eval.knn_at_end else None
        lines += label_free_report(model.eval_backbone, init_backbone, cfg, model.info, train, run_dir, said)
    return lines


def not_learning(knn: dict, run_dir, step: int, remedy: str) -> list[str]:
    """The end-of-run half of the ``knn_over_init`` sign (instruments/collapse.py): a trained backbone whose kNN
    top-1 is under its start's (random init or ``model.weights``) by more than the noise, the same band a gain must
    pass (``runs.learning.knn_verdict``), is a ``collapse`` event in ``events.jsonl`` (threshold −band; unless the
    kNN monitor already raised it) and a console line; the report then shows it first."""
    verdict, over, band = knn_verdict(knn)
    events = read_events(run_dir / "events.jsonl")
    if verdict != "loss" or any(e.get("sign") == KNN_OVER_INIT.name for e in events):
        return []
    event = EventLog(run_dir / "events.jsonl").write(
        step, "collapse", over, -band, sign=KNN_OVER_INIT.name, raw=knn["pretrained"]["top1"],
        meaning=f"the backbone's kNN top-1 is under that of {start_words(knn)}, past the noise of the test split "
                "(points)", window=1, remedy=remedy)
    report_collapse(event)
    return [f"  not learning: the trained backbone is {-over:.2f} points under {start_words(knn)}, past the noise "
            f"({noise_words(knn, band)}) (try: {remedy})"]


def flow_report(model: TrainingBase, train, init_backbone: nn.Module, run_dir, step: int) -> list[str]:
    """A flow run: kNN of the EMA model's features (``eval_backbone``, trained vs init; pixel data only) and a grid
    of EMA samples (``samples_end.png``: Euler ODE, 25 steps, two per class, no guidance)."""
    c, info, lines = model.cfg.method, model.info, []
    if train.images.dtype == torch.uint8:
        lines += knn_report(model.eval_backbone, init_backbone, model.cfg, info, train, run_dir)
        if model.cfg.eval.knn_at_end:
            lines[0] = lines[0].replace(
                "kNN", f"kNN of the EMA model's block-{c.eval_block()} tokens at t={c.feature_t}", 1)
        ema = model.ema
        n = 2 * ema.num_classes if ema.num_classes else 16
        labels = sample_labels(n, ema.num_classes)
        x = generate(ema, labels, steps=25, seed=model.cfg.trainer.seed, device=model.device)
        fit = {"fit": c.fit, "mean": info.mean, "std": info.std}
        path = save_grid(sample_images(x, fit, info.image_size), run_dir / "samples_end.png")
        lines.append(f"{n} EMA samples (Euler ODE, 25 steps, no guidance): {path}")
    lines.append(f"more: selfsup generate {run_dir} --n 64 [--cfg 1.5]; selfsup eval generation {run_dir}")
    return lines


REPORTS = {"joint": joint_report, "flow": flow_report}  # by the method's declared family


def end_of_run_report(model: TrainingBase, train, init_backbone: nn.Module, run_dir, step: int) -> list[str]:
    """The lines printed after fit: the report of the model's family (``REPORTS``), then whether the run learned
    (``runs.learning``: ``not_learning`` events with their causes)."""
    return (REPORTS[model.family](model, train, init_backbone, run_dir, step)
            + learning_report(model, init_backbone, run_dir, step))


def export_step(model: TrainingBase, train, meta: dict, run_dir: Path, step: int) -> None:
    """The evaluated backbone (DINO's teacher, as its kNN; a flow run's FlowEncoder) → ``backbone.safetensors``,
    its projector / predictor → ``heads.safetensors`` (``eval --embedding`` reads them beside it)."""
    export_backbone(model.eval_backbone.cpu(), run_dir / "backbone.safetensors", meta)
    export_heads(model, run_dir / HEADS_FILE)


def report_step(model: TrainingBase, train, meta: dict, run_dir: Path, step: int) -> None:
    """The family's end-of-run report, printed: the trained ``eval_backbone`` against its random init
    (``backbone_init.safetensors``)."""
    init_backbone = copy.deepcopy(model.eval_backbone.cpu())
    init_backbone.load_state_dict(load_file(str(run_dir / "backbone_init.safetensors")))
    for line in end_of_run_report(model, train, init_backbone, run_dir, step):
        print(line)


FINISHING = {"export": export_step, "report": report_step}  # in order; run.json's finished_steps: those done


def finish_run(model: TrainingBase, train, meta: dict, run_dir: Path, step: int, saved_step: int | None,
               report: bool = True) -> None:
    """The finishing steps of a run trained to ``step`` (rank 0, run.json's status ``trained``) not yet done, each
    recorded in run.json's ``finished_steps`` once done (a step killed midway is done again: each writes whole
    files atomically, the same ones); then status ``finished``. ``saved_step``: the last checkpoint's, for a full
    disk's line. ``report=False`` skips the ``report`` step (``engine.pretrain(..., report=False)``)."""
    done = list(read_run_facts(run_dir).get("finished_steps", []))
    for name, work in FINISHING.items():
        if name in done or (name == "report" and not report):
            continue
        try:
            work(model, train, meta, run_dir, step)
            done.append(name)
            mark_run(run_dir, finished_steps=done)
        except DiskFull as e:
            raise out_of_space(e, run_dir, saved_step) from None
    mark_run(run_dir, drop=("finished_steps",), status="finished")
    bad = bad_files(run_dir)
    if bad:
        print(f"{len(bad)} unreadable training image(s) were skipped, the next readable file standing in (all in "
              f"{run_dir / BAD_FILES}): {', '.join(bad[:5])}" + (" ..." if len(bad) > 5 else ""))
    print(f"run folder: {run_dir}")
