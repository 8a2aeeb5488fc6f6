"""Online linear probe: a Linear classifier trained on the detached ``embedding`` of each training step.

Its own AdamW optimiser, fp32, on the step's StepOutput (``embedding``, ``labels``; unlabelled −1 ignored);
logs ``monitor/probe_acc`` (batch accuracy before the update, %) and ``monitor/probe_loss``. Gradients
are averaged across processes so every process holds the same probe; its state is checkpointed.
"""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch import nn

from selfsup.step import step_output


class OnlineLinearProbe(pl.Callback):
    """Linear(num_features, num_classes) on detached embeddings, updated once per training batch."""

    def __init__(self, lr: float = 1e-3, num_classes: int | None = None, seed: int = 0):
        super().__init__()
        self.lr, self.num_classes, self.seed = lr, num_classes, seed
        self.probe: nn.Linear | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self._pending: dict | None = None

    def on_fit_start(self, trainer, pl_module) -> None:
        classes = self.num_classes or trainer.datamodule.dataset.num_classes
        g = torch.Generator().manual_seed(self.seed)  # the same init on every process
        probe = nn.Linear(pl_module.eval_backbone.num_features, classes)
        with torch.no_grad():
            probe.weight.normal_(0.0, 0.01, generator=g)
            probe.bias.zero_()
        self.probe = probe.to(pl_module.device)
        # fused: its step counter stays on the device (the for-loop AdamW reads it back every step)
        self.optimizer = torch.optim.AdamW(self.probe.parameters(), lr=self.lr, weight_decay=0.0, fused=True)
        if self._pending is not None:
            self.probe.load_state_dict(self._pending["probe"])
            self.optimizer.load_state_dict(self._pending["optimizer"])
            self._pending = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        out = step_output(outputs)
        if out is None or out.embedding is None or out.labels is None:
            return
        emb, labels = out.embedding.detach().float(), out.labels
        # unlabelled samples (-1) weigh 0; masking instead of selecting keeps the step free of host reads
        # (an all-unlabelled batch gives a zero loss and gradient: Adam's moments still advance, as they
        # would with any zero gradient)
        keep = (labels >= 0).float()
        labelled = keep.sum().clamp_min(1.0)
        with torch.enable_grad(), torch.autocast(emb.device.type, enabled=False):
            logits = self.probe(emb)
            per_sample = F.cross_entropy(logits, labels.clamp_min(0), reduction="none")
            loss = (per_sample * keep).sum() / labelled
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            world = torch.distributed.get_world_size()
            for p in self.probe.parameters():
                torch.distributed.all_reduce(p.grad)
                p.grad.div_(world)
        self.optimizer.step()
        acc = 100.0 * ((logits.detach().argmax(1) == labels).float() * keep).sum() / labelled
        pl_module.log("monitor/probe_acc", acc, on_step=True, on_epoch=False)
        pl_module.log("monitor/probe_loss", loss.detach(), on_step=True, on_epoch=False)

    def state_dict(self) -> dict:
        if self.probe is None:
            return {}
        return {"probe": self.probe.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state_dict: dict) -> None:
        if state_dict and self.probe is not None:
            self.probe.load_state_dict(state_dict["probe"])
            self.optimizer.load_state_dict(state_dict["optimizer"])
        elif state_dict:
            self._pending = state_dict
