"""The application layer beside the engine: opening a run folder (``source``: run folder | .safetensors | .ckpt →
backbone + metadata; a flow run's EMA model) and what is done with it: an evaluation session (``session``), the
protocols run on it (``evaluate``: ``run_knn`` ...), a flow run's samples and their quality (``generation``), an
MAE run's reconstructions (``reconstruct``), and the end-of-run report the engine prints (``finish``).

From Python::

    from selfsup.eval import KnnConfig
    from selfsup.runs import EvalSession, run_knn
    top1 = run_knn(EvalSession("runs/moco-v3-digits"), KnnConfig(ks=(20,)))["results"]["k=20"]["top1"]
"""

from selfsup.runs.evaluate import run_all, run_finetune, run_knn, run_linear, run_norms_ood, run_rankme
from selfsup.runs.generation import GenerationConfig, run_generation
from selfsup.runs.reconstruct import reconstruct
from selfsup.runs.session import EvalSession
from selfsup.runs.source import load_flow_run, load_source

__all__ = ["EvalSession", "run_knn", "run_linear", "run_finetune", "run_rankme", "run_norms_ood", "run_all",
           "GenerationConfig", "run_generation", "reconstruct", "load_source", "load_flow_run"]
