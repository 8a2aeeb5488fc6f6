"""Datasets as uint8 image tensors with fixed train/test splits.

Small datasets (digits, Fashion-MNIST, CIFAR, STL-10) live in memory as one (N, C, H, W) uint8
tensor, so a batch is one indexing operation. ``imagefolder`` (classes from folder names) and ``images``
(an unlabelled folder at any depth, pretraining only) decode files lazily in DataLoader
workers (``selfsup.data.decode``): for evaluation, resize the shorter side to ``load_size`` and take the
central ``image_size`` square; for pretraining, each view a random resized crop of the whole image at
the output size. Augmentation then runs batched on the device. Without ``data.image_size`` the folders and shards
take the size of their first images (``infer_image_size``, printed); ``data.channels=1`` decodes them to one
grayscale channel.
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
import struct
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torchvision
from PIL import Image
from torch import Tensor

from selfsup.choices import DATASETS, DECODED
from selfsup.data.badfiles import bad_file_cap, cap_words, logged, too_many_bad_files
from selfsup.data.decode import FolderCrops, _decoded, _open, eval_resize, first_readable, resize_center_crop
from selfsup.data.device_decode import EncodedCrops
from selfsup.data.shards import ShardImages, count_samples, first_image_sizes, shard_urls
from selfsup.diskspace import writing
from selfsup.errors import UserError

FASHION_MNIST_DEFAULT = Path("/usr/share/datasets/fashion-mnist")  # Debian's dataset-fashion-mnist
FASHION_MNIST_ENV = "SELFSUP_FASHION_MNIST_DIR"  # overrides the default location (data.root still wins)
FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
LUMA = (0.299, 0.587, 0.114)  # PIL's L = R 299/1000 + G 587/1000 + B 114/1000 (ITU-R 601-2)
# one grayscale channel: the luma of the ImageNet mean (exact for the mean) and of its std (an upper bound, reached
# when the three channels move together, as they nearly do in natural images)
IMAGENET_GRAY_MEAN = (round(sum(w * m for w, m in zip(LUMA, IMAGENET_MEAN)), 4),)
IMAGENET_GRAY_STD = (round(sum(w * s for w, s in zip(LUMA, IMAGENET_STD)), 4),)
DEFAULT_SIZE = 224  # the model size of larger images when data.image_size is unset (ImageNet's crop)
SIZE_SAMPLE = 256  # the images (spread over the sorted files: every class) whose sizes data.image_size defaults to
MIN_AUTO_SIZE = 8  # the automatic data.image_size is at least this (then rounded to the patch grid)


def folder_stats(channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Normalisation of decoded folders and shards: ImageNet's, or its luma for one channel."""
    return (IMAGENET_GRAY_MEAN, IMAGENET_GRAY_STD) if channels == 1 else (IMAGENET_MEAN, IMAGENET_STD)


def infer_image_size(cfg, sizes: list[tuple[int, int]], where: str) -> int:
    """``data.image_size`` when set, else the median shorter side of a sample of the images (``sizes``: their
    (width, height), up to ``SIZE_SAMPLE``), clamped to ``MIN_AUTO_SIZE``..``DEFAULT_SIZE`` (larger photos:
    ImageNet's crop) and rounded down to ``data.image_size_multiple`` (a ViT's patch grid), printed once; written into
    ``cfg`` so the run's config.yaml records it. The median, not the smallest: one thumbnail among photos does not
    shrink the run. A UserError naming the key when there is no usable size."""
    if cfg.image_size is not None:
        return cfg.image_size
    if not sizes:
        raise UserError(f"data.image_size is unset and no image size can be read from {where}; set data.image_size")
    size, why = auto_image_size(sizes, getattr(cfg, "image_size_multiple", None) or 1, where)
    if os.environ.get("LOCAL_RANK", "0") == "0":
        print(f"selfsup: data.image_size unset: using {size} px ({why}); set data.image_size to choose",
              file=sys.stderr)
    cfg.image_size = size
    return size


