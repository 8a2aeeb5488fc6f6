"""Evaluation from Python: each protocol on a run, with its typed config, returning its results as a dict.

Each runner takes an :class:`~selfsup.runs.session.EvalSession` or a run location (run folder, exported
.safetensors or .ckpt: opened with the session's defaults) and the protocol's config (None: its defaults), writes
``RUN/eval/<protocol>[-<embedding>][.<tag>].json`` and returns the same dict. Nothing is printed but warnings; the
tables of ``selfsup eval`` are the front end's (``commands.eval``)::

    from selfsup.eval import KnnConfig
    from selfsup.runs import EvalSession, run_knn, run_linear
    session = EvalSession("runs/moco-v3-digits", device="cpu")
    top1 = run_knn(session, KnnConfig(ks=(20,)))["results"]["k=20"]["top1"]
    probe = run_linear(session)  # the run's default protocol (ProbeConfig.for_method)
"""

from __future__ import annotations

import copy
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from selfsup.errors import UserError
from selfsup.eval.finetune import FinetuneConfig, finetune, load_pretrained
from selfsup.eval.knn import KnnConfig, knn_sweep, resolve_ks
from selfsup.eval.linear import ProbeConfig, default_base_lr, probe_augmented, probe_features
from selfsup.eval.ood import OodConfig, auroc, histogram, norm_scores
from selfsup.eval.segment import SegmentConfig, knn_segment, linear_segment, patch_maps
from selfsup.eval.splits import val_split
from selfsup.eval.report import write_json
from selfsup.runs.session import EvalSession, data_config
from selfsup.eval.spectrum import SpectrumConfig, effective_rank, norm_stats, rankme, subsample
from selfsup.data.canvas import CANVAS_TASKS, canvas_task
from selfsup.data.dense import DenseSet
from selfsup.data.seg_folder import folder_task
from selfsup.eval_configs import DEFAULT_SEGMENT_TASK, SEGMENT_TASKS
from selfsup.export import export_backbone
from selfsup.models.backbones import build_backbone


def open_session(source: EvalSession | str | Path) -> EvalSession:
    """``source`` itself, or the session of a run location with the defaults (the run's data, cuda if any)."""
    return source if isinstance(source, EvalSession) else EvalSession(source)


def run_knn(source: EvalSession | str | Path, cfg: KnnConfig | None = None) -> dict:
    """Weighted (DINO) or majority-vote kNN for each k: ``results`` = {"k=20": {"top1", "top5"}, ...}."""
    session, cfg = open_session(source), cfg or KnnConfig()
    ftr, ytr = session.features("train")
    if not 0 <= cfg.val_fraction < 1:
        raise UserError(f"--val-fraction {cfg.val_fraction} must be in [0, 1) (0: score on the test split)")
    if cfg.val_fraction:  # scored on a validation split carved from the training images, the test split unread
        fit, val = val_split(len(ytr), cfg.val_fraction, cfg.seed)
        if not len(val) or not len(fit):
            raise UserError(f"--val-fraction {cfg.val_fraction} of {len(ytr)} training images leaves an empty split")
        (ftr, ytr), (fte, yte) = (ftr[fit], ytr[fit]), (ftr[val], ytr[val])
    else:
        fte, yte = session.features("test")
    ks = resolve_ks(cfg.ks, len(ytr))
    t0 = time.perf_counter()
    res = knn_sweep(ftr.to(session.device), ytr, fte.to(session.device), yte, ks, (cfg.temperature,))
    seconds = time.perf_counter() - t0
    (vote, by_k), = res.items()
    scored_on = "val" if cfg.val_fraction else "test"
    out = {**session.header(), "voting": vote, "temperature": cfg.temperature, "train_size": len(ytr),
           "test_size": len(yte), "scored_on": scored_on, "val_fraction": cfg.val_fraction, "results": by_k,
           "seconds": seconds}
    write_json(session.out_dir, f"knn{'-val' if cfg.val_fraction else ''}{session.suffix()}", out)
    return out


