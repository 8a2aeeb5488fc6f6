"""trainer.loggers: csv, tensorboard and wandb (offline, files in the run folder) each receive Lightning's values,
the instruments' metrics and the detectors' events."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest

import selfsup.engine as engine
from selfsup.config import load_run_config
from selfsup.errors import UserError
from selfsup.runs.loggers import WANDB_ID
from ssl_helpers import TINY


def wandb_history(path: Path) -> list[dict]:
    """The history rows of a ``.wandb`` file: W&B's record log (the LevelDB log format: a 7-byte file header,
    32 KiB blocks of records with a 7-byte header: CRC, little-endian length, type full/first/middle/last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    pos, parts, rows = 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        parts = chunk if kind in (1, 2) else parts + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(parts)
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


def test_loggers_are_validated():
    assert load_run_config("byol-digits", ["trainer.loggers=csv,wandb"]).trainer.loggers == ["csv", "wandb"]
    assert load_run_config("byol-digits", []).trainer.loggers == ["csv", "tensorboard"]
    with pytest.raises(UserError, match="'mlflow' is not one"):
        load_run_config("byol-digits", ["trainer.loggers=[csv,mlflow]"])
    with pytest.raises(UserError, match="must name each of its loggers once"):
        load_run_config("byol-digits", ["trainer.loggers=[csv,csv]"])


def test_wandb_chosen_but_not_installed_is_one_line(tmp_path, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    cfg = load_run_config("byol-digits", [*TINY, "trainer.loggers=csv,wandb", f"output_dir={tmp_path}", "name=r"])
    with pytest.raises(UserError, match=r"wandb package is not installed; pip install 'selfsup\[wandb\]'"):
        engine.pretrain(cfg)
    assert not (tmp_path / "r").exists()  # refused before the run folder is made


@pytest.mark.spawn
def test_wandb_offline_files_hold_the_metrics_and_events_and_tensorboard_too(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    cfg = load_run_config("byol-digits", [
        *TINY, "trainer.limit_train_batches=5", "trainer.loggers=[csv,tensorboard,wandb]",
        "instruments.every_n_steps=1",
        "instruments.spike_k=0.001", "instruments.spike_window=2", "instruments.spike_min_history=2",
        f"output_dir={tmp_path}", "name=r"])
    run = engine.pretrain(cfg)
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    events = [e for e in events if e["kind"] != "not_learning"]  # the end of run's verdict on 5 steps (learning.py)
    assert events and all(e["kind"] == "grad_spike" for e in events)
    files = list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1 and (run / WANDB_ID).read_text().strip() in files[0].name
    rows = wandb_history(files[0])
    with (run / "metrics.csv").open(newline="") as f:
        table = list(csv.DictReader(f))
    for key in ("train/loss", "train/lr", "instruments/grad_l2", "instruments/norm_embedding_mean"):
        logged = {r["trainer/global_step"]: r[key] for r in rows if key in r}
        expected = {int(r["step"]): float(r[key]) for r in table if r.get(key)}
        assert logged and logged == pytest.approx(expected, rel=1e-6), key
    for e in events:  # each event at its step, under events/<kind>/<group>
        key = f"events/grad_spike/{e['group']}"
        assert any(r.get(key) == pytest.approx(e["value"]) and r["trainer/global_step"] == e["step"] for r in rows)
    assert "wandb runs offline" in capsys.readouterr().err
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tb = EventAccumulator(str(run / "tensorboard")).Reload()
    tags = set(tb.Tags()["scalars"])
    assert {"train/loss", "instruments/grad_l2", f"events/grad_spike/{events[0]['group']}"} <= tags
    assert not any(k.startswith("events/") for k in table[0])  # the CSV logger's events are events.jsonl


@pytest.mark.train
def test_the_progress_bar_is_plain_lines_where_stdout_is_not_a_terminal(tmp_path):
    """``selfsup pretrain ... > train.log``: no tqdm redraws (carriage returns) in the log, a plain line every
    ``trainer.log_every_n_steps`` batches and at the epoch's end, with the step, the loss and the rate."""
    from ssl_helpers import run_cli

    code, out, err = run_cli("pretrain", "moco-v3-vit-digits", *TINY, "trainer.progress_bar=true",
                             "trainer.limit_train_batches=5", "trainer.log_every_n_steps=2", "eval.knn_at_end=false",
                             f"output_dir={tmp_path}", "name=r")
    assert code == 0, err
    assert "\r" not in out + err and "it/s]" not in out + err
    lines = [line for line in out.splitlines() if line.startswith("epoch 1/1 batch ")]
    assert [line.split(" step ")[0] for line in lines] == ["epoch 1/1 batch 2/5", "epoch 1/1 batch 4/5",
                                                           "epoch 1/1 batch 5/5"], out
    assert all("loss" in line and line.endswith("it/s") for line in lines), lines
