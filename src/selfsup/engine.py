"""Pretraining on the Lightning engine in three steps: start (config → data → model → run folder), fit (the Trainer),
finish (facts → export → report: ``runs.finish``; a resumed run whose training is done is only finished).

A run folder holds ``config.yaml`` (resolved), ``checkpoints/last.ckpt``, the loggers' files (``trainer.loggers``:
``metrics.csv``, ``tensorboard/``, ``wandb/``), ``backbone_init.safetensors`` (the random init, the kNN floor),
``backbone.safetensors`` (the exported backbone), ``heads.safetensors`` (its projector / predictor, read by
``eval --embedding``), ``run.json`` (``runs.facts``: status, steps, epochs, devices, fit wall time) and the method's
report files (``knn.json`` for the joint-embedding methods). Its side concerns live in ``runs/``: the data module
(``runs.data``), the loggers (``runs.loggers``), the facts (``runs.facts``), the resume rules (``runs.resume``).
"""

from __future__ import annotations

import inspect
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import lightning.pytorch as pl
import torch
import yaml
from lightning.fabric.utilities.exceptions import MisconfigurationException

from selfsup import host
from selfsup.checkpoints import (AtomicCheckpointIO, NonFiniteWeights, RunCheckpoints, check_checkpoint,
                                 remove_partial_writes)
from selfsup.config import RunConfig, load_run, to_dict  # noqa: F401  (load_run: engine.load_run for callers)
from selfsup.data.datasets import UNLABELLED, ImageDataset, load_dataset, require_images
from selfsup.diskspace import DiskFull, is_disk_full, write_text
from selfsup.distributed import check_devices
from selfsup.errors import UserError
from selfsup.export import export_backbone
from selfsup.instruments import monitor_callbacks
from selfsup.methods.base import NonFiniteLoss, TrainingBase, TrainingCollapsed
from selfsup.methods.build import backbone_meta, build_method, data_info
from selfsup.runs.data import BadFileEvents, PretrainData
from selfsup.runs.facts import (RunInterrupted, kept_checkpoint, mark_run, out_of_space, read_run_facts,
                                record_start_facts, write_run_facts)
from selfsup.runs.finish import finish_run
from selfsup.runs.loggers import finish_loggers, keep_metrics, quiet_lightning, require_loggers, run_loggers
from selfsup.runs.memory import FirstStepMemory, check_step_memory
from selfsup.runs.progress import progress_bars
from selfsup.runs.resume import nothing_to_train


def new_run_dir(cfg: RunConfig, preset: str) -> Path:
    """The path of a fresh run folder ``output_dir/name`` (default name: preset and time); made once the model
    builds."""
    name = cfg.name or f"{Path(preset).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = Path(cfg.output_dir) / name
    if (run_dir / "checkpoints").exists():
        raise UserError(f"run folder {run_dir} already holds a run; continue it with --resume {run_dir} "
                        "or choose another name=...")
    return run_dir


def make_trainer(cfg: RunConfig, run_dir: Path, callbacks=()) -> pl.Trainer:
    """The Lightning Trainer of a run: devices, precision, strategy, loggers, checkpoints; ``callbacks`` first."""
    quiet_lightning(cfg.trainer.verbose)
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
            devices=t.devices, num_nodes=t.num_nodes, strategy=t.strategy, precision=t.precision,
            gradient_clip_val=t.gradient_clip_val, accumulate_grad_batches=t.accumulate_grad_batches,
            log_every_n_steps=t.log_every_n_steps, sync_batchnorm=sync_bn,
            limit_train_batches=t.limit_train_batches, enable_progress_bar=t.progress_bar, enable_model_summary=False,
            logger=loggers, callbacks=[*callbacks, checkpoint, *monitor_callbacks(cfg), BadFileEvents(run_dir),
                                       FirstStepMemory(run_dir), *progress_bars(t)],
            enable_checkpointing=False, plugins=[AtomicCheckpointIO()], use_distributed_sampler=False,
            num_sanity_val_steps=0,
        )
    except (ValueError, RuntimeError, TypeError, MisconfigurationException) as e:  # Lightning's: devices, strategy
        raise UserError(f"trainer: {str(e).splitlines()[0]}") from None


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


def refuse_contradictions(cfg: RunConfig) -> None:
    """Settings that cannot work together, refused before anything is built."""
    if cfg.data.name in UNLABELLED and (cfg.eval.knn_every_n_steps or cfg.eval.online_probe):
        raise UserError(f"eval.knn_every_n_steps and eval.online_probe need labels, and data.name={cfg.data.name} has "
                        "none; set eval.knn_every_n_steps=0 eval.online_probe=false")
    if cfg.trainer.memory_format == "channels_last" and cfg.method_cls.family == "flow":
        raise UserError("trainer.memory_format=channels_last applies to the joint-embedding methods' convolutions; a "
                        "flow model (SiT) has none but its patch projection: set it to auto or contiguous")


