"""I-JEPA's multi-block masks (facebookresearch/ijepa ``src/masks/multiblock.py`` ``MaskCollator``), a whole batch
at once.

Official behaviour (file:line in docs/JEPA.md §1), per batch of B images on an H × W patch grid:

* two block sizes for the whole batch, from one uniform draw each (:55-72 ``_sample_block_size``, called at
  :128-135): the target ("pred") size with ``pred_mask_scale`` and ``aspect_ratio``, then the context ("enc")
  size with ``enc_mask_scale`` and aspect ratio (1, 1); the same draw u sets both the scale ``s = lo + u (hi −
  lo)`` and the aspect ratio ``a = lo + u (hi − lo)``; ``max_keep = int(H W s)``, ``h = round(√(max_keep a))``,
  ``w = round(√(max_keep / a))``, each lowered until ``h < H`` and ``w < W``;
* per image, ``npred`` target blocks at a uniform position, ``top ~ randint(0, H − h)`` and ``left ~ randint(0,
  W − w)`` (torch.randint's upper end is exclusive: a block never touches the last row or column) (:89-92);
  then ``nenc`` context blocks of the context size, each restricted to the complement of every target block
  unless ``allow_overlap`` (:150-162, ``constrain_mask`` :77-81); a block is accepted when it keeps more than
  ``min_keep`` patches (:98); after every 20 refused attempts one more target block is dropped from the
  restriction, the last first (``tries``, :99-104);
* the patch indices of each block in ascending order (``torch.nonzero`` of the flattened mask, :96), truncated
  over the batch to the shortest target block and the shortest context block (:164-168).

Here every block of the batch is drawn at once: the two sizes from two uniforms of a host generator seeded by the
step alone (the same sizes on every process, as the code's), then, from the step's and the process's seed, every
target position, then for each context block the ``20 · npred + 1`` attempts the official
loop can need (after ``20 · npred`` refusals no restriction is left, and the next attempt either is accepted or
never will be), of which the first accepted one is taken. The draws are made on the host (a small integer
problem, as the official collator's in its loader workers), so the index lengths, which set the step's shapes,
are known without reading the device. A configuration whose blocks can never keep more than ``min_keep``
patches (the official loop then never ends) is refused with one line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

TIMEOUT = 20  # refused attempts before one restriction is dropped (multiblock.py:85)


@dataclass(frozen=True)
class MultiBlockDraws:
    """The random numbers one batch's masks are made of, by role (the replay a reference reads them from)."""

    u: Tensor  # (2,) uniforms: the target size's, then the context size's
    pred_top: Tensor  # (B, npred) int
    pred_left: Tensor  # (B, npred)
    enc_top: Tensor  # (B, nenc, attempts)
    enc_left: Tensor  # (B, nenc, attempts)


def block_size(u: float, scale: tuple[float, float], aspect_ratio: tuple[float, float],
               grid: tuple[int, int]) -> tuple[int, int]:
    """``_sample_block_size`` (multiblock.py:55-72) for the uniform draw ``u``: (h, w) in patches."""
    H, W = grid
    s = scale[0] + u * (scale[1] - scale[0])
    max_keep = int(H * W * s)
    a = aspect_ratio[0] + u * (aspect_ratio[1] - aspect_ratio[0])
    h, w = int(round(math.sqrt(max_keep * a))), int(round(math.sqrt(max_keep / a)))
    return min(h, H - 1), min(w, W - 1)  # the official ``while h >= H: h -= 1``


def smallest_block(scale, aspect_ratio, grid: tuple[int, int]) -> int:
    """The fewest patches a block of ``scale`` and ``aspect_ratio`` holds over the draw u in [0, 1] (on a grid of
    1001 values of u and its ends): a block that can hold ``min_keep`` or fewer makes the official loop endless."""
    return min(h * w for h, w in (block_size(u, tuple(scale), tuple(aspect_ratio), grid)
                                  for u in torch.linspace(0, 1, 1001).tolist()))


def enc_attempts(npred: int, allow_overlap: bool) -> int:
    """Attempts drawn per context block: ``20 · npred + 1`` (after ``20 · npred`` refusals no restriction is
    left); 1 when the blocks may overlap (no restriction: the first attempt is accepted or none is)."""
    return 1 if allow_overlap else TIMEOUT * npred + 1


