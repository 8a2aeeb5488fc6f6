"""The statistics behind the claims' verdicts, pinned against scipy and values computed by hand, and the stated
power checked over simulated draws."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sp

from selfsup.claims import stats
from selfsup.claims.suite import (INCONCLUSIVE, MIN_SEEDS, NOT_REPRODUCED, REPRODUCED, Rule, binomial_sd, judge,
                                  verdict)


def test_interval_is_student_t_with_n_minus_1_dof():
    # by hand: [0, 1, 2] has mean 1, sd 1; t_{0.975, 2} = 4.302652729911275; half-width 4.3027 / √3 = 2.48414
    assert stats.interval(1.0, 1.0, 3) == pytest.approx((1 - 2.484137711750, 1 + 2.484137711750), abs=1e-9)
    values = [1.2, 3.4, 2.2, 0.5, 2.9]
    n, mean, sd = stats.summary(values)
    lo, hi = sp.t.interval(0.95, n - 1, loc=np.mean(values), scale=sp.sem(values))
    assert (n, mean, sd) == (5, pytest.approx(2.04), pytest.approx(np.std(values, ddof=1)))
    assert stats.interval(mean, sd, n) == pytest.approx((lo, hi), abs=1e-12)


def test_mde_is_the_effect_detected_at_80_percent_power():
    for sd, n in ((1.0, 3), (5.0, 5), (0.2, 12)):
        effect = stats.mde(sd, n)
        crit = sp.t.ppf(0.975, n - 1)
        assert sp.nct.sf(crit, n - 1, effect * math.sqrt(n) / sd) == pytest.approx(0.8, abs=1e-9)
        assert stats.mde(2 * sd, n) == pytest.approx(2 * effect)  # linear in the spread
    # many seeds: the normal approximation (z_0.975 + z_0.8) sd / √n = 2.8016 / √n
    assert stats.mde(1.0, 2000) == pytest.approx((sp.norm.ppf(0.975) + sp.norm.ppf(0.8)) / math.sqrt(2000), rel=2e-3)
    assert stats.mde(1.0, 3) == pytest.approx(3.2640, abs=1e-4)  # larger than the normal 1.6176: t with 2 dof
    assert stats.mde(1.0, 1) == math.inf and stats.mde(0.0, 4) == 0.0


@pytest.mark.parametrize("n, sd", [(3, 1.0), (8, 2.5)])
def test_a_planted_effect_of_the_mde_is_detected_at_the_stated_power(n, sd):
    """Draws of n per-seed effects with mean MDE: the 95% interval lies wholly above 0 in 80% of them (20,000
    draws: binomial sd 0.3 points); with no effect, in 2.5% of them (the one-sided level)."""
    rng = np.random.default_rng(0)
    effect = stats.mde(sd, n)
    for planted, rate in ((effect, 0.8), (0.0, 0.025)):
        x = rng.normal(planted, sd, size=(20_000, n))
        lo = x.mean(1) - sp.t.ppf(0.975, n - 1) * x.std(1, ddof=1) / math.sqrt(n)
        assert (lo > 0).mean() == pytest.approx(rate, abs=0.012)


def test_seeds_needed_is_the_smallest_n_whose_mde_reaches_the_effect():
    need = stats.seeds_needed(5.0, 1.0)  # the "about 200 seeds" for a 1-point effect at 5 points of spread
    assert need == 199
    assert stats.mde(5.0, need) <= 1.0 < stats.mde(5.0, need - 1)
    assert stats.seeds_needed(0.1, 5.0) == 3  # never fewer than a training claim's 3
    assert stats.seeds_needed(1.0, 1e-5) is None  # more than MAX_SEEDS


def test_a_rule_holds_only_when_the_whole_interval_is_on_its_side():
    gain = Rule("gain", ">", 0.0)
    assert gain.judge([2.0, 3.0, 4.0]) == REPRODUCED  # 3 ± 2.48
    assert gain.judge([0.0, 1.0, 2.0]) == INCONCLUSIVE  # 1 ± 2.48: mean ± sd (0, 2] would have held
    assert gain.judge([0.5, 1.0, 1.5]) == INCONCLUSIVE  # 1 ± 1.24
    assert gain.judge([-4.0, -3.0, -2.0]) == NOT_REPRODUCED
    assert Rule("x", "<", 0.1).judge([0.01, 0.02, 0.03]) == REPRODUCED


def test_a_training_claim_needs_three_seeds_a_simulator_one():
    gain = Rule("gain", ">", 0.0)
    for values in ([5.0], [5.0, 5.1]):
        s = gain.stats(values)
        assert s["verdict"] == INCONCLUSIVE and f"a training claim needs at least {MIN_SEEDS}" in s["why"]
    assert gain.stats([5.0, 5.1])["interval"] is not None  # still stated
    assert gain.judge([1.0], deterministic=True) == REPRODUCED and gain.judge([0.0], deterministic=True) == \
        NOT_REPRODUCED  # the threshold itself does not pass a strict ">"


def test_an_inconclusive_rule_says_its_power_and_the_seeds_it_needs():
    values = [-3.0, 1.0, 5.0]  # mean 1, sd 4: MDE 13.06 at n = 3
    s = Rule("gain", ">", 0.0, paper=2.2).stats(values)
    assert s["verdict"] == INCONCLUSIVE and s["underpowered"] is True
    assert s["mde"] == pytest.approx(stats.mde(4.0, 3)) and s["paper_effect"] == pytest.approx(2.2)
    assert s["seeds_needed"] == stats.seeds_needed(4.0, 2.2) and "underpowered" in s["why"]
    assert s["interval"] == pytest.approx(list(stats.interval(1.0, 4.0, 3)))
    s = Rule("gain", ">", 0.0, paper=30.0).stats(values)
    assert s["underpowered"] is False and s["seeds_needed"] == 3
    s = Rule("gain", ">", 0.0).stats(values)  # no paper effect: the seeds for the observed distance
    assert s["underpowered"] is None and s["seeds_needed"] == stats.seeds_needed(4.0, 1.0)
    assert Rule("gain", ">", 0.0).stats([1.0, math.nan, 2.0])["why"] == "undefined for 1 of 3 seed(s)"


def test_comparable_is_two_one_sided_tests_within_the_margin():
    same = Rule("gain", "within", 2.0)
    assert str(same) == "gain within ±2"
    assert same.judge([-0.2, 0.1, 0.3]) == REPRODUCED  # 0.067 ± 0.63, inside (-2, 2)
    assert same.judge([5.0, 6.0, 7.0]) == NOT_REPRODUCED  # 6 ± 2.48: wholly outside
    assert same.judge([-7.0, -6.0, -5.0]) == NOT_REPRODUCED
    assert same.judge([0.0, 1.0, 2.0]) == INCONCLUSIVE  # 1 ± 2.48 crosses the margin
    assert same.stats([0.0, 1.0, 2.0])["paper_effect"] == 2.0


def test_verdict_needs_every_rule_and_reports_the_test_images():
    rules = (Rule("a", ">", 0.0, arms=("x", "y")), Rule("b", "<", 1.0))
    ok, bad, unsure = [1.0, 1.1, 1.2], [2.0, 2.1, 2.2], [0.0, 1.0, 2.0]
    assert verdict(rules, {"a": ok, "b": [0.5, 0.4, 0.6]}) == REPRODUCED
    assert verdict(rules, {"a": ok, "b": bad}) == NOT_REPRODUCED
    assert verdict(rules, {"a": unsure, "b": [0.5, 0.4, 0.6]}) == INCONCLUSIVE
    assert verdict(rules, {"a": unsure, "b": bad}) == NOT_REPRODUCED
    _, judged = judge(rules, {"a": ok, "b": bad, "x": [70.0] * 3, "y": [69.0] * 3}, test_images=360)
    assert judged[0]["test_images"] == 360 and "test_images" not in judged[1]
    # the binomial sd of one top-1 near 70% on 360 images: 100·√(0.7·0.3/360) = 2.42 points (the 2.4)
    assert judged[0]["binomial_sd"]["x"] == pytest.approx(2.4152, abs=1e-4) == binomial_sd(70.0, 360)
    assert binomial_sd(70.0, 10_000) == pytest.approx(0.458, abs=1e-3)  # Fashion-MNIST's test split


def test_digits_test_split_has_the_stated_images():
    from selfsup.claims.suite import TEST_IMAGES
    from selfsup.config import DataConfig
    from selfsup.data.datasets import load_dataset

    assert len(load_dataset(DataConfig(name="digits"), "test")) == TEST_IMAGES["digits"]


def test_a_rule_names_its_own_test_split_where_it_is_not_the_claim_s():
    from selfsup.claims.registry import CLAIMS
    from selfsup.claims.suite import TEST_IMAGES, declared_test_images, judge_result

    rules = (Rule("a", ">", 0.0, arms=("x",)), Rule("b", ">", 0.0, arms=("y",), test_data="fashion-mnist"))
    _, judged = judge(rules, {"a": [1.0] * 3, "b": [1.0] * 3, "x": [70.0] * 3, "y": [70.0] * 3}, test_images=359)
    assert [s["test_images"] for s in judged] == [359, 10_000]
    assert judged[1]["binomial_sd"]["y"] == pytest.approx(binomial_sd(70.0, 10_000))
    claim = CLAIMS["cut-init-helps-byol-moco-v3"]  # BYOL on digits, MoCo v3 on Fashion-MNIST
    assert declared_test_images(claim) == {TEST_IMAGES["digits"], TEST_IMAGES["fashion-mnist"]}
    metrics = {k: [1.0, 2.0, 3.0] for k in ("knn_gain_byol", "knn_gain_moco_v3")}
    metrics.update({k: [70.0] * 3 for k in ("byol_cut", "byol_default", "moco_v3_cut", "moco_v3_default")})
    _, judged = judge_result(claim, metrics)
    assert [s["test_images"] for s in judged] == [359, 10_000]


def test_a_pilot_states_its_spread_and_the_mde_it_gives_at_three_seeds():
    from selfsup.claims.suite import MIN_SEEDS, Pilot

    pilot = Pilot(seeds=2, steps=1000, wall_s=600.0, sd=(("gain", 1.5),), note="one method of two")
    assert pilot.mde() == {"gain": pytest.approx(stats.mde(1.5, MIN_SEEDS))}
    assert pilot.mde(5)["gain"] < pilot.mde()["gain"]
    text = str(pilot)
    assert text.startswith("2 pilot seeds × 1000 steps per run, 10.0 min") and text.endswith("one method of two")
    assert f"gain: sd 1.5 → MDE at 3 seeds {stats.mde(1.5, 3):.3g}" in text
    assert eval(repr(pilot), {"Pilot": Pilot}) == pilot  # pasted into a claim's definition as printed


def test_the_sd_upper_bound_matches_the_normal_quantile_for_two_seeds_and_covers_at_its_level():
    """Two seeds: (n − 1)s²/σ² = Z², so P(σ ≤ s·c) = 0.8 gives c = 1/Φ⁻¹(0.6), by hand; for 3 and 5 seeds the
    bound covers the true sd in 80% of simulated pilots (2,000 draws each, ±2.7 points at 3 binomial sds)."""
    from statistics import NormalDist

    from selfsup.claims.planning import planned_mde, sd_upper

    assert sd_upper(1.0, 2) == pytest.approx(1 / NormalDist().inv_cdf(0.6), rel=1e-9)  # 3.947
    assert sd_upper(0.5, 3) == pytest.approx(0.5 * math.sqrt(2 / (-2 * math.log(0.8))), rel=1e-9)  # χ²₂ = Exp(1/2)
    assert sd_upper(1.0, 1) == math.inf
    rng = np.random.default_rng(0)
    for n in (3, 5):
        samples = rng.normal(0.0, 2.0, size=(2000, n))
        covered = np.mean([sd_upper(float(s), n) >= 2.0 for s in samples.std(axis=1, ddof=1)])
        assert abs(covered - 0.8) < 3 * math.sqrt(0.8 * 0.2 / 2000)
    assert planned_mde(1.0, 2, 3) == pytest.approx(stats.mde(sd_upper(1.0, 2), 3))
    assert planned_mde(1.0, 2, 3) > stats.mde(1.0, 3)


def test_spearman_is_pearson_of_average_ranks_by_hand():
    # no ties: 1 − 6Σd²/(n(n² − 1)) with d = (−1, 1, −1, 1, 0): 1 − 6·4/120 = 0.8
    assert stats.spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)
    # ties get their average rank: x ranks (1, 2.5, 2.5, 4), y ranks (1, 3, 2, 4): 4.5 / √(4.5 · 5) = 3/√10
    assert stats.spearman([1, 2, 2, 4], [10, 30, 20, 40]) == pytest.approx(3 / math.sqrt(10))
    assert stats.spearman([1, 2, 2, 4], [10, 30, 20, 40]) == pytest.approx(sp.spearmanr([1, 2, 2, 4],
                                                                                      [10, 30, 20, 40])[0])
    assert stats.spearman([3, 2, 1], [1, 2, 3]) == pytest.approx(-1.0)
    assert math.isnan(stats.spearman([1, 1, 1], [1, 2, 3])) and math.isnan(stats.spearman([1], [2]))
    with pytest.raises(ValueError, match="pairs"):
        stats.spearman([1, 2], [1])


def test_the_cluster_bootstrap_resamples_whole_runs_by_hand():
    # run A alone (or twice) has ρ −1, run B alone (or twice: ranks 2r − 0.5, the same ρ) 0.5; A with B pooled:
    # x ranks (3, 2, 1, 4, 5, 6), y ranks (2.5, 4.5, 6, 1, 4.5, 2.5): −9.5 / √(17.5 · 16.5) = −0.5591. The
    # resamples AA, AB / BA, BB come with probability 1/4, 1/2, 1/4, so the 2.5% and 97.5% points are −1 and 0.5
    x = [3, 2, 1, 4, 5, 6]
    y = [1, 2, 3, 0, 2, 1]
    runs = ["A", "A", "A", "B", "B", "B"]
    assert stats.spearman(x[3:], y[3:]) == pytest.approx(0.5)
    assert stats.spearman(x, y) == pytest.approx(-9.5 / math.sqrt(17.5 * 16.5))
    assert stats.spearman(x + x[3:], y + y[3:]) != pytest.approx(stats.spearman(x, y))  # a run drawn twice counts
    assert stats.cluster_bootstrap_spearman(x, y, runs) == pytest.approx((-1.0, 0.5))
    assert stats.cluster_bootstrap_spearman(x, y, runs, seed=7) == pytest.approx((-1.0, 0.5))
    # one run: every resample is that run, so the interval is its ρ; seeded: the same draws give the same interval
    assert stats.cluster_bootstrap_spearman(x[:3], y[:3], runs[:3]) == pytest.approx((-1.0, -1.0))
    rng = np.random.default_rng(1)
    a, b, g = rng.normal(size=40).tolist(), rng.normal(size=40).tolist(), [i // 8 for i in range(40)]
    assert stats.cluster_bootstrap_spearman(a, b, g) == stats.cluster_bootstrap_spearman(a, b, g)
    with pytest.raises(ValueError, match="one group per pair"):
        stats.cluster_bootstrap_spearman(x, y, runs[:5])


def _trajectories(runs: int, sign: float) -> dict:
    """Runs whose every (loss, accuracy) pair lies on one decreasing (sign −1) or increasing (+1) line."""
    m = {"loss": [], "acc": [], "run": []}
    for g in range(runs):
        for k in range(3):
            m["loss"].append(10.0 * g + 3 - k)
            m["acc"].append(sign * (10.0 * g + 3 - k))
            m["run"].append(f"r{g}")
    return m


def test_a_correlation_rule_is_judged_on_the_run_bootstrap_and_needs_three_runs():
    rule = Rule("rho", "<", 0.0, paper=-0.9452, pairs=("loss", "acc", "run"))
    s = rule.correlation_stats(_trajectories(3, -1.0))
    assert s["verdict"] == REPRODUCED and s["mean"] == pytest.approx(-1.0) and s["interval"] == pytest.approx([-1, -1])
    assert s["n"] == 3 and s["pairs"] == 9 and s["mde"] is None and "bootstrap over the runs" in s["interval_kind"]
    assert rule.correlation_stats(_trajectories(3, 1.0))["verdict"] == NOT_REPRODUCED
    two = rule.correlation_stats(_trajectories(2, -1.0))
    assert two["verdict"] == INCONCLUSIVE and "2 run(s) of 2 seed(s)" in two["why"]
    # a seed list named: six runs of two seeds (three runs a seed) are not three seeds; of three seeds they are
    six = _trajectories(6, -1.0)
    six["seed"] = [int(r[1:]) // 3 for r in six["run"]]
    with_seeds = Rule("rho", "<", 0.0, pairs=("loss", "acc", "run", "seed"))
    assert with_seeds.correlation_stats(six)["verdict"] == INCONCLUSIVE
    six["seed"] = [int(r[1:]) // 2 for r in six["run"]]
    assert with_seeds.correlation_stats(six)["verdict"] == REPRODUCED
    flat = _trajectories(3, -1.0)
    flat["acc"] = [5.0] * 9
    assert rule.correlation_stats(flat)["verdict"] == INCONCLUSIVE  # ρ undefined
    # judge() takes the correlation from the pairs, not from the metric's own (reported) list
    m = {**_trajectories(3, -1.0), "rho": [0.99]}
    assert verdict((rule,), m) == REPRODUCED
    assert judge((rule,), m)[1][0]["mean"] == pytest.approx(-1.0)
