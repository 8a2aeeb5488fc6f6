"""Typed, validated run configuration: presets (YAML) + ``dotted.key=value`` overrides → dataclasses.

Every mistake is a ``UserError`` with one line naming the key and the fix (close keys suggested).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from selfsup.architectures import DINOV3_VIT_SIZES
from selfsup.choices import DATASETS, MEMORY_FORMATS, OptimConfig
from selfsup.errors import UserError

PRESET_DIR = Path(__file__).parent / "presets"
LOGGERS = ("csv", "tensorboard", "wandb")


@dataclass
class DataConfig:
    """Which images, where from, and how they are batched."""

    # digits | fashion-mnist | cifar10 | cifar100 | stl10 | imagefolder | images (unlabelled, any depth)
    # | webdataset (tar shards) | latents (precomputed, float)
    name: str = "digits"
    root: str | None = None  # None: the dataset's default location (see selfsup.data.datasets)
    # None: the dataset's native size; image folders and shards: the median shorter side of up to 256 of their images
    # (clamped to 8..224, rounded down to image_size_multiple), printed and recorded in config.yaml
    image_size: int | None = None
    # the automatic image_size is a multiple of this (None: model.patch_size for a selfsup ViT backbone, else 1)
    image_size_multiple: int | None = None
    channels: int | None = None  # image folders and shards: 3 (RGB, the default) or 1 (decoded to grayscale)
    batch_size: int = 256  # global batch (all processes); per process = batch_size / world_size
    # decoding workers (imagefolder, images, webdataset: one shard stream each); in-memory datasets need none
    num_workers: int = 0
    # A training image of a folder (imagefolder, images) that cannot be decoded: error stops the run naming it;
    # skip replaces it by the next readable file of the list (a deterministic choice: resume stays exact), prints
    # one line, logs it in RUN/bad_files.jsonl (a bad_file event) and names the files at the end; past
    # the larger of 10 files and max_bad_fraction of them (counted over every loader worker; data/badfiles.py) the run
    # stops in one line. Files that fail at listing (data.name=images: empty, not an image, a dangling symlink)
    # count the same. Tar shards (webdataset) the same: a corrupt image is replaced by another sample of its batch, a
    # shard that breaks off (truncated, unreadable) ends there and the stream goes on. `selfsup data check ROOT`
    # finds them before a run.
    on_bad_file: str = "skip"
    max_bad_fraction: float = 0.001
    # Where the training crops of a folder (imagefolder, images) are decoded: cpu (the workers decode and crop,
    # data.decode.FolderCrops), device (the workers read bytes; the accelerator decodes JPEGs, nvJPEG on a GPU, and
    # cuts the views, the next batch decoded during the step: data.device_decode), auto (device on a GPU fed by fewer
    # than 2 workers when every training file is a JPEG, else cpu: with more, the workers outrun nvJPEG;
    # runs.data.decode_on_device)
    decode: str = "auto"
    # imagefolder evaluation: shorter side before the centre crop (None: image_size / 0.875)
    load_size: int | None = None
    unlabeled: bool = False  # stl10: pretrain on train + unlabeled
    num_samples: int | None = None  # webdataset: samples per epoch, all shards (None: counted from local tar headers)
    shuffle_buffer: int = 1000  # webdataset: samples in each stream's shuffle buffer (0: shard order)
    download: bool = False  # torchvision download when the files are absent (never in tests)
    # classes held out of pretraining: removed from the train and test splits of the run (kNN and the monitor see
    # the others); ``selfsup eval norms-ood`` scores their test images as the truly unseen, OOD set
    exclude_classes: list[int] = field(default_factory=list)
    # long-tailed train split: the class of rank i (by label, excluded classes skipped) keeps a fixed random
    # ratio^(-i/(C-1)) of its images, so the largest class has ``imbalance`` times the smallest (1 = balanced);
    # the embedding-norm code's CIFAR-10-LT keeps 1.5^-i of each class (ratio 1.5^9 ≈ 38)
    imbalance: float = 1.0
    imbalance_seed: int = 0  # the draw of the kept images (the same subsample for every trainer.seed)

    def validate(self) -> None:
        if self.on_bad_file not in ("error", "skip"):
            raise UserError(f"data.on_bad_file={self.on_bad_file!r} is not one of: error, skip")
        if not 0 <= self.max_bad_fraction < 1:
            raise UserError(f"data.max_bad_fraction={self.max_bad_fraction} must be in [0, 1)")
        if self.image_size_multiple is not None and self.image_size_multiple < 1:
            raise UserError(f"data.image_size_multiple={self.image_size_multiple} must be >= 1")
        if self.decode not in ("auto", "cpu", "device"):
            raise UserError(f"data.decode={self.decode!r} is not one of: auto, cpu, device")
        if self.name not in DATASETS:
            raise UserError(f"data.name={self.name!r} is not known; use one of {', '.join(DATASETS)}")
        if self.batch_size < 1:
            raise UserError(f"data.batch_size={self.batch_size} must be >= 1")
        if self.num_samples is not None and self.num_samples < 1:
            raise UserError(f"data.num_samples={self.num_samples} must be >= 1 (or null: count the local shards)")
        if self.shuffle_buffer < 0:
            raise UserError(f"data.shuffle_buffer={self.shuffle_buffer} must be >= 0 (0: shard order)")
        if self.image_size is not None and self.image_size < 4:
            raise UserError(f"data.image_size={self.image_size} is too small; use >= 4")
        if self.channels not in (None, 1, 3):
            raise UserError(f"data.channels={self.channels} must be 1 (grayscale) or 3 (RGB)")
        if self.num_workers < 0:
            raise UserError(f"data.num_workers={self.num_workers} must be >= 0 (0: decode in the main process)")
        if any(c < 0 for c in self.exclude_classes) or len(set(self.exclude_classes)) < len(self.exclude_classes):
            raise UserError(f"data.exclude_classes={self.exclude_classes} must list distinct class indices >= 0, "
                            "e.g. [8, 9]")
        if not self.imbalance >= 1:
            raise UserError(f"data.imbalance={self.imbalance} must be >= 1 (the largest class / the smallest; "
                            "1 = balanced)")


@dataclass
class AugmentSection:
    """The view plan: a recipe's two branches (the global crops) plus overrides, and optional local crops
    (multi-crop; see selfsup.data.views.build_view_plan)."""

    recipe: str | None = None  # None: the method's own recipe
    crop_min: float | None = None  # overrides of both branches
    hflip_p: float | None = None
    jitter_p: float | None = None
    grayscale_p: float | None = None
    blur_p: float | None = None
    solarize_p: float | None = None
    branch1: dict = field(default_factory=dict)  # per-branch overrides of AugmentConfig fields
    branch2: dict = field(default_factory=dict)
    global_crops_scale: tuple[float, float] | None = None  # both branches' crop scale (DINO --global_crops_scale)
    local_crops_number: int = 0  # local crops after the two global ones (DINO 8; 0: the two-branch plan)
    local_crops_size: int | None = None  # their output size; None: 96/224 of the model size (DINO's 96 px at 224)
    local_crops_scale: tuple[float, float] = (0.05, 0.4)  # DINO --local_crops_scale
    local: dict = field(default_factory=dict)  # overrides of the local crops' AugmentConfig fields

    def validate(self) -> None:
        if self.local_crops_number < 0:
            raise UserError(f"augment.local_crops_number={self.local_crops_number} must be >= 0 (0: no local crops)")
        if self.local_crops_size is not None and self.local_crops_size < 1:
            raise UserError(f"augment.local_crops_size={self.local_crops_size} must be >= 1")


@dataclass
class ModelConfig:
    """The backbone: own MoCo v3 ViT, DINOv3's ViT or ConvNeXt (``dinov3_*``), torchvision ResNet or ``timm:<name>``."""

    backbone: str = "vit_micro"
    patch_size: int = 16
    pool: str = "cls"  # cls | avg (ViT)
    stop_grad_conv1: bool = False  # MoCo v3's frozen random patch projection
    drop_path_rate: float = 0.0
    small_stem: bool = False  # ResNet: 3×3 stride-1 conv1 and no max-pool, for small images
    zero_init_residual: bool = False  # ResNet: last BN γ of every residual block starts at 0 (the official SSL codes)
    layer_scale: float = 0.0  # ViT LayerScale init value (CaiT: 0.1 to depth 18, 1e-5 deeper); 0 = off
    # ViT positions: sincos (fixed, MoCo v3) | learned (DINO / timm; bicubic for other crop sizes) | none (zeros)
    pos_embed: str = "sincos"
    final_norm: bool = True  # ViT: false drops the final LayerNorm (MoCo v3 §6.2: average pooling needs it gone)
    # ViT init: moco_v3 | trunc_normal (DINO / timm: Linear weights, cls, pos std .02) | dinov2 (the same, cls std 1e-6)
    init: str = "moco_v3"
    registers: int = 0  # ViT register tokens (DINOv2 "registers": 4), after the class token, dropped from outputs
    ffn: str = "mlp"  # ViT block FFN: mlp (GELU) | swiglu (DINOv2 ViT-L/g's swiglufused)
    drop_path_uniform: bool = False  # ViT: every block the same drop-path rate (DINOv2), not rising linearly
    class_token: bool = True  # ViT: false builds it without a class token (I-JEPA's ViT; pool avg)
    # Start the backbone from given weights (selfsup.weights): a selfsup run folder or exported .safetensors, a local
    # .safetensors / .pth / .pt (state dict or checkpoint: wrappers teacher, state_dict, model; prefixes module.,
    # backbone., encoder., ...), a DINOv2 torch.hub checkpoint (dinov2_vit{s,b,l,g}14[_reg4]_pretrain.pth), a DINOv3
    # hub file (dinov3_<arch>_pretrain_<weights>-<hash>.pth), a transformers DINOv2 / DINOv3 folder (config.json +
    # model.safetensors), timm (a timm:<name> backbone's own pretrained weights) or timm:<name>; None: a random init.
    # Position tables are resampled to the run's image size; run.json records the source and a sha256 of the loaded
    # tensors
    weights: str | None = None

    def validate(self) -> None:
        if self.pos_embed not in ("sincos", "learned", "none"):
            raise UserError(f"model.pos_embed={self.pos_embed!r} is not known; use sincos, learned or none")
        if self.init not in ("moco_v3", "trunc_normal", "dinov2"):
            raise UserError(f"model.init={self.init!r} is not known; use moco_v3, trunc_normal or dinov2")
        if self.pool not in ("cls", "avg"):
            raise UserError(f"model.pool={self.pool!r} is not known; use cls or avg")
        if self.ffn not in ("mlp", "swiglu"):
            raise UserError(f"model.ffn={self.ffn!r} is not known; use mlp or swiglu")
        if self.registers < 0:
            raise UserError(f"model.registers={self.registers} must be >= 0")
        if not self.class_token and self.pool == "cls":
            raise UserError("model.class_token=false leaves no class token to pool: set model.pool=avg")
        if not self.class_token and not self.backbone.startswith("vit_"):
            raise UserError(f"model.class_token=false applies to the selfsup ViTs, not {self.backbone!r}; drop it")
        if self.layer_scale < 0:
            raise UserError(f"model.layer_scale={self.layer_scale} must be >= 0 (0 turns LayerScale off)")
        if not 0 <= self.drop_path_rate < 1:
            raise UserError(f"model.drop_path_rate={self.drop_path_rate} must be in [0, 1)")
        if self.weights is not None and not str(self.weights).strip():
            raise UserError("model.weights is empty; give a run folder, a weights file, timm or timm:<name>, "
                            "or null for a random init")
        if self.zero_init_residual and not self.backbone.startswith("resnet"):
            raise UserError(f"model.zero_init_residual applies to the torchvision ResNets, not {self.backbone!r}; "
                            "drop it (timm ResNets zero-init their last BN already)")


