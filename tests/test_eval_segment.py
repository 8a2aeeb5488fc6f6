"""``selfsup eval segment``: the generated canvas task (seeded, its labels exact), the mIoU against a hand
computation, the patch labels, the linear and kNN protocols end to end on a tiny source, and a user's folder of
images with masks (each problem one line)."""

import dataclasses
import json

import numpy as np
import pytest
import torch
from PIL import Image

from selfsup.data.canvas import CANVAS_TASKS, CanvasTask, make_canvases, place_item
from selfsup.data.datasets import ImageDataset
from selfsup.data.dense import IGNORE
from selfsup.errors import UserError
from selfsup.eval.segment import SegmentConfig, confusion, knn_segment, linear_segment, miou, patch_labels

from ssl_helpers import assert_user_error, run_cli


def items(n=12, side=6, seed=0):
    """A tiny item set: random uint8 squares (some pixels under the threshold), labels 0..2."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 1, side, side), generator=g, dtype=torch.uint8)
    return ImageDataset("t", images, torch.arange(n) % 3, 3, (0.5,), (0.25,))


def test_a_hand_placed_item_is_labelled_exactly_where_its_foreground_lies_and_a_later_one_covers_it():
    image, mask = torch.zeros(1, 6, 6, dtype=torch.uint8), torch.zeros(6, 6, dtype=torch.uint8)
    first = torch.tensor([[[0, 20, 15], [16, 255, 3], [40, 0, 16]]], dtype=torch.uint8)
    place_item(image, mask, first, 4, top=1, left=2, threshold=16)
    want_mask = torch.zeros(6, 6, dtype=torch.uint8)
    want_mask[1:4, 2:5] = torch.tensor([[0, 4, 0], [4, 4, 0], [4, 0, 4]], dtype=torch.uint8)
    want_image = torch.zeros(6, 6, dtype=torch.uint8)
    want_image[1:4, 2:5] = torch.tensor([[0, 20, 0], [16, 255, 0], [40, 0, 16]], dtype=torch.uint8)
    assert torch.equal(mask, want_mask) and torch.equal(image[0], want_image)
    second = torch.full((1, 2, 2), 100, dtype=torch.uint8)
    second[0, 1, 1] = 0  # under the threshold: what lies below shows through
    place_item(image, mask, second, 7, top=2, left=2, threshold=16)
    want_mask[2:4, 2:4] = torch.tensor([[7, 7], [7, 0]], dtype=torch.uint8)
    want_image[2:4, 2:4] = torch.tensor([[100, 100], [100, 0]], dtype=torch.uint8)
    assert torch.equal(mask, want_mask) and torch.equal(image[0], want_image)


def test_canvases_are_seeded_and_labelled_where_an_item_shows():
    task = CanvasTask("t", size=16, items=3, min_side=4, max_side=9)
    a, b = make_canvases(items(), 20, task, seed=5), make_canvases(items(), 20, task, seed=5)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], make_canvases(items(), 20, task, seed=6)[1])
    images, masks = a
    assert images.shape == (20, 1, 16, 16) and masks.shape == (20, 16, 16)
    assert torch.equal(images[:, 0] > 0, masks > 0)  # every shown pixel is an item's foreground, the rest background
    assert ((images[:, 0] >= 16) | (images[:, 0] == 0)).all() and int(masks.max()) <= 3
    assert 2 <= len(masks.unique()) <= 4


def test_the_shipped_tasks_are_the_documented_ones():
    assert CANVAS_TASKS["digits-canvas"] == CanvasTask("digits", 24, 2, 8, 12, 16, 1000, 200, 0)
    assert CANVAS_TASKS["fmnist-canvas"] == CanvasTask("fashion-mnist", 56, 2, 20, 32, 16, 1000, 200, 0)


def test_miou_against_a_hand_computation():
    target = torch.tensor([[[0, 0, 1, 1], [2, 2, IGNORE, 0]]])
    pred = torch.tensor([[[0, 1, 1, 1], [2, 0, 3, 3]]])
    conf = confusion(pred, target, 5)
    # class 0: TP 1, FP 1 (a 2 predicted 0), FN 2 (a 1 and a 3 predicted) -> 1/4; class 1: TP 2, FP 1 -> 2/3;
    # class 2: TP 1, FN 1 -> 1/2; class 3: FP 1, no label -> 0; class 4: empty union, left out; the ignored pixel
    # (predicted 3) is not counted
    got = miou(conf, ("bg", "a", "b", "c", "d"))
    assert got["iou"] == {"bg": 25.0, "a": pytest.approx(66.667, abs=1e-3), "b": 50.0, "c": 0.0, "d": None}
    assert got["miou"] == pytest.approx(100 * (1 / 4 + 2 / 3 + 1 / 2 + 0) / 4)
    assert got["miou_fg"] == pytest.approx(100 * (2 / 3 + 1 / 2 + 0) / 3)
    assert got["pixel_acc"] == pytest.approx(100 * 4 / 7)


def test_patch_labels_take_the_majority_and_leave_ignored_patches_out():
    m = torch.tensor([[[1, 1, 2, 2], [1, 0, 2, IGNORE], [IGNORE, IGNORE, 3, 0], [IGNORE, IGNORE, 0, 3]]],
                     dtype=torch.uint8)
    assert patch_labels(m, (2, 2), 4).tolist() == [[[1, 2], [IGNORE, 0]]]  # a 0/3 tie goes to the lower class


def oracle(masks, grid=4, classes=4):
    """Features that say each patch's label (one-hot, a little noise): the protocols must read them back."""
    onehot = torch.nn.functional.one_hot(patch_labels(masks, (grid, grid), classes), classes).permute(0, 3, 1, 2)
    noise = torch.randn(len(masks), classes, grid, grid, generator=torch.Generator().manual_seed(0))
    return onehot.float() + 0.01 * noise


