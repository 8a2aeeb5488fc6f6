"""The label-free learning signal (issue 63 item 5): each measure against a hand computation on tiny tensors, the
verdict's rule, and an unlabelled folder's run that prints the verdict against its start."""

from __future__ import annotations

import json
import math

import pytest
import torch
from PIL import Image

from selfsup.eval import label_free
from selfsup.eval.label_free import alignment, nn_agreement, uniformity, view_uniformity
from selfsup.runs.learning import (LABEL_FREE_VERDICTS, NOISE_Z, RANK_GAIN, RANK_KEPT, agreement_band,
                                   label_free_verdict, label_free_words)
from ssl_helpers import TINY, run_cli


def test_alignment_is_the_mean_squared_distance_of_the_normalised_pairs():
    z1 = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
    z2 = torch.tensor([[8.0, 6.0], [0.0, 2.0]])
    # (0.6, 0.8) − (0.8, 0.6): 0.04 + 0.04; (1, 0) − (0, 1): 2; the mean
    assert alignment(z1, z2) == pytest.approx((0.08 + 2.0) / 2)
    assert alignment(z1, 7 * z1) == pytest.approx(0.0)
    assert alignment(z1, z2, alpha=1) == pytest.approx((math.sqrt(0.08) + math.sqrt(2.0)) / 2)


def test_uniformity_is_the_log_mean_gaussian_potential_of_the_pairs():
    z = torch.tensor([[2.0, 0.0], [0.0, 5.0], [-1.0, 0.0]])  # on the circle: squared distances 2, 4, 2
    assert uniformity(z) == pytest.approx(math.log((2 * math.exp(-4) + math.exp(-8)) / 3))
    assert uniformity(z, t=1) == pytest.approx(math.log((2 * math.exp(-2) + math.exp(-4)) / 3))
    assert uniformity(torch.ones(4, 3)) == pytest.approx(0.0)  # one point: the collapse's 0
    other = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # squared distance 2
    assert view_uniformity(z, other) == pytest.approx((uniformity(z) + math.log(math.exp(-4))) / 2)


def test_nn_agreement_counts_the_images_whose_own_second_view_is_the_nearest_strictly():
    z1 = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    z2 = torch.tensor([[1.0, 0.1], [0.1, 1.0], [1.0, 0.0]])
    # row 0: cos 0.995 to its own, 1 to row 2 (a miss); row 1: 0.995 own, 0.0995, 0 (a hit);
    # row 2: 0.707 own, 0.774 to row 0 (a miss)
    assert nn_agreement(z1, z2) == pytest.approx(1 / 3)
    assert nn_agreement(z1, z1) == 1.0
    assert nn_agreement(torch.ones(5, 3), torch.ones(5, 3)) == 0.0  # every tie a miss: collapse scores 0


def test_nn_agreement_in_chunks_equals_the_whole_matrix(monkeypatch):
    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(37, 6, generator=g), torch.randn(37, 6, generator=g)
    z2[:20] = z1[:20] + 0.3 * z2[:20]
    sim = torch.nn.functional.normalize(z1, dim=1) @ torch.nn.functional.normalize(z2, dim=1).T
    by_hand = sum(int(sim[i, i] > torch.cat([sim[i, :i], sim[i, i + 1:]]).max()) for i in range(37)) / 37
    monkeypatch.setattr(label_free, "AGREEMENT_CHUNK", 5)
    assert nn_agreement(z1, z2) == pytest.approx(by_hand) and 0 < by_hand < 1


def measured(agreement: float, rankme: float, effective: int) -> dict:
    return {"nn_agreement": agreement, "rankme": rankme, "effective_rank_99": effective, "alignment": 0.5,
            "uniformity": -1.0}


def lf(trained: float, start: float, rank_trained: float = 10.0, rank_start: float = 10.0, n: int = 100,
       eff_trained: int = 20, eff_start: int = 20) -> dict:
    return {"images": n, "scored_on": f"{n} images", "views": "two crops",
            "pretrained": measured(trained, rank_trained, eff_trained),
            "random_init": measured(start, rank_start, eff_start),
            "labels": {"pretrained": "pretrained", "random_init": "random_init"}}


def test_the_agreement_band_is_the_knn_binomial_rule():
    assert agreement_band(lf(50, 50)) == pytest.approx(100 * NOISE_Z * math.sqrt(0.5 / 100))  # ±13.86
    assert agreement_band(lf(90, 10, n=400)) == pytest.approx(100 * 1.96 * math.sqrt((0.09 + 0.09) / 400))


