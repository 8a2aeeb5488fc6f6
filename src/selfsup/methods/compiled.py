"""``trainer.compile``: a method's whole step forward compiled as one graph (``compile_step``), or each module of
its step on its own (``compile_step_modules``); ``method`` is a ``methods.base.TrainingBase``."""

from __future__ import annotations

import torch


def compile_step_modules(method, backend: str = "inductor") -> None:
    """``torch.compile`` in place each module of a method's step (``method.step_modules()``: the trainable
    ones and the EMA targets) on its own; parameter names, and so checkpoints and exports, stay as they are.
    The module-by-module variant ``trainer.compile`` replaced by ``compile_step`` (kept for comparison:
    benchmarks/results/NOTES.md, compile_modes)."""
    for module in method.step_modules().values():
        module.compile(backend=backend)


def compile_step(method, backend: str = "inductor", mode: str | None = None,
                 fullgraph: bool = True) -> None:
    """``trainer.compile=true``: the method's whole step forward (``method.step_forward``: ``forward_views`` /
    ``forward_flow``, i.e. the EMA update, every view's backbone and heads, the loss) compiled as one graph,
    per set of view shapes (DINO's global and local crops: one graph holding both resolutions); AOTAutograd
    derives its backward as one graph too. ``fullgraph`` makes a graph break an error instead of a silent split;
    shapes are static (``dynamic=False``): a step's shapes do not change between steps. Only the instance's
    method is replaced: modules, parameter names, checkpoints and exports stay as they are."""
    name = method.step_forward
    if name is None:  # a family whose step forward draws from the step's generator (flow): module by module
        compile_step_modules(method, backend)
        return
    if name in vars(method):  # compiled already (a second fit of the same module)
        return
    if method.momentum_pairs and method._ema_params is None:  # gathered outside the graph (no lazy state inside)
        method._ema_params = method.ema_params()
    setattr(method, name, torch.compile(getattr(method, name), backend=backend, mode=mode, fullgraph=fullgraph,
                                        dynamic=False))
