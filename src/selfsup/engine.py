"""Pretraining on the Lightning engine: run folder, data module, Trainer, export, the end-of-run report
(``runs.finish``).

A run folder holds ``config.yaml`` (resolved), ``checkpoints/last.ckpt``, the loggers' files (``trainer.loggers``:
``metrics.csv``, ``tensorboard/``, ``wandb/``), ``backbone_init.safetensors`` (the random init, the kNN floor),
``backbone.safetensors`` (the exported backbone), ``heads.safetensors`` (its projector / predictor, read by
``eval --embedding``), ``run.json`` (steps, epochs, devices, fit wall time) and the method's report files
(``knn.json`` for the joint-embedding methods).
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import importlib.util
import inspect
import json
import logging
import netrc
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
import warnings
from pathlib import Path
from urllib.parse import urlparse

import lightning.pytorch as pl
import torch
import yaml
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only
from safetensors.torch import load_file

from selfsup import host
from selfsup.checkpoints import (AtomicCheckpointIO, NonFiniteWeights, RunCheckpoints, load_checkpoint,
                                 remove_partial_writes)
from selfsup.config import RunConfig, load_run, resolve, to_dict  # noqa: F401  (load_run: engine.load_run for callers)
from selfsup.data.datasets import UNLABELLED, FolderImages, ImageDataset, StreamDataset, load_dataset
from selfsup.data.loader import EpochBatchSampler, StreamBatchSampler, batch_loader, stream_loader
from selfsup.data.decode import bad_file_cap, too_many_bad_files
from selfsup.data.device_decode import all_jpeg, decoder_error
from selfsup.data.shards import ShardCrops
from selfsup.diskspace import DiskFull, is_disk_full, write_text, written_by_selfsup
from selfsup.distributed import check_devices
from selfsup.errors import UserError
from selfsup.export import HEADS_FILE, export_backbone, export_heads
from selfsup.instruments import monitor_callbacks
from selfsup.instruments.detectors import event_log
from selfsup.methods import SSLMethod
from selfsup.methods.base import NonFiniteLoss, TrainingCollapsed
from selfsup.methods.build import backbone_meta, build_method, data_info
from selfsup.runs import console
from selfsup.runs.finish import end_of_run_report


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
        plan = self.trainer.lightning_module.decode_crops()
        dataset = self.dataset
        folder = isinstance(dataset.images, FolderImages) and plan is not None
        if folder:  # crops at decode time, from the whole image: every view of the plan, its scale and size
            scales, sizes = plan
            encoded = decode_on_device(self.cfg.data.decode, dataset.images.files, self.trainer,
                                       self.trainer.strategy.root_device, workers=self.cfg.data.num_workers)
            crops = dataset.images.train_crops(scales, self.cfg.trainer.seed, sizes=sizes,
                                               bad_log=Path(self.trainer.default_root_dir) / BAD_FILES,
                                               encoded=encoded)
            self.trainer.lightning_module.encoded_crops = crops if encoded else None
            dataset = dataclasses.replace(dataset, images=crops)
        sampler = EpochBatchSampler(len(dataset), local, seed=self.cfg.trainer.seed,
                                    rank=self.trainer.global_rank, world_size=world_size,
                                    consumed=self._consumed, tag_epoch=folder)
        return batch_loader(dataset, sampler, self.cfg.data.num_workers,
                            pin_memory=self.trainer.accelerator.__class__.__name__ != "CPUAccelerator")

    def _stream_loader(self, local: int, world_size: int):
        plan = self.trainer.lightning_module.decode_crops()
        if plan is None:
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
        crops = ShardCrops(self.stream.images, plan[0], self.cfg.trainer.seed, self.trainer.global_rank, world_size,
                           local, streams, sizes=plan[1])
        if self.cfg.data.on_bad_file == "skip":
            crops.skip_bad_files(self.cfg.data.max_bad_fraction, Path(self.trainer.default_root_dir) / BAD_FILES)
        return stream_loader(crops, StreamBatchSampler(batches, streams, consumed=self._consumed),
                             self.cfg.data.num_workers,
                             pin_memory=self.trainer.accelerator.__class__.__name__ != "CPUAccelerator")


# data.decode=auto decodes on the GPU only below this many loader workers per process. Measured on an H200 with 16
# Xeon cores (benchmarks/results/end_to_end_cuda.json, decode_realistic_cuda.json): with 14 workers the CPU path fed
# DINO ViT-S/16's multi-crop step at 0.93 of its rate with free data, nvJPEG in the step at 0.65 (it adds ~70 ms of
# GPU time to a 130 ms step); a multi-crop worker decodes ~136 images per CPU-second there, so ~5 workers give what
# the device path gives (637 images/s), and the same count holds for MoCo v3's two views (~1,450 against 273 per
# CPU-second). Below it the CPU path starves the step and the device's decode is the faster of the two.
DEVICE_DECODE_BELOW_WORKERS = 5


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


def new_run_dir(cfg: RunConfig, preset: str) -> Path:
    """The path of a fresh run folder ``output_dir/name`` (default name: preset and time); made once the model
    builds."""
    name = cfg.name or f"{Path(preset).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = Path(cfg.output_dir) / name
    if (run_dir / "checkpoints").exists():
        raise UserError(f"run folder {run_dir} already holds a run; continue it with --resume {run_dir} "
                        "or choose another name=...")
    return run_dir


def check_checkpoint(path: Path, model: SSLMethod) -> None:
    """A readable checkpoint (loaded weights-only: a file holding code is refused) whose weights fit ``model``,
    or a one-line UserError."""
    ckpt = load_checkpoint(path, "delete it to restart the run from scratch")
    state = ckpt["state_dict"]
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    mismatched = [k for k in own if k in state and state[k].shape != own[k].shape]
    if missing or mismatched or set(state) - set(own):
        what = f"missing {missing[0]}" if missing else (f"shape of {mismatched[0]}" if mismatched else "extra weights")
        raise UserError(f"checkpoint {path} does not fit this run's model ({what}); it was made with another config")
    return int(ckpt.get("global_step", 0))


def keep_metrics(trainer: pl.Trainer, run_dir: Path, step: int) -> None:
    """On resume: Lightning's CSVLogger deletes an existing metrics.csv; keep its rows from before ``step``, and
    the events of ``events.jsonl`` from before ``step`` (those after it are measured again)."""
    if not trainer.is_global_zero:
        return
    events = run_dir / "events.jsonl"
    if events.exists():
        kept = []
        for line in events.read_text().splitlines():
            try:
                if int(json.loads(line)["step"]) < step:
                    kept.append(line + "\n")
            except (ValueError, KeyError, TypeError):
                continue
        events.write_text("".join(kept))
    path = run_dir / "metrics.csv"
    if not path.exists():
        return
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        keys = list(reader.fieldnames or [])
        rows = [r for r in reader if r.get("step", "").isdigit() and int(r["step"]) < step]
    for logger in trainer.loggers:
        if isinstance(logger, CSVLogger):
            writer = logger.experiment  # creating the writer removes the file
            with path.open("w", newline="") as f:
                out = csv.DictWriter(f, fieldnames=keys)
                out.writeheader()
                out.writerows(rows)
            writer.metrics_keys = keys


def step_csv_logger(run_dir: Path, flush_every: int = 100):
    """Lightning's CSVLogger writing one row per step: values logged for the step of the last buffered row (the
    instruments write straight to the loggers, Lightning writes its own values after them) join that row."""
    class StepCSVLogger(CSVLogger):
        @rank_zero_only
        def log_metrics(self, metrics, step=None):
            rows = self.experiment.metrics
            values = {k: v.item() if isinstance(v, torch.Tensor) else v for k, v in metrics.items()}
            if step is not None and rows and rows[-1].get("step") == step:
                rows[-1].update(values)
                return
            if len(rows) >= flush_every:  # flushed only when a new step starts, so a step's row is never split
                self.save()
            self.experiment.log_metrics(values, step)

    return StepCSVLogger(run_dir, name="", version="")


WANDB_ID = "wandb-run-id"  # in the run folder: a resumed run continues the same W&B run


def wandb_mode() -> str:
    """``$WANDB_MODE`` when set; else online when an API key is configured (``$WANDB_API_KEY`` or ~/.netrc) and the
    W&B host answers within 2 s, else offline (the files stay in ``RUN/wandb/`` for a later ``wandb sync``)."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    key = os.environ.get("WANDB_API_KEY")
    if not key:
        try:
            key = (netrc.netrc().authenticators(host) or (None, None, None))[2]
        except (OSError, netrc.NetrcParseError):
            key = None
    if not key:
        return "offline"
    try:
        socket.create_connection((host, 443), timeout=2).close()
    except OSError:
        return "offline"
    return "online"


