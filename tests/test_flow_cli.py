"""End to end from the CLI on digits: a few Self-Flow steps, ``selfsup generate``, ``selfsup eval generation``."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from ssl_helpers import FLOW_TINY, TINY, assert_user_error, run_cli

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("flow-e2e")
    code, stdout, err = run_cli("pretrain", "self-flow-digits", *FLOW_TINY, f"output_dir={out}", "name=flow")
    assert code == 0, err
    (out / "flow-pretrain-stdout.txt").write_text(stdout)  # the end-of-run report, for the suggested commands
    code, _, err = run_cli("pretrain", "moco-v3-vit-digits", *TINY, f"output_dir={out}", "name=moco")
    assert code == 0, err
    return out / "flow", out / "moco"


@pytest.mark.spawn
def test_generate_writes_a_grid_and_a_tensor(runs, tmp_path):
    flow, _ = runs
    code, out, err = run_cli("generate", str(flow), "--n", "12", "--steps", "3", "--cfg", "1.5", "--class", "3",
                             "--out", str(tmp_path / "s.png"))
    assert code == 0, err
    blob = torch.load(tmp_path / "s.pt")
    assert blob["samples"].shape == (12, 1, 8, 8) and blob["labels"].tolist() == [3] * 12
    assert blob["settings"]["cfg"] == 1.5 and torch.isfinite(blob["samples"]).all()
    assert Image.open(tmp_path / "s.png").size == (4 * 10 + 2, 3 * 10 + 2)
    code, out, err = run_cli("generate", str(flow), "--n", "4", "--steps", "2", "--sampler", "sde")
    assert code == 0, err
    assert (flow / "samples" / "samples-n4-sde2-cfg1-seed0.png").exists()
    assert (flow / "samples" / "samples-n4-sde2-cfg1-seed0.pt").exists()


@pytest.mark.spawn
def test_eval_generation_writes_json(runs, tmp_path):
    flow, moco = runs
    code, out, err = run_cli("eval", "generation", str(flow), "--encoder", str(moco), "--n", "40", "--steps", "2",
                             "--out", str(tmp_path))
    assert code == 0, err
    res = json.loads((tmp_path / "generation.json").read_text())
    assert res["encoder_frechet_distance"] > res["reference_real_test_frechet_distance"] >= 0
    assert 0 <= res["class_fidelity"] <= 100 and res["n"] == 40
    # the classifier behind class fidelity works: real test digits in the encoder's space are far above chance (10%)
    assert res["reference_real_test_knn_top1"] > 30
    assert (res["inception_fid"] is None) == ("inception_fid_note" in res)
    assert "encoder Fréchet distance" in out and (tmp_path / "generation-samples.png").exists()


@pytest.mark.spawn
@pytest.mark.parametrize("argv, words", [
    (["--n", "0"], ["--n 0"]), (["--steps", "0"], ["--steps 0"]), (["--cfg", "-1"], ["--cfg -1"]),
    (["--class", "10"], ["--class 10", "0..9"]), (["--sampler", "heun"], ["--sampler", "ode, sde"]),
    (["--sampler", "sde", "--steps", "1"], ["--sampler sde needs --steps >= 2", "--sampler ode"]),
])
def test_generate_bad_options_exit_2_and_write_nothing(runs, tmp_path, argv, words):
    flow, _ = runs
    before = sorted(p.name for p in flow.rglob("*"))
    code, _, err = run_cli("generate", str(flow), *argv, "--out", str(tmp_path / "x"))
    assert_user_error(code, err, *words)
    assert list(tmp_path.iterdir()) == [] and sorted(p.name for p in flow.rglob("*")) == before


@pytest.mark.spawn
def test_generate_and_eval_generation_reject_a_non_flow_run(runs, tmp_path):
    flow, moco = runs
    code, _, err = run_cli("generate", str(moco), "--out", str(tmp_path / "x"))
    assert_user_error(code, err, "not a flow run")
    code, _, err = run_cli("eval", "generation", str(moco), "--encoder", str(moco), "--out", str(tmp_path))
    assert_user_error(code, err, "not a flow run")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.spawn
def test_the_suggested_eval_generation_works_as_printed(runs):
    """A flow run ends by suggesting ``selfsup eval generation RUN``: run as printed (no --encoder), it measures the
    samples in the run's own EMA feature space and says so in its table and its JSON."""
    flow, _ = runs
    report = (flow.parent / "flow-pretrain-stdout.txt").read_text()
    suggested = report.split("; selfsup eval generation ")[1].splitlines()[0].split()
    assert suggested == [str(flow)]
    # as printed, plus fewer samples and steps than the defaults (1000, 50) to stay fast: no --encoder
    code, out, err = run_cli("eval", "generation", *suggested, "--n", "40", "--steps", "2")
    assert code == 0, err
    res = json.loads((flow / "eval" / "generation.json").read_text())
    assert res["backbone"] == "flow_encoder" and res["encoder"] == str(flow / "backbone.safetensors")
    assert "own EMA features" in res["encoder_note"] and "own EMA features" in out
    assert res["n"] == 40 and "class_fidelity" in res
    assert res["encoder_frechet_distance"] > res["reference_real_test_frechet_distance"] >= 0


@pytest.mark.spawn
def test_eval_generation_bad_options_exit_2(runs, tmp_path):
    flow, moco = runs
    for argv, word in ((["--n", "1"], "--n 1"), (["--k", "0"], "--k"), (["--steps", "0"], "--steps 0")):
        code, _, err = run_cli("eval", "generation", str(flow), "--encoder", str(moco), *argv, "--out", str(tmp_path))
        assert_user_error(code, err, word)
    assert list(tmp_path.iterdir()) == []


def test_eval_generation_never_defaults_to_repas_own_encoder():
    """Every flow run defaults to its own EMA features, REPA's too: its alignment encoder would favour it."""
    from types import SimpleNamespace

    from selfsup.runs.generation import OWN_FEATURES, REPA_NOT_DEFAULT, _encoder_location

    repa = SimpleNamespace(method=SimpleNamespace(encoder="runs/moco"))
    assert _encoder_location(SimpleNamespace(encoder=None), repa, "runs/repa") == (
        "runs/repa", OWN_FEATURES + REPA_NOT_DEFAULT)
    assert _encoder_location(SimpleNamespace(encoder="other"), repa, "runs/repa") == ("other", None)
    plain = SimpleNamespace(method=SimpleNamespace())
    assert _encoder_location(SimpleNamespace(encoder=None), plain, "runs/sf") == ("runs/sf", OWN_FEATURES)
