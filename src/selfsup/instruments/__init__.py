"""Online evaluators for pretraining, as Lightning callbacks: a dense kNN monitor and an online linear probe."""

from selfsup.instruments.knn_monitor import KNNMonitor
from selfsup.instruments.online_probe import OnlineLinearProbe


def monitor_callbacks(cfg) -> list:
    """The callbacks ``cfg.eval`` asks for (eval.knn_every_n_steps > 0, eval.online_probe)."""
    ev = cfg.eval
    out = []
    if ev.knn_every_n_steps:
        out.append(KNNMonitor(ev.knn_every_n_steps, k=ev.knn_k, temperature=ev.knn_temperature,
                              train_size=ev.knn_monitor_train, test_size=ev.knn_monitor_test,
                              batch_size=ev.batch_size, seed=cfg.trainer.seed))
    if ev.online_probe:
        out.append(OnlineLinearProbe(lr=ev.online_probe_lr))
    return out


__all__ = ["KNNMonitor", "OnlineLinearProbe", "monitor_callbacks"]
