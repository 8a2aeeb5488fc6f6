"""The finishing work of a trained run (rank 0), after fit or at the resume of a run killed in it (``finish_run``):
the export of the evaluated backbone and its heads, then the end-of-run report, from what the method declares: the
weighted kNN of its ``eval_backbone`` trained and at its random init (``knn.json``), and for a flow run a grid of its
EMA model's samples (``samples_end.png``). Each step is idempotent and recorded in run.json once done. A method holds
its algorithm only; this module evaluates it."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import Tensor, nn

from selfsup.data.datasets import UNLABELLED, load_dataset
from selfsup.diskspace import DiskFull, write_text
from selfsup.eval.features import extract_features
from selfsup.eval.knn import knn_accuracy
from selfsup.flow.sampler import generate, sample_images, sample_labels, save_grid
from selfsup.instruments.collapse import KNN_OVER_INIT
from selfsup.instruments.detectors import EventLog, read_events, report_collapse
from selfsup.export import HEADS_FILE, export_backbone, export_heads
from selfsup.methods.base import DataInfo, TrainingBase
from selfsup.runs.data import BAD_FILES, bad_files
from selfsup.runs.facts import mark_run, out_of_space, read_run_facts
from selfsup.runs.learning import learning_report

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


def knn_report(backbone: nn.Module, init_backbone: nn.Module, cfg, info: DataInfo, train, run_dir) -> list[str]:
    """The weighted kNN (k, T from ``cfg.eval``) on the test split of the trained and of the random-init
    backbone, written to ``run_dir/knn.json``; the lines the engine prints. The random init's result is
    computed once per process for the same weights and data (``init_knn_key``)."""
    if not cfg.eval.knn_at_end:
        return [f"no kNN report: eval.knn_at_end=false (selfsup eval knn {run_dir})"]
    if cfg.data.name in UNLABELLED:
        return [f"no kNN report: data.name={cfg.data.name} has no labels "
                "(selfsup eval knn RUN --data ... on labelled data)"]
    test = load_dataset(cfg.data, "test")
    k, temperature = cfg.eval.knn_k, cfg.eval.knn_temperature
    out = {"k": k, "temperature": temperature, "train_size": len(train), "test_size": len(test)}
    for key, model in (("pretrained", backbone), ("random_init", init_backbone)):
        cache = init_knn_key(model, train, test, info, cfg) if key == "random_init" else None
        if cache in _INIT_KNN:
            out[key] = copy.deepcopy(_INIT_KNN[cache])
            continue
        ftr, ytr = extract_features(model, train, info.image_size, info.mean, info.std, cfg.eval.batch_size)
        fte, yte = extract_features(model, test, info.image_size, info.mean, info.std, cfg.eval.batch_size)
        out[key] = knn_accuracy(ftr, ytr, fte, yte, k=k, temperature=temperature)
        if cache is not None:
            _INIT_KNN[cache] = copy.deepcopy(out[key])
    write_text(run_dir / "knn.json", json.dumps(out, indent=2), "the end-of-run kNN")
    lines = [f"kNN (k={k}, T={temperature}) on {cfg.data.name} test ({len(test)} images):"]
    lines += [f"  {key:<12} top-1 {out[key]['top1']:6.2f}%   top-5 {out[key]['top5']:6.2f}%"
              for key in ("pretrained", "random_init")]
    return lines


def joint_report(model: TrainingBase, train, init_backbone: nn.Module, run_dir, step: int) -> list[str]:
    """A joint-embedding run: :func:`knn_report` of the trained and the random-init ``eval_backbone``, and
    :func:`not_learning` on it (an event at ``step``, the run's last)."""
    lines = knn_report(model.eval_backbone, init_backbone, model.cfg, model.info, train, run_dir)
    if (run_dir / "knn.json").exists() and model.cfg.instruments.enabled and model.cfg.instruments.collapse_alarm:
        knn = json.loads((run_dir / "knn.json").read_text())
        lines += not_learning(knn, run_dir, step, model.collapse_remedy)
    return lines


def not_learning(knn: dict, run_dir, step: int, remedy: str) -> list[str]:
    """The end-of-run half of the ``knn_over_init`` sign (instruments/collapse.py): a trained backbone whose kNN
    top-1 is under its random init's is a ``collapse`` event in ``events.jsonl`` (unless the kNN monitor already
    raised it) and a console line; the report then shows it first."""
    over = knn["pretrained"]["top1"] - knn["random_init"]["top1"]
    events = read_events(run_dir / "events.jsonl")
    if over >= KNN_OVER_INIT.threshold or any(e.get("sign") == KNN_OVER_INIT.name for e in events):
        return []
    event = EventLog(run_dir / "events.jsonl").write(
        step, "collapse", over, KNN_OVER_INIT.threshold, sign=KNN_OVER_INIT.name, raw=knn["pretrained"]["top1"],
        meaning=KNN_OVER_INIT.meaning, window=1, remedy=remedy)
    report_collapse(event)
    return [f"  not learning: the trained backbone is {-over:.2f} points under its random init (try: {remedy})"]


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