def test_both_protocols_read_back_features_that_hold_the_labels():
    task = CanvasTask("t", size=16, items=2, min_side=8, max_side=8, threshold=1)
    src = items(n=30, side=8)
    src.images[:] = 200  # solid squares: each patch of 4 px lies in one item or none at an item's 4-px-aligned place
    (_, mtr), (_, mte) = make_canvases(src, 40, task, 0), make_canvases(src, 10, task, 1)
    cfg = SegmentConfig(epochs=30, batch_size=8, lr=0.05, k=3, max_train_patches=200)
    names = ("bg", "a", "b", "c")
    for protocol in (linear_segment, knn_segment):
        got = protocol(oracle(mtr), mtr, oracle(mte), mte, names, cfg, torch.device("cpu"))
        assert got["miou"] > 60, (protocol.__name__, got)
    noise = torch.randn(40, 4, 4, 4), torch.randn(10, 4, 4, 4)
    random = linear_segment(noise[0], mtr, noise[1], mte, names, cfg, torch.device("cpu"))
    assert random["miou_fg"] < 40
    assert linear_segment(noise[0], mtr, noise[1], mte, names, cfg, torch.device("cpu")) == random  # seeded


# --------------------------------------------------------------------------- end to end on a tiny source


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """An exported random-init vit_nano of the digits preset (8 px, patch 2), outside any run."""
    from selfsup.export import export_backbone
    from selfsup.models.backbones import build_backbone

    path = tmp_path_factory.mktemp("src") / "nano.safetensors"
    kwargs = {"in_chans": 1, "image_size": 8, "patch_size": 2}
    meta = {"backbone": "vit_nano", "kwargs": kwargs, "image_size": 8, "in_chans": 1, "mean": [0.3],
            "std": [0.35], "dataset": "digits", "method": "moco_v3"}
    torch.manual_seed(0)
    export_backbone(build_backbone("vit_nano", **kwargs), path, meta)
    return path


def write_folder(root, n=6, size=8, mask_mode="L"):
    (root / "images").mkdir(parents=True)
    (root / "masks").mkdir()
    rng = np.random.default_rng(0)
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (size, size), dtype=np.uint8)).save(root / "images" / f"{i}.png")
        label = (np.arange(size * size).reshape(size, size) % 3).astype(np.uint8)
        label[0, 0] = IGNORE
        Image.fromarray(label).convert(mask_mode).save(root / "masks" / f"{i}.png")


