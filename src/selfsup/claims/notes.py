"""What each claim's latest committed run showed and what scale would decide it, by claim id: docs/CLAIMS.md's
paragraph for a claim not reproduced (beside the claim's own ``decide``, which this replaces).

Written after the run, so it is no part of any claim's definition: ``definition_hash`` hashes a claim's seed module,
not this one, and a note added after a run leaves the run's result current for ``claims run --resume``.
"""

from __future__ import annotations

AFTER_RUN: dict[str, str] = {}
