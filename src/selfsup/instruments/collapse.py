"""The collapse alarm: a run that stops learning says so while it runs.

Each sign is a value the instruments already measure at every ``instruments.every_n_steps`` step, with a threshold
past which a representation carries (almost) nothing about its image. When a sign stays past its threshold for
``window`` consecutive measurements after the lr warm-up, the alarm fires once for that sign: a ``collapse`` event in
``RUN/events.jsonl`` (and every logger), one console line naming the sign, its value, the step and the method's
usual remedies (``TrainingBase.collapse_remedy``), and the report's first section.

Why only after the warm-up: healthy runs reorganise their features while the lr rises. The three 5-epoch
``dino-fmnist`` seeds with Sinkhorn-Knopp targets (which then learnt) dipped from an effective rank of 16-19 to 3
between steps 30 and 100 of their 117 warm-up steps and climbed back to 17-22; judged from step 0, the alarm fired
at step 70 in two of them. A collapse by construction stays collapsed after the warm-up.

The signs and why their thresholds (``benchmarks/collapse_alarm.py`` measures them on runs that collapse by
construction and on healthy presets):

* ``eff_rank_batch`` (every method): the effective rank (principal components for 99% of the variance) of the
  step's backbone features, over its value at the first measurement. VICReg with its invariance term only (a
  collapse by construction) falls 16 → 2 on digits (0.13 of the init; 10 → 2 at batch 64) while its preset rises
  16 → 24; the SwAV and W-MSE Fashion-MNIST runs that learnt nothing in 2 epochs (floor sweep) fell to 0.21-0.30,
  a third of W-MSE's lr (it learnt) to 0.47. Threshold: under 0.25 of the first value.
* ``dim_std_projection_batch`` (the methods whose step gives its projections): SimSiam §4.1's collapse measure,
  the per-dimension std of the step's L2-normalised projections, over its first value. SimSiam without
  stop-gradient and predictor (a collapse by construction) falls to 0.13-0.40 of it from step 150 on digits while
  its backbone's rank only wavers (the projector's BatchNorm keeps it from 0 in train mode); the 10 healthy digits
  presets that have projections stay at 0.67 or more (BYOL's minimum). Threshold: under 0.4 of the first value
  (replayed on the stored runs: it fires on that run at step 190 of 250, on no healthy one).
* ``knn_over_init`` (every joint-embedding run with labels): the kNN top-1 of the evaluated backbone minus its
  random init's, in points: during the run from the kNN monitor (``eval.knn_every_n_steps``; the init measured
  before the first step, 3 measurements in a row), and at the end from the end-of-run report (``runs/finish.py``;
  one measurement, always). W-MSE at 10x its lr ends at 50.4% against its init's 58.5% with no other sign moving:
  a run that stops learning without collapsing. Threshold: under 0 for the monitor's 3 measurements in a row; at the
  end, under minus the noise band a gain must pass (``runs.learning.knn_verdict``: ±7.3 points on the 359 digits test
  images there, so that run still fires; a 2-point drop on 100 test images, inside ±13.9, does not).
* ``dino_teacher_spread`` (DINO, iBOT): the teacher logits' spread over the batch in units of τt. In every 5-epoch
  seed of ``dino-fmnist`` (centre cancelling one collapsed output) it fell under 0.05 by step 70 and to 0.002;
  it is 1.3 at init. Threshold: under 0.05 (targets that no longer depend on the image).
* ``swav_code_entropy_over_log_k`` (SwAV): the codes' mean entropy over log K. Uniform codes (1.0) give the
  swapped prediction nothing to predict; the preset at the code's ε 0.05 sat at 0.91 and learnt nothing, ε 0.025
  at 0.48 learnt. Threshold: above 0.9.
* ``wmse_cov_condition`` (W-MSE): the condition number of the covariance its whitening inverts. The preset
  whose features fell to rank 12 reached 3e6, a third of its lr kept it at 8e4. Threshold: above 1e6.
* ``ijepa_target_std`` and ``ijepa_prediction_std`` (I-JEPA): the spread over the batch of the target encoder's
  pooled features, and of the predictor's outputs over the predicted tokens, over their first values. A collapsed
  target encoder maps every image to one point (spread 0) and the predictor then has one target. On the digits
  pilots (``benchmarks/jepa_choice.py``, seed 100) the target spread kept 0.41 of its first value in the run that
  learnt nothing (the code's init on 4-pixel patches) and 0.62-0.71 in the one that learnt; the prediction spread
  0.44 or more. The runs with the EMA from 0.9 (``ijepa-digits`` and four variants, 8 runs) collapse after the
  warm-up: the loss falls from 0.37 to under 1e-3 and the target spread to 0.05-0.16 of its first value, against
  0.26 and more in the two runs whose loss stayed up (``benchmarks/results/ijepa_collapse_series.json``, replayed by
  ``tests/test_collapse_alarm.py``). Thresholds: the target spread under 0.2 of its first value (every collapse of
  the 8 named by step 150, neither other run); the prediction spread under 0.1 (not calibrated on a collapse).
* ``lejepa_sigreg_over_point_mass`` (LeJEPA): the SIGReg statistic over its value for a point mass at 0 on the
  same global batch (1: as far from the isotropic Gaussian as a collapse to one point). The ``lejepa-digits``
  pilot starts at 0.74 (the random init's projections) and sits at 0.09-0.14 after its warm-up. Threshold: above
  0.5 (not calibrated on a collapse).

Without the kNN monitor (off by default) a run that stops learning without collapsing is named at its end only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Sign:
    """A collapse sign: the instrument ``name`` past ``threshold`` (``above`` it, or under it), ``relative``: the
    value is compared as a fraction of its first measurement."""

    name: str
    threshold: float
    above: bool = False
    relative: bool = False
    meaning: str = ""

    def crossed(self, value: float, first: float | None) -> bool:
        if value != value:  # NaN: not a measurement of collapse (the loss watch owns non-finite values)
            return False
        if self.relative:
            if not first:
                return False
            value = value / first
        return value > self.threshold if self.above else value < self.threshold


KNN_WINDOW = 3  # the kNN monitor's measurements in a row (sparser than the step signs')
KNN_OVER_INIT = Sign("knn_over_init", 0.0, meaning="the backbone's kNN top-1 is under its random init's (points)")
SIGNS = (
    Sign("eff_rank_batch", 0.25, relative=True, meaning="the backbone features' effective rank over its first value"),
    Sign("dim_std_projection_batch", 0.4, relative=True, meaning="the per-dimension std of the L2-normalised "
         "projections over its first value"),
    KNN_OVER_INIT,
    Sign("dino_teacher_spread", 0.05, meaning="the teacher's logits no longer vary over the batch (spread in tau_t)"),
    Sign("swav_code_entropy_over_log_k", 0.9, above=True, meaning="the codes are near uniform (entropy / log K)"),
    Sign("wmse_cov_condition", 1e6, above=True, meaning="the whitened covariance is near singular (condition "
         "number)"),
    Sign("ijepa_target_std", 0.2, relative=True, meaning="the target encoder's pooled features no longer vary over "
         "the batch (spread over its first value)"),
    Sign("ijepa_prediction_std", 0.1, relative=True, meaning="the predictor's outputs no longer vary (spread over "
         "its first value)"),
    Sign("moco_queue_similarity", 0.9, above=True, meaning="MoCo v2's keys are nearly all one direction (their mean "
         "cosine to the queue of past keys)"),
    Sign("tico_covariance_concentration", 0.9, above=True, meaning="TiCo's running covariance has one direction "
         "(||C||_F^2 / tr(C)^2: 1 / dim when isotropic, 1 at collapse)"),
    Sign("lejepa_sigreg_over_point_mass", 0.5, above=True, meaning="the projections are as far from an isotropic "
         "Gaussian as half a collapse to one point (SIGReg over a point mass's)"),
)


def collapse_signs(rank_fraction: float = 0.25) -> tuple[Sign, ...]:
    """The signs, with ``instruments.collapse_rank_fraction`` as the effective rank's threshold."""
    return tuple(replace(s, threshold=rank_fraction) if s.name == "eff_rank_batch" else s for s in SIGNS)


