"""The training data of a run: the Lightning data module (``PretrainData``: whole uint8 batches, or streamed tar
shards), where a folder's JPEGs are decoded (``decode_on_device``: ``data.decode``), and the unreadable files the
loaders skipped (``BadFileEvents`` as events, ``bad_files`` at the end of the run)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import lightning.pytorch as pl

from selfsup.config import RunConfig
from selfsup.data.datasets import FolderImages, ImageDataset, StreamDataset
from selfsup.data.decode import bad_file_cap, too_many_bad_files
from selfsup.data.device_decode import all_jpeg, decoder_error
from selfsup.data.loader import EpochBatchSampler, StreamBatchSampler, batch_loader, stream_loader
from selfsup.data.shards import ShardCrops
from selfsup.distributed import cpu_cores
from selfsup.errors import UserError
from selfsup.instruments.detectors import event_log


class PretrainData(pl.LightningDataModule):
    """The training split as whole uint8 batches; each process takes its slice of the global batch.
    Tar shards (``StreamDataset``) are streamed instead; ``dataset`` is then their first images (the fixed batch of
    the instruments that need one)."""

    def __init__(self, cfg: RunConfig, dataset: ImageDataset):
        super().__init__()
        self.cfg, self.dataset, self.stream = cfg, dataset, None
        if isinstance(dataset, StreamDataset):
            rank = cfg.instruments.enabled and cfg.instruments.rank_every_n_steps
            self.stream, self.dataset = dataset, dataset.head(cfg.instruments.rank_samples if rank else 1)

    def _consumed(self) -> int:
        """Batches of the current epoch a mid-epoch checkpoint already trained on (Lightning restarts a
        non-stateful loader from the epoch's first batch while counting those as fetched); 0 otherwise."""
        done = self.trainer.fit_loop.epoch_loop.batch_progress.current.ready
        return done if done < self.trainer.num_training_batches else 0

    def train_dataloader(self):
        world_size = self.trainer.world_size
        if self.cfg.data.batch_size % world_size:
            raise UserError(f"data.batch_size={self.cfg.data.batch_size} is the global batch and must divide "
                            f"by the {world_size} processes")
        local = self.cfg.data.batch_size // world_size
        if self.stream is not None:
            return self._stream_loader(local, world_size)
        if len(self.dataset) < self.cfg.data.batch_size:
            raise UserError(f"data.batch_size={self.cfg.data.batch_size} is larger than the {len(self.dataset)} "
                            "training images; lower it")
        views = self.trainer.lightning_module.device_views
        plan = views.crops() if views is not None else None
        dataset = self.dataset
        folder = isinstance(dataset.images, FolderImages) and plan is not None
        workers = capped_workers(self.cfg.data.num_workers, self.trainer.world_size // max(self.trainer.num_nodes, 1),
                                 self.trainer.is_global_zero)
        if folder:  # crops at decode time, from the whole image: every view of the plan, its scale and size
            scales, sizes = plan
            encoded = decode_on_device(self.cfg.data.decode, dataset.images.files, self.trainer,
                                       self.trainer.strategy.root_device, workers=workers)
            crops = dataset.images.train_crops(scales, self.cfg.trainer.seed, sizes=sizes,
                                               bad_log=Path(self.trainer.default_root_dir) / BAD_FILES,
                                               encoded=encoded)
            views.use_encoded(crops if encoded else None)
            dataset = dataclasses.replace(dataset, images=crops)
        sampler = EpochBatchSampler(len(dataset), local, seed=self.cfg.trainer.seed,
                                    rank=self.trainer.global_rank, world_size=world_size,
                                    consumed=self._consumed, tag_epoch=folder)
        return batch_loader(dataset, sampler, workers,
                            pin_memory=self.trainer.accelerator.__class__.__name__ != "CPUAccelerator",
                            lookahead=folder and encoded)  # data.decode=device: the next batch decoded ahead

    def _stream_loader(self, local: int, world_size: int):
        views = self.trainer.lightning_module.device_views
        if views is None:
            raise UserError(f"data.name={self.stream.name} streams crops for the joint-embedding methods; "
                            "train a flow method on an in-memory dataset or latents")
        batches = len(self.stream) // self.cfg.data.batch_size
        if batches < 1:
            raise UserError(f"data.batch_size={self.cfg.data.batch_size} is larger than the {len(self.stream)} samples "
                            "of the shards; lower it")
        streams = max(1, self.cfg.data.num_workers)
        if len(self.stream.images.urls) < world_size * streams:
            raise UserError(f"{len(self.stream.images.urls)} shard(s) cannot feed {world_size} process(es) x {streams} "
                            "decoding stream(s) (data.num_workers); write more shards or lower data.num_workers")
        scales, sizes = views.crops()
        crops = ShardCrops(self.stream.images, scales, self.cfg.trainer.seed, self.trainer.global_rank, world_size,
                           local, streams, sizes=sizes)
        if self.cfg.data.on_bad_file == "skip":
            crops.skip_bad_files(self.cfg.data.max_bad_fraction, Path(self.trainer.default_root_dir) / BAD_FILES)
        return stream_loader(crops, StreamBatchSampler(batches, streams, consumed=self._consumed),
                             self.cfg.data.num_workers,
                             pin_memory=self.trainer.accelerator.__class__.__name__ != "CPUAccelerator")


def capped_workers(asked: int, processes: int = 1, say: bool = True) -> int:
    """``data.num_workers`` on this machine: at most its cores shared by the node's ``processes`` training processes,
    less one each for the process itself (a preset's 8 GPU-machine workers on a 2-core laptop: 1), said in one line
    (``say``: rank 0's) where that lowers it. Which crops a batch holds depends on the seed alone, not the workers.
    Tar shards keep theirs: their workers are the streams that order the samples."""
    cores = cpu_cores()
    cap = max(0, cores // max(processes, 1) - 1)
    if asked <= cap:
        return asked
    if say:
        share = f"{cores} CPU core{'s' if cores != 1 else ''}"
        share += f" shared by {processes} processes" if processes > 1 else ""
        print(f"selfsup: data.num_workers={asked} is more than this machine's {share} less one can run: "
              f"using {cap} (set data.num_workers={cap} to choose it)")
    return cap


# data.decode=auto decodes on the GPU only below this many loader workers per process. The rule: the device path
# when the workers' rate, workers x one worker's images per CPU-second, stays below the device's decode rate. Measured
# on an H200 with 16 Xeon cores (benchmarks/results/end_to_end_cuda.json, decode_realistic_cuda.json): nvJPEG decodes
# and crops DINO's multi-crop at 637 images/s (MoCo v3's two views: ~1,450), where a CPU worker of that run decoded
# ~136 (two views: 273) images per CPU-second. Issue 52's CPU path is 3.6x (two views 2.3x) faster per CPU-second
# than that one on the same files (benchmarks/results/decode_realistic.json, an AMD EPYC), so a Xeon worker should
# give ~490 (two views ~630): 2 workers outrun the device for multi-crop (980 > 637), and decoding ahead on a side
# stream (device_decode.DecodePrefetcher) leaves the device path GPU time, not step time. Re-measured by
# benchmarks/gpu_session.sh (the end-to-end part, device against 2 and 14 workers) on the next lent GPU.
DEVICE_DECODE_BELOW_WORKERS = 2


def decode_on_device(decode: str, files: list, trainer, device=None, workers: int = 0) -> bool:
    """``data.decode``: whether a folder's training crops are decoded on the device (``data.device_decode``):
    ``device`` (JPEG files only, a decoder that works there), ``auto`` on a GPU fed by fewer than
    ``DEVICE_DECODE_BELOW_WORKERS`` loader ``workers`` when every training file is a JPEG and the GPU's decoder
    decodes one (else the CPU path, said in one line where the decoder fails), ``cpu`` never."""
    if decode == "device":
        others = [f for f in files if not all_jpeg([f])]
        if others:
            raise UserError(f"data.decode=device decodes JPEG files only; {len(others)} training files are not JPEGs "
                            f"(first: {others[0]}); use data.decode=cpu or auto")
        why = decoder_error(device) if device is not None else None
        if why:
            raise UserError(f"data.decode=device: torchvision cannot decode JPEGs on {device} ({why}); use "
                            "data.decode=cpu")
        return True
    if (decode != "auto" or trainer.accelerator.__class__.__name__ != "CUDAAccelerator"
            or workers >= DEVICE_DECODE_BELOW_WORKERS or not all_jpeg(files)):
        return False
    why = decoder_error(device) if device is not None else None
    if why:
        print(f"selfsup: data.decode=auto: torchvision cannot decode JPEGs on {device} ({why}); the workers decode "
              "them (data.decode=cpu)", file=sys.stderr)
    return why is None


BAD_FILES = "bad_files.jsonl"  # data.on_bad_file=skip: one JSON line per unreadable file a loader met


class BadFileEvents(pl.Callback):
    """Each unreadable training file the loaders skipped (``RUN/bad_files.jsonl``, written by the workers) as one
    ``bad_file`` event in ``events.jsonl`` and the loggers, at the step the main process first sees it: value =
    the files skipped so far, with the path and the reason. The file is read from where it was last read (a
    stat a step); the paths seen and the offset are in the checkpoint, so a resumed run does not repeat them."""

    def __init__(self, run_dir: Path):
        self.path, self.offset, self.seen = Path(run_dir) / BAD_FILES, 0, []
        self.files, self.max_fraction = 0, None  # set by ``cap``: the whole run's limit, over every worker

    def cap(self, files: int, max_fraction: float) -> None:
        """Stop the run when the files skipped by all the loader workers together pass ``bad_file_cap`` (each
        worker also stops at its own count)."""
        self.files, self.max_fraction = files, max_fraction

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not trainer.is_global_zero or not self.path.exists() or self.path.stat().st_size <= self.offset:
            return
        with self.path.open() as f:
            f.seek(self.offset)
            text = f.read()
        complete = text[:text.rfind("\n") + 1]  # a line a worker is still writing waits for the next step
        self.offset += len(complete.encode())
        log = None
        for line in complete.splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if entry.get("path") in self.seen:
                continue
            self.seen.append(entry["path"])
            log = log or event_log(trainer)
            log.write(trainer.global_step, "bad_file", len(self.seen), 0.0, path=entry["path"],
                      reason=entry.get("reason", ""))
        if self.max_fraction is not None and len(self.seen) > bad_file_cap(self.files, self.max_fraction):
            raise UserError(too_many_bad_files(self.seen, self.files, self.max_fraction))

    def state_dict(self) -> dict:
        return {"offset": self.offset, "seen": list(self.seen)}

    def load_state_dict(self, state: dict) -> None:
        self.offset, self.seen = int(state.get("offset", 0)), list(state.get("seen", []))


def bad_files(run_dir: Path) -> list[str]:
    """The unreadable training files a run skipped (each once, in the order first met)."""
    path = run_dir / BAD_FILES
    if not path.exists():
        return []
    seen: dict[str, None] = {}
    for line in path.read_text().splitlines():
        try:
            seen.setdefault(json.loads(line)["path"], None)
        except (json.JSONDecodeError, KeyError):
            continue
    return list(seen)

