"""WebDataset tar shards (``data.name=webdataset``): streamed, split across processes and workers, cropped at
decode time.

A shard is a tar file whose members sharing a key (``0001.jpg``, ``0001.cls``) form one sample (the webdataset
convention); a sample's image is its first member with an image extension, its label an optional ``.cls``.
``data.root`` names the shards: a folder of ``.tar`` files, a brace pattern (``/data/train-{000000..000099}.tar``),
a glob pattern of local files (``/data/train-*.tar``), or anything the webdataset library opens
(``pipe:curl -s https://...``, ``http(s)://``, ``::``-separated lists). A pattern that matches no file says so.

Each epoch (selfsup's rule, the same in every process):

1. the shard list is permuted by (seed, epoch); process r takes every R-th shard from r, and its stream s of
   S = max(1, data.num_workers) every S-th of those;
2. a stream reads its shards in turn (restarting from its first when it runs out) through a shuffle buffer of
   ``data.shuffle_buffer`` samples seeded by (seed, epoch, rank, stream); its k-th batch is samples k·b … (k+1)·b − 1;
3. every process yields ⌊N / data.batch_size⌋ batches (N = data.num_samples, or the count of the local shards'
   tar headers), batch i from stream i mod S, so all processes take the same number of steps;
4. each view of a sample is a RandomResizedCrop seeded by (seed, epoch, shard, position in the shard), decoded
   like the image folders (``selfsup.data.decode``).

What this guarantees, and what not:

* each sample is seen at most once per epoch when every stream's shards hold at least the samples of the
  batches it serves (stream s serves batches s, s + S, ... of the ⌊N / data.batch_size⌋): e.g. equal shards,
  their number a multiple of processes × streams, and ⌊N / data.batch_size⌋ a multiple of S.
  A stream whose shards hold fewer starts them again (those samples are seen twice that epoch); one whose
  shards hold more leaves the rest for later epochs (the shard assignment changes every epoch);
* a resumed run continues at the right sample and ends bit-identical, given the same shards, processes,
  ``data.num_workers``, ``data.batch_size`` and shuffle buffer: each stream is read again from the epoch's
  start up to the consumed batches (read, not decoded), so a resume costs a re-read of that part of the epoch;
* under ``data.on_bad_file=skip`` (the default) a corrupt image is replaced in its batch by another sample of the
  same batch, so the batch keeps its size and the resume its position, and a shard that breaks off (truncated,
  damaged) ends there, named with the sample it breaks after; both are logged as the image folders' bad files,
  within the same cap (``ShardCrops``); under ``error`` either stops the run naming it;
* the order is a shard permutation plus a buffer shuffle, not a uniform permutation of the samples.
"""

from __future__ import annotations

import glob
import io
import random
import tarfile
from pathlib import Path

import torch
from PIL import Image
from torch import Tensor

from selfsup.data.decode import Opened, ViewBatch, crop_box_batch, decode_views, record_bad_file, resize_center_crop
from selfsup.errors import UserError

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "bmp", "ppm", "pgm", "tif", "tiff")
LABEL_EXTS = ("cls", "cls.txt", "label")
SHARD_SUFFIXES = (".tar", ".tgz", ".tar.gz")


def _webdataset():
    try:
        import webdataset  # optional: pip install 'selfsup[webdataset]'
    except ImportError:
        raise UserError("data.name=webdataset needs the webdataset package; "
                        "pip install 'selfsup[webdataset]'") from None
    return webdataset


def shard_urls(root: str | None) -> list[str]:
    """The shards ``data.root`` names: a folder's tar files (sorted), else the webdataset library's expansion of a
    brace pattern or ``::``-separated list of paths and URLs."""
    if not root:
        raise UserError("data.name=webdataset needs data.root=<a folder of .tar shards, a brace pattern like "
                        "/data/train-{000000..000099}.tar, or URLs the webdataset library opens>")
    base = Path(root)
    if base.is_dir():
        urls = sorted(str(f) for f in base.iterdir() if f.name.endswith(SHARD_SUFFIXES))
        if not urls:
            raise UserError(f"no .tar shards in {base}; data.name=webdataset reads webdataset tar files")
        return urls
    if _is_local(root) and any(c in root for c in "*?["):
        urls = sorted(glob.glob(root.removeprefix("file:")))
    else:
        urls = _webdataset().shardlists.expand_urls(root)
    local = [u for u in urls if _is_local(u)]
    missing = [u for u in local if _local_path(u) is None]
    if not urls or (local and len(missing) == len(urls)):
        raise UserError(f"no file matches data.root={root}; point it at existing shards (a folder of .tar files, "
                        "a brace pattern like /data/train-{000000..000099}.tar, or a glob like /data/train-*.tar)")
    if missing:
        raise UserError(f"data.root={root}: {len(missing)} of its {len(urls)} shards do not exist "
                        f"(first: {missing[0]}); fix the pattern or the files")
    return urls


