"""Evaluation from Python (``selfsup.runs.evaluate``): docs/evaluation.md's snippet on a tiny pretrained run gives the
command line's results; the probe's protocol defaults are written once; the projection heads exported by pretraining are
what ``--embedding projector|predictor`` reads, identical to the checkpoint rebuild it replaces."""

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from ssl_helpers import TINY_TRAINER, run_cli

DOC = Path(__file__).resolve().parents[1] / "docs" / "evaluation.md"
PRESET = "simsiam-cnn-digits"
TINY_SIMSIAM = ["method.proj_hidden_dim=64", "method.pred_hidden_dim=32", "method.dim=64", "data.batch_size=64",
                *(f"trainer.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in TINY_TRAINER.items()),
                "trainer.limit_train_batches=2"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A SimSiam ConvNet run on digits, two steps of pretraining (its heads: MLP projector and predictor)."""
    root = tmp_path_factory.mktemp("runs")
    code, _, err = run_cli("pretrain", PRESET, *TINY_SIMSIAM, f"output_dir={root}", "name=r")
    assert code == 0, err
    return root / "r"


def readme_snippet() -> str:
    blocks = [b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
              if "from selfsup.runs import" in b and "EvalSession(" in b]
    assert len(blocks) == 1, "docs/evaluation.md must hold exactly one python block evaluating a run with EvalSession"
    return blocks[0]


@pytest.mark.train
def test_the_readme_snippet_runs_and_gives_the_command_lines_results(run, tmp_path, capsys):
    snippet = readme_snippet()
    pretrain = 'selfsup.pretrain("simsiam-cnn-digits", trainer={"max_epochs": 1})'
    assert pretrain in snippet  # the page trains its run (a folder with a timestamp); here: the tiny run of the fixture
    scope: dict = {}
    exec(compile(snippet.replace(pretrain, f"selfsup.Run({str(run)!r})"), "docs/evaluation.md", "exec"), scope)
    printed = capsys.readouterr().out.split()
    knn, probe = scope["knn"], scope["probe"]
    assert float(printed[0]) == knn["results"]["k=20"]["top1"] and set(knn["results"]) == {"k=10", "k=20"}
    assert json.loads((run / "eval" / "knn.json").read_text()) == knn  # the runner writes what it returns
    # the command line's kNN is the same numbers (the front end only adds the table)
    code, out, err = run_cli("eval", "knn", run, "--k", "10,20", "--device", "cpu", "--out", tmp_path / "cli")
    assert code == 0, err
    assert "kNN (T=0.07) on digits" in out
    cli = json.loads((tmp_path / "cli" / "knn.json").read_text())
    assert cli["results"] == knn["results"]
    # the probe trained the whole moco_v3 lr grid, 10 epochs, and chose one of its points
    assert [g["base_lr"] for g in probe["grid"]] == list(scope["ProbeConfig"].for_protocol("moco_v3").lr_grid)
    assert probe["epochs"] == 10 and probe["chosen"] in probe["grid"] and float(printed[1]) == probe["test"]["top1"]
    rankme = json.loads((run / "eval" / "rankme-predictor.json").read_text())
    assert rankme["embedding"] == "predictor" and float(printed[3]) == rankme["rankme"]
    assert rankme["source"] == str(run / "heads.safetensors")  # the exported heads, not the checkpoint


def test_the_probe_protocols_defaults_live_in_the_dataclass():
    from selfsup.eval.linear import MAE_BASE_LR, ProbeConfig, mae_probe_config

    assert ProbeConfig.for_method("mae") == mae_probe_config() == ProbeConfig.for_protocol("mae")
    mae = ProbeConfig.for_method("mae")
    assert (mae.protocol, mae.lr_grid, mae.val_fraction, mae.warmup_epochs) == ("mae", (MAE_BASE_LR,), 0.0, 10.0)
    moco = ProbeConfig.for_method("byol", epochs=3)
    assert moco.protocol == "moco_v3" and len(moco.lr_grid) == 7 and 0.1 in moco.lr_grid and moco.epochs == 3
    assert ProbeConfig().lr_grid == ()  # the bare dataclass: one lr (base_lr)
    with pytest.raises(ValueError, match="protocol must be one of"):
        ProbeConfig.for_protocol("dino")


def test_fine_tuning_defaults_per_method_live_in_the_dataclass():
    from selfsup.eval.finetune import FinetuneConfig

    mae = FinetuneConfig.for_method("mae", "vit_micro", epochs=2)
    assert (mae.pool, mae.train_pos_embed, mae.epochs) == ("global", True, 2)
    assert (FinetuneConfig.for_method("moco_v3", "vit_micro").pool, FinetuneConfig.for_method("moco_v3", "vit_micro")
            .train_pos_embed) == (None, False)
    assert FinetuneConfig.for_method("mae", "resnet18").pool is None  # the global pool is a selfsup ViT's


@pytest.mark.train
def test_the_exported_heads_equal_the_checkpoint_rebuild_and_need_no_training_module(run, tmp_path, monkeypatch):
    from selfsup.runs.source import load_source, loss_embedding, with_heads
    from selfsup.export import load_heads

    heads = load_heads(run / "heads.safetensors")
    assert set(heads) == {"projector", "predictor"} and not heads["projector"].training
    old = tmp_path / "old"  # the same run as a folder made before heads.safetensors existed
    shutil.copytree(run, old, ignore=shutil.ignore_patterns("eval", "heads.safetensors"))
    x = torch.randn(16, 1, 8, 8)
    for embedding in ("projector", "predictor"):
        rebuilt = with_heads(load_source(old), embedding)
        assert rebuilt.weights == old / "checkpoints" / "last.ckpt"
        import selfsup.runs.source as source

        with monkeypatch.context() as m:  # the exported heads are read without building the training module
            m.setattr(source, "build_method", lambda *a, **k: pytest.fail("rebuilt the training module"))
            exported = with_heads(load_source(run), embedding)
            assert loss_embedding(load_source(run)) == "predictor"
        assert exported.weights == run / "heads.safetensors" and exported.embedding == embedding
        with torch.no_grad():
            assert torch.equal(exported.backbone(x), rebuilt.backbone(x))
    # weights other than the exported backbone: the heads file does not belong to them
    init = with_heads(load_source(run / "checkpoints" / "last.ckpt"), "projector")
    assert init.weights.suffix == ".ckpt"


def test_the_command_lines_defaults_are_the_dataclasses():
    """``eval generation`` / ``eval reconstruct`` / ``eval finetune`` / ``eval rankme`` flags default to their typed
    configs' fields, and ``eval generation``'s runner takes the config the flags build."""
    import dataclasses

    from selfsup.commands.main import build_parser
    from selfsup.eval.finetune import FinetuneConfig
    from selfsup.eval.reconstruct import ReconstructConfig
    from selfsup.eval.spectrum import SpectrumConfig
    from selfsup.runs.generation import GenerationConfig

    parse = build_parser().parse_args
    g = parse(["eval", "generation", "RUN"])
    assert GenerationConfig(encoder=g.encoder, n=g.n, steps=g.steps, sampler=g.sampler, cfg=g.cfg, seed=g.seed,
                            k=g.k, batch_size=g.batch_size, sample_batch=g.sample_batch,
                            inception=not g.no_inception) == GenerationConfig()
    r = parse(["eval", "reconstruct", "RUN"])
    assert ReconstructConfig(**{f.name: getattr(r, f.name) for f in dataclasses.fields(ReconstructConfig)}) == \
        ReconstructConfig()
    f = parse(["eval", "finetune", "RUN"])
    ft = FinetuneConfig()
    assert (f.epochs, f.ft_batch, f.lr, f.layer_decay, f.drop_path, f.min_lr) == (
        ft.epochs, ft.batch_size, ft.base_lr, ft.layer_decay, ft.drop_path, ft.min_lr)
    s = parse(["eval", "rankme", "RUN"])
    assert (s.split, s.max_samples) == (SpectrumConfig.split, SpectrumConfig.max_samples)


@pytest.mark.train
def test_knn_on_a_validation_split_carved_from_train_never_reads_the_test_split(run, tmp_path, monkeypatch):
    from selfsup.eval import KnnConfig, knn_sweep
    from selfsup.eval.splits import val_split
    from selfsup.runs import EvalSession, run_knn

    session = EvalSession(run, device="cpu", out=str(tmp_path / "api"))
    ftr, ytr = session.features("train")
    read = []
    features = session.features
    monkeypatch.setattr(session, "features", lambda split: read.append(split) or features(split))
    out = run_knn(session, KnnConfig(ks=(10,), val_fraction=0.25))
    assert read == ["train"] and out["scored_on"] == "val"
    fit, val = val_split(len(ytr), 0.25, 0)
    assert (out["train_size"], out["test_size"]) == (len(fit), len(val)) and len(fit) + len(val) == len(ytr)
    assert set(fit.tolist()).isdisjoint(val.tolist())
    by_hand = knn_sweep(ftr[fit], ytr[fit], ftr[val], ytr[val], [10], (0.07,))
    assert out["results"] == next(iter(by_hand.values()))
    assert json.loads((tmp_path / "api" / "knn-val.json").read_text()) == out
    # the command line: the same numbers, the flag checked in one line
    code, _, err = run_cli("eval", "knn", run, "--k", "10", "--val-fraction", "0.25", "--device", "cpu",
                           "--out", tmp_path / "cli")
    assert code == 0, err
    assert json.loads((tmp_path / "cli" / "knn-val.json").read_text())["results"] == out["results"]
    code, _, err = run_cli("eval", "knn", run, "--val-fraction", "1.5", "--device", "cpu", "--out", tmp_path / "x")
    assert code == 2 and "--val-fraction 1.5 must be in [0, 1)" in err
