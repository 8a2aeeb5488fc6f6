"""The backbone facts declared without torch: the selfsup ViT sizes (``models.vit`` builds them) and the name of a
flow run's frozen feature extractor (``models.sit.FlowEncoder``). ``models`` import them from here and export them as
before, so that what needs only the table (the evaluation configs, ``selfsup eval``'s flags) loads no torch."""

from __future__ import annotations

VIT_SIZES = {
    "vit_nano": dict(embed_dim=32, depth=2, num_heads=2),  # smoke runs; the tests that compare two runs' states
    "vit_micro": dict(embed_dim=128, depth=4, num_heads=4),
    "vit_tiny": dict(embed_dim=192, depth=12, num_heads=3),
    "vit_small": dict(embed_dim=384, depth=12, num_heads=12),  # MoCo v3's ViT-S (12 heads)
    "deit_small": dict(embed_dim=384, depth=12, num_heads=6),  # DeiT-S = DINO's vit_small (6 heads)
    "vit_base": dict(embed_dim=768, depth=12, num_heads=12),
    "vit_large": dict(embed_dim=1024, depth=24, num_heads=16),
    "vit_huge": dict(embed_dim=1280, depth=32, num_heads=16),  # I-JEPA's ViT-H (ijepa vision_transformer.py:479-483)
    "vit_giant2": dict(embed_dim=1536, depth=40, num_heads=24),  # DINOv2's ViT-g (vision_transformer.py:383-396)
}

FLOW_ENCODER = "flow_encoder"
