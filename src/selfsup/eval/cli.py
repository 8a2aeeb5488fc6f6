"""``selfsup eval {knn,linear,finetune,rankme,norms-ood,all} CKPT_OR_RUN`` (and ``generation RUN``): RUN/eval/*.json + a table."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from selfsup.errors import UserError

DEFAULT_KS = (10, 20, 100, 200)


# --------------------------------------------------------------------------- shared plumbing


class Context:
    """The source, device, datasets and cached features of one ``selfsup eval`` call."""

    def __init__(self, args):
        from selfsup.eval.cache import default_device
        from selfsup.eval.data import data_config
        from selfsup.eval.source import load_source

        self.args = args
        self.device = _device(args.device) if args.device else default_device()
        self.source = load_source(args.ckpt)
        if getattr(args, "embedding", "backbone") == "projector":
            from selfsup.eval.source import with_projector

            self.source = with_projector(self.source)
        if getattr(args, "flow_t", None) is not None or getattr(args, "flow_block", None) is not None:
            from selfsup.eval.source import with_flow_features

            self.source = with_flow_features(self.source, args.flow_t, args.flow_block)
        if args.out:
            self.source.out_dir = Path(args.out)
        self.data_cfg = data_config(self.source, args.data, args.root)
        self._splits: dict = {}

    @property
    def out_dir(self) -> Path:
        return self.source.out_dir

    def data_key(self, cfg, limit: int | None = None) -> str:
        return json.dumps([cfg.name, cfg.root, cfg.image_size, cfg.load_size, limit])

    def _limit(self, name: str, cfg, limit: int | None) -> int | None:
        if limit is None and name == "train" and cfg is self.data_cfg and self.args.train_limit is not None:
            return _positive(self.args.train_limit, "--train-limit")
        return limit

    def split(self, name: str, cfg=None, resize: bool | None = None, flag: str = "--resize", limit: int | None = None):
        """A dataset split checked against the backbone (``--train-limit``: a fixed subset of train)."""
        from selfsup.eval.data import load_split, subset

        cfg = cfg or self.data_cfg
        limit = self._limit(name, cfg, limit)
        key = (self.data_key(cfg, limit), name)
        if key not in self._splits:
            full = load_split(cfg, name, self.source.meta, self.args.resize if resize is None else resize, flag)
            self._splits[key] = subset(full, limit)
        return self._splits[key]

    def features(self, name: str, cfg=None, resize: bool | None = None, flag: str = "--resize",
                 limit: int | None = None):
        """(features, labels) of a split, through the feature cache."""
        from selfsup.eval.cache import features

        cfg = cfg or self.data_cfg
        limit = self._limit(name, cfg, limit)
        dataset = self.split(name, cfg, resize, flag, limit)
        return features(self.source, dataset, name, self.data_key(cfg, limit), self.args.batch_size, self.device,
                        not self.args.no_cache)

    def header(self) -> dict:
        return {"source": str(self.source.weights), "backbone": self.source.meta["backbone"],
                "method": self.source.meta.get("method"), "dataset": self.data_cfg.name,
                "embedding": self.source.embedding}

    def suffix(self) -> str:
        """File-name suffix of results on an embedding other than the backbone's."""
        return "" if self.source.embedding == "backbone" else f"-{self.source.embedding}"


def _device(name: str) -> torch.device:
    try:
        dev = torch.device(name)
    except RuntimeError:
        raise UserError(f"--device {name!r} is not a device name; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {name} asked for a GPU but none is available; use --device cpu")
    return dev


def _positive(value: int, flag: str) -> int:
    if value < 1:
        raise UserError(f"{flag} {value} must be >= 1")
    return value


def _parse_ks(text: str | None, n_train: int) -> list[int]:
    """``10,20,100`` → [10, 20, 100]; the default list drops k larger than the training set."""
    if text is None:
        ks = [k for k in DEFAULT_KS if k <= n_train] or [n_train]
        return ks
    try:
        ks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UserError(f"--k {text!r} is not a comma-separated list of integers (e.g. --k 10,20,100,200)") from None
    if not ks:
        raise UserError("--k needs at least one value (e.g. --k 20)")
    for k in ks:
        if k < 1:
            raise UserError(f"--k {k} must be >= 1")
        if k > n_train:
            raise UserError(f"--k {k} is larger than the {n_train} training samples; choose k <= {n_train}")
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


