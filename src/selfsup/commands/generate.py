"""``selfsup generate``: samples of a flow run (a front end; their quality, ``selfsup eval generation``, is
``commands.generation``).

Samples come from :func:`selfsup.flow.sampler.generate` on the run's EMA model (``runs.source.load_flow_run``).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from selfsup.errors import UserError
from selfsup.flow.sampler import check_options, generate, sample_labels, save_grid, to_uint8


def _save_tensor(blob: dict, path: Path) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(blob, tmp)
    tmp.replace(path)
    return path


# --------------------------------------------------------------------------- selfsup generate


def _load(run_dir: str):
    from selfsup.runs.source import load_flow_run  # a run's model: the methods and Lightning, for this command only

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
    from selfsup.runs.session import checked_device

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


def add_generate_parser(p) -> None:
    """``selfsup generate RUN_DIR``: ``p`` is its parser, made by ``commands.main``."""
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
