"""selfsup: self-supervised visual representation learning, faithful to the methods' official code.

Joint-embedding methods (MoCo v3, BYOL, SimSiam, SimCLR with the DirectPred / DirectCopy predictors; Barlow Twins,
VICReg, W-MSE, NNCLR), multi-crop distillation and clustering (DINO, iBOT, DINOv2, SwAV), masked image modelling
(MAE) and the flow family (flow matching, Self-Flow, REPA); the evaluation protocols (weighted kNN, linear probe,
fine-tuning, RankMe, the embedding norm as an OOD signal), the training-dynamics instruments with the collapse
alarm, the theory simulators and the seeds' claims. The command line is ``selfsup`` (``selfsup --help``); from
Python, the same code: ``run = selfsup.pretrain("simclr-digits", trainer={"max_epochs": 1})`` and
``selfsup.evaluate(run, "knn")`` (``selfsup.api``).
"""

__version__ = "0.1.0"
__all__ = ["pretrain", "evaluate", "embed", "method", "Run", "__version__"]


def __getattr__(name: str):
    """``selfsup.pretrain``, ``selfsup.evaluate``, ``selfsup.embed``, ``selfsup.method`` and ``selfsup.Run`` from
    ``selfsup.api``,
    imported on first use (so ``import selfsup`` and ``selfsup --version`` stay light)."""
    if name in ("pretrain", "evaluate", "embed", "method", "Run"):
        from selfsup import api

        return getattr(api, name)
    raise AttributeError(f"module 'selfsup' has no attribute {name!r}")
