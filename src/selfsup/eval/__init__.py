"""Evaluation of frozen representations."""

from selfsup.eval.knn import knn_accuracy

__all__ = ["knn_accuracy"]
