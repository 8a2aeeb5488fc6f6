"""Will the step fit? The memory of a joint-embedding run's training step, estimated before its first step, against
the memory this machine has free: a run that would be killed by the kernel (or run out of GPU memory) is refused in
one line naming the keys that shrink it, instead of dying without a word.

The estimate (``step_estimate``):

- activations: what autograd keeps for the backward of the backbone, measured, not modelled: two images of each
  view size of the method's view plan through the backbone in training mode (a BatchNorm needs two), the bytes
  of the distinct tensors saved for backward counted and halved (``torch.autograd.graph.saved_tensors_hooks``;
  parameters excluded), times the batch; times ``HEADS_SHARE`` for the heads, the losses and the allocator's slack;
- the model's state: every parameter and buffer of the method, and for each trained parameter its gradient and two
  optimiser moments (AdamW's; LARS and SGD keep fewer).

The probe runs on the CPU before the trainer moves the model, with the global RNG forked and the backbone's
buffers restored (a BatchNorm's running statistics), so a seeded run draws and trains exactly as without it. It is
made for runs on a CPU, where a step too large is killed by the kernel without a word (a GPU's runs end in CUDA's
own out-of-memory error; the free GPU memory is read where a caller asks). The flow family (a SiT on the noise
levels, not a view plan) is not estimated. Measured: ``simclr-digits`` at 134 px with its patch 2 (4,489 tokens an
image) needs ~372 MiB an image, ~93 GiB at batch 256, refused in about 4 s; at its own 8 px, 0.4 GiB.
"""

from __future__ import annotations

import re
import resource
import sys
from dataclasses import dataclass
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch import nn

from selfsup.errors import UserError
from selfsup.runs.facts import mark_run

# a first step measured past WIDE x its estimate and SLACK above it is said in one line (the first step's one-off
# allocations, the allocator's arenas and the kernels' workspaces, measured ~90 MiB on byol-digits: not a wide miss)
WIDE, SLACK = 2.0, 256 << 20
HEADS_SHARE = 1.3  # the backbone's saved tensors × this: the heads, the loss, the allocator's slack
FIT_SHARE = 0.9  # of the free memory a step may take
GIB = 1 << 30


