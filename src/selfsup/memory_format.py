"""The memory format of a run's convolutions (``trainer.memory_format``): NCHW or channels-last (NHWC).

On a GPU, cuDNN's tensor-core convolutions work in NHWC: with NCHW weights and inputs each convolution
transposes its operands, so ResNets train with channels-last weights and views, the format the
fastest public ResNet training codes use. A ViT's only convolution is its patch projection (kernel ==
stride, run once per image), so it keeps NCHW. The result is the same in either format up to float
summation order; parameter names, shapes and values are untouched (checkpoints and exports do not
depend on it).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from selfsup.choices import MEMORY_FORMATS


def has_spatial_convs(module: nn.Module) -> bool:
    """Whether ``module`` has 2-D convolutions beyond a patch projection (kernel == stride: non-overlapping
    patches, a ViT's only convolution): a ResNet or another CNN."""
    return any(isinstance(m, nn.Conv2d) and m.kernel_size != m.stride for m in module.modules())


def resolve_memory_format(choice: str, backbone: nn.Module, device: torch.device | str) -> torch.memory_format:
    """The format ``trainer.memory_format=choice`` means for ``backbone`` trained on ``device``.

    ``auto``: channels-last for a CNN backbone on a CUDA GPU, NCHW otherwise (on CPU channels-last was not
    faster: README, Training speed)."""
    if choice not in MEMORY_FORMATS:
        raise ValueError(f"memory format {choice!r} is not known; use {', '.join(MEMORY_FORMATS)}")
    if choice == "auto":
        choice = ("channels_last" if torch.device(device).type == "cuda" and has_spatial_convs(backbone)
                  else "contiguous")
    return torch.channels_last if choice == "channels_last" else torch.contiguous_format


def set_memory_format(module: nn.Module, memory_format: torch.memory_format) -> nn.Module:
    """``module``'s 4-D parameters and buffers (convolution weights) in ``memory_format``, in place: the
    ``Parameter`` objects stay the same, so optimisers and EMA pairs built before still hold them."""
    return module.to(memory_format=memory_format)


def images_in(images: Tensor, memory_format: torch.memory_format) -> Tensor:
    """An image batch (B, C, H, W) in ``memory_format`` (one copy when it is not already)."""
    return images.contiguous(memory_format=memory_format) if images.dim() == 4 else images


@torch.no_grad()
def match_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Each optimiser state tensor shaped like its parameter takes the parameter's strides: a checkpoint
    written in the other format is resumed without mixing layouts in the fused / foreach kernels."""
    for p, state in optimizer.state.items():
        for key, value in state.items():
            if torch.is_tensor(value) and value.shape == p.shape and value.stride() != p.stride():
                state[key] = torch.empty_like(p, dtype=value.dtype).copy_(value)