def _is_local(url: str) -> bool:
    """A path on this machine (or ``file:``), not a URL or ``pipe:`` command."""
    return "://" not in url and not url.startswith("pipe:")


def _local_path(url: str) -> Path | None:
    path = Path(url.removeprefix("file:"))
    return path if path.is_file() else None


def _key_ext(name: str) -> tuple[str | None, str]:
    """webdataset's split of a member name: the key up to the basename's first dot, the rest lower-cased."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return ((f"{folder}/{stem}" if folder else stem) if dot else None), ext.lower()


def _members(path: Path, skip: bool):
    """The regular members of local shard ``path`` in tar order; a shard that breaks off (truncated, not a tar) ends
    at the break under ``skip`` (the stream names it when it reaches it: one line, a ``bad_file`` event), else is a
    UserError naming it."""
    try:
        with tarfile.open(path) as tar:
            for member in tar:
                if member.isreg():
                    yield tar, member
    except (tarfile.TarError, OSError, EOFError) as e:
        if not skip:
            raise UserError(f"shard {path} is not a readable tar file ({type(e).__name__}); remove or rewrite it, or "
                            "set data.on_bad_file=skip") from None


def count_samples(urls: list[str], skip: bool = False) -> int:
    """Samples with an image in local shards, from their tar headers (no image is read); a shard that breaks off is
    counted up to the break under ``skip`` (``data.on_bad_file=skip``); a UserError for URLs."""
    total = 0
    for url in urls:
        path = _local_path(url)
        if path is None:
            raise UserError(f"shard {url} is not a local file, so its samples cannot be counted; set data.num_samples "
                            "(all shards together) for streamed shards")
        keys = {_key_ext(m.name)[0] for _, m in _members(path, skip) if _key_ext(m.name)[1] in IMAGE_EXTS}
        total += len(keys - {None})
    return total


def first_image_sizes(urls: list[str], n: int, skip: bool = False) -> list[tuple[int, int]]:
    """(width, height) of the first ``n`` images of the local shards, in shard order, from their headers; [] for a
    stream (the caller then asks for data.image_size). A shard that breaks off gives what it holds before the break
    under ``skip``."""
    sizes: list[tuple[int, int]] = []
    for path in (p for p in map(_local_path, urls) if p is not None):
        for tar, member in _members(path, skip):
            if _key_ext(member.name)[1] not in IMAGE_EXTS:
                continue
            try:
                with Image.open(tar.extractfile(member)) as im:
                    sizes.append(im.size)
            except Exception:  # a damaged image: the size comes from the others
                continue
            if len(sizes) == n:
                return sizes
    return sizes


class NamedBytes(io.BytesIO):
    """An image member's bytes, named ``shard:member`` in error messages."""

    def __init__(self, data: bytes, name: str):
        super().__init__(data)
        self.label = name

    def __str__(self) -> str:
        return self.label


def _image(sample: dict) -> tuple[str, bytes] | None:
    return next(((ext, sample[ext]) for ext in IMAGE_EXTS if ext in sample), None)


def _label(sample: dict) -> int:
    for ext in LABEL_EXTS:
        if ext in sample:
            try:
                return int(sample[ext].decode().strip())
            except ValueError:
                return -1
    return -1


def _buffer_shuffle(items, size: int, rng: random.Random):
    """A stream shuffled through a buffer of ``size`` items (webdataset's shuffle, with a seeded generator)."""
    buffer = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        j = rng.randrange(size)
        buffer[j], item = item, buffer[j]
        yield item
    rng.shuffle(buffer)
    yield from buffer


