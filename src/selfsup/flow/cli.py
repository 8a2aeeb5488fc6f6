"""``selfsup generate`` and ``selfsup eval generation``: samples of a flow run, and their quality (a front end).

Samples come from :func:`selfsup.flow.sampler.generate` on the run's EMA model (``eval.source.load_flow_run``);
for the metrics they are brought back to the dataset's size and to uint8, then pass through the
encoder's own evaluation transform exactly as the real images do (``flow.metrics``).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from selfsup.errors import UserError
from selfsup.eval.session import FEATURE_BATCH, EvalSession, checked_device
from selfsup.eval.source import load_flow_run
from selfsup.flow.sampler import check_options, generate, sample_images, sample_labels, save_grid, to_uint8


def _save_tensor(blob: dict, path: Path) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(blob, tmp)
    tmp.replace(path)
    return path


# --------------------------------------------------------------------------- selfsup generate


def _load(run_dir: str):
    return load_flow_run(Path(run_dir))


def _stem(out: str | None, run_dir: Path, name: str) -> Path:
    if out is None:
        return run_dir / "samples" / name
    path = Path(out)
    return path.with_suffix("") if path.suffix in (".png", ".pt") else path


def cmd_generate(args) -> int:
    """Sample ``--n`` images of a flow run's EMA model: a PNG grid and a .pt file (samples, labels, settings)."""
    check_options(args.steps, args.cfg, args.sampler, args.n)
    if args.batch_size < 1:
        raise UserError(f"--batch-size {args.batch_size} must be >= 1")
    run_dir = Path(args.run_dir)
    model, cfg, info = _load(args.run_dir)
    if args.cfg != 1.0 and not model.num_classes:
        raise UserError(f"--cfg {args.cfg} needs a class-conditional model; {run_dir} is unconditional (use --cfg 1)")
    labels = sample_labels(args.n, model.num_classes, args.cls)
    device = checked_device(args.device)
    name = (f"samples-n{args.n}-{args.sampler}{args.steps}-cfg{args.cfg:g}"
            f"{'' if args.cls is None else f'-class{args.cls}'}-seed{args.seed}")
    stem = _stem(args.out, run_dir, name)
    print(f"sampling {args.n} images from {run_dir} ({args.sampler}, {args.steps} steps, guidance {args.cfg:g}) "
          f"on {device}", flush=True)
    t0 = time.perf_counter()
    x = generate(model, labels, args.steps, args.sampler, args.cfg, args.seed, device, args.batch_size,
                 progress=args.n > args.batch_size)
    seconds = time.perf_counter() - t0
    stem.parent.mkdir(parents=True, exist_ok=True)
    settings = dict(run=str(run_dir), n=args.n, steps=args.steps, sampler=args.sampler, cfg=args.cfg,
                    cls=args.cls, seed=args.seed, seconds=seconds)
    pt = _save_tensor({"samples": x, "labels": labels, "settings": settings}, stem.with_name(stem.name + ".pt"))
    print(f"  {pt} (samples in [-1, 1], {tuple(x.shape)}; {seconds:.1f} s)")
    if info["latents"]:
        print("  (no PNG: the run models latents; decode the .pt with the VAE that made them)")
    else:
        print(f"  {save_grid(to_uint8(x, info['mean'], info['std']), stem.with_name(stem.name + '.png'))}")
    return 0