def draw_multiblock(batch: int, grid: tuple[int, int], generator: torch.Generator, pred_scale, enc_scale,
                    aspect_ratio, npred: int, nenc: int, allow_overlap: bool,
                    size_generator: torch.Generator | None = None) -> MultiBlockDraws:
    """Every random number of one batch's masks, from ``generator`` (CPU), in a fixed order: the two size
    uniforms (from ``size_generator`` where given: the code seeds them with the iteration counter, the same on
    every process, :125-127), the target positions, the context attempts' positions."""
    H, W = grid
    u = torch.rand(2, generator=size_generator or generator)  # float32, as ``torch.rand(1).item()`` (:56)
    uu = u.numpy()  # host values without a tensor read
    ph, pw = block_size(float(uu[0]), tuple(pred_scale), tuple(aspect_ratio), grid)
    eh, ew = block_size(float(uu[1]), tuple(enc_scale), (1.0, 1.0), grid)
    t = enc_attempts(npred, allow_overlap)
    return MultiBlockDraws(
        u=u,
        pred_top=torch.randint(0, H - ph, (batch, npred), generator=generator),
        pred_left=torch.randint(0, W - pw, (batch, npred), generator=generator),
        enc_top=torch.randint(0, H - eh, (batch, nenc, t), generator=generator),
        enc_left=torch.randint(0, W - ew, (batch, nenc, t), generator=generator))


def _blocks(top: np.ndarray, left: np.ndarray, h: int, w: int, grid: tuple[int, int]) -> np.ndarray:
    """(..., H, W) bool rectangles of h × w patches at (top, left)."""
    H, W = grid
    rows, cols = np.arange(H).reshape(H, 1), np.arange(W).reshape(1, W)
    t, le = top[..., None, None], left[..., None, None]
    return (rows >= t) & (rows < t + h) & (cols >= le) & (cols < le + w)


def first_indices(mask: np.ndarray, k: int) -> np.ndarray:
    """(n, k) the ascending indices of the first ``k`` True entries of each row of the (n, L) bool ``mask``
    (``torch.nonzero(mask)[:k]`` per row; every row holds at least ``k``)."""
    return np.argsort(~mask, axis=1, kind="stable")[:, :k]


def multiblock_masks(draws: MultiBlockDraws, grid: tuple[int, int], pred_scale, enc_scale, aspect_ratio,
                     min_keep: int, allow_overlap: bool) -> tuple[Tensor, Tensor]:
    """(context indices (nenc, B, K_enc), target indices (npred, B, K_pred)) from ``draws``: the official
    collator's ``collated_masks_enc`` / ``collated_masks_pred`` (lists of (B, K) tensors) stacked. Raises
    ValueError where the official loop would never end. Computed in numpy on the host (no tensor value is read
    back: nothing here waits for a device)."""
    H, W = grid
    u = draws.u.numpy()
    pred_top, pred_left = draws.pred_top.numpy(), draws.pred_left.numpy()
    enc_top, enc_left = draws.enc_top.numpy(), draws.enc_left.numpy()
    B, npred = pred_top.shape
    nenc = enc_top.shape[1]
    ph, pw = block_size(float(u[0]), tuple(pred_scale), tuple(aspect_ratio), grid)
    eh, ew = block_size(float(u[1]), tuple(enc_scale), (1.0, 1.0), grid)
    if ph * pw <= min_keep:
        raise ValueError(f"a target block of {ph}x{pw} patches never keeps more than min_keep={min_keep}")
    pred = _blocks(pred_top, pred_left, ph, pw, grid)  # (B, npred, H, W)
    enc = _blocks(enc_top, enc_left, eh, ew, grid)  # (B, nenc, T, H, W)
    T = enc.shape[2]
    if allow_overlap:
        kept = enc
    else:
        # allowed[j]: the complement of the first j target blocks (j = 0: everything)
        allowed = np.logical_and.accumulate(np.concatenate([np.ones((B, 1, H, W), dtype=bool), ~pred], axis=1),
                                            axis=1)
        regions = np.clip(npred - np.arange(T) // TIMEOUT, 0, None)  # blocks restricting attempt a
        kept = enc & allowed[:, regions][:, None]  # (B, nenc, T, H, W)
    ok = kept.reshape(B, nenc, T, H * W).sum(-1) > min_keep
    if not ok.any(axis=2).all():
        raise ValueError(f"a context block of {eh}x{ew} patches never keeps more than min_keep={min_keep}")
    first = ok.argmax(axis=2)  # the first accepted attempt
    chosen = np.take_along_axis(kept, first[:, :, None, None, None], axis=2)[:, :, 0]  # (B, nenc, H, W)
    k_enc = int(chosen.reshape(B, nenc, H * W).sum(-1).min())
    enc_idx = first_indices(chosen.transpose(1, 0, 2, 3).reshape(nenc * B, H * W), k_enc).reshape(nenc, B, k_enc)
    k_pred = ph * pw
    pred_idx = first_indices(pred.transpose(1, 0, 2, 3).reshape(npred * B, H * W), k_pred).reshape(npred, B, k_pred)
    return torch.from_numpy(enc_idx).long(), torch.from_numpy(pred_idx).long()
