"""data.name=webdataset: tar shards the tests write, split across processes and workers, decode-time crops,
resume at the right sample, corrupt images and broken shards skipped under the bad-file rule or named."""

from __future__ import annotations

import statistics

import pytest
import torch

from selfsup.config import DataConfig
from selfsup.data.datasets import load_dataset
from selfsup.data.loader import StreamBatchSampler, stream_loader
from selfsup.data.shards import ShardCrops
from selfsup.errors import UserError
from shard_files import write_shards

SCALES = [(0.3, 1.0), (0.5, 1.0)]


def shards(root, **kw):
    return load_dataset(DataConfig(name="webdataset", root=str(root), image_size=8, **kw), "train")


def epoch_batches(ds, epoch, rank, world, local, workers, consumed=0, buffer=None, skip=None, log=None):
    streams = max(1, workers)
    if buffer is not None:
        ds.images.shuffle_buffer = buffer
    crops = ShardCrops(ds.images, SCALES, seed=3, rank=rank, world=world, batch=local, streams=streams)
    if skip is not None:
        crops.skip_bad_files(skip, log)
    sampler = StreamBatchSampler(len(ds) // (local * world), streams, consumed=lambda: consumed)
    sampler.set_epoch(epoch)
    return list(stream_loader(crops, sampler, num_workers=workers))


def test_shards_are_counted_and_their_first_images_load(tmp_path):
    ds = shards(write_shards(tmp_path / "s", [5, 3, 4]))
    assert len(ds) == 12 and ds.images.shape == (12, 3, 8, 8) and ds.num_classes == 0 and ds.channels == 3
    head = ds.head(7)
    assert head.images.shape == (7, 3, 8, 8) and head.images.dtype == torch.uint8
    assert head.labels.tolist() == list(range(7))  # shard order, tar order
    assert len(shards(tmp_path / "s", num_samples=10)) == 10  # the epoch length given, nothing counted


@pytest.mark.spawn
@pytest.mark.parametrize("workers", [0, 2])
def test_two_processes_see_each_sample_once_per_epoch(tmp_path, workers):
    """8 equal shards of 6, global batch 8 over 2 processes (4 each): 6 batches per process and epoch; the two
    processes' batches together hold every sample exactly once, and the next epoch deals them otherwise."""
    ds = shards(write_shards(tmp_path / "s", [6] * 8))
    seen = {}
    for epoch in (0, 1):
        ranks = [epoch_batches(ds, epoch, rank, 2, 4, workers) for rank in (0, 1)]
        assert [len(r) for r in ranks] == [6, 6]
        for views, labels in ranks[0] + ranks[1]:
            assert views.shape == (4, 2, 3, 8, 8) and views.dtype == torch.uint8
        ids = [sorted(torch.cat([b[1] for b in r]).tolist()) for r in ranks]
        assert sorted(ids[0] + ids[1]) == list(range(48))
        seen[epoch] = ids
    assert seen[0] != seen[1]  # another shard assignment each epoch
    # the same epoch again: the same batches, bit for bit (crops seeded by seed, epoch and sample)
    again = epoch_batches(ds, 1, 0, 2, 4, workers)
    first = epoch_batches(ds, 1, 0, 2, 4, workers)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(again, first))


@pytest.mark.spawn
def test_a_resumed_epoch_continues_at_the_right_sample(tmp_path):
    ds = shards(write_shards(tmp_path / "s", [7, 5, 9, 3]), shuffle_buffer=4)
    full = epoch_batches(ds, 2, 0, 1, 3, 2)
    assert len(full) == 8
    for consumed in (1, 3, 6):
        rest = epoch_batches(ds, 2, 0, 1, 3, 2, consumed=consumed)
        assert len(rest) == len(full) - consumed
        assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(rest, full[consumed:]))


