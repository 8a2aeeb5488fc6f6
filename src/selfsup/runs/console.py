"""The run's console: Lightning's chatter off unless ``trainer.verbose=true``.

Off: the ``lightning.pytorch`` / ``lightning.fabric`` loggers at WARNING (their INFO lines: GPU / TPU available, the
``limit_train_batches=1.0`` notice, "Loading `train_dataloader` to estimate ...", "`Trainer.fit` stopped", the DDP
banner "Initializing distributed: GLOBAL_RANK ..." and "distributed_backend=gloo ..."; the tips, such as the
litlogger one) and Lightning's deprecation warnings (``LeafSpec``). On: as Lightning has them. What selfsup says
itself (its ``selfsup:`` lines, the progress bar, the end-of-run report) is unchanged.
"""

from __future__ import annotations

import logging
import warnings

LIGHTNING_LOGGERS = ("lightning.pytorch", "lightning.fabric", "pytorch_lightning", "lightning_fabric")
CHATTER = (  # warnings that say nothing a selfsup user can act on
    ".*LeafSpec.*is deprecated.*",
    ".*litlogger.*",
    ".*Please use `isinstance\\(treespec, TreeSpec\\)`.*",
)


def quiet(verbose: bool = False) -> None:
    """Lightning's chatter off (``verbose`` false) or back on (true) for this process."""
    level = logging.INFO if verbose else logging.WARNING
    for name in LIGHTNING_LOGGERS:
        logging.getLogger(name).setLevel(level)
    for pattern in CHATTER:
        warnings.filterwarnings("default" if verbose else "ignore", message=pattern)
