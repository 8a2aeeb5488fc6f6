"""Every claim, by id, gathered from the per-seed modules in the seeds' order; and the document each seed is."""

from __future__ import annotations

from selfsup.claims import cookbook, directpred, distillation, embedding_norms, embedding_norms_dinov2, \
    gram_anchoring, ijepa, lejepa, moco_v3, self_flow
from selfsup.claims.suite import Claim

CLAIMS: dict[str, Claim] = {c.id: c for module in (self_flow, embedding_norms, embedding_norms_dinov2, cookbook,
                                                   distillation, directpred, moco_v3, ijepa, lejepa,
                                                   gram_anchoring)
                            for c in module.CLAIMS}

# the paper (or thread) each seed file is; the files are in the project's seeds folder (seeds/README.md); the
# papers of the methods an issue added (issue 51: I-JEPA, LeJEPA) by their arXiv id
PAPERS: dict[str, str] = {
    "000_c0eb5cef7d50dfe6.txt": "Self-Flow: self-supervised flow matching (public issue thread on its alignment loss)",
    "001_83bb0da94ad51f7b.txt": "On the Importance of Embedding Norms in Self-Supervised Learning (author rebuttal)",
    "002_010407c8532905bc.txt": "A Cookbook of Self-Supervised Learning (part 5)",
    "003_7eb28182f9835575.txt": "Understanding Self-Supervised Learning Dynamics without Contrastive Pairs "
                                "(DirectPred)",
    "004_128fc6c8941a5b31.txt": "An Empirical Study of Training Self-Supervised Vision Transformers (MoCo v3)",
    "arXiv:2301.08243": "Self-Supervised Learning from Images with a Joint-Embedding Predictive Architecture "
                        "(I-JEPA)",
    "arXiv:2511.08544": "LeJEPA: Provable and Scalable Self-Supervised Learning Without the Heuristics",
    "arXiv:2508.10104": "DINOv3 (Gram anchoring)",
}


def short(seed: str) -> str:
    """How a table names the document: a seed file by its number (``004``), a paper by its arXiv id."""
    return seed[:3] if seed[:3].isdigit() else seed
