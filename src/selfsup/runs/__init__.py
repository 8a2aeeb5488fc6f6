"""The application layer beside the engine: opening a run folder (``source``: run folder | .safetensors | .ckpt →
backbone + metadata; a flow run's EMA model) and what is done with it: an evaluation session (``session``), the
protocols run on it (``evaluate``: ``run_knn`` ...), a flow run's samples and their quality (``generation``), an
MAE run's reconstructions (``reconstruct``); and what the engine keeps beside it: the data module (``data``), the
loggers (``loggers``), the console progress (``progress``), the run's facts (``facts``), the resume rules
(``resume``) and the finishing work (``finish``).

From Python::

    from selfsup.eval import KnnConfig
    from selfsup.runs import EvalSession, run_knn
    top1 = run_knn(EvalSession("runs/moco-v3-digits"), KnnConfig(ks=(20,)))["results"]["k=20"]["top1"]
"""

from importlib import import_module

# name → the module that defines it, imported on first use: the run facts and the resume rules (``runs.facts``,
# ``runs.resume``) are read without the methods and Lightning that the evaluation modules import
_WHERE = {"run_all": "evaluate", "run_finetune": "evaluate", "run_knn": "evaluate", "run_linear": "evaluate",
          "run_norms_ood": "evaluate", "run_rankme": "evaluate", "run_segment": "evaluate",
          "GenerationConfig": "generation", "run_generation": "generation", "reconstruct": "reconstruct",
          "EvalSession": "session", "load_flow_run": "source", "load_source": "source"}
__all__ = ["EvalSession", "run_knn", "run_linear", "run_finetune", "run_rankme", "run_norms_ood", "run_segment",
           "run_all", "GenerationConfig", "run_generation", "reconstruct", "load_source", "load_flow_run"]


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(import_module(f"selfsup.runs.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'selfsup.runs' has no attribute {name!r}")
