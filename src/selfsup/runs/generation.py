"""``selfsup eval generation`` as a function: the samples of a flow run and their quality, with a typed config.

Samples come from :func:`selfsup.flow.sampler.generate` on the run's EMA model (``runs.source.load_flow_run``);
for the metrics they are brought back to the dataset's size and to uint8, then pass through the encoder's own
evaluation transform exactly as the real images do (``flow.metrics``). ``run_generation`` writes
``RUN/eval/generation.json`` and the sample grid and returns the results; the table is the front end's
(``commands.generation``).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from selfsup.errors import UserError
from selfsup.eval.knn import knn_predict_scores, topk_accuracy
from selfsup.eval.report import write_json
from selfsup.eval_configs import GenerationConfig
from selfsup.flow.metrics import (class_fidelity, feature_frechet_distance, image_features, inception_fid,
                                  inception_fid_unavailable)
from selfsup.flow.sampler import check_options, generate, sample_images, sample_labels, save_grid

OWN_FEATURES = ("the run's own EMA features (its exported flow_encoder): the model judges its own samples; "
                "to compare runs, pass every run the same --encoder RUN_OR_FILE")
REPA_NOT_DEFAULT = (" (a REPA run's own alignment encoder is never the default: REPA was trained to match that "
                    "space, which would favour it)")


def _encoder_location(cfg, run_cfg, run_dir) -> tuple[str, str | None]:
    """(the encoder whose features define the metrics, a note when it is the run's own): ``cfg.encoder``, else the
    flow run itself (its EMA model's block-k tokens, as ``selfsup eval`` sees it), for REPA runs too."""
    if cfg.encoder:
        return cfg.encoder, None
    return str(run_dir), OWN_FEATURES + (REPA_NOT_DEFAULT if getattr(run_cfg.method, "encoder", None) else "")


def run_generation(run_dir: str | Path, cfg: GenerationConfig | None = None, *, device: str | None = None,
                   out: str | None = None, cache: bool = True, verbose: bool = False) -> dict:
    """Encoder Fréchet distance, class fidelity (and Inception FID when on disk) of a flow run's samples.

    ``out``: results folder (default RUN/eval); ``cache``: reuse the real images' cached features; ``verbose``:
    progress lines on stdout. The result also holds ``png`` and ``json`` (the files written) and, where Inception FID
    was not computed, ``inception_fid_note`` says why."""
    # a run folder and a session import the methods (Lightning): `from selfsup.runs import GenerationConfig` without
    from selfsup.runs.session import EvalSession
    from selfsup.runs.source import load_flow_run

    cfg = cfg or GenerationConfig()
    say = print if verbose else (lambda *a, **k: None)
    check_options(cfg.steps, cfg.cfg, cfg.sampler, cfg.n)
    if cfg.n < 2:
        raise UserError(f"--n {cfg.n} must be >= 2 for a Fréchet distance")
    if min(cfg.k, cfg.batch_size, cfg.sample_batch) < 1:
        raise UserError("--k, --batch-size and --sample-batch must be >= 1")
    run_dir = Path(run_dir)
    model, run_cfg, info = load_flow_run(run_dir)
    if info["latents"]:
        raise UserError(f"{run_dir} models latents; eval generation needs a pixel-space flow run "
                        "(decode the latents with their VAE and evaluate the images)")
    if cfg.cfg != 1.0 and not model.num_classes:
        raise UserError(f"--cfg {cfg.cfg} needs a class-conditional model; {run_dir} is unconditional (use --cfg 1)")
    data = run_cfg.data
    encoder, own = _encoder_location(cfg, run_cfg, run_dir)
    session = EvalSession(encoder, data=data.name, root=data.root, resize=True, device=device,
                          batch_size=cfg.batch_size, out=out or str(run_dir / "eval"), cache=cache)
    train = session.split("train")
    if train.channels != model.in_channels:
        raise UserError(f"{data.name} images have {train.channels} channel(s) but the flow model makes "
                        f"{model.in_channels}; evaluate the run with an encoder of its own dataset")
    say(f"real features: {data.name} train/test through {session.source.weights}"
        f"{f' ({own})' if own else ''}", flush=True)
    ftr, ytr = session.features("train")
    fte, yte = session.features("test")

    labels = sample_labels(cfg.n, model.num_classes)
    say(f"sampling {cfg.n} images ({cfg.sampler}, {cfg.steps} steps, guidance {cfg.cfg:g}) on {session.device}",
        flush=True)
    t0 = time.perf_counter()
    x = generate(model, labels, cfg.steps, cfg.sampler, cfg.cfg, cfg.seed, session.device, cfg.sample_batch,
                 progress=verbose)
    sample_seconds = time.perf_counter() - t0
    images = sample_images(x, info, train.image_size)
    fgen = image_features(session.source, images, cfg.batch_size, session.device)

    n_ref = min(cfg.n, len(yte))
    ref = torch.randperm(len(yte), generator=torch.Generator().manual_seed(0))[:n_ref]
    res = {**session.header(), "run": str(run_dir), "encoder": str(session.source.weights),
           **({"encoder_note": own} if own else {}),
           "metric": "encoder Fréchet distance (Fréchet distance of encoder features; not FID)",
           "n": cfg.n, "steps": cfg.steps, "sampler": cfg.sampler, "cfg": cfg.cfg, "seed": cfg.seed,
           "sample_seconds": sample_seconds, "real_train_size": len(ytr),
           "encoder_frechet_distance": feature_frechet_distance(fgen, ftr),
           "reference_real_test_frechet_distance": feature_frechet_distance(fte[ref], ftr),
           "reference_test_size": n_ref}
    if model.num_classes:
        k = min(cfg.k, len(ytr))
        fid = class_fidelity(ftr, ytr, fgen, labels, k, 0.07, train.num_classes)
        real = topk_accuracy(knn_predict_scores(ftr, ytr, fte, k, 0.07, train.num_classes), yte)["top1"]
        res.update(class_fidelity=fid["class_fidelity"], class_fidelity_per_class=fid["per_class"], knn_k=k,
                   reference_real_test_knn_top1=real)
    why = "Inception FID skipped (--no-inception)" if not cfg.inception else inception_fid_unavailable()
    if why is None:
        res["inception_fid"] = inception_fid(train.images, images, device=session.device)
    else:
        res["inception_fid"] = None
        res["inception_fid_note"] = why
    grid = save_grid(images[: min(100, len(images))], session.out_dir / "generation-samples.png")
    path = write_json(session.out_dir, "generation", res)
    return {**res, "png": str(grid), "json": str(path)}
