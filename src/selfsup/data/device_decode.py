"""JPEG training crops decoded on the accelerator (``data.decode=device``): the workers only read bytes.

On a GPU host the CPU data path is the limit for multi-crop methods (issue 39): the decode-time crops of
``decode.FolderCrops`` cost a worker several milliseconds an image. Here a worker reads each file's bytes, parses its
header for the size and draws the same seeded crop boxes (``decode.crop_boxes``, per (seed, epoch, index)): an
``EncodedBatch``. The training module (``on_before_batch_transfer``) then decodes the whole batch in one call,
``torchvision.io.decode_jpeg(list, device=...)`` (nvJPEG's batched decode on a GPU), and cuts every view with one
``torchvision.ops.roi_align`` per image (all its views at once): each output pixel the mean of bilinear samples
over its bin, ceil(crop / output) of them a side, an area filter where PIL's bilinear resize of the CPU path is a
triangle filter. The result is the CPU path's contract, uint8 (B, V, C, S, S) (a multi-crop plan: one such tensor
per run of equal sizes), already on the device.

Differences from the CPU path, measured by ``tests/test_device_decode.py``: the same boxes; no DCT-scaled (draft)
decode, so every crop is cut from the full-resolution image; the resize filter as above (mean |Δ| 0.4 grey levels
of 255 at 224-px crops of ImageNet-sized JPEGs, 1-2.5 where a crop shrinks 2-10 x, 0.2 where it grows;
torchvision's libjpeg-turbo and PIL decode these files identically on the CPU). A batch whose decode fails (a
corrupt body the header did not show, a JPEG kind the device's decoder refuses) is decoded by the CPU path instead,
where ``data.on_bad_file`` applies as always; a file whose header cannot be read is skipped in the worker by the
same rule. Either way the batch depends on the files alone, so a resumed run stays exact. torchvision 0.29
deprecates its image codecs (for TorchCodec); ``decode_jpeg`` is the decoder here while it lasts.
"""

from __future__ import annotations

import contextlib
import io
import sys

import numpy as np
import torch
from PIL import Image
from torch import Tensor
from torchvision.io import ImageReadMode, decode_jpeg
from torchvision.ops import roi_align

from selfsup.data.decode import FolderCrops, crop_boxes, first_readable, size_runs
from selfsup.errors import UserError

JPEG_SUFFIXES = (".jpg", ".jpeg")


def all_jpeg(files) -> bool:
    """Whether every file is named as a JPEG (``data.decode=auto`` decodes on the device only then)."""
    return all(str(f).lower().endswith(JPEG_SUFFIXES) for f in files)


class EncodedBatch:
    """A batch as a worker leaves it: the files' bytes (one flat uint8 tensor and each file's length), the crop
    boxes (B, V, 4) as (top, left, h, w) in full-resolution pixels, and what the CPU path needs to redo it
    (``index``, ``epoch``). Not a dataclass: Lightning moves it to the device untouched, decoded first."""

    def __init__(self, data: Tensor, lengths: list[int], boxes: Tensor, index: Tensor, epoch: int):
        self.data, self.lengths, self.boxes, self.index, self.epoch = data, lengths, boxes, index, epoch

    def __len__(self) -> int:
        return len(self.lengths)


class EncodedCrops(FolderCrops):
    """``FolderCrops`` whose ``crops`` leave decoding to the device: an ``EncodedBatch`` per batch of indices;
    ``decoded`` is the CPU path on the same indices (the fallback, counted in ``fallbacks``)."""

    fallbacks = 0  # batches the device's decoder refused, decoded on the CPU instead (this process)

    def encoded(self, i: int, epoch: int) -> tuple[Tensor, Tensor]:
        """File ``i``'s bytes and its views' boxes; under ``skip`` the first file from ``i`` on whose header reads."""
        def read(j: int):
            path = self.files[j]
            data = np.fromfile(path, dtype=np.uint8)
            try:
                with Image.open(io.BytesIO(data.tobytes())) as f:  # the header only: the size for the boxes
                    width, height = f.size
            except (OSError, SyntaxError, ValueError) as e:
                raise UserError(f"corrupt or unreadable image file {path} ({type(e).__name__}); remove or "
                                "replace it") from None
            if not len(data):
                raise UserError(f"corrupt or unreadable image file {path} (empty); remove or replace it")
            return torch.from_numpy(data), torch.tensor(crop_boxes(self.seed, epoch, j, height, width, self.scales,
                                                                   self.ratio))
        return first_readable(read, i, self.files, self.max_bad_fraction, self.bad, self.bad_log)

    def crops(self, index: Tensor, epoch: int) -> EncodedBatch:
        per_image = [self.encoded(i, epoch) for i in index.tolist()]
        data = torch.cat([d for d, _ in per_image])
        return EncodedBatch(data, [len(d) for d, _ in per_image], torch.stack([b for _, b in per_image]),
                            index, epoch)

    def decoded(self, batch: EncodedBatch):
        """The CPU path (``FolderCrops.crops``) on the batch's indices: the fallback of a failed device decode."""
        return FolderCrops.crops(self, batch.index, batch.epoch)


def roi_crops(image: Tensor, boxes: Tensor, size: int) -> Tensor:
    """The views of one decoded image uint8 (C, H, W) at ``boxes`` (V, 4) (top, left, h, w) as uint8 (V, C, s, s):
    one ``roi_align`` (pixel-aligned boxes, adaptive sampling: ceil(crop / s) bilinear samples a bin side)."""
    x = image.unsqueeze(0).float()
    b = boxes.to(device=x.device, dtype=x.dtype)
    rois = torch.cat([b.new_zeros(len(b), 1), b[:, 1:2], b[:, 0:1], b[:, 1:2] + b[:, 3:4], b[:, 0:1] + b[:, 2:3]],
                     dim=1)  # (0, x1, y1, x2, y2) in pixel edges
    out = roi_align(x, rois, (size, size), spatial_scale=1.0, sampling_ratio=-1, aligned=True)
    return out.round_().clamp_(0, 255).to(torch.uint8)


