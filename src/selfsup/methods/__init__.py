"""Methods registered by name: ``method.name`` in a config picks one."""

from selfsup.methods.base import DataInfo, SSLMethod
from selfsup.methods.byol import BYOL
from selfsup.methods.mae import MAE
from selfsup.methods.moco_v3 import MoCoV3
from selfsup.methods.simclr import SimCLR
from selfsup.methods.simsiam import SimSiam

METHODS: dict[str, type] = {"moco_v3": MoCoV3, "byol": BYOL, "simsiam": SimSiam, "simclr": SimCLR, "mae": MAE}

import selfsup.flow.methods  # noqa: E402,F401  (registers the generative family: flow_matching, self_flow, repa)


def method_name(method_cfg) -> str:
    """The registered name of the method whose Config ``method_cfg`` is."""
    return next(name for name, cls in METHODS.items() if isinstance(method_cfg, cls.Config))


__all__ = ["METHODS", "DataInfo", "SSLMethod", "method_name", "MoCoV3", "BYOL", "SimSiam", "SimCLR", "MAE"]
