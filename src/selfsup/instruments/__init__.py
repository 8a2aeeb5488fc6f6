"""Online evaluators and training-dynamics instruments for pretraining, as Lightning callbacks."""

from selfsup.instruments.collapse import KNN_OVER_INIT, KNN_WINDOW, CollapseAlarm, collapse_signs
from selfsup.instruments.dynamics import (Alignment, EmbeddingNorms, GradientNorms, PredictorAlignment,
                                          RankCollapse, StepInstruments)
from selfsup.instruments.knn_monitor import KNNMonitor
from selfsup.instruments.online_probe import OnlineLinearProbe


def monitor_callbacks(cfg) -> list:
    """The callbacks ``cfg.eval`` (kNN monitor, online probe) and ``cfg.instruments`` ask for."""
    ev, ins = cfg.eval, cfg.instruments
    out = []
    if ev.knn_every_n_steps:
        out.append(KNNMonitor(ev.knn_every_n_steps, k=ev.knn_k, temperature=ev.knn_temperature,
                              train_size=ev.knn_monitor_train, test_size=ev.knn_monitor_test,
                              batch_size=ev.batch_size, seed=cfg.trainer.seed,
                              dip_threshold=ins.knn_dip if ins.enabled else 0.0,
                              alarm=CollapseAlarm(KNN_WINDOW, (KNN_OVER_INIT,))
                              if ins.enabled and ins.collapse_alarm else None))
    if ev.online_probe:
        out.append(OnlineLinearProbe(lr=ev.online_probe_lr))
    if not ins.enabled:
        return out
    n = ins.every_n_steps
    alarm = (CollapseAlarm(ins.collapse_window, collapse_signs(ins.collapse_rank_fraction)) if ins.collapse_alarm
             else None)
    out.append(StepInstruments(n, alarm))  # a method's own signs (StepOutput.instruments), the collapse alarm
    if ins.embedding_norms:
        out.append(EmbeddingNorms(n))
    if ins.gradients:
        out.append(GradientNorms(n, spike_k=ins.spike_k, spike_window=ins.spike_window,
                                 spike_min_history=ins.spike_min_history, spikes=ins.spikes))
    if ins.alignment:
        out.append(Alignment(n))
    if ins.rank_every_n_steps:
        out.append(RankCollapse(ins.rank_every_n_steps, ins.rank_samples, seed=cfg.trainer.seed))
    if ins.predictor_alignment:
        out.append(PredictorAlignment(n, top_k=ins.predictor_top_k, rho=ins.correlation_rho))
    return out


__all__ = ["Alignment", "CollapseAlarm", "EmbeddingNorms", "GradientNorms", "KNNMonitor", "OnlineLinearProbe",
           "PredictorAlignment", "RankCollapse", "StepInstruments", "monitor_callbacks"]