class CollapseAlarm:
    """Counts, per sign, the consecutive measurements past its threshold; ``observe`` returns the signs that
    have now been past it for ``window`` measurements (each sign fires once a run). Its state is checkpointed."""

    def __init__(self, window: int = 5, signs: tuple[Sign, ...] = SIGNS):
        if window < 1:
            raise ValueError("window must be >= 1")
        self.window, self.signs = window, {s.name: s for s in signs}
        self.first: dict[str, float] = {}
        self.run: dict[str, int] = {}
        self.fired: set[str] = set()

    def names(self) -> tuple[str, ...]:
        return tuple(self.signs)

    def observe(self, values: dict[str, float], judge: bool = True) -> list[tuple[Sign, float, float]]:
        """Feed one measurement step's values (name → float; other names are ignored). Returns (sign, value,
        value compared) for each sign that fires now. ``judge`` False (the warm-up): the first values are kept as
        the relative signs' reference, nothing is counted."""
        out = []
        for name, value in values.items():
            sign = self.signs.get(name)
            if sign is None:
                continue
            value = float(value)
            if name not in self.first and value == value:
                self.first[name] = value
            first = self.first.get(name)
            if judge and sign.crossed(value, first):
                self.run[name] = self.run.get(name, 0) + 1
            else:
                self.run[name] = 0
            if self.run[name] >= self.window and name not in self.fired:
                self.fired.add(name)
                out.append((sign, value, value / first if sign.relative and first else value))
        return out

    def replay(self, series: dict[str, list[tuple[int, float]]], warmup_steps: int = 0) -> list[dict]:
        """The alarm over logged series (name → [(step, value)], e.g. a run's metrics.csv columns), as the run
        would have raised it: the measurements in step order, judged from ``warmup_steps`` on."""
        steps = sorted({s for points in series.values() for s, _ in points})
        at = {name: dict(points) for name, points in series.items()}
        out = []
        for step in steps:
            values = {name: v[step] for name, v in at.items() if step in v}
            for sign, value, compared in self.observe(values, judge=step >= warmup_steps):
                out.append({"step": step, "sign": sign.name, "value": compared, "raw": value,
                            "baseline": sign.threshold})
        return out

    def state_dict(self) -> dict:
        return {"first": dict(self.first), "run": dict(self.run), "fired": sorted(self.fired)}

    def load_state_dict(self, state: dict) -> None:
        self.first, self.run = dict(state.get("first", {})), dict(state.get("run", {}))
        self.fired = set(state.get("fired", []))
