"""Datasets (digits, Fashion-MNIST IDX, imagefolder) and the epoch batch sampler."""

from __future__ import annotations

import gzip
import os

import numpy as np
import pytest
import torch
from PIL import Image

from selfsup.config import DataConfig
from selfsup.data.datasets import IMAGENET_MEAN, fashion_mnist_default, load_dataset
from selfsup.data.loader import EpochBatchSampler, batch_loader
from selfsup.errors import UserError, clean_message

from idx_files import fake_fashion, write_idx
from ssl_helpers import raises_user_error


# --------------------------------------------------------------------------- digits


def test_digits_split_sizes_and_fixedness():
    train, test = load_dataset(DataConfig(name="digits"), "train"), load_dataset(DataConfig(name="digits"), "test")
    assert (len(train), len(test)) == (1438, 359)  # 1797 images, a fixed 80/20 split
    for ds in (train, test):
        assert ds.images.dtype == torch.uint8 and ds.images.shape[1:] == (1, 8, 8)
        assert ds.labels.dtype == torch.int64 and set(ds.labels.tolist()) == set(range(10))
        assert ds.num_classes == 10 and ds.channels == 1 and ds.image_size == 8
    assert int(train.images.max()) == 255 and int(train.images.min()) == 0
    again = load_dataset(DataConfig(name="digits"), "train")
    assert torch.equal(again.images, train.images) and torch.equal(again.labels, train.labels)
    assert again.mean == train.mean and again.std == train.std
    # train and test are complementary parts of the 1797 images (all of them, each once)
    from sklearn.datasets import load_digits

    everything = torch.from_numpy(np.round(load_digits().images * (255.0 / 16.0)).astype(np.uint8))
    ours = torch.cat([train.images, test.images])[:, 0]
    key = lambda t: sorted(map(bytes, t.reshape(len(t), -1).numpy()))  # noqa: E731
    assert key(ours) == key(everything)
    images, labels = train[torch.tensor([3, 0, 7])]
    assert torch.equal(images, train.images[[3, 0, 7]]) and torch.equal(labels, train.labels[[3, 0, 7]])


def _numbered(n: int, unlabelled_every: int = 0):
    """A dataset whose image i holds the number i, so a subset shows which samples it drew."""
    from selfsup.data.datasets import ImageDataset

    labels = torch.arange(n)
    if unlabelled_every:
        labels[::unlabelled_every] = -1
    return ImageDataset("numbered", torch.arange(n).view(n, 1, 1, 1), labels, n, (0.0,), (1.0,))


def test_subset_is_one_fixed_draw_in_original_order():
    """The one subset helper (kNN monitor, RankCollapse batch, eval --train-limit): the values are the draws of
    the three helpers it replaced (randperm(N, seed)[:n] sorted), so every seeded figure stays the same."""
    ds = _numbered(20)
    assert ds.subset(6, 0).images.flatten().tolist() == [4, 5, 7, 13, 14, 19]
    assert ds.subset(6, 0, labelled_only=True).images.flatten().tolist() == [4, 5, 7, 13, 14, 19]  # all labelled
    assert ds.subset(6, 1).images.flatten().tolist() != [4, 5, 7, 13, 14, 19]  # the seed matters
    assert ds.subset(None) is ds and ds.subset(20) is ds and len(ds.subset(19, 3)) == 19
    partly = _numbered(20, unlabelled_every=2)  # even samples unlabelled
    assert partly.subset(4, 0, labelled_only=True).images.flatten().tolist() == [3, 9, 11, 15]
    assert partly.subset(4, 0).images.flatten().tolist() == [4, 5, 13, 19]
    assert partly.subset(100, 0, labelled_only=True).images.flatten().tolist() == list(range(1, 20, 2))


def test_unknown_split_is_a_programming_error():
    with pytest.raises(ValueError):
        load_dataset(DataConfig(name="digits"), "val")


# --------------------------------------------------------------------------- Fashion-MNIST


