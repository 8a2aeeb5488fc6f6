"""What each claim's latest committed run showed and what scale would decide it, by claim id: docs/CLAIMS.md's
paragraph for a claim not reproduced (beside the claim's own ``decide``, which this replaces).

Written after the run, so it is no part of any claim's definition: ``definition_hash`` hashes a claim's seed module,
not this one, and a note added after a run leaves the run's result current for ``claims run --resume``.
"""

from __future__ import annotations

AFTER_RUN: dict[str, str] = {
    "cut-init-helps-byol-moco-v3":
        "MoCo v3's rule fails: after 100 Fashion-MNIST steps cut-init costs 5.2 points, whose interval lies wholly "
        "below 0 (each accuracy's binomial sd 0.4 points), so at this budget the cut slows MoCo v3 down rather than "
        "helping it; the rebuttal's +4 points are at 100 ImageNet-100 epochs, and a run of several Fashion-MNIST "
        "epochs would test whether the sign turns once the default's norms have grown. BYOL's rule is inconclusive "
        "and cannot show the paper's 28 points on digits: its default (93.1%) sits below the BN ConvNet's random "
        "init (94.4%), at the digits' ceiling; deciding it needs data where the default is far from its ceiling, "
        "e.g. the BN ConvNet on Fashion-MNIST for at least an epoch.",
}
