"""The evaluation protocols' typed configs and their defaults, declared without torch: data only. ``selfsup eval``'s
parser takes its defaults from them, so ``selfsup eval --help`` loads no torch; the protocols import them from here
(``selfsup.eval`` and its modules re-export them under their old names: ``eval.knn.KnnConfig``, ...), as do
``runs.generation`` (``GenerationConfig``) and ``eval.reconstruct`` (``ReconstructConfig``)."""

from __future__ import annotations

from dataclasses import dataclass

from selfsup.architectures import VIT_SIZES

FEATURE_BATCH = 512  # images per feature-extraction forward (selfsup eval's default)


# --------------------------------------------------------------------------- kNN (eval.knn)

DEFAULT_KS = (10, 20, 100, 200)


@dataclass
class KnnConfig:
    """``selfsup eval knn``: neighbour counts (() = ``DEFAULT_KS`` up to the training-set size), the vote
    temperature (DINO's 0.07; None: majority voting), and where it is scored: the test split, or a validation
    split carved from the training images (``val_fraction``), the one to choose settings on."""

    ks: tuple[int, ...] = ()
    temperature: float | None = 0.07
    val_fraction: float = 0.0  # > 0: scored on this seeded share of the training images, fit on the rest (not test)
    seed: int = 0              # of that split (selfsup.eval.splits.val_split)


# --------------------------------------------------------------------------- the linear probe (eval.linear)


@dataclass
class ProbeConfig:
    """The probe's schedule; ``base_lr`` None picks MoCo v3's (3.0 for ViT, 0.1 otherwise).

    The fields' defaults are the bare probe (one lr, ``lr_grid`` ()); a protocol's defaults (MoCo v3's lr grid,
    MAE's LARS probe) are ``PROTOCOL_DEFAULTS``, applied by ``for_protocol`` / ``for_method``: the one place
    they are written (``selfsup eval linear`` and ``all`` read them from there)."""

    epochs: int = 90
    batch_size: int = 256
    base_lr: float | None = None
    momentum: float = 0.9
    weight_decay: float = 0.0
    crop_min: float = 0.08  # augmented path: RandomResizedCrop scale=(crop_min, 1)
    hflip_p: float = 0.5
    seed: int = 0
    lr_grid: tuple[float, ...] = ()  # base lrs (× batch/256) trained together; () = just base_lr
    wd_grid: tuple[float, ...] = ()  # weight decays crossed with lr_grid; () = just weight_decay
    val_fraction: float = 0.1  # of the training set, held out to choose the grid point (0: choose on test)
    feature_bn: bool = True  # MAE's BatchNorm1d(affine=False) on the frozen features before the heads
    protocol: str = "moco_v3"  # moco_v3: SGD, cosine per epoch | mae: LARS, warm-up + cosine per iteration
    warmup_epochs: float = 0.0  # mae: 10 (main_linprobe.py --warmup_epochs)
    min_lr: float = 0.0  # mae: the cosine's end (main_linprobe.py --min_lr 0)

    def __post_init__(self):
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}")

    @classmethod
    def for_protocol(cls, protocol: str = "moco_v3", **overrides) -> "ProbeConfig":
        """The protocol's probe (``PROTOCOL_DEFAULTS``), with ``overrides`` on top."""
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        return cls(**{**PROTOCOL_DEFAULTS[protocol], **overrides})

    @staticmethod
    def protocol_for(method: str | None) -> str:
        """The protocol a run of ``method`` is probed with by default: MAE's for MAE runs, else MoCo v3's."""
        return "mae" if method == "mae" else "moco_v3"

    @classmethod
    def for_method(cls, method: str | None, **overrides) -> "ProbeConfig":
        """The default probe of a run of ``method`` (``protocol_for``), with ``overrides`` on top."""
        return cls.for_protocol(cls.protocol_for(method), **overrides)


PROTOCOLS = ("moco_v3", "mae")
MAE_BASE_LR = 0.1  # main_linprobe.py --blr: lr = 0.1 · batch / 256
PROTOCOL_DEFAULTS = {
    # SGD over base lrs around MoCo v3's 0.1 (ResNet) and 3 (ViT), chosen on the validation split
    "moco_v3": {"protocol": "moco_v3", "lr_grid": (0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)},
    # MAE's linear probe (main_linprobe.py defaults): LARS at base lr 0.1, wd 0, 10 warm-up epochs, 90 epochs,
    # BatchNorm(affine=False) head, the whole training split (``val_fraction`` 0: one lr, nothing to choose)
    "mae": {"protocol": "mae", "lr_grid": (MAE_BASE_LR,), "weight_decay": 0.0, "warmup_epochs": 10.0,
            "feature_bn": True, "val_fraction": 0.0},
}


# --------------------------------------------------------------------------- fine-tuning (eval.finetune)


@dataclass
class MAERecipe:
    """MAE's fine-tuning defaults (main_finetune.py arguments of the same names)."""

    rand_augment: str | None = "rand-m9-mstd0.5-inc1"  # timm auto_augment string; None: off
    reprob: float = 0.25  # random erasing probability (mode pixel, one box)
    mixup: float = 0.8  # Mixup α (0: off)
    cutmix: float = 1.0  # CutMix α (0: off)
    mixup_switch_prob: float = 0.5
    smoothing: float = 0.1

    @property
    def mixes(self) -> bool:
        return self.mixup > 0 or self.cutmix > 0


