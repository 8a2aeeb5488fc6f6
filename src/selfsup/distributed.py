"""Gathers across processes, with and without gradient; identity in a single process."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


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
    from torch.distributed.nn.functional import all_gather

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
    from torch.distributed.nn.functional import all_reduce

    return all_reduce(x.contiguous())


@torch.no_grad()
def all_reduce_sum(x: Tensor) -> Tensor:
    """``x`` summed over every process (a new tensor; no gradient; DINO's centre); ``x`` itself in one process."""
    _, size = world()
    if size == 1:
        return x
    out = x.detach().clone()
    dist.all_reduce(out)
    return out