def test_uneven_shards_keep_every_process_at_the_same_step_count(tmp_path):
    """3 + 9 samples over 2 processes x 1 stream: each yields 12 // 4 = 3 batches of 2; rank with the 3-sample
    shard wraps around it (documented: those samples are seen twice), the other leaves 3 for later epochs."""
    ds = shards(write_shards(tmp_path / "s", [3, 9]), shuffle_buffer=0)
    ranks = [epoch_batches(ds, 0, rank, 2, 2, 0) for rank in (0, 1)]
    assert [len(r) for r in ranks] == [3, 3]
    counts = sorted(len(set(torch.cat([b[1] for b in r]).tolist())) for r in ranks)
    assert counts == [3, 6]  # the small shard's 3 samples (twice), 6 of the 9


def test_corrupt_image_is_replaced_in_its_batch_and_logged(tmp_path, capsys):
    ds = shards(write_shards(tmp_path / "s", [4, 4], corrupt={5}), shuffle_buffer=0)
    log = tmp_path / "bad_files.jsonl"
    batches = epoch_batches(ds, 0, 0, 1, 4, 0, skip=0.2, log=log)
    labels = sorted(torch.cat([b[1] for b in batches]).tolist())
    assert len(labels) == 8 and 5 not in labels and len(set(labels)) == 7
    err = capsys.readouterr().err
    assert "skipped an unreadable image" in err and "00005.png" in err and "another sample of its batch" in err
    import json

    entry, = [json.loads(line) for line in log.read_text().splitlines()]
    assert entry["path"].endswith("shard-000001.tar:00005.png")


def test_under_on_bad_file_error_a_corrupt_image_stops_naming_its_shard_and_member(tmp_path):
    ds = shards(write_shards(tmp_path / "s", [4, 4], corrupt={5}), shuffle_buffer=0)
    with pytest.raises(UserError, match=r"corrupt or unreadable image file .*shard-000001.tar:00005.png"):
        epoch_batches(ds, 0, 0, 1, 4, 0)


def test_past_the_cap_corrupt_images_stop_the_run_in_one_line(tmp_path):
    ds = shards(write_shards(tmp_path / "s", [12, 12], corrupt={0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20}),
                shuffle_buffer=0)
    with pytest.raises(UserError, match=r"11 of 24 images could not be read .*data.max_bad_fraction=0.1"):
        epoch_batches(ds, 0, 0, 1, 4, 0, skip=0.1)  # a cap of max(10, 2.4) = 10


def truncate(shard, keep: float):
    data = shard.read_bytes()
    shard.write_bytes(data[:int(len(data) * keep)])


def test_a_shard_that_breaks_off_is_named_with_where_or_ends_there_under_skip(tmp_path, capsys):
    folder = write_shards(tmp_path / "s", [6, 6])
    truncate(folder / "shard-000000.tar", 0.55)  # the tar ends inside a member
    ds = shards(folder, shuffle_buffer=0, num_samples=12)
    with pytest.raises(UserError, match=r"shard .*shard-000000.tar breaks off after its sample \d \(key 0000\d\)"
                                        r".*rewrite or remove it"):
        epoch_batches(ds, 0, 0, 1, 4, 0)
    log = tmp_path / "bad_files.jsonl"
    batches = epoch_batches(ds, 0, 0, 1, 4, 0, skip=0.2, log=log)
    labels = torch.cat([b[1] for b in batches]).tolist()
    assert len(labels) == 12 and set(range(6, 12)) <= set(labels)  # the next shard, then around again
    assert "the stream goes on with its next shard" in capsys.readouterr().err
    assert "shard-000000.tar breaks off" in log.read_text()
    again = epoch_batches(ds, 0, 0, 1, 4, 0, skip=0.2)  # the same batches: the rule depends on the shards alone
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(again, batches))


def test_a_glob_of_shards_their_inferred_size_and_one_channel(tmp_path, capsys):
    folder = write_shards(tmp_path / "s", [5, 3])
    ds = load_dataset(DataConfig(name="webdataset", root=f"{folder}/shard-*.tar", channels=1), "train")
    assert len(ds) == 8 and ds.channels == 1 and ds.mean == (0.459,)
    from selfsup.data.shards import first_image_sizes

    size = int(statistics.median(min(wh) for wh in first_image_sizes(ds.images.urls, 256)))  # 12..20 px: no clamp
    assert ds.image_size == size and f"data.image_size unset: using {size} px" in capsys.readouterr().err
    crops = ShardCrops(ds.images, SCALES, seed=3, rank=0, world=1, batch=2, streams=1)[(0, 0, 0)][0]
    assert crops.shape == (2, 2, 1, size, size) and ds.head(3).images.shape == (3, 1, size, size)
    with pytest.raises(UserError, match="1 of its 3 shards do not exist"):
        shards(f"{folder}/shard-{{000000..000002}}.tar")