def test_the_verdict_rule():
    assert label_free_verdict(lf(30, 10))[0] == "learned"  # +20 past ±10.7
    assert label_free_verdict(lf(18, 10))[0] == "noise"  # +8 inside ±9.6, the rank unmoved (an unmoved backbone)
    assert label_free_verdict(lf(2, 20))[0] == "collapse"  # −18 past ±8.3
    verdict, why = label_free_verdict(lf(18, 10, rank_trained=RANK_GAIN * 10 + 0.01))
    assert verdict == "learned" and "RankMe rose" in why  # the agreement inside its noise, the rank past its gain
    assert label_free_verdict(lf(18, 10, rank_trained=RANK_GAIN * 10 - 0.01))[0] == "noise"
    verdict, why = label_free_verdict(lf(60, 10, eff_trained=int(RANK_KEPT * 20) - 1))
    assert verdict == "collapse" and "collapsed" in why  # a rise of the agreement does not excuse a lost rank
    assert label_free_verdict(lf(60, 10, eff_trained=int(RANK_KEPT * 20)))[0] == "learned"  # at the share: kept
    assert label_free_verdict(lf(60, 10, rank_trained=2.0))[0] == "learned"  # RankMe falling is no collapse
    assert label_free_verdict(lf(2, 20, rank_trained=30))[0] == "collapse"  # a fall past the band, whatever the rank
    assert set(LABEL_FREE_VERDICTS.values()) == {"gain", "noise", "loss"}


def test_the_printed_verdict_names_its_start_and_the_knn_verdict_beside_it():
    lines = label_free_words(lf(30, 10), "gain")
    assert lines[-1].startswith("  label-free verdict against its random init: learned (NN agreement +20.00 points")
    assert lines[-1].endswith("the kNN verdict: gain (agrees)")
    assert label_free_words(lf(30, 10), "noise")[-1].endswith("the kNN verdict: noise (disagrees)")
    assert label_free_words(lf(12, 10), "loss")[-1].endswith("the kNN verdict: loss (agrees)")  # both: not learned
    start = lf(30, 10)
    start["labels"]["random_init"] = "start (weights: w.safetensors)"
    assert "against its start (weights: w.safetensors): learned" in label_free_words(start)[-1]


@pytest.mark.train
def test_an_unlabelled_folder_run_prints_the_label_free_verdict_against_its_start(tmp_path):
    root = tmp_path / "photos"
    root.mkdir()
    for i in range(16):
        Image.new("RGB", (10, 10), (15 * i, 90, 255 - 15 * i)).save(root / f"{i:02d}.png")
    code, out, err = run_cli("pretrain", "byol-digits", *TINY, "data.name=images", f"data.root={root}",
                             "data.image_size=8", "data.batch_size=4", f"output_dir={tmp_path}", "name=r")
    assert code == 0, err
    assert "no kNN report: data.name=images has no labels" in out
    head = next(line for line in out.splitlines() if line.startswith("label-free"))
    assert f"on 3 images of {root} (20% of train/ seeded 0, seen in training: no test split)" in head
    verdict = next(line for line in out.splitlines() if "label-free verdict" in line)
    assert "label-free verdict against its random init: " in verdict and "kNN verdict" not in verdict
    saved = json.loads((tmp_path / "r" / "label_free.json").read_text())
    assert saved["images"] == 3 and saved["verdict"] in verdict
    assert saved["pretrained"]["rankme"] > 0 and 0 <= saved["random_init"]["nn_agreement"] <= 100
    facts = json.loads((tmp_path / "r" / "run.json").read_text())
    assert facts["label_free"]["verdict"] == saved["verdict"]


def test_the_report_shows_the_measures_beside_the_start_and_the_verdict():
    from selfsup.report import label_free_rows

    saved = {**lf(30, 10), "verdict": "learned", "why": "NN agreement +20.00 points"}
    rows = label_free_rows(saved, "random init")
    assert rows[0] == ("NN agreement of two views, trained / random init", "30.00% / 10.00%",
                       "100 images, two views each")
    assert ("effective rank (99%), trained / random init", "20 / 20", "") in rows
    assert rows[-1] == ("label-free verdict", "learned", "NN agreement +20.00 points")
    assert label_free_rows({}, "random init") == []