def auto_image_size(sizes: list[tuple[int, int]], multiple: int = 1, where: str = "the data") -> tuple[int, str]:
    """The automatic image size of images of (width, height) ``sizes`` and how it was found (``infer_image_size``)."""
    median = int(statistics.median(min(w, h) for w, h in sizes))
    if median < 4:
        raise UserError(f"the images' median shorter side is {median} px; set data.image_size (>= 4) to the size to "
                        "train at")
    size = min(max(median, MIN_AUTO_SIZE), DEFAULT_SIZE)
    why = f"the median shorter side of {len(sizes)} image(s) of {where}: {median} px"
    if size != median:
        why += f", clamped to {MIN_AUTO_SIZE}..{DEFAULT_SIZE}"
    if size % multiple:
        size = max(multiple, size // multiple * multiple)
        why += f", rounded to a multiple of {multiple} (data.image_size_multiple: the ViT's model.patch_size)"
    return size, why


def _header_size(path: Path) -> tuple[int, int] | None:
    try:
        with Image.open(path) as im:
            return im.size
    except Exception:  # a damaged file: the size comes from the others
        return None


def _header_sizes(files: list[Path]) -> list[tuple[int, int]]:
    """(width, height) of the readable ones of ``files`` (up to ``SIZE_SAMPLE``), from their headers (nothing
    decoded; threads, as the opens wait on the disk)."""
    with ThreadPoolExecutor(max_workers=min(16, (os.cpu_count() or 1) * 2)) as pool:
        return [s for s in pool.map(_header_size, files[:SIZE_SAMPLE]) if s is not None]


@dataclass
class ImageDataset:
    """Images (uint8, N×C×H×W, or lazily decoded), integer labels, and normalisation statistics."""

    name: str
    images: Tensor | "FolderImages"
    labels: Tensor
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def channels(self) -> int:
        return self.images.shape[1]

    @property
    def image_size(self) -> int:
        return self.images.shape[-1]

    def __getitem__(self, index) -> tuple[Tensor, Tensor]:
        """A whole batch at once: ``index`` is a 1-D tensor of sample indices, or ``(epoch, indices)`` for
        images cropped at decode time (``FolderCrops``: uint8 (B, V, C, S, S), one crop per view)."""
        if isinstance(index, tuple):
            epoch, index = index
            return self.images.crops(index, epoch), self.labels[index]
        return self.images[index], self.labels[index]

    def select(self, index: Tensor) -> "ImageDataset":
        """The samples at ``index`` as a dataset of their own (images loaded into memory)."""
        return ImageDataset(self.name, self.images[index], self.labels[index], self.num_classes, self.mean, self.std)

    def subset(self, n: int | None, seed: int = 0, labelled_only: bool = False) -> "ImageDataset":
        """A fixed random subset of at most ``n`` samples (of the labelled ones when ``labelled_only``), drawn once
        with ``seed`` and kept in their original order; ``n`` None: all of them. The draw is one ``randperm`` of the
        candidates, so a subset of a fully labelled dataset is the same with or without ``labelled_only``."""
        if not labelled_only:
            if n is None or n >= len(self):
                return self
            pick = torch.randperm(len(self), generator=torch.Generator().manual_seed(seed))[:n]
            return self.select(pick.sort().values)
        labelled = (self.labels >= 0).nonzero().squeeze(1)
        pick = labelled[torch.randperm(len(labelled), generator=torch.Generator().manual_seed(seed))[:n]]
        return self.select(pick.sort().values)


def _split(n: int, test_fraction: float, seed: int = 0) -> tuple[Tensor, Tensor]:
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_test = int(round(n * test_fraction))
    return perm[n_test:].sort().values, perm[:n_test].sort().values


def _stats(images: Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    x = images.float().div_(255).transpose(0, 1).reshape(images.shape[1], -1)
    return tuple(round(v, 4) for v in x.mean(1).tolist()), tuple(round(v, 4) for v in x.std(1).tolist())


def load_digits(split: str, root: str | None = None) -> ImageDataset:
    """scikit-learn's bundled 8×8 handwritten digits (1797 images, 0–16 scaled to 0–255); a fixed 80/20 split."""
    from sklearn.datasets import load_digits as sk_digits  # lazy: 0.2 s, the digits dataset only

    bunch = sk_digits()
    images = torch.from_numpy(np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)).unsqueeze(1)
    labels = torch.from_numpy(bunch.target.astype(np.int64))
    train_idx, test_idx = _split(len(labels), 0.2)
    mean, std = _stats(images[train_idx])
    idx = train_idx if split == "train" else test_idx
    return ImageDataset("digits", images[idx].contiguous(), labels[idx].contiguous(), 10, mean, std)


def _read_idx(path: Path) -> np.ndarray:
    """An IDX file (the MNIST format), gzip-compressed or plain."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
        zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
        if zero != 0 or dtype_code != 0x08:
            raise ValueError("bad magic number")
        shape = struct.unpack(">" + "I" * ndim, data[4 : 4 + 4 * ndim])
        array = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
        return array.reshape(shape)
    except (OSError, ValueError, EOFError, struct.error) as e:
        raise UserError(f"{path} is not a readable IDX file ({e}); delete it and get the file again") from None


def fashion_mnist_default() -> Path:
    """Where Fashion-MNIST is looked for without ``data.root``: ``$SELFSUP_FASHION_MNIST_DIR``, else Debian's folder."""
    return Path(os.environ.get(FASHION_MNIST_ENV) or FASHION_MNIST_DEFAULT)


def _find_fashion_mnist(root: str | None, download: bool) -> Path:
    candidates = [Path(root)] if root else [fashion_mnist_default()]
    for base in candidates:
        for folder in (base, base / "FashionMNIST" / "raw", base / "fashion-mnist"):
            if all((folder / f).exists() or (folder / f[:-3]).exists()
                   for pair in FASHION_MNIST_FILES.values() for f in pair):
                return folder
    if download:
        target = Path(root or "data")
        torchvision.datasets.FashionMNIST(str(target), train=True, download=True)
        torchvision.datasets.FashionMNIST(str(target), train=False, download=True)
        return target / "FashionMNIST" / "raw"
    looked = ", ".join(str(c) for c in candidates)
    raise UserError(
        f"no Fashion-MNIST IDX files (train-images-idx3-ubyte.gz, ...) in {looked}; install them with "
        "`apt-get install dataset-fashion-mnist`, point data.root at them, or set data.download=true"
    )


def load_fashion_mnist(split: str, root: str | None = None, download: bool = False) -> ImageDataset:
    """Fashion-MNIST from the standard IDX files: 60,000 train / 10,000 test, 28×28 grayscale."""
    folder = _find_fashion_mnist(root, download)
    image_file, label_file = FASHION_MNIST_FILES["train" if split == "train" else "test"]
    pick = lambda f: folder / f if (folder / f).exists() else folder / f[:-3]  # noqa: E731
    images = torch.from_numpy(_read_idx(pick(image_file)).copy()).unsqueeze(1)
    labels = torch.from_numpy(_read_idx(pick(label_file)).astype(np.int64))
    if images.shape[0] != labels.shape[0]:
        raise UserError(f"{folder}: {images.shape[0]} images but {labels.shape[0]} labels; "
                        "the files do not belong together")
    return ImageDataset("fashion-mnist", images, labels, 10, (0.2860,), (0.3530,))


def _torchvision_dataset(name: str, split: str, root: str | None, download: bool, unlabeled: bool) -> ImageDataset:
    """CIFAR-10/100 and STL-10 through torchvision, from files already present (``download`` to fetch)."""
    root_path = root or "data"
    try:
        if name in ("cifar10", "cifar100"):
            cls = torchvision.datasets.CIFAR10 if name == "cifar10" else torchvision.datasets.CIFAR100
            ds = cls(root_path, train=split == "train", download=download)
            images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()
            labels = torch.tensor(ds.targets, dtype=torch.int64)
            mean, std = ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)) if name == "cifar10" else (
                (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))
            return ImageDataset(name, images, labels, len(ds.classes), mean, std)
        stl_split = ("train+unlabeled" if unlabeled else "train") if split == "train" else "test"
        ds = torchvision.datasets.STL10(root_path, split=stl_split, download=download)
        images = torch.from_numpy(ds.data)
        labels = torch.from_numpy(ds.labels.astype(np.int64))  # −1 for unlabeled images
        return ImageDataset(name, images, labels, 10, (0.4467, 0.4398, 0.4066), (0.2603, 0.2566, 0.2713))
    except RuntimeError as e:
        if "not found or corrupted" in str(e) or "download=True" in str(e):
            raise UserError(f"no {name} files in {Path(root_path).resolve()}; point data.root at the folder "
                            "that holds them, or set data.download=true") from None
        raise


