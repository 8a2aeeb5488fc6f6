"""Every claim, by id, gathered from the per-seed modules in the seeds' order."""

from __future__ import annotations

from selfsup.claims import cookbook, directpred, embedding_norms, moco_v3, self_flow
from selfsup.claims.suite import Claim

CLAIMS: dict[str, Claim] = {c.id: c for module in (self_flow, embedding_norms, cookbook, directpred, moco_v3)
                            for c in module.CLAIMS}
