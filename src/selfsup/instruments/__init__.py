"""Online evaluators for pretraining, as Lightning callbacks: a dense kNN monitor and an online linear probe."""

from selfsup.instruments.knn_monitor import KNNMonitor
from selfsup.instruments.online_probe import OnlineLinearProbe


def monitor_callbacks(cfg) -> list:
    """The callbacks ``cfg.eval`` asks for (eval.knn_every_n_steps > 0, eval.online_probe)."""
    ev = cfg.eval
    out = []
    every = getattr(ev, "knn_every_n_steps", 0)
    if every:
        out.append(KNNMonitor(every, k=ev.knn_k, temperature=ev.knn_temperature,
                              train_size=getattr(ev, "knn_monitor_train", 5000),
                              test_size=getattr(ev, "knn_monitor_test", 1000), batch_size=ev.batch_size,
                              seed=cfg.trainer.seed))
    if getattr(ev, "online_probe", False):
        out.append(OnlineLinearProbe(lr=getattr(ev, "online_probe_lr", 1e-3)))
    return out


__all__ = ["KNNMonitor", "OnlineLinearProbe", "monitor_callbacks"]
