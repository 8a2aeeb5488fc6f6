"""Decoding image files in DataLoader workers: random resized crops for training, resize + centre crop for evaluation.

Training (``FolderCrops``): each view of each image is its own RandomResizedCrop (the recipe's scale
per view, ratio (3/4, 4/3), torchvision's sampling rule) taken from the whole decoded image and
resized (antialiased bilinear, uint8) straight to its view's output size, so a batch is a fixed-size
``uint8 (B, V, C, S, S)`` tensor (a multi-crop plan with several sizes: one such tensor per run of views of
equal size) that the batched on-device augmentation takes without cropping again.
The crop boxes of a whole batch come from one vectorised draw (``crop_box_batch``) on counter-based uniforms keyed
by (seed, epoch, image index): the same on every worker count and after a resume. Each image is decoded once: an RGB
JPEG by torchvision's libjpeg-turbo on its bytes (sized from its own frame header), a JPEG whose every crop shrinks
at least 2x at the smallest DCT scale that still leaves every crop at least the output size (``PIL.Image.draft``),
anything else by PIL; each view is then resized once into a preallocated channels-last batch (``ViewBatch``).

Evaluation (``resize_center_crop``): resize the shorter side to ``resize`` (default size / 0.875:
256 for 224), then the central ``size`` square, exactly as torchvision's Resize + CenterCrop on PIL.

Images are decoded to RGB, or to one grayscale channel (``channels=1``, ``data.channels``: PIL's ``L``, ITU-R
601-2 luma), before any crop.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torchvision.io import ImageReadMode, decode_jpeg

from selfsup.data.badfiles import bad_file_cap, logged_paths, say_skipped, too_many_bad_files  # noqa: F401
from selfsup.diskspace import writing
from selfsup.errors import UserError

EVAL_CROP = 0.875  # Resize(256) + CenterCrop(224)


def eval_resize(size: int) -> int:
    """The shorter side before the centre crop: size / 0.875, rounded (224 → 256)."""
    return int(round(size / EVAL_CROP))


def _open(path: Path):
    try:
        return Image.open(path)
    except (OSError, SyntaxError, ValueError) as e:
        raise UserError(f"corrupt or unreadable image file {path} ({type(e).__name__}); remove or replace it") from None


MODES = {1: "L", 3: "RGB"}  # data.channels → the PIL mode images are decoded to


def _decoded(im, path: Path, channels: int = 3):
    try:
        return im.convert(MODES[channels])
    except (OSError, SyntaxError, ValueError) as e:
        raise UserError(f"corrupt or unreadable image file {path} ({type(e).__name__}); remove or replace it") from None


def _to_tensor(im) -> Tensor:
    """A PIL image as uint8 (C, H, W): RGB 3 channels, L one."""
    a = np.asarray(im, dtype=np.uint8).copy()
    return torch.from_numpy(a[..., None] if a.ndim == 2 else a).permute(2, 0, 1)


def resize_center_crop(path: Path, size: int, resize: int | None = None, channels: int = 3) -> Tensor:
    """torchvision ``Resize(resize)`` (shorter side, PIL bilinear) + ``CenterCrop(size)`` as uint8 (C, size, size)."""
    resize = resize or eval_resize(size)
    with _open(path) as f:
        im = _decoded(f, path, channels)
    w, h = im.size
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = resize, int(resize * long / short)
    new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
    if (new_w, new_h) != (w, h):
        im = im.resize((new_w, new_h), Image.BILINEAR)
    if new_w < size or new_h < size:
        raise UserError(f"data.load_size={resize} is smaller than the {size}-pixel centre crop; raise it")
    top, left = int(round((new_h - size) / 2.0)), int(round((new_w - size) / 2.0))
    return _to_tensor(im.crop((left, top, left + size, top + size)))


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # SplitMix64's increment, 2^64 / φ
_MIX = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))
_MASK = (1 << 64) - 1


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser (Steele, Lea & Flood 2014): a bijection of uint64 arrays with full avalanche."""
    x = (x ^ (x >> np.uint64(30))) * _MIX[0]
    x = (x ^ (x >> np.uint64(27))) * _MIX[1]
    return x ^ (x >> np.uint64(31))


