"""A crafted .ckpt whose pickle carries code is refused (exit 2, one line) by eval and --resume; the code never runs."""

from __future__ import annotations

import pytest
import torch
import yaml

from selfsup.config import load_run_config, to_dict
from selfsup.methods.build import build_method, data_info
from selfsup.data.datasets import load_dataset
from ssl_helpers import TINY, assert_user_error, run_cli


class Payload:
    """Unpickling this object calls open(marker, "w"): the marker file appears iff the payload ran."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


@pytest.fixture
def crafted_run(tmp_path):
    """A run folder whose last.ckpt holds real weights of the run's model plus a payload."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    cfg = load_run_config("moco-v3-vit-digits", [*TINY, f"output_dir={tmp_path}", "name=run"])
    (run / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    model = build_method(cfg, data_info(cfg, load_dataset(cfg.data, "train")))
    marker = tmp_path / "payload-ran"
    torch.save({"state_dict": model.state_dict(), "global_step": 0, "extra": Payload(marker)},
               run / "checkpoints" / "last.ckpt")
    return run, marker


def test_the_payload_is_real(crafted_run):
    run, marker = crafted_run
    torch.load(run / "checkpoints" / "last.ckpt", weights_only=False)  # what an unsafe loader would do
    assert marker.exists()


@pytest.mark.parametrize("argv", [("eval", "knn", "{ckpt}"), ("eval", "rankme", "{run}"),
                                  ("pretrain", "--resume", "{run}")])
def test_crafted_checkpoint_is_refused_and_never_runs(crafted_run, argv):
    run, marker = crafted_run
    ckpt = run / "checkpoints" / "last.ckpt"
    code, _, err = run_cli(*(a.format(run=run, ckpt=ckpt) for a in argv))
    assert_user_error(code, err, "refusing", str(ckpt), "io.open", ".safetensors", only_line=False)
    assert not marker.exists()
