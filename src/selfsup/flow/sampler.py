"""Sampling a velocity model from noise (t = 1) to data (t = 0): Euler ODE, Euler–Maruyama SDE, guidance.

Everything here works on a plain velocity callable ``velocity(x, t, y) -> v`` (t of shape (B,)),
so it is tested without a network. The path is x_t = (1 − t)·x_0 + t·ε and v = ε − x_0.

ODE (probability flow): x_{t−h} = x_t − h·v(x_t, t).

SDE, in SiT's convention (transport/transport.py, integrators.py of willisma/SiT; the Self-Flow
release samples with it): in data-time τ = 1 − t the SDE  dx = [u + w·s] dτ + √(2w) dW  has the
marginals of the path for any w ≥ 0, where u = dx/dτ = −v and s = ∇ log p_t. For the linear path
(α = 1 − t, σ = t) the score follows from the velocity as

    s(x, t) = −E[ε | x_t] / t = −(x + (1 − t)·v) / t

and SiT's default diffusion is w = norm · σ_t = norm · t ("sigma" form), so w·s = −norm·(x + (1 − t)·v)
(no 1/t: finite at t → 0). Euler–Maruyama takes ``steps − 1`` steps of equal size from t = 1 to
t = ``last_step_size``, then one noise-free "Mean" step (drift only) to t = 0 (SiT's default:
0.04), so ``steps`` is the number of model evaluations in both samplers.

Classifier-free guidance: v = v_u + w·(v_c − v_u), with the conditional and unconditional
(null class) halves in one batched forward. Guidance is applied to every channel.

Sampling a model in batches (``generate``): the initial noise comes from a CPU generator seeded by
``seed`` (the same draw on any device), the SDE's step noise from a generator on the device seeded by
``seed + 1``. Pixel-space models work on images in [−1, 1] at the model's input size;
``sample_images`` brings samples back to the dataset's size (the inverse of the run's resize / pad)
and to uint8.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor
from torchvision.utils import make_grid

from selfsup.errors import UserError

Velocity = Callable[[Tensor, Tensor, Tensor], Tensor]
SAMPLERS = ("ode", "sde")
SDE_STEPS = ("--sampler sde needs --steps >= 2 (got {steps}): steps − 1 Euler–Maruyama steps, then the noise-free "
             "last step (SiT's scheme has no 1-step form); use --sampler ode for one step")


def guided(velocity: Velocity, scale: float, null_class: int) -> Velocity:
    """v_u + scale·(v_c − v_u) from one forward of the doubled batch [conditional; null class]."""
    if scale == 1.0:
        return velocity

    def v(x: Tensor, t: Tensor, y: Tensor) -> Tensor:
        out = velocity(torch.cat([x, x]), torch.cat([t, t]), torch.cat([y, torch.full_like(y, null_class)]))
        v_c, v_u = out.chunk(2)
        return v_u + scale * (v_c - v_u)

    return v


def _time_column(t: float, x: Tensor) -> Tensor:
    return torch.full((x.shape[0],), t, device=x.device, dtype=x.dtype)


@torch.no_grad()
def euler_ode(velocity: Velocity, noise: Tensor, y: Tensor, steps: int) -> Tensor:
    """Euler steps of equal size on dx/dt = v from t = 1 to t = 0."""
    times = torch.linspace(1.0, 0.0, steps + 1).tolist()
    x = noise
    for t, t_next in zip(times[:-1], times[1:]):
        x = x + (t_next - t) * velocity(x, _time_column(t, x), y)
    return x


def sde_drift(x: Tensor, v: Tensor, t: Tensor, norm: float) -> Tensor:
    """dx/dτ = −v + w·s with w = norm·t and s = −(x + (1 − t)·v)/t (SiT: velocity + diffusion·score)."""
    t = t.view(-1, *([1] * (x.dim() - 1)))
    return -v - norm * (x + (1 - t) * v)


@torch.no_grad()
def euler_maruyama(velocity: Velocity, noise: Tensor, y: Tensor, steps: int, last_step_size: float = 0.04,
                   diffusion_norm: float = 1.0, generator: torch.Generator | None = None) -> Tensor:
    """``steps − 1`` Euler–Maruyama steps from t = 1 to ``last_step_size``, then a noise-free step to 0
    (``steps`` >= 2: one step would be the noise-free step alone, from t = 1, which returns x̂₀ − ε̂)."""
    if steps < 2:
        raise UserError(SDE_STEPS.format(steps=steps))
    if diffusion_norm < 0:
        raise UserError(f"diffusion_norm {diffusion_norm} must be >= 0 (0: the drift alone)")
    last = last_step_size
    times = torch.linspace(1.0, last, steps).tolist()
    x = noise
    for t, t_next in zip(times[:-1], times[1:]):
        h = t - t_next
        tt = _time_column(t, x)
        dw = torch.randn(x.shape, generator=generator, device=x.device, dtype=x.dtype) * h ** 0.5
        x = x + h * sde_drift(x, velocity(x, tt, y), tt, diffusion_norm) + (2 * diffusion_norm * t) ** 0.5 * dw
    tt = _time_column(last, x)
    return x + last * sde_drift(x, velocity(x, tt, y), tt, diffusion_norm)


def check_options(steps: int, cfg_scale: float, method: str, n: int | None = None) -> None:
    """One-line errors for out-of-range sampling options."""
    if n is not None and n < 1:
        raise UserError(f"--n {n} must be >= 1")
    if steps < 1:
        raise UserError(f"--steps {steps} must be >= 1")
    if not cfg_scale >= 0 or cfg_scale == float("inf"):
        raise UserError(f"--cfg {cfg_scale} must be a finite number >= 0 (1 = no guidance)")
    if method not in SAMPLERS:
        raise UserError(f"--sampler {method!r} is not one of {', '.join(SAMPLERS)}")
    if method == "sde" and steps < 2:
        raise UserError(SDE_STEPS.format(steps=steps))


@torch.no_grad()
def sample(velocity: Velocity, noise: Tensor, y: Tensor, steps: int = 50, method: str = "ode",
           cfg_scale: float = 1.0, null_class: int | None = None, last_step_size: float = 0.04,
           diffusion_norm: float = 1.0, generator: torch.Generator | None = None) -> Tensor:
    """x_0 from x_1 = ``noise`` for labels ``y`` (the null class for unconditional samples)."""
    check_options(steps, cfg_scale, method)
    if cfg_scale != 1.0 and null_class is None:
        raise UserError("classifier-free guidance needs the model's null class (a class-conditional model)")
    v = guided(velocity, cfg_scale, null_class) if cfg_scale != 1.0 else velocity
    if method == "ode":
        return euler_ode(v, noise, y, steps)
    if not 0 < last_step_size < 1:
        raise UserError(f"last_step_size {last_step_size} must be in (0, 1)")
    return euler_maruyama(v, noise, y, steps, last_step_size, diffusion_norm, generator)


# --------------------------------------------------------------------------- a model, in batches


def sample_labels(n: int, num_classes: int, cls: int | None = None) -> Tensor:
    """``cls`` for every sample, else the classes in turn (0, 1, …); the null class for an unconditional model."""
    if cls is not None:
        if num_classes == 0 or not 0 <= cls < num_classes:
            what = "an unconditional model" if num_classes == 0 else f"classes 0..{num_classes - 1}"
            raise UserError(f"--class {cls} is not a class of the model ({what})")
        return torch.full((n,), cls, dtype=torch.long)
    if num_classes == 0:
        return torch.zeros(n, dtype=torch.long)
    return torch.arange(n) % num_classes


@torch.no_grad()
def generate(model, labels: Tensor, steps: int = 50, method: str = "ode", cfg_scale: float = 1.0, seed: int = 0,
             device: torch.device | str = "cpu", batch_size: int = 256, progress: bool = False) -> Tensor:
    """Samples (N, C, S, S), float32 on CPU, of ``model(x_t, t, y) -> velocity`` for ``labels``."""
    if batch_size < 1:
        raise UserError(f"batch size {batch_size} must be >= 1")
    device = torch.device(device)
    model = model.eval().to(device)
    shape = (model.in_channels, model.input_size, model.input_size)
    noise = torch.randn(len(labels), *shape, generator=torch.Generator().manual_seed(seed))
    sde_gen = torch.Generator(device=device).manual_seed(seed + 1)
    null = model.num_classes if model.num_classes else None
    out, t0 = [], time.perf_counter()
    for i in range(0, len(labels), batch_size):
        x = sample(model, noise[i : i + batch_size].to(device), labels[i : i + batch_size].to(device), steps, method,
                   cfg_scale, null, generator=sde_gen)
        out.append(x.float().cpu())
        if progress:
            done = min(i + batch_size, len(labels))
            print(f"  sampled {done}/{len(labels)} ({time.perf_counter() - t0:.1f} s)", flush=True)
    return torch.cat(out)


def to_uint8(x: Tensor, mean=(0.5,), std=(0.5,)) -> Tensor:
    """The model's space ``(image − mean)/std`` (a flow run's: [−1, 1]) → uint8 images [0, 255]."""
    shape = (1, -1, 1, 1)
    image = x.float() * torch.tensor(std).view(shape) + torch.tensor(mean).view(shape)
    return (image * 255).round_().clamp_(0, 255).to(torch.uint8)


def to_dataset_size(x: Tensor, size: int, fit: str) -> Tensor:
    """Undo the run's fit of ``size``×``size`` dataset images to the model input: centre crop (pad) or resize."""
    s = x.shape[-1]
    if s == size:
        return x
    if fit == "pad":
        top = (s - size) // 2
        return x[..., top : top + size, top : top + size]
    return F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False, antialias=True)


def save_grid(images: Tensor, path: Path) -> Path:
    """uint8 (N, C, H, W) → a PNG grid about √N wide (grey images as grey)."""
    grid = make_grid(images, nrow=max(1, math.ceil(math.sqrt(len(images)))), padding=2, pad_value=255)
    array = grid.permute(1, 2, 0).numpy()
    img = Image.fromarray(array[..., 0] if images.shape[1] == 1 else array[..., :3])
    tmp = path.with_name(path.name + ".tmp")
    img.save(tmp, format="PNG")
    tmp.replace(path)
    return path


def sample_images(x: Tensor, info: dict, data_size: int) -> Tensor:
    """Samples in the model's space → uint8 images at the dataset's size (the run's fit undone)."""
    return to_uint8(to_dataset_size(x, data_size, info["fit"]), info["mean"], info["std"])
