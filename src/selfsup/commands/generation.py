"""``selfsup eval generation RUN_DIR``: the flags → ``GenerationConfig`` → ``runs.generation.run_generation`` →
a table (registered by ``commands.eval``; the flags read the torch-free config, the run is imported when it
runs)."""

from __future__ import annotations

from pathlib import Path

from selfsup.commands.tables import print_table
from selfsup.eval_configs import GenerationConfig


def eval_generation(args) -> int:
    """``selfsup eval generation``: ``runs.generation.run_generation`` with the flags' ``GenerationConfig``, and
    its table."""
    from selfsup.runs.generation import run_generation  # a flow run's model and samples: torch, for this command

    cfg = GenerationConfig(encoder=args.encoder, n=args.n, steps=args.steps, sampler=args.sampler, cfg=args.cfg,
                           seed=args.seed, k=args.k, batch_size=args.batch_size, sample_batch=args.sample_batch,
                           inception=not args.no_inception)
    out = run_generation(args.run_dir, cfg, device=args.device, out=args.out, cache=not args.no_cache, verbose=True)
    rows = [["encoder Fréchet distance", out["encoder_frechet_distance"],
             out["reference_real_test_frechet_distance"]]]
    if "class_fidelity" in out:
        rows.append(["class fidelity %", out["class_fidelity"], out["reference_real_test_knn_top1"]])
    if out["inception_fid"] is not None:
        rows.append(["Inception FID", out["inception_fid"], "-"])
    encoder_name = out["backbone"] + (" (the run's own EMA features)" if "encoder_note" in out else "")
    print_table(f"generation of {Path(out['run']).name}: {cfg.n} samples vs {out['dataset']} train "
                f"({out['real_train_size']}), encoder {encoder_name}",
                ["metric", "samples", f"real test ({out['reference_test_size']})"], rows)
    if "inception_fid_note" in out:
        print(out["inception_fid_note"])
    print(f"  {out['json']}\n  {out['png']}")
    return 0


def add_generation_eval_parser(sub) -> None:
    """``selfsup eval generation RUN_DIR`` (registered by selfsup.commands.eval)."""
    p = sub.add_parser("generation", help="a flow run's samples: encoder Fréchet distance, class fidelity, "
                                          "Inception FID when its weights are on disk")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a flow run folder")
    p.add_argument("--encoder", metavar="RUN_OR_FILE",
                   help="selfsup backbone whose features define the metrics (run folder, .safetensors or .ckpt); "
                        "default: the run's own EMA features (labelled as such; REPA runs too). Comparing runs: give "
                        "every run the same --encoder")
    g = GenerationConfig
    p.add_argument("--n", type=int, default=g.n, help=f"generated samples, classes in turn (default {g.n})")
    p.add_argument("--steps", type=int, default=g.steps, help=f"sampler steps (default {g.steps})")
    p.add_argument("--sampler", default=g.sampler, help=f"ode or sde (default {g.sampler})")
    p.add_argument("--cfg", type=float, default=g.cfg,
                   help=f"classifier-free guidance scale (default {g.cfg:g}: none)")
    p.add_argument("--seed", type=int, default=g.seed)
    p.add_argument("--k", type=int, default=g.k,
                   help=f"neighbours of the class-fidelity kNN classifier (default {g.k})")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda when available)")
    p.add_argument("--batch-size", type=int, default=g.batch_size,
                   help=f"feature extraction batch (default {g.batch_size})")
    p.add_argument("--sample-batch", type=int, default=g.sample_batch,
                   help=f"samples per sampler forward (default {g.sample_batch})")
    p.add_argument("--out", help="folder for the results (default: RUN/eval)")
    p.add_argument("--no-cache", action="store_true", help="extract real features again instead of the cache")
    p.add_argument("--no-inception", action="store_true", help="skip Inception FID even when available")
    p.set_defaults(func=eval_generation)
