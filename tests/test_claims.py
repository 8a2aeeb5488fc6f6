"""The claims suite: the verdict rule by hand, and one quick claim of each seed on tiny settings."""

from __future__ import annotations

import json

import pytest

from selfsup.commands.claims import RESULTS, table
from selfsup.claims.registry import CLAIMS, PAPERS
from selfsup.claims.suite import MIN_SEEDS, REPRODUCED, plot_result
from selfsup.commands.main import main
from ssl_helpers import quick_claim

TINY = ["trainer.max_epochs=1", "trainer.limit_train_batches=2", "data.batch_size=32", "trainer.log_every_n_steps=1",
        "eval.knn_every_n_steps=0"]


def test_every_claim_is_stated_before_it_runs():
    seeds = {c.seed[:3] if c.seed[:3].isdigit() else c.seed for c in CLAIMS.values()}
    assert seeds == {"000", "001", "002", "003", "004", "arXiv:2301.08243", "arXiv:2511.08544",
                     "arXiv:2508.10104"}  # + issue 51's and issue 65's (DINOv3)
    for c in CLAIMS.values():
        assert c.statement and c.paper and c.rules and c.why_different and PAPERS[c.seed]
        assert c.deterministic or c.default_seeds >= MIN_SEEDS, c.id  # every training claim at least 3 seeds
    assert {c.id for c in CLAIMS.values() if c.deterministic} == {"byol-ode", "norm-convergence-quadratic"}


@pytest.mark.train
@pytest.mark.parametrize("claim_id", ["self-flow-alignment-curve", "norm-convergence-quadratic",
                                      "byol-no-ema-predictor-lr", "directpred-beats-linear", "frozen-patch-projection"])
