"""selfsup: self-supervised visual representation learning (MoCo v3, BYOL, SimSiam, SimCLR)."""

__version__ = "0.1.0"