class FolderImages:
    """Lazily decoded image files for evaluation: shorter side resized to ``resize`` (default size / 0.875),
    centre ``size`` crop (torchvision Resize + CenterCrop), as uint8 C×size×size (``channels``: 3 RGB, 1 gray)."""

    def __init__(self, files: list[Path], size: int, resize: int | None = None, channels: int = 3,
                 max_bad_fraction: float | None = None):
        self.files, self.size, self.resize = files, size, resize or eval_resize(size)
        self.channels = channels
        self.max_bad_fraction = max_bad_fraction  # None: data.on_bad_file=error
        self.bad: dict[int, str] = {}
        self.listed_bad: list[tuple[str, str]] = []  # (path, reason): files left out at listing (data.name=images)
        self.bad_log: Path | None = None  # the run's skipped-file log, once training opened it (train_crops)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (len(self.files), self.channels, self.size, self.size)

    def __len__(self) -> int:
        return len(self.files)

    def open(self, i: int):
        """File ``i`` decoded whole as an RGB (or L) PIL image (a UserError naming a corrupt file)."""
        with _open(self.files[i]) as f:
            return _decoded(f, self.files[i], self.channels)

    def load(self, i: int) -> Tensor:
        """File ``i`` resized and centre-cropped; under ``data.on_bad_file=skip`` an unreadable file's place is
        taken by the next readable one, as in training (its label stays: at most ``max_bad_fraction`` of the
        features are a neighbour's), within the same cap."""
        return first_readable(lambda j: resize_center_crop(self.files[j], self.size, self.resize, self.channels), i,
                              self.files, self.max_bad_fraction, self.bad, self.bad_log)

    def train_crops(self, scales, seed: int, ratio=(3 / 4, 4 / 3), sizes=None, bad_log: Path | None = None,
                    encoded: bool = False) -> FolderCrops:
        """The same files as training views: one random resized crop per scale in ``scales``, per image
        (at ``sizes``, one per view, for a multi-crop plan; default: all at the model size); the files skipped
        under ``data.on_bad_file=skip`` are logged in ``bad_log``. ``encoded``: the workers read bytes and boxes
        only, decoded on the device (``data.decode=device``, ``device_decode.EncodedCrops``)."""
        kind = EncodedCrops if encoded else FolderCrops
        crops = kind(self.files, self.size, scales, seed, ratio, sizes=sizes, channels=self.channels)
        self.bad_log = bad_log or self.bad_log  # the evaluation loads of this run say and log a file once too
        if bad_log is not None:  # the files left out at listing: the run's bad_file events too
            with writing(bad_log, "the skipped-file log"), open(bad_log, "a") as f:
                f.writelines(json.dumps({"index": -1, "path": p, "reason": r}) + "\n" for p, r in self.listed_bad
                             if not logged(bad_log, p))
        return crops if self.max_bad_fraction is None else crops.skip_bad_files(self.max_bad_fraction, bad_log)

    def __getitem__(self, index) -> Tensor:
        if isinstance(index, Tensor):
            index = index.tolist()
        if isinstance(index, int):
            return self.load(index)
        return torch.stack([self.load(i) for i in index])


IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}


def bad_fraction(cfg) -> float | None:
    """``data.max_bad_fraction`` under ``data.on_bad_file=skip``, None under ``error``."""
    return cfg.max_bad_fraction if cfg.on_bad_file == "skip" else None


MIN_TRAIN_IMAGES = 8  # the fewest readable images a run trains on: two optimiser steps of a batch of 4 (docs/data.md)


def too_few_images(n: int, where) -> UserError:
    """The one-line refusal of a training folder under ``MIN_TRAIN_IMAGES`` readable images."""
    return UserError(f"{where} holds {n} readable training image(s), fewer than the {MIN_TRAIN_IMAGES} a run needs "
                     f"(two batches of 4: a batch of 1 has no other image to contrast and no batch statistics); add "
                     "images to the folder")


def require_images(cfg, n: int) -> None:
    """A folder run (``imagefolder`` / ``images``) of ``n`` training images refused under ``MIN_TRAIN_IMAGES``,
    before anything is built (a preset on a folder, as the folder recipe)."""
    if cfg.name in ("imagefolder", "images") and n < MIN_TRAIN_IMAGES:
        raise too_few_images(n, f"data.root={cfg.root}")


def no_readable_image(where, tried: int, total: int, first: str) -> UserError:
    """The one-line refusal of a folder none of whose ``tried`` image files (of ``total``) opens; ``first``: why the
    first one does not (``unreadable``)."""
    count = f"all {tried} image files" if tried == total else f"all {tried} image files tried (of {total})"
    return UserError(f"no image in {where} is readable: {count} fail to open (first: "
                     f"{first.removeprefix('unreadable image file ')}); replace them, or list them with "
                     f"`selfsup data check {where}`")


