"""Training-dynamics instruments: Lightning callbacks that read the step's output (``selfsup.step.StepOutput``)
and the gradients.

They never change training: everything they read is detached, they draw no random numbers from the
global generators, and a module they put in eval mode is put back. Every value is logged under
``instruments/`` (every logger of ``trainer.loggers``); the detectors also append to ``RUN/events.jsonl``.
Steps are 0-based optimiser-step indices (the step whose gradient or output is measured), as in the
``step`` column Lightning writes; the values go straight to the loggers (``log_metrics``).
"""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import Tensor, nn

from selfsup.eval.features import extract_features
from selfsup.eval.spectrum import effective_rank, rankme
from selfsup.instruments.collapse import CollapseAlarm
from selfsup.instruments.detectors import (SpikeDetector, event_log, log_metrics, measured_step, report_collapse,
                                           report_event, stepped)
from selfsup.instruments.measures import (QUANTILES, batch_dim_std, batch_effective_rank, misalignment, norm_summary,
                                          per_dim_std, predictor_alignment)
from selfsup.step import StepOutput, step_output

NORM_KEYS = ("embedding", "projection", "prediction")
TENSORS = {f.name for f in fields(StepOutput)} - {"loss", "scalars", "instruments", "labels"}


def step_tensors(names) -> tuple[str, ...]:
    """``names`` checked to be the StepOutput's detached tensors (a misspelt one would never be measured)."""
    unknown = set(names) - TENSORS
    if unknown:
        raise ValueError(f"{sorted(unknown)} are no StepOutput tensors; use some of {sorted(TENSORS)}")
    return tuple(names)


class EmbeddingNorms(pl.Callback):
    """Every N steps: mean and 10/50/90% quantiles of ‖·‖ of the backbone features (``embedding``),
    projector outputs (``projection``) and predictor outputs (``prediction``) of the step's batch.
    At the end of fit the last measured norms are written to ``RUN/embedding_norms.pt`` (for histograms)."""

    def __init__(self, every_n_steps: int = 10, keys=NORM_KEYS, run_dir: str | Path | None = None):
        super().__init__()
        self.every, self.keys, self.run_dir = every_n_steps, step_tensors(keys), run_dir
        self.last: dict[str, Tensor] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        out = step_output(outputs)
        if out is None or measured_step(trainer) % self.every or not stepped(trainer):
            return
        values = {}
        for key in self.keys:
            x = getattr(out, key)
            if isinstance(x, Tensor) and x.ndim == 2:
                self.last[key] = x.detach().float().norm(dim=1)
                summary = norm_summary(x)
                values[f"norm_{key}_mean"] = summary[0]
                for q, v in zip(QUANTILES, summary[1:]):
                    values[f"norm_{key}_q{int(q * 100)}"] = v
        log_metrics(trainer, values, measured_step(trainer))

    def state_dict(self) -> dict:
        return {"last": {k: v.detach().cpu() for k, v in self.last.items()}}

    def load_state_dict(self, state_dict: dict) -> None:
        self.last = dict(state_dict.get("last", {}))

    def on_fit_end(self, trainer, pl_module) -> None:
        if trainer.is_global_zero and self.last:
            path = Path(self.run_dir or trainer.default_root_dir) / "embedding_norms.pt"
            torch.save({k: v.cpu() for k, v in self.last.items()}, path)


