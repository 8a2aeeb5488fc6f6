"""The claims suite: the verdict rule by hand, and one quick claim of each seed on tiny settings."""

from __future__ import annotations

import json

import pytest

from selfsup.claims.cli import table
from selfsup.claims.registry import CLAIMS
from selfsup.claims.suite import (INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, Rule, plot_result, verdict)
from selfsup.cli import main
from ssl_helpers import quick_claim

TINY = ["trainer.max_epochs=1", "trainer.limit_train_batches=2", "data.batch_size=32", "trainer.log_every_n_steps=1",
        "eval.knn_every_n_steps=0"]


def test_rule_uses_mean_and_spread_over_seeds():
    gain = Rule("gain", ">", 0.0)
    assert gain.judge([1.0]) == REPRODUCED and gain.judge([-1.0]) == NOT_REPRODUCED
    assert gain.judge([0.0]) == NOT_REPRODUCED  # the threshold itself does not pass a strict ">"
    # mean 1, std 1 (sample): mean - std = 0 is not above 0, mean + std = 2 is: inside the spread
    assert gain.judge([0.0, 1.0, 2.0]) == INCONCLUSIVE
    assert gain.judge([2.0, 3.0, 4.0]) == REPRODUCED  # 3 - 1 > 0
    assert gain.judge([-4.0, -3.0, -2.0]) == NOT_REPRODUCED
    below = Rule("x", "<", 0.1)
    assert below.judge([0.05]) == REPRODUCED and below.judge([0.2]) == NOT_REPRODUCED
    assert below.judge([0.0, 0.1, 0.2]) == INCONCLUSIVE


def test_verdict_needs_every_rule():
    rules = (Rule("a", ">", 0.0), Rule("b", "<", 1.0))
    assert verdict(rules, {"a": [1.0], "b": [0.5]}) == REPRODUCED
    assert verdict(rules, {"a": [1.0], "b": [2.0]}) == NOT_REPRODUCED
    assert verdict(rules, {"a": [0.0, 1.0, 2.0], "b": [0.5]}) == INCONCLUSIVE
    assert verdict(rules, {"a": [0.0, 1.0, 2.0], "b": [2.0]}) == NOT_REPRODUCED


def test_every_claim_is_stated_before_it_runs():
    seeds = {c.seed[:3] for c in CLAIMS.values()}
    assert seeds == {"000", "001", "002", "003", "004"}
    for c in CLAIMS.values():
        assert c.statement and c.paper and c.rules and c.why_different


@pytest.mark.parametrize("claim_id", ["self-flow-alignment-curve", "norm-convergence-quadratic",
                                      "byol-no-ema-predictor-lr", "directpred-beats-linear", "frozen-patch-projection"])
def test_one_quick_claim_of_each_seed_runs(claim_id, tmp_path):
    result = quick_claim(claim_id, tmp_path, TINY)
    assert all(len(v) == 1 for v in result["metrics"].values())
    plot_result(result, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 5000


def test_cli_run_writes_json_png_and_verdict_and_table(tmp_path, capsys):
    assert main(["claims", "run", "norm-convergence-quadratic", "--quick", "--out", str(tmp_path),
                 "--work", str(tmp_path / "runs")]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads((tmp_path / "norm-convergence-quadratic.json").read_text())
    assert line.startswith(f"norm-convergence-quadratic: {result['verdict']} — ours: steps ∝ r^")
    assert 1.8 < result["metrics"]["exponent"][0] < 2.2 and result["verdict"] == REPRODUCED
    assert (tmp_path / "norm-convergence-quadratic.png").exists()
    md = table(tmp_path)
    assert "**reproduced** (quick)" in md and all(f"`{c}`" in md for c in CLAIMS)


def test_unknown_claim_is_one_line_exit_2(capsys):
    assert main(["claims", "run", "no-such-claim", "--out", "/tmp/unused"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "selfsup claims list" in err
