"""iBOT's masks of the patch grid (bytedance/ibot loader.py ``ImageFolderMask``), drawn for a whole batch at once.

Official behaviour (NEW-METHODS §2 iBOT, I/loader.py:18-116), per crop:

* the prediction ratio: for each entry i of ``pred_ratio`` a draw ``U(r_i − v_i, r_i + v_i)`` (``r_i`` itself when
  ``v_i = 0``), then one entry chosen uniformly (:33-49); the README recipe ``pred_ratio (0, 0.3)``,
  ``pred_ratio_var (0, 0.2)`` leaves a crop unmasked with probability ½, otherwise masks U(0.1, 0.5) of it;
  0 before ``pred_start_epoch``;
* ``block`` (BEiT's generator, :67-100): while fewer than ``high = ratio · H · W`` patches are masked, up to 10
  attempts at a rectangle of area ``U(low, high − masked)`` (``low = (min(H, W) // 3)²``, 16 on a 14 × 14 grid)
  and aspect ratio log-uniform in ``pred_aspect_ratio`` (0.3, 1/0.3), sides rounded, ``h < H`` and ``w < W``,
  at a uniform position; the first rectangle that masks between 1 and ``high − masked`` new patches is taken;
  a round in which no attempt is taken ends the mask;
* ``rand`` (:102-108): ``int(high)`` patches chosen uniformly.

Here every mask of the batch is drawn at once on the device from the step's generator (so a resumed run draws
the same masks, and nothing is read back to the host): the 10 attempts of a round are drawn together and the
first accepted one is taken (attempts of one round are independent given the mask, as in the official loop),
the patches a rectangle already covers are counted with a 2-D prefix sum, and the rounds run a fixed number of
times, ``max_blocks`` (default ``ceil(max ratio · H · W)``, the most rounds that can each add a patch: the result
is then the official loop's; a finished mask stays as it is). The official code draws masks for the local crops
too and never uses them: here only the global crops get one.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

ATTEMPTS = 10  # attempts at a rectangle per round (loader.py:72)


def prediction_ratios(n: int, pred_ratio, pred_ratio_var, generator: torch.Generator, device=None) -> Tensor:
    """(n,) masking ratios: per entry ``U(r − v, r + v)`` (``r`` where ``v = 0``), then one entry uniformly."""
    r = torch.tensor([float(x) for x in pred_ratio], device=device)
    v = torch.tensor([float(x) for x in pred_ratio_var], device=device)
    u = torch.rand(n, len(r), generator=generator, device=device)
    draws = torch.where(v > 0, r - v + 2 * v * u, r)
    pick = (torch.rand(n, generator=generator, device=device) * len(r)).long().clamp_(max=len(r) - 1)
    return draws.gather(1, pick[:, None]).squeeze(1)


def max_masked_patches(grid: tuple[int, int], pred_ratio, pred_ratio_var) -> int:
    """The most patches a crop's mask can hold, ``ceil(max ratio · H · W)`` (at most H · W): the block loop stops
    at its target ``ratio · H · W`` and never passes it, the random one takes ``int(ratio · H · W)``."""
    top = max(float(r) + float(v) for r, v in zip(pred_ratio, pred_ratio_var))
    return min(int(math.ceil(top * grid[0] * grid[1])), grid[0] * grid[1])


def default_max_blocks(grid: tuple[int, int], pred_ratio, pred_ratio_var) -> int:
    """The most rounds of the block loop that can each add a patch: ``ceil(max ratio · H · W)``."""
    return max(max_masked_patches(grid, pred_ratio, pred_ratio_var), 1)


def block_masks(ratio: Tensor, grid: tuple[int, int], generator: torch.Generator,
                aspect_ratio: tuple[float, float] = (0.3, 1 / 0.3), max_blocks: int | None = None) -> Tensor:
    """(n, H, W) bool block-wise masks, mask i with the target ``ratio[i] · H · W`` (BEiT / iBOT block loop)."""
    H, W = grid
    return block_loop(ratio.float() * H * W, grid, generator, aspect_ratio, max_blocks,
                      low=float((min(H, W) // 3) ** 2))


def block_loop(high: Tensor, grid: tuple[int, int], generator: torch.Generator,
               aspect_ratio: tuple[float, float] = (0.3, 1 / 0.3), max_blocks: int | None = None, *,
               low: float, block_max: float | None = None) -> Tensor:
    """(n, H, W) bool masks by the block loop, mask i grown to at most ``high[i]`` patches: each round's rectangles
    have an area ``U(low, min(high − masked, block_max))`` (iBOT: ``low = (min(H, W) // 3)²``, no ``block_max``;
    DINOv2's MaskingGenerator: ``low = min_num_patches = 4``, ``block_max = max_num_patches = 0.5 · H · W``)."""
    n, (H, W), dev = high.shape[0], grid, high.device
    rounds = H * W if max_blocks is None else max_blocks  # H · W: enough for any ratio
    log_lo, log_hi = math.log(aspect_ratio[0]), math.log(aspect_ratio[1])
    mask = torch.zeros(n, H, W, dtype=torch.bool, device=dev)
    count = torch.zeros(n, device=dev)
    active = count < high  # the official ``while mask_count < high``
    rows = torch.arange(H, device=dev).view(1, H, 1)
    cols = torch.arange(W, device=dev).view(1, 1, W)
    sample = torch.arange(n, device=dev)
    for _ in range(rounds):
        remaining = (high - count)[:, None]  # max_mask_patches
        if block_max is not None:
            remaining = remaining.clamp(max=block_max)
        u = torch.rand(4, n, ATTEMPTS, generator=generator, device=dev)
        area = low + (remaining - low) * u[0]  # random.uniform(low, remaining), either order
        aspect = torch.exp(log_lo + (log_hi - log_lo) * u[1])
        h = torch.round(torch.sqrt(area * aspect)).long()
        w = torch.round(torch.sqrt(area / aspect)).long()
        fits = (h < H) & (w < W)
        h, w = torch.where(fits, h, 0), torch.where(fits, w, 0)
        top = torch.floor(u[2] * (H - h + 1)).long().clamp_(max=H - h)  # random.randint(0, H - h)
        left = torch.floor(u[3] * (W - w + 1)).long().clamp_(max=W - w)
        covered = torch.nn.functional.pad(mask.int().cumsum(1).cumsum(2), (1, 0, 1, 0)).view(n, -1)
        at = lambda r, c: covered.gather(1, r * (W + 1) + c)  # noqa: E731  prefix sum at (r, c)
        already = at(top + h, left + w) - at(top, left + w) - at(top + h, left) + at(top, left)
        new = h * w - already
        ok = fits & (new > 0) & (new <= remaining)
        first = ok.int().argmax(dim=1)  # the first accepted attempt
        take = ok[sample, first] & active
        t, le, hh, ww = (x[sample, first].view(n, 1, 1) for x in (top, left, h, w))
        block = (rows >= t) & (rows < t + hh) & (cols >= le) & (cols < le + ww)
        mask |= block & take.view(n, 1, 1)
        count = count + torch.where(take, new[sample, first], 0)
        active = take & (count < high)  # a round without progress, or the target reached, ends the mask
    return mask


def random_masks(ratio: Tensor, grid: tuple[int, int], generator: torch.Generator) -> Tensor:
    """(n, H, W) bool masks of exactly ``int(ratio[i] · H · W)`` uniformly chosen patches (``pred_shape rand``)."""
    n, (H, W) = ratio.shape[0], grid
    noise = torch.rand(n, H * W, generator=generator, device=ratio.device)
    rank = noise.argsort(dim=1).argsort(dim=1)
    return (rank < (ratio.float() * H * W).long()[:, None]).view(n, H, W)


def ibot_masks(n: int, grid: tuple[int, int], generator: torch.Generator, pred_ratio=(0.3,), pred_ratio_var=(0.0,),
               aspect_ratio: tuple[float, float] = (0.3, 1 / 0.3), shape: str = "block",
               max_blocks: int | None = None, device=None) -> Tensor:
    """(n, H, W) bool iBOT masks (True = masked) of ``n`` crops: ratios by ``prediction_ratios``, then
    ``block_masks`` or ``random_masks``."""
    ratio = prediction_ratios(n, pred_ratio, pred_ratio_var, generator, device)
    if shape == "rand":
        return random_masks(ratio, grid, generator)
    if max_blocks is None:
        max_blocks = default_max_blocks(grid, pred_ratio, pred_ratio_var)
    return block_masks(ratio, grid, generator, aspect_ratio, max_blocks)


def dinov2_masks(n: int, grid: tuple[int, int], generator: torch.Generator, probability: float = 0.5,
                 ratio_min_max: tuple[float, float] = (0.1, 0.5), device=None) -> Tensor:
    """(n, H, W) bool masks of the ``n`` global crops of one process's batch, as DINOv2's collate
    (dinov2/data/collate.py:20-36, train.py:170-173, data/masking.py):

    * ``k = int(n · probability)`` crops are masked; crop i < k gets the target ``int(N · U(p_i, p_{i+1}))``
      patches with ``p = linspace(min, max, k + 1)`` (the ratios stratified over the range); the others none;
    * each target by the block loop with ``min_num_patches`` 4 and at most ``0.5 · N`` patches per block
      (``max_num_patches = 0.5 · H · W``), aspect ratio log-uniform in (0.3, 1/0.3);
    * the n masks shuffled over the crops (``random.shuffle``): here by a random permutation.

    The draws come from the step's generator on the device, as ``ibot_masks``."""
    H, W = grid
    N, k = H * W, int(n * probability)
    p = torch.linspace(ratio_min_max[0], ratio_min_max[1], k + 1, device=device)
    u = torch.rand(k, generator=generator, device=device)
    counts = torch.zeros(n, device=device)
    counts[:k] = (N * (p[:-1] + (p[1:] - p[:-1]) * u)).floor()  # int(N · random.uniform(p_i, p_i+1))
    counts = counts[torch.randperm(n, generator=generator, device=device)]
    rounds = dinov2_max_masked(grid, ratio_min_max)
    masks = block_loop(counts, grid, generator, (0.3, 1 / 0.3), max(rounds, 1), low=4.0, block_max=0.5 * N)
    return masks


def dinov2_max_masked(grid: tuple[int, int], ratio_min_max: tuple[float, float] = (0.1, 0.5)) -> int:
    """The most patches one crop's DINOv2 mask holds, ``int(N · max ratio)`` (a target never passes it)."""
    return int(np.float32(grid[0] * grid[1]) * np.float32(ratio_min_max[1]))  # float32, as the collate; no host read


def dinov2_upperbound(n: int, grid: tuple[int, int], probability: float = 0.5,
                      ratio_min_max: tuple[float, float] = (0.1, 0.5)) -> int:
    """DINOv2's ``upperbound`` (collate.py:24-30): ``Σ_i int(N · p_{i+1})`` over the ``int(n · probability)`` masked
    crops, the most masked patches a batch of ``n`` global crops holds: the static length of the flat buffer of
    masked patch tokens the heads run on."""
    N, k = grid[0] * grid[1], int(n * probability)
    p = torch.linspace(ratio_min_max[0], ratio_min_max[1], k + 1)  # float32, as the collate's
    return int((N * p[1:]).floor().sum())