@dataclass
class TrainerConfig:
    """The Lightning Trainer: devices, precision, strategy, checkpoints, logging."""

    max_epochs: int = 100
    max_steps: int = 0  # > 0: train this many optimiser steps (trainer.max_epochs is then not used); 0: max_epochs
    accelerator: str = "auto"  # auto | cpu | gpu
    devices: Any = "auto"  # int, list of ids, or "auto"
    num_nodes: int = 1
    strategy: str = "auto"  # auto | ddp | ddp_spawn | fsdp
    precision: str = "32-true"  # 32-true | 16-mixed | bf16-mixed
    sync_batchnorm: bool = True  # SyncBN across processes (MoCo v3 official); GPUs only, no-op in one process
    gradient_clip_val: float | None = None
    accumulate_grad_batches: int = 1  # optimiser step every k batches of data.batch_size (schedules count steps)
    log_every_n_steps: int = 10
    checkpoint_every_n_steps: int = 0  # also every N optimiser steps (0: off); a checkpoint at each epoch end always
    checkpoint_every_n_minutes: float = 10.0  # also every N minutes of wall time (0: off)
    limit_train_batches: float | int = 1.0
    # tqdm's bar on a terminal; where stdout is not one (a log file, a job's output) a plain line every
    # log_every_n_steps batches and at each epoch's end (runs.progress)
    progress_bar: bool = True
    # Lightning's own console messages (GPU / TPU available, its tips, limit_train_batches=1.0, the DDP banner and
    # torch.distributed's lines for one process, its deprecation warnings): off unless true
    # (runs.loggers.quiet_lightning)
    verbose: bool = False
    seed: int = 0
    compile: bool = False  # torch.compile the whole step forward (EMA update, views, heads, loss) as one graph
    compile_backend: str = "inductor"  # torch.compile backend (aot_eager: capture without code generation)
    compile_mode: str | None = None  # torch.compile mode: None (default) | max-autotune-no-cudagraphs | ...
    host_allocator: str = "cached"  # cached: glibc keeps freed blocks for reuse on CPU training (selfsup.host) | system
    # auto (channels_last for a CNN backbone on a CUDA GPU, else contiguous) | channels_last | contiguous
    memory_format: str = "auto"
    loggers: list[str] | str = field(default_factory=lambda: ["csv", "tensorboard"])  # any of csv, tensorboard, wandb
    wandb_project: str = "selfsup"  # trainer.loggers=wandb: the W&B project (offline without an API key or network)

    def validate(self) -> None:
        if self.max_epochs < 1:
            raise UserError(f"trainer.max_epochs={self.max_epochs} must be >= 1")
        if self.max_steps < 0:
            raise UserError(f"trainer.max_steps={self.max_steps} must be >= 0 (0: train trainer.max_epochs epochs)")
        if self.checkpoint_every_n_steps < 0:
            raise UserError(f"trainer.checkpoint_every_n_steps={self.checkpoint_every_n_steps} must be >= 0 (0: off)")
        if self.checkpoint_every_n_minutes < 0:
            raise UserError(f"trainer.checkpoint_every_n_minutes={self.checkpoint_every_n_minutes} must be >= 0 "
                            "(0: off)")
        if self.accumulate_grad_batches < 1:
            raise UserError(f"trainer.accumulate_grad_batches={self.accumulate_grad_batches} must be >= 1"
                            " (1: no accumulation)")
        if self.precision not in ("32-true", "32", "16-mixed", "bf16-mixed", "bf16-true", "64-true"):
            raise UserError(f"trainer.precision={self.precision!r} is not known; use 32-true, 16-mixed or bf16-mixed")
        if self.host_allocator not in ("cached", "system"):
            raise UserError(f"trainer.host_allocator={self.host_allocator!r} is not known; use cached or system")
        if isinstance(self.loggers, str):  # trainer.loggers=csv,wandb
            self.loggers = [name.strip() for name in self.loggers.split(",") if name.strip()]
        unknown = [name for name in self.loggers if name not in LOGGERS]
        if unknown or not self.loggers or len(set(self.loggers)) < len(self.loggers):
            raise UserError(f"trainer.loggers={self.loggers} must name each of its loggers once, "
                            f"from {', '.join(LOGGERS)}"
                            + (f" ({unknown[0]!r} is not one)" if unknown else ""))
        if self.memory_format not in MEMORY_FORMATS:
            raise UserError(f"trainer.memory_format={self.memory_format!r} is not known; "
                            f"use {', '.join(MEMORY_FORMATS)}")