def run_linear(source: EvalSession | str | Path, cfg: ProbeConfig | None = None, mode: str | None = None) -> dict:
    """MoCo v3 (or MAE) linear probe over the config's grid: ``test`` = {"top1", "top5"} at the ``chosen`` point.

    ``cfg`` None: the run's default protocol (``ProbeConfig.for_method``). ``mode``: ``features`` (cached features,
    no augmentation) or ``augmented`` (crop + flip each step); None: augmented on a GPU, features on a CPU."""
    session = open_session(source)
    cfg = cfg or ProbeConfig.for_method(session.source.meta.get("method"))
    mode = mode or ("augmented" if session.device.type == "cuda" else "features")
    base = default_base_lr(session.source.meta["backbone"])  # only used when the grid is empty
    train, test = session.split("train"), session.split("test")
    t0 = time.perf_counter()
    if mode == "features":
        ftr, ytr = session.features("train")
        fte, yte = session.features("test")
        res = probe_features(ftr, ytr, fte, yte, max(train.num_classes, int(ytr.max()) + 1), cfg, base,
                             session.device)
    else:
        res = probe_augmented(session.source.backbone, train, test, session.source.meta, cfg, base, session.device)
    chosen = res["chosen"]
    out = {**session.header(), "mode": mode, "protocol": cfg.protocol, "epochs": cfg.epochs,
           "warmup_epochs": cfg.warmup_epochs, "optimizer": "lars" if cfg.protocol == "mae" else "sgd",
           "batch_size": cfg.batch_size, "base_lr": chosen["base_lr"], "lr": chosen["lr"],
           "weight_decay": chosen["weight_decay"], "val_fraction": cfg.val_fraction, "feature_bn": cfg.feature_bn,
           **({"crop_min": cfg.crop_min, "hflip_p": cfg.hflip_p} if mode == "augmented" else {}),
           **res, "seconds": time.perf_counter() - t0}
    write_json(session.out_dir, f"linear{session.suffix()}", out)
    return out


def run_finetune(source: EvalSession | str | Path, cfg: FinetuneConfig | None = None) -> dict:
    """End-to-end fine-tuning with layer-wise lr decay (ViTs only) and drop path; the fine-tuned backbone is
    exported to ``RUN/eval/finetuned_backbone[...].safetensors``. ``cfg`` None: the run's defaults
    (``FinetuneConfig.for_method``)."""
    session = open_session(source)
    meta = session.source.meta
    cfg = cfg or FinetuneConfig.for_method(meta.get("method"), meta["backbone"])
    if not hasattr(session.source.backbone, "layer_id"):  # layer-wise decay applies to ViT blocks
        cfg = dataclasses.replace(cfg, layer_decay=1.0)
    recipe = cfg.recipe
    train, test = session.split("train"), session.split("test")
    kwargs = dict(meta["kwargs"], drop_path_rate=cfg.drop_path, **({"pool": cfg.pool} if cfg.pool else {}))
    backbone = build_backbone(meta["backbone"], **kwargs)
    load_pretrained(backbone, session.source.backbone.state_dict())
    t0 = time.perf_counter()
    res = finetune(backbone, train, test, meta, cfg, session.device)
    out = {**session.header(), "epochs": cfg.epochs, "warmup_epochs": cfg.warmup_epochs, "batch_size": cfg.batch_size,
           "base_lr": cfg.base_lr, "layer_decay": cfg.layer_decay, "drop_path": cfg.drop_path,
           "weight_decay": cfg.weight_decay, "min_lr": cfg.min_lr, "head_init_std": cfg.head_init_std,
           "pool": kwargs.get("pool"), "train_pos_embed": cfg.train_pos_embed,
           "recipe": dataclasses.asdict(recipe) if recipe else "plain", **res, "seconds": time.perf_counter() - t0}
    export_backbone(backbone.cpu(), session.out_dir / f"finetuned_backbone{session.suffix()}.safetensors",
                    {k: v for k, v in meta.items() if k != "format"} | {"kwargs": kwargs})
    write_json(session.out_dir, f"finetune{session.suffix()}", out)
    return out


