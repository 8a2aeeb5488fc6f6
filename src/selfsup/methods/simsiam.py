"""SimSiam (Chen & He 2021): a predictor and a stop-gradient, no momentum encoder, no negatives.

Loss ``½ D(p1, sg(z2)) + ½ D(p2, sg(z1))`` with D = −cos (official main_simsiam.py). Projector:
3 bias-free layers, the last followed by BN(affine=False) (``proj_last_affine``: a learnable γ, β, as the
embedding-norm code); predictor: dim → 512 (BN, ReLU) → dim
(the last Linear with bias). ``optim.fix_predictor_lr`` keeps the predictor's lr at its peak.
Ablations (SimSiam §4.1–4.2, DirectPred §1): ``method.stop_gradient=false`` lets the gradient flow into
both branches; ``method.predictor=none`` removes the predictor. Both collapse.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from selfsup.losses import negative_cosine
from selfsup.methods.base import SSLMethod, encode_views
from selfsup.models.heads import mlp
from selfsup.predictors import DirectPredConfig, after_step_hooks, build_predictor, check_predictor
from selfsup.step import StepOutput


@dataclass
class SimSiamConfig:
    """SimSiam hyper-parameters; defaults from the official ImageNet code."""

    proj_hidden_dim: int = 2048
    dim: int = 2048
    pred_hidden_dim: int = 512
    # true: the projector's last BN has a learnable scale and shift, as the embedding-norm code's SimSiam projector
    # (SSLEmbeddingNorms models.py:29-84, affine BatchNorm1d); false: affine=False, the official SimSiam code
    proj_last_affine: bool = False
    predictor: str = "mlp"  # mlp | linear | symmetric | directpred | directcopy | none (selfsup.predictors)
    directpred: DirectPredConfig = field(default_factory=DirectPredConfig)
    stop_gradient: bool = True  # false: SimSiam §4.1's ablation (no sg on z; it collapses)

    def validate(self) -> None:
        check_predictor(self)


class SimSiam(SSLMethod):
    """z = projector(backbone(x)); p = predictor(z)."""

    Config = SimSiamConfig
    collapse_remedy = ("keep the predictor and the stop-gradient; a fixed predictor lr (SimSiam's fix_pred_lr); a "
                       "lower optim.base_lr or a larger optim.weight_decay")
    recipe = "simsiam"
    loss_embedding = ("projector", "predictor")  # the predictions are normalised by the loss

    def __init__(self, cfg, info):
        super().__init__(cfg, info)
        c = cfg.method
        self.projector = mlp(self.backbone.num_features, c.proj_hidden_dim, c.dim, 3, last_bn=True,
                             last_bn_affine=c.proj_last_affine)
        self.predictor = build_predictor(c, c.dim, lambda: mlp(c.dim, c.pred_hidden_dim, c.dim, 2, last_bias=True))
        self.post_step_hooks += after_step_hooks(self.predictor)

    def trainable(self):
        return {"backbone": self.backbone, "projector": self.projector, "predictor": self.predictor}

    def forward_views(self, views):
        h1, h2 = encode_views(self.backbone, views)  # one call when the backbone has no BatchNorm
        z1, z2 = self.projector(h1), self.projector(h2)
        p1, p2 = self.grad_scale(self.predictor(z1)), self.grad_scale(self.predictor(z2))
        sg = self.cfg.method.stop_gradient
        loss = 0.5 * (negative_cosine(p1, z2, sg) + negative_cosine(p2, z1, sg))
        return StepOutput(loss, embedding=h1.detach(), embedding2=h2.detach(), projection=z1.detach(),
                          prediction=p1.detach(), target=z2.detach())
