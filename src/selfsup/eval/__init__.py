"""Evaluation of frozen representations: kNN, linear probe, fine-tuning, RankMe, effective rank, norm OOD."""

from selfsup.eval.knn import knn_accuracy, knn_sweep
from selfsup.eval.ood import auroc, norm_scores
from selfsup.eval.spectrum import effective_rank, norm_stats, rankme

__all__ = ["knn_accuracy", "knn_sweep", "rankme", "effective_rank", "norm_stats", "auroc", "norm_scores"]
