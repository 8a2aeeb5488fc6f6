"""benchmarks/methods_fmnist.py's bookkeeping: the init's digest (one floor per network) and scoring a finished run."""

import json

import torch
import yaml
from safetensors.torch import save_file

from selfsup.config import load_run_config, to_dict


def bench():
    import benchmarks.methods_fmnist

    return benchmarks.methods_fmnist


def test_the_digest_reads_a_batchnorm_counter_and_names_the_weights(tmp_path):
    """A BN network's state holds a 0-d int64 ``num_batches_tracked``: the digest reads it (it once stopped the
    ConvNet's rows after training) and changes with any weight, so two networks never share a floor."""
    m = bench()
    state = {"bn.num_batches_tracked": torch.tensor(0), "conv.weight": torch.ones(2, 3)}
    save_file(state, tmp_path / "a.safetensors")
    save_file({**state, "conv.weight": torch.ones(2, 3) * 2}, tmp_path / "b.safetensors")
    save_file(dict(state), tmp_path / "c.safetensors")
    a, b, c = (m.digest(tmp_path / f"{x}.safetensors") for x in "abc")
    assert a == c != b and len(a) == 16


def test_a_finished_run_of_the_same_config_is_scored_not_retrained(tmp_path):
    m = bench()
    cfg = load_run_config("wmse-fmnist", ["trainer.seed=1"])
    run = tmp_path / "wmse-fmnist-s1"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    (run / "backbone.safetensors").write_bytes(b"")
    (run / "run.json").write_text(json.dumps({"status": "finished", "fit_seconds": 12.5}))
    assert m.finished_run(run, cfg) == run
    assert m.finished_run(run, load_run_config("wmse-fmnist", ["trainer.seed=2"])) is None  # another config
    (run / "run.json").write_text(json.dumps({"status": "collapsed"}))
    assert m.finished_run(run, cfg) is None  # a run that stopped is trained again
    assert m.finished_run(tmp_path / "absent", cfg) is None


def test_the_dense_column_is_blank_for_rows_measured_before_it():
    m = bench()
    old, new = {"knn20_top1": 80.0}, {"knn20_top1": 80.0, "segment_linear_miou": 41.04, "segment_knn_miou": 30.0}
    floor = {"segment_linear_miou": 20.0, "segment_knn_miou": 10.26}
    assert m.dense([old], [floor]) == "—"
    assert m.dense([new, old], [floor, floor]) == "—"  # a group is filled only where every seed has the keys
    assert m.dense([new], [floor]) == "41.0 / 30.0 (20.0 / 10.3)"
    assert m.dense([new], [{}]) == "41.0 / 30.0"  # an init measured before the column: no brackets