def decode_on_device(batch: EncodedBatch, sizes: list[int], channels: int, device) -> Tensor | tuple[Tensor, ...]:
    """The batch's views on ``device``: uint8 (B, V, C, S, S), or with several sizes (``sizes``, one per view) a
    tuple of uint8 (B, V_r, C, s_r, s_r), one per run of equal sizes (``FolderCrops``' layout). Raises
    RuntimeError where the decoder refuses a file."""
    mode = ImageReadMode.RGB if channels == 3 else ImageReadMode.GRAY
    images = decode_jpeg(list(torch.split(batch.data, batch.lengths)), mode=mode, device=device)
    out = [torch.stack([roi_crops(im, boxes[a:b], sizes[a]) for im, boxes in zip(images, batch.boxes)])
           for a, b in size_runs(sizes)]
    return out[0] if len(out) == 1 else tuple(out)


def decode_batch(batch: EncodedBatch, crops: EncodedCrops, device) -> Tensor | tuple[Tensor, ...]:
    """``decode_on_device``, or where the decoder refuses a file, the CPU path on the same indices (its
    ``data.on_bad_file`` rule), moved to ``device`` (one line the first time: it decodes in the training process)."""
    sizes = crops.sizes or [crops.size] * len(crops.scales)
    try:
        return decode_on_device(batch, sizes, crops.channels, device)
    except RuntimeError as e:
        if not crops.fallbacks:
            print(f"selfsup: the device's JPEG decoder refused a batch ({str(e).splitlines()[0][:120]}); that "
                  "batch is decoded on the CPU, in the training process", file=sys.stderr)
        crops.fallbacks += 1
        views = crops.decoded(batch)
        return tuple(v.to(device) for v in views) if isinstance(views, tuple) else views.to(device)


def decoder_error(device) -> str | None:
    """None when ``decode_jpeg`` decodes a small JPEG on ``device`` (torchvision built with nvJPEG on a GPU),
    else why not: ``data.decode=auto`` then keeps the CPU path, ``device`` stops in one line."""
    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (120, 60, 30)).save(buffer, "JPEG")
    try:
        decode_jpeg([torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)], device=device)
    except (RuntimeError, NotImplementedError, ValueError) as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
    return None


def _tensors(views) -> tuple[Tensor, ...]:
    return tuple(views) if isinstance(views, (tuple, list)) else (views,)


class DecodePrefetcher:
    """Batch k+1's device decode (``decode``: nvJPEG's batched decode and the crops) overlapped with step k: ``start``
    launches it on a side CUDA stream as soon as the loader has handed the batch over, an event marks its end, and
    ``take`` (when batch k+1's turn comes) makes the current stream wait on that event and hands the views over
    (``record_stream``: their memory stays the step's until the step is done with them). One batch ahead at most.

    A batch that was not started (the first of an epoch, after a resume, another batch than the one started) is
    decoded by ``take`` itself, on the current stream, as before; either way batch k's views are ``decode(batch k)``,
    so a run with prefetching is the run without it. An error of a prefetched decode (a corrupt file under
    ``data.on_bad_file=error``) is raised by ``take``, at that batch's own step. On a device without streams (the
    CPU) the same code runs with the streams and events as no-ops: ``start`` decodes at once."""

    def __init__(self, decode, device):
        self.decode, self.device = decode, torch.device(device)
        cuda = self.device.type == "cuda" and torch.cuda.is_available()
        self.stream = torch.cuda.Stream(self.device) if cuda else None
        self.pending = None  # (key, views or None, error or None, event or None)
        self.started = self.hits = 0  # counts: batches decoded ahead, and those used

    @staticmethod
    def key(batch: EncodedBatch) -> tuple:
        return batch.epoch, tuple(batch.index.tolist())

    def start(self, batch: EncodedBatch) -> None:
        """Launch ``batch``'s decode on the side stream. It reads host memory only (the batch's bytes), so it waits on
        nothing queued on the current stream; the caching allocator keeps each stream's blocks apart."""
        views = error = event = None
        context = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        try:
            with context:
                views = self.decode(batch)
                if self.stream is not None:
                    event = torch.cuda.Event()
                    event.record(self.stream)
        except Exception as e:  # noqa: BLE001 - raised at the batch's own step by take
            error = e
        self.pending, self.started = (self.key(batch), views, error, event), self.started + 1

    def take(self, batch: EncodedBatch):
        """``batch``'s views: the prefetched ones where ``start`` had this batch, else decoded now."""
        pending, self.pending = self.pending, None
        if pending is None or pending[0] != self.key(batch):
            return self.decode(batch)
        _, views, error, event = pending
        if error is not None:
            raise error
        self.hits += 1
        if event is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(event)
            for t in _tensors(views):
                t.record_stream(current)
        return views

    def reset(self) -> None:
        """Drop a batch decoded ahead (its epoch ended without it, a validation loop came between)."""
        self.pending = None


def upcoming_batch(trainer):
    """The batch the loop trains on next, as the loader gives it, where the training loader is a
    ``loader.LookaheadLoader`` (data.decode=device), which holds it one batch ahead; None at an epoch's last batch,
    before the first, or for any other loader."""
    try:
        loader = trainer.train_dataloader
    except (AttributeError, RuntimeError):
        return None
    current = getattr(loader, "current", None)
    batch = current.upcoming if current is not None else None
    encoded = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
    return encoded if isinstance(encoded, EncodedBatch) else None
