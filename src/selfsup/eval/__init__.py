"""The evaluation protocols of frozen representations, pure: a backbone or its features in, numbers out (kNN, linear
probe, fine-tuning, RankMe / effective rank, norm OOD, an MAE's reconstructions, the segmentation of the patch
features), each with its typed config.

Opening a run folder and running a protocol on it (``EvalSession``, ``run_knn``, ``run_linear``, ...) is the
application layer's: :mod:`selfsup.runs`.
"""

from selfsup.eval.finetune import FinetuneConfig
from selfsup.eval.knn import KnnConfig, knn_accuracy, knn_sweep
from selfsup.eval.linear import ProbeConfig
from selfsup.eval.ood import OodConfig, auroc, norm_scores
from selfsup.eval.segment import SegmentConfig
from selfsup.eval.spectrum import SpectrumConfig, effective_rank, norm_stats, rankme

__all__ = ["knn_accuracy", "knn_sweep", "rankme", "effective_rank", "norm_stats", "auroc", "norm_scores",
           "KnnConfig", "ProbeConfig", "FinetuneConfig", "SpectrumConfig", "OodConfig",
           "SegmentConfig"]