# --------------------------------------------------------------------------- evaluations


def run_knn(ctx: Context) -> dict:
    """Weighted (DINO) or majority-vote kNN for each k."""
    from selfsup.eval.knn import knn_sweep
    from selfsup.eval.report import print_table, write_json

    a = ctx.args
    temperature = _parse_temperature(getattr(a, "temperature", "0.07"), getattr(a, "majority", False))
    ftr, ytr = ctx.features("train")
    fte, yte = ctx.features("test")
    ks = _parse_ks(getattr(a, "k", None), len(ytr))
    t0 = time.perf_counter()
    res = knn_sweep(ftr.to(ctx.device), ytr, fte.to(ctx.device), yte, ks, (temperature,))
    seconds = time.perf_counter() - t0
    (vote, by_k), = res.items()
    out = {**ctx.header(), "voting": vote, "temperature": temperature, "train_size": len(ytr), "test_size": len(yte),
           "results": by_k, "seconds": seconds}
    write_json(ctx.out_dir, f"knn{ctx.suffix()}", out)
    print_table(f"kNN ({vote}) on {ctx.data_cfg.name}: {len(ytr)} train / {len(yte)} test",
                ["k", "top-1 %", "top-5 %"], [[k[2:], r["top1"], r["top5"]] for k, r in by_k.items()])
    return out


def _aug_defaults(ctx: Context, a) -> tuple[float, float]:
    """Crop scale and flip probability: the flags, else 0.08 whatever the pretraining crop was (MoCo v3's
    main_lincls.py, MAE's fine-tuning) and the run's flip probability (0 where flips change the class)."""
    aug = getattr(ctx.source.run_cfg, "augment", None)
    crop = a.crop_min if a.crop_min is not None else 0.08
    flip = a.hflip if a.hflip is not None else (aug.hflip_p if aug is not None and aug.hflip_p is not None else 0.5)
    return crop, flip


def run_linear(ctx: Context, mode: str | None = None) -> dict:
    """MoCo v3 linear probe: the fast path on cached features, or with augmentation."""
    from selfsup.eval.linear import DEFAULT_LR_GRID, ProbeConfig, default_base_lr, probe_augmented, probe_features
    from selfsup.eval.report import print_table, write_json

    a = ctx.args
    mode = mode or a.mode or ("augmented" if ctx.device.type == "cuda" else "features")
    crop, flip = _aug_defaults(ctx, a) if hasattr(a, "crop_min") else (0.08, 0.5)
    lr_flag = getattr(a, "lr", None)
    lr_grid = (lr_flag,) if lr_flag is not None else (_parse_floats(getattr(a, "lr_grid", None), "--lr-grid")
                                                       or DEFAULT_LR_GRID)
    val_fraction = getattr(a, "val_fraction", 0.1)
    if not 0 <= val_fraction < 1:
        raise UserError(f"--val-fraction {val_fraction} must be in [0, 1) (0: choose the grid point on test)")
    cfg = ProbeConfig(epochs=_positive(getattr(a, "epochs", None) or 90, "--epochs"),
                      batch_size=_positive(getattr(a, "probe_batch", 256), "--probe-batch"),
                      crop_min=crop, hflip_p=flip, lr_grid=lr_grid, val_fraction=val_fraction,
                      feature_bn=not getattr(a, "no_feature_bn", False),
                      wd_grid=_parse_floats(getattr(a, "wd_grid", None), "--wd-grid", allow_zero=True))
    base = default_base_lr(ctx.source.meta["backbone"])  # only used when the grid is empty
    train, test = ctx.split("train"), ctx.split("test")
    t0 = time.perf_counter()
    if mode == "features":
        ftr, ytr = ctx.features("train")
        fte, yte = ctx.features("test")
        res = probe_features(ftr, ytr, fte, yte, max(train.num_classes, int(ytr.max()) + 1), cfg, base, ctx.device)
    else:
        res = probe_augmented(ctx.source.backbone, train, test, ctx.source.meta, cfg, base, ctx.device)
    chosen = res["chosen"]
    out = {**ctx.header(), "mode": mode, "protocol": "moco_v3", "epochs": cfg.epochs, "batch_size": cfg.batch_size,
           "base_lr": chosen["base_lr"], "lr": chosen["lr"], "weight_decay": chosen["weight_decay"],
           "val_fraction": cfg.val_fraction, "feature_bn": cfg.feature_bn, **({"crop_min": crop, "hflip_p": flip} if mode == "augmented" else {}),
           **res, "seconds": time.perf_counter() - t0}
    write_json(ctx.out_dir, f"linear{ctx.suffix()}", out)
    chooser = "val_top1" if "val_top1" in chosen else "test_top1"
    print_table(f"linear probe grid ({mode}, {cfg.epochs} epochs, {len(res['grid'])} heads trained together; "
                f"chosen on {'a ' + str(res['val_size']) + '-image validation split' if res['val_size'] else 'test'})",
                ["base lr", "lr", "wd", "val top-1 %", "test top-1 %", ""],
                [[g["base_lr"], g["lr"], g["weight_decay"], g.get("val_top1", "-"), g["test_top1"],
                  "<- chosen" if g is chosen else ""] for g in res["grid"]])
    rows = [["test", res["test"]["top1"], res["test"]["top5"]]]
    if "train" in res:
        rows.append(["train", res["train"]["top1"], res["train"]["top5"]])
    print_table(f"linear probe ({mode}, lr {chosen['lr']:g}, wd {chosen['weight_decay']:g}, by {chooser}) "
                f"on {ctx.data_cfg.name}", ["split", "top-1 %", "top-5 %"], rows)
    return out