@dataclass
class Start:
    """What a run starts from: its training split, the seeded method, the backbone's metadata, and for a resume
    the checkpoint to continue (its path and step)."""

    train: ImageDataset
    model: TrainingBase
    meta: dict
    ckpt_path: Path | None = None
    resumed_step: int = 0


def build(cfg: RunConfig, resume: Path | None) -> Start:
    """Config → data → model (``model.weights`` loaded for a fresh run; a resumed run's are its checkpoint's)."""
    train = load_dataset(cfg.data, "train")
    require_images(cfg.data, len(train))
    info = data_info(cfg, train)
    model = build_method(cfg, info, load_weights=resume is None)
    model.step_memory = check_step_memory(model, cfg)  # on a CPU: refused if too large; FirstStepMemory reads it
    return Start(train, model, backbone_meta(cfg, info))


@dataclass
class Session:
    """One session of a run (``pretrain``): its config, folder and added callbacks, then what steps 1 and 2 make."""

    cfg: RunConfig
    run_dir: Path
    callbacks: tuple = ()
    start: Start | None = None
    trainer: pl.Trainer | None = None
    checkpoints: RunCheckpoints | None = None


def open_run_folder(start: Start, cfg: RunConfig, run_dir: Path, child: bool, resume: Path | None) -> None:
    """A fresh run's folder (config.yaml, the evaluated backbone at init), or a resumed run's checkpoint, checked
    against the model; a DDP child (``child``) joins the folder its parent made."""
    if resume is None:
        if not child:
            run_dir.mkdir(parents=True, exist_ok=True)
            write_text(run_dir / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False), "the run's config")
            # the evaluated backbone at init (DINO / iBOT: the teacher, a copy of the student without iBOT's mask token)
            export_backbone(start.model.eval_backbone, run_dir / "backbone_init.safetensors", start.meta)
            record_start_facts(run_dir, start.model.run_facts)
        return
    start.ckpt_path = run_dir / "checkpoints" / "last.ckpt"
    if not child:  # what a write killed midway left: a checkpoint's, an export's, run.json's
        for folder in (start.ckpt_path.parent, run_dir):
            remove_partial_writes(folder)
    if not start.ckpt_path.exists():
        raise UserError(f"{run_dir} has no checkpoints/last.ckpt to resume from; start it again without --resume")
    start.resumed_step = int(check_checkpoint(start.ckpt_path, start.model).get("global_step", 0))


def start_run(cfg: RunConfig, run_dir: Path, child: bool, resume: Path | None) -> Start:
    """Step 1: the checks, then config → data → model → run folder. Lightning's DDP launcher re-runs this command
    in one process per device: the children (LOCAL_RANK > 0) join the run folder their parent made."""
    if not child:
        os.environ["SELFSUP_RUN_DIR"] = str(run_dir)
    require_loggers(cfg)
    if not child:
        preflight(cfg, resume)
    refuse_contradictions(cfg)
    start = build(cfg, resume)
    open_run_folder(start, cfg, run_dir, child, resume)
    return start


def prepare_fit(s: Session) -> pl.Trainer:
    """The Trainer of this session (its callbacks first), its run-wide limit on skipped files, the host allocator,
    the loggers' files cut at the resumed step, and run.json's status ``running`` (a killed session keeps it)."""
    cfg, run_dir, start = s.cfg, s.run_dir, s.start
    s.trainer = trainer = make_trainer(cfg, run_dir, s.callbacks)
    if cfg.data.on_bad_file == "skip" and cfg.data.name in ("imagefolder", "images", "webdataset"):
        for callback in trainer.callbacks:
            if isinstance(callback, BadFileEvents):
                callback.cap(len(start.train), cfg.data.max_bad_fraction)
    s.checkpoints = next(c for c in trainer.callbacks if isinstance(c, RunCheckpoints))
    if cfg.trainer.host_allocator == "cached" and type(trainer.accelerator).__name__ == "CPUAccelerator":
        host.cache_freed_memory()  # the step's tensors live in host memory: reuse it across steps
    if start.ckpt_path is not None:
        keep_metrics(trainer, run_dir, start.resumed_step)
    if trainer.is_global_zero:
        mark_run(run_dir, drop=("finished_steps",), status="running")
    return trainer


