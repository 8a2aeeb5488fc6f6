import math

import numpy as np
import pytest
import torch
from sklearn.neighbors import KNeighborsClassifier

from selfsup.errors import UserError
from selfsup.eval import knn_accuracy, knn_sweep
from selfsup.eval.knn import knn_predict_scores, knn_search


def data(n_train=120, n_test=37, dim=16, classes=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n_train, dim, generator=g), torch.randint(0, classes, (n_train,), generator=g),
            torch.randn(n_test, dim, generator=g), torch.randint(0, classes, (n_test,), generator=g))


def brute_scores(xtr, ytr, xte, k, temperature, classes):
    """Per-sample reference: full cosine matrix, argsort, loop over neighbours."""
    a = xte.numpy() / np.linalg.norm(xte.numpy(), axis=1, keepdims=True)
    b = xtr.numpy() / np.linalg.norm(xtr.numpy(), axis=1, keepdims=True)
    sim = a @ b.T
    out = np.zeros((len(a), classes))
    for i in range(len(a)):
        for j in np.argsort(-sim[i])[:k]:
            out[i, ytr[j]] += 1.0 if temperature is None else math.exp(sim[i, j] / temperature)
    return out


@pytest.mark.parametrize("block", [1 << 24, 200, 7])  # one block; row blocks; row and column blocks
@pytest.mark.parametrize("temperature", [0.07, 0.5, None])
def test_scores_match_brute_force(block, temperature):
    xtr, ytr, xte, _ = data()
    got = knn_predict_scores(xtr, ytr, xte, k=9, temperature=temperature, num_classes=7, block_elements=block)
    ref = brute_scores(xtr, ytr, xte, 9, temperature, 7)
    if temperature is None:  # majority scores carry a tie-break offset below 0.5
        assert np.array_equal(np.round(got.numpy() + 0.25), ref)
    else:
        np.testing.assert_allclose(got.numpy(), ref, rtol=1e-4)


@pytest.mark.parametrize("block", [1 << 24, 5])
def test_search_matches_full_topk(block):
    xtr, _, xte, _ = data(n_train=300, n_test=50)
    sims, idx = knn_search(xtr, xte, 17, block_elements=block)
    full = torch.nn.functional.normalize(xte, dim=1) @ torch.nn.functional.normalize(xtr, dim=1).T
    ref_s, ref_i = full.topk(17, dim=1)
    assert torch.equal(idx, ref_i)
    torch.testing.assert_close(sims, ref_s)


@pytest.mark.parametrize("k", [1, 5, 20])
def test_majority_matches_sklearn(k):
    xtr, ytr, xte, yte = data(n_train=200, n_test=60, classes=5, seed=k)
    clf = KNeighborsClassifier(n_neighbors=k, metric="cosine", algorithm="brute").fit(xtr.numpy(), ytr.numpy())
    expected = clf.predict(xte.numpy())
    scores = knn_predict_scores(xtr, ytr, xte, k=k, temperature=None, num_classes=5)
    assert np.array_equal(scores.argmax(1).numpy(), expected)
    acc = knn_accuracy(xtr, ytr, xte, yte, k=k, temperature=None)
    assert acc["top1"] == pytest.approx(100.0 * float((expected == yte.numpy()).mean()))


def test_dino_weighting_hand_computed():
    # train: class 0 at angle 0, class 1 at 90 and 45 degrees; test at angle 0 (1, 0)
    xtr = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]])
    ytr = torch.tensor([0, 1, 1])
    xte = torch.tensor([[5.0, 0.0]])
    scores = knn_predict_scores(xtr, ytr, xte, k=3, temperature=0.5, num_classes=2)
    c45 = 1 / math.sqrt(2)
    expected = [math.exp(1 / 0.5), math.exp(0 / 0.5) + math.exp(c45 / 0.5)]  # [7.389, 1 + 4.113]
    torch.testing.assert_close(scores, torch.tensor([expected]))
    # k = 2 drops the orthogonal neighbour: class 0 gets e^2 = 7.39, class 1 gets e^(2·0.707) = 4.11
    assert knn_accuracy(xtr, ytr, xte, torch.tensor([0]), k=2, temperature=0.5)["top1"] == 100.0
    # with T large, votes are nearly equal and class 1 (two neighbours) wins
    assert knn_accuracy(xtr, ytr, xte, torch.tensor([0]), k=3, temperature=100.0)["top1"] == 0.0


def test_small_sets_and_few_classes():
    xtr, ytr, xte, yte = data(n_train=30, n_test=3, classes=3)
    acc = knn_accuracy(xtr, ytr, xte, yte, k=30)
    assert acc["top5"] == 100.0  # 3 classes: the top-5 holds every class
    assert acc["top1"] * 3 / 100 == pytest.approx(round(acc["top1"] * 3 / 100), abs=1e-9)  # 3 test images
    with pytest.raises(UserError, match="larger than the 30 training samples"):
        knn_accuracy(xtr, ytr, xte, yte, k=31)


def test_sweep_equals_single_runs():
    xtr, ytr, xte, yte = data(n_train=250, n_test=40)
    res = knn_sweep(xtr, ytr, xte, yte, ks=(5, 20, 100), temperatures=(0.07, None))
    for k in (5, 20, 100):
        assert res["T=0.07"][f"k={k}"] == knn_accuracy(xtr, ytr, xte, yte, k=k, temperature=0.07)
        assert res["majority"][f"k={k}"] == knn_accuracy(xtr, ytr, xte, yte, k=k, temperature=None)
