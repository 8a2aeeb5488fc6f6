"""The step contract: what a method's step forward (``forward_views`` / ``forward_flow``) returns, and how a
callback finds it in the outputs Lightning hands it.

The training step returns Lightning's ``{"loss": loss, "step": StepOutput}``; every callback (instruments, online
evaluators) reads the :class:`StepOutput`'s attributes (:func:`step_output`), so the names a method fills and the
ones an instrument reads are the same Python attributes, not strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor


@dataclass
class StepOutput:
    """One step forward's result: the loss (with its graph) and, detached, what the instruments read.

    ``embedding`` / ``embedding2``: the evaluated backbone's features of the first two views (``EmbeddingNorms``,
    ``Alignment``, the online probe); ``projection``, ``prediction`` and ``target``: the heads' outputs of view 1
    and the prediction's target (``EmbeddingNorms``, ``Alignment``, ``PredictorAlignment``). ``scalars``: the
    method's own values (0-d tensors or floats), logged as ``train/<name>`` at logging steps (iBOT's loss terms,
    the flow loss per noise level). ``instruments``: the method's collapse signs (0-d tensors), logged under
    ``instruments/`` every ``instruments.every_n_steps`` (DINO's teacher entropy). ``labels``: the batch's labels,
    set by the training step."""

    loss: Tensor
    embedding: Tensor | None = None
    embedding2: Tensor | None = None
    projection: Tensor | None = None
    prediction: Tensor | None = None
    target: Tensor | None = None
    scalars: dict[str, Tensor | float] = field(default_factory=dict)
    instruments: dict[str, Tensor] = field(default_factory=dict)
    labels: Tensor | None = None


def step_output(outputs) -> StepOutput | None:
    """The :class:`StepOutput` in the outputs of a training step (Lightning's ``on_train_batch_end(outputs)``);
    None where the step returned none (a module other than a selfsup method)."""
    out = outputs.get("step") if isinstance(outputs, dict) else None
    return out if isinstance(out, StepOutput) else None