@dataclass
class StepEstimate:
    """Bytes of a training step: ``per_image`` activations (every view of one image), ``state`` (weights, gradients,
    optimiser moments), ``batch`` images, and the view sizes measured."""

    per_image: int
    state: int
    batch: int
    sizes: tuple[int, ...]

    @property
    def total(self) -> int:
        return self.per_image * self.batch + self.state

    def largest_batch(self, free: int) -> int:
        """The largest batch whose step fits ``FIT_SHARE`` of ``free`` bytes (0: not even one image)."""
        return max(0, int((free * FIT_SHARE - self.state) // max(self.per_image, 1)))


def saved_bytes(module: nn.Module, x: torch.Tensor) -> int:
    """The bytes of the distinct tensors autograd saves for the backward of ``module(x)`` (its parameters
    excluded), with the global RNG forked and the module's buffers restored afterwards."""
    params = {p.data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            seen[ptr] = max(seen.get(ptr, 0), t.untyped_storage().nbytes())
        return t

    buffers = {name: b.clone() for name, b in module.named_buffers()}
    with torch.random.fork_rng(devices=[]), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(x)
    del out
    with torch.no_grad():
        for name, b in module.named_buffers():
            b.copy_(buffers[name])
    return sum(seen.values())


def step_estimate(method: nn.Module, batch: int) -> StepEstimate | None:
    """The estimate of ``method``'s step at ``batch`` images (None for a method without a backbone and a view
    plan: the flow family)."""
    backbone, augment = getattr(method, "backbone", None), getattr(method, "augment", None)
    sizes = getattr(augment, "sizes", None)
    if backbone is None or not sizes:
        return None
    channels = method.info.channels
    device = next(backbone.parameters()).device
    # two images (a BatchNorm needs more than one value per channel in training mode), halved
    per_size = {s: saved_bytes(backbone, torch.zeros(2, channels, s, s, device=device)) // 2 for s in set(sizes)}
    per_image = int(sum(per_size[s] for s in sizes) * HEADS_SHARE)
    tensors = [*method.parameters(), *method.buffers()]
    trained = sum(p.numel() * p.element_size() for p in method.parameters() if p.requires_grad)
    state = sum(t.numel() * t.element_size() for t in tensors) + 3 * trained
    return StepEstimate(per_image, state, batch, tuple(sizes))


def free_memory(device: torch.device) -> int | None:
    """The bytes free for the step: the GPU's (``torch.cuda.mem_get_info``) or the machine's ``MemAvailable``
    (``/proc/meminfo``); None where neither can be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def _size(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB / 10 else f"{n / 2 ** 20:.0f} MiB"


def runs_on_cpu(cfg) -> bool:
    """Whether the run trains on the CPU (``trainer.accelerator`` cpu, or auto without CUDA)."""
    return cfg.trainer.accelerator == "cpu" or (cfg.trainer.accelerator == "auto" and not torch.cuda.is_available())


def check_step_memory(method: nn.Module, cfg, device: torch.device | None = None) -> StepEstimate | None:
    """Refuse in one line a step that would not fit the free memory of ``device``, naming the keys that shrink
    it; returns the estimate (None where it cannot be made). ``device`` None: the CPU for a run on the CPU; a run
    on a GPU is estimated (on the CPU, before the model moves) and not refused: CUDA's own out-of-memory error
    names the allocation there, and ``FirstStepMemory`` sets the estimate beside the measured step."""
    refuse = device is not None or runs_on_cpu(cfg)
    device = device or torch.device("cpu")
    per_process = cfg.data.batch_size
    estimate = step_estimate(method, per_process)
    free = free_memory(device) if refuse else None
    if estimate is None or free is None or estimate.total <= free * FIT_SHARE:
        return estimate
    fits = estimate.largest_batch(free)
    where = "the GPU" if device.type == "cuda" else "this machine"
    patch, size = getattr(method.backbone, "patch_size", None), method.info.image_size
    grid = f", {(size // patch) ** 2} tokens an image at model.patch_size={patch}" if patch else ""
    fix = f"set data.batch_size={fits} or lower" if fits >= 1 else "lower data.image_size"
    raise UserError(
        f"the training step would need about {_size(estimate.total)} (data.batch_size={per_process} x "
        f"{_size(estimate.per_image)} of activations an image at data.image_size={size}"
        f"{grid}), {where} has {_size(free)} free: {fix}" + (", or raise model.patch_size" if patch else "")
        + " (or trainer.accumulate_grad_batches for the same global batch)")


STATUS = Path("/proc/self/status")


def _status_bytes(field: str) -> int | None:
    """A ``/proc/self/status`` field in bytes (VmRSS: resident now; VmHWM: the resident peak), None without it."""
    try:
        found = re.search(rf"^{field}:\s+(\d+) kB", STATUS.read_text(), re.M)
    except OSError:
        return None
    return int(found.group(1)) * 1024 if found else None


def reset_resident_peak() -> bool:
    """Reset this process's resident peak (VmHWM) to its resident set now (Linux's ``/proc/self/clear_refs``,
    value 5); False where it cannot be reset (then ``ru_maxrss``, the peak since the process began, is read)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return _status_bytes("VmHWM") is not None


def resident_peak() -> int:
    """This process's resident peak in bytes: VmHWM, else ``ru_maxrss`` (KiB on Linux, bytes on macOS)."""
    peak = _status_bytes("VmHWM")
    if peak is not None:
        return peak
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


class FirstStepMemory(pl.Callback):
    """The first optimiser step's measured peak memory beside the estimate made before it (the method's
    ``step_memory``, a ``StepEstimate``): ``run.json``'s ``step_memory``, and one line when the peak passes ``WIDE``
    times the estimate (and ``SLACK`` above it). Measured around the first step of a session only, from the hooks
    before and after it, never inside the (compiled) step: on a GPU torch's peak of allocated bytes since the step began
    (``torch.cuda.max_memory_allocated``; the weights included, as in the estimate); on a CPU the process's resident
    peak during the step less its resident set before it, plus the method's weights and buffers, which were resident
    before it (the estimate's state counts them)."""

    def __init__(self, run_dir: Path):
        self.run_dir, self.start, self.before, self.how = Path(run_dir), None, 0, ""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.start is not None or not trainer.is_global_zero:
            return
        self.start, device = trainer.global_step, pl_module.device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            self.before, self.how = 0, "torch.cuda.max_memory_allocated"
        else:
            reset = reset_resident_peak()
            self.before = _status_bytes("VmRSS") if reset else 0
            self.how = "resident peak less resident before, plus the weights" if reset else \
                "ru_maxrss (the process's peak: no VmHWM reset here)"

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.start is None or self.how == "done" or trainer.global_step == self.start:
            return  # before the first optimiser step is done (accumulated micro-batches)
        device = pl_module.device
        if device.type == "cuda":
            measured = torch.cuda.max_memory_allocated(device)
        else:
            held = sum(t.numel() * t.element_size() for t in (*pl_module.parameters(), *pl_module.buffers()))
            measured = resident_peak() - self.before + (held if self.before else 0)
        estimate = getattr(pl_module, "step_memory", None)
        mark_run(self.run_dir, step_memory={
            "step": int(trainer.global_step), "device": device.type, "measured_bytes": int(measured),
            "measured": self.how, "estimate_bytes": estimate.total if estimate else None,
            "estimate_per_image_bytes": estimate.per_image if estimate else None,
            "batch": estimate.batch if estimate else None})
        self.how = "done"
        if estimate and measured > max(WIDE * estimate.total, estimate.total + SLACK):
            print(f"selfsup: the first step peaked at {_size(measured)}, {measured / estimate.total:.1f} x the "
                  f"{_size(estimate.total)} estimated before it (runs/memory.py): the memory check underestimates "
                  "this run; watch the machine's memory, or lower data.batch_size", file=sys.stderr)
