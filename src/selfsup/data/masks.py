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
    n, (H, W), dev = ratio.shape[0], grid, ratio.device
    rounds = H * W if max_blocks is None else max_blocks  # H · W: enough for any ratio
    low = float((min(H, W) // 3) ** 2)
    log_lo, log_hi = math.log(aspect_ratio[0]), math.log(aspect_ratio[1])
    high = ratio.float() * H * W
    mask = torch.zeros(n, H, W, dtype=torch.bool, device=dev)
    count = torch.zeros(n, device=dev)
    active = count < high  # the official ``while mask_count < high``
    rows = torch.arange(H, device=dev).view(1, H, 1)
    cols = torch.arange(W, device=dev).view(1, 1, W)
    sample = torch.arange(n, device=dev)
    for _ in range(rounds):
        remaining = (high - count)[:, None]  # max_mask_patches
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
    """(n, H, W) bool iBOT masks (True = masked) of ``n`` crops: ratios by :func:`prediction_ratios`, then
    :func:`block_masks` or :func:`random_masks`."""
    ratio = prediction_ratios(n, pred_ratio, pred_ratio_var, generator, device)
    if shape == "rand":
        return random_masks(ratio, grid, generator)
    if max_blocks is None:
        max_blocks = default_max_blocks(grid, pred_ratio, pred_ratio_var)
    return block_masks(ratio, grid, generator, aspect_ratio, max_blocks)