def run_rankme(source: EvalSession | str | Path, cfg: SpectrumConfig | None = None) -> dict:
    """RankMe, effective rank (99% variance) and norm statistics of the split's embeddings."""
    session, cfg = open_session(source), cfg or SpectrumConfig()
    feats, _ = session.features(cfg.split)
    sub = subsample(feats, cfg.max_samples)
    out = {**session.header(), "split": cfg.split, "samples": len(sub), "dim": feats.shape[1], "rankme": rankme(sub),
           "effective_rank_99": effective_rank(sub, 0.99), "norms": norm_stats(feats)}
    write_json(session.out_dir, f"rankme{session.suffix()}", out)
    return out


def dense_sets(cfg: SegmentConfig, meta: dict) -> tuple[str, DenseSet, DenseSet]:
    """(task name, train, test) of ``cfg.task`` (None: the canvas of the backbone's dataset), checked against the
    backbone's channels."""
    task = cfg.task or DEFAULT_SEGMENT_TASK.get(str(meta.get("dataset")))
    if task is None:
        raise UserError(f"eval segment needs --task ({', '.join(SEGMENT_TASKS)}): the backbone was trained on "
                        f"{meta.get('dataset')}, which has no canvas task of its own")
    if task not in SEGMENT_TASKS:
        raise UserError(f"--task {task} is not one of {', '.join(SEGMENT_TASKS)}")
    if task == "folder":
        train, test = folder_task(cfg.root, meta["in_chans"], cfg.size or meta["image_size"], cfg.seed)
    else:
        train, test = canvas_task(task, "train", cfg.root), canvas_task(task, "test", cfg.root)
    if train.channels != meta["in_chans"]:
        raise UserError(f"--task {task} has {train.channels}-channel images but the backbone takes "
                        f"{meta['in_chans']}; evaluate a {train.channels}-channel backbone (channels are never "
                        "converted)")
    return task, train, test


def run_segment(source: EvalSession | str | Path, cfg: SegmentConfig | None = None) -> dict:
    """Dense evaluation of the frozen patch features (``eval.segment``): DINOv2's linear head and a patch kNN, each
    scored by mIoU on the task's test split: ``linear`` / ``knn`` = {"miou", "miou_fg", "pixel_acc", "iou", ...}."""
    session, cfg = open_session(source), cfg or SegmentConfig()
    meta = session.source.meta
    task, train, test = dense_sets(cfg, meta)
    train = train.subset(session.train_limit)  # --train-limit: a fixed random subset of the training images
    t0 = time.perf_counter()
    backbone, batch, device = session.source.backbone, session.batch_size, session.device
    ftr = patch_maps(backbone, train.images, meta["mean"], meta["std"], batch, device)
    fte = patch_maps(backbone, test.images, meta["mean"], meta["std"], batch, device)
    out = {**session.header(), "dataset": task, "task": task,
           "task_spec": vars(CANVAS_TASKS[task]) if task in CANVAS_TASKS else {"root": cfg.root},
           "train_size": len(train), "test_size": len(test), "image_size": test.image_size,
           "classes": list(test.classes), "grid": list(ftr.shape[-2:]), "feature_dim": ftr.shape[1],
           "background_in_miou": True}
    protocols = {"linear": linear_segment, "knn": knn_segment}
    for name in cfg.protocols:
        out[name] = protocols[name](ftr, train.masks, fte, test.masks, test.classes, cfg, device)
    out["seconds"] = time.perf_counter() - t0
    write_json(session.out_dir, f"segment{session.suffix()}", out)
    return out


def ood_classes(spec: str, num_classes: int) -> list[int]:
    """``8,9`` → [8, 9]: some but not all of the classes 0..num_classes-1."""
    try:
        classes = sorted({int(c) for c in spec.split(",") if c.strip()})
    except ValueError:
        raise UserError(f"--ood classes:{spec} is not a list of class indices (e.g. --ood classes:8,9)") from None
    if not classes or any(not 0 <= c < num_classes for c in classes) or len(classes) >= num_classes:
        raise UserError(f"--ood classes:{spec} must name some but not all of the classes 0..{num_classes - 1}")
    return classes


