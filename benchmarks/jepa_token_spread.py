"""Where an I-JEPA run's patch features went: their spread over the tokens of test images, as the loss sees them.

I-JEPA regresses the target encoder's patch features after a layer norm without affine (ijepa ``src/train.py``:
``h = F.layer_norm(h, (h.size(-1),))``). Each such feature has mean 0 and variance 1 over its D dimensions, so the
variance of the features over all (image, patch) tokens, summed over the dimensions, lies between 0 (every token the
same vector) and D. It splits into ``between`` positions (the spread of each position's mean over the images: a code
of where the patch is) and ``within`` (the spread over the images at a position: what the image puts there).
Written for issue 51's I-JEPA bar, on the validation runs of ``benchmarks/jepa_choice.py`` and the Fashion-MNIST
table's ``ijepa-fmnist`` runs: each run's exported target encoder against its own init, on the first 359 test
images (no training; seconds of CPU). Beside it, whether the pooling hides what the patches learnt: the weighted
kNN@20 (T 0.07, ``selfsup.eval.knn``) of the average-pooled features (the export's) and of the patch features laid
end to end, fit on a seeded draw of at most 10,000 training images, scored on at most 5,000 test images.

    python -m benchmarks.jepa_token_spread RUN [RUN ...] [--out benchmarks/results/ijepa_token_spread.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.harness import write_report

OUT = Path("benchmarks/results/ijepa_token_spread.json")
IMAGES = 359  # the digits test split; the first 359 of Fashion-MNIST's
KNN_TRAIN, KNN_TEST = 10_000, 5_000


def token_spread(features: torch.Tensor) -> dict:
    """(B, N, D) patch features → their total, between-position and within-position variance over the tokens, each
    summed over D, after the loss's layer norm (total = between + within)."""
    h = F.layer_norm(features.double(), (features.shape[-1],))
    between = h.mean(0).var(0, unbiased=False).sum()
    within = h.var(0, unbiased=False).mean(0).sum()
    return {"dim": features.shape[-1], "total": round(float(between + within), 4), "between": round(float(between), 4),
            "within": round(float(within), 4)}


def pooled_and_flat_knn(patches, train: torch.Tensor, test: torch.Tensor, train_labels: torch.Tensor,
                        test_labels: torch.Tensor) -> dict:
    """kNN@20 top-1 of the average-pooled patch features and of all of them laid end to end."""
    from selfsup.eval.knn import knn_accuracy

    a, b = patches(train), patches(test)
    return {name: round(knn_accuracy(f(a), train_labels, f(b), test_labels)["top1"], 2)
            for name, f in (("knn_pooled", lambda h: h.mean(1)), ("knn_flat", lambda h: h.flatten(1)))}


def measure(run: Path) -> dict:
    from selfsup.config import load_run
    from selfsup.data.datasets import load_dataset
    from selfsup.export import load_exported

    cfg = load_run(run).data
    train, test = load_dataset(cfg, "train"), load_dataset(cfg, "test")
    pick = torch.randperm(len(train.images), generator=torch.Generator().manual_seed(0))[:KNN_TRAIN]
    train_x, train_y = train.images[pick].float() / 255.0, torch.as_tensor(train.labels)[pick]
    test_x, test_y = test.images[:KNN_TEST].float() / 255.0, torch.as_tensor(test.labels)[:KNN_TEST]
    row = {"run": run.name}
    for name in ("backbone_init", "backbone"):
        net, meta = load_exported(run / f"{name}.safetensors")
        net.eval()
        mean, std = (torch.tensor(meta[k]).view(1, -1, 1, 1) for k in ("mean", "std"))

        @torch.no_grad()
        def patches(x: torch.Tensor) -> torch.Tensor:
            return torch.cat([net.forward_features((x[i:i + 1000] - mean) / std)
                              for i in range(0, len(x), 1000)])

        row["init" if name == "backbone_init" else "trained"] = {
            **token_spread(patches(test_x[:IMAGES])), **pooled_and_flat_knn(patches, train_x, test_x, train_y, test_y)}
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    rows = []
    for run in args.runs:
        rows.append(measure(run))
        r = rows[-1]
        print(f"{r['run']}: total {r['init']['total']} -> {r['trained']['total']} of {r['init']['dim']} "
              f"(within a position {r['init']['within']} -> {r['trained']['within']}, between positions "
              f"{r['init']['between']} -> {r['trained']['between']}); kNN pooled {r['init']['knn_pooled']} -> "
              f"{r['trained']['knn_pooled']}, flat {r['init']['knn_flat']} -> {r['trained']['knn_flat']}")
    write_report({"what": __doc__.splitlines()[0], "images": IMAGES, "knn_train": KNN_TRAIN, "knn_test": KNN_TEST,
                  "rows": rows}, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