def run_finetune(ctx: Context) -> dict:
    """End-to-end fine-tuning with layer-wise lr decay and drop path."""
    from selfsup.eval.finetune import FinetuneConfig, finetune
    from selfsup.eval.report import print_table, write_json
    from selfsup.export import export_backbone
    from selfsup.models.backbones import build_backbone

    a = ctx.args
    meta = ctx.source.meta
    is_vit = hasattr(ctx.source.backbone, "layer_id")
    crop, flip = _aug_defaults(ctx, a)
    if not 0 <= a.drop_path < 1:
        raise UserError(f"--drop-path {a.drop_path} must be in [0, 1)")
    if not 0 < a.layer_decay <= 1:
        raise UserError(f"--layer-decay {a.layer_decay} must be in (0, 1]")
    recipe = _mae_recipe(a, ctx.data_cfg.name)
    if recipe and recipe.mixes and a.ft_batch % 2:
        raise UserError(f"--ft-batch {a.ft_batch} must be even for mixup / cutmix (or pass --mixup 0 --cutmix 0)")
    cfg = FinetuneConfig(epochs=_positive(a.epochs, "--epochs"), warmup_epochs=a.warmup_epochs,
                         batch_size=_positive(a.ft_batch, "--ft-batch"), base_lr=a.lr, weight_decay=a.weight_decay,
                         layer_decay=a.layer_decay if is_vit else 1.0, drop_path=a.drop_path, crop_min=crop,
                         hflip_p=flip, min_lr=a.min_lr, recipe=recipe,
                         label_smoothing=a.smoothing if a.smoothing is not None else 0.1,
                         num_workers=a.workers if a.workers is not None else ctx.data_cfg.num_workers)
    train, test = ctx.split("train"), ctx.split("test")
    kwargs = dict(meta["kwargs"], drop_path_rate=cfg.drop_path)
    backbone = build_backbone(meta["backbone"], **kwargs)
    backbone.load_state_dict(ctx.source.backbone.state_dict())
    t0 = time.perf_counter()
    res = finetune(backbone, train, test, meta, cfg, ctx.device)
    out = {**ctx.header(), "epochs": cfg.epochs, "warmup_epochs": cfg.warmup_epochs, "batch_size": cfg.batch_size,
           "base_lr": cfg.base_lr, "layer_decay": cfg.layer_decay, "drop_path": cfg.drop_path,
           "weight_decay": cfg.weight_decay, "min_lr": cfg.min_lr, "head_init_std": cfg.head_init_std,
           "recipe": dataclasses.asdict(recipe) if recipe else "plain", **res, "seconds": time.perf_counter() - t0}
    export_backbone(backbone.cpu(), ctx.out_dir / "finetuned_backbone.safetensors",
                    {k: v for k, v in meta.items() if k != "format"} | {"kwargs": kwargs})
    write_json(ctx.out_dir, "finetune", out)
    print_table(f"fine-tuning ({cfg.epochs} epochs, {'MAE recipe' if recipe else 'plain crop + flip'}, "
                f"layer decay {cfg.layer_decay:g}, drop path {cfg.drop_path:g}) "
                f"on {ctx.data_cfg.name}", ["split", "top-1 %", "top-5 %"],
                [["test", res["test"]["top1"], res["test"]["top5"]]])
    return out