def test_one_quick_claim_of_each_seed_runs(claim_id, tmp_path):
    from idx_files import fashion_overrides

    from selfsup.claims.suite import declared_test_images

    fashion = fashion_overrides(claim_id, tmp_path / "fmnist")
    result = quick_claim(claim_id, tmp_path, [*TINY, *fashion])
    if not fashion:  # the test images behind its accuracies, read from each run's knn.json, are the declared ones
        assert set(result["knn_test_images"]) <= declared_test_images(CLAIMS[claim_id])
    assert CLAIMS[claim_id].deterministic or result["runs"]  # every training run recorded
    assert all(r["steps"] <= 2 for r in result["runs"])  # TINY: 2 batches
    assert all(len(v) == 1 for v in result["metrics"].values())
    plot_result(result, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 5000


@pytest.mark.spawn
def test_cli_run_writes_json_png_and_verdict_and_table(tmp_path, capsys):
    assert main(["claims", "run", "norm-convergence-quadratic", "--quick", "--out", str(tmp_path),
                 "--work", str(tmp_path / "runs")]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    result = json.loads((tmp_path / "norm-convergence-quadratic.json").read_text())
    assert line.startswith(f"norm-convergence-quadratic: {result['verdict']} (quick) — ours: steps ∝ r^")
    assert 1.8 < result["metrics"]["exponent"][0] < 2.2 and result["verdict"] == REPRODUCED
    assert (tmp_path / "norm-convergence-quadratic.png").exists()
    import re

    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", result["commit"])  # the checkout's commit it ran at
    md = table(tmp_path)
    assert "**reproduced** (quick)" in md and all(f"`{c}`" in md for c in CLAIMS)


def test_unknown_claim_is_one_line_exit_2(capsys):
    assert main(["claims", "run", "no-such-claim", "--out", "/tmp/unused"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "selfsup claims list" in err


def test_committed_results_ship_with_the_package_and_list_reads_them_anywhere(tmp_path, monkeypatch, capsys):
    assert RESULTS.parent.name == "claims" and RESULTS.parent.parent.name == "selfsup"  # package data
    assert {p.stem for p in RESULTS.glob("*.json")} <= set(CLAIMS)
    assert len(list(RESULTS.glob("*.json"))) >= 26
    for p in RESULTS.glob("*.json"):  # every committed result judged by the current statistics
        result = json.loads(p.read_text())
        assert [s["rule"] for s in result["statistics"]] == [str(r) for r in CLAIMS[result["id"]].rules], p.name
    monkeypatch.chdir(tmp_path)  # outside the checkout
    assert main(["claims", "list"]) == 0
    out = capsys.readouterr().out
    unrun = [c for c in CLAIMS if not (RESULTS / f"{c}.json").exists()]
    assert out.count("last: not run yet") == len(unrun) < len(CLAIMS) and "last: reproduced" in out
    assert "An Empirical Study of Training Self-Supervised Vision Transformers (MoCo v3)" in out  # the paper's name


def test_table_prints_unless_write_says_where(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["claims", "table"]) == 0
    md = capsys.readouterr().out
    assert md.startswith("# The seeds' claims") and list(tmp_path.iterdir()) == []
    assert "95% interval" in md and " ± " not in md.split("## Not reproduced")[0].split("| claim |")[1]
    assert main(["claims", "table", "--write", "sub/CLAIMS.md"]) == 0
    assert (tmp_path / "sub" / "CLAIMS.md").read_text() == md


def test_run_needs_out_and_ids_or_all(capsys):
    assert main(["claims", "run", "byol-ode"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out DIR" in err
    assert main(["claims", "run", "--out", "/tmp/unused"]) == 2
    assert "--all" in capsys.readouterr().err


def test_definition_hash_follows_the_definition(tmp_path):
    from dataclasses import replace

    from selfsup.claims.suite import Rule, definition_hash

    claim = CLAIMS["moco-v3-momentum"]
    h = definition_hash(claim)
    assert len(h) == 64 and definition_hash(claim) == h
    assert definition_hash(replace(claim, rules=(Rule("gain", ">", 0.5),))) != h
    assert definition_hash(replace(claim, default_seeds=5)) != h
    assert definition_hash(replace(claim, decide="a longer run")) == h  # documentation only
    assert definition_hash(CLAIMS["moco-v3-predictor"]) != h


@pytest.mark.spawn
def test_run_all_resume_skips_results_that_match_and_runs_the_rest(tmp_path, capsys):
    from selfsup.claims.suite import definition_hash

    out = tmp_path / "out"
    out.mkdir()
    todo = {"norm-convergence-quadratic", "byol-ode"}
    for c in CLAIMS.values():
        if c.id in todo:
            continue
        (out / f"{c.id}.json").write_text(json.dumps({"id": c.id, "quick": True, "seeds": c.default_seeds,
                                                      "verdict": "reproduced", "code_hash": definition_hash(c)}))
    stale = {"id": "byol-ode", "quick": True, "seeds": 1, "verdict": "reproduced", "code_hash": "0" * 64}
    (out / "byol-ode.json").write_text(json.dumps(stale))  # another definition's result: run again
    assert main(["claims", "run", "--all", "--resume", "--quick", "--out", str(out), "--work",
                 str(tmp_path / "runs")]) == 0
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert sum("skipped" in line for line in lines) == len(CLAIMS) - len(todo)
    assert {line.split(":")[0] for line in lines if "skipped" not in line} == todo
    assert "claim 1/2" in captured.err and "claim 2/2" in captured.err and "expected remaining" in captured.err
    for claim_id in todo:
        assert json.loads((out / f"{claim_id}.json").read_text())["code_hash"] == definition_hash(CLAIMS[claim_id])


def test_rejudge_recomputes_an_old_result_without_training(tmp_path, capsys):
    old = {"id": "moco-v3-momentum", "seed": CLAIMS["moco-v3-momentum"].seed, "quick": False, "seeds": 3,
           "rules": ["gain > 0"], "verdict": "reproduced", "series": {}, "plot": {},
           "metrics": {"default": [70.0, 72.0, 74.0], "m_0": [69.0, 70.0, 71.0], "gain": [1.0, 2.0, 3.0]},
           "ours": "kNN top-1 default 72.0% vs m 0 70.0% (default − ablation +2.00 ± 1.00 points)"}
    (tmp_path / "moco-v3-momentum.json").write_text(json.dumps(old))
    assert main(["claims", "rejudge", "--results", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == "moco-v3-momentum: reproduced → inconclusive"  # 2 ± 2.48
    new = json.loads((tmp_path / "moco-v3-momentum.json").read_text())
    (s,) = new["statistics"]
    assert s["n"] == 3 and s["interval"] == pytest.approx([2 - 2.484137711750, 2 + 2.484137711750])
    assert s["test_images"] == 359 and set(s["binomial_sd"]) == {"default", "m_0"}
    assert s["underpowered"] is True and s["paper_effect"] == pytest.approx(2.2)  # MDE 3.26 > 2.2
    assert new["ours"].endswith("(default − ablation +2.00 [-0.48, +4.48] points)")
    assert (tmp_path / "moco-v3-momentum.png").exists()


@pytest.mark.train
def test_a_claims_runs_share_datasets_and_the_random_init_knn_and_stay_identical(tmp_path, monkeypatch):
    """Two arms of one seed (same init): under shared_datasets each split is read once and the second run reuses
    the first's random-init kNN; every result equals that of runs that share nothing."""
    from selfsup.claims import suite
    from selfsup.data import datasets
    from selfsup.runs import finish
    from ssl_helpers import TINY as TINY_RUN

    reads, passes = [], []
    read, extract = datasets._load_dataset, finish.extract_features
    monkeypatch.setattr(datasets, "_load_dataset", lambda cfg, split: reads.append(split) or read(cfg, split))
    monkeypatch.setattr(finish, "extract_features", lambda *a, **k: passes.append(len(a[1])) or extract(*a, **k))
    monkeypatch.setattr(suite, "_SPLITS", {})
    monkeypatch.setattr(finish, "_INIT_KNN", {})
    ctx = suite.Context(quick=True, seeds=1, work=tmp_path, progress=lambda m: None)
    arms = (("a", []), ("b", ["optim.base_lr=1e-4"]))

    def runs(tag):
        return [json.loads((suite.pretrain_run(ctx, "byol-digits", f"{tag}-{arm}", ["trainer.seed=0", *TINY_RUN,
                                                                                   *o]) / "knn.json").read_text())
                for arm, o in arms]

    with suite.shared_datasets():
        shared = runs("shared")
    assert datasets._load_dataset.__name__ == "<lambda>"  # restored on leaving
    assert sorted(reads) == ["test", "train"]  # each split once for both runs
    # the end-of-run kNN's passes over whole splits (runs.finish): run a the trained and the init
    # backbone over train and test, run b its trained one only
    assert sorted(n for n in passes if n in (1438, 359)) == [359] * 3 + [1438] * 3
    assert shared[0]["random_init"] == shared[1]["random_init"]
    finish._INIT_KNN.clear()
    alone = runs("alone")
    assert alone == shared  # kNN of the trained and the random-init backbones, bit for bit


def test_the_claims_pages_tally_and_table_are_the_committed_results():
    from pathlib import Path

    from selfsup.commands.claims import tally_text

    root = Path(__file__).resolve().parents[1]
    assert f"Today {tally_text()}, at CPU scale" in " ".join((root / "docs" / "seeds-claims.md").read_text().split())
    assert (root / "docs" / "CLAIMS.md").read_text() == table(RESULTS)  # selfsup claims table --write docs/CLAIMS.md


@pytest.mark.train
def test_pilot_runs_on_its_own_seeds_and_prints_the_figures_for_the_definition(tmp_path, capsys):
    """`claims pilot` measures a claim on seeds from PILOT_FIRST_SEED (never the run's) and prints the Pilot that
    its definition then carries: steps per run, wall time, per-seed sd of each rule's metric."""
    import yaml

    from selfsup.claims.suite import PILOT_FIRST_SEED, Pilot

    assert main(["claims", "pilot", "norms-grow", "--quick", "--seeds", "2", "--out", str(tmp_path / "p"),
                 "--work", str(tmp_path / "runs"), "--set", *TINY]) == 0
    out = capsys.readouterr().out
    result = json.loads((tmp_path / "p" / "norms-grow.pilot.json").read_text())
    assert result["first_seed"] == PILOT_FIRST_SEED and result["seeds"] == 2
    seeds = sorted(yaml.safe_load((tmp_path / "runs" / "norms-grow-pilot" / f"simclr-default-s{s}" / "config.yaml")
                                  .read_text())["trainer"]["seed"] for s in (PILOT_FIRST_SEED, PILOT_FIRST_SEED + 1))
    assert seeds == [PILOT_FIRST_SEED, PILOT_FIRST_SEED + 1]
    figures = result["pilot_figures"]
    assert figures["steps"] == 2 and set(figures["sd"]) == {"growth_simclr", "growth_simsiam"}  # TINY: 2 batches
    pilot = eval(out.split("pilot=", 1)[1].strip(), {"Pilot": Pilot})
    assert pilot.sd == tuple(figures["sd"].items()) and str(pilot) == result["pilot"]
    from selfsup.claims.planning import sd_upper  # and the spread a cautious plan assumes, from 2 seeds

    assert figures["sd_upper"] == {m: pytest.approx(sd_upper(sd, 2)) for m, sd in figures["sd"].items()}
    assert all(figures["mde_at_3_seeds_at_sd_upper"][m] >= figures["mde_at_3_seeds"][m] for m in figures["sd"])
    assert "at the sd's 80% upper bound (2 pilot seeds): growth_simclr: sd ≤" in out
    assert main(["claims", "pilot", "norms-grow", "--seeds", "1", "--out", str(tmp_path)]) == 2  # no spread
    assert "at least 2 seeds" in capsys.readouterr().err


def test_list_and_table_show_the_budget_the_pilot_and_a_redefinition(tmp_path, capsys, monkeypatch):
    from dataclasses import replace

    from selfsup.commands import claims as cli
    from selfsup.claims.suite import Pilot, judge_result

    claim = CLAIMS["moco-v3-momentum"]
    pilot = Pilot(seeds=2, steps=234, wall_s=60.0, sd=(("gain", 0.8),))
    monkeypatch.setitem(CLAIMS, claim.id, replace(claim, pilot=pilot))
    old = {"id": claim.id, "seed": claim.seed, "quick": False, "seeds": 3, "verdict": "inconclusive",
           "why_different": "an older budget", "metrics": {"gain": [1.0, 2.0, 3.0]}, "ours": "—", "series": {},
           "statistics": judge_result(claim, {"gain": [1.0, 2.0, 3.0]})[1]}
    (tmp_path / f"{claim.id}.json").write_text(json.dumps(old))
    assert main(["claims", "list", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out.split(claim.id + "  [", 1)[1].split("\n\n")[0]
    assert f"budget: {claim.why_different}" in out and f"pilot: {pilot}" in out
    md = table(tmp_path)
    row = next(line for line in md.splitlines() if line.startswith(f"| `{claim.id}`"))
    assert f"an older budget. **Redefined, not re-run yet:** {claim.why_different}. Pilot: {pilot}" in row
    assert "Redefined since, not re-run yet" in md.split("## Not reproduced")[1]
    assert "binomial sd" in md.split("| claim |")[0]
    # a note written after the run replaces the definition's decide text in the paragraph, and is not hashed
    from selfsup.claims.suite import definition_hash

    h = definition_hash(CLAIMS[claim.id])
    monkeypatch.setitem(cli.AFTER_RUN, claim.id, "A longer run would decide it.")
    paragraph = table(tmp_path).split("## Not reproduced")[1]
    assert "A longer run would decide it." in paragraph and (claim.decide or "∅") not in paragraph
    assert definition_hash(CLAIMS[claim.id]) == h


def test_the_command_line_names_the_first_pilot_seed_of_the_suite():
    """commands/claims.py repeats claims.suite.PILOT_FIRST_SEED so that building the parser imports no claim."""
    from selfsup.claims.suite import PILOT_FIRST_SEED
    from selfsup.commands import claims as cli

    assert cli.PILOT_FIRST_SEED == PILOT_FIRST_SEED


def test_a_finished_run_of_the_same_config_is_read_not_trained_again(tmp_path):
    """An interrupted claim keeps its finished runs: ``pretrain_run`` reads a finished run (run.json, knn.json) whose
    config.yaml is the config it would train, and trains any other."""
    import yaml

    from selfsup.claims.suite import finished_as
    from selfsup.config import load_run_config, to_dict

    cfg = load_run_config("simclr-digits", [f"output_dir={tmp_path}", "name=r", "trainer.seed=3"])
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    (run / "knn.json").write_text("{}")
    (run / "run.json").write_text(json.dumps({"status": "trained"}))
    assert not finished_as(run, cfg)  # its finishing was cut short
    (run / "run.json").write_text(json.dumps({"status": "finished"}))
    assert finished_as(run, cfg)
    other = load_run_config("simclr-digits", [f"output_dir={tmp_path}", "name=r", "trainer.seed=4"])
    assert not finished_as(run, other)
    # a field added to the config since the run (absent from its config.yaml) reads as its default, as a resume does
    saved = to_dict(cfg)
    del saved["eval"]["knn_at_end"]
    (run / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    assert finished_as(run, cfg)
    off = load_run_config("simclr-digits", [f"output_dir={tmp_path}", "name=r", "trainer.seed=3",
                                            "eval.knn_at_end=false"])
    assert not finished_as(run, off)


@pytest.mark.spawn
@pytest.mark.train
def test_an_unfinished_run_of_the_same_config_is_resumed_and_ends_as_the_uninterrupted_one(tmp_path):
    """A session stopped mid-claim keeps its hours of training: ``pretrain_run`` resumes an unfinished run whose
    config.yaml is the config it would train (a killed run with a checkpoint) instead of training it again."""
    from selfsup.claims.suite import Context, pretrain_run
    from selfsup.config import load_run_config
    from ssl_helpers import RESUME, assert_same_run, ckpt_step, forked_kill

    overrides = [*RESUME, "trainer.checkpoint_every_n_steps=1", "eval.knn_at_end=false"]  # the state is compared
    said: list[str] = []
    ctx = Context(quick=True, seeds=1, work=tmp_path / "b", progress=said.append)
    cfg = load_run_config("moco-v3-vit-digits", [*overrides, "trainer.progress_bar=false", "trainer.accelerator=cpu",
                                                 "trainer.devices=1", f"output_dir={ctx.work}", "name=r"])
    forked_kill(cfg, 4)  # killed before step 4: the checkpoint of 4 steps done (epoch 1, mid-way)
    assert ckpt_step(ctx.work / "r") == 4
    resumed = pretrain_run(ctx, "moco-v3-vit-digits", "r", overrides)
    assert any(line.startswith(f"unfinished run {ctx.work / 'r'}") for line in said), said
    straight = pretrain_run(Context(quick=True, seeds=1, work=tmp_path / "a", progress=said.append),
                            "moco-v3-vit-digits", "r", overrides)
    assert_same_run(straight, resumed)


def test_a_claim_whose_pilot_was_an_earlier_run_measures_past_its_seeds(tmp_path, monkeypatch):
    """`Claim.first_seed`: a claim whose budget was set by an earlier run of its own (seeds 0-2) runs on the
    seeds after it, and its result records them (`--resume` reads a result only at the same first seed: the
    definition hash covers it)."""
    from dataclasses import replace

    from selfsup.claims.suite import Rule
    from selfsup.commands.claims import _matches

    seen = []

    def measure(ctx):
        seen.extend(ctx.seed_ids())
        return {"metrics": {"gain": [1.0 + 0.1 * s for s in ctx.seed_ids()]}, "series": {}, "ours": "gain"}

    claim = replace(CLAIMS["distill-beats-scratch"], id="first-seed-probe", rules=(Rule("gain", ">", 0.0),),
                    measure=measure, default_seeds=4, first_seed=3)
    monkeypatch.setitem(CLAIMS, claim.id, claim)
    assert main(["claims", "run", claim.id, "--out", str(tmp_path / "out"), "--work", str(tmp_path / "runs")]) == 0
    result = json.loads((tmp_path / "out" / f"{claim.id}.json").read_text())
    assert seen == [3, 4, 5, 6] and result["first_seed"] == 3 and result["seeds"] == 4
    assert _matches(result, claim, False, 4) and not _matches(result, replace(claim, first_seed=0), False, 4)


def test_the_random_init_knn_is_shared_only_by_the_same_network():
    """`runs.finish.init_knn_key`: the same weights under another model setting that the weights do not carry (a
    ViT's pool, cls or avg) give other features, so they get another key and are not served the other's kNN."""
    from types import SimpleNamespace

    import torch

    from selfsup.config import load_run_config
    from selfsup.runs.finish import init_knn_key

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    data = SimpleNamespace(images=torch.zeros(3, 1, 2, 2), labels=torch.zeros(3, dtype=torch.long))
    info = SimpleNamespace(image_size=8, mean=(0.5,), std=(0.5,))
    keys = [init_knn_key(model, data, data, info, load_run_config("moco-v3-vit-digits", [f"model.pool={pool}"]))
            for pool in ("cls", "avg", "avg")]
    assert None not in keys and keys[0] != keys[1] and keys[1] == keys[2]
