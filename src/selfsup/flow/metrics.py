"""Sample-quality metrics for generated images, in the feature space of a frozen encoder.

- **Encoder Fréchet distance**: the Fréchet distance between Gaussians fitted to the features of
  generated and of real images, with a selfsup-pretrained encoder in place of Inception:
  d² = ‖μ₁ − μ₂‖² + Tr(Σ₁ + Σ₂ − 2 (Σ₁ Σ₂)^{1/2}). It is *not* FID: its value depends on the encoder.
  Tr (Σ₁Σ₂)^{1/2} = Σ √λᵢ(Σ₁^{1/2} Σ₂ Σ₁^{1/2}), the symmetric form, in float64 with ``eigh``.
- **Class fidelity**: a kNN classifier (``selfsup.eval.knn``) fitted on real encoder features,
  applied to class-conditional samples: the share classified as the class they were drawn for.
- **Inception FID** through torchmetrics, only when torch-fidelity and its Inception weights are
  already on disk (nothing is downloaded); otherwise one line says why it is unavailable.
- **A supervised metric classifier** (``fit_metric_classifier``): a small CNN trained on the dataset's labelled
  training images, whose pooled features stand in for Inception's on small datasets (a fixed, trained feature
  space shared by every method compared; a barely trained SSL encoder is close to a random one there).
- **Held-out velocity error** (``heldout_velocity_error``): the model's velocity MSE on held-out images at fixed
  noise, each image at one level t of a fixed grid: the task the sampler integrates, a low-noise companion of
  the Fréchet distance.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from selfsup.data.datasets import ImageDataset
from selfsup.errors import UserError
from selfsup.eval.features import extract_features
from selfsup.eval.knn import knn_predict_scores

INCEPTION_WEIGHTS = "weights-inception-2015-12-05-6726825d.pth"  # torch-fidelity's file in torch.hub's cache


def gaussian_stats(features: Tensor) -> tuple[Tensor, Tensor]:
    """(mean, covariance with N − 1) of N × D features, in float64."""
    f = features.double()
    if f.shape[0] < 2:
        raise UserError(f"the Fréchet distance needs at least 2 samples per set (got {f.shape[0]}); raise --n")
    mu = f.mean(0)
    centred = f - mu
    return mu, centred.T @ centred / (f.shape[0] - 1)


def _sqrt_psd(matrix: Tensor) -> Tensor:
    vals, vecs = torch.linalg.eigh(matrix)
    return (vecs * vals.clamp_min(0).sqrt()) @ vecs.T


def frechet_distance(mu1: Tensor, sigma1: Tensor, mu2: Tensor, sigma2: Tensor) -> float:
    """‖μ₁ − μ₂‖² + Tr Σ₁ + Tr Σ₂ − 2 Tr (Σ₁^{1/2} Σ₂ Σ₁^{1/2})^{1/2}, in float64."""
    mu1, sigma1, mu2, sigma2 = (a.double() for a in (mu1, sigma1, mu2, sigma2))
    root1 = _sqrt_psd(sigma1)
    middle = root1 @ sigma2 @ root1
    middle = (middle + middle.T) / 2
    trace_sqrt = torch.linalg.eigvalsh(middle).clamp_min(0).sqrt().sum()
    d2 = (mu1 - mu2).square().sum() + sigma1.trace() + sigma2.trace() - 2 * trace_sqrt
    return max(float(d2), 0.0)


def feature_frechet_distance(features1: Tensor, features2: Tensor) -> float:
    """The Fréchet distance between Gaussians fitted to two feature sets (N₁ × D, N₂ × D)."""
    return frechet_distance(*gaussian_stats(features1), *gaussian_stats(features2))


def class_fidelity(train_features: Tensor, train_labels: Tensor, sample_features: Tensor, requested: Tensor,
                   k: int = 20, temperature: float | None = 0.07, num_classes: int | None = None) -> dict:
    """Share (%) of samples a kNN classifier on real features assigns to the requested class, overall and per class."""
    k = min(k, len(train_labels))
    predicted = knn_predict_scores(train_features, train_labels, sample_features, k, temperature,
                                   num_classes).argmax(1).cpu()
    hit = (predicted == requested.cpu()).double()
    per_class = {int(c): 100.0 * float(hit[requested.cpu() == c].mean()) for c in requested.unique().tolist()}
    return {"class_fidelity": 100.0 * float(hit.mean()), "per_class": per_class, "k": k,
            "temperature": temperature}


def inception_fid_unavailable() -> str | None:
    """Why torchmetrics' Inception FID cannot run here without a download, or None when it can."""
    try:
        import torch_fidelity  # noqa: F401  (torchmetrics' Inception network)
        from torchmetrics.image.fid import FrechetInceptionDistance  # noqa: F401
    except ImportError:
        return "Inception FID unavailable: needs torchmetrics with torch-fidelity (pip install torch-fidelity)"
    path = Path(torch.hub.get_dir()) / "checkpoints" / INCEPTION_WEIGHTS
    if not path.exists():
        return f"Inception FID unavailable: its weights are not on disk ({path}); nothing is downloaded"
    return None