def check_readable(files: list[Path], where) -> None:
    """Refuses a listing none of whose files (up to ``SIZE_SAMPLE``, spread over it) opens as an image."""
    sample = _spread(files)
    with ThreadPoolExecutor(max_workers=min(16, (os.cpu_count() or 1) * 2)) as pool:
        why = list(pool.map(unreadable, sample))
    if all(why):
        raise no_readable_image(where, len(sample), len(files), str(why[0]))


TEST_FOLDERS = ("val", "test")  # an imagefolder's test split: the first of these under data.root
HELD_OUT = 0.2  # without one, the share of train/ the end-of-run kNN scores on (runs.finish.knn_sets), seeded


def has_test_split(cfg) -> bool:
    """Whether ``cfg``'s data has a test split: every dataset but an image folder without ``val/`` or ``test/``."""
    return cfg.name != "imagefolder" or not cfg.root or any((Path(cfg.root) / n).is_dir() for n in TEST_FOLDERS)


def load_imagefolder(split: str, cfg) -> ImageDataset:
    """``root/{train,val|test}/<class>/<image>`` (torchvision ImageFolder layout); classes sorted by name; the size
    ``data.image_size``, else the train images' (``infer_image_size``)."""
    root = cfg.root
    if not root:
        raise UserError("data.name=imagefolder needs data.root=<folder with train/ and val/ subfolders>")
    base = Path(root)
    names = ("train",) if split == "train" else TEST_FOLDERS
    folder = next((base / n for n in names if (base / n).is_dir()), None)
    if folder is None:
        raise UserError(f"no {' or '.join(names)}/ folder in {base}; "
                        "an imagefolder root holds train/<class>/*.jpg and val/<class>/*.jpg")
    classes = sorted(d.name for d in folder.iterdir() if d.is_dir())
    files, labels = [], []
    for label, cls in enumerate(classes):
        for f in sorted((folder / cls).rglob("*")):
            if f.suffix.lower() in IMAGE_SUFFIXES:
                files.append(f)
                labels.append(label)
    if not files:
        raise UserError(f"no image files in {folder}/<class>/; an imagefolder root holds train/<class>/*.jpg")
    check_readable(files, folder)
    if cfg.image_size is None:  # the train split's first images decide, whichever split is loaded first
        train = folder if split == "train" else base / "train"
        probe = files if split == "train" or not train.is_dir() else \
            [f for d in sorted(p for p in train.iterdir() if p.is_dir()) for f in sorted(d.rglob("*"))
             if f.suffix.lower() in IMAGE_SUFFIXES][:SIZE_SAMPLE]
        infer_image_size(cfg, _header_sizes(_spread(probe)), train)
    images = FolderImages(files, cfg.image_size, cfg.load_size, cfg.channels or 3, bad_fraction(cfg))
    return ImageDataset("imagefolder", images, torch.tensor(labels), len(classes), *folder_stats(cfg.channels or 3))