@dataclass
class EvalConfig:
    """The kNN accuracy printed at the end of pretraining (DINO style)."""

    knn_k: int = 20
    knn_temperature: float = 0.07
    batch_size: int = 512
    knn_at_end: bool = True  # false: no end-of-run kNN report nor its not-learning verdict (selfsup eval knn RUN later)
    label_free_at_end: bool = True  # false: no end-of-run label-free measures nor their verdict (runs/label_free.py)
    knn_every_n_steps: int = 0  # kNN monitor during pretraining (monitor/knn_top1) every N steps; 0 = off
    knn_monitor_train: int = 5000  # fixed train / test subset sizes of the monitor
    knn_monitor_test: int = 1000
    online_probe: bool = False  # online linear probe on detached embeddings (monitor/probe_acc)
    online_probe_lr: float = 1e-3

    def validate(self) -> None:
        if self.knn_k < 1:
            raise UserError(f"eval.knn_k={self.knn_k} must be >= 1")
        if self.knn_every_n_steps < 0:
            raise UserError(f"eval.knn_every_n_steps={self.knn_every_n_steps} must be >= 0 (0 turns the monitor off)")
        if self.knn_monitor_train < 1 or self.knn_monitor_test < 1:
            raise UserError("eval.knn_monitor_train and eval.knn_monitor_test must be >= 1")
        if not self.online_probe_lr > 0:
            raise UserError(f"eval.online_probe_lr={self.online_probe_lr} must be > 0")


