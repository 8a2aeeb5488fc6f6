"""A trained network that does not train, held beside a method: a distillation teacher, REPA's encoder.

One object for every such network (``FrozenNetwork``), held by the method as a plain attribute and never
registered as a child module, so it is in no ``state_dict``, checkpoint, optimiser or DDP wrapper (lightly-train
keeps its teacher a child and drops its keys on save; here nothing is there to drop). It

- runs the network under ``no_grad``, in eval mode (set once: Lightning's ``train()`` never reaches it), in bf16
  autocast on a GPU, on the student's input taken to the network's own through its ``input_map``;
- moves to the step's device in ``place`` (``TrainingBase.training_step``, outside the compiled step);
- knows what was loaded (``facts``: ``weights.StartFacts``, written to ``run.json`` under its ``name``) and its
  sha256, which ``TrainingBase`` writes into every checkpoint under ``checkpoint_key`` and checks on resume against
  the network reloaded from its source: another network is one line.

Every frozen network comes through one loader, ``weights.build_from_weights`` (any ``model.weights`` source);
``load_teacher`` is that loader and this object together.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from selfsup.errors import UserError
from selfsup.weights import build_from_weights


class Renormalise(nn.Module):
    """The student's normalised view in the network's own input normalisation, channel by channel:
    ``x_t = (x · std + mean − mean_t) / std_t``, with (``mean``, ``std``) the run's statistics and ``norm`` =
    (``mean_t``, ``std_t``) those the network was trained with (None: the run's). A grey run (1 channel) feeding a
    3-channel network repeats its channel, each copy normalised with that channel's own statistics."""

    def __init__(self, mean, std, norm: tuple | None, channels: int | None = None, what: str = "the frozen network"):
        super().__init__()
        mean, std = torch.tensor(mean), torch.tensor(std)
        t_mean, t_std = (torch.tensor(norm[0]), torch.tensor(norm[1])) if norm else (mean, std)
        channels = channels or t_mean.numel()
        if t_mean.numel() != channels:
            t_mean, t_std = t_mean.mean().expand(channels), t_std.mean().expand(channels)
        self.repeat = channels if mean.numel() == 1 and channels > 1 else 1
        if self.repeat > 1:
            mean, std = mean.expand(channels), std.expand(channels)
        elif mean.numel() != channels:
            raise UserError(f"{what} takes {channels}-channel images, the data has {mean.numel()}; use a network "
                            "trained on images of the data's channels (or on grey ones), or set data.channels")
        self.register_buffer("scale", (std / t_std).reshape(1, -1, 1, 1))
        self.register_buffer("shift", ((mean - t_mean) / t_std).reshape(1, -1, 1, 1))

    def forward(self, x: Tensor) -> Tensor:
        if self.repeat > 1:
            x = x.expand(-1, self.repeat, -1, -1)
        return x * self.scale + self.shift


class FrozenNetwork:
    """``network`` frozen (eval mode, no gradient), called on ``input_map(x)``; ``facts`` what was loaded
    (``weights.StartFacts``); ``name`` its key in ``run.json`` and its kind in messages; ``what`` the config key of
    its source; ``checkpoint_key`` where its sha256 is written in each checkpoint."""

    def __init__(self, network: nn.Module, facts, input_map: nn.Module, name: str, what: str, checkpoint_key: str):
        self.network = network.eval().requires_grad_(False)
        self.input_map = input_map
        self.facts = facts.as_dict()
        self.name, self.what, self.checkpoint_key = name, what, checkpoint_key
        self.device = next(network.parameters()).device

    @property
    def sha256(self) -> str:
        """Of the source's tensors as read (``StartFacts.source_sha256``): the same network whatever the run's
        image size, channels or precision (its positions resampled, its stem's channels)."""
        return self.facts["source_sha256"] or self.facts["sha256"]

    def __call__(self, x: Tensor, *args, **kwargs):
        """The network on ``x`` in its own input normalisation: no gradient, bf16 autocast on a GPU (placed on
        ``x``'s device first where a caller outside the training step has not: ``place``)."""
        return self.apply(lambda network, y: network(y, *args, **kwargs), x)

    def apply(self, fn, x: Tensor):
        """``fn(network, input_map(x))`` as :meth:`__call__` runs the network (another of its forwards: a
        distillation teacher's feature maps)."""
        if x.device != self.device:
            self.place(x.device)
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16, enabled=x.is_cuda):
            return fn(self.network, self.input_map(x))

    def place(self, device) -> None:
        """The network and its input map on ``device`` (a no-op where they are)."""
        device = torch.device(device)
        if device != self.device:
            self.network.to(device)
            self.input_map.to(device)
            self.device = next(self.network.parameters()).device

    def parameters(self):
        return self.network.parameters()

    def check(self, saved: str | None) -> None:
        """A checkpoint's sha256 of this network against the one loaded now: another network is one line."""
        if saved is not None and saved != self.sha256:
            raise UserError(f"{self.what}={self.facts['source']} is not the {self.name} this run trained with "
                            f"(sha256 {self.sha256[:12]}, the checkpoint's {saved[:12]}); give the run's own "
                            f"{self.name} to resume it")


TEACHER_SHA = "distill_teacher_sha256"  # the checkpoint key of a distillation teacher's sha256


def load_teacher(spec: str, backbone: str, kwargs: dict, info, what: str = "method.teacher.weights") -> FrozenNetwork:
    """A distillation teacher: the network of the source ``spec`` (``weights.build_from_weights``: its own
    architecture with ``auto``, its own input channels, at the run's image size) frozen, seeing the run's images
    (``info``: channels, statistics) in its own normalisation."""
    network, facts, norm = build_from_weights(spec, backbone, kwargs, info.channels, info.image_size, what,
                                              own_channels=True)
    channels = len(norm[0]) if norm else info.channels
    return FrozenNetwork(network, facts, Renormalise(info.mean, info.std, norm, channels, f"{what}={spec}"),
                         "teacher", what, TEACHER_SHA)
