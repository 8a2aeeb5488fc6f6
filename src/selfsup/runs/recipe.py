"""A recipe sized to a folder: ``selfsup pretrain <method> data.root=FOLDER`` (``selfsup.pretrain("simclr",
{"data.root": FOLDER})``) resolves what a user with their own images should not have to pick, from the folder's
measured facts and the machine, printed in one block and recorded in the run's ``config.yaml``. Every key the user
sets wins (it is left as given, and what derives from it follows it).

The recipe starts from the method's small-image CPU preset (``BASES``: its ``*-fmnist`` recipe, W-MSE's ConvNet one),
whose heads, losses and augmentations were measured to learn on 28-px images, then sets:

- ``data.name``: ``imagefolder`` where the folder holds ``train/<class>/`` (the end-of-run kNN then has labels), else
  ``images`` (unlabelled: the kNN monitor and online probe off);
- ``data.channels``: 1 when nearly every sampled image is grayscale (``GRAY_SHARE``), else 3;
- ``data.image_size``: the median shorter side of up to 256 images, clamped to ``MIN_SIZE`` .. ``MAX_SIZE_CPU`` on a CPU
  (``MAX_SIZE_GPU`` on a GPU) and, for a ViT, on a grid of ``GRID_CPU`` (``GRID_GPU``) patches a side:
  ``model.patch_size`` = size // grid, the size rounded down to a multiple of it, the local crops too (I-JEPA: its
  base's 7 x 7 grid on a CPU, ``GRID_CPU_OF``);
- ``data.batch_size``: the base's, at most the largest power of two <= images / ``MIN_BATCHES`` (so an epoch has
  several steps), at least ``MIN_BATCH`` and at most half the images (two steps an epoch); a folder under
  ``data.datasets.MIN_TRAIN_IMAGES`` readable images is refused;
- ``trainer.max_epochs``: enough epochs for ``TARGET_STEPS`` optimiser steps (the base's budget on Fashion-MNIST:
  5 epochs of 234 steps), within ``MIN_EPOCHS`` .. ``MAX_EPOCHS``; ``optim.warmup_epochs`` the base's share of its
  run (10% in every base), at most ``WARMUP_SHARE``, so the warm-up keeps its length in steps;
- the sizes that scale with the data: DINO's / iBOT's / DINOv2's prototypes (``method.out_dim``, iBOT's
  ``patch_out_dim``), SwAV's ``nmb_prototypes``: the largest power of two <= images / ``IMAGES_PER_PROTOTYPE``,
  within ``MIN_PROTOTYPES`` .. the base's (a bucket per data size, as LightlyTrain scales them); NNCLR's support set
  ``queue_size`` at most half the images; W-MSE's ``w_size`` a divisor of a smaller batch (and ``emb`` under it);
- ``trainer.accelerator``: ``gpu`` where CUDA is there, else ``cpu`` (one device); ``trainer.precision``:
  ``bf16-mixed`` on a GPU, ``32-true`` on a CPU (where bf16 autocast is slower); ``data.num_workers``: the cores less
  one, at most 8.

The patch grid is read, never guessed over: a ``model.patch_size`` the user gives, the patch of ``model.weights`` or
of a ``timm:<name>`` backbone (``source_patch``) is kept and the image size is a multiple of it; a distillation
teacher's patch (``method.teacher.weights``) makes the size a multiple of it too, and DINOv2's distillation pairs
the student's patches with the teacher's (the same patch). Distillation (``distill``, ``distill_dinov2``) needs
``method.teacher.weights``; its queue follows LightlyTrain's buckets of the image count (``QUEUE_BUCKETS``).

With ``model.weights`` (continued pretraining) the recipe is docs/pretrained.md's adaptation: the base's peak lr
times ``ADAPT_LR`` and a warm-up of ``ADAPT_WARMUP`` epoch, so the first steps do not undo what the model knows; a
torchvision ResNet file (``source_resnet``: its keys and shapes) makes the student that ResNet.

A GPU preset given a folder where the run trains on the CPU (``gpu_preset_on_cpu``) gets the same reading of the
folder for the CPU (``cpu_recipe``): size, data-sized heads and queues, a batch of at most ``CPU_BATCH``, about
``TARGET_STEPS`` steps, float32, one process and the cores' workers, each change printed beside the preset's value.
"""

from __future__ import annotations

import math
import os
import re
import statistics
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from PIL import Image
from safetensors import safe_open