def test_fashion_mnist_from_the_installed_files():
    """The one test that reads the real files: skipped where they are absent, unless SELFSUP_REQUIRE_REAL_DATA=1
    (set by .ci/run, which installs them) makes their absence a failure."""
    if not (fashion_mnist_default() / "train-images-idx3-ubyte.gz").exists():
        reason = (f"Debian's Fashion-MNIST files are not in {fashion_mnist_default()} "
                  "(apt-get install dataset-fashion-mnist, or set SELFSUP_FASHION_MNIST_DIR)")
        if os.environ.get("SELFSUP_REQUIRE_REAL_DATA") == "1":
            pytest.fail(reason + "; SELFSUP_REQUIRE_REAL_DATA=1 requires them")
        pytest.skip(reason)
    train = load_dataset(DataConfig(name="fashion-mnist"), "train")
    test = load_dataset(DataConfig(name="fashion-mnist"), "test")
    assert (len(train), len(test)) == (60_000, 10_000)
    for ds in (train, test):
        assert ds.images.shape == (len(ds), 1, 28, 28) and ds.images.dtype == torch.uint8
        assert sorted(ds.labels.unique().tolist()) == list(range(10)) and ds.labels.dtype == torch.int64
        assert torch.bincount(ds.labels).tolist() == [len(ds) // 10] * 10  # balanced classes
    assert abs(train.images.float().mean().item() / 255 - train.mean[0]) < 1e-3


@pytest.mark.parametrize("compress", [True, False])
def test_idx_files_written_here_are_read_back(tmp_path, compress):
    written = fake_fashion(tmp_path, compress)
    for split in ("train", "test"):
        ds = load_dataset(DataConfig(name="fashion-mnist", root=str(tmp_path)), split)
        images, labels = written[split]
        assert ds.images.shape == (len(labels), 1, 28, 28)
        assert np.array_equal(ds.images[:, 0].numpy(), images) and np.array_equal(ds.labels.numpy(), labels)


def test_idx_files_in_torchvision_layout(tmp_path):
    raw = tmp_path / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    written = fake_fashion(raw, compress=False)
    ds = load_dataset(DataConfig(name="fashion-mnist", root=str(tmp_path)), "test")
    assert np.array_equal(ds.labels.numpy(), written["test"][1])


@pytest.mark.parametrize("damage", ["magic", "truncated", "gzip", "empty"])
def test_corrupt_idx_is_a_user_error_naming_the_file(tmp_path, damage):
    fake_fashion(tmp_path, compress=True)
    target = tmp_path / "train-images-idx3-ubyte.gz"
    if damage == "magic":
        write_idx(target, np.zeros((2, 28, 28)), True)
        raw = bytearray(gzip.decompress(target.read_bytes()))
        raw[2] = 0x0D  # float data, not uint8
        target.write_bytes(gzip.compress(bytes(raw)))
    elif damage == "truncated":
        target.write_bytes(gzip.compress(gzip.decompress(target.read_bytes())[:500]))
    elif damage == "gzip":
        target.write_bytes(b"this is not gzip at all" * 10)
    else:
        target.write_bytes(gzip.compress(b""))
    with raises_user_error(str(target), "not a readable IDX file"):
        load_dataset(DataConfig(name="fashion-mnist", root=str(tmp_path)), "train")


def test_images_and_labels_that_do_not_belong_together(tmp_path):
    fake_fashion(tmp_path, compress=True)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.zeros(5), True)  # 6 images, 5 labels
    with pytest.raises(UserError, match="6 images but 5 labels"):
        load_dataset(DataConfig(name="fashion-mnist", root=str(tmp_path)), "train")


def test_missing_fashion_mnist_says_where_it_looked_and_how_to_get_it(tmp_path):
    with raises_user_error(str(tmp_path), "apt-get install dataset-fashion-mnist", "data.download=true"):
        load_dataset(DataConfig(name="fashion-mnist", root=str(tmp_path)), "train")


# --------------------------------------------------------------------------- imagefolder


def make_folder(root, layout, size=(20, 12)):
    """layout: {split: {class: n_images}}; image i of class c has red = 10·c + i."""
    for split, classes in layout.items():
        for c, (cls, n) in enumerate(classes.items()):
            (root / split / cls).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                Image.new("RGB", size, (10 * c + i, 7, 200)).save(root / split / cls / f"{i:02d}.png")