@dataclass
class FinetuneConfig:
    """Small CPU-friendly defaults; MAE ViT-B uses 100 epochs, blr 5e-4, decay 0.65, drop path 0.1."""

    epochs: int = 5
    warmup_epochs: float = 1.0
    batch_size: int = 128
    base_lr: float = 1e-3  # lr = base_lr · batch / 256
    min_lr: float = 1e-6
    weight_decay: float = 0.05
    layer_decay: float = 0.75
    drop_path: float = 0.1
    label_smoothing: float = 0.1
    crop_min: float = 0.08
    hflip_p: float = 0.5
    seed: int = 0
    head_init_std: float = 2e-5  # MAE: trunc_normal_(head.weight, std=2e-5)
    recipe: MAERecipe | None = None  # MAE's RandAugment / erasing / mixup / cutmix (imagefolder default)
    num_workers: int = 0  # DataLoader workers of the recipe path
    pool: str | None = None  # ViT feature: None the backbone's own; cls | avg | global (MAE: global, fc_norm)
    train_pos_embed: bool = False  # MAE: the position table is trained (timm's pos_embed is a parameter)

    @classmethod
    def for_method(cls, method: str | None, backbone: str, **overrides) -> "FinetuneConfig":
        """The default fine-tuning of a run of ``method`` with ``backbone``: an MAE run's selfsup ViT gets MAE's
        global pool + ``fc_norm`` and a trained position table; the others keep their backbone's pool (the class
        token for the ViT presets) and the fixed table."""
        mae = method == "mae"
        return cls(**{"pool": "global" if mae and backbone in VIT_SIZES else None, "train_pos_embed": mae,
                      **overrides})


# --------------------------------------------------------------------------- the spectrum, norm OOD

RANKME_SAMPLES = 25_600  # the RankMe paper's sample count


@dataclass
class SpectrumConfig:
    """``selfsup eval rankme``: the split whose embeddings are measured and the rows used for the spectrum."""

    split: str = "train"  # train | test
    max_samples: int = RANKME_SAMPLES


@dataclass
class OodConfig:
    """``selfsup eval norms-ood``: the OOD set (a dataset name, its test split; ``classes:8,9``; None: the classes the
    run held out of pretraining, ``data.exclude_classes``), its folder and an optional fixed random subset size."""

    ood: str | None = None
    root: str | None = None
    limit: int | None = None


# --------------------------------------------------------------------------- dense: segmentation (eval.segment)

SEGMENT_TASKS = ("digits-canvas", "fmnist-canvas", "folder")  # data.canvas.CANVAS_TASKS and a user's folder
SEGMENT_PROTOCOLS = ("linear", "knn")
DEFAULT_SEGMENT_TASK = {"digits": "digits-canvas", "fashion-mnist": "fmnist-canvas"}  # a run's dataset → its task


@dataclass
class SegmentConfig:
    """``selfsup eval segment``: the dense task (None: the canvas of the run's dataset, ``DEFAULT_SEGMENT_TASK``),
    its folder (fmnist-canvas: Fashion-MNIST's IDX files; folder: ``images/`` + ``masks/``), the protocols and
    their settings: the linear head (DINOv2's BNHead: BatchNorm then a 1×1 linear layer on the patch tokens; AdamW,
    linear warm-up then linear decay to 0, per step) and the patch kNN (k, vote temperature, the seeded subset of
    training patches it searches)."""

    task: str | None = None
    root: str | None = None
    protocols: tuple[str, ...] = SEGMENT_PROTOCOLS
    size: int | None = None  # folder: the side images and masks are resized to (None: the backbone's image size)
    epochs: int = 20  # linear head: passes over the training images' cached patch features
    batch_size: int = 32  # images per step
    lr: float = 1e-2  # AdamW; 1e-2 over 1e-3 (the digits canvas, a DINO run and its init: +0.9 mIoU each)
    weight_decay: float = 1e-4
    warmup: float = 0.1  # share of the steps in the linear warm-up
    head_bn: bool = True  # DINOv2's BNHead: BatchNorm2d before the 1×1 linear layer; False: the linear layer alone
    k: int = 20
    temperature: float | None = 0.07  # None: majority vote
    max_train_patches: int = 20_000  # training patches the kNN searches (a seeded subset; 0: all of them)
    seed: int = 0  # the head's init and batch order, the kNN's subset, a folder's train / test split

    def __post_init__(self):
        unknown = [p for p in self.protocols if p not in SEGMENT_PROTOCOLS]
        if unknown or not self.protocols:
            raise ValueError(f"protocols must be some of {', '.join(SEGMENT_PROTOCOLS)}, got {self.protocols!r}")


# --------------------------------------------------------------------------- reconstructions, generation


@dataclass
class ReconstructConfig:
    """``selfsup eval reconstruct``: how many test images (``n``) of which ``split``, the ``seed`` of the images and
    the mask, the mask ratio (None: the run's), and the enlargement of each image (None: to at least 64 px)."""

    n: int = 8
    split: str = "test"
    seed: int = 0
    mask_ratio: float | None = None
    scale: int | None = None


@dataclass
class GenerationConfig:
    """``selfsup eval generation``: the encoder whose features define the metrics (None: the run's own EMA
    features), the samples (``n``, sampler ``steps`` / ``sampler`` / guidance ``cfg`` / ``seed``), the
    class-fidelity kNN's ``k``, the feature and sampler batches, and whether to compute Inception FID when its
    weights are on disk."""

    encoder: str | None = None
    n: int = 1000
    steps: int = 50
    sampler: str = "ode"
    cfg: float = 1.0
    seed: int = 0
    k: int = 20
    batch_size: int = FEATURE_BATCH
    sample_batch: int = 256
    inception: bool = True