def test_the_canvas_task_end_to_end_from_the_command_line(source, tmp_path, monkeypatch):
    small = dataclasses.replace(CANVAS_TASKS["digits-canvas"], train=16, test=4)
    monkeypatch.setitem(CANVAS_TASKS, "digits-canvas", small)
    code, out, err = run_cli("eval", "segment", source, "--device", "cpu", "--epochs", "2", "--out", tmp_path)
    assert code == 0, err
    assert "digits-canvas" in out and "linear" in out and "knn" in out
    res = json.loads((tmp_path / "segment.json").read_text())
    assert res["task"] == "digits-canvas" and res["grid"] == [12, 12] and res["train_size"] == 16
    assert res["classes"][0] == "background" and len(res["classes"]) == 11 and res["background_in_miou"]
    assert 0 <= res["linear"]["miou"] <= 100 and 0 <= res["knn"]["miou"] <= 100
    assert res["knn"]["train_patches"] == 16 * 144
    code, out, err = run_cli("eval", "segment", source, "--device", "cpu", "--epochs", "1", "--protocol", "knn",
                             "--train-limit", "5", "--out", tmp_path / "limited")
    res = json.loads((tmp_path / "limited" / "segment.json").read_text())
    assert code == 0 and res["train_size"] == 5 and "linear" not in res and res["knn"]["train_patches"] == 5 * 144


def test_a_folder_with_masks_end_to_end_through_selfsup_evaluate(source, tmp_path):
    import selfsup

    write_folder(tmp_path / "seg")
    res = selfsup.evaluate(source, "segment", task="folder", root=tmp_path / "seg", device="cpu",
                           out=tmp_path / "o", epochs=2, protocols=("knn",))
    assert res["task"] == "folder" and res["classes"] == ["0", "1", "2"] and "linear" not in res
    assert (res["train_size"], res["test_size"]) == (5, 1) and res["grid"] == [4, 4]


def test_folder_problems_are_one_line_each(source, tmp_path):
    def bad(root, *extra):
        code, _, err = run_cli("eval", "segment", source, "--task", "folder", "--device", "cpu", *extra,
                               *(("--root", root) if root else ()))
        return assert_user_error(code, err)

    assert "--task folder needs --root" in bad(None)
    assert "is not a folder" in bad(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    assert "no images/ folder" in bad(tmp_path / "empty")
    write_folder(tmp_path / "missing")
    (tmp_path / "missing" / "masks" / "3.png").unlink()
    assert "3.png is missing (1 of 6 images have no mask)" in bad(tmp_path / "missing")
    write_folder(tmp_path / "rgb", mask_mode="RGB")
    assert "is a RGB image; a mask is a single-channel PNG" in bad(tmp_path / "rgb")
    write_folder(tmp_path / "sized")
    Image.new("L", (5, 8)).save(tmp_path / "sized" / "masks" / "2.png")
    assert "2.png is 5x8 but its image is 8x8" in bad(tmp_path / "sized")
    write_folder(tmp_path / "one", n=1)
    assert "the test split needs one more" in bad(tmp_path / "one")
    assert "--task fmnist-canvas" not in bad(tmp_path / "one")  # (the line names the folder's problem only)


def test_a_run_without_a_canvas_of_its_own_must_name_the_task_and_channels_must_match(monkeypatch):
    from selfsup.runs.evaluate import dense_sets

    with pytest.raises(UserError, match="needs --task"):
        dense_sets(SegmentConfig(), {"dataset": "imagefolder", "in_chans": 3, "image_size": 8})
    monkeypatch.setitem(CANVAS_TASKS, "digits-canvas", dataclasses.replace(CANVAS_TASKS["digits-canvas"], train=2,
                                                                            test=1))
    with pytest.raises(UserError, match="1-channel images but the backbone takes 3"):
        dense_sets(SegmentConfig(task="digits-canvas"), {"in_chans": 3, "image_size": 8, "dataset": "digits"})


def test_a_convnet_and_a_resnet_give_their_last_feature_map_as_patches():
    from selfsup.eval.segment import patch_map
    from selfsup.models.backbones import build_backbone

    x = torch.randn(2, 1, 16, 16)
    cnn = build_backbone("bn_cnn_micro", in_chans=1).eval()
    assert torch.equal(patch_map(cnn, x), cnn.features(x))
    resnet = build_backbone("resnet18", in_chans=1, small_stem=True).eval()
    fmap = patch_map(resnet, x)
    assert fmap.shape == (2, 512, 2, 2)
    assert torch.allclose(fmap.mean((2, 3)), resnet(x), atol=1e-5)  # its pooled feature is the map's mean
    with pytest.raises(UserError, match="gives none"):
        patch_map(torch.nn.Linear(3, 3), x)
