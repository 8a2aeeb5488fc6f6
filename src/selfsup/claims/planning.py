"""Planning a claim's budget from its pilot: how large the spread may really be, given the pilot's few seeds.

A sample sd from n seeds has n − 1 degrees of freedom, and with two or three seeds it often understates the
spread several times: the committed pilots of ``moco-v3-momentum`` (sd 0.18) and ``eigenspace-alignment`` (0.047)
were 4.5× and 3.6× below the sd their 3-seed runs then measured (0.82, 0.17). So a pilot reports, beside the MDE
at its sd, the MDE at the sd's one-sided upper confidence bound (χ², n − 1 dof) at ``UPPER_LEVEL``: the spread a
plan that should not be caught short assumes. The 80% level is this project's choice: at 95% two seeds bound the
sd only within ×15.9, which plans nothing; at 80% the factor is ×3.95 for 2 seeds, ×2.12 for 3 and ×1.56 for 5.

Not part of any claim's definition (``definition_hash`` does not hash this module): it sets how a budget is
chosen, not what a run measures.
"""

from __future__ import annotations

import math

from scipy import stats as scipy_stats

from selfsup.claims import stats

UPPER_LEVEL = 0.8  # one-sided: the true sd lies below the bound with this probability, for normal per-seed values


def sd_upper(sd: float, n: int, level: float = UPPER_LEVEL) -> float:
    """The one-sided ``level`` upper confidence bound of the sd behind a sample sd of ``n`` values:
    sd · √((n − 1) / χ²_{1−level, n−1}), since (n − 1)s²/σ² ~ χ²_{n−1} for normal values."""
    if n < 2:
        return math.inf
    return sd * math.sqrt((n - 1) / float(scipy_stats.chi2.ppf(1 - level, n - 1)))


def planned_mde(sd: float, pilot_seeds: int, run_seeds: int, level: float = UPPER_LEVEL) -> float:
    """The minimum detectable effect of a ``run_seeds`` run (80% power, ``stats.mde``) if the spread is the upper
    bound of the one a ``pilot_seeds`` pilot measured."""
    return stats.mde(sd_upper(sd, pilot_seeds, level), run_seeds)
