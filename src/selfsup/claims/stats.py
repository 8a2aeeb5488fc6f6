"""The statistics behind a claim's verdict: per-seed paired effects, their mean, the 95% confidence interval of
the mean (Student t, n − 1 degrees of freedom) and the minimum detectable effect at 80% power.

A rule's claimed side is decided at the level of that interval: the effect is *detected* when the whole 95%
interval lies on the claimed side of the threshold, i.e. a one-sided t-test at α = 0.025. The minimum detectable
effect (MDE) is the true distance from the threshold that this test detects with probability 0.8, given n and the
spread: with T' a noncentral t (n − 1 dof, noncentrality δ√n/sd), it solves P(T' > t_{0.975, n−1}) = 0.8 exactly
(scipy.stats.nct), not by the normal approximation, so that a planted effect of that size is detected in 80% of
draws. Equivalence ("comparable within ± margin") is two one-sided tests at the same level each: the 95% interval
lies inside (−margin, +margin).

A correlation across training runs and their checkpoints (LeJEPA's loss against accuracy) is Spearman's rank
correlation over every (run, checkpoint) pair, its 95% interval a percentile bootstrap that resamples whole runs
(``cluster_bootstrap_spearman``).
"""

from __future__ import annotations

import math
import statistics

import numpy as np
from scipy import optimize, stats

LEVEL = 0.95  # two-sided level of the interval; each side at 0.025
POWER = 0.8
MAX_SEEDS = 100_000  # beyond this, "seeds needed" is reported as more than MAX_SEEDS


def summary(values: list[float]) -> tuple[int, float, float | None]:
    """(n, mean, sample sd); sd is None for one value."""
    n = len(values)
    return n, statistics.fmean(values), statistics.stdev(values) if n > 1 else None


def t_critical(n: int, level: float = LEVEL) -> float:
    return float(stats.t.ppf(0.5 + level / 2, n - 1))


def interval(mean: float, sd: float, n: int, level: float = LEVEL) -> tuple[float, float]:
    """The ``level`` confidence interval of the mean: mean ± t_{(1+level)/2, n−1} · sd / √n."""
    half = t_critical(n, level) * sd / math.sqrt(n)
    return mean - half, mean + half


def power(effect: float, sd: float, n: int, level: float = LEVEL) -> float:
    """Probability that the ``level`` interval lies wholly above 0 when the true mean is ``effect`` > 0."""
    if sd == 0:
        return 1.0 if effect > 0 else 0.0
    return float(stats.nct.sf(t_critical(n, level), n - 1, effect * math.sqrt(n) / sd))


def mde(sd: float, n: int, level: float = LEVEL, target: float = POWER) -> float:
    """The minimum detectable effect: the true distance from the threshold detected with probability ``target``."""
    if n < 2:
        return math.inf
    if sd == 0:
        return 0.0
    hi = sd
    while power(hi, sd, n, level) < target:
        hi *= 2
    return float(optimize.brentq(lambda e: power(e, sd, n, level) - target, 0.0, hi, xtol=1e-12 * sd))


def seeds_needed(sd: float, effect: float, level: float = LEVEL, target: float = POWER) -> int | None:
    """The smallest n (at least 3) whose MDE at spread ``sd`` is at most ``effect``; None beyond ``MAX_SEEDS``."""
    if effect <= 0 or not math.isfinite(sd):
        return None
    if sd == 0 or mde(sd, 3, level, target) <= effect:
        return 3
    lo, hi = 3, 6
    while mde(sd, hi, level, target) > effect:
        if hi >= MAX_SEEDS:
            return None
        lo, hi = hi, min(2 * hi, MAX_SEEDS)
    while hi - lo > 1:  # mde decreases with n: lo too few, hi enough
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if mde(sd, mid, level, target) <= effect else (mid, hi)
    return hi


# ---- a rank correlation over (run, checkpoint) pairs -----------------------------------------------------------

BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation: Pearson's r of the ranks, ties given their average rank; nan where either
    side is constant or there are fewer than 2 pairs."""
    if len(x) != len(y):
        raise ValueError(f"spearman needs pairs: {len(x)} x values against {len(y)} y values")
    if len(x) < 2:
        return math.nan
    rx, ry = stats.rankdata(x), stats.rankdata(y)
    dx, dy = rx - rx.mean(), ry - ry.mean()
    norm = math.sqrt(float((dx * dx).sum()) * float((dy * dy).sum()))
    return float((dx * dy).sum()) / norm if norm > 0 else math.nan


def cluster_bootstrap_spearman(x: list[float], y: list[float], groups: list, resamples: int = BOOTSTRAP_RESAMPLES,
                               seed: int = BOOTSTRAP_SEED, level: float = LEVEL) -> tuple[float, float]:
    """The percentile bootstrap interval (``level``) of ``spearman(x, y)`` that resamples whole groups: each
    resample draws as many groups as there are, with replacement (a fixed ``seed``), and pools their pairs.

    A group is one training run: its checkpoints' pairs are serially dependent (one trajectory), so resampling
    pairs one by one (or Fisher's z with n pairs) would count each run's checkpoints as independent evidence and
    give too narrow an interval; the runs are the independent units. Resamples whose correlation is undefined
    (a constant side) are left out; (nan, nan) where none is defined."""
    if not len(x) == len(y) == len(groups):
        raise ValueError(f"cluster_bootstrap_spearman needs one group per pair: {len(x)}, {len(y)}, {len(groups)}")
    names = sorted(set(groups), key=str)
    members = {g: np.flatnonzero(np.array([h == g for h in groups])) for g in names}
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    rng = np.random.default_rng(seed)
    values = []
    for draw in rng.integers(0, len(names), size=(resamples, len(names))):
        idx = np.concatenate([members[names[i]] for i in draw])
        r = spearman(xs[idx].tolist(), ys[idx].tolist())
        if math.isfinite(r):
            values.append(r)
    if not values:
        return math.nan, math.nan
    lo, hi = np.quantile(values, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)