def require_loggers(cfg: RunConfig) -> None:
    """The packages of the chosen loggers are installed (checked before a run folder is made), or a one-line
    UserError."""
    if "wandb" in cfg.trainer.loggers and importlib.util.find_spec("wandb") is None:
        raise UserError("trainer.loggers names wandb but the wandb package is not installed; "
                        "pip install 'selfsup[wandb]' (or drop wandb from trainer.loggers)")


def wandb_logger(cfg: RunConfig, run_dir: Path):
    """Lightning's WandbLogger writing under ``RUN/wandb/`` (project ``trainer.wandb_project``, the run folder's name,
    the resolved config); its run id is kept in ``RUN/wandb-run-id`` so a resume continues the same W&B run."""
    require_loggers(cfg)
    id_file = run_dir / WANDB_ID
    run_id = id_file.read_text().strip() if id_file.exists() else secrets.token_hex(4)
    parent = os.environ.get("LOCAL_RANK", "0") == "0"  # rank 0's logger is the one that writes
    if parent and not id_file.exists():
        id_file.write_text(run_id + "\n")
    mode = wandb_mode()
    if mode == "offline" and parent:
        print(f"selfsup: wandb runs offline (no API key or no network); upload later with "
              f"`wandb sync {run_dir / 'wandb'}/offline-run-*`", file=sys.stderr)
    return WandbLogger(save_dir=str(run_dir), project=cfg.trainer.wandb_project, name=run_dir.name, id=run_id,
                       mode=mode, config=to_dict(cfg))