def _mae_recipe(a, dataset: str):
    """MAE's data recipe (defaults on for imagefolder, off for the small in-memory sets), with the flags applied."""
    from selfsup.eval.mae_recipe import MAERecipe

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
                raise UserError(f"--{flag} {value} is out of range ({'[0, 1)' if flag in ('reprob', 'smoothing') else '>= 0'})")
            setattr(r, field, value)
    if r.rand_augment:
        from timm.data import rand_augment_transform

        try:
            rand_augment_transform(r.rand_augment, {})
        except Exception:
            raise UserError(f"--rand-augment {r.rand_augment!r} is not a timm RandAugment string "
                            "(e.g. rand-m9-mstd0.5-inc1, or none)") from None
    return r


def run_rankme(ctx: Context) -> dict:
    """RankMe, effective rank (99% variance) and norm statistics of the train-split embeddings."""
    from selfsup.eval.report import print_table, write_json
    from selfsup.eval.spectrum import effective_rank, norm_stats, rankme, subsample

    a = ctx.args
    split = getattr(a, "split", "train")
    feats, _ = ctx.features(split)
    sub = subsample(feats, _positive(getattr(a, "max_samples", 25_600), "--max-samples"))
    out = {**ctx.header(), "split": split, "samples": len(sub), "dim": feats.shape[1], "rankme": rankme(sub),
           "effective_rank_99": effective_rank(sub, 0.99), "norms": norm_stats(feats)}
    write_json(ctx.out_dir, f"rankme{ctx.suffix()}", out)
    n = out["norms"]
    print_table(f"embedding spectrum on {ctx.data_cfg.name} {split} ({len(sub)} samples, dim {out['dim']})",
                ["RankMe", "eff. rank 99%", "norm mean", "norm p5", "norm p50", "norm p95"],
                [[out["rankme"], out["effective_rank_99"], n["mean"], n["p5"], n["p50"], n["p95"]]])
    return out


def _parse_classes(spec: str, num_classes: int) -> list[int]:
    try:
        classes = sorted({int(c) for c in spec.split(",") if c.strip()})
    except ValueError:
        raise UserError(f"--ood classes:{spec} is not a list of class indices (e.g. --ood classes:8,9)") from None
    if not classes or any(not 0 <= c < num_classes for c in classes) or len(classes) >= num_classes:
        raise UserError(f"--ood classes:{spec} must name some but not all of the classes 0..{num_classes - 1}")
    return classes


def run_norms_ood(ctx: Context, ood: str | None = None) -> dict:
    """Embedding-norm OOD score: AUROC of in-distribution test (positive) vs the OOD set (``--ood``), and a histogram."""
    ood = ood or ctx.args.ood
    from selfsup.eval.data import data_config
    from selfsup.eval.ood import auroc, histogram, norm_scores
    from selfsup.eval.report import print_table, write_json

    ftr, ytr = ctx.features("train")
    fte, yte = ctx.features("test")
    if ood.startswith("classes:"):
        classes = _parse_classes(ood[len("classes:"):], ctx.split("train").num_classes)
        held = torch.isin(yte, torch.tensor(classes))
        ftr = ftr[~torch.isin(ytr, torch.tensor(classes))]
        f_ood, fte = fte[held], fte[~held]
        tag = "classes-" + "-".join(map(str, classes))
    else:
        cfg = data_config(ctx.source, ood, getattr(ctx.args, "ood_root", None))
        limit = getattr(ctx.args, "ood_limit", None)
        f_ood, _ = ctx.features("test", cfg, resize=True, limit=_positive(limit, "--ood-limit") if limit else None)
        tag = cfg.name
    if len(fte) == 0 or len(f_ood) == 0:
        raise UserError(f"--ood {ood} leaves no in-distribution or no OOD test samples; choose other classes")
    mean_norm = float(ftr.norm(dim=1).mean())
    s_in, s_ood = norm_scores(fte, mean_norm), norm_scores(f_ood, mean_norm)
    area = auroc(s_in, s_ood)
    png = histogram(s_in, s_ood, ctx.out_dir / f"norms-ood-{tag}{ctx.suffix()}.png",
                    f"{ctx.data_cfg.name} vs {tag}: AUROC {area:.3f}")
    out = {**ctx.header(), "ood": ood, "train_mean_norm": mean_norm, "auroc": area, "in_size": len(s_in),
           "ood_size": len(s_ood), "in_score_mean": float(s_in.mean()), "ood_score_mean": float(s_ood.mean()),
           "plot": str(png)}
    write_json(ctx.out_dir, f"norms-ood-{tag}{ctx.suffix()}", out)
    print_table(f"norm OOD score: {ctx.data_cfg.name} test (in) vs {tag} (OOD)",
                ["AUROC", "in mean score", "OOD mean score", "in n", "OOD n"],
                [[area, out["in_score_mean"], out["ood_score_mean"], len(s_in), len(s_ood)]])
    print(f"  histogram: {png}")
    return out