def test_imagefolder_classes_labels_and_shapes(tmp_path):
    make_folder(tmp_path, {"train": {"zebra": 2, "ant": 3, "moth": 1}, "val": {"zebra": 1, "ant": 1, "moth": 2}})
    (tmp_path / "train" / "ant" / "notes.txt").write_text("not an image")  # ignored
    cfg = DataConfig(name="imagefolder", root=str(tmp_path), image_size=16, load_size=16)
    train, val = load_dataset(cfg, "train"), load_dataset(cfg, "test")
    assert len(train) == 6 and len(val) == 4 and train.num_classes == 3
    assert train.labels.tolist() == [0, 0, 0, 1, 2, 2]  # ant, moth, zebra: classes sorted by name
    assert val.labels.tolist() == [0, 1, 1, 2]
    assert train.images.shape == (6, 3, 16, 16) and train.channels == 3 and train.image_size == 16
    images, labels = train[torch.tensor([4, 0])]
    assert images.shape == (2, 3, 16, 16) and images.dtype == torch.uint8 and labels.tolist() == [2, 0]
    # a 20×12 image: shorter side to 16, centre crop; colours survive (zebra/00: red 0, ant/00: red 10)
    assert images[0, :, 8, 8].tolist() == [0, 7, 200] and images[1, :, 8, 8].tolist() == [10, 7, 200]
    loader = batch_loader(train, EpochBatchSampler(len(train), 3, shuffle=False))
    batches = list(loader)
    assert [b[0].shape for b in batches] == [(3, 3, 16, 16)] * 2


def test_an_unreadable_training_file_is_replaced_by_the_next_readable_one(tmp_path):
    """data.on_bad_file=skip: file i unreadable → the views of the first readable file after it, with that file's
    own seeded boxes (the same in any worker and after a resume); files are read in a cycle."""
    from selfsup.data.decode import FolderCrops

    make_folder(tmp_path, {"train": {"a": 3, "b": 2}})
    files = sorted((tmp_path / "train").rglob("*.png"))
    files[1].write_bytes(b"")
    files[2].write_bytes(b"no image")
    noise = np.random.default_rng(0).integers(0, 256, (12, 20, 3), dtype=np.uint8)
    Image.fromarray(noise).save(files[3])  # texture: crops of other boxes differ
    crops = FolderCrops(files, 8, [(0.3, 1.0), (0.3, 1.0)], seed=3).skip_bad_files(0.5, tmp_path / "bad.jsonl")
    assert torch.equal(crops.crop(1, 2), crops.crop(3, 2)) and torch.equal(crops.crop(2, 2), crops.crop(3, 2))
    assert not torch.equal(crops.crop(1, 2), crops.crop(3, 1))  # the stand-in's boxes of that epoch
    assert sorted(crops.bad) == [1, 2] and len((tmp_path / "bad.jsonl").read_text().splitlines()) == 2
    strict = FolderCrops(files, 8, [(0.3, 1.0)], seed=3)
    with raises_user_error(str(files[1])):
        strict.crop(1, 0)
    make_folder(tmp_path / "big", {"train": {"a": 14}})
    many = sorted((tmp_path / "big" / "train").rglob("*.png"))
    for f in many[:11]:
        f.write_bytes(b"")
    capped = FolderCrops(many, 8, [(0.3, 1.0)], seed=3).skip_bad_files(0.0)
    capped.crop(1, 0)  # ten bad files (1..10, then 11 stands in) are always allowed
    with raises_user_error("11 of 14 images could not be read", "the larger of 10", "data.max_bad_fraction"):
        capped.crop(0, 0)


def test_evaluation_features_skip_an_unreadable_file_as_training_does(tmp_path):
    make_folder(tmp_path, {"train": {"a": 2, "b": 2}})
    (tmp_path / "train" / "b" / "00.png").write_bytes(b"")
    train = load_dataset(DataConfig(name="imagefolder", root=str(tmp_path), image_size=8), "train")
    images, labels = train[torch.tensor([2, 3])]
    assert torch.equal(images[0], images[1]) and labels.tolist() == [1, 1]  # b/01 stands in, b's label kept