@dataclass
class InstrumentsConfig:
    """Training-dynamics instruments (selfsup.instruments.dynamics), logged under ``instruments/``; detector
    events in ``RUN/events.jsonl``. The defaults cost a few percent of a CPU step (benchmarks/embedding_norms.py)."""

    enabled: bool = True  # false: no instrument at all (the kNN monitor and online probe are eval.*)
    every_n_steps: int = 10  # embedding norms, alignment, gradient-norm logging, predictor alignment
    embedding_norms: bool = True
    gradients: bool = True  # global and per-layer-group L2 / Linf gradient norms (after AMP unscaling)
    spikes: bool = True  # gradient spike detector: norm > median + k * MAD of the previous window
    spike_k: float = 10.0
    spike_window: int = 100
    spike_min_history: int = 20
    alignment: bool = True  # mean 1 - cos of prediction/target and of the two views' features
    rank_every_n_steps: int = 100  # RankMe / effective rank / per-dim std on a fixed batch; 0 = off
    rank_samples: int = 512
    predictor_alignment: bool = True  # linear predictors only (DirectPred eigenspace alignment)
    predictor_top_k: int = 3
    correlation_rho: float = 0.3  # running correlation F of the predictor inputs (when the predictor keeps none)
    knn_dip: float = 3.0  # kNN monitor dip: points below the running best (0 = off); needs eval.knn_every_n_steps
    # The collapse alarm (instruments/collapse.py): a sign past its threshold for collapse_window consecutive
    # measurements (every every_n_steps) after the lr warm-up writes a `collapse` event and one console line with
    # the remedies.
    collapse_alarm: bool = True
    collapse_window: int = 5
    collapse_rank_fraction: float = 0.25  # eff_rank_batch: the features' effective rank under this x its first value

    def validate(self) -> None:
        for key in ("every_n_steps", "spike_window", "spike_min_history", "rank_samples", "predictor_top_k"):
            if getattr(self, key) < 1:
                raise UserError(f"instruments.{key}={getattr(self, key)} must be >= 1")
        if self.spike_min_history < 2 or self.spike_min_history > self.spike_window:
            raise UserError(f"instruments.spike_min_history={self.spike_min_history} must be in [2, "
                            f"instruments.spike_window={self.spike_window}]")
        if self.spike_k <= 0:
            raise UserError(f"instruments.spike_k={self.spike_k} must be > 0")
        if self.rank_every_n_steps < 0:
            raise UserError(f"instruments.rank_every_n_steps={self.rank_every_n_steps} must be >= 0 (0 turns it off)")
        if not 0 <= self.correlation_rho < 1:
            raise UserError(f"instruments.correlation_rho={self.correlation_rho} must be in [0, 1)")
        if self.knn_dip < 0:
            raise UserError(f"instruments.knn_dip={self.knn_dip} must be >= 0 (0 turns the dip detector off)")
        if self.collapse_window < 1:
            raise UserError(f"instruments.collapse_window={self.collapse_window} must be >= 1")
        if not 0 < self.collapse_rank_fraction < 1:
            raise UserError(f"instruments.collapse_rank_fraction={self.collapse_rank_fraction} must be in (0, 1)")