def layer_groups(module: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Trainable parameters by group: ``all``; the network's ``patch_embed`` (ViT patch projection, ResNet
    conv1/bn1, a flow model's x_embedder), ``first_block`` and ``last_block`` (ViT / SiT blocks, ResNet stages)
    of ``backbone`` (or a flow method's ``student``); one group per other top-level child with trainable
    parameters (the heads, e.g. ``projector``, ``predictor``)."""
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    groups: dict[str, list[nn.Parameter]] = {"all": [p for _, p in named]}
    block = re.compile(r"(?:backbone|student)\.(?:blocks\.|layer)(\d+)\.")
    ids = sorted({int(m.group(1)) for n, _ in named if (m := block.match(n))})
    stems = tuple(f"{net}.{stem}." for net in ("backbone", "student")
                  for stem in ("patch_embed", "conv1", "bn1", "x_embedder"))
    rules = [("patch_embed", lambda n: n.startswith(stems))]
    if ids:
        rules += [("first_block", lambda n, i=ids[0]: (m := block.match(n)) is not None and int(m.group(1)) == i),
                  ("last_block", lambda n, i=ids[-1]: (m := block.match(n)) is not None and int(m.group(1)) == i)]
    for name, rule in rules:
        params = [p for n, p in named if rule(n)]
        if params:
            groups[name] = params
    for child in dict.fromkeys(n.split(".")[0] for n, _ in named):
        if child not in ("backbone", "student"):
            groups[child] = [p for n, p in named if n.split(".")[0] == child]
    return groups


class GradientNorms(pl.Callback):
    """Global and per-group L2 / L∞ gradient norms of every step, read in ``on_before_optimizer_step``
    (after Lightning unscales mixed-precision gradients, before clipping), with a spike detector on each
    group's L2 norm. Norms stay on the device and are read back every N steps (one host sync), when they
    are logged (the values of that step) and fed, step by step, to the detectors."""

    def __init__(self, every_n_steps: int = 10, spike_k: float = 10.0, spike_window: int = 100,
                 spike_min_history: int = 20, spikes: bool = True, run_dir: str | Path | None = None):
        super().__init__()
        self.every, self.spikes, self.run_dir = every_n_steps, spikes, run_dir
        self.detector_args = dict(k=spike_k, window=spike_window, min_history=spike_min_history)
        self.groups: dict[str, list[nn.Parameter]] | None = None
        self.detectors: dict[str, SpikeDetector] = {}
        self._pending_state: dict | None = None
        self._pending_buffer: list[tuple[int, Tensor]] = []  # restored from a checkpoint, until the first step
        self.buffer: list[tuple[int, Tensor]] = []
        self.events: list[dict] = []
        self._last_spike: dict[str, int] = {}  # per group: the step of the last spike (console lines name a run once)

    def _norms(self) -> Tensor:
        """(groups, 2): L2 and L∞ of each group, one norm per parameter computed once."""
        params = self.groups["all"]
        have = [i for i, p in enumerate(params) if p.grad is not None]
        if not have:
            return torch.zeros(len(self.groups), 2)
        grads = [params[i].grad for i in have]
        l2 = torch.zeros(len(params), device=grads[0].device)
        linf = torch.zeros(len(params), device=grads[0].device)
        index = torch.tensor(have, device=grads[0].device)
        l2[index] = torch.stack(torch._foreach_norm(grads, 2.0)).float()
        linf[index] = torch.stack(torch._foreach_norm(grads, float("inf"))).float()
        rows = [torch.stack([l2[idx].square().sum().sqrt(), linf[idx].max()]) for idx in self._index]
        return torch.stack(rows)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if self.groups is None:
            self.groups = layer_groups(pl_module)
            position = {id(p): i for i, p in enumerate(self.groups["all"])}
            device = self.groups["all"][0].device
            self._index = [torch.tensor([position[id(p)] for p in ps], device=device) for ps in self.groups.values()]
            self.detectors = {g: SpikeDetector(**self.detector_args) for g in self.groups}
            if self._pending_state:
                for g, s in self._pending_state.items():
                    if g in self.detectors:
                        self.detectors[g].load_state_dict(s)
            device = self.groups["all"][0].device
            self.buffer = [(s, v.to(device)) for s, v in self._pending_buffer] + self.buffer
            self._pending_buffer = []
        step = trainer.global_step
        norms = self._norms()
        self.buffer.append((step, norms[:, 0]))
        if step % self.every == 0:
            values = {}
            for g, (l2, linf) in zip(self.groups, norms):
                suffix = "" if g == "all" else f"_{g}"
                values[f"grad_l2{suffix}"], values[f"grad_linf{suffix}"] = l2, linf
            log_metrics(trainer, values, step)
            self.flush(trainer)

    def flush(self, trainer) -> None:
        """Read the buffered norms back (one sync) and run the detectors over them in step order."""
        if not self.buffer:
            return
        steps = [s for s, _ in self.buffer]
        values = torch.stack([v for _, v in self.buffer]).cpu().tolist()
        self.buffer.clear()
        if not self.spikes:
            return
        log = event_log(trainer, self.run_dir) if trainer.is_global_zero else None
        for step, row in zip(steps, values):
            for g, value in zip(self.groups, row):
                base = self.detectors[g].update(value)
                if base is not None and log is not None:
                    event = log.write(step, "grad_spike", value, base[0], threshold=base[1], group=g)
                    self.events.append(event)
                    if self._last_spike.get(g) != step - 1:  # the console names a run of spikes once
                        report_event(event)
                if base is not None:
                    self._last_spike[g] = step

    def on_train_end(self, trainer, pl_module) -> None:
        self.flush(trainer)

    def before_checkpoint(self, trainer) -> None:
        """Called by ``RunCheckpoints`` before each write: the buffered norms are read and detected first, so the
        events of the steps a checkpoint holds are in events.jsonl when it is (a resume truncates the file at its
        step)."""
        self.flush(trainer)

    def state_dict(self) -> dict:
        """The detectors' windows and the norms buffered since the last read (a resumed run reads them at the
        same step as an uninterrupted one, so events.jsonl and metrics.csv are the same)."""
        return {"detectors": {g: d.state_dict() for g, d in self.detectors.items()},
                "buffer": [(int(s), v.detach().cpu()) for s, v in self.buffer],
                "last_spike": dict(self._last_spike)}

    def load_state_dict(self, state_dict: dict) -> None:
        if "detectors" not in state_dict:  # a checkpoint of an earlier version: the detectors only
            state_dict = {"detectors": state_dict}
        self._pending_state = state_dict["detectors"]
        self._pending_buffer = list(state_dict.get("buffer", []))
        self._last_spike = dict(state_dict.get("last_spike", {}))


class Alignment(pl.Callback):
    """Every N steps: mean ``1 − cos`` of each (a, b) pair of the StepOutput's tensors that the step filled: by
    default the prediction and its target (BYOL, SimSiam, MoCo v3 positives; any method giving both) and the two
    views' backbone features."""

    def __init__(self, every_n_steps: int = 10, pairs=(("prediction", "target"), ("embedding", "embedding2"))):
        super().__init__()
        self.every, self.pairs = every_n_steps, tuple(step_tensors(p) for p in pairs)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        out = step_output(outputs)
        if out is None or measured_step(trainer) % self.every or not stepped(trainer):
            return
        values = {f"align_{a}_{b}": misalignment(getattr(out, a), getattr(out, b)) for a, b in self.pairs
                  if getattr(out, a) is not None and getattr(out, b) is not None}
        log_metrics(trainer, values, measured_step(trainer))


class StepInstruments(pl.Callback):
    """Every N steps: the collapse signs a method reports in its StepOutput's ``instruments`` (name → 0-d tensor
    on the device, e.g. DINO's teacher-output entropy, KL(teacher ‖ student) and centre norm), read in one copy.
    With a ``CollapseAlarm`` (``instruments.collapse_alarm``) it also measures the effective rank of the step's
    backbone features (``eff_rank_batch``, joint-embedding methods) and feeds the read values to the alarm, which
    judges them once the lr warm-up is over: a sign that fires becomes a ``collapse`` event and one console line
    naming the method's remedies."""

    def __init__(self, every_n_steps: int = 10, alarm: CollapseAlarm | None = None, run_dir: str | Path | None = None):
        super().__init__()
        self.every, self.alarm, self.run_dir = every_n_steps, alarm, run_dir

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        out = step_output(outputs)
        if out is None or measured_step(trainer) % self.every or not stepped(trainer):
            return
        values = {k: v for k, v in (out.instruments or {}).items() if isinstance(v, (Tensor, float, int))}
        if self.alarm is not None and out.embedding is not None and pl_module.family == "joint":
            values["eff_rank_batch"] = batch_effective_rank(out.embedding)
            if out.projection is not None:
                values["dim_std_projection_batch"] = batch_dim_std(out.projection)
        read = log_metrics(trainer, values, measured_step(trainer))
        if self.alarm is None or not read:
            return
        judge = measured_step(trainer) >= pl_module.warmup_steps()  # not while the lr warms up (collapse.py)
        for sign, value, compared in self.alarm.observe(read, judge):
            event = event_log(trainer, self.run_dir).write(
                measured_step(trainer), "collapse", compared, sign.threshold, sign=sign.name, raw=value,
                meaning=sign.meaning, window=self.alarm.window, remedy=pl_module.collapse_remedy)
            report_collapse(event)

    def state_dict(self) -> dict:
        return {"alarm": self.alarm.state_dict()} if self.alarm is not None else {}

    def load_state_dict(self, state_dict: dict) -> None:
        if self.alarm is not None and "alarm" in state_dict:
            self.alarm.load_state_dict(state_dict["alarm"])


class RankCollapse(pl.Callback):
    """Every N steps, on a fixed batch of un-augmented training images in eval mode: RankMe, effective rank (PCs
    for 99% of the variance), the per-dimension std of the L2-normalised features and the mean L2 norm
    (``eval_norm_<key>_mean``, the embedding-norm paper's measurement) of the evaluated backbone (``eval_backbone``:
    the online one, DINO's teacher) and, when the method has a ``projector`` (and a ``predictor``), of their outputs.
    Joint-embedding methods only (the module's declared ``family`` is ``joint``)."""

    def __init__(self, every_n_steps: int = 100, samples: int = 512, seed: int = 0, dataset=None):
        super().__init__()
        self.every, self.samples, self.seed, self._dataset = every_n_steps, samples, seed, dataset
        self._batch = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self._batch is None:
            data = self._dataset if self._dataset is not None else getattr(trainer.datamodule, "dataset", None)
            if data is None or pl_module.family != "joint":
                return  # a joint-embedding method's measure (flow runs have their own feature extractor)
            self._batch = data.subset(self.samples, self.seed)

    @torch.no_grad()
    def measure(self, pl_module) -> dict[str, float]:
        info = pl_module.info
        h, _ = extract_features(pl_module.eval_backbone, self._batch, info.image_size, info.mean, info.std,
                                len(self._batch), pl_module.device)
        feats = {"embedding": h}
        x = h.to(pl_module.device)
        for key, name in (("projection", "projector"), ("prediction", "predictor")):
            head = getattr(pl_module, name, None)
            if not isinstance(head, nn.Module):  # the projector's input is the backbone feature, the predictor's z
                break
            was = head.training
            head.eval()
            try:
                x = head(x)
            finally:
                head.train(was)
            feats[key] = x.float().cpu()
        out = {}
        for key, x in feats.items():
            out[f"rankme_{key}"] = rankme(x)
            out[f"eff_rank_{key}"] = float(effective_rank(x))
            out[f"dim_std_{key}"] = per_dim_std(x)
            out[f"eval_norm_{key}_mean"] = float(x.norm(dim=1).mean())
        return out

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if (measured_step(trainer) % self.every or self._batch is None or not trainer.is_global_zero
                or not stepped(trainer)):
            return
        log_metrics(trainer, self.measure(pl_module), measured_step(trainer))


def square_weight(predictor: nn.Module) -> Tensor | None:
    """The d×d matrix of a linear predictor: its ``matrix`` as applied (selfsup.predictors, e.g. the symmetrised
    W_p) or its own 2-D square ``weight``, or the weight of its only Linear; else None."""
    w = getattr(predictor, "matrix", None)
    if not (isinstance(w, Tensor) and w.ndim == 2 and w.shape[0] == w.shape[1]):
        w = getattr(predictor, "weight", None)
    if not (isinstance(w, Tensor) and w.ndim == 2 and w.shape[0] == w.shape[1]):
        linears = [m for m in predictor.modules() if isinstance(m, nn.Linear)]
        w = linears[0].weight if len(linears) == 1 else None
    return w if w is not None and w.ndim == 2 and w.shape[0] == w.shape[1] else None


class PredictorAlignment(pl.Callback):
    """For a linear predictor W (see ``square_weight``): asymmetry, normalised commutator with the correlation
    F of its inputs, and cos(W u_j, u_j) for F's top eigenvectors, every N steps (DirectPred Fig. 2 / Thm. 3).

    F is the predictor's own ``correlation`` buffer when it has one (DirectPred keeps it); otherwise this
    callback keeps ``F ← ρF + (1 − ρ)·mean(f fᵀ)`` each step from the StepOutput's ``input_key`` tensor
    (the predictor's inputs, view 1). Methods without a linear predictor are left alone."""

    def __init__(self, every_n_steps: int = 10, top_k: int = 3, rho: float = 0.3, input_key: str = "projection"):
        super().__init__()
        self.every, self.top_k, self.rho = every_n_steps, top_k, rho
        (self.input_key,) = step_tensors((input_key,))
        self.correlation: Tensor | None = None
        self.active = False

    def on_fit_start(self, trainer, pl_module) -> None:
        predictor = getattr(pl_module, "predictor", None)
        self.active = isinstance(predictor, nn.Module) and square_weight(predictor) is not None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        out = step_output(outputs)
        if not self.active or out is None:
            return
        predictor = pl_module.predictor
        own = getattr(predictor, "correlation", None)
        if not isinstance(own, Tensor):
            f = getattr(out, self.input_key)
            if f is None:
                return
            f = f.detach().float()
            batch_corr = f.T @ f / f.shape[0]
            if self.correlation is None:
                self.correlation = batch_corr
            else:
                self.correlation.mul_(self.rho).add_(batch_corr, alpha=1.0 - self.rho)
        if measured_step(trainer) % self.every or not stepped(trainer):
            return
        corr = own if isinstance(own, Tensor) else self.correlation
        weight = square_weight(predictor)
        if corr is None or weight is None or corr.shape != weight.shape:
            return
        values = predictor_alignment(weight, corr, min(self.top_k, weight.shape[0]))
        log_metrics(trainer, {f"pred_{k}": v for k, v in values.items()}, measured_step(trainer))

    def state_dict(self) -> dict:
        """Its running F (kept when the predictor has none of its own)."""
        return {"correlation": self.correlation.detach().cpu()} if self.correlation is not None else {}

    def load_state_dict(self, state_dict: dict) -> None:
        self._pending = state_dict.get("correlation")

    def on_train_start(self, trainer, pl_module) -> None:
        if getattr(self, "_pending", None) is not None:
            self.correlation = self._pending.to(pl_module.device)
            self._pending = None
