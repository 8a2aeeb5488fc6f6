"""data.decode=device: the workers read bytes and draw the boxes, the module decodes and crops on its device
(here the CPU, the same code as on a GPU but the device), within a grey level of the CPU path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import selfsup.engine as engine
import selfsup.runs.data as run_data
from selfsup.config import load_run_config
from selfsup.data.decode import FolderCrops, crop_boxes
from selfsup.data.device_decode import EncodedBatch, EncodedCrops, all_jpeg, decode_batch
from ssl_helpers import raises_user_error

SIZES = [(120, 90), (90, 120), (160, 90), (100, 100), (200, 150), (64, 48)]  # (width, height): 4:3, 3:4, 16:9, 1:1


def photo(path, width, height, seed, mode="RGB"):
    """A smooth random image (low-frequency noise, as photographs are mostly smooth) saved as a JPEG, quality 90."""
    rng = np.random.default_rng(seed)
    small = Image.fromarray(rng.integers(0, 256, (max(2, height // 8), max(2, width // 8), 3), dtype=np.uint8))
    small.resize((width, height), Image.BICUBIC).convert(mode).save(path, quality=90)
    return path


def jpegs(folder, sizes=SIZES, mode="RGB"):
    return [photo(folder / f"{i}.jpg", w, h, i, mode) for i, (w, h) in enumerate(sizes)]


def test_device_views_are_the_cpu_views_within_a_grey_level(tmp_path):
    files, scales = jpegs(tmp_path), [(0.08, 1.0), (0.4, 1.0)]
    enc, cpu = EncodedCrops(files, 32, scales, seed=5), FolderCrops(files, 32, scales, seed=5, draft=False)
    index = torch.tensor([3, 0, 5, 1, 4, 2])
    batch = enc.crops(index, epoch=2)
    assert isinstance(batch, EncodedBatch) and len(batch) == 6
    for row, i in enumerate(index.tolist()):  # the CPU path's boxes, from the header's size
        w, h = SIZES[i]
        assert batch.boxes[row].tolist() == [list(b) for b in crop_boxes(5, 2, i, h, w, scales)]
        assert batch.data[sum(batch.lengths[:row]):][:batch.lengths[row]].numpy().tobytes() == files[i].read_bytes()
    views, ref = decode_batch(batch, enc, "cpu"), cpu.crops(index, 2)
    assert views.shape == ref.shape == (6, 2, 3, 32, 32) and views.dtype == torch.uint8
    diff = (views.float() - ref.float()).abs()
    assert diff.mean() < 1.5 and diff.quantile(0.99) <= 8, (diff.mean(), diff.quantile(0.99))  # measured 1.07, 6


def test_a_multicrop_plan_comes_as_runs_of_equal_sizes_and_grayscale_as_one_channel(tmp_path):
    files = jpegs(tmp_path)
    sizes, scales = [32, 32, 16, 16, 16], [(0.4, 1.0)] * 2 + [(0.05, 0.4)] * 3
    enc = EncodedCrops(files, 32, scales, seed=0, sizes=sizes)
    glob, local = decode_batch(enc.crops(torch.arange(6), 0), enc, "cpu")
    ref = FolderCrops(files, 32, scales, seed=0, sizes=sizes, draft=False).crops(torch.arange(6), 0)
    assert glob.shape == (6, 2, 3, 32, 32) and local.shape == (6, 3, 3, 16, 16)
    # the same views (a wrong box or layout differs by tens of grey levels); the filters differ most where a crop
    # shrinks by 2-4 x (box against triangle: 1-2.6 grey levels), measured 1.8 here
    assert (local.float() - ref[1].float()).abs().mean() < 3
    grey = EncodedCrops(files, 16, [(0.2, 1.0)] * 2, seed=0, channels=1)
    views = decode_batch(grey.crops(torch.arange(6), 0), grey, "cpu")
    ref = FolderCrops(files, 16, [(0.2, 1.0)] * 2, seed=0, channels=1, draft=False).crops(torch.arange(6), 0)
    assert views.shape == (6, 2, 1, 16, 16) and (views.float() - ref.float()).abs().mean() < 3  # 5-10 x: 2.5


def test_a_file_the_decoder_refuses_sends_the_batch_to_the_cpu_path_and_its_skip_rule(tmp_path):
    files = jpegs(tmp_path)
    data = files[2].read_bytes()
    files[2].write_bytes(data[:len(data) // 2])  # the header reads; the body ends half-way
    enc = EncodedCrops(files, 16, [(0.2, 1.0)] * 2, seed=0).skip_bad_files(0.5)
    batch = enc.crops(torch.arange(6), 0)
    assert len(batch) == 6 and not enc.bad  # the worker read its header: nothing known bad yet
    views = decode_batch(batch, enc, "cpu")
    ref = FolderCrops(files, 16, [(0.2, 1.0)] * 2, seed=0).skip_bad_files(0.5).crops(torch.arange(6), 0)
    assert torch.equal(views, ref) and list(enc.bad) == [2]  # the CPU path's views: file 3 stands in for 2


def test_a_file_whose_header_does_not_read_is_skipped_in_the_worker(tmp_path):
    files = jpegs(tmp_path)
    files[1].write_bytes(b"not a jpeg at all")
    enc = EncodedCrops(files, 16, [(0.2, 1.0)] * 2, seed=0).skip_bad_files(0.5)
    batch = enc.crops(torch.tensor([1, 4]), 0)
    assert list(enc.bad) == [1] and batch.lengths[0] == len(files[2].read_bytes())  # the next readable file
    w, h = SIZES[2]
    assert batch.boxes[0].tolist() == [list(b) for b in crop_boxes(0, 0, 2, h, w, [(0.2, 1.0)] * 2)]
    with raises_user_error("corrupt or unreadable image file", "1.jpg"):
        EncodedCrops(files, 16, [(0.2, 1.0)] * 2, seed=0).crops(torch.tensor([1]), 0)  # data.on_bad_file=error


def test_data_decode_chooses_the_path_and_names_a_folder_it_cannot_decode(tmp_path):
    class Trainer:
        def __init__(self, kind):
            self.accelerator = type(kind, (), {})()

    jpg, png = [tmp_path / "a.jpg", tmp_path / "B.JPEG"], [tmp_path / "a.jpg", tmp_path / "b.png"]
    assert all_jpeg(jpg) and not all_jpeg(png)
    assert run_data.decode_on_device("auto", jpg, Trainer("CUDAAccelerator"))
    few = run_data.DEVICE_DECODE_BELOW_WORKERS - 1
    assert run_data.decode_on_device("auto", jpg, Trainer("CUDAAccelerator"), workers=few)
    assert not run_data.decode_on_device("auto", jpg, Trainer("CUDAAccelerator"),  # enough workers: the CPU path (H200)
                                       workers=run_data.DEVICE_DECODE_BELOW_WORKERS)
    assert run_data.decode_on_device("device", jpg, Trainer("CUDAAccelerator"), workers=14)
    assert not run_data.decode_on_device("auto", png, Trainer("CUDAAccelerator"))
    assert not run_data.decode_on_device("auto", jpg, Trainer("CPUAccelerator"))
    assert not run_data.decode_on_device("cpu", jpg, Trainer("CUDAAccelerator"))
    assert run_data.decode_on_device("device", jpg, Trainer("CPUAccelerator"))
    with raises_user_error("data.decode=device decodes JPEG files only", "1 training files", "b.png",
                           "data.decode=cpu"):
        run_data.decode_on_device("device", png, Trainer("CUDAAccelerator"))
    with raises_user_error("data.decode='gpu' is not one of: auto, cpu, device"):
        load_run_config("simclr-digits", ["data.decode=gpu"])


def test_a_device_whose_decoder_fails_keeps_the_cpu_path_or_stops_in_one_line(monkeypatch, capsys):
    from selfsup.data.device_decode import decoder_error

    assert decoder_error("cpu") is None  # torchvision decodes a JPEG here
    trainer = type("T", (), {"accelerator": type("CUDAAccelerator", (), {})()})()
    monkeypatch.setattr(run_data, "decoder_error", lambda device: "RuntimeError: not compiled with nvJPEG")
    assert not run_data.decode_on_device("auto", ["a.jpg"], trainer, "cuda:0")
    assert "data.decode=auto: torchvision cannot decode JPEGs on cuda:0 (RuntimeError: not compiled with nvJPEG); " \
           "the workers decode them" in capsys.readouterr().err
    with raises_user_error("data.decode=device: torchvision cannot decode JPEGs on cuda:0", "use data.decode=cpu"):
        run_data.decode_on_device("device", ["a.jpg"], trainer, "cuda:0")


def test_a_refused_batch_is_said_once(tmp_path, capsys):
    files = jpegs(tmp_path)
    enc = EncodedCrops(files, 16, [(0.2, 1.0)] * 2, seed=0)
    batch = enc.crops(torch.arange(6), 0)
    broken = EncodedBatch(torch.zeros_like(batch.data), batch.lengths, batch.boxes, batch.index, batch.epoch)
    for _ in range(2):
        assert torch.equal(decode_batch(broken, enc, "cpu"), FolderCrops(files, 16, [(0.2, 1.0)] * 2, seed=0).crops(
            torch.arange(6), 0))
    assert capsys.readouterr().err.count("the device's JPEG decoder refused a batch") == 1 and enc.fallbacks == 2


@pytest.mark.spawn
@pytest.mark.parametrize("workers", [0, 1])
def test_pretraining_decodes_on_the_device_with_or_without_workers(tmp_path, workers):
    for split in ("train", "val"):
        for c in range(2):
            (tmp_path / "images" / split / f"c{c}").mkdir(parents=True)
            jpegs(tmp_path / "images" / split / f"c{c}", SIZES * 2)  # 24 training images: the report's kNN@20
    cfg = load_run_config("simclr-digits", [
        "data.name=imagefolder", f"data.root={tmp_path / 'images'}", "data.image_size=8", "data.batch_size=4",
        "data.decode=device", f"data.num_workers={workers}", "trainer.max_epochs=1", "trainer.limit_train_batches=2",
        "trainer.progress_bar=false", "trainer.accelerator=cpu", "trainer.devices=1", "method.proj_hidden_dim=32",
        "method.dim=16", f"output_dir={tmp_path}", f"name=w{workers}"])
    run = engine.pretrain(cfg)
    assert (run / "backbone.safetensors").exists()


def test_prefetching_one_batch_ahead_gives_each_batch_its_own_views(tmp_path):
    """DecodePrefetcher on the CPU (streams and events no-ops, the same code path): batch k's views are decode(k)
    whether decoded ahead or not, in order, the last batch and the first of an epoch decoded when their turn comes,
    a resumed loop (a fresh prefetcher mid-epoch) the same, a batch other than the one started decoded anew, and an
    error of a decode done ahead raised at its own batch."""
    from selfsup.data.device_decode import DecodePrefetcher

    files = jpegs(tmp_path)
    enc = EncodedCrops(files, 16, [(0.2, 1.0)] * 2, seed=0)
    epochs = {e: [enc.crops(torch.tensor(ix), e) for ix in ([0, 1], [2, 3], [4, 5])] for e in (0, 1)}
    calls = []

    def decode(batch):
        calls.append((batch.epoch, batch.index.tolist()))
        return decode_batch(batch, enc, "cpu")

    p = DecodePrefetcher(decode, "cpu")
    assert p.stream is None
    for e, batches in epochs.items():  # the loop: take batch k, then start batch k+1 while step k runs
        for k, batch in enumerate(batches):
            views = p.take(batch)
            assert torch.equal(views, decode_batch(batch, enc, "cpu"))
            if k + 1 < len(batches):
                p.start(batches[k + 1])
                assert calls[-1] == (e, batches[k + 1].index.tolist())  # decoded ahead, before step k's end
    assert p.started == 4 and p.hits == 4 and len(calls) == 6  # each batch decoded once

    resumed = DecodePrefetcher(decode, "cpu")  # resumed at batch 1 of epoch 1
    assert torch.equal(resumed.take(epochs[1][1]), decode_batch(epochs[1][1], enc, "cpu")) and resumed.hits == 0
    resumed.start(epochs[1][2])
    assert torch.equal(resumed.take(epochs[0][2]), decode_batch(epochs[0][2], enc, "cpu"))  # not the started one
    assert resumed.hits == 0 and resumed.pending is None

    def failing(batch):
        if batch.index.tolist() == [2, 3]:
            raise RuntimeError("corrupt")
        return decode(batch)

    f = DecodePrefetcher(failing, "cpu")
    f.take(epochs[0][0])
    f.start(epochs[0][1])  # the error waits for its batch
    with pytest.raises(RuntimeError, match="corrupt"):
        f.take(epochs[0][1])


@pytest.mark.train
def test_pretraining_with_prefetched_device_decode_is_the_run_without(tmp_path, monkeypatch):
    """In the Trainer's loop batch k+1 is decoded ahead during step k (the fetcher's batch, seen by upcoming_batch);
    the trained weights are bit-identical to a run that decodes each batch at its own step."""
    from safetensors.torch import load_file

    import selfsup.data.device_decode as device_decode

    for split in ("train", "val"):
        for c in range(2):
            (tmp_path / "images" / split / f"c{c}").mkdir(parents=True)
            jpegs(tmp_path / "images" / split / f"c{c}", SIZES * 2)  # 24 training images: the report's kNN@20
    started = []
    real_start = device_decode.DecodePrefetcher.start
    monkeypatch.setattr(device_decode.DecodePrefetcher, "start", lambda self, b: started.append(b.epoch) or real_start(
        self, b))

    def run(name):
        cfg = load_run_config("simclr-digits", [
            "data.name=imagefolder", f"data.root={tmp_path / 'images'}", "data.image_size=8", "data.batch_size=8",
            "data.decode=device", "data.num_workers=0", "trainer.max_epochs=2", "trainer.progress_bar=false",
            "trainer.accelerator=cpu", "trainer.devices=1", "method.proj_hidden_dim=32", "method.dim=16",
            f"output_dir={tmp_path}", f"name={name}"])
        return load_file(engine.pretrain(cfg) / "backbone.safetensors")

    ahead = run("ahead")
    assert started == [0, 0, 1, 1]  # 3 batches an epoch: batches 1 and 2 of each decoded ahead
    monkeypatch.setattr(device_decode.DecodePrefetcher, "start", lambda self, b: started.append("no"))
    monkeypatch.setattr("selfsup.methods.device_views.upcoming_batch", lambda trainer: None)
    plain = run("plain")
    assert started[4:] == [] and ahead.keys() == plain.keys()
    assert all(torch.equal(ahead[k], plain[k]) for k in ahead)


def test_the_lookahead_loader_holds_the_next_batch_and_changes_nothing():
    from selfsup.data.loader import Lookahead, LookaheadLoader

    made = []
    look = Lookahead(lambda: made.append(1) or iter([10, 11, 12]))
    assert look.upcoming is None and not made  # started on the first next(), as DeferredLoader
    seen = []
    for item in look:
        seen.append((item, look.upcoming))
    assert seen == [(10, 11), (11, 12), (12, None)] and made == [1]
    loader = LookaheadLoader(list(range(5)), batch_size=None)
    assert list(loader) == list(range(5)) and loader.current.upcoming is None and len(loader) == 5