def run_loggers(cfg: RunConfig, run_dir: Path) -> list:
    """The loggers ``trainer.loggers`` names: csv (``metrics.csv``, one row per step), tensorboard
    (``tensorboard/``), wandb (``wandb/``). Lightning's values and the instruments' reach each of them."""
    make = {"csv": lambda: step_csv_logger(run_dir),
            "tensorboard": lambda: TensorBoardLogger(run_dir, name="tensorboard", version=""),
            "wandb": lambda: wandb_logger(cfg, run_dir)}
    return [make[name]() for name in cfg.trainer.loggers]


def finish_loggers(trainer: pl.Trainer, failed: bool) -> None:
    """Close a W&B run this process started (Lightning leaves it open: the next run in the process would join it)."""
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger) and getattr(logger, "_experiment", None) is not None:
            logger._experiment.finish(exit_code=1 if failed else 0)


class _DropTips(logging.Filter):
    """Drops Lightning's advertising tips; keeps every real message."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡")


_DROP_TIPS = _DropTips()  # one instance, so adding it again is a no-op


def quiet_lightning() -> None:
    """Silence Lightning notices that do not apply to selfsup's design (documented choices)."""
    for name in ("lightning.pytorch", "lightning.fabric"):
        for handler_owner in (logging.getLogger(name), logging.getLogger(f"{name}.utilities.rank_zero")):
            handler_owner.addFilter(_DROP_TIPS)
    for pattern in (
        # decoding (data.decode=device) and augmentation on the device are intended to live in the module
        ".*overridden `on_(before|after)_batch_transfer`.*",
        ".*Experiment logs directory .* exists and is not empty.*",  # the run folder holds config.yaml first
        ".*isinstance\\(treespec, LeafSpec\\)` is deprecated.*",
        ".*does not have many workers.*",  # in-memory datasets need no workers
        # the samplers resume mid-epoch themselves (PretrainData._consumed)
        ".*resuming from a checkpoint that ended before the epoch ended.*",
        ".*is smaller than the logging interval.*",  # a run shorter than the interval logs every step (base.py)
    ):
        warnings.filterwarnings("ignore", message=pattern)