# --------------------------------------------------------------------------- commands


def command(run):
    """An argparse handler that runs ``run(Context(args))`` and exits 0 (errors raise UserError)."""

    def handler(args) -> int:
        run(Context(args))
        return 0

    return handler


def cmd_all(args) -> int:
    """The standard set: kNN, linear probe (fast path), RankMe / effective rank / norms, norm OOD if --ood."""
    from selfsup.eval.report import write_json

    ctx = Context(args)
    summary = {**ctx.header(), "knn": run_knn(ctx)["results"]}
    summary["linear"] = run_linear(ctx, mode="features")["test"]
    r = run_rankme(ctx)
    summary.update(rankme=r["rankme"], effective_rank_99=r["effective_rank_99"], norms=r["norms"])
    if args.ood:
        summary["norms_ood_auroc"] = run_norms_ood(ctx, args.ood)["auroc"]
    else:
        print("(norm OOD scoring skipped: pass --ood DATASET or --ood classes:8,9)")
    write_json(ctx.out_dir, "all", summary)
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("ckpt", metavar="CKPT_OR_RUN", help="run folder, exported backbone .safetensors, or a run's .ckpt")
    p.add_argument("--data", help="dataset name (default: the one the backbone was trained on)")
    p.add_argument("--root", help="dataset folder (default: the run's data.root, else the dataset's default)")
    p.add_argument("--resize", action="store_true", help="resize images of another size to the backbone's input")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument("--batch-size", type=int, default=512, help="feature extraction batch (default 512)")
    p.add_argument("--out", help="folder for the results (default: RUN/eval)")
    p.add_argument("--no-cache", action="store_true", help="extract features again instead of reusing the cache")
    p.add_argument("--train-limit", type=int, help="use a fixed random subset of this many training images")
    p.add_argument("--flow-t", type=float, help="flow runs: noise level of the features (default: the run's method.feature_t)")
    p.add_argument("--flow-block", type=int, help="flow runs: block whose tokens are pooled (default: the teacher's k)")


def _knn_args(p) -> None:
    p.add_argument("--k", help="comma-separated neighbour counts (default 10,20,100,200)")
    p.add_argument("--temperature", default="0.07", help="vote weight exp(sim/T) (default 0.07); none: majority")
    p.add_argument("--majority", action="store_true", help="plain majority voting (same as --temperature none)")


def _aug_args(p) -> None:
    p.add_argument("--crop-min", type=float, help="RandomResizedCrop minimum area (default 0.08)")
    p.add_argument("--hflip", type=float, help="flip probability (default: run's, else 0.5)")


def _embedding_arg(p) -> None:
    p.add_argument("--embedding", choices=("backbone", "projector"), default="backbone",
                   help="which embedding: the backbone feature (default) or the projector output (a run folder's heads)")