def run_norms_ood(source: EvalSession | str | Path, cfg: OodConfig | None = None) -> dict:
    """Embedding-norm OOD score: AUROC of in-distribution test (positive) vs the OOD set, and a histogram.

    ``cfg.ood`` None: the classes the run held out of pretraining (``data.exclude_classes``). ``classes:…``: those
    classes' test images; held out when the run excluded them (the train mean norm and the in-distribution test are
    then the run's own splits), else they were pretrained on (scored with a warning: not OOD in the paper's sense).
    ``tag`` names the OOD set in the file names.
    """
    session, cfg = open_session(source), cfg or OodConfig()
    excluded = sorted(session.data_cfg.exclude_classes)
    ood = cfg.ood
    if ood is None:
        if not excluded:
            raise UserError("norms-ood needs an OOD set: pass --ood DATASET or --ood classes:8,9, or pretrain with "
                            "data.exclude_classes=[8,9] to score truly held-out classes")
        ood = "classes:" + ",".join(map(str, excluded))
    ftr, ytr = session.features("train")
    fte, yte = session.features("test")
    held_out = None
    if ood.startswith("classes:"):
        full = copy.deepcopy(session.data_cfg)
        full.exclude_classes, full.imbalance = [], 1.0
        num_classes = session.split("test", full).num_classes
        classes = ood_classes(ood[len("classes:"):], num_classes)
        held_out = set(classes) <= set(excluded)
        if held_out:  # unseen in pretraining: their test images from the whole test split
            f_all, y_all = session.features("test", full)
            f_ood = f_all[torch.isin(y_all, torch.tensor(classes))]
        else:
            print(f"selfsup: --ood {ood}: the run pretrained on these classes (data.exclude_classes={excluded}), "
                  "so they are not OOD in the paper's sense; pretrain with data.exclude_classes to hold them out",
                  file=sys.stderr)
            held = torch.isin(yte, torch.tensor(classes))
            ftr = ftr[~torch.isin(ytr, torch.tensor(classes))]
            f_ood, fte = fte[held], fte[~held]
        tag = "classes-" + "-".join(map(str, classes))
    else:
        data = data_config(session.source, ood, cfg.root)
        f_ood, _ = session.features("test", data, resize=True, limit=cfg.limit)
        tag = data.name
    if len(fte) == 0 or len(f_ood) == 0:
        raise UserError(f"--ood {ood} leaves no in-distribution or no OOD test samples; choose other classes")
    mean_norm = float(ftr.norm(dim=1).mean())
    s_in, s_ood = norm_scores(fte, mean_norm), norm_scores(f_ood, mean_norm)
    area = auroc(s_in, s_ood)
    png = histogram(s_in, s_ood, session.out_dir / f"norms-ood-{tag}{session.suffix()}.png",
                    f"{session.data_cfg.name} vs {tag}: AUROC {area:.3f}")
    out = {**session.header(), "ood": ood, "held_out": held_out, "train_mean_norm": mean_norm, "auroc": area,
           "in_size": len(s_in), "ood_size": len(s_ood), "in_score_mean": float(s_in.mean()),
           "ood_score_mean": float(s_ood.mean()), "plot": str(png)}
    write_json(session.out_dir, f"norms-ood-{tag}{session.suffix()}", out)
    return {**out, "tag": tag}


def run_all(source: EvalSession | str | Path, ood: OodConfig | None = None,
            on_result: Callable[[str, dict], None] | None = None) -> dict:
    """The standard set, each with its config's defaults: kNN, linear probe (fast path, the run's protocol), RankMe /
    effective rank / norms, and norm OOD when ``ood`` is given. ``on_result(protocol, result)`` is called after each
    (the front end prints its table there). Returns the summary written to ``all.json``."""
    session = open_session(source)
    report = on_result or (lambda name, result: None)
    knn = run_knn(session, KnnConfig())
    report("knn", knn)
    summary = {**session.header(), "knn": knn["results"]}
    linear = run_linear(session, ProbeConfig.for_method(session.source.meta.get("method")), mode="features")
    report("linear", linear)
    summary["linear"] = linear["test"]
    r = run_rankme(session, SpectrumConfig())
    report("rankme", r)
    summary.update(rankme=r["rankme"], effective_rank_99=r["effective_rank_99"], norms=r["norms"])
    if ood is not None:
        o = run_norms_ood(session, ood)
        report("norms-ood", o)
        summary["norms_ood_auroc"] = o["auroc"]
    write_json(session.out_dir, f"all{session.suffix()}", summary)
    return summary
