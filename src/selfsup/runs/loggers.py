"""A run's loggers (``trainer.loggers``: csv one row per step, tensorboard, wandb offline without a key or
network), what a resume keeps of their files (``keep_metrics``), and Lightning's notices that do not apply
(``quiet_lightning``), its chatter included unless ``trainer.verbose=true``."""

from __future__ import annotations

import csv
import importlib.util
import json
import logging
import netrc
import os
import secrets
import socket
import sys
import warnings
from pathlib import Path
from urllib.parse import urlparse

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities import rank_zero_only

from selfsup.config import RunConfig, to_dict
from selfsup.errors import UserError


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


LIGHTNING_LOGGERS = ("lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric")
CHATTER = (  # warnings that say nothing a selfsup user can act on
    ".*LeafSpec.*is deprecated.*",
    ".*litlogger.*",
    ".*Please use `isinstance\\(treespec, TreeSpec\\)`.*",
)


def quiet_lightning(verbose: bool = False) -> None:
    """Silence Lightning notices that do not apply to selfsup's design (documented choices), and its chatter unless
    ``verbose`` (``trainer.verbose``): its loggers at WARNING (GPU / TPU available, the ``limit_train_batches``
    notice, "Loading `train_dataloader`", the DDP banner and gloo lines, the tips) and its deprecation warnings.
    What selfsup says itself (its ``selfsup:`` lines, the progress bar, the end-of-run report) is unchanged."""
    for name in LIGHTNING_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.WARNING)
    for pattern in CHATTER:
        warnings.filterwarnings("default" if verbose else "ignore", message=pattern)
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