@torch.no_grad()
def inception_fid(real: Tensor, fake: Tensor, batch_size: int = 256, device: torch.device | str = "cpu") -> float:
    """torchmetrics' FID of uint8 N × C × H × W image sets (grey images repeated to 3 channels)."""
    from torchmetrics.image.fid import FrechetInceptionDistance  # optional: needs torch-fidelity

    metric = FrechetInceptionDistance(feature=2048).to(device)
    for images, is_real in ((real, True), (fake, False)):
        for i in range(0, len(images), batch_size):
            batch = images[i : i + batch_size].to(device)
            metric.update(batch.expand(-1, 3, -1, -1) if batch.shape[1] == 1 else batch, real=is_real)
    return float(metric.compute())


def image_features(source, images: Tensor, batch_size: int = 512, device=None) -> Tensor:
    """Features (N × D) of uint8 images through an evaluation source's frozen backbone and its transform."""
    m = source.meta
    fake = ImageDataset("generated", images, torch.zeros(len(images), dtype=torch.long), 1, m["mean"], m["std"])
    return extract_features(source.backbone, fake, m["image_size"], m["mean"], m["std"], batch_size, device)[0]


# --------------------------------------------------------------------------- a trained feature space, a companion


class MetricClassifier(nn.Module):
    """Three 3×3 convolutions (32, 64, 128 channels; stride 1, 2, 2), ReLU, global average pool → ``features``
    (128-d), then a linear classifier. Inputs: uint8 images scaled to [−1, 1]."""

    def __init__(self, channels: int, num_classes: int, width: int = 32):
        super().__init__()
        w = width
        self.body = nn.Sequential(nn.Conv2d(channels, w, 3, 1, 1), nn.ReLU(), nn.Conv2d(w, 2 * w, 3, 2, 1), nn.ReLU(),
                                  nn.Conv2d(2 * w, 4 * w, 3, 2, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.fc = nn.Linear(4 * w, num_classes)

    @staticmethod
    def scale(images: Tensor) -> Tensor:
        return images.float() / 127.5 - 1 if images.dtype == torch.uint8 else images.float()

    def features(self, images: Tensor) -> Tensor:
        return self.body(self.scale(images))

    def forward(self, images: Tensor) -> Tensor:
        return self.fc(self.features(images))


def fit_metric_classifier(images: Tensor, labels: Tensor, num_classes: int, epochs: int = 30, batch_size: int = 128,
                          lr: float = 2e-3, seed: int = 0) -> MetricClassifier:
    """A ``MetricClassifier`` trained with cross-entropy and Adam on uint8 ``images``; seeded, eval mode."""
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MetricClassifier(images.shape[1], num_classes)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(images), generator=gen)
        for i in range(0, len(images), batch_size):
            idx = order[i:i + batch_size]
            loss = nn.functional.cross_entropy(model(images[idx]), labels[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return model.eval().requires_grad_(False)


@torch.no_grad()
def classifier_features(model: MetricClassifier, images: Tensor, batch_size: int = 1000) -> Tensor:
    """(N, D) pooled features of uint8 images."""
    return torch.cat([model.features(images[i:i + batch_size]) for i in range(0, len(images), batch_size)])


VAL_LEVELS = (0.05, 0.15, 0.3, 0.5, 0.7, 0.85, 0.95)


@torch.no_grad()
def heldout_velocity_error(velocity, x0: Tensor, labels: Tensor, levels=VAL_LEVELS, seed: int = 0,
                           batch_size: int = 500) -> dict:
    """Mean ‖v(x_t, t, y) − (ε − x₀)‖² per value of held-out images ``x0`` (model space) with their ``labels``, every
    image at each level t of ``levels`` in turn; ε drawn once from a CPU generator seeded by ``seed`` (shared by
    every level and every model): ``{"val": mean over levels, "per_level": {t: error}}``."""
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(seed), dtype=x0.dtype)
    target = noise - x0
    per_level = {}
    for t in levels:
        err = 0.0
        for i in range(0, len(x0), batch_size):
            x, e, v = x0[i:i + batch_size], noise[i:i + batch_size], target[i:i + batch_size]
            tt = torch.full((len(x),), float(t), dtype=x.dtype)
            err += float((velocity((1 - t) * x + t * e, tt, labels[i:i + batch_size]) - v).double().square().sum())
        per_level[t] = err / x0.numel()
    return {"val": sum(per_level.values()) / len(per_level), "per_level": per_level}
