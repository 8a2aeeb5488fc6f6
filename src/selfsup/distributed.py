"""Gathers across processes, with and without gradient; identity in a single process. And the check of the
devices a run asks for against the machine (``check_devices``)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.nn.functional import all_gather, all_reduce

from selfsup.errors import UserError


def world() -> tuple[int, int]:
    """(rank, world_size) of the default process group, (0, 1) when not distributed."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@torch.no_grad()
def gather_no_grad(x: Tensor) -> Tensor:
    """Concatenate ``x`` of every process in rank order; no gradient (MoCo v3's keys)."""
    _, size = world()
    if size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(size)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


def gather_with_grad(x: Tensor) -> Tensor:
    """Concatenate ``x`` of every process, differentiable (SimCLR's negatives).

    The backward sums each slice's gradient over all processes (torch.distributed.nn.all_gather),
    so after DDP's gradient averaging the result equals one process on the concatenated batch.
    """
    _, size = world()
    if size == 1:
        return x
    return torch.cat(all_gather(x.contiguous()))


class _SumValueLocalGradient(torch.autograd.Function):
    """Forward: the sum over processes; backward: the gradient passes to this process's term unchanged."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        out = x.contiguous().clone()
        dist.all_reduce(out)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad


def all_reduce_local_grad(x: Tensor) -> Tensor:
    """The sum of ``x`` over processes, differentiated as if it were this process's ``x`` alone: what an
    in-place ``torch.distributed.all_reduce`` inside the graph gives (Barlow Twins main.py:216). Each
    process then back-propagates only its own term, so after DDP's averaging a loss of the sum has
    1 / world_size of its gradient."""
    _, size = world()
    return x if size == 1 else _SumValueLocalGradient.apply(x)


def all_reduce_with_grad(x: Tensor) -> Tensor:
    """The sum of ``x`` over processes, differentiable (torch.distributed.nn.all_reduce: the backward sums
    the gradient over processes), so after DDP's averaging a loss of the sum has its whole gradient."""
    _, size = world()
    if size == 1:
        return x
    return all_reduce(x.contiguous())


def all_reduce_mean_with_grad(x: Tensor) -> Tensor:
    """The mean of ``x`` over processes, differentiable: torch.distributed.nn's ``all_reduce(x, AVG)``, whose
    backward averages the gradient over processes (LeJEPA's SIGReg, lejepa univariate/epps_pulley.py:8-13,
    :91-93); ``x`` itself in one process."""
    _, size = world()
    return x if size == 1 else all_reduce_with_grad(x) / size


@torch.no_grad()
def all_reduce_sum(x: Tensor) -> Tensor:
    """``x`` summed over every process (a new tensor; no gradient; DINO's centre); ``x`` itself in one process."""
    _, size = world()
    if size == 1:
        return x
    out = x.detach().clone()
    dist.all_reduce(out)
    return out


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask: a container's or a job's share, not the host's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def check_devices(trainer) -> None:
    """``trainer.accelerator`` and ``trainer.devices`` (the TrainerConfig) against this machine, before anything
    starts: a GPU asked for without one, or more processes than the CPU cores or GPUs present, is a one-line
    UserError naming the key (Lightning would raise a traceback, or start every process and hang)."""
    accelerator, devices = str(trainer.accelerator).lower(), trainer.devices
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if accelerator in ("gpu", "cuda") and not gpus:
        raise UserError(f"trainer.accelerator={trainer.accelerator} but this machine has no CUDA GPU; "
                        "set trainer.accelerator=cpu (or auto)")
    on_gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and gpus > 0)
    if accelerator not in ("gpu", "cuda", "cpu", "auto"):
        return  # mps, tpu, ...: Lightning checks its own
    present, what = (gpus, "GPU(s)") if on_gpu else (cpu_cores(), "CPU cores")
    if isinstance(devices, str) and devices.strip() not in ("auto", "-1"):
        text = devices.strip()
        devices = [int(x) for x in text.split(",") if x.strip().isdigit()] if "," in text else \
            (int(text) if text.lstrip("-").isdigit() else devices)
    if isinstance(devices, bool) or not isinstance(devices, (int, list, tuple)):
        return  # "auto", "-1" or a form Lightning reports itself
    if isinstance(devices, int):
        if devices == 0 or devices < -1:
            raise UserError(f"trainer.devices={trainer.devices} must be >= 1 (or -1 / auto: all {present} {what})")
        if devices > present:
            raise UserError(f"trainer.devices={trainer.devices} asks for more processes than the {present} {what} "
                            f"of this machine; use trainer.devices={present} or fewer")
    elif on_gpu and any(not isinstance(i, int) or not 0 <= i < gpus for i in devices):
        raise UserError(f"trainer.devices={trainer.devices} names a GPU this machine does not have "
                        f"(ids 0..{gpus - 1}); list ids in that range")
    elif not on_gpu and len(devices) > present:
        raise UserError(f"trainer.devices={trainer.devices} asks for more processes than the {present} {what} "
                        f"of this machine; use trainer.devices={present} or fewer")