@dataclass
class InterventionsConfig:
    """Steering the embedding norms (Draganov et al.; selfsup.interventions)."""

    cut_init: float = 1.0  # c: divide parameters by c after initialisation (1 = off; the paper's example 3)
    cut_init_scope: str = "all"  # all (every parameter, the public code) | projector_last (the projector's last layer)
    grad_scale_p: float = 0.0  # GradScale power p: each sample's gradient times ||z||^p (0 = off)
    # GradScale's own schedule, used instead of optim.base_lr / optim.warmup_epochs when grad_scale_p != 0 (None:
    # the optim section's): the embedding-norm code runs GradScale at lr 0.1 with 100 of 512 warmup epochs instead
    # of 0.6 with 10 (SSLEmbeddingNorms CLA/experiments/model_comparison.py:282-290); its positive feedback (the
    # norm grows with the gradient, the gradient with the norm) diverges at the default lr
    grad_scale_lr: float | None = None
    grad_scale_warmup_epochs: float | None = None

    def validate(self) -> None:
        if not self.cut_init > 0:
            raise UserError(f"interventions.cut_init={self.cut_init} must be > 0 (1 turns it off)")
        if self.cut_init_scope not in ("all", "projector_last"):
            raise UserError(f"interventions.cut_init_scope={self.cut_init_scope!r}; use all or projector_last")
        for key in ("grad_scale_lr", "grad_scale_warmup_epochs"):
            if getattr(self, key) is not None and getattr(self, key) < 0:
                raise UserError(f"interventions.{key}={getattr(self, key)} must be >= 0 (or null: the optim section's)")


