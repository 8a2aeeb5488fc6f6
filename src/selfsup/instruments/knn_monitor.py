"""Dense kNN monitor: weighted kNN top-1 of the current backbone every N optimiser steps (MoCo v3's dips).

A fixed random subset of the training and test splits is embedded by the backbone in eval mode (no
gradient, train mode restored after), on the first process only; writes ``monitor/knn_top1`` to the loggers
(labelled with the index of the step just taken). With the collapse alarm (``instruments.collapse_alarm``) it also
measures the random init before the first step (``monitor/knn_top1_init``) and feeds ``knn_over_init`` (top-1 minus
the init's, points) to its own alarm after the lr warm-up: a run whose backbone stays under its init for 3
measurements in a row gets a ``collapse`` event (instruments/collapse.py).
"""

from __future__ import annotations

import lightning.pytorch as pl

from selfsup.data.datasets import ImageDataset, load_dataset
from selfsup.eval.features import extract_features
from selfsup.eval.knn import knn_accuracy
from selfsup.instruments.collapse import KNN_OVER_INIT, CollapseAlarm
from selfsup.instruments.detectors import DipDetector, event_log, log_metrics, report_collapse, report_event


class KNNMonitor(pl.Callback):
    """Every ``every_n_steps`` steps: kNN top-1 (%) of a fixed test subset against a fixed train subset."""

    def __init__(self, every_n_steps: int, k: int = 20, temperature: float | None = 0.07, train_size: int = 5000,
                 test_size: int = 1000, batch_size: int = 512, seed: int = 0,
                 train: ImageDataset | None = None, test: ImageDataset | None = None,
                 dip_threshold: float = 0.0, run_dir=None, alarm: CollapseAlarm | None = None):
        super().__init__()
        if every_n_steps < 1:
            raise ValueError("every_n_steps must be >= 1")
        self.every, self.k, self.temperature = every_n_steps, k, temperature
        self.train_size, self.test_size, self.batch_size, self.seed = train_size, test_size, batch_size, seed
        self._train, self._test = train, test
        self.history: list[tuple[int, float]] = []
        self._data = None
        self.dips = DipDetector(dip_threshold) if dip_threshold > 0 else None
        self.run_dir = run_dir
        self.events: list[dict] = []
        self.alarm, self.init_top1 = alarm, None  # knn_over_init: the init's top-1, measured before the first step

    def setup(self, trainer, pl_module, stage: str) -> None:
        if not trainer.is_global_zero or self._data is not None:
            return
        train = self._train if self._train is not None else trainer.datamodule.dataset
        test = self._test if self._test is not None else load_dataset(pl_module.cfg.data, "test")
        train = train.subset(self.train_size, self.seed, labelled_only=True)
        test = test.subset(self.test_size, self.seed + 1, labelled_only=True)
        self._data = (train, test, min(self.k, len(train)))

    def measure(self, pl_module) -> float:
        """kNN top-1 (%) of the current backbone (a method's ``eval_backbone``: DINO's teacher) on the fixed
        subsets; the backbone's mode is restored."""
        train, test, k = self._data
        info = pl_module.info
        ftr, ytr, fte, yte = (t for split in (train, test) for t in extract_features(
            pl_module.eval_backbone, split, info.image_size, info.mean, info.std, self.batch_size, pl_module.device))
        return knn_accuracy(ftr, ytr, fte, yte, k, self.temperature)["top1"]

    def on_train_start(self, trainer, pl_module) -> None:
        if self.alarm is not None and self.init_top1 is None and trainer.global_step == 0 and trainer.is_global_zero \
                and self._data is not None:
            self.init_top1 = self.measure(pl_module)
            log_metrics(trainer, {"knn_top1_init": self.init_top1}, 0, prefix="monitor")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        step = trainer.global_step
        if step % self.every or not trainer.is_global_zero or self._data is None:
            return
        if self.history and self.history[-1][0] == step:  # accumulation: several batches per step
            return
        top1 = self.measure(pl_module)
        self.history.append((step, top1))
        log_metrics(trainer, {"knn_top1": top1}, step - 1, prefix="monitor")  # after step index step − 1
        best = self.dips.update(top1) if self.dips is not None else None
        if best is not None:
            # the CSV step of that value
            event = event_log(trainer, self.run_dir).write(step - 1, "knn_dip", top1, best)
            self.events.append(event)
            report_event(event)
        if self.alarm is not None and self.init_top1 is not None:
            judge = step >= pl_module.warmup_steps()  # not while the lr warms up (collapse.py)
            for sign, value, compared in self.alarm.observe({KNN_OVER_INIT.name: top1 - self.init_top1}, judge):
                event = event_log(trainer, self.run_dir).write(
                    step - 1, "collapse", compared, sign.threshold, sign=sign.name, raw=top1, meaning=sign.meaning,
                    window=self.alarm.window, remedy=pl_module.collapse_remedy)
                self.events.append(event)
                report_collapse(event)

    def state_dict(self) -> dict:
        state = {"dips": self.dips.state_dict()} if self.dips is not None else {}
        if self.alarm is not None:
            state.update(alarm=self.alarm.state_dict(), init_top1=self.init_top1)
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        if self.dips is not None and "dips" in state_dict:
            self.dips.load_state_dict(state_dict["dips"])
        if self.alarm is not None and "alarm" in state_dict:
            self.alarm.load_state_dict(state_dict["alarm"])
            self.init_top1 = state_dict.get("init_top1")