def make_trainer(cfg: RunConfig, run_dir: Path) -> pl.Trainer:
    """The Lightning Trainer of a run: devices, precision, strategy, loggers, checkpoints."""
    quiet_lightning()
    console.quiet(cfg.trainer.verbose)  # Lightning's chatter off unless trainer.verbose=true
    t = cfg.trainer
    checkpoint = RunCheckpoints(t.checkpoint_every_n_steps, t.checkpoint_every_n_minutes, t.max_steps)
    # torch's SyncBatchNorm runs only on GPUs: on CPU processes (gloo) each keeps its own BN statistics.
    on_gpu = t.accelerator in ("gpu", "cuda") or (t.accelerator == "auto" and torch.cuda.is_available())
    sync_bn = t.sync_batchnorm and on_gpu
    loggers = run_loggers(cfg, run_dir)
    try:
        return pl.Trainer(
            # trainer.max_steps: epochs without end, stopped at that step by RunCheckpoints (Lightning's own
            # max_steps would restore every checkpoint as a restart of an unfinished epoch)
            default_root_dir=run_dir, max_epochs=-1 if t.max_steps else t.max_epochs, accelerator=t.accelerator,
            devices=t.devices,
            num_nodes=t.num_nodes, strategy=t.strategy, precision=t.precision, sync_batchnorm=sync_bn,
            gradient_clip_val=t.gradient_clip_val, accumulate_grad_batches=t.accumulate_grad_batches,
            log_every_n_steps=t.log_every_n_steps,
            limit_train_batches=t.limit_train_batches, enable_progress_bar=t.progress_bar,
            enable_model_summary=False, callbacks=[checkpoint, *monitor_callbacks(cfg), BadFileEvents(run_dir)],
            logger=loggers,
            enable_checkpointing=False, plugins=[AtomicCheckpointIO()], use_distributed_sampler=False,
            num_sanity_val_steps=0,
        )
    except (ValueError, RuntimeError, TypeError, MisconfigurationException) as e:  # Lightning's: devices, strategy
        raise UserError(f"trainer: {str(e).splitlines()[0]}") from None


RUN_FACTS = "run.json"


def read_run_facts(run_dir: Path) -> dict:
    """``RUN/run.json`` as a mapping (empty when absent or unreadable)."""
    try:
        facts = json.loads((Path(run_dir) / RUN_FACTS).read_text())
    except (OSError, ValueError):
        return {}
    return facts if isinstance(facts, dict) else {}


def mark_run(run_dir: Path, drop: tuple[str, ...] = (), **facts) -> None:
    """Update ``RUN/run.json`` with ``facts``, without the keys ``drop`` (written whole through a temp file)."""
    merged = {k: v for k, v in read_run_facts(run_dir).items() if k not in drop}
    write_text(Path(run_dir) / RUN_FACTS, json.dumps({**merged, **facts}, indent=2), "the run's facts")


def write_run_facts(trainer, run_dir: Path, seconds: float, status: str = "finished", **extra) -> None:
    """``RUN/run.json``: what the config cannot say about a run (read by ``selfsup report``): how its last session
    ended (``status``: running while it trains, so a killed run keeps that; finished, interrupted, nan, failed),
    steps and epochs done, the devices it ran on, and the wall time of fit, summed over the sessions of a
    resumed run."""
    before = read_run_facts(run_dir)
    kind = type(trainer.accelerator).__name__.replace("Accelerator", "").lower()
    device = torch.cuda.get_device_name(trainer.strategy.root_device) if kind == "cuda" else kind
    facts = {"status": status, "global_step": int(trainer.global_step), "epochs": int(trainer.current_epoch),
             "fit_seconds": float(before.get("fit_seconds", 0.0)) + seconds,
             "sessions": int(before.get("sessions", 0)) + 1, "world_size": int(trainer.world_size),
             "num_nodes": int(trainer.num_nodes), "accelerator": kind, "device": device}
    mark_run(run_dir, drop=("signal", "stopped_at_step", "reason"), **facts, **extra)


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by SIGINT / SIGTERM after writing its checkpoint; the CLI exits with 128 + ``signum``."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def out_of_space(exc: BaseException, run_dir: Path, saved_step: int | None) -> DiskFull:
    """A run stopped by a full disk, in one line: the write of selfsup's own that failed (its file and size) or,
    for a logger's write (Lightning's metrics.csv, TensorBoard), the run folder and the size of its checkpoint,
    which the run needs free to go on; and the checkpoint kept."""
    kept = _kept_checkpoint(run_dir, saved_step)
    own = written_by_selfsup(exc)
    if own is not None:
        return own.keeping(kept)
    last = run_dir / "checkpoints" / "last.ckpt"
    return DiskFull(run_dir, "the run's logs in", last.stat().st_size if last.exists() else None, kept)