@pytest.mark.spawn
def test_imagefolder_corrupt_file_names_it(tmp_path):
    make_folder(tmp_path, {"train": {"a": 2, "b": 2}})
    bad = tmp_path / "train" / "b" / "01.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 20)
    train = load_dataset(DataConfig(name="imagefolder", root=str(tmp_path), image_size=8, on_bad_file="error"),
                         "train")
    train[torch.tensor([0, 1])]  # the good ones decode
    with raises_user_error(str(bad), "corrupt"):
        train[torch.tensor([2, 3])]
    # the same from a decoding worker: the CLI's one-line message still names the file
    loader = batch_loader(train, EpochBatchSampler(len(train), 4, shuffle=False), num_workers=1)
    with pytest.raises(Exception) as e:
        list(loader)
    assert str(bad) in clean_message(e.value) and "\n" not in clean_message(e.value)


def test_imagefolder_size_from_its_first_images_and_one_grayscale_channel(tmp_path, capsys):
    """data.image_size unset: the shorter side of the first train images (also when the test split is loaded
    first, as evaluation does), printed, at most 224; data.channels=1: PIL's luma, ImageNet's statistics' luma."""
    make_folder(tmp_path / "f", {"train": {"a": 2, "b": 2}, "val": {"a": 1}}, size=(20, 12))
    cfg = DataConfig(name="imagefolder", root=str(tmp_path / "f"))
    val = load_dataset(cfg, "test")
    assert val.image_size == 12 and cfg.image_size == 12 and val.images.shape == (1, 3, 12, 12)
    assert "data.image_size unset: using 12 px (the median shorter side of 4 image(s) of" in capsys.readouterr().err
    gray = DataConfig(name="imagefolder", root=str(tmp_path / "f"), image_size=8, channels=1)
    train = load_dataset(gray, "train")
    images, _ = train[torch.tensor([0, 2])]
    assert images.shape == (2, 1, 8, 8) and train.channels == 1
    assert images[:, 0, 4, 4].tolist() == [round(7 * 0.587 + 200 * 0.114), round(10 * 0.299 + 7 * 0.587 + 200 * 0.114)]
    assert train.mean == (0.459,) and train.std == (0.2256,) and load_dataset(cfg, "train").mean == IMAGENET_MEAN
    crops = train.images.train_crops([(0.5, 1.0)] * 2, seed=0).crops(torch.tensor([1]), 0)
    assert crops.shape == (1, 2, 1, 8, 8)  # the decode-time training crops are grayscale too
    make_folder(tmp_path / "big", {"train": {"a": 1}}, size=(300, 260))
    big = DataConfig(name="imagefolder", root=str(tmp_path / "big"))
    assert load_dataset(big, "train").image_size == 224 and ": 260 px, clamped to 8..224" in capsys.readouterr().err


def test_the_automatic_size_is_the_median_of_a_large_sample_on_the_patch_grid(tmp_path, capsys):
    """Issue 49: the smallest side of 16 images chose 7 px for a folder of photos; the median short side of up to
    256 images spread over the folder, clamped to 8..224 and rounded down to data.image_size_multiple (the ViT's
    patch), does not."""
    from selfsup.config import load_run_config
    from selfsup.data.datasets import auto_image_size

    root = tmp_path / "photos"
    root.mkdir()
    Image.new("RGB", (7, 9)).save(root / "000-thumbnail.png")  # first in sorted order: the old rule took it
    for i in range(40):
        Image.new("RGB", (60 + i, 50 + i % 5)).save(root / f"{i + 1:03d}.png")
    cfg = load_run_config("simclr-digits", ["data.name=images", f"data.root={root}"])
    assert cfg.data.image_size_multiple == 2  # the micro ViT's model.patch_size
    assert load_dataset(cfg.data, "train").image_size == 52  # the median of 7 and 40 of 50..54
    assert "the median shorter side of 41 image(s)" in capsys.readouterr().err
    cfg = load_run_config("simclr-digits", ["data.name=images", f"data.root={root}", "model.patch_size=16"])
    assert load_dataset(cfg.data, "train").image_size == 48
    assert "rounded to a multiple of 16" in capsys.readouterr().err
    assert auto_image_size([(5, 6)] * 3)[0] == 8 and auto_image_size([(30, 33), (31, 40), (500, 600)], 4)[0] == 28
    with pytest.raises(UserError, match="median shorter side is 3 px"):
        auto_image_size([(3, 3)] * 3)