def _spread(files: list[Path]) -> list[Path]:
    """``SIZE_SAMPLE`` files spread over the list (every class of a sorted folder, not only the first)."""
    step = max(1, len(files) // SIZE_SAMPLE)
    return files[::step][:SIZE_SAMPLE]


UNLABELLED = ("images", "webdataset")  # pretraining-only data: no labels, no test split


def needs_labels(name: str) -> UserError:
    """The one-line refusal of evaluating (or kNN-monitoring) on unlabelled pretraining data."""
    return UserError(f"data.name={name} has no labels and evaluation needs them; evaluate on labelled data, e.g. "
                     "--data imagefolder --root <folder with train/<class>/ and val/<class>/>")


def image_files(base: Path) -> list[Path]:
    """Every file with an image suffix under ``base``, at any depth (symlinked folders followed, hidden
    files and folders skipped), sorted by path: the order, and so a seeded run, depends on nothing else."""
    out = []
    for folder, dirs, files in os.walk(base, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        out += [Path(folder) / f for f in files if not f.startswith(".") and Path(f).suffix.lower() in IMAGE_SUFFIXES]
    return sorted(out)


def unreadable(path: Path) -> str | None:
    """Why ``path`` does not open as an image (header read; PIL's verify, which checks e.g. PNG chunk CRCs), or None."""
    if not path.exists():
        return f"unreadable image file {path} (a dangling symlink: its target does not exist)"
    try:
        if path.stat().st_size == 0:
            return f"unreadable image file {path} (empty: 0 bytes)"
        with Image.open(path) as im:
            im.verify()
        return None
    except Exception as e:  # PIL raises many types (OSError, SyntaxError, ValueError, struct.error...)
        return f"unreadable image file {path} ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:80]})"


def load_images(split: str, cfg) -> ImageDataset:
    """An unlabelled folder of images, flat or nested at any depth, for pretraining: ``root/**/*.{jpg,png,...}``.
    Files that do not open as images (empty, not an image, a dangling symlink) are the bad files of
    ``data.on_bad_file``: ``error`` stops in one line naming them; ``skip`` leaves each out with one line, within the
    same cap as training's (``data/badfiles.py``), and logs them as the run's ``bad_file`` events
    (``FolderImages.train_crops``); labels −1, 0 classes; the size ``data.image_size``, else the images'
    (``infer_image_size``)."""
    root = cfg.root
    if split != "train":
        raise needs_labels("images")
    if not root:
        raise UserError("data.name=images needs data.root=<folder of images, flat or nested at any depth>")
    base = Path(root)
    if not base.is_dir():
        raise UserError(f"data.root={root} is not a folder; data.name=images reads every image file under a folder")
    candidates = image_files(base)
    with ThreadPoolExecutor(max_workers=min(16, (os.cpu_count() or 1) * 2)) as pool:  # file opens wait on the disk
        why = list(pool.map(unreadable, candidates, chunksize=64))
    files = [f for f, reason in zip(candidates, why) if reason is None]
    bad = [(str(f), reason) for f, reason in zip(candidates, why) if reason is not None]
    if candidates and not files:
        raise no_readable_image(base, len(candidates), len(candidates), str(why[0]))
    if bad and cfg.on_bad_file == "error":
        raise UserError(f"{len(bad)} of {len(candidates)} image files under {base} cannot be read (first: "
                        f"{bad[0][1].removeprefix('unreadable image file ')}); data.on_bad_file=error stops on them: "
                        f"remove or replace them (selfsup data check {base} lists them), or set data.on_bad_file=skip")
    for k, (path, reason) in enumerate(bad, 1):  # one line each, then the cap
        print(f"selfsup: skipped an unreadable image: {reason}; it is left out ({k} skipped, "
              f"{cap_words(len(candidates), cfg.max_bad_fraction)})", file=sys.stderr)
    if len(bad) > bad_file_cap(len(candidates), cfg.max_bad_fraction):
        raise UserError(too_many_bad_files([p for p, _ in bad], len(candidates), cfg.max_bad_fraction))
    if not files:
        suffixes = ", ".join(sorted(IMAGE_SUFFIXES))
        raise UserError(f"no readable image files under {base} (looked for {suffixes} at any depth)")
    infer_image_size(cfg, _header_sizes(_spread(files)), base)
    images = FolderImages(files, cfg.image_size, cfg.load_size, cfg.channels or 3, bad_fraction(cfg))
    images.listed_bad = bad
    return ImageDataset("images", images, torch.full((len(files),), -1), 0, *folder_stats(cfg.channels or 3))


@dataclass
class StreamDataset(ImageDataset):
    """Tar shards streamed for pretraining (``images`` a ``ShardImages``; no per-sample labels in memory)."""

    def __len__(self) -> int:
        return self.images.num_samples

    def head(self, n: int) -> ImageDataset:
        """The first ``n`` images of the shards as an in-memory dataset (evaluation crops): the fixed batch of the
        instruments that need one (a stream has no random access)."""
        images, labels = self.images.head(n)
        return ImageDataset(self.name, images, labels, self.num_classes, self.mean, self.std)


def load_webdataset(split: str, cfg) -> StreamDataset:
    """WebDataset tar shards for pretraining (``selfsup.data.shards``): ``data.root`` the shards, ``data.num_samples``
    the epoch length (None: counted from the local shards' tar headers)."""
    if split != "train":
        raise needs_labels("webdataset")
    urls = shard_urls(cfg.root)
    skip = cfg.on_bad_file == "skip"  # a shard that breaks off is counted up to the break; the stream reports it
    n = cfg.num_samples if cfg.num_samples is not None else count_samples(urls, skip)
    if n < 1:
        raise UserError(f"the shards {urls[0]} ... hold no image samples (members named <key>.jpg, <key>.png, ...)")
    if cfg.image_size is None:
        infer_image_size(cfg, first_image_sizes(urls, SIZE_SAMPLE, skip), urls[0])
    images = ShardImages(urls, n, cfg.image_size, cfg.load_size, cfg.shuffle_buffer, cfg.channels or 3)
    images.skip_damaged = skip
    return StreamDataset("webdataset", images, torch.zeros(0, dtype=torch.long), 0, *folder_stats(cfg.channels or 3))


LATENT_SUFFIXES = (".pt", ".npz", ".npy")


def _read_latents(path: Path) -> tuple[Tensor, Tensor | None]:
    """(latents, labels or None) from .pt ({"latents", "labels"} or a tensor), .npz (same keys) or
    .npy (labels in ``<stem>_labels.npy`` beside it, if present)."""
    try:
        if path.suffix == ".pt":
            obj = torch.load(path, map_location="cpu", weights_only=True)
            latents, labels = (obj.get("latents"), obj.get("labels")) if isinstance(obj, dict) else (obj, None)
        elif path.suffix == ".npz":
            with np.load(path) as z:
                latents = z["latents"] if "latents" in z else None
                labels = z["labels"] if "labels" in z else None
        else:
            latents = np.load(path)
            side = path.with_name(f"{path.stem}_labels.npy")
            labels = np.load(side) if side.exists() else None
    except Exception as e:
        raise UserError(f"{path} is not a readable latent file ({type(e).__name__}); "
                        "write latents as .pt, .npz or .npy") from None
    if latents is None:
        raise UserError(f"{path} holds no 'latents' entry; store {{'latents': (N, C, H, W), 'labels': (N,)}}")
    latents = torch.as_tensor(latents).float()
    if latents.ndim != 4 or latents.shape[-1] != latents.shape[-2]:
        raise UserError(f"{path}: latents must be (N, C, H, W) with H = W, got {tuple(latents.shape)}")
    if labels is not None:
        labels = torch.as_tensor(labels).long().flatten()
        if len(labels) != len(latents):
            raise UserError(f"{path}: {len(latents)} latents but {len(labels)} labels; they do not belong together")
    return latents.contiguous(), labels


def load_latents(split: str, root: str | None) -> ImageDataset:
    """Precomputed latents (e.g. scaled SD-VAE latents) with optional labels; ``root`` a file (used for both
    splits) or a folder with ``train.*`` and ``test.*`` (.pt / .npz / .npy). Unlabelled: labels −1, 0 classes."""
    if not root:
        raise UserError("data.name=latents needs data.root=<latent file .pt/.npz/.npy, "
                        "or a folder with train.pt and test.pt>")
    base = Path(root)
    path = base
    if base.is_dir():
        path = next((base / f"{split}{s}" for s in LATENT_SUFFIXES if (base / f"{split}{s}").exists()), None)
        if path is None:
            raise UserError(f"no {split}.pt, {split}.npz or {split}.npy in {base}")
    elif not base.exists() or base.suffix not in LATENT_SUFFIXES:
        raise UserError(f"data.root={root} is not a latent file (.pt, .npz, .npy) or a folder holding them")
    latents, labels = _read_latents(path)
    c = latents.shape[1]
    if labels is None:
        return ImageDataset("latents", latents, torch.full((len(latents),), -1), 0, (0.0,) * c, (1.0,) * c)
    return ImageDataset("latents", latents, labels, int(labels.max()) + 1, (0.0,) * c, (1.0,) * c)


def _take(dataset: ImageDataset, index: Tensor) -> ImageDataset:
    """The samples at ``index`` (sorted); lazily decoded folders stay lazy (their file list is cut)."""
    if isinstance(dataset.images, FolderImages):
        f = dataset.images
        images = FolderImages([f.files[i] for i in index.tolist()], f.size, f.resize, f.channels, f.max_bad_fraction)
        return ImageDataset(dataset.name, images, dataset.labels[index], dataset.num_classes, dataset.mean,
                            dataset.std)
    return dataset.select(index)


def long_tail_counts(counts: list[int], ratio: float) -> list[int]:
    """Images kept per class for a long tail of ``ratio`` (largest / smallest share): the class of rank i of C keeps
    ``floor(n_i · ratio^(-i/(C-1)))``, at least 1."""
    c = len(counts)
    return [max(1, int(n * ratio ** (-i / (c - 1)))) if c > 1 else n for i, n in enumerate(counts)]


def restrict(dataset: ImageDataset, cfg, split: str) -> ImageDataset:
    """``data.exclude_classes`` (both splits) and ``data.imbalance`` (train only) applied to ``dataset``."""
    exclude, ratio = list(getattr(cfg, "exclude_classes", []) or []), getattr(cfg, "imbalance", 1.0)
    if not exclude and (ratio == 1 or split != "train"):
        return dataset
    key = "data.exclude_classes" if exclude else "data.imbalance"
    if isinstance(dataset, StreamDataset) or dataset.num_classes == 0:
        raise UserError(f"{key} needs labelled data; data.name={cfg.name} has no labels (drop {key})")
    if any(c >= dataset.num_classes for c in exclude) or len(exclude) >= dataset.num_classes:
        raise UserError(f"data.exclude_classes={exclude} must name some but not all of the classes "
                        f"0..{dataset.num_classes - 1} of {dataset.name}")
    labels = dataset.labels
    keep = ~torch.isin(labels, torch.tensor(exclude, dtype=labels.dtype))
    if split == "train" and ratio != 1:
        g = torch.Generator().manual_seed(getattr(cfg, "imbalance_seed", 0))
        classes = [c for c in range(dataset.num_classes) if c not in exclude]
        members = [(labels == c).nonzero().squeeze(1) for c in classes]
        kept = long_tail_counts([len(m) for m in members], ratio)
        keep = torch.zeros_like(keep)
        for m, n in zip(members, kept):
            keep[m[torch.randperm(len(m), generator=g)[:n]]] = True
    return _take(dataset, keep.nonzero().squeeze(1))


def load_dataset(cfg, split: str) -> ImageDataset:
    """The ``split`` ("train" or "test") of the dataset named by the DataConfig ``cfg``, with its held-out classes
    and long tail (``restrict``)."""
    return restrict(_load_dataset(cfg, split), cfg, split)


def _load_dataset(cfg, split: str) -> ImageDataset:
    if split not in ("train", "test"):
        raise ValueError(f"split must be train or test, got {split!r}")
    if getattr(cfg, "channels", None) is not None and cfg.name not in DECODED:
        raise UserError(f"data.channels={cfg.channels} applies to the decoded image files ({', '.join(DECODED)}); "
                        f"{cfg.name} keeps its own channels: leave data.channels unset")
    if cfg.name == "digits":
        return load_digits(split)
    if cfg.name == "fashion-mnist":
        return load_fashion_mnist(split, cfg.root, cfg.download)
    if cfg.name in ("cifar10", "cifar100", "stl10"):
        return _torchvision_dataset(cfg.name, split, cfg.root, cfg.download, cfg.unlabeled)
    if cfg.name == "imagefolder":
        return load_imagefolder(split, cfg)
    if cfg.name == "images":
        return load_images(split, cfg)
    if cfg.name == "webdataset":
        return load_webdataset(split, cfg)
    if cfg.name == "latents":
        return load_latents(split, cfg.root)
    raise UserError(f"data.name={cfg.name!r} is not known; use one of {', '.join(DATASETS)}")