def _kept_checkpoint(run_dir: Path, saved_step: int | None) -> str:
    """What a stopped run says of its checkpoint."""
    if saved_step is None:
        return "no checkpoint was written before it (the run cannot be resumed)"
    return (f"the last checkpoint, with finite weights, is step {saved_step}: {run_dir / 'checkpoints' / 'last.ckpt'}"
            f" (selfsup pretrain --resume {run_dir} continues from it)")


def preflight(cfg: RunConfig, resume: Path | None) -> None:
    """What can be refused before anything is built: the devices against this machine
    (``distributed.check_devices``) and, for a new run, an ``output_dir`` that cannot be made or written."""
    check_devices(cfg.trainer)
    if resume is None:
        out = Path(cfg.output_dir)
        try:
            out.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=out):
                pass
        except OSError as e:
            raise UserError(f"output_dir={cfg.output_dir} cannot hold run folders ({e.strerror or type(e).__name__}); "
                            "set output_dir to a folder you can write") from None


def pretrain(cfg: RunConfig, preset: str = "run", resume: Path | None = None) -> Path:
    """Train ``cfg`` (or continue the run in ``resume``); export the backbone; print the end-of-run report.
    A fresh run whose start fails (before training begins) leaves no folder behind."""
    child = os.environ.get("LOCAL_RANK", "0") != "0" and "SELFSUP_RUN_DIR" in os.environ
    run_dir = Path(os.environ["SELFSUP_RUN_DIR"]) if child else (Path(resume) if resume else new_run_dir(cfg, preset))
    fresh = not child and not resume and not run_dir.exists()
    state: dict = {}
    try:
        return _pretrain(cfg, run_dir, child, resume, state)
    except BaseException:
        checkpoints = state.get("checkpoints")
        if fresh and run_dir.exists() and (checkpoints is None or not checkpoints.started):
            shutil.rmtree(run_dir, ignore_errors=True)  # a failed start: nothing trained, nothing to keep
        raise


