"""selfsup: self-supervised visual representation learning, faithful to the methods' official code.

Joint-embedding methods (MoCo v3, BYOL, SimSiam, SimCLR with the DirectPred / DirectCopy predictors; Barlow Twins,
VICReg, W-MSE, NNCLR), multi-crop distillation and clustering (DINO, iBOT, SwAV), masked image modelling (MAE) and
the flow family (flow matching, Self-Flow, REPA); the evaluation protocols (weighted kNN, linear probe,
fine-tuning, RankMe, the embedding norm as an OOD signal), the training-dynamics instruments with the collapse
alarm, the theory simulators and the seeds' claims. The command line is ``selfsup`` (``selfsup --help``); a run
from Python is ``selfsup.engine.pretrain(selfsup.config.load_run_config(preset, overrides))``.
"""

__version__ = "0.1.0"