def box_uniforms(seed: int, epoch: int, index, n: int) -> np.ndarray:
    """float64 (B, n) uniforms in [0, 1), row b a counter-based stream keyed by (seed, epoch, ``index[b]``): the same
    numbers whatever the batch, the worker or the order, drawn for a whole batch at once (53 bits each)."""
    index = np.asarray(index, dtype=np.int64).reshape(-1).astype(np.uint64)
    key = _mix64(np.full(1, seed & _MASK, np.uint64) + _GOLDEN)
    key = _mix64(key + np.full(1, epoch & _MASK, np.uint64) + _GOLDEN)
    key = _mix64(key + index + _GOLDEN)  # (B,)
    counters = (np.arange(1, n + 1, dtype=np.uint64) * _GOLDEN)[None, :]
    return (_mix64(key[:, None] + counters) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def crop_box_batch(seed: int, epoch: int, index, heights, widths, scales, ratio=(3 / 4, 4 / 3),
                   tries: int = 10) -> np.ndarray:
    """int64 (B, V, 4) (top, left, h, w): view v of image b a RandomResizedCrop of a ``heights[b]`` x ``widths[b]``
    image at ``scales[v]``, torchvision's ``RandomResizedCrop.get_params`` rule (area ~ U(scale) · H · W, log-ratio ~
    U(log ratio), the first of ``tries`` draws that fits, else the centre crop at the clamped ratio; top and left
    uniform over the places that fit), for the whole batch in one vectorised float64 computation from
    ``box_uniforms`` (seed, epoch, index): image b's boxes depend on (seed, epoch, ``index[b]``, its size) alone."""
    heights = np.asarray(heights, dtype=np.float64).reshape(-1, 1)  # (B, 1)
    widths = np.asarray(widths, dtype=np.float64).reshape(-1, 1)
    scales = np.asarray(scales, dtype=np.float64).reshape(-1, 2)  # (V, 2)
    b, v = len(heights), len(scales)
    u = box_uniforms(seed, epoch, index, v * (2 * tries + 2)).reshape(b, v, 2 * tries + 2)
    lo, hi = scales[:, 0, None], scales[:, 1, None]  # (V, 1)
    area = (heights * widths)[:, :, None] * (lo + (hi - lo) * u[..., :tries])
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = np.exp(log_lo + (log_hi - log_lo) * u[..., tries:2 * tries])
    w, h = np.round(np.sqrt(area * aspect)), np.round(np.sqrt(area / aspect))  # half to even, as Python's round
    ok = (w >= 1) & (w <= widths[:, :, None]) & (h >= 1) & (h <= heights[:, :, None])
    first = ok.argmax(axis=-1)[..., None]  # the first try that fits
    w, h = np.take_along_axis(w, first, -1)[..., 0], np.take_along_axis(h, first, -1)[..., 0]  # (B, V)
    top = np.minimum(np.floor(u[..., -2] * (heights - h + 1)), heights - h)
    left = np.minimum(np.floor(u[..., -1] * (widths - w + 1)), widths - w)
    # no try fits: the central crop, its aspect ratio clamped to the range
    in_ratio = widths / heights
    low, high = in_ratio < min(ratio), in_ratio > max(ratio)
    fw = np.where(low, widths, np.where(high, np.round(heights * max(ratio)), widths))
    fh = np.where(low, np.round(widths / min(ratio)), heights)
    found = ok.any(axis=-1)
    boxes = [np.where(found, top, (heights - fh) // 2), np.where(found, left, (widths - fw) // 2),
             np.where(found, h, fh), np.where(found, w, fw)]
    return np.stack(boxes, axis=-1).astype(np.int64)


def crop_boxes(seed: int, epoch: int, index: int, height: int, width: int, scales, ratio=(3 / 4, 4 / 3)):
    """One (top, left, h, w) per view of image ``index``: ``crop_box_batch`` for one image."""
    return [tuple(int(x) for x in box)
            for box in crop_box_batch(seed, epoch, [index], [height], [width], scales, ratio)[0]]


def _resize_into_fallback(crop: Tensor, size: int, out: Tensor) -> None:
    out.copy_(torch.nn.functional.interpolate(crop, size=(size, size), mode="bilinear", antialias=True))


def _resize_into_aten(crop: Tensor, size: int, out: Tensor) -> None:
    torch._C._nn._upsample_bilinear2d_aa(crop, (size, size), False, out=out)


try:  # the out= form writes straight into the batch's channels-last slot (half the time of a separate copy)
    _probe = torch.zeros(1, 3, 4, 4, dtype=torch.uint8).contiguous(memory_format=torch.channels_last)
    _resize_into_aten(_probe, 2, torch.empty(1, 2, 2, 3, dtype=torch.uint8).permute(0, 3, 1, 2))
    resize_into = _resize_into_aten
except (AttributeError, RuntimeError, TypeError):  # pragma: no cover - another torch
    resize_into = _resize_into_fallback
resize_into.__doc__ = """Antialiased bilinear resize of uint8 (1, C, h, w) ``crop`` to (1, C, size, size) ``out``
(torch's uint8 kernel, PIL's triangle filter: within one grey level of ``Image.resize(BILINEAR)``)."""


class ViewBatch:
    """The views of a batch, written in place: per run of equal sizes one uint8 (B, V_r, C, s, s) tensor, laid out
    channels-last underneath ((B, V_r, s, s, C) in memory), which the device augmentation makes contiguous."""

    def __init__(self, n: int, sizes: list[int], channels: int):
        self.sizes, self.runs = sizes, size_runs(sizes)
        self.buffers = [torch.empty(n, b - a, sizes[a], sizes[a], channels, dtype=torch.uint8) for a, b in self.runs]

    def slots(self, i: int) -> list[Tensor]:
        """Image ``i``'s views, each uint8 (1, C, s, s) (channels-last strides) in the batch."""
        return [buf[i, k].permute(2, 0, 1).unsqueeze(0) for buf, (a, b) in zip(self.buffers, self.runs)
                for k in range(b - a)]

    def copy(self, dst: int, src: int) -> None:
        for buf in self.buffers:
            buf[dst] = buf[src]

    def result(self, single: bool):
        out = tuple(buf.permute(0, 1, 4, 2, 3) for buf in self.buffers)
        return out[0] if single else out


_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}  # frame headers (not DHT, DAC)


def jpeg_header(data: bytes) -> tuple[int, int, int] | None:
    """(width, height, components) from a JPEG's frame header, walking the markers up to it; None where ``data`` is
    no JPEG or the walk fails (PIL then reads the header)."""
    if data[:2] != b"\xff\xd8":
        return None
    at, n = 2, len(data)
    while at + 4 <= n:
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # no length
            at += 2
            continue
        length = int.from_bytes(data[at + 2:at + 4], "big")
        if marker in _SOF:
            if at + 10 > n or length < 8:
                return None
            height, width = int.from_bytes(data[at + 5:at + 7], "big"), int.from_bytes(data[at + 7:at + 9], "big")
            return (width, height, data[at + 9]) if width and height else None
        if marker in (0xD9, 0xDA) or length < 2:  # end of image, start of scan: no frame header before
            return None
        at += 2 + length
    return None


class Opened:
    """An image file read for its header: its bytes, its size and whether it is a JPEG; its PIL image (lazy: nothing
    decoded) opened where needed (a JPEG's frame header read from its bytes leaves PIL out of an RGB decode)."""

    def __init__(self, source, channels: int):
        self.name, self.channels, self._image = source, channels, None
        try:
            self.data = source.getvalue() if isinstance(source, io.BytesIO) else Path(source).read_bytes()
        except OSError as e:
            raise self._error(e) from None
        header = jpeg_header(self.data) if channels == 3 else None
        if header is not None and header[2] in (1, 3):  # grey or YCbCr: decode_jpeg's RGB is PIL's convert("RGB")
            self.width, self.height, _ = header
            self.jpeg, self.light = True, True
        else:
            self.width, self.height = self.image.size
            self.jpeg, self.light = self.image.format == "JPEG", False

    def _error(self, e: Exception) -> UserError:
        return UserError(f"corrupt or unreadable image file {self.name} ({type(e).__name__}); remove or replace it")

    @property
    def image(self):
        """The PIL image of the bytes (header read, nothing decoded)."""
        if self._image is None:
            try:
                self._image = Image.open(io.BytesIO(self.data))
            except (OSError, SyntaxError, ValueError) as e:
                raise self._error(e) from None
        return self._image


def _pixels(opened: Opened, luma: bool = False) -> Tensor:
    """The whole image as uint8 (1, C, H, W), channels-last strides: torchvision's libjpeg-turbo decode of the file's
    bytes for an RGB JPEG (the same pixels as PIL's, without PIL's row copies), else PIL's (``luma``: a JPEG's own
    luma channel, as a draft decode gives it, for ``channels=1``)."""
    if opened.light:
        try:
            x = decode_jpeg(torch.frombuffer(bytearray(opened.data), dtype=torch.uint8), mode=ImageReadMode.RGB)
            return x.unsqueeze(0)  # decode_jpeg gives a (C, H, W) view of (H, W, C)
        except RuntimeError:  # a JPEG kind it refuses or a corrupt body: PIL decides
            pass
    with opened.image as f:  # a header PIL cannot read raises here
        if luma:
            f.draft("L", None)
        a = np.array(_decoded(f, opened.name, opened.channels))  # writable: torch takes it as it is
    return torch.from_numpy(a.reshape(a.shape[0], a.shape[1], -1)).permute(2, 0, 1).unsqueeze(0)


def decode_views(opened: Opened, boxes, sizes: list[int], slots: list[Tensor], draft: bool = True) -> None:
    """Write the views of ``opened`` at ``boxes`` (V, 4) (top, left, h, w; full-resolution pixels) into ``slots``
    (``ViewBatch.slots``), view v resized to ``sizes[v]``. A JPEG whose every crop shrinks at least 2x is decoded at
    the smallest DCT scale that keeps each crop at least its output size (``PIL.Image.draft``) and resized from its
    exact (fractional) box by PIL; any other image is decoded whole once (``_pixels``) and each view resized from its
    crop by torch's uint8 antialiased kernel straight into its slot."""
    boxes = [tuple(int(x) for x in box) for box in boxes]
    r = max(max(s / h, s / w) for (_, _, h, w), s in zip(boxes, sizes))
    if draft and opened.jpeg and r <= 0.5:
        f, width, height = opened.image, opened.width, opened.height
        with f:
            f.draft(MODES[opened.channels], (math.ceil(width * r), math.ceil(height * r)))
            sx, sy = f.size[0] / width, f.size[1] / height
            im = _decoded(f, opened.name, opened.channels)
        for (top, left, h, w), s, slot in zip(boxes, sizes, slots):
            view = np.array(im.resize((s, s), Image.BILINEAR, box=(left * sx, top * sy, (left + w) * sx,
                                                                      (top + h) * sy)))
            slot[0].copy_(torch.from_numpy(view.reshape(s, s, -1)).permute(2, 0, 1))
        return
    x = _pixels(opened, luma=draft and opened.jpeg and r < 1 and opened.channels == 1)
    for (top, left, h, w), s, slot in zip(boxes, sizes, slots):
        resize_into(x[:, :, top:top + h, left:left + w], s, slot)


def decode_crops(path: Path, boxes_of, size, draft: bool = True, channels: int = 3) -> Tensor | list[Tensor]:
    """The views of one file as uint8 (V, C, size, size); ``boxes_of(height, width)`` gives the crop boxes
    in full-resolution pixels (the header's size, read before decoding). ``size`` may be one output size per
    view: the views then come as a list of uint8 (C, s, s)."""
    opened = Opened(path, channels)
    boxes = boxes_of(opened.height, opened.width)
    sizes = [size] * len(boxes) if isinstance(size, int) else [int(s) for s in size]
    batch = ViewBatch(1, sizes, channels)
    decode_views(opened, boxes, sizes, batch.slots(0), draft)
    if isinstance(size, int):
        return batch.result(True)[0]
    return [slot[0] for slot in batch.slots(0)]


def first_readable(read, i: int, files: list, max_fraction: float | None, bad: dict, log: Path | None = None):
    """``read(i)``; under ``data.on_bad_file=skip`` (``max_fraction`` not None) an unreadable file's place is taken by
    the first readable one after it (cyclically): which one depends on the files alone, so a resumed run and any
    worker take the same. Each unreadable file is noted once (``record_bad_file``)."""
    n = len(files)
    for k in range(n if max_fraction is not None else 1):
        j = (i + k) % n
        try:
            return read(j)
        except UserError as e:
            if max_fraction is None:
                raise
            record_bad_file(bad, j, str(files[j]), str(e), len(files), max_fraction, log)
    raise UserError(f"none of the {n} images can be read (the first: {files[0]})")


def record_bad_file(bad: dict, key, path: str, reason: str, total: int, max_fraction: float, log: Path | None,
                    stands_in: str = "the next readable file stands in") -> None:
    """Note unreadable file ``key`` (``path``) in ``bad`` (once): one line on stderr and a JSON line in ``log``, unless
    another process of the run logged it (``badfiles.say_skipped``); past ``bad_file_cap`` the run stops in one
    line (``data.on_bad_file=skip``). The count is the run's: the files of its log (every worker, epoch and
    session of the run: a worker's ``bad`` starts empty each epoch) with this process's."""
    if key in bad:
        return
    bad[key] = path
    skipped = sorted(logged_paths(log) | set(bad.values()))
    if say_skipped(path, reason, stands_in, len(skipped), total, max_fraction, log) and log is not None:
        with writing(log, "the skipped-file log"), open(log, "a") as f:
            f.write(json.dumps({"index": key, "path": path, "reason": reason}) + "\n")
    if len(skipped) > bad_file_cap(total, max_fraction):
        raise UserError(too_many_bad_files(skipped, total, max_fraction))


class FolderCrops:
    """Training views of image files, decoded and cropped per (epoch, index): ``crops(indices, epoch)`` →
    uint8 (B, V, C, size, size), view v a RandomResizedCrop with ``scales[v]``; with ``sizes`` (one output
    size per view, a multi-crop plan) a tuple of uint8 (B, V_r, C, s_r, s_r), one per run of equal sizes."""

    def __init__(self, files: list[Path], size: int, scales, seed: int, ratio=(3 / 4, 4 / 3), draft: bool = True,
                 sizes=None, channels: int = 3):
        self.files, self.size, self.scales, self.channels = files, size, [tuple(s) for s in scales], channels
        self.seed, self.ratio, self.draft = seed, tuple(ratio), draft
        sizes = [int(s) for s in sizes] if sizes is not None else None
        if sizes is not None and len(sizes) != len(self.scales):
            raise ValueError(f"{len(sizes)} crop sizes for {len(self.scales)} crop scales")
        self.sizes = None if sizes is None or all(s == size for s in sizes) else sizes
        self.max_bad_fraction: float | None = None  # None: data.on_bad_file=error
        self.bad_log: Path | None = None
        self.bad: dict[int, str] = {}  # the unreadable files this process met: index -> path

    def skip_bad_files(self, max_fraction: float, log: Path | None = None) -> "FolderCrops":
        """``data.on_bad_file=skip``: an unreadable file is replaced by the next readable one (``first_readable``),
        logged (one line, and a JSON line in ``log``); more than ``max(1, max_fraction · n)`` of them stop the run."""
        self.max_bad_fraction, self.bad_log = max_fraction, log
        return self

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (len(self.files), self.channels, self.size, self.size)

    def __len__(self) -> int:
        return len(self.files)

    @property
    def view_sizes(self) -> list[int]:
        return self.sizes or [self.size] * len(self.scales)

    def _opened(self, j: int) -> tuple[int, Opened]:
        return j, Opened(self.files[j], self.channels)

    def _read_into(self, slots: list[Tensor], epoch: int):
        """``read(j)`` for ``first_readable``: file j's views, with its own seeded boxes, written into ``slots``."""
        def read(j: int) -> None:
            opened = Opened(self.files[j], self.channels)
            boxes = crop_box_batch(self.seed, epoch, [j], [opened.height], [opened.width], self.scales, self.ratio)
            decode_views(opened, boxes[0], self.view_sizes, slots, self.draft)
        return read

    def crop(self, i: int, epoch: int):
        """The views of file ``i``; under ``skip`` those of the first readable file from ``i`` on (cyclically), with
        that file's own seeded boxes: which file stands in depends on the files alone, so a resumed run (and any
        worker) takes the same one."""
        batch = ViewBatch(1, self.view_sizes, self.channels)
        first_readable(self._read_into(batch.slots(0), epoch), i, self.files, self.max_bad_fraction, self.bad,
                       self.bad_log)
        return batch.result(True)[0] if self.sizes is None else [slot[0] for slot in batch.slots(0)]

    def crops(self, index: Tensor, epoch: int):
        """The batch's views: every header read, every box drawn in one ``crop_box_batch`` call, each image decoded
        once and its views written into the preallocated batch (``ViewBatch``). A file whose body fails to decode
        goes through ``first_readable`` as in ``crop``: the same views."""
        idx = index.tolist()
        read = [first_readable(self._opened, i, self.files, self.max_bad_fraction, self.bad, self.bad_log)
                for i in idx]
        boxes = crop_box_batch(self.seed, epoch, [j for j, _ in read], [o.height for _, o in read],
                               [o.width for _, o in read], self.scales, self.ratio)
        batch = ViewBatch(len(idx), self.view_sizes, self.channels)
        for b, ((_, opened), image_boxes) in enumerate(zip(read, boxes)):
            slots = batch.slots(b)
            try:
                decode_views(opened, image_boxes, self.view_sizes, slots, self.draft)
            except UserError:
                if self.max_bad_fraction is None:
                    raise
                first_readable(self._read_into(slots, epoch), idx[b], self.files, self.max_bad_fraction, self.bad,
                               self.bad_log)
        return batch.result(self.sizes is None)


def size_runs(sizes: list[int]) -> list[tuple[int, int]]:
    """(first, end) of each run of consecutive views of equal size in a multi-crop plan's ``sizes``."""
    runs, first = [], 0
    for v in range(1, len(sizes) + 1):
        if v == len(sizes) or sizes[v] != sizes[first]:
            runs.append((first, v))
            first = v
    return runs
