"""``selfsup eval {knn,linear,finetune,rankme,norms-ood,segment,all} CKPT_OR_RUN`` (and ``generation RUN``,
``reconstruct RUN``): RUN/eval/*.json + a table.

The front end of ``selfsup.runs.evaluate``: the ``*_config(args)`` functions are the only ones that read the command
line and build the protocol's typed config (``KnnConfig``, ``ProbeConfig``, ``FinetuneConfig``, ``SpectrumConfig``,
``OodConfig``, ``SegmentConfig``); argparse takes its defaults from those dataclasses, so every default lives in one
place; the ``print_*`` functions print the tables of the runners' results.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from selfsup.architectures import FLOW_ENCODER, VIT_SIZES
from selfsup.commands.generation import add_generation_eval_parser
from selfsup.commands.reconstruct import add_reconstruct_parser
from selfsup.commands.tables import print_table
from selfsup.errors import UserError, positive
from selfsup.eval_configs import (DEFAULT_KS, FEATURE_BATCH, MAE_BASE_LR, PROTOCOL_DEFAULTS, PROTOCOLS,
                                  SEGMENT_PROTOCOLS, SEGMENT_TASKS, FinetuneConfig, KnnConfig, MAERecipe, OodConfig,
                                  ProbeConfig, SegmentConfig, SpectrumConfig)

if TYPE_CHECKING:
    from selfsup.runs.session import EvalSession

# --------------------------------------------------------------------------- the command line → typed configs


def _parse_ks(text: str | None) -> tuple[int, ...]:
    """``10,20,100`` → (10, 20, 100); None: () (the default list; ``eval.knn.resolve_ks`` checks the values)."""
    if text is None:
        return ()
    try:
        ks = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise UserError(f"--k {text!r} is not a comma-separated list of integers (e.g. --k 10,20,100,200)") from None
    if not ks:
        raise UserError("--k needs at least one value (e.g. --k 20)")
    return ks


def _parse_floats(text: str | None, flag: str, allow_zero: bool = False) -> tuple[float, ...]:
    """``0.1,1,3`` → (0.1, 1.0, 3.0); each > 0 (>= 0 with ``allow_zero``)."""
    if text is None:
        return ()
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UserError(f"{flag} {text!r} is not a comma-separated list of numbers (e.g. {flag} 0.1,1,3)") from None
    if not values or any(v < 0 or (v == 0 and not allow_zero) for v in values):
        raise UserError(f"{flag} {text!r} needs one or more values {'>= 0' if allow_zero else '> 0'}")
    return values


def _parse_temperature(text: str, majority: bool) -> float | None:
    if majority or text.lower() in ("none", "majority"):
        return None
    try:
        t = float(text)
    except ValueError:
        raise UserError(f"--temperature {text!r} is not a number; use e.g. 0.07, or none for majority voting") from None
    if not t > 0:
        raise UserError(f"--temperature {t} must be > 0 (or none for majority voting)")
    return t


def knn_config(a, session: EvalSession | None = None) -> KnnConfig:
    return KnnConfig(ks=_parse_ks(a.k), temperature=_parse_temperature(a.temperature, a.majority),
                     val_fraction=getattr(a, "val_fraction", 0.0) or 0.0)


def probe_config(a, session: EvalSession) -> ProbeConfig:
    """Crop scale and flip probability: the flags, else 0.08 whatever the pretraining crop was (MoCo v3's
    main_lincls.py, MAE's fine-tuning) and the run's flip probability (0 where flips change the class).
    The protocol: ``ProbeConfig.protocol_for`` the run's method (MAE's LARS at base lr 0.1 for MAE runs, else
    MoCo v3's over the lr grid), its defaults ``ProbeConfig.for_protocol``; the validation split holds out 10%
    where there is a grid to choose from, none for MAE's one lr."""
    crop = a.crop_min if a.crop_min is not None else ProbeConfig.crop_min
    flip = a.hflip if a.hflip is not None else session.run_hflip(ProbeConfig.hflip_p)
    protocol = a.protocol or ProbeConfig.protocol_for(session.source.meta.get("method"))
    base = ProbeConfig.for_protocol(protocol)
    lr_grid = (a.lr,) if a.lr is not None else (_parse_floats(a.lr_grid, "--lr-grid") or base.lr_grid)
    val_fraction = a.val_fraction if a.val_fraction is not None else \
        (base.val_fraction if len(lr_grid) == 1 and a.wd_grid is None else ProbeConfig.val_fraction)
    if not 0 <= val_fraction < 1:
        raise UserError(f"--val-fraction {val_fraction} must be in [0, 1) (0: choose the grid point on test)")
    # the protocol's warm-up share of its 90 epochs (MAE: 10 of 90) where --epochs shortens the probe
    warmup = a.warmup_epochs if a.warmup_epochs is not None else base.warmup_epochs * a.epochs / ProbeConfig.epochs
    if not 0 <= warmup < max(a.epochs, 1e-9):
        raise UserError(f"--warmup-epochs {warmup:g} must be in [0, --epochs {a.epochs})")
    return dataclasses.replace(base, epochs=positive(a.epochs, "--epochs"),
                               batch_size=positive(a.probe_batch, "--probe-batch"), crop_min=crop, hflip_p=flip,
                               lr_grid=lr_grid, val_fraction=val_fraction, warmup_epochs=warmup,
                               feature_bn=not a.no_feature_bn,
                               wd_grid=_parse_floats(a.wd_grid, "--wd-grid", allow_zero=True))


def finetune_config(a, session: EvalSession) -> FinetuneConfig:
    """The run's defaults (``FinetuneConfig.for_method``: MAE's global pool + ``fc_norm`` and a trained position
    table for MAE runs), the flags on top."""
    backbone = session.source.meta["backbone"]
    if backbone == FLOW_ENCODER:
        raise UserError(f"eval finetune trains an image backbone; {session.source.weights} holds a {backbone} "
                        "(a flow run's frozen features): evaluate it with knn, linear or rankme")
    crop = a.crop_min if a.crop_min is not None else FinetuneConfig.crop_min
    flip = a.hflip if a.hflip is not None else session.run_hflip(FinetuneConfig.hflip_p)
    if not 0 <= a.drop_path < 1:
        raise UserError(f"--drop-path {a.drop_path} must be in [0, 1)")
    if not 0 < a.layer_decay <= 1:
        raise UserError(f"--layer-decay {a.layer_decay} must be in (0, 1]")
    if a.pool is not None and backbone not in VIT_SIZES:
        raise UserError(f"--pool {a.pool} chooses the feature of a selfsup ViT ({', '.join(VIT_SIZES)}); "
                        f"{backbone} pools its own way: leave --pool out")
    default = FinetuneConfig.for_method(session.source.meta.get("method"), backbone)
    pool = a.pool or default.pool
    train_pos = a.train_pos_embed if a.train_pos_embed is not None else default.train_pos_embed
    recipe = _mae_recipe(a, session.data_cfg.name)
    if recipe and recipe.mixes and a.ft_batch % 2:
        raise UserError(f"--ft-batch {a.ft_batch} must be even for mixup / cutmix (or pass --mixup 0 --cutmix 0)")
    return FinetuneConfig(epochs=positive(a.epochs, "--epochs"), warmup_epochs=a.warmup_epochs,
                          batch_size=positive(a.ft_batch, "--ft-batch"), base_lr=a.lr, weight_decay=a.weight_decay,
                          layer_decay=a.layer_decay, drop_path=a.drop_path, crop_min=crop, hflip_p=flip,
                          min_lr=a.min_lr, recipe=recipe, pool=pool, train_pos_embed=train_pos,
                          label_smoothing=a.smoothing if a.smoothing is not None else FinetuneConfig.label_smoothing,
                          num_workers=a.workers if a.workers is not None else session.data_cfg.num_workers)


def _mae_recipe(a, dataset: str):
    """MAE's data recipe (defaults on for imagefolder, off for the small in-memory sets), with the flags applied."""
    kind = a.recipe or ("mae" if dataset == "imagefolder" else "plain")
    if kind == "plain":
        return None
    r = MAERecipe()
    if a.rand_augment is not None:
        r.rand_augment = None if a.rand_augment.lower() in ("none", "") else a.rand_augment
    for flag, field in (("reprob", "reprob"), ("mixup", "mixup"), ("cutmix", "cutmix"), ("smoothing", "smoothing")):
        value = getattr(a, flag)
        if value is not None:
            if value < 0 or (flag in ("reprob", "smoothing") and value >= 1):
                raise UserError(f"--{flag} {value} is out of range "
                                f"({'[0, 1)' if flag in ('reprob', 'smoothing') else '>= 0'})")
            setattr(r, field, value)
    if r.rand_augment:
        from timm.data import rand_augment_transform  # lazy: timm takes 1.5 s to import

        try:
            rand_augment_transform(r.rand_augment, {})
        except Exception:
            raise UserError(f"--rand-augment {r.rand_augment!r} is not a timm RandAugment string "
                            "(e.g. rand-m9-mstd0.5-inc1, or none)") from None
    return r


def segment_config(a, session: EvalSession | None = None) -> SegmentConfig:
    """The dense task and its protocols' settings (defaults: ``SegmentConfig``)."""
    if a.size is not None:
        positive(a.size, "--size")
    if a.max_train_patches < 0:
        raise UserError(f"--max-train-patches {a.max_train_patches} must be >= 0 (0: every training patch)")
    return SegmentConfig(task=a.task, root=a.task_root, protocols=SEGMENT_PROTOCOLS if a.protocol == "both" else
                         (a.protocol,), size=a.size, epochs=positive(a.epochs, "--epochs"),
                         batch_size=positive(a.seg_batch, "--seg-batch"), lr=a.lr, weight_decay=a.weight_decay,
                         head_bn=not a.no_head_bn, k=positive(a.k, "--k"),
                         temperature=_parse_temperature(a.temperature, a.majority),
                         max_train_patches=a.max_train_patches, seed=a.seed)


def spectrum_config(a, session: EvalSession | None = None) -> SpectrumConfig:
    return SpectrumConfig(split=a.split, max_samples=positive(a.max_samples, "--max-samples"))


def ood_config(a, session: EvalSession | None = None) -> OodConfig:
    return OodConfig(a.ood, a.ood_root, None if a.ood_limit is None else positive(a.ood_limit, "--ood-limit"))


# --------------------------------------------------------------------------- the tables of the results


def print_knn(out: dict) -> None:
    print_table(f"kNN ({out['voting']}) on {out['dataset']}: {out['train_size']} train / {out['test_size']} "
                f"{'validation (carved from train)' if out.get('scored_on') == 'val' else 'test'}",
                ["k", "top-1 %", "top-5 %"], [[k[2:], r["top1"], r["top5"]] for k, r in out["results"].items()])


def print_linear(out: dict) -> None:
    chosen, mode = out["chosen"], out["mode"]
    chooser = "val_top1" if "val_top1" in chosen else "test_top1"
    print_table(f"linear probe grid ({out['protocol']} protocol, {mode}, {out['epochs']} epochs, "
                f"{len(out['grid'])} heads trained together; "
                f"chosen on {'a ' + str(out['val_size']) + '-image validation split' if out['val_size'] else 'test'})",
                ["base lr", "lr", "wd", "val top-1 %", "test top-1 %", ""],
                [[g["base_lr"], g["lr"], g["weight_decay"], g.get("val_top1", "-"), g["test_top1"],
                  "<- chosen" if g is chosen else ""] for g in out["grid"]])
    rows = [["test", out["test"]["top1"], out["test"]["top5"]]]
    if "train" in out:
        rows.append(["train", out["train"]["top1"], out["train"]["top5"]])
    print_table(f"linear probe ({mode}, lr {chosen['lr']:g}, wd {chosen['weight_decay']:g}, by {chooser}) "
                f"on {out['dataset']}", ["split", "top-1 %", "top-5 %"], rows)


def print_finetune(out: dict) -> None:
    print_table(f"fine-tuning ({out['epochs']} epochs, "
                f"{'plain crop + flip' if out['recipe'] == 'plain' else 'MAE recipe'}, "
                f"{'pool ' + out['pool'] + ', ' if out['pool'] else ''}"
                f"layer decay {out['layer_decay']:g}, drop path {out['drop_path']:g}) "
                f"on {out['dataset']}", ["split", "top-1 %", "top-5 %"],
                [["test", out["test"]["top1"], out["test"]["top5"]]])


def print_rankme(out: dict) -> None:
    n = out["norms"]
    print_table(f"embedding spectrum on {out['dataset']} {out['split']} ({out['samples']} samples, dim {out['dim']})",
                ["RankMe", "eff. rank 99%", "norm mean", "norm p5", "norm p50", "norm p95"],
                [[out["rankme"], out["effective_rank_99"], n["mean"], n["p5"], n["p50"], n["p95"]]])


def print_norms_ood(out: dict) -> None:
    tag = out["tag"]
    print_table(f"norm OOD score ({out['embedding']}): {out['dataset']} test (in) vs {tag} (OOD"
                + (", held out of pretraining)" if out["held_out"] else ")"),
                ["AUROC", "in mean score", "OOD mean score", "in n", "OOD n"],
                [[out["auroc"], out["in_score_mean"], out["ood_score_mean"], out["in_size"], out["ood_size"]]])
    print(f"  histogram: {out['plot']}")


def print_segment(out: dict) -> None:
    rows = [[name, out[name]["miou"], out[name]["miou_fg"], out[name]["pixel_acc"]]
            for name in ("linear", "knn") if name in out]
    print_table(f"segmentation of the frozen patch features ({out['grid'][0]}x{out['grid'][1]} grid) on "
                f"{out['task']}: {out['train_size']} train / {out['test_size']} test images, {len(out['classes'])} "
                "classes (mIoU with the background class, mIoU of the others)",
                ["protocol", "mIoU %", "fg mIoU %", "pixel acc %"], rows)


PRINTERS = {"knn": print_knn, "linear": print_linear, "finetune": print_finetune, "rankme": print_rankme,
            "norms-ood": print_norms_ood, "segment": print_segment}


# --------------------------------------------------------------------------- commands


def command(name: str, config, **options):
    """An argparse handler: ``evaluate.run_<name>(session, config(args, session), **{k: f(args)})``, its table printed,
    exit 0 (errors raise UserError)."""
    def handler(args) -> int:
        # a session opens a run (the methods, Lightning): imported by the command, not by the parser
        from selfsup.runs import evaluate
        from selfsup.runs.session import EvalSession

        run = getattr(evaluate, f"run_{name.replace('-', '_')}")
        session = EvalSession.from_args(named(args))
        PRINTERS[name](run(session, config(args, session), **{k: f(args) for k, f in options.items()}))
        return 0

    return handler


def cmd_all(args) -> int:
    """The standard set, each with its config's defaults (``evaluate.run_all``): kNN, linear probe (fast path, the run's
    protocol), RankMe / effective rank / norms, norm OOD if --ood."""
    from selfsup.runs import evaluate
    from selfsup.runs.session import EvalSession

    session = EvalSession.from_args(named(args))
    evaluate.run_all(session, ood_config(args) if args.ood else None, lambda name, out: PRINTERS[name](out))
    if not args.ood:
        print("(norm OOD scoring skipped: pass --ood DATASET or --ood classes:8,9)")
    return 0


def named(args):
    """``args`` with CKPT_OR_RUN and ``--backbone`` as one source (``runs.source.NamedWeights``)."""
    if getattr(args, "backbone", None):
        from selfsup.runs.source import NamedWeights

        args.ckpt = NamedWeights(str(args.ckpt), args.backbone)
    return args


def _grid(values) -> str:
    return ",".join(f"{v:g}" for v in values)


def _common(p: argparse.ArgumentParser, dataset: bool = True) -> None:
    """The flags of every protocol; ``dataset`` False (segment: its own task and --root): no --data / --root /
    --resize."""
    p.add_argument("ckpt", metavar="CKPT_OR_RUN", help="run folder, exported backbone .safetensors, a run's .ckpt, "
                   "a DINOv2 hub or training checkpoint, timm:<name>, or any model.weights file with --backbone")
    p.add_argument("--backbone", help="the architecture of a weights file that cannot say it (a torchvision or timm "
                   "state dict, a method's release checkpoint): a selfsup backbone (a ViT's settings read from the "
                   "file) or timm:<name>")
    if dataset:
        p.add_argument("--data", help="dataset name (default: the one the backbone was trained on)")
        p.add_argument("--root", help="dataset folder (default: the run's data.root, else the dataset's default)")
        p.add_argument("--resize", action="store_true", help="resize images of another size to the backbone's input")
    else:
        p.set_defaults(data=None, root=None, resize=False)
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument("--batch-size", type=int, default=FEATURE_BATCH,
                   help=f"feature extraction batch (default {FEATURE_BATCH})")
    p.add_argument("--out", help="folder for the results (default: RUN/eval)")
    p.add_argument("--no-cache", action="store_true", help="extract features again instead of reusing the cache")
    p.add_argument("--train-limit", type=int, help="use a fixed random subset of this many training images")
    p.add_argument("--flow-t", type=float,
                   help="flow runs: noise level of the features (default: the run's method.feature_t)")
    p.add_argument("--flow-block", type=int, help="flow runs: block whose tokens are pooled (default: the teacher's k)")
    p.add_argument("--last-blocks", type=int, metavar="N",
                   help="ViT backbones: the last N blocks' pooled features concatenated (I-JEPA's and DINO's linear "
                        "evaluation; default 1, the backbone's feature)")
    p.set_defaults(embedding="backbone")  # --embedding where a protocol offers it


def _knn_args(p) -> None:
    t = KnnConfig.temperature
    p.add_argument("--k", help=f"comma-separated neighbour counts (default {','.join(map(str, DEFAULT_KS))})")
    p.add_argument("--temperature", default=f"{t:g}", help=f"vote weight exp(sim/T) (default {t:g}); none: majority")
    p.add_argument("--majority", action="store_true", help="plain majority voting (same as --temperature none)")


def _aug_args(p, crop_min: float) -> None:
    p.add_argument("--crop-min", type=float, help=f"RandomResizedCrop minimum area (default {crop_min:g})")
    p.add_argument("--hflip", type=float, help="flip probability (default: run's, else 0.5)")


def _embedding_arg(p, default: str = "backbone") -> None:
    p.add_argument("--embedding", choices=("backbone", "projector", "predictor", "loss"), default=default,
                   help=f"which embedding (default {default}): the backbone feature, the projector or predictor "
                        "output (a run folder's heads, eval mode), or loss: the one the method's loss normalises "
                        "(SimCLR the projector, BYOL / SimSiam / MoCo v3 the predictor)")


def _ood_args(p, required: bool) -> None:
    p.add_argument("--ood", required=required,
                   help="OOD dataset name (its test split), or classes:8,9 (test images of these classes; OOD in the "
                        "paper's sense where the run held them out with data.exclude_classes)"
                        + ("" if required else "; norms-ood's default: the run's data.exclude_classes"))
    p.add_argument("--ood-root", help="folder of the OOD dataset")
    p.add_argument("--ood-limit", type=int, help="use a fixed random subset of this many OOD images")


def _linear_parser(sub) -> None:
    """``selfsup eval linear`` (defaults: ``ProbeConfig``)."""
    lin = ProbeConfig
    p = sub.add_parser("linear", help="linear probe, MoCo v3 protocol (MAE's for MAE runs)")
    _common(p)
    p.add_argument("--mode", choices=("features", "augmented"),
                   help="features: cached features, no augmentation (default on CPU); "
                        "augmented: crop + flip (GPU default)")
    p.add_argument("--protocol", choices=PROTOCOLS,
                   help="moco_v3: SGD over the lr grid, cosine per epoch (default); mae: MAE's BatchNorm "
                        "(affine=False) + LARS at base lr 0.1, 10 warm-up epochs (the default for MAE runs)")
    p.add_argument("--epochs", type=int, default=lin.epochs, help=f"default {lin.epochs} (MoCo v3 and MAE)")
    p.add_argument("--warmup-epochs", type=float,
                   help="linear warm-up epochs of the lr (default: the mae protocol's 10 of 90 epochs, scaled "
                        "to --epochs; 0 for moco_v3)")
    p.add_argument("--probe-batch", type=int, default=lin.batch_size,
                   help=f"classifier batch (default {lin.batch_size})")
    p.add_argument("--lr", type=float, help="one base lr (× batch/256) instead of the grid")
    p.add_argument("--lr-grid",
                   help="base lrs trained together, chosen on validation "
                        f"(default {_grid(PROTOCOL_DEFAULTS['moco_v3']['lr_grid'])}; "
                        f"mae protocol: {MAE_BASE_LR:g})")
    p.add_argument("--wd-grid", help=f"weight decays crossed with the lr grid (default {lin.weight_decay:g})")
    p.add_argument("--no-feature-bn", action="store_true",
                   help="no BatchNorm (affine=False) on the features before the heads "
                        "(MoCo v3's plain head; MAE's has it)")
    p.add_argument("--val-fraction", type=float,
                   help="share of train held out to choose the grid point "
                        f"(default {lin.val_fraction:g}, 0 for the mae protocol's one lr; 0: choose on test)")
    _aug_args(p, lin.crop_min)
    p.set_defaults(func=command("linear", probe_config, mode=lambda args: args.mode))


def _finetune_parser(sub) -> None:
    """``selfsup eval finetune`` (defaults: ``FinetuneConfig``)."""
    ft = FinetuneConfig
    p = sub.add_parser("finetune", help="end-to-end fine-tuning: layer-wise lr decay, drop path, AdamW")
    _common(p)
    p.add_argument("--epochs", type=int, default=ft.epochs, help=f"default {ft.epochs} (small, for CPUs)")
    p.add_argument("--warmup-epochs", type=float, default=ft.warmup_epochs)
    p.add_argument("--ft-batch", type=int, default=ft.batch_size, help=f"training batch (default {ft.batch_size})")
    p.add_argument("--lr", type=float, default=ft.base_lr,
                   help=f"base lr, scaled by batch/256 (default {ft.base_lr:g})")
    p.add_argument("--weight-decay", type=float, default=ft.weight_decay)
    p.add_argument("--layer-decay", type=float, default=ft.layer_decay,
                   help=f"ViT layer-wise lr decay (default {ft.layer_decay:g})")
    p.add_argument("--drop-path", type=float, default=ft.drop_path,
                   help=f"stochastic depth rate (default {ft.drop_path:g})")
    p.add_argument("--min-lr", type=float, default=ft.min_lr,
                   help=f"final lr, absolute as MAE's (default {ft.min_lr:g})")
    p.add_argument("--recipe", choices=("mae", "plain"),
                   help="mae: RandAugment, random erasing, mixup / cutmix (default for imagefolder); "
                        "plain: crop + flip")
    p.add_argument("--rand-augment", help="timm RandAugment string (MAE: rand-m9-mstd0.5-inc1), or none")
    p.add_argument("--reprob", type=float, help="random erasing probability (MAE: 0.25)")
    p.add_argument("--mixup", type=float, help="Mixup alpha (MAE: 0.8; 0 off)")
    p.add_argument("--cutmix", type=float, help="CutMix alpha (MAE: 1.0; 0 off)")
    p.add_argument("--smoothing", type=float, help=f"label smoothing (default and MAE: {ft.label_smoothing:g})")
    p.add_argument("--workers", type=int,
                   help="decoding workers of the MAE recipe (default: the run's data.num_workers)")
    p.add_argument("--pool", choices=("global", "cls", "avg"),
                   help="ViT feature: global = mean of the patch tokens + fc_norm (MAE's, the default for MAE "
                        "runs), cls = class token (the default for the others), avg = mean after the final norm")
    p.add_argument("--train-pos-embed", action=argparse.BooleanOptionalAction,
                   help="train the position table (MAE's fine-tuning does: the default for MAE runs)")
    _aug_args(p, ft.crop_min)
    p.set_defaults(func=command("finetune", finetune_config))


def _segment_parser(sub) -> None:
    """``selfsup eval segment`` (defaults: ``SegmentConfig``)."""
    sc = SegmentConfig
    p = sub.add_parser("segment", help="dense: DINOv2's linear head and a patch kNN on the frozen patch features, "
                                       "mIoU on a generated canvas task or a folder of images with masks")
    _common(p, dataset=False)
    p.add_argument("--task", choices=SEGMENT_TASKS,
                   help="digits-canvas | fmnist-canvas (items on a larger canvas, generated, seeded) | folder "
                        "(--root DIR with images/ and masks/); default: the canvas of the backbone's dataset")
    p.add_argument("--root", dest="task_root", metavar="DIR",
                   help="folder: images/ + masks/ (PNG label maps, 255 = ignore); fmnist-canvas: Fashion-MNIST's "
                        "IDX files (default: the dataset's own place)")
    p.add_argument("--protocol", choices=("both", *SEGMENT_PROTOCOLS), default="both")
    p.add_argument("--size", type=int, help="folder: the side images are resized to (default: the backbone's)")
    p.add_argument("--epochs", type=int, default=sc.epochs, help=f"linear head epochs (default {sc.epochs})")
    p.add_argument("--seg-batch", type=int, default=sc.batch_size, help=f"images per step (default {sc.batch_size})")
    p.add_argument("--lr", type=float, default=sc.lr, help=f"AdamW lr of the linear head (default {sc.lr:g})")
    p.add_argument("--weight-decay", type=float, default=sc.weight_decay)
    p.add_argument("--no-head-bn", action="store_true",
                   help="the linear layer alone (DINOv2's BNHead has a BatchNorm before it: the default)")
    p.add_argument("--k", type=int, default=sc.k, help=f"patch kNN neighbours (default {sc.k})")
    p.add_argument("--temperature", default=f"{sc.temperature:g}",
                   help=f"vote weight exp(sim/T) (default {sc.temperature:g}); none: majority")
    p.add_argument("--majority", action="store_true", help="plain majority voting (same as --temperature none)")
    p.add_argument("--max-train-patches", type=int, default=sc.max_train_patches,
                   help=f"training patches the kNN searches, a seeded subset (default {sc.max_train_patches}; 0: all)")
    p.add_argument("--seed", type=int, default=sc.seed)
    p.set_defaults(func=command("segment", segment_config))


def add_eval_parser(ev) -> None:
    """The ``selfsup eval`` command's subcommands (defaults: the protocols' config dataclasses) on its parser ``ev``,
    made by ``commands.main``."""
    sub = ev.add_subparsers(dest="eval_command", required=True)

    p = sub.add_parser("knn", help="weighted (DINO) or majority-vote kNN, top-1 / top-5")
    _common(p)
    _knn_args(p)
    p.add_argument("--val-fraction", type=float, default=0.0,
                   help="score on this seeded share of the training images (after --train-limit), fit on the rest, "
                        "and leave the test split unread: to choose settings (writes knn-val.json)")
    p.set_defaults(func=command("knn", knn_config))

    _linear_parser(sub)
    _finetune_parser(sub)

    sp = SpectrumConfig
    p = sub.add_parser("rankme", help="RankMe, effective rank (99%% variance), embedding norm statistics")
    _common(p)
    p.add_argument("--split", choices=("train", "test"), default=sp.split)
    p.add_argument("--max-samples", type=int, default=sp.max_samples,
                   help=f"rows used for the spectrum (default {sp.max_samples})")
    _embedding_arg(p)
    p.set_defaults(func=command("rankme", spectrum_config))

    p = sub.add_parser("norms-ood", help="embedding-norm OOD score: AUROC and histogram (default: the run's "
                                         "data.exclude_classes on the loss-side embedding)")
    _common(p)
    _ood_args(p, required=False)
    _embedding_arg(p, default="loss")
    p.set_defaults(func=command("norms-ood", ood_config))

    p = sub.add_parser("all", help="knn, linear (fast path), rankme and norm statistics (+ norms-ood with --ood)")
    _common(p)
    _ood_args(p, required=False)
    p.set_defaults(func=cmd_all)

    _segment_parser(sub)
    add_generation_eval_parser(sub)
    add_reconstruct_parser(sub)
