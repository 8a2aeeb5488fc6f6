"""The registry: ``method.name`` in a config picks one of ``METHODS`` (both families, a literal mapping).

Each family's base class answers what the builder and evaluation ask of a method, so neither names a
family: ``data_info(cfg, dataset)``, ``backbone_meta(cfg, info)``, ``backbone_state(state_dict)``
(``SSLMethod`` for the joint-embedding methods, ``FlowMatching`` for the flow methods).
"""

from selfsup.methods.barlow_twins import BarlowTwins
from selfsup.methods.base import DataInfo, SSLMethod
from selfsup.methods.byol import BYOL
from selfsup.methods.dino import DINO
from selfsup.methods.dinov2 import DINOv2
from selfsup.methods.dinov3 import DINOv3
from selfsup.methods.distill import Distill
from selfsup.methods.distill_dinov2 import DistillDINOv2
from selfsup.methods.flow import FlowMatching, Repa, SelfFlow
from selfsup.methods.ibot import iBOT
from selfsup.methods.ijepa import IJEPA
from selfsup.methods.lejepa import LeJEPA
from selfsup.methods.mae import MAE
from selfsup.methods.moco_v2 import MoCoV2
from selfsup.methods.moco_v3 import MoCoV3
from selfsup.methods.nnclr import NNCLR
from selfsup.methods.simclr import SimCLR
from selfsup.methods.simsiam import SimSiam
from selfsup.methods.swav import SwAV
from selfsup.methods.tico import TiCo
from selfsup.methods.vicreg import VICReg
from selfsup.methods.wmse import WMSE

METHODS: dict[str, type] = {
    "moco_v3": MoCoV3,
    "byol": BYOL,
    "simsiam": SimSiam,
    "simclr": SimCLR,
    "barlow_twins": BarlowTwins,
    "vicreg": VICReg,
    "dino": DINO,
    "swav": SwAV,
    "wmse": WMSE,
    "nnclr": NNCLR,
    "ibot": iBOT,
    "dinov2": DINOv2,
    "dinov3": DINOv3,
    "mae": MAE,
    "ijepa": IJEPA,
    "lejepa": LeJEPA,
    "moco_v2": MoCoV2,
    "tico": TiCo,
    "distill": Distill,
    "distill_dinov2": DistillDINOv2,
    "flow_matching": FlowMatching,
    "self_flow": SelfFlow,
    "repa": Repa,
}


def registered_name(method_cfg) -> str:
    """The registered name of the method whose Config is exactly ``type(method_cfg)`` (``RunConfig.method_name``
    holds it for a run's config)."""
    for name, cls in METHODS.items():
        if type(method_cfg) is cls.Config:
            return name
    raise KeyError(f"{type(method_cfg).__name__} is the Config of no registered method")


__all__ = ["METHODS", "DataInfo", "SSLMethod", "registered_name", "MoCoV3", "BYOL", "SimSiam", "SimCLR", "BarlowTwins",
           "VICReg", "DINO", "DINOv2", "SwAV", "WMSE", "NNCLR", "iBOT", "MAE", "IJEPA", "LeJEPA", "Distill",
           "DistillDINOv2", "FlowMatching", "SelfFlow", "Repa", "MoCoV2", "TiCo"]