from selfsup.architectures import DINOV3_VIT_SIZES
from selfsup.config import RunConfig, load_preset, merge, parse_overrides, resolve, student_moved
from selfsup.data.datasets import (HELD_OUT, IMAGE_SUFFIXES, MIN_TRAIN_IMAGES, SIZE_SAMPLE, TEST_FOLDERS, image_files,
                                   no_readable_image, too_few_images, unreadable)
from selfsup.errors import UserError
from selfsup.export import read_meta
from selfsup.layouts import hf_config
from selfsup.methods import METHODS
from selfsup.models.backbones import TIMM_PREFIX
from selfsup.models.resnet import RESNET_NAMES
from selfsup.weights import PREFIXES, read_weights

BASES = {"moco_v3": "moco-v3-vit-fmnist", "byol": "byol-fmnist", "simsiam": "simsiam-fmnist", "simclr": "simclr-fmnist",
         "barlow_twins": "barlow-twins-fmnist", "vicreg": "vicreg-fmnist", "dino": "dino-fmnist", "swav": "swav-fmnist",
         "wmse": "wmse-fmnist", "nnclr": "nnclr-fmnist", "ibot": "ibot-fmnist", "dinov2": "dinov2-fmnist",
         "mae": "mae-fmnist", "ijepa": "ijepa-fmnist", "lejepa": "lejepa-fmnist", "distill": "distill-fmnist",
         "distill_dinov2": "distill-dinov2-digits"}
TEACHER_METHODS = ("distill", "distill_dinov2")  # need method.teacher.weights
# LightlyTrain's queue size by image count (distillation.py at 004229f, DistillationArgs.resolve_auto): (fewer
# images than, queue rows), about 25-50% of the images; 8192 from 20,000 images
QUEUE_BUCKETS = ((50, 16), (100, 32), (250, 64), (500, 128), (1_000, 256), (2_000, 512), (4_000, 1024),
                 (10_000, 2048), (20_000, 4096))
QUEUE_MAX = 8192
ADAPT_LR, ADAPT_WARMUP = 0.25, 0.1  # docs/pretrained.md: a quarter of the lr, a tenth of an epoch of warm-up
# the built-in datasets' own image sizes: a preset of theirs given a folder keeps its grid of patches (keep_grid)
NATIVE_SIZES = {"digits": 8, "fashion-mnist": 28, "cifar10": 32, "cifar100": 32, "stl10": 96}
FOLDER_DATASETS = ("images", "imagefolder")
AUTO_SIZE_RANGE = (8, 224)  # data.datasets' automatic size of a folder: its median shorter side, clamped
MIN_SIZE, MAX_SIZE_CPU, MAX_SIZE_GPU = 16, 64, 224
GRID_CPU, GRID_GPU = 4, 8  # ViT patches a side: 16 tokens on a CPU (the *-fmnist presets' 28 / 7), 64 on a GPU
GRID_CPU_OF = {"ijepa": 7}  # I-JEPA's target blocks need more patches: ijepa-fmnist's 7 x 7 (28 / 4)
MIN_BATCHES, MIN_BATCH = 4, 8
CPU_BATCH = 64  # a GPU preset's batch on a CPU (gpu_preset_on_cpu): a step of seconds, not minutes
TARGET_STEPS, MIN_EPOCHS, MAX_EPOCHS = 1000, 5, 300
WARMUP_SHARE = 0.1
IMAGES_PER_PROTOTYPE, MIN_PROTOTYPES = 8, 64
GRAY_SHARE = 0.9
GRAY_MODES = ("1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F")


@dataclass
class FolderFacts:
    """What the recipe reads of a folder and the machine."""

    root: Path
    labelled: bool  # root/train/<class>/ (and val/): an imagefolder
    images: int  # image files listed (the training split's, for an imagefolder)
    short_sides: list[int]  # of up to SIZE_SAMPLE images spread over the files
    gray: float  # the share of the sampled images that are grayscale
    cores: int
    gpu: str | None  # the CUDA device's name, None without one