@pytest.mark.spawn
def test_streamed_urls_need_a_sample_count_and_shards_name_their_mistakes(tmp_path):
    folder = write_shards(tmp_path / "s", [4, 4])
    url = f"pipe:cat {folder}/shard-{{000000..000001}}.tar"  # any URL the webdataset library opens
    with pytest.raises(UserError, match="set data.num_samples"):
        shards(url)
    with pytest.raises(UserError, match="data.image_size is unset and no image size can be read from pipe:cat"):
        load_dataset(DataConfig(name="webdataset", root=url, num_samples=8), "train")  # a stream: no header to read
    ds = shards(url, num_samples=8)
    labels = sorted(torch.cat([b[1] for b in epoch_batches(ds, 0, 0, 1, 2, 0, buffer=0)]).tolist())
    assert labels == list(range(8))
    with pytest.raises(UserError, match="needs data.root"):
        load_dataset(DataConfig(name="webdataset"), "train")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no .tar shards in"):
        shards(tmp_path / "empty")
    with pytest.raises(UserError, match="data.name=webdataset has no labels and evaluation needs them"):
        load_dataset(DataConfig(name="webdataset", root=str(folder)), "test")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.tar").write_bytes(b"not a tar file" * 100)
    with pytest.raises(UserError, match="is not a readable tar file"):
        shards(tmp_path / "bad", on_bad_file="error")
    with pytest.raises(UserError, match="hold no image samples"):  # under skip: counted as 0 samples
        shards(tmp_path / "bad")


@pytest.mark.train
def test_a_truncated_or_unreadable_shard_under_skip_is_a_bad_file_event_and_the_run_goes_on(tmp_path):
    """Issue 49's replay: the default data.on_bad_file=skip, no data.num_samples, the instruments on (their fixed
    batch reads the shards' head): a truncated shard and one that is no tar at all cost one line each and a
    bad_file event, and the run ends."""
    import json

    from ssl_helpers import TINY, run_cli

    folder = write_shards(tmp_path / "s", [16, 16, 16, 16])
    truncate(folder / "shard-000000.tar", 0.15)  # breaks off early: every pass through it meets the break
    (folder / "shard-000004.tar").write_bytes(b"not a tar file" * 100)
    code, out, err = run_cli("pretrain", "moco-v3-vit-digits", *TINY, "data.name=webdataset", f"data.root={folder}",
                             "data.batch_size=16", "trainer.limit_train_batches=1.0", "trainer.max_epochs=2",
                             "eval.knn_every_n_steps=0",
                             "eval.online_probe=false", f"output_dir={tmp_path}", "name=r")
    assert code == 0, err
    events = [json.loads(line) for line in (tmp_path / "r" / "events.jsonl").read_text().splitlines()]
    bad = [e["path"] for e in events if e["kind"] == "bad_file"]
    assert len(bad) == len(set(bad)) and any("shard-000000.tar" in p for p in bad), (bad, err)
    assert err.count("breaks off") == len(bad)  # one line per skipped file
    with pytest.raises(UserError, match="shard-000000.tar"):  # error: the same shard stops the run at once
        shards(folder, on_bad_file="error")


