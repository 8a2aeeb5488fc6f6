"""Evaluation of frozen representations: kNN, linear probe, fine-tuning, RankMe, effective rank, norm OOD.

The pure functions are imported here; the runners on a run folder (``run_knn``, ``run_linear``, ``run_finetune``,
``run_rankme``, ``run_norms_ood``, ``run_all``: ``selfsup.eval.api``), ``EvalSession`` and the protocols' configs are
loaded on first use, so that the methods and instruments importing ``selfsup.eval.knn`` do not load the run-folder
machinery (configs, checkpoints) with it.
"""

from selfsup.eval.knn import knn_accuracy, knn_sweep
from selfsup.eval.ood import auroc, norm_scores
from selfsup.eval.spectrum import effective_rank, norm_stats, rankme

_LAZY = {"run_knn": "api", "run_linear": "api", "run_finetune": "api", "run_rankme": "api", "run_norms_ood": "api",
         "run_all": "api", "EvalSession": "session", "KnnConfig": "knn", "ProbeConfig": "linear",
         "FinetuneConfig": "finetune", "SpectrumConfig": "spectrum", "OodConfig": "ood"}

__all__ = ["knn_accuracy", "knn_sweep", "rankme", "effective_rank", "norm_stats", "auroc", "norm_scores", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'selfsup.eval' has no attribute {name!r}")
    from selfsup.eval import api, finetune, knn, linear, ood, session, spectrum

    modules = {"api": api, "session": session, "knn": knn, "linear": linear, "finetune": finetune,
               "spectrum": spectrum, "ood": ood}
    return getattr(modules[_LAZY[name]], name)
