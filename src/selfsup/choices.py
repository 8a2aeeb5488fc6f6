"""The choices a run's config validates against, declared without torch: the dataset names, the memory formats
and the optimiser section. ``config`` reads them, so ``selfsup presets``, ``--help`` and the resume rules load no
torch; ``data.datasets``, ``memory_format`` and ``optim`` import them from here."""

from __future__ import annotations

from dataclasses import dataclass

from selfsup.errors import UserError

DATASETS = ("digits", "fashion-mnist", "cifar10", "cifar100", "stl10", "imagefolder", "images", "webdataset", "latents")
DECODED = ("imagefolder", "images", "webdataset")  # decoded from image files: data.image_size and data.channels apply
MEMORY_FORMATS = ("auto", "channels_last", "contiguous")


@dataclass
class OptimConfig:
    """Optimiser and schedule. ``lr = base_lr · global_batch / 256`` (or its square root), warmup then cosine,
    per iteration or per epoch."""

    name: str = "adamw"  # adamw | lars | larc (SwAV: every parameter adapted and decayed) | adam (coupled L2) | sgd
    base_lr: float = 1.5e-4
    weight_decay: float = 0.1
    momentum: float = 0.9  # SGD and LARS
    betas: tuple[float, float] = (0.9, 0.999)  # AdamW
    trust_coefficient: float = 0.001  # LARS
    warmup_epochs: float = 0.0
    min_lr: float = 0.0
    scale_min_lr: bool | None = None  # None: the method's official rule (scaled as base_lr; DINO, iBOT, MAE: as given)
    decay_1d: bool = True  # AdamW/SGD: decay biases and norm weights too (the official MoCo v3 / SimSiam code does)
    # linear: base_lr * batch/256 | sqrt: base_lr * sqrt(batch/256) (cookbook §3.5) | sqrt_1024: DINOv2's
    lr_scaling: str = "linear"
    predictor_lr_mult: float = 1.0  # predictor lr = mult × scheduled lr (DirectPred studies 1–10×)
    predictor_weight_decay: float | None = None  # None: same as weight_decay
    fix_predictor_lr: bool = False  # SimSiam's --fix-pred-lr: the predictor keeps the peak lr
    lr_schedule_unit: str = "iteration"  # iteration | epoch: the lr changes at each epoch's start only (SimSiam's code)
    # true: every schedule phase (this warm-up, a method's warm-ups and freezes) as configured even where longer than
    # the run (a short debug run of an official recipe); false: such a phase is shortened to 0.1 of the run
    keep_phases: bool = False
    lr_1d_mult: float = 1.0  # lr of ndim <= 1 tensors (LARS: its exempt group) = mult x lr (Barlow Twins 0.0048/0.2)
    fused: bool = True  # AdamW: torch's fused kernel (the same update in fewer kernels; benchmarks/results/NOTES.md)

    def validate(self) -> None:
        if self.name not in ("adamw", "lars", "larc", "adam", "sgd"):
            raise UserError(f"optim.name={self.name!r} is not known; use one of adamw, lars, larc, adam, sgd")
        for key in ("base_lr", "weight_decay", "warmup_epochs", "min_lr", "predictor_lr_mult", "lr_1d_mult"):
            if getattr(self, key) < 0:
                raise UserError(f"optim.{key}={getattr(self, key)} must be >= 0")
        if self.lr_scaling not in ("linear", "sqrt", "sqrt_1024"):
            raise UserError(f"optim.lr_scaling={self.lr_scaling!r} is not known; use linear, sqrt or sqrt_1024")
        if self.lr_schedule_unit not in ("iteration", "epoch"):
            raise UserError(f"optim.lr_schedule_unit={self.lr_schedule_unit!r} is not known; use iteration or epoch")
        if not 0 <= self.momentum < 1:
            raise UserError(f"optim.momentum={self.momentum} must be in [0, 1)")