class ShardImages:
    """The samples of tar shards as a stream: ``stream(seed, epoch, rank, world, streams, s)`` yields
    ``(sample id, sample dict)`` for stream ``s``; ``head(n)`` the first ``n`` images as evaluation crops."""

    def __init__(self, urls: list[str], num_samples: int, size: int, resize: int | None = None,
                 shuffle_buffer: int = 1000, channels: int = 3):
        self.urls, self.num_samples, self.size, self.resize = list(urls), num_samples, size, resize
        self.shuffle_buffer, self.channels = shuffle_buffer, channels
        self.skip_damaged = False  # data.on_bad_file=skip: head() reads a shard up to where it breaks off

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.num_samples, self.channels, self.size, self.size)

    def __len__(self) -> int:
        return self.num_samples

    def read(self, shard: int, damaged=None):
        """The samples of shard ``shard`` that hold an image, in tar order. A shard that breaks off (truncated,
        damaged, unreadable) is named with the place: a UserError, or with ``damaged`` (``data.on_bad_file=skip``)
        ``damaged(url, message)`` and the shard ends there."""
        wds = _webdataset()
        url = self.urls[shard]
        read, key = 0, None
        try:
            for sample in wds.tariterators.tarfile_samples([{"url": url}]):
                read, key = read + 1, sample.get("__key__")
                if _image(sample) is not None:
                    yield sample
        except UserError:
            raise
        except Exception as e:  # the library's errors for unreadable streams and damaged tar files
            where = f"after its sample {read} (key {key})" if read else "at its start"
            message = f"shard {url} breaks off {where} ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
            if damaged is None:
                raise UserError(f"{message}; rewrite or remove it") from None
            damaged(url, message)

    def shards_of(self, seed: int, epoch: int, rank: int, world: int, streams: int, s: int) -> list[int]:
        """Stream s of process ``rank``'s shards in ``epoch``: the (seed, epoch) permutation, every world-th from
        rank, every streams-th of those from s."""
        order = torch.randperm(len(self.urls), generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        return order.tolist()[rank::world][s::streams]

    def stream(self, seed: int, epoch: int, rank: int, world: int, streams: int, s: int, damaged=None):
        mine = self.shards_of(seed, epoch, rank, world, streams, s)
        if not mine:
            raise UserError(f"{len(self.urls)} shard(s) cannot feed {world} process(es) x {streams} stream(s) "
                            "(data.num_workers); use at least as many shards, or fewer workers")

        def one_pass():
            for shard in mine:
                for position, sample in enumerate(self.read(shard, damaged)):
                    yield (shard << 32) | position, sample

        def passes():  # each pass through the stream's shards shuffled on its own: a pass holds each sample once
            rng = random.Random(f"{seed}/{epoch}/{rank}/{s}")
            while True:
                seen = 0
                for item in (_buffer_shuffle(one_pass(), self.shuffle_buffer, rng) if self.shuffle_buffer > 1
                             else one_pass()):
                    seen += 1
                    yield item
                if not seen:
                    raise UserError(f"shards {[self.urls[i] for i in mine][:3]} hold no image samples")

        return passes()

    def head(self, n: int) -> tuple[Tensor, Tensor]:
        """The first ``n`` decodable images in shard order as evaluation crops, uint8 (n, 3, S, S), and labels."""
        images, labels = [], []
        damaged = (lambda url, message: None) if self.skip_damaged else None  # the training stream names it
        for shard in range(len(self.urls)):
            for sample in self.read(shard, damaged):
                ext, data = _image(sample)
                try:
                    images.append(resize_center_crop(NamedBytes(data, f"{sample['__url__']}:{sample['__key__']}.{ext}"),
                                                     self.size, self.resize, self.channels))
                except UserError:
                    continue
                labels.append(_label(sample))
                if len(images) == n:
                    return torch.stack(images), torch.tensor(labels)
        if not images:
            raise UserError(f"no decodable image in the shards {self.urls[0]} ...")
        return torch.stack(images), torch.tensor(labels)


class ShardCrops:
    """Training batches of one process: ``self[(epoch, s, k)]`` = batch k of its stream s, uint8 (b, V, 3, S, S) with
    one RandomResizedCrop per view (``scales``) seeded by (seed, epoch, sample id), and the labels (−1: none); with
    ``sizes`` (a multi-crop plan) a tuple of uint8 (b, V_r, 3, s_r, s_r), one per run of equal sizes.
    Each worker keeps its open streams and continues them; any other request reopens the stream and skips.

    A corrupt image, or a shard that breaks off, stops the run naming it (``data.on_bad_file=error``, the class's
    default) or, after ``skip_bad_files``, costs a line: the image is replaced by another sample of its batch (the
    batch keeps its size, the resume its position), the broken shard ends where it breaks (the stream goes on with
    its next shard); each is a JSON line of ``RUN/bad_files.jsonl`` and so a ``bad_file`` event; past the cap of
    ``data.max_bad_fraction`` of the samples the run stops in one line. Which samples stand in depends on the shards
    alone, so a resumed run stays exact."""

    def __init__(self, images: ShardImages, scales, seed: int, rank: int, world: int, batch: int, streams: int,
                 ratio=(3 / 4, 4 / 3), sizes=None):
        self.images, self.scales, self.seed, self.ratio = images, [tuple(x) for x in scales], seed, tuple(ratio)
        sizes = [int(s) for s in sizes] if sizes is not None else None
        if sizes is not None and len(sizes) != len(self.scales):
            raise ValueError(f"{len(sizes)} crop sizes for {len(self.scales)} crop scales")
        # a multi-crop plan's output size per view (None: every view at the images' size), as FolderCrops
        self.sizes = None if sizes is None or all(s == images.size for s in sizes) else sizes
        self.rank, self.world, self.batch, self.streams = rank, world, batch, streams
        self._open: dict = {}
        self.max_bad_fraction: float | None = None  # None: data.on_bad_file=error
        self.bad_log = None
        self.bad: dict[str, str] = {}  # what this process skipped: name -> name

    def skip_bad_files(self, max_fraction: float, log=None) -> "ShardCrops":
        """``data.on_bad_file=skip`` with its cap ``max_fraction`` of the samples; ``log``: ``RUN/bad_files.jsonl``."""
        self.max_bad_fraction, self.bad_log = max_fraction, log
        return self

    def _skipped(self, name: str, reason: str, stands_in: str) -> None:
        record_bad_file(self.bad, name, name, reason, len(self.images), self.max_bad_fraction, self.bad_log,
                        stands_in)

    def _damaged(self, url: str, message: str) -> None:
        self._skipped(url, message, "the stream goes on with its next shard")

    def __getstate__(self) -> dict:  # open streams stay in their process
        return {**self.__dict__, "_open": {}}

    def _samples(self, epoch: int, s: int, k: int) -> list:
        it, at = self._open.pop((epoch, s), (None, None))
        if it is None or at > k:
            damaged = self._damaged if self.max_bad_fraction is not None else None
            it, at = self.images.stream(self.seed, epoch, self.rank, self.world, self.streams, s, damaged), 0
        for _ in range((k - at) * self.batch):  # read, not decoded
            next(it)
        out = [next(it) for _ in range(self.batch)]
        self._open = {key: v for key, v in self._open.items() if key[0] == epoch}
        self._open[(epoch, s)] = (it, k + 1)
        return out

    def _opened(self, sample: dict) -> Opened | None:
        """The sample's image read for its header, or None where it is corrupt under ``skip``."""
        ext, data = _image(sample)
        name = f"{sample['__url__']}:{sample['__key__']}.{ext}"
        try:
            return Opened(NamedBytes(data, name), self.images.channels)
        except UserError as e:
            return self._bad(name, e)

    def _bad(self, name: str, e: UserError) -> None:
        if self.max_bad_fraction is None:
            raise e
        self._skipped(name, str(e), "another sample of its batch stands in")
        return None

    def __getitem__(self, index) -> tuple[Tensor, Tensor]:
        """Every header read, every box drawn in one ``crop_box_batch`` call (seeded by sample id), each image
        decoded once into the preallocated batch (``ViewBatch``); a corrupt sample's place is copied from another."""
        epoch, s, k = index
        samples = self._samples(epoch, s, k)
        opened = [self._opened(sample) for _, sample in samples]
        good = [i for i, o in enumerate(opened) if o is not None]
        boxes = crop_box_batch(self.seed, epoch, [samples[i][0] for i in good], [opened[i].height for i in good],
                               [opened[i].width for i in good], self.scales, self.ratio)
        sizes = self.sizes or [self.images.size] * len(self.scales)
        batch = ViewBatch(len(samples), sizes, self.images.channels)
        decoded = []
        for i, image_boxes in zip(good, boxes):
            try:
                decode_views(opened[i], image_boxes, sizes, batch.slots(i))
                decoded.append(i)
            except UserError as e:
                self._bad(str(opened[i].name), e)
        if not decoded:
            raise UserError(f"every image of batch {k} of stream {s} is corrupt (first: {samples[0][1]['__url__']}); "
                            "check the shards")
        ok = set(decoded)
        pick = [i if i in ok else decoded[n % len(decoded)] for n, i in enumerate(range(len(samples)))]
        for i, j in enumerate(pick):
            if i != j:
                batch.copy(i, j)
        labels = torch.tensor([_label(samples[i][1]) for i in pick])
        return batch.result(self.sizes is None), labels