def source_patch(spec: str | None) -> int | None:
    """The ViT patch of a weights source or backbone name, read without building it: a selfsup export's metadata
    (a run folder's ``backbone.safetensors``), the patch embedding's kernel of a ``.safetensors`` / ``.pth`` file
    (memory-mapped), a transformers folder's ``config.json``, the ``patch<N>`` of a timm model name; None for a
    ConvNet or a source that does not say."""
    if not spec:
        return None
    if spec.startswith(TIMM_PREFIX):
        found = re.search(r"patch(\d+)", spec)
        return int(found.group(1)) if found else None
    path = Path(spec).expanduser()
    if path.is_dir() and (config := hf_config(path)) is not None:  # a transformers folder: its config.json's
        return int(config["patch_size"]) if "patch_size" in config else None
    path = path / "backbone.safetensors" if path.is_dir() else path
    if not path.is_file():
        return None
    if path.suffix == ".safetensors":
        with safe_open(str(path), framework="pt") as f:
            meta = (f.metadata() or {}).get("selfsup")
            keys = [k for k in f.keys() if k.endswith("patch_embed.proj.weight")]
            shape = f.get_slice(keys[0]).get_shape() if keys else None
        if meta:
            return read_meta(path).get("kwargs", {}).get("patch_size") if shape else None
        return int(shape[-1]) if shape else None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # the loader names what is wrong with the file when the run builds it
        return None
    return _kernel(state)


# torchvision's ResNets by their blocks a stage and block kind (torchvision models/resnet.py: resnet18 .. resnet152)
RESNET_STAGES = {((2, 2, 2, 2), False): "resnet18", ((3, 4, 6, 3), False): "resnet34", ((3, 4, 6, 3), True): "resnet50",
                 ((3, 4, 23, 3), True): "resnet101", ((3, 8, 36, 3), True): "resnet152"}


def source_resnet(spec: str | None) -> tuple[str, bool] | None:
    """The selfsup ResNet a weights source holds, read from its keys and shapes without building it: (its name,
    whether its stem is the small 3 x 3 one), from a selfsup export's metadata or a torchvision-layout state dict
    (blocks a stage, BasicBlock or Bottleneck, conv1's kernel; any wrapper or prefix ``model.weights`` strips);
    None for any other network or a source that cannot be read here (the run names what is wrong)."""
    if not spec or spec.startswith(TIMM_PREFIX) or not Path(spec).expanduser().exists():
        return None
    try:
        raw = read_weights(str(Path(spec).expanduser()), None, "model.weights")
    except (UserError, OSError):
        return None
    if raw.kind == "selfsup":
        kwargs = raw.meta.get("kwargs", {})
        name = raw.meta.get("backbone")
        return (name, bool(kwargs.get("small_stem"))) if name in RESNET_NAMES else None
    for state in raw.candidates.values():
        for prefix in PREFIXES:
            stem = state.get(f"{prefix}conv1.weight")
            if stem is None or len(stem.shape) != 4 or f"{prefix}layer1.0.conv1.weight" not in state:
                continue
            depth = 1 + prefix.count(".")  # the block index of layer<i>.<block>. after the prefix
            blocks = tuple(len({k.split(".")[depth] for k in state if k.startswith(f"{prefix}layer{i}.")})
                           for i in range(1, 5))
            name = RESNET_STAGES.get((blocks, f"{prefix}layer1.0.conv3.weight" in state))
            return (name, stem.shape[-1] == 3) if name else None
    return None


def _kernel(obj, depth: int = 0) -> int | None:
    """The last side of the first ``*patch_embed.proj.weight`` tensor in a (nested) checkpoint dict."""
    if not isinstance(obj, dict) or depth > 3:
        return None
    for key, value in obj.items():
        if isinstance(value, torch.Tensor) and str(key).endswith("patch_embed.proj.weight") and value.ndim == 4:
            return int(value.shape[-1])
    for value in obj.values():
        found = _kernel(value, depth + 1)
        if found:
            return found
    return None


def _header(path: Path) -> tuple[int, str] | None:
    try:
        with Image.open(path) as im:
            return min(im.size), im.mode
    except Exception:  # an unreadable file: the others tell the size
        return None