@dataclass
class RunConfig:
    """A whole pretraining run."""

    method: Any  # the method's own dataclass, chosen by method.name (see selfsup.methods)
    name: str | None = None  # run folder name; None: <preset>-<timestamp>
    output_dir: str = "runs"
    description: str = ""
    data: DataConfig = field(default_factory=DataConfig)
    augment: AugmentSection = field(default_factory=AugmentSection)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    instruments: InstrumentsConfig = field(default_factory=InstrumentsConfig)
    interventions: InterventionsConfig = field(default_factory=InterventionsConfig)
    # the method's registered name and class (``selfsup.methods.METHODS``), looked up once from ``method``'s type:
    # what the builder, the engine and evaluation ask; not config keys, never written to config.yaml
    method_name: str = field(init=False, repr=False, compare=False)
    method_cls: type = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        methods = method_registry()
        self.method_name = methods.registered_name(self.method)
        self.method_cls = methods.METHODS[self.method_name]
        if self.data.image_size_multiple is None and self.model.backbone.startswith("vit_"):
            self.data.image_size_multiple = self.model.patch_size  # the automatic size on the ViT's patch grid


DERIVED = ("method_name", "method_cls")  # RunConfig's fields that are no config keys


# --------------------------------------------------------------------------- presets and overrides


def preset_names() -> list[str]:
    """Names of the shipped presets."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def _read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise UserError(f"{path}: not valid YAML ({' '.join(str(e).split())[:160]})") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: a config file must be a mapping of keys to values")
    return data


def merge(base: dict, override: dict) -> dict:
    """Recursive dict merge; ``override`` wins."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def method_registry():
    """``selfsup.methods`` (``METHODS``, ``registered_name``), imported when a config is resolved, not with this
    module: the methods import torch and Lightning, which ``selfsup presets``, ``--help`` and the resume rules do not
    load."""
    from selfsup import methods

    return methods


def load_preset(name_or_path: str) -> dict:
    """A preset by name or a YAML path, with its ``base:`` chain merged underneath."""
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") and path.exists()):
        path = PRESET_DIR / f"{name_or_path}.yaml"
        if not path.exists():
            close = difflib.get_close_matches(name_or_path, [*preset_names(), *method_registry().METHODS], n=3)
            hint = f"did you mean {', '.join(close)}?" if close else "run `selfsup presets` for the list"
            hint += " (a method name with data.root=FOLDER: a recipe sized to your images)"
            raise UserError(f"no preset or YAML file named {name_or_path!r}; {hint}")
    data = _read_yaml(path)
    base = data.pop("base", None)
    data.pop("summary", None)
    return merge(load_preset(base), data) if base else data


def parse_overrides(items: list[str]) -> dict:
    """``["a.b=1", "c=x"]`` → ``{"a": {"b": 1}, "c": "x"}``; values are parsed as YAML scalars."""
    out: dict = {}
    for item in items:
        if "=" not in item:
            raise UserError(f"override {item!r} is not of the form dotted.key=value (e.g. trainer.max_epochs=5)")
        key, raw = item.split("=", 1)
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node = out
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UserError(f"override {item!r} conflicts with another override of {part!r}")
        node[parts[-1]] = value
    return out


# --------------------------------------------------------------------------- typed construction


def _type_name(tp) -> str:
    return getattr(tp, "__name__", str(tp)).replace("typing.", "")