def fit(s: Session) -> pl.Trainer:
    """Step 2: train (from the checkpoint, for a resume); a stop says how in run.json and names the kept checkpoint;
    a trained run's facts are written with status ``trained``, before its finishing."""
    trainer = prepare_fit(s)
    cfg, run_dir, start, checkpoints = s.cfg, s.run_dir, s.start, s.checkpoints
    failed, started = True, time.perf_counter()
    try:
        # Lightning reads the (already checked) file again: weights-only as well, where its fit() takes the switch.
        safe = {"weights_only": True} if "weights_only" in inspect.signature(trainer.fit).parameters else {}
        trainer.fit(start.model, datamodule=PretrainData(cfg, start.train), ckpt_path=start.ckpt_path, **safe)
        failed = False
    except BaseException as e:
        instead = fit_stopped(e, trainer, run_dir, checkpoints, time.perf_counter() - started)
        if instead is None:
            raise
        raise instead from None
    finally:
        finish_loggers(trainer, failed)
    if checkpoints.signal_received is not None:
        name = signal.Signals(checkpoints.signal_received).name
        if trainer.is_global_zero:
            write_run_facts(trainer, run_dir, time.perf_counter() - started, "interrupted", signal=name)
            print(f"selfsup: {name} received: stopped after step {trainer.global_step - 1}, checkpoint written; "
                  f"continue with: selfsup pretrain --resume {run_dir}", file=sys.stderr)
        raise RunInterrupted(checkpoints.signal_received)
    if trainer.is_global_zero:
        try:
            write_run_facts(trainer, run_dir, time.perf_counter() - started, "trained")
        except DiskFull as e:
            raise out_of_space(e, run_dir, checkpoints.saved_step) from None
    return trainer


def fit_stopped(e: BaseException, trainer: pl.Trainer, run_dir: Path, checkpoints: RunCheckpoints,
                seconds: float) -> BaseException | None:
    """How a fit that raised ``e`` ended, in run.json (rank 0); the exception to raise instead (None: ``e``)."""
    zero = trainer.is_global_zero
    if isinstance(e, SystemExit):  # Lightning ends a Ctrl-C'd fit with sys.exit(1) after its graceful shutdown
        if not trainer.interrupted:
            return None
        if zero:
            write_run_facts(trainer, run_dir, seconds, "interrupted", signal="SIGINT")
            print(f"interrupted; continue with: selfsup pretrain --resume {run_dir}", file=sys.stderr)
        return KeyboardInterrupt()
    if isinstance(e, (NonFiniteLoss, NonFiniteWeights, TrainingCollapsed)):
        if zero:
            write_run_facts(trainer, run_dir, seconds, "collapsed" if isinstance(e, TrainingCollapsed) else "nan",
                            reason=str(e), stopped_at_step=int(trainer.global_step))
        return type(e)(f"{e}; {kept_checkpoint(run_dir, checkpoints.saved_step)}")
    full = out_of_space(e, run_dir, checkpoints.saved_step) if is_disk_full(e) else None
    if zero and run_dir.exists():
        try:
            write_run_facts(trainer, run_dir, seconds, "failed", reason=(str(full or e).splitlines()
                                                                         or [type(e).__name__])[0])
        except DiskFull:  # run.json itself does not fit: the line on stderr says it
            pass
    return full


def pretrain(cfg: RunConfig, preset: str = "run", resume: Path | None = None, *, action: str = "train",
             callbacks=(), report: bool = True) -> Path:
    """Train ``cfg`` (or continue the run in ``resume``); export the backbone; print the end-of-run report
    (``report=False``: skipped). ``callbacks``: Lightning callbacks put first on the Trainer. ``action``: what
    ``runs.resume.resume`` decided for ``resume``; ``finish``: only the finishing, ``done``: nothing.
    A fresh run whose start fails (before training begins) leaves no folder behind."""
    child = os.environ.get("LOCAL_RANK", "0") != "0" and "SELFSUP_RUN_DIR" in os.environ
    run_dir = Path(os.environ["SELFSUP_RUN_DIR"]) if child else (Path(resume) if resume else new_run_dir(cfg, preset))
    if action != "train" and not child:
        if action == "finish":
            return finish_trained(cfg, run_dir, report)
        print(nothing_to_train(run_dir, read_run_facts(run_dir)))
        return run_dir
    fresh = not child and not resume and not run_dir.exists()
    s = Session(cfg, run_dir, tuple(callbacks))
    try:
        s.start = start_run(cfg, run_dir, child, resume)
        trainer = fit(s)
    except BaseException:
        if fresh and run_dir.exists() and (s.checkpoints is None or not s.checkpoints.started):
            shutil.rmtree(run_dir, ignore_errors=True)  # a failed start: nothing trained, nothing to keep
        raise
    if trainer.is_global_zero:
        finish_run(s.start.model, s.start.train, s.start.meta, run_dir, int(trainer.global_step),
                   s.checkpoints.saved_step, report=report)
    return run_dir


def finish_trained(cfg: RunConfig, run_dir: Path, report: bool = True) -> Path:
    """Step 3 alone, for a run killed after its training and before the end of its finishing: the model as its
    last checkpoint holds it (the tensors themselves: their dtype and memory format, as fit left them)."""
    for folder in (run_dir / "checkpoints", run_dir):
        remove_partial_writes(folder)
    start = build(cfg, run_dir)  # the weights are the checkpoint's
    ckpt = check_checkpoint(run_dir / "checkpoints" / "last.ckpt", start.model)
    with torch.no_grad():
        for name, tensor in start.model.state_dict(keep_vars=True).items():
            tensor.data = ckpt["state_dict"][name]
    step = int(ckpt.get("global_step", 0))
    finish_run(start.model, start.train, start.meta, run_dir, step, step, report=report)
    return run_dir
