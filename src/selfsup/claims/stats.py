"""The statistics behind a claim's verdict: per-seed paired effects, their mean, the 95% confidence interval of
the mean (Student t, n − 1 degrees of freedom) and the minimum detectable effect at 80% power.

A rule's claimed side is decided at the level of that interval: the effect is *detected* when the whole 95%
interval lies on the claimed side of the threshold, i.e. a one-sided t-test at α = 0.025. The minimum detectable
effect (MDE) is the true distance from the threshold that this test detects with probability 0.8, given n and the
spread: with T' a noncentral t (n − 1 dof, noncentrality δ√n/sd), it solves P(T' > t_{0.975, n−1}) = 0.8 exactly
(scipy.stats.nct), not by the normal approximation, so that a planted effect of that size is detected in 80% of
draws. Equivalence ("comparable within ± margin") is two one-sided tests at the same level each: the 95% interval
lies inside (−margin, +margin).
"""

from __future__ import annotations

import math
import statistics

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