def _coerce(value, tp, key: str):
    """Check ``value`` against the annotation ``tp``; ints are accepted for floats."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except UserError as e:
                errors.append(e)
        names = " or ".join(_type_name(a) for a in args if a is not type(None))
        raise UserError(f"{key}={value!r} has the wrong type; expected {names}")
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise UserError(f"{key}={value!r} has the wrong type; expected a list like [0.9, 0.999]")
        args = typing.get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis and len(args) != len(value):
            raise UserError(f"{key}={value!r} needs {len(args)} values")
        inner = args[0] if args else Any
        return origin(_coerce(v, inner, key) for v in value)
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{key}={value!r} has the wrong type; expected a mapping")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise UserError(f"{key}={value!r} has the wrong type; expected true or false")
        return value
    if tp is float:
        if isinstance(value, str) and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+", value.strip()):
            value = float(value)  # YAML 1.1 reads exponents without a dot (1e-3) as strings
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{key}={value!r} has the wrong type; expected a number")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{key}={value!r} has the wrong type; expected an integer")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise UserError(f"{key}={value!r} has the wrong type; expected a string")
        return value
    if dataclasses.is_dataclass(tp):
        return build(tp, value, key)
    return value


def build(cls, data: dict | None, prefix: str):
    """Construct dataclass ``cls`` from ``data``, rejecting unknown keys (with close suggestions)."""
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise UserError(f"{prefix} must be a mapping of keys to values, got {data!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=3, cutoff=0.5)
            hint = (f"did you mean {', '.join(f'{prefix}.{c}' for c in close)}?" if close
                    else f"valid keys: {', '.join(names)}")
            raise UserError(f"unknown config key '{prefix}.{key}'; {hint}")
        kwargs[key] = _coerce(value, hints[key], f"{prefix}.{key}")
    obj = cls(**kwargs)
    if hasattr(obj, "validate"):
        obj.validate()
    return obj


def resolve(data: dict) -> RunConfig:
    """A validated RunConfig from a merged preset + overrides mapping."""
    METHODS = method_registry().METHODS
    data = dict(data)
    method = dict(data.pop("method", None) or {})
    name = method.pop("name", None)
    if name not in METHODS:
        close = difflib.get_close_matches(str(name), list(METHODS), n=3)
        hint = f"did you mean {', '.join(close)}?" if close else f"use one of {', '.join(METHODS)}"
        raise UserError(f"method.name={name!r} is not known; {hint}")
    fields = {f.name for f in dataclasses.fields(METHODS[name].Config)}
    for key in ("predictor", "directpred"):
        if key in method and key not in fields:
            raise UserError(f"method.{key}: {name} has no predictor; predictor choices (mlp, linear, symmetric, "
                            "directpred, directcopy) apply to byol, simsiam and moco_v3")
    method_cfg = build(METHODS[name].Config, method, "method")
    top = {f.name for f in dataclasses.fields(RunConfig)} - {"method", *DERIVED}
    for key in data:
        if key not in top:
            close = difflib.get_close_matches(str(key), sorted(top), n=3, cutoff=0.5)
            hint = f"did you mean {', '.join(close)}?" if close else f"valid sections: method, {', '.join(sorted(top))}"
            raise UserError(f"unknown config key '{key}'; {hint}")
    sections = {}
    hints = typing.get_type_hints(RunConfig)
    for key, value in data.items():
        sections[key] = _coerce(value, hints[key], key)
    cfg = RunConfig(method=method_cfg, **sections)
    iv = cfg.interventions
    if iv.grad_scale_p != 0:  # GradScale's own lr and warmup (InterventionsConfig)
        if iv.grad_scale_lr is not None:
            cfg.optim.base_lr = iv.grad_scale_lr
        if iv.grad_scale_warmup_epochs is not None:
            cfg.optim.warmup_epochs = iv.grad_scale_warmup_epochs
    return cfg


def to_dict(cfg: RunConfig) -> dict:
    """A plain mapping (YAML-safe) of the resolved config, method name included."""
    out = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in DERIVED}
    out["method"] = {"name": cfg.method_name, **out["method"]}

    def plain(x):
        if isinstance(x, tuple):
            return [plain(v) for v in x]
        if isinstance(x, list):
            return [plain(v) for v in x]
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        return x

    return plain(out)


def load_run_config(name_or_path: str, overrides: list[str] | None = None) -> RunConfig:
    """Preset or YAML + overrides → validated RunConfig (a ViT preset given another backbone: ``student_moved``)."""
    given = parse_overrides(overrides or [])
    return resolve(merge(student_moved(load_preset(name_or_path), given), given))


# the model keys of the selfsup ViTs: another backbone refuses them (models.backbones._vit_only) or ignores them
VIT_ONLY = ("patch_size", "pool", "stop_grad_conv1", "layer_scale", "pos_embed", "final_norm", "init", "registers",
            "ffn", "drop_path_uniform", "class_token")
PATCH_TERMS = {"distill_dinov2": "ibot_loss_weight"}  # a method's patch-token term: none without a ViT's tokens
VIT_METHODS = ("dinov2", "ibot", "mae", "ijepa")  # they need a selfsup ViT whatever its keys: they refuse others


def selfsup_vit(backbone: str) -> bool:
    """Whether ``backbone`` names a selfsup ViT (``models.vit.VIT_SIZES``: vit_* and deit_small)."""
    return backbone.startswith(("vit_", "deit_"))


def student_moved(preset: dict, given: dict, say: bool = True) -> dict:
    """A ViT preset whose ``model.backbone`` the overrides make another network (a ResNet, a ConvNet, timm's):
    the ViT-only keys the preset set (``VIT_ONLY``, and ``drop_path_rate`` but for timm's) and a method's patch
    term (``PATCH_TERMS``: the student has no patch tokens) go back to their defaults, in one printed line (``say``;
    off for a look ahead at the config), unless the overrides set them too (then the backbone's own refusal names
    them). A DINOv3 ViT (``dinov3_vit*``) keeps the pooling, the drop path and the patch term, and trains DINOv2,
    iBOT and MAE; its patch is its release's 16 unless given: its architecture is its size's."""
    backbone, model = given.get("model", {}).get("backbone"), preset.get("model", {})
    method = {**preset.get("method", {}), **given.get("method", {})}
    if not isinstance(backbone, str) or selfsup_vit(backbone) or not selfsup_vit(str(model.get("backbone", ""))):
        return preset
    tokens = backbone in DINOV3_VIT_SIZES  # a DINOv3 ViT: class and patch tokens, its own fixed architecture
    if method.get("name") in VIT_METHODS and not (tokens and method["name"] in ("dinov2", "ibot", "mae")):
        raise UserError(f"model.backbone={backbone}: method {method['name']} trains a selfsup ViT (vit_micro ... "
                        "vit_large, deit_small), whatever its keys; keep one, or choose a method that trains any "
                        "network (dino, moco_v3, byol, simclr, ...; distill_dinov2 from a DINOv2 teacher)")
    defaults, mine = ModelConfig(), given.get("model", {})
    keys = tuple(k for k in VIT_ONLY if k != "pool") if tokens else \
        VIT_ONLY + (() if backbone.startswith("timm:") else ("drop_path_rate",))
    reset = {k: getattr(defaults, k) for k in keys if k in model and k not in mine and model[k] != getattr(defaults, k)}
    moved = {**preset, "model": {k: v for k, v in model.items() if k not in reset}}
    said = [f"model.{k}={_said(model[k])} → {_said(v)}" for k, v in reset.items()]
    term = PATCH_TERMS.get(str(method.get("name")))
    if term and not tokens and term not in given.get("method", {}) and method.get(term, 1) != 0:
        moved["method"] = {**preset.get("method", {}), term: 0}
        said.append(f"method.{term}={method.get(term, 1)} → 0 (no patch tokens: the [CLS] term only)")
    if said and say:
        what = "a DINOv3 ViT, its release's architecture" if tokens else "not a selfsup ViT"
        print(f"selfsup: model.backbone={backbone} is {what}: the preset's ViT settings go back to their "
              f"defaults: {', '.join(said)}")
    return moved


def _said(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def flatten(mapping: dict, prefix: str = "") -> dict:
    """A nested config as ``dotted.key`` → value (lists and empty mappings kept whole): the overrides' form."""
    out = {}
    for key, value in mapping.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def read_run_config(run_dir: str | Path) -> dict:
    """The ``config.yaml`` of a run folder as a plain mapping (not resolved: no method is imported)."""
    path = Path(run_dir) / "config.yaml"
    if not path.exists():
        left = [n for n in ("checkpoints", "metrics.csv", "backbone_init.safetensors") if (Path(run_dir) / n).exists()]
        if left:  # a run's files without its config: removed, or the start was cut off
            raise UserError(f"{run_dir} holds a run's {left[0]} but no config.yaml (removed, or the run was cut off "
                            "while starting); restore its config.yaml or start the run again")
        raise UserError(f"{run_dir} is not a selfsup run folder (no config.yaml); pass the folder a pretrain run made")
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        raise UserError(f"{path} is not valid YAML; restore the run's config.yaml") from None
    if not isinstance(raw, dict):
        raise UserError(f"{path} is not a selfsup run config; restore the run's config.yaml")
    return raw


def load_run(run_dir: str | Path) -> RunConfig:
    """The resolved config of an existing run folder."""
    return resolve(read_run_config(run_dir))
