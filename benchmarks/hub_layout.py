"""A checkpoint in the DINOv2 torch.hub layout without the download: timm's DINOv2 ViT (random values) turned into
``dinov2_vit{s,b,l,g}14[_reg4]_pretrain.pth``'s keys and shapes. tests/test_weights.py checks the inverse against
timm's own filter; the GPU session (``benchmarks.distill_presets``) writes one where the real file cannot be fetched.
The values are random: a file to check a loading path, sizes and speed with, not a teacher.

    python -m benchmarks.hub_layout /tmp/dinov2_vits14_pretrain.pth
    python -m benchmarks.hub_layout /tmp/dinov2_vitb14_reg4_pretrain.pth --model vit_base_patch14_reg4_dinov2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch


def hub_layout(timm_state: dict, seed: int = 0) -> dict:
    """The DINOv2 torch.hub layout of a timm DINOv2 state dict: the inverse of timm's ``_convert_dinov2`` (timm
    models/vision_transformer.py): ``mask_token`` back (zeros; the hub models carry one), a registers model's
    ``reg_token`` → ``register_tokens`` and its class position split back out of ``cls_token`` (any class row c:
    cls = timm's cls − c), SwiGLU ``fc1/fc2`` → ``w12/w3``."""
    out = {}
    for k, v in timm_state.items():
        out[k.replace("mlp.fc1.", "mlp.w12.").replace("mlp.fc2.", "mlp.w3.") if "w12" in k else k] = v.clone()
    D = out["cls_token"].shape[-1]
    if "reg_token" in out:
        c = torch.randn(1, 1, D, generator=torch.Generator().manual_seed(seed)) * 0.02
        out["register_tokens"] = out.pop("reg_token")
        out["cls_token"] = out["cls_token"] - c
        out["pos_embed"] = torch.cat([c, out["pos_embed"]], dim=1)
    out["mask_token"] = torch.zeros(1, D)
    return out


def write_hub_checkpoint(path: str | Path, model: str = "vit_small_patch14_dinov2", seed: int = 0) -> Path:
    """``path``: timm's ``model`` (random init at its 518 px: a 37 x 37 + 1 position table, LayerScale, the mask
    token) in the hub layout, as ``torch.save`` writes the official files (a plain state dict)."""
    import timm

    torch.manual_seed(seed)
    ref = timm.create_model(model, pretrained=False, num_classes=0)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(hub_layout(ref.state_dict(), seed), path)
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", help="the file to write (torch.save of the state dict)")
    p.add_argument("--model", default="vit_small_patch14_dinov2", help="timm's DINOv2 model whose shapes to take")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(f"wrote {write_hub_checkpoint(args.path, args.model, args.seed)} (random values)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
