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

# DINOv3's released backbones (facebookresearch/dinov3 @6876159, hub/backbones.py): every ViT at patch 16 with RoPE
# base 100, "separate" coordinates, train-time rescale 2, LayerScale 1e-5, LayerNorm eps 1e-5 ("layernormbf16"),
# 4 storage tokens and the k bias masked (:199-492); the 7B has no qkv bias, a SwiGLU aligned to 64 and an untied
# local-crop class norm (:450-492). ffn_ratio 6 with SwiGLU is S+ and H+ (:238-274, :411-447).
DINOV3_VIT_SIZES = {
    "dinov3_vits16": dict(embed_dim=384, depth=12, num_heads=6, ffn_ratio=4.0, ffn="mlp"),  # :199-235
    "dinov3_vitsplus16": dict(embed_dim=384, depth=12, num_heads=6, ffn_ratio=6.0, ffn="swiglu"),  # :238-274
    "dinov3_vitb16": dict(embed_dim=768, depth=12, num_heads=12, ffn_ratio=4.0, ffn="mlp"),  # :277-313
    "dinov3_vitl16": dict(embed_dim=1024, depth=24, num_heads=16, ffn_ratio=4.0, ffn="mlp"),  # :316-369
    "dinov3_vitlplus16": dict(embed_dim=1024, depth=24, num_heads=16, ffn_ratio=6.0, ffn="swiglu"),  # :372-408
    "dinov3_vithplus16": dict(embed_dim=1280, depth=32, num_heads=20, ffn_ratio=6.0, ffn="swiglu"),  # :411-447
    "dinov3_vit7b16": dict(embed_dim=4096, depth=40, num_heads=32, ffn_ratio=3.0, ffn="swiglu", ffn_align=64,
                           qkv_bias=False, untie_local_cls_norm=True),  # :450-492
}
# DINOv3's ConvNeXts (models/convnext.py:319-336; hub/backbones.py:495-612: LayerScale 1e-6, no drop path)
DINOV3_CONVNEXT_SIZES = {
    "dinov3_convnext_tiny": dict(depths=(3, 3, 9, 3), dims=(96, 192, 384, 768)),
    "dinov3_convnext_small": dict(depths=(3, 3, 27, 3), dims=(96, 192, 384, 768)),
    "dinov3_convnext_base": dict(depths=(3, 3, 27, 3), dims=(128, 256, 512, 1024)),
    "dinov3_convnext_large": dict(depths=(3, 3, 27, 3), dims=(192, 384, 768, 1536)),
}