def folder_facts(root: str | Path) -> FolderFacts:
    """The facts of ``root`` (its image count, a sample's shorter sides and colour modes) and of this machine."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"data.root={root} is not a folder; give the folder of your images (nested at any depth, or "
                        "train/<class>/ and val/<class>/ for labels)")
    train = root / "train"
    labelled = train.is_dir() and any(d.is_dir() for d in train.iterdir())
    files = image_files(train if labelled else root)
    if not files:
        raise UserError(f"no image files under {root} (looked for {', '.join(sorted(IMAGE_SUFFIXES))} at any depth)")
    sample = files[::max(1, len(files) // SIZE_SAMPLE)][:SIZE_SAMPLE]
    with ThreadPoolExecutor(max_workers=min(16, (os.cpu_count() or 1) * 2)) as pool:
        headers = [h for h in pool.map(_header, sample) if h is not None]
    if not headers:
        raise no_readable_image(root, len(sample), len(files), unreadable(sample[0]) or "?")
    readable = len(headers) if len(sample) == len(files) else len(files)  # a sample of the whole: the count
    if readable < MIN_TRAIN_IMAGES:
        raise too_few_images(readable, train if labelled else root)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return FolderFacts(root, labelled, len(files), [s for s, _ in headers],
                       sum(m in GRAY_MODES for _, m in headers) / len(headers), os.cpu_count() or 1, gpu)


def _pow2_at_most(x: float) -> int:
    return 1 << max(0, int(x).bit_length() - 1) if x >= 1 else 1


def _given(overrides: dict, key: str) -> bool:
    section, _, name = key.partition(".")
    return isinstance(overrides.get(section), dict) and name in overrides[section] if name else section in overrides


def resolve_recipe(method: str, facts: FolderFacts, overrides: dict) -> tuple[dict, list[tuple[str, object, str]]]:
    """The recipe's config mapping (the base preset, the resolved values, then ``overrides`` on top) and the
    resolved values with why: (key, value, reason), the keys the user set left out."""
    held = None if _given(overrides, "model.backbone") else source_resnet((overrides.get("model") or {}).get("weights"))
    given = merge(overrides, {"model": {"backbone": held[0]}}) if held else overrides
    base = student_moved(load_preset(BASES[method]), given, say=not held)  # a ResNet: the base's ViT keys reset
    cfg = resolve(merge(base, given))  # the base with the user's keys: what the resolution starts from
    gpu = facts.gpu is not None
    chosen: list[tuple[str, object, str]] = []

    def put(key: str, value, why: str) -> None:
        if not _given(overrides, key):
            chosen.append((key, value, why))

    if held:
        put("model.backbone", held[0], f"model.weights holds a torchvision {held[0]} (the base's ViT settings reset)")
        if held[1]:
            put("model.small_stem", True, "model.weights' 3 x 3 stem")
    put("data.name", "imagefolder" if facts.labelled else "images",
        "train/<class>/ folders: labelled" if facts.labelled else "an unlabelled folder")
    put("data.root", str(facts.root), "")
    channels = 1 if facts.gray >= GRAY_SHARE else 3
    put("data.channels", channels, f"{facts.gray:.0%} of the sampled images are grayscale")
    size, patch = _size_and_patch(method, facts, cfg, overrides, put)
    if cfg.augment.local_crops_number and not _given(overrides, "augment.local_crops_size"):
        local = round(size * 96 / 224 / (patch or 1)) * (patch or 1)
        put("augment.local_crops_size", max(patch or 8, local), "96/224 of the image size, as DINO's")
    batch = cfg.data.batch_size if _given(overrides, "data.batch_size") else max(
        MIN_BATCH, min(cfg.data.batch_size, _pow2_at_most(facts.images / MIN_BATCHES)))
    if not _given(overrides, "data.batch_size"):
        batch = min(batch, facts.images // 2)  # two steps an epoch at least (MIN_TRAIN_IMAGES: a batch of 4)
    put("data.batch_size", batch, f"at most {facts.images} images / {MIN_BATCHES} and the base's {base_batch(base)}")
    _length(base, cfg, facts, batch, overrides, put)
    _data_sizes(method, cfg.method, facts, batch, put)
    put("trainer.accelerator", "gpu" if gpu else "cpu", facts.gpu or f"no GPU; {facts.cores} CPU cores")
    put("trainer.devices", 1, "")
    put("trainer.precision", "bf16-mixed" if gpu else "32-true",
        "bf16 autocast on a GPU" if gpu else "float32 on a CPU (bf16 autocast is slower there)")
    put("data.num_workers", min(8, max(0, facts.cores - 1)), f"{facts.cores} cores less one, at most 8")
    if not facts.labelled:
        put("eval.knn_every_n_steps", 0, "no labels")
        put("eval.online_probe", False, "no labels")
    values: dict = {}
    for key, value, _ in chosen:
        section, _, name = key.partition(".")
        values.setdefault(section, {})[name] = value
    return merge(merge(base, values), overrides), chosen


def _size_and_patch(method: str, facts: FolderFacts, cfg: RunConfig, overrides: dict, put,
                    keep: bool = False) -> tuple[int, int | None]:
    """``data.image_size`` and the ViT patch (None: a ConvNet). The size: the median shorter side clamped to the
    machine's range. A patch the user, the weights or a timm backbone fixes is kept, a teacher's patch too, and the
    size is a multiple of each; otherwise a selfsup ViT gets ``size // grid`` (a grid of ``GRID_*`` patches), or
    with ``keep`` and no teacher the patch of ``cfg`` (a preset's ViT-S/14 stays /14)."""
    gpu = facts.gpu is not None
    median = int(statistics.median(facts.short_sides))
    top, grid = (MAX_SIZE_GPU, GRID_GPU) if gpu else (MAX_SIZE_CPU, GRID_CPU_OF.get(method, GRID_CPU))
    given_size = _given(overrides, "data.image_size")
    size = cfg.data.image_size if given_size else min(max(median, MIN_SIZE), top)
    own = cfg.model.backbone.startswith(("vit_", "deit_"))  # a selfsup ViT: its patch is the recipe's to choose
    fixed, source = _fixed_patch(cfg, overrides)
    teacher = source_patch(cfg.method.teacher.weights) if method in TEACHER_METHODS else None
    if own and keep and fixed is None and not teacher and method not in GRID_CPU_OF:  # I-JEPA: its grid
        fixed, source = cfg.model.patch_size, "the preset"
    unit = math.lcm(*(p for p in (fixed, teacher) if p)) if (fixed or teacher) else 1
    if not given_size and unit > 1:
        size = max(unit, size // unit * unit)
    patch = fixed
    if own and patch is None and method == "distill_dinov2" and teacher:
        patch = teacher
        put("model.patch_size", patch, "the teacher's patch: DINOv2's distillation pairs the patches one to one")
    elif own and patch is None:
        patch = max(2, size // grid) if not teacher else max(
            [d for d in range(2, size // grid + 1) if size % d == 0] or [size])
        put("model.patch_size", patch, f"a {size // patch} x {size // patch} grid of patches")
    elif fixed is not None:
        put("model.patch_size", patch, f"{source}'s patch")
    if own and not given_size and unit == 1:
        size = max(patch, size // patch * patch)
    why = [f"a multiple of the patch {patch}"] if patch else []
    why += [f"of the teacher's patch {teacher}"] if teacher and teacher != patch else []
    put("data.image_size", size, f"the median shorter side of {len(facts.short_sides)} images, {median} px, clamped "
        f"to {MIN_SIZE}..{top} ({'GPU' if gpu else 'CPU'})" + (", " + ", ".join(why) if why else ""))
    return size, patch


def _fixed_patch(cfg: RunConfig, overrides: dict) -> tuple[int | None, str]:
    """A patch the recipe must keep, and whose: ``model.patch_size`` as given, else that of ``model.weights``,
    else that of a ``timm:<name>`` backbone (read from the source, ``source_patch``)."""
    if _given(overrides, "model.patch_size"):
        return cfg.model.patch_size, "model.patch_size"
    for key, spec in (("model.weights", cfg.model.weights), ("model.backbone", cfg.model.backbone)):
        if spec and (key != "model.backbone" or spec.startswith(TIMM_PREFIX)):
            patch = source_patch(spec)
            if patch:
                return patch, f"{key}={spec}"
    if cfg.model.backbone in DINOV3_VIT_SIZES:  # a DINOv3 ViT: its release's patch (16)
        return cfg.model.patch_size, f"model.backbone={cfg.model.backbone}"
    return None, ""


def _length(base: dict, cfg: RunConfig, facts: FolderFacts, batch: int, overrides: dict, put) -> None:
    """``trainer.max_epochs`` for ~``TARGET_STEPS`` steps, the warm-up's share of the run; with ``model.weights``
    the adaptation recipe: ``ADAPT_LR`` of the base's lr, ``ADAPT_WARMUP`` epoch of warm-up."""
    steps_per_epoch = max(1, facts.images // batch)
    epochs = cfg.trainer.max_epochs if _given(overrides, "trainer.max_epochs") else min(
        MAX_EPOCHS, max(MIN_EPOCHS, -(-TARGET_STEPS // steps_per_epoch)))
    put("trainer.max_epochs", epochs, f"~{TARGET_STEPS} optimiser steps of {steps_per_epoch} an epoch, within "
        f"{MIN_EPOCHS}..{MAX_EPOCHS}")
    base_cfg = resolve(base)
    if cfg.model.weights:
        put("optim.base_lr", base_cfg.optim.base_lr * ADAPT_LR, f"model.weights: the adaptation recipe "
            f"(docs/pretrained.md), {ADAPT_LR:g} of the base's {base_cfg.optim.base_lr:g}")
        put("optim.warmup_epochs", ADAPT_WARMUP, "model.weights: a short warm-up, so the first steps do not undo "
            "what the model knows")
        return
    share = min(WARMUP_SHARE, base_cfg.optim.warmup_epochs / max(base_cfg.trainer.max_epochs, 1))
    put("optim.warmup_epochs", round(share * epochs, 4),
        f"{share:.0%} of the run, as the base's {base_cfg.optim.warmup_epochs:g} of {base_cfg.trainer.max_epochs} "
        f"epochs (at most {WARMUP_SHARE:g})")


def queue_bucket(images: int) -> int:
    """LightlyTrain's distillation queue for ``images`` images (``QUEUE_BUCKETS``)."""
    return next((rows for bound, rows in QUEUE_BUCKETS if images < bound), QUEUE_MAX)


def _data_sizes(method: str, c, facts: FolderFacts, batch: int, put) -> None:
    """The sizes that scale with the data: prototypes, W-MSE's whitening window, the queues."""
    k = max(MIN_PROTOTYPES, _pow2_at_most(facts.images / IMAGES_PER_PROTOTYPE))
    for key in ("out_dim", "patch_out_dim", "nmb_prototypes"):
        if hasattr(c, key) and method != "distill_dinov2":  # its prototypes are the teacher's
            put(f"method.{key}", min(getattr(c, key), k), f"{facts.images} images / {IMAGES_PER_PROTOTYPE}, "
                f"a power of two within {MIN_PROTOTYPES}..the base's {getattr(c, key)}")
    if getattr(c, "w_size", 0) and batch % c.w_size:  # W-MSE whitens sub-batches of w_size > emb samples
        w = math.gcd(c.w_size, batch)
        put("method.w_size", w, f"a divisor of the batch {batch} (the base's {c.w_size})")
        if c.emb >= w:
            put("method.emb", max(1, w // 2), f"half the whitened sub-batch {w}, as the base's 2x (its {c.emb})")
    if method == "distill":
        put("method.queue_size", min(queue_bucket(facts.images), max(1, facts.images - 1)),
            f"LightlyTrain's bucket for {facts.images} images")
    elif hasattr(c, "queue_size"):
        put("method.queue_size", max(batch, min(c.queue_size, _pow2_at_most(facts.images / 2))),
            "at most half the images, at least the batch")


def base_batch(base: dict) -> int:
    return int((base.get("data") or {}).get("batch_size", 256))


def recipe_block(method: str, facts: FolderFacts, chosen: list[tuple[str, object, str]]) -> list[str]:
    """The printed block: the facts, then each resolved key=value with why."""
    lines = [f"selfsup: a recipe for {method} sized to {facts.root} ({facts.images} images, "
             f"{'labelled' if facts.labelled else 'unlabelled'}; {facts.gpu or f'{facts.cores} CPU cores, no GPU'}), "
             f"from the {BASES[method]} preset; any key=value you give wins:"]
    items = [(f"{k}={str(v).lower() if isinstance(v, bool) else v}", why) for k, v, why in chosen]
    width = max(len(item) for item, _ in items)
    lines += [f"  {item:<{width}}  {why}".rstrip() for item, why in items]
    if facts.labelled and not any((facts.root / n).is_dir() for n in TEST_FOLDERS):
        lines.append(f"  no val/ or test/ folder: the end-of-run kNN scores a seeded {HELD_OUT:.0%} of train/, held "
                     "out of its fit (add val/<class>/ images to score on images of your own choosing)")
    return lines


def folder_recipe(method: str, items: list[str]) -> RunConfig:
    """``selfsup pretrain <method> data.root=FOLDER [key=value ...]``: the recipe's typed config, its block printed."""
    if method not in BASES:
        raise UserError(f"selfsup pretrain {method}: a recipe sized to a folder serves {', '.join(BASES)}; a flow "
                        "method trains from a preset (selfsup presets)")
    overrides = parse_overrides(items)
    if method in TEACHER_METHODS and not ((overrides.get("method") or {}).get("teacher") or {}).get("weights"):
        what = "a selfsup DINOv2 run folder" if method == "distill_dinov2" else \
            "a selfsup run folder, a weights file, a DINOv2 hub checkpoint or timm:<name>"
        raise UserError(f"selfsup pretrain {method} data.root=FOLDER needs method.teacher.weights=SOURCE ({what})")
    root = (overrides.get("data") or {}).get("root")
    if not root:
        raise UserError(f"selfsup pretrain {method} needs data.root=FOLDER (a recipe sized to your images), or a "
                        f"preset: {', '.join(p for p in (BASES[method],))} ... (selfsup presets)")
    facts = folder_facts(root)
    data, chosen = resolve_recipe(method, facts, overrides)
    cfg = resolve(data)
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print("\n".join(recipe_block(method, facts, chosen)))
    return cfg


def is_method_name(name: str) -> bool:
    """Whether ``selfsup pretrain NAME`` names a method (a recipe sized to data.root) rather than a preset."""
    return name in METHODS


def keep_grid(preset: str, items: list[str]) -> list[str]:
    """A preset given a folder (``data.name=images|imagefolder data.root=F``) keeps its grid of patches: a selfsup
    ViT preset of a built-in dataset of N px at patch p trains on an N/p x N/p grid; the folder's automatic size
    (its median shorter side) gets the patch size // (N/p) and the size a multiple of it, printed, rather than p
    at the folder's size (``simclr-digits`` on 134-px photos: patch 2, 4,489 tokens an image, 93 GiB at batch
    256). Returns ``items`` with the two keys added; unchanged where the user sets either or nothing applies."""
    overrides = parse_overrides(items)
    if not (overrides.get("data") or {}).get("root") or _given(overrides, "model.patch_size") or \
            _given(overrides, "data.image_size"):
        return items
    base = resolve(load_preset(preset))
    cfg = resolve(merge(load_preset(preset), overrides))
    native = base.data.image_size or NATIVE_SIZES.get(base.data.name)
    if cfg.data.name not in FOLDER_DATASETS or native is None or \
            not cfg.model.backbone.startswith(("vit_", "deit_")):
        return items
    grid = max(1, native // base.model.patch_size)
    facts = folder_facts(cfg.data.root)
    median = int(statistics.median(facts.short_sides))
    size = min(max(median, AUTO_SIZE_RANGE[0]), AUTO_SIZE_RANGE[1])
    patch = max(1, size // grid)
    size = size // patch * patch
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print(f"selfsup: {preset} on a folder keeps its {grid} x {grid} grid of patches ({base.data.name} at "
              f"{native} px, patch {base.model.patch_size}): model.patch_size={patch}, data.image_size={size} (the "
              f"folder's median shorter side, {median} px); set either to choose")
    return [*items, f"model.patch_size={patch}", f"data.image_size={size}"]


def _value(cfg: RunConfig, key: str):
    section, _, name = key.partition(".")
    return getattr(getattr(cfg, section), name, None)


def gpu_preset_on_cpu(preset: str, items: list[str]) -> list[str]:
    """A GPU preset (``trainer.accelerator: gpu``) given ``data.root=FOLDER`` of images, run where there is no GPU
    (or with ``trainer.accelerator=cpu``): what runs on the CPU, resolved from the folder as the folder recipe
    resolves it (``cpu_recipe``) and printed in one block, each changed key with the preset's value. Returns
    ``items`` with those keys added; unchanged for any other preset, or on a GPU."""
    overrides = parse_overrides(items)
    root = (overrides.get("data") or {}).get("root")
    if not root:
        return items
    preset_data = load_preset(preset)
    asked = (overrides.get("trainer") or {}).get("accelerator")
    if str((preset_data.get("trainer") or {}).get("accelerator")) not in ("gpu", "cuda") or (
            asked != "cpu" and (torch.cuda.is_available() or asked in ("gpu", "cuda"))):
        return items
    moved = student_moved(preset_data, overrides, say=False)  # said again when the run's config is loaded
    cfg = resolve(merge(moved, overrides))
    if cfg.data.name not in FOLDER_DATASETS:
        return items
    facts = folder_facts(root)
    facts.gpu = None  # the recipe of this machine's CPU, whatever CUDA shows (trainer.accelerator=cpu)
    own = resolve(moved)
    chosen = [(k, v, why) for k, v, why in cpu_recipe(cfg, facts, overrides) if k != "data.root" and (
        v != _value(own, k) or k == "trainer.accelerator")]
    if os.environ.get("LOCAL_RANK", "0") == "0":
        lines = [f"selfsup: {preset} is a GPU preset and this machine trains on its {facts.cores} CPU cores: what "
                 f"runs here, sized to {facts.root} ({facts.images} images, "
                 f"{'labelled' if facts.labelled else 'unlabelled'}); any key=value you give wins:"]
        said = [(f"{k}={_said(v)}", why, _said(_value(own, k))) for k, v, why in chosen]
        width = max(len(item) for item, _, _ in said)
        lines += [f"  {item:<{width}}  {why}{'; ' if why else ''}the preset's {was}" for item, why, was in said]
        print("\n".join(lines))
    return [*items, *(f"{k}={_said(v)}" for k, v, _ in chosen)]


def _said(value) -> str:
    """A value as an override gives it (YAML's null, true, false)."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def cpu_recipe(cfg: RunConfig, facts: FolderFacts, overrides: dict) -> list[tuple[str, object, str]]:
    """The keys of a GPU preset's ``cfg`` that run on a CPU, with why: the folder recipe's image size (the model's
    and the teacher's patch grid), data-sized heads and queues, one CPU device in float32 with the cores' workers;
    a batch of at most ``CPU_BATCH`` and the preset's epochs cut to about ``TARGET_STEPS`` steps, its warm-up the
    same share of the run; the evaluation's resize follows the size. Keys in ``overrides`` are left out."""
    chosen: list[tuple[str, object, str]] = []

    def put(key: str, value, why: str) -> None:
        if not _given(overrides, key):
            chosen.append((key, value, why))

    method = cfg.method_name
    put("data.name", "imagefolder" if facts.labelled else "images",
        "train/<class>/ folders: labelled" if facts.labelled else "an unlabelled folder")
    if not facts.labelled:
        put("eval.knn_every_n_steps", 0, "no labels")
        put("eval.online_probe", False, "no labels")
    size, patch = _size_and_patch(method, facts, cfg, overrides, put, keep=True)
    if cfg.augment.local_crops_number and not _given(overrides, "augment.local_crops_size"):
        local = round(size * 96 / 224 / (patch or 1)) * (patch or 1)
        put("augment.local_crops_size", max(patch or 8, local), "96/224 of the image size, as DINO's")
    if cfg.data.load_size:
        put("data.load_size", None, "the evaluation's resize follows the image size (its / 0.875)")
    batch = cfg.data.batch_size if _given(overrides, "data.batch_size") else max(MIN_BATCH, min(
        cfg.data.batch_size, CPU_BATCH, _pow2_at_most(facts.images / MIN_BATCHES), facts.images // 2))
    put("data.batch_size", batch, f"a CPU step: at most {CPU_BATCH} and {facts.images} images / {MIN_BATCHES}")
    steps_per_epoch = max(1, facts.images // batch)
    t = cfg.trainer
    if t.max_steps:
        put("trainer.max_steps", min(t.max_steps, TARGET_STEPS), f"at most ~{TARGET_STEPS} optimiser steps")
    epochs = cfg.trainer.max_epochs if _given(overrides, "trainer.max_epochs") else max(
        1, min(t.max_epochs, -(-TARGET_STEPS // steps_per_epoch)))
    put("trainer.max_epochs", epochs, f"at most ~{TARGET_STEPS} optimiser steps of {steps_per_epoch} an epoch")
    if cfg.optim.warmup_epochs and epochs != t.max_epochs:
        share = cfg.optim.warmup_epochs / max(t.max_epochs, 1)
        put("optim.warmup_epochs", round(share * epochs, 4), f"the preset's {share:.0%} of the run")
    _data_sizes(method, cfg.method, facts, batch, put)
    put("trainer.accelerator", "cpu", facts.gpu or f"no GPU; {facts.cores} CPU cores")
    put("trainer.devices", 1, "one process")
    put("trainer.strategy", "auto", "one process")
    put("trainer.precision", "32-true", "float32 on a CPU (bf16 autocast is slower there)")
    put("data.num_workers", min(8, max(0, facts.cores - 1)), f"{facts.cores} cores less one, at most 8")
    return chosen
