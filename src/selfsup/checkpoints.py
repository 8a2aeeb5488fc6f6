"""Reading ``.ckpt`` files without running code from them.

A ``.ckpt`` is a pickle, and unpickling an arbitrary file can call any function it names. Every
checkpoint selfsup writes (Lightning's ``last.ckpt``: weights, optimiser state, loop counters,
callback state, the RNG state) holds only dicts, lists, tuples, strings, numbers and tensors, all of
which ``torch.load(weights_only=True)`` accepts without an allow-list of our own
(``EXTRA_SAFE_GLOBALS`` is empty on purpose). A file naming anything else is refused before any of it
runs. Exported ``.safetensors`` files hold no code at all and are the way to share weights.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import torch

from selfsup.errors import UserError

EXTRA_SAFE_GLOBALS: list = []  # nothing beyond torch's own weights-only set: selfsup checkpoints need no more


def load_checkpoint(path: Path, fix: str) -> dict:
    """The contents of the checkpoint ``path``, loaded with ``weights_only=True``; a one-line UserError ending
    in ``fix`` when the file is unreadable, and a refusal naming the foreign object when it holds code."""
    path = Path(path)
    try:
        with torch.serialization.safe_globals(EXTRA_SAFE_GLOBALS), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Detected pickle protocol.*")  # Lightning saves protocol 4
            ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        foreign = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        if foreign:
            raise UserError(f"refusing {path}: it names {foreign.group(1)}, an object selfsup checkpoints "
                            "never hold, which could run code when loaded; use only checkpoints you made, and share "
                            "weights as exported .safetensors") from None
        raise UserError(f"{path} is not a readable selfsup checkpoint ({type(e).__name__}); {fix}") from None
    if not isinstance(ckpt, dict) or not isinstance(ckpt.get("state_dict"), dict):
        raise UserError(f"{path} is not a selfsup checkpoint (no state_dict); {fix}")
    return ckpt