def _pretrain(cfg: RunConfig, run_dir: Path, child: bool, resume: Path | None, state: dict) -> Path:
    # Lightning's DDP launcher re-runs this command in one process per device: the children
    # (LOCAL_RANK > 0) join the run folder their parent made instead of making their own.
    if not child:
        os.environ["SELFSUP_RUN_DIR"] = str(run_dir)
    require_loggers(cfg)
    if not child:
        preflight(cfg, resume)
    if cfg.data.name in UNLABELLED and (cfg.eval.knn_every_n_steps or cfg.eval.online_probe):
        raise UserError(f"eval.knn_every_n_steps and eval.online_probe need labels, and data.name={cfg.data.name} has "
                        "none; set eval.knn_every_n_steps=0 eval.online_probe=false")
    if cfg.trainer.memory_format == "channels_last" and cfg.method_cls.family == "flow":
        raise UserError("trainer.memory_format=channels_last applies to the joint-embedding methods' convolutions; a "
                        "flow model (SiT) has none but its patch projection: set it to auto or contiguous")
    train = load_dataset(cfg.data, "train")
    info = data_info(cfg, train)
    model = build_method(cfg, info)
    meta = backbone_meta(cfg, info)
    ckpt_path = run_dir / "checkpoints" / "last.ckpt" if resume else None
    if ckpt_path is not None:
        if not child:  # what a write killed midway left: a checkpoint's, an export's, run.json's
            for folder in (ckpt_path.parent, run_dir):
                remove_partial_writes(folder)
        if not ckpt_path.exists():
            raise UserError(f"{run_dir} has no checkpoints/last.ckpt to resume from; start it again without --resume")
        resumed_step = check_checkpoint(ckpt_path, model)
    elif not child:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_text(run_dir / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False), "the run's config")
        # the evaluated backbone at init (DINO / iBOT: the teacher, a copy of the student without iBOT's mask token)
        export_backbone(model.eval_backbone, run_dir / "backbone_init.safetensors", meta)
    trainer = make_trainer(cfg, run_dir)
    if cfg.data.on_bad_file == "skip" and cfg.data.name in ("imagefolder", "images", "webdataset"):
        for callback in trainer.callbacks:
            if isinstance(callback, BadFileEvents):
                callback.cap(len(train), cfg.data.max_bad_fraction)
    checkpoints = state["checkpoints"] = next(c for c in trainer.callbacks if isinstance(c, RunCheckpoints))
    if cfg.trainer.host_allocator == "cached" and type(trainer.accelerator).__name__ == "CPUAccelerator":
        host.cache_freed_memory()  # the step's tensors live in host memory: reuse it across steps
    if ckpt_path is not None:
        keep_metrics(trainer, run_dir, resumed_step)
    if trainer.is_global_zero:
        mark_run(run_dir, status="running")
    failed = True
    started = time.perf_counter()
    try:
        # Lightning reads the (already checked) file again: weights-only as well, where its fit() takes the switch.
        safe = {"weights_only": True} if "weights_only" in inspect.signature(trainer.fit).parameters else {}
        trainer.fit(model, datamodule=PretrainData(cfg, train), ckpt_path=ckpt_path, **safe)
        failed = False
    except SystemExit:  # Lightning ends a Ctrl-C'd fit with sys.exit(1) after its graceful shutdown
        if not trainer.interrupted:
            raise
        if trainer.is_global_zero:
            write_run_facts(trainer, run_dir, time.perf_counter() - started, "interrupted", signal="SIGINT")
            print(f"interrupted; continue with: selfsup pretrain --resume {run_dir}", file=sys.stderr)
        raise KeyboardInterrupt from None
    except (NonFiniteLoss, NonFiniteWeights, TrainingCollapsed) as e:
        if trainer.is_global_zero:
            write_run_facts(trainer, run_dir, time.perf_counter() - started,
                            "collapsed" if isinstance(e, TrainingCollapsed) else "nan", reason=str(e),
                            stopped_at_step=int(trainer.global_step))
        raise type(e)(f"{e}; {_kept_checkpoint(run_dir, checkpoints.saved_step)}") from None
    except BaseException as e:
        full = out_of_space(e, run_dir, checkpoints.saved_step) if is_disk_full(e) else None
        if trainer.is_global_zero and run_dir.exists():
            try:
                write_run_facts(trainer, run_dir, time.perf_counter() - started, "failed",
                                reason=(str(full or e).splitlines() or [type(e).__name__])[0])
            except DiskFull:  # run.json itself does not fit: the line on stderr says it
                pass
        if full is not None:
            raise full from None
        raise
    finally:
        finish_loggers(trainer, failed)
    if checkpoints.signal_received is not None:
        name = signal.Signals(checkpoints.signal_received).name
        if trainer.is_global_zero:
            write_run_facts(trainer, run_dir, time.perf_counter() - started, "interrupted", signal=name)
            print(f"selfsup: {name} received: stopped after step {trainer.global_step - 1}, checkpoint written; "
                  f"continue with: selfsup pretrain --resume {run_dir}", file=sys.stderr)
        raise RunInterrupted(checkpoints.signal_received)
    if not trainer.is_global_zero:
        return run_dir
    backbone = model.eval_backbone.cpu()  # DINO exports its teacher, as its kNN; a flow run its FlowEncoder
    try:
        write_run_facts(trainer, run_dir, time.perf_counter() - started)
        export_backbone(backbone, run_dir / "backbone.safetensors", meta)
        export_heads(model, run_dir / HEADS_FILE)  # the projector / predictor: eval --embedding reads them beside it
    except DiskFull as e:
        raise out_of_space(e, run_dir, checkpoints.saved_step) from None
    init_backbone = copy.deepcopy(backbone)
    init_backbone.load_state_dict(load_file(str(run_dir / "backbone_init.safetensors")))
    for line in end_of_run_report(model, train, init_backbone, run_dir):
        print(line)
    bad = bad_files(run_dir)
    if bad:
        print(f"{len(bad)} unreadable training image(s) were skipped, the next readable file standing in (all in "
              f"{run_dir / BAD_FILES}): {', '.join(bad[:5])}" + (" ..." if len(bad) > 5 else ""))
    print(f"run folder: {run_dir}")
    return run_dir
