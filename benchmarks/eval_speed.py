"""Evaluation speed: kNN (10,000 test vs 60,000 train, dim 256) against scikit-learn's brute-force
KNeighborsClassifier and the bare similarity product, plus feature-extraction images/s.

    python -m benchmarks.eval_speed [--quick]      → benchmarks/results/eval_speed.json
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.harness import RESULTS, timed, write_report


def best(fn, repeat: int = 1) -> float:
    """Best wall time of ``repeat`` calls (seconds)."""
    return min(wall for wall, _ in timed(fn, repeat))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the sizes (smoke run)")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    from sklearn.neighbors import KNeighborsClassifier

    from selfsup.eval.knn import knn_predict_scores

    n_train, n_test, dim, k = (6000, 1000, 256, 20) if args.quick else (60000, 10000, 256, 20)
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(10, dim, generator=g)
    ytr, yte = torch.randint(0, 10, (n_train,), generator=g), torch.randint(0, 10, (n_test,), generator=g)
    xtr = centres[ytr] + 2 * torch.randn(n_train, dim, generator=g)
    xte = centres[yte] + 2 * torch.randn(n_test, dim, generator=g)
    out = {"n_train": n_train, "n_test": n_test, "dim": dim, "k": k, "threads": torch.get_num_threads()}

    a, b = F.normalize(xte, dim=1), F.normalize(xtr, dim=1)
    out["bare_product_s"] = best(lambda: a @ b.T, args.repeat)
    pred = {}
    out["selfsup_s"] = best(lambda: pred.__setitem__(
        "selfsup", knn_predict_scores(xtr, ytr, xte, k=k, temperature=None, num_classes=10).argmax(1)), args.repeat)
    out["selfsup_weighted_s"] = best(lambda: knn_predict_scores(xtr, ytr, xte, k=k, temperature=0.07), args.repeat)
    clf = KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute").fit(xtr.numpy(), ytr.numpy())
    out["sklearn_s"] = best(lambda: pred.__setitem__("sklearn", clf.predict(xte.numpy())), 1)
    out["same_predictions_%"] = 100.0 * float(np.mean(pred["selfsup"].numpy() == pred["sklearn"]))
    out["speedup_vs_sklearn"] = out["sklearn_s"] / out["selfsup_s"]
    out["ratio_to_bare_product"] = out["selfsup_s"] / out["bare_product_s"]

    from selfsup.data.datasets import load_digits
    from selfsup.eval.features import extract_features
    from selfsup.models.backbones import build_backbone

    digits = load_digits("train")
    vit = build_backbone("vit_micro", in_chans=1, image_size=8, patch_size=2)
    extract_features(vit, digits, 8, digits.mean, digits.std, 512, "cpu")  # warm-up
    sec = best(lambda: extract_features(vit, digits, 8, digits.mean, digits.std, 512, "cpu"), args.repeat)
    out["extract_vit_micro_digits_images_per_s"] = len(digits) / sec

    for key, value in out.items():
        print(f"{key:<40} {value:.4g}" if isinstance(value, float) else f"{key:<40} {value}")
    path = RESULTS / "eval_speed.json"
    write_report(out, path)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
