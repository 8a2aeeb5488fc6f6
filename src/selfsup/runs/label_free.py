"""The label-free measures of a finished run, trained against its start (``runs.finish``'s end-of-run report; the
verdict is ``runs.learning.label_free_verdict``): on at most ``LABEL_FREE_IMAGES`` held-out images (the test split, or
where there is none, an unlabelled folder included, the seeded share of train/ the kNN holds out: ``HELD_OUT``),

- two augmented views of each image drawn with the run's own global crops (its view plan's first two branches; a
  one-branch recipe's branch twice), the same draws for both backbones (seed ``trainer.seed``);
- their nearest-neighbour agreement, alignment and uniformity (``eval.label_free``);
- RankMe and the effective rank (99% variance) of the plain (evaluation-transform) features (``eval.spectrum``).

Written to ``label_free.json`` (``labels`` names what each key holds, as ``knn.json``) and run.json's
``label_free``."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn

from selfsup.data.datasets import HELD_OUT, UNLABELLED, ImageDataset, StreamDataset, has_test_split, load_dataset
from selfsup.data.views import EvalTransform, MultiViewAugment, build_view_plan
from selfsup.diskspace import write_text
from selfsup.eval.label_free import alignment, nn_agreement, view_uniformity
from selfsup.eval.spectrum import effective_rank, rankme
from selfsup.eval.splits import val_split
from selfsup.runs.facts import mark_run, start_label
from selfsup.runs.learning import label_free_verdict, label_free_words

LABEL_FREE_IMAGES = 1000  # held-out images measured at most: a seeded subset of a larger split


def held_out_images(cfg, train) -> tuple[ImageDataset | None, str]:
    """The images the measures are taken on, and where they come from in words; None and why where there are none
    to take (streamed shards have no random access)."""
    if isinstance(train, StreamDataset):
        return None, "no label-free report: streamed shards hold no held-out images (selfsup eval on a folder)"
    if cfg.data.name not in UNLABELLED and has_test_split(cfg.data):
        test = load_dataset(cfg.data, "test")
        pick = test.subset(LABEL_FREE_IMAGES, seed=cfg.trainer.seed)
        return pick, f"{len(pick)} {cfg.data.name} test images"
    _, val = val_split(len(train), HELD_OUT, cfg.trainer.seed)
    if len(val) == 0:
        return None, f"no label-free report: the {len(train)} training images leave none to hold out"
    if len(val) > LABEL_FREE_IMAGES:
        val = val[torch.randperm(len(val), generator=torch.Generator().manual_seed(cfg.trainer.seed))]
        val = val[:LABEL_FREE_IMAGES].sort().values
    where = cfg.data.root or cfg.data.name
    return train.select(val), (f"{len(val)} images of {where} ({HELD_OUT:.0%} of train/ seeded {cfg.trainer.seed}, "
                               "seen in training: no test split)")


def view_pair(cfg, image_size: int, mean, std) -> MultiViewAugment:
    """The run's own global crops, two views: its view plan's first two branches (a one-branch recipe's twice)."""
    plan = build_view_plan(cfg.augment, cfg.method_cls.recipe, image_size)
    branches = [g.augment for g in plan[:2] if g.size == image_size and g.count == 1]
    return MultiViewAugment((branches * 2)[:2], image_size, mean, std)


@torch.no_grad()
def measures(backbone: nn.Module, images: Tensor, augment: MultiViewAugment, seed: int, batch_size: int,
             device: torch.device) -> dict:
    """The measures of ``backbone`` (eval mode) on uint8 ``images``: each batch's two views drawn from a generator
    seeded by (``seed``, the batch's index), so any backbone sees the same views."""
    was_training = backbone.training
    backbone.eval().to(device)
    plain = EvalTransform(augment.image_size, augment.mean.flatten().tolist(), augment.std.flatten().tolist())
    f1, f2, f0 = [], [], []
    try:
        for i, start in enumerate(range(0, len(images), batch_size)):
            x = images[start:start + batch_size].to(device)
            v1, v2 = augment.to(device)(x, torch.Generator(device).manual_seed(seed * 100003 + i))
            for out, v in ((f1, v1), (f2, v2), (f0, plain.to(device)(x))):
                out.append(backbone(v).float().cpu())
    finally:
        backbone.train(was_training)
    z1, z2, z0 = torch.cat(f1), torch.cat(f2), torch.cat(f0)
    return {"nn_agreement": 100 * nn_agreement(z1, z2), "alignment": alignment(z1, z2),
            "uniformity": view_uniformity(z1, z2), "rankme": rankme(z0), "effective_rank_99": effective_rank(z0)}


def label_free_scores(backbone: nn.Module, init_backbone: nn.Module, cfg, image_size: int, mean, std, train,
                      run_dir: Path, device: torch.device | None = None) -> dict | str:
    """The measures of the trained and of the starting backbone, as written to ``label_free.json``; or the line
    saying why there are none."""
    images, where = held_out_images(cfg, train)
    if images is None:
        return where
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    augment = view_pair(cfg, image_size, mean, std)
    x = images.images if isinstance(images.images, Tensor) else images.images[torch.arange(len(images))]
    seed, batch = cfg.trainer.seed, cfg.eval.batch_size
    out = {"images": len(images), "scored_on": where, "seed": seed,
           "views": f"the run's global crops (augment.recipe={cfg.augment.recipe or cfg.method_cls.recipe})",
           "labels": {"pretrained": "pretrained", "random_init": start_label(run_dir, "random_init")}}
    for key, model in (("pretrained", backbone), ("random_init", init_backbone)):
        out[key] = measures(model, x, augment, seed, batch, device)
    verdict, why = label_free_verdict(out)
    out["verdict"], out["why"] = verdict, why
    return out


def label_free_report(backbone: nn.Module, init_backbone: nn.Module, cfg, info, train, run_dir,
                      knn_verdict: str | None = None) -> list[str]:
    """:func:`label_free_scores` written to ``run_dir/label_free.json`` and run.json's ``label_free``; the lines
    printed (``knn_verdict``, where the run has one, said beside it)."""
    out = label_free_scores(backbone, init_backbone, cfg, info.image_size, info.mean, info.std, train, run_dir)
    if isinstance(out, str):
        return [out]
    write_text(Path(run_dir) / "label_free.json", json.dumps(out, indent=2), "the label-free measures")
    mark_run(Path(run_dir), label_free={"verdict": out["verdict"], "why": out["why"]})
    return label_free_words(out, knn_verdict)