@pytest.mark.spawn
def test_the_engine_deals_the_shards_by_global_rank(tmp_path):
    """PretrainData of two processes (the trainer each would have): every sample once per epoch across them."""
    from types import SimpleNamespace

    from lightning.pytorch.accelerators import CPUAccelerator

    import selfsup.engine as engine
    from selfsup.config import load_run_config
    from selfsup.data.views import AugmentConfig

    write_shards(tmp_path / "s", [6] * 4)  # 6 batches of 2 per process: 3 per stream, one shard of 6 each
    cfg = load_run_config("byol-digits", ["data.name=webdataset", f"data.root={tmp_path / 's'}", "data.image_size=8",
                                          "data.batch_size=4", "data.num_workers=2", "instruments.rank_samples=3"])
    train = load_dataset(cfg.data, "train")
    labels = []
    views = [AugmentConfig(), AugmentConfig()]
    for rank in (0, 1):
        data = engine.PretrainData(cfg, train)
        assert len(data.dataset) == 3 and data.dataset.images.shape == (3, 3, 8, 8)  # the instruments' fixed batch
        progress = SimpleNamespace(current=SimpleNamespace(ready=0))
        data.trainer = SimpleNamespace(
            world_size=2, global_rank=rank, accelerator=CPUAccelerator(), default_root_dir=str(tmp_path),
            lightning_module=SimpleNamespace(device_views=SimpleNamespace(
                crops=lambda: ([(a.crop_min, a.crop_max) for a in views], (8, 8)))),
            fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=progress)), num_training_batches=6)
        batches = list(data.train_dataloader())
        assert len(batches) == 24 // 4 and all(b[0].shape == (2, 2, 3, 8, 8) for b in batches)
        labels += torch.cat([b[1] for b in batches]).tolist()
    assert sorted(labels) == list(range(24))
    cfg.data.num_workers = 3  # 2 processes x 3 streams > 4 shards
    data = engine.PretrainData(cfg, train)
    data.trainer = SimpleNamespace(world_size=2, global_rank=0, lightning_module=SimpleNamespace(
        device_views=SimpleNamespace(crops=lambda: ([(0.08, 1.0)], (8,)))))
    with pytest.raises(UserError, match="4 shard\\(s\\) cannot feed 2 process\\(es\\) x 3 decoding stream"):
        data.train_dataloader()


DDP_SCRIPT = '''
import json, os, sys
import lightning.pytorch as pl
import selfsup.engine as engine
from selfsup.config import load_run_config

class Seen(pl.Callback):
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        with open(os.path.join(sys.argv[2], f"seen-{trainer.global_rank}.jsonl"), "a") as f:
            f.write(json.dumps([trainer.current_epoch, batch[1].tolist()]) + "\\n")

engine.pretrain(load_run_config("byol-digits", sys.argv[3:] + [f"data.root={sys.argv[1]}", f"output_dir={sys.argv[2]}",
                                                              "name=ddp"]), callbacks=[Seen()])
'''


@pytest.mark.spawn
def test_two_ddp_processes_train_on_each_sample_once_per_epoch(tmp_path):
    """A real two-process CPU DDP run (gloo; Lightning re-runs the script for rank 1) on 4 shards of 6: per epoch,
    the labels the two processes trained on are every sample exactly once, dealt differently each epoch."""
    import json
    import os

    from spawn import run_script
    from ssl_helpers import TINY

    write_shards(tmp_path / "s", [6] * 4)
    (tmp_path / "ddp.py").write_text(DDP_SCRIPT)
    overrides = [o for o in TINY if not o.startswith(("trainer.devices", "trainer.limit_train_batches", "data.batch",
                                                      "trainer.max_epochs"))]
    run = run_script(  # rank 0 forked from the tests' preloaded fork server; Lightning starts rank 1 anew
        tmp_path / "ddp.py", [str(tmp_path / "s"), str(tmp_path), *overrides, "trainer.devices=2",
                              "trainer.strategy=ddp", "trainer.max_epochs=2", "data.name=webdataset",
                              "data.image_size=8", "data.batch_size=8", "instruments.rank_samples=4"],
        cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = {0: [], 1: []}
    for rank in (0, 1):
        for line in (tmp_path / f"seen-{rank}.jsonl").read_text().splitlines():
            epoch, labels = json.loads(line)
            seen[epoch].append(labels)
    for epoch in (0, 1):
        assert len(seen[epoch]) == 2 * 3 and all(len(b) == 4 for b in seen[epoch])  # 3 steps x 2 processes x 4
        assert sorted(sum(seen[epoch], [])) == list(range(24))
    assert sorted(map(sorted, seen[0])) != sorted(map(sorted, seen[1]))