def add_eval_parser(subparsers) -> None:
    """The ``selfsup eval`` command and its subcommands."""
    ev = subparsers.add_parser("eval", help="evaluate a pretrained backbone: knn, linear, finetune, rankme, norms-ood, all; "
                                        "a flow run's samples: generation")
    sub = ev.add_subparsers(dest="eval_command", required=True)

    p = sub.add_parser("knn", help="weighted (DINO) or majority-vote kNN, top-1 / top-5")
    _common(p)
    _knn_args(p)
    p.set_defaults(func=command(run_knn))

    p = sub.add_parser("linear", help="linear probe, MoCo v3 protocol")
    _common(p)
    p.add_argument("--mode", choices=("features", "augmented"),
                   help="features: cached features, no augmentation (default on CPU); augmented: crop + flip (GPU default)")
    p.add_argument("--epochs", type=int, default=90, help="default 90 (MoCo v3)")
    p.add_argument("--probe-batch", type=int, default=256, help="classifier batch (default 256)")
    p.add_argument("--lr", type=float, help="one base lr (× batch/256) instead of the grid")
    p.add_argument("--lr-grid", help="base lrs trained together, chosen on validation (default 0.01,0.03,0.1,0.3,1,3,10)")
    p.add_argument("--wd-grid", help="weight decays crossed with the lr grid (default 0)")
    p.add_argument("--no-feature-bn", action="store_true",
                   help="no BatchNorm (affine=False) on the features before the heads (MoCo v3's plain head; MAE's has it)")
    p.add_argument("--val-fraction", type=float, default=0.1,
                   help="share of train held out to choose the grid point (default 0.1; 0: choose on test)")
    _aug_args(p)
    p.set_defaults(func=command(run_linear))

    p = sub.add_parser("finetune", help="end-to-end fine-tuning: layer-wise lr decay, drop path, AdamW")
    _common(p)
    p.add_argument("--epochs", type=int, default=5, help="default 5 (small, for CPUs)")
    p.add_argument("--warmup-epochs", type=float, default=1.0)
    p.add_argument("--ft-batch", type=int, default=128, help="training batch (default 128)")
    p.add_argument("--lr", type=float, default=1e-3, help="base lr, scaled by batch/256 (default 1e-3)")
    p.add_argument("--weight-decay", type=float, default=0.05)
    p.add_argument("--layer-decay", type=float, default=0.75, help="ViT layer-wise lr decay (default 0.75)")
    p.add_argument("--drop-path", type=float, default=0.1, help="stochastic depth rate (default 0.1)")
    p.add_argument("--min-lr", type=float, default=1e-6, help="final lr, absolute as MAE's (default 1e-6)")
    p.add_argument("--recipe", choices=("mae", "plain"),
                   help="mae: RandAugment, random erasing, mixup / cutmix (default for imagefolder); plain: crop + flip")
    p.add_argument("--rand-augment", help="timm RandAugment string (MAE: rand-m9-mstd0.5-inc1), or none")
    p.add_argument("--reprob", type=float, help="random erasing probability (MAE: 0.25)")
    p.add_argument("--mixup", type=float, help="Mixup alpha (MAE: 0.8; 0 off)")
    p.add_argument("--cutmix", type=float, help="CutMix alpha (MAE: 1.0; 0 off)")
    p.add_argument("--smoothing", type=float, help="label smoothing (MAE: 0.1)")
    p.add_argument("--workers", type=int, help="decoding workers of the MAE recipe (default: the run's data.num_workers)")
    _aug_args(p)
    p.set_defaults(func=command(run_finetune))

    p = sub.add_parser("rankme", help="RankMe, effective rank (99%% variance), embedding norm statistics")
    _common(p)
    p.add_argument("--split", choices=("train", "test"), default="train")
    p.add_argument("--max-samples", type=int, default=25_600, help="rows used for the spectrum (default 25600)")
    _embedding_arg(p)
    p.set_defaults(func=command(run_rankme))

    p = sub.add_parser("norms-ood", help="embedding-norm OOD score: AUROC and histogram")
    _common(p)
    p.add_argument("--ood", required=True, help="OOD dataset name (its test split), or classes:8,9 (held-out classes)")
    p.add_argument("--ood-root", help="folder of the OOD dataset")
    p.add_argument("--ood-limit", type=int, help="use a fixed random subset of this many OOD images")
    _embedding_arg(p)
    p.set_defaults(func=command(run_norms_ood))

    p = sub.add_parser("all", help="knn, linear (fast path), rankme and norm statistics (+ norms-ood with --ood)")
    _common(p)
    p.add_argument("--ood", help="OOD dataset or classes:8,9 for the norm OOD score")
    p.add_argument("--ood-root", help="folder of the OOD dataset")
    p.add_argument("--ood-limit", type=int, help="use a fixed random subset of this many OOD images")
    p.set_defaults(func=cmd_all)

    from selfsup.flow.generation import add_generation_eval_parser

    add_generation_eval_parser(sub)

    from selfsup.eval.reconstruct import add_reconstruct_parser

    add_reconstruct_parser(sub)