def test_imagefolder_without_folders_or_images(tmp_path):
    with pytest.raises(UserError, match="needs data.root"):
        load_dataset(DataConfig(name="imagefolder"), "train")
    with pytest.raises(UserError, match="no train/ folder"):
        load_dataset(DataConfig(name="imagefolder", root=str(tmp_path)), "train")
    (tmp_path / "train" / "a").mkdir(parents=True)
    with pytest.raises(UserError, match="no image files"):
        load_dataset(DataConfig(name="imagefolder", root=str(tmp_path)), "train")


# --------------------------------------------------------------------------- EpochBatchSampler


@pytest.mark.parametrize("world_size", [2, 4])
def test_rank_slices_concatenate_to_the_single_process_batch(world_size):
    n, global_batch = 103, 16
    single = list(EpochBatchSampler(n, global_batch, seed=3))
    ranks = [list(EpochBatchSampler(n, global_batch // world_size, seed=3, rank=r, world_size=world_size))
             for r in range(world_size)]
    assert all(len(r) == len(single) == n // global_batch for r in ranks)
    for i, batch in enumerate(single):
        assert torch.equal(torch.cat([r[i] for r in ranks]), batch)


def test_set_epoch_reshuffles_deterministically():
    s = EpochBatchSampler(50, 10, seed=1)
    e0 = torch.cat(list(s))
    assert torch.equal(torch.cat(list(s)), e0)  # iterating again: the same epoch
    s.set_epoch(1)
    e1 = torch.cat(list(s))
    assert not torch.equal(e1, e0)
    assert sorted(e0.tolist()) == sorted(e1.tolist()) == list(range(50))  # a permutation of everything
    other = EpochBatchSampler(50, 10, seed=1)
    other.set_epoch(1)
    assert torch.equal(torch.cat(list(other)), e1)  # a fresh sampler at the same epoch
    reseeded = EpochBatchSampler(50, 10, seed=2)
    reseeded.set_epoch(1)
    assert not torch.equal(torch.cat(list(reseeded)), e1)


def test_len_and_drop_last():
    assert len(EpochBatchSampler(103, 10)) == 10
    assert len(EpochBatchSampler(103, 10, drop_last=False)) == 11
    assert len(EpochBatchSampler(103, 5, world_size=2, rank=1)) == 10
    dropped = list(EpochBatchSampler(103, 10))
    assert len(dropped) == 10 and all(len(b) == 10 for b in dropped) and len(set(torch.cat(dropped).tolist())) == 100
    kept = list(EpochBatchSampler(103, 10, shuffle=False, drop_last=False))
    assert [len(b) for b in kept] == [10] * 10 + [3] and torch.equal(torch.cat(kept), torch.arange(103))


# --------------------------------------------------------------------------- images (unlabelled folders)


def test_unlabelled_folder_at_any_depth_skips_a_corrupt_file_with_a_count(tmp_path, capsys):
    files = ["top.png", "a/one.JPG", "a/b/c/deep.bmp", "z/two.webp", "a/b/three.jpeg"]
    for i, name in enumerate(files):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (10 + i, 12), (20 * i, 5, 9)).save(tmp_path / name, lossless=True)  # lossless webp
    (tmp_path / "a" / "b" / "bad.jpg").write_bytes(b"not a jpeg at all" * 10)  # corrupt: skipped and counted
    (tmp_path / "a" / "README.txt").write_text("not an image")  # not an image suffix: ignored
    (tmp_path / ".cache").mkdir()
    Image.new("RGB", (10, 10)).save(tmp_path / ".cache" / "hidden.png")  # hidden folder: ignored
    train = load_dataset(DataConfig(name="images", root=str(tmp_path), image_size=8), "train")
    err = capsys.readouterr().err
    assert f"skipped an unreadable image: unreadable image file {tmp_path / 'a/b/bad.jpg'} (" in err
    assert err.count("skipped an unreadable image") == 1 and "it is left out (1 skipped, at most 10 of 6" in err
    assert [str(f.relative_to(tmp_path)) for f in train.images.files] == sorted(files)  # sorted by path
    assert len(train) == 5 and train.num_classes == 0 and train.labels.tolist() == [-1] * 5
    assert train.images.shape == (5, 3, 8, 8) and train.channels == 3
    images, _ = train[torch.tensor([0, 4])]  # a/b/c/deep.bmp (i=2) and z/two.webp (i=3): colours survive
    assert images[0, :, 4, 4].tolist() == [40, 5, 9] and images[1, :, 4, 4].tolist() == [60, 5, 9]
    # pretraining crops at decode time, like imagefolder
    crops = train.images.train_crops([(0.2, 1.0), (0.5, 1.0)], seed=0).crops(torch.tensor([1, 2]), epoch=0)
    assert crops.shape == (2, 2, 3, 8, 8) and crops.dtype == torch.uint8


def test_files_that_fail_at_listing_are_bad_files_under_both_rules(tmp_path, capsys):
    """Issue 49: an empty file, a text file named .png and a dangling symlink stop the run under
    data.on_bad_file=error (one line naming them); under skip each is one line, counted against the cap."""
    for i in range(4):
        Image.new("RGB", (10, 12), (20 * i, 5, 9)).save(tmp_path / f"{i}.png")
    (tmp_path / "empty.png").write_bytes(b"")
    (tmp_path / "text.png").write_text("hello")
    (tmp_path / "gone.png").symlink_to(tmp_path / "nowhere.png")
    with pytest.raises(UserError, match=r"3 of 7 image files under .* cannot be read .*data.on_bad_file=error stops "
                                        r"on them.*or set data.on_bad_file=skip"):
        load_dataset(DataConfig(name="images", root=str(tmp_path), image_size=8, on_bad_file="error"), "train")
    train = load_dataset(DataConfig(name="images", root=str(tmp_path), image_size=8), "train")
    err = capsys.readouterr().err
    assert len(train) == 4 and err.count("skipped an unreadable image") == 3
    assert "dangling symlink" in err and "empty: 0 bytes" in err and str(tmp_path / "text.png") in err
    assert sorted(p for p, _ in train.images.listed_bad) == sorted(str(tmp_path / n) for n in
                                                                   ("empty.png", "gone.png", "text.png"))
    log = tmp_path / "bad.jsonl"
    train.images.train_crops([(0.5, 1.0)], seed=0, bad_log=log)
    train.images.train_crops([(0.5, 1.0)], seed=0, bad_log=log)  # a second loader (the next epoch) logs none again
    assert len(log.read_text().splitlines()) == 3
    for i in range(4, 12):  # 11 bad of 15: past the cap of max(10, 0.001 x 15)
        (tmp_path / f"bad{i}.png").write_bytes(b"")
    with pytest.raises(UserError, match="11 of 15 images could not be read"):
        load_dataset(DataConfig(name="images", root=str(tmp_path), image_size=8), "train")


def test_unlabelled_folder_has_no_test_split_and_names_its_mistakes(tmp_path):
    Image.new("RGB", (8, 8)).save(tmp_path / "x.png")
    with pytest.raises(UserError, match="data.name=images has no labels and evaluation needs them"):
        load_dataset(DataConfig(name="images", root=str(tmp_path)), "test")
    with pytest.raises(UserError, match="data.name=images needs data.root"):
        load_dataset(DataConfig(name="images"), "train")
    with pytest.raises(UserError, match="is not a folder"):
        load_dataset(DataConfig(name="images", root=str(tmp_path / "x.png")), "train")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    with raises_user_error(f"no image in {tmp_path / 'empty'} is readable", "all 1 image files fail to open",
                           "broken.png"):  # issue 62: the folder and how many files were tried
        load_dataset(DataConfig(name="images", root=str(tmp_path / "empty")), "train")