def add_generate_parser(subparsers) -> None:
    """``selfsup generate RUN_DIR``."""
    p = subparsers.add_parser("generate", help="sample a flow run: a PNG grid and a .pt tensor file")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a flow run folder (selfsup pretrain with a flow preset)")
    p.add_argument("--n", type=int, default=64, help="number of samples (default 64)")
    p.add_argument("--cfg", type=float, default=1.0, help="classifier-free guidance scale (default 1: none)")
    p.add_argument("--class", dest="cls", type=int, help="draw every sample of this class (default: classes in turn)")
    p.add_argument("--steps", type=int, default=50, help="sampler steps = model evaluations (default 50)")
    p.add_argument("--sampler", default="ode", help="ode (Euler) or sde (Euler-Maruyama, SiT's) (default ode)")
    p.add_argument("--seed", type=int, default=0, help="noise seed (default 0)")
    p.add_argument("--batch-size", type=int, default=256, help="samples per forward (default 256)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument("--out", help="output stem: writes STEM.png and STEM.pt (default RUN/samples/samples-...)")
    p.set_defaults(func=cmd_generate)


# --------------------------------------------------------------------------- selfsup eval generation


OWN_FEATURES = ("the run's own EMA features (its exported flow_encoder): the model judges its own samples; "
                "to compare runs, pass every run the same --encoder RUN_OR_FILE")
REPA_NOT_DEFAULT = (" (a REPA run's own alignment encoder is never the default: REPA was trained to match that "
                    "space, which would favour it)")


def _encoder_location(args, cfg, run_dir) -> tuple[str, str | None]:
    """(the encoder whose features define the metrics, a note when it is the run's own): ``--encoder``, else the
    flow run itself (its EMA model's block-k tokens, as ``selfsup eval`` sees it), for REPA runs too."""
    if args.encoder:
        return args.encoder, None
    return str(run_dir), OWN_FEATURES + (REPA_NOT_DEFAULT if getattr(cfg.method, "encoder", None) else "")


def eval_generation(args) -> int:
    """Encoder Fréchet distance, class fidelity (and Inception FID when on disk) of a flow run's samples."""
    from selfsup.eval.knn import knn_predict_scores, topk_accuracy
    from selfsup.eval.report import print_table, write_json
    from selfsup.flow.metrics import (
        class_fidelity,
        feature_frechet_distance,
        image_features,
        inception_fid,
        inception_fid_unavailable,
    )

    check_options(args.steps, args.cfg, args.sampler, args.n)
    if args.n < 2:
        raise UserError(f"--n {args.n} must be >= 2 for a Fréchet distance")
    if min(args.k, args.batch_size, args.sample_batch) < 1:
        raise UserError("--k, --batch-size and --sample-batch must be >= 1")
    run_dir = Path(args.run_dir)
    model, cfg, info = _load(args.run_dir)
    if info["latents"]:
        raise UserError(f"{run_dir} models latents; eval generation needs a pixel-space flow run "
                        "(decode the latents with their VAE and evaluate the images)")
    if args.cfg != 1.0 and not model.num_classes:
        raise UserError(f"--cfg {args.cfg} needs a class-conditional model; {run_dir} is unconditional (use --cfg 1)")
    data = cfg.data
    encoder, own = _encoder_location(args, cfg, run_dir)
    session = EvalSession(encoder, data=data.name, root=data.root, resize=True, device=args.device,
                      batch_size=args.batch_size, out=args.out or str(run_dir / "eval"), cache=not args.no_cache)
    train = session.split("train")
    if train.channels != model.in_channels:
        raise UserError(f"{data.name} images have {train.channels} channel(s) but the flow model makes "
                        f"{model.in_channels}; evaluate the run with an encoder of its own dataset")
    m = session.source.meta
    print(f"real features: {data.name} train/test through {session.source.weights}"
          f"{f' ({own})' if own else ''}", flush=True)
    ftr, ytr = session.features("train")
    fte, yte = session.features("test")

    labels = sample_labels(args.n, model.num_classes)
    print(f"sampling {args.n} images ({args.sampler}, {args.steps} steps, guidance {args.cfg:g}) on {session.device}",
          flush=True)
    t0 = time.perf_counter()
    x = generate(model, labels, args.steps, args.sampler, args.cfg, args.seed, session.device, args.sample_batch,
                 progress=True)
    sample_seconds = time.perf_counter() - t0
    images = sample_images(x, info, train.image_size)
    fgen = image_features(session.source, images, args.batch_size, session.device)

    n_ref = min(args.n, len(yte))
    ref = torch.randperm(len(yte), generator=torch.Generator().manual_seed(0))[:n_ref]
    out = {**session.header(), "run": str(run_dir), "encoder": str(session.source.weights),
           **({"encoder_note": own} if own else {}),
           "metric": "encoder Fréchet distance (Fréchet distance of encoder features; not FID)",
           "n": args.n, "steps": args.steps, "sampler": args.sampler, "cfg": args.cfg, "seed": args.seed,
           "sample_seconds": sample_seconds, "real_train_size": len(ytr),
           "encoder_frechet_distance": feature_frechet_distance(fgen, ftr),
           "reference_real_test_frechet_distance": feature_frechet_distance(fte[ref], ftr),
           "reference_test_size": n_ref}
    if model.num_classes:
        k = min(args.k, len(ytr))
        fid = class_fidelity(ftr, ytr, fgen, labels, k, 0.07, train.num_classes)
        real = topk_accuracy(knn_predict_scores(ftr, ytr, fte, k, 0.07, train.num_classes), yte)["top1"]
        out.update(class_fidelity=fid["class_fidelity"], class_fidelity_per_class=fid["per_class"], knn_k=k,
                   reference_real_test_knn_top1=real)
    why = "Inception FID skipped (--no-inception)" if args.no_inception else inception_fid_unavailable()
    if why is None:
        out["inception_fid"] = inception_fid(train.images, images, device=session.device)
    else:
        out["inception_fid"] = None
        out["inception_fid_note"] = why
    grid = save_grid(images[: min(100, len(images))], session.out_dir / "generation-samples.png")
    path = write_json(session.out_dir, "generation", out)
    rows = [["encoder Fréchet distance", out["encoder_frechet_distance"],
             out["reference_real_test_frechet_distance"]]]
    if model.num_classes:
        rows.append(["class fidelity %", out["class_fidelity"], out["reference_real_test_knn_top1"]])
    if out["inception_fid"] is not None:
        rows.append(["Inception FID", out["inception_fid"], "-"])
    encoder_name = m["backbone"] + (" (the run's own EMA features)" if own else "")
    print_table(f"generation of {run_dir.name}: {args.n} samples vs {data.name} train ({len(ytr)}), "
                f"encoder {encoder_name}", ["metric", "samples", f"real test ({n_ref})"], rows)
    if why:
        print(why)
    print(f"  {path}\n  {grid}")
    return 0


def add_generation_eval_parser(sub) -> None:
    """``selfsup eval generation RUN_DIR`` (registered by selfsup.eval.cli)."""
    p = sub.add_parser("generation", help="a flow run's samples: encoder Fréchet distance, class fidelity, "
                                          "Inception FID when its weights are on disk")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a flow run folder")
    p.add_argument("--encoder", metavar="RUN_OR_FILE",
                   help="selfsup backbone whose features define the metrics (run folder, .safetensors or .ckpt); "
                        "default: the run's own EMA features (labelled as such; REPA runs too). Comparing runs: give "
                        "every run the same --encoder")
    p.add_argument("--n", type=int, default=1000, help="generated samples, classes in turn (default 1000)")
    p.add_argument("--steps", type=int, default=50, help="sampler steps (default 50)")
    p.add_argument("--sampler", default="ode", help="ode or sde (default ode)")
    p.add_argument("--cfg", type=float, default=1.0, help="classifier-free guidance scale (default 1: none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--k", type=int, default=20, help="neighbours of the class-fidelity kNN classifier (default 20)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument("--batch-size", type=int, default=FEATURE_BATCH,
                   help=f"feature extraction batch (default {FEATURE_BATCH})")
    p.add_argument("--sample-batch", type=int, default=256, help="samples per sampler forward (default 256)")
    p.add_argument("--out", help="folder for the results (default: RUN/eval)")
    p.add_argument("--no-cache", action="store_true", help="extract real features again instead of the cache")
    p.add_argument("--no-inception", action="store_true", help="skip Inception FID even when available")
    p.set_defaults(func=eval_generation)
