"""``selfsup simulate NAME [options] --out DIR``: run a theory simulator, write JSON + PNG, print tables.

Every mistake (unknown simulator, an option out of its domain or of the wrong form) is one line, exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from selfsup.simulate import byol_dynamics as bd, norm_convergence as nc
from selfsup.simulate.byol_dynamics import ByolDynamicsConfig
from selfsup.simulate.norm_convergence import NormConvergenceConfig


SIMULATORS = ("byol-dynamics", "norm-convergence")


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None


def _one_line_error(parser: argparse.ArgumentParser):
    def error(message: str):
        parser.exit(2, f"selfsup: error: {parser.prog}: {message}\n")
    return error


def _checks_table(rows: list[dict]) -> list[str]:
    width = max(len(r["claim"]) for r in rows)
    lines = [f"{'the paper says':<{width}}  {'this run':<9}  measured"]
    for r in rows:
        lines.append(f"{r['claim']:<{width}}  {'confirmed' if r['confirmed'] else 'NOT seen':<9}  {r['measured']}")
    return lines


def _finish(name: str, out: Path, result: dict, rows: list[dict], table: list[str], plot) -> int:
    out.mkdir(parents=True, exist_ok=True)
    stem = name.replace("-", "_")
    result["checks"] = rows
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    plot(out / f"{stem}.png")
    print("\n".join(table))
    print()
    print("\n".join(_checks_table(rows)))
    print(f"\nconfirmed {sum(r['confirmed'] for r in rows)} of {len(rows)}; wrote {out / (stem + '.json')} and "
          f"{out / (stem + '.png')}")
    return 0


def _progress(start: float):
    return lambda message: print(f"[{time.perf_counter() - start:6.1f}s] {message}", file=sys.stderr, flush=True)


def cmd_norm_convergence(args) -> int:
    cfg = nc.NormConvergenceConfig(n_pairs=args.n_pairs, dim=args.dim, lr=args.lr, tol=args.tol, norms=args.norms,
                                   gammas=args.gammas, angles_deg=args.angles, max_steps=args.max_steps,
                                   patience=args.patience, seed=args.seed)
    result = nc.run(cfg, progress=_progress(time.perf_counter()))
    return _finish(args.name, Path(args.out or "simulations/norm-convergence"), result, nc.checks(result),
                   nc.table(result), lambda path: nc.plot(result, path))


def cmd_byol_dynamics(args) -> int:
    cfg = bd.ByolDynamicsConfig(alpha_p=args.alpha_p, sigma2=args.sigma2, eta=args.eta, beta=args.beta,
                                t_end=args.t_end, seed=args.seed)
    result = bd.run(cfg, progress=_progress(time.perf_counter()))
    return _finish(args.name, Path(args.out or "simulations/byol-dynamics"), result, bd.checks(result, cfg),
                   bd.table(result), lambda path: bd.plot(result, cfg, path))


def add_simulate_parser(p) -> None:
    """``selfsup simulate byol-dynamics | norm-convergence``: ``p`` is its parser, made by ``commands.main``."""
    p.error = _one_line_error(p)
    names = p.add_subparsers(dest="name", metavar="NAME", required=True)

    nc, d = names.add_parser("norm-convergence", help="steps to converge by initial embedding norm"), \
        NormConvergenceConfig()
    nc.error = _one_line_error(nc)
    nc.add_argument("--n-pairs", type=int, default=d.n_pairs)
    nc.add_argument("--dim", type=int, default=d.dim)
    nc.add_argument("--lr", type=float, default=d.lr)
    nc.add_argument("--tol", type=float, default=d.tol, help="converged when mean cos >= 1 - tol")
    nc.add_argument("--norms", type=_floats, default=d.norms, help="initial norms, e.g. 0.5,1,2,4")
    nc.add_argument("--gammas", type=_floats, default=d.gammas, help="penalty weights of gamma*||z||")
    nc.add_argument("--angles", type=_floats, default=d.angles_deg, help="initial angles (degrees), unit norm")
    nc.add_argument("--max-steps", type=int, default=d.max_steps)
    nc.add_argument("--patience", type=int, default=d.patience)
    nc.add_argument("--seed", type=int, default=d.seed)
    nc.add_argument("--out", metavar="DIR", help="output folder (default simulations/norm-convergence)")
    nc.set_defaults(func=cmd_norm_convergence)

    bd, d = names.add_parser("byol-dynamics", help="the (p, s, tau) dynamics of BYOL / SimSiam"), ByolDynamicsConfig()
    bd.error = _one_line_error(bd)
    bd.add_argument("--alpha-p", type=float, default=d.alpha_p, help="relative predictor lr")
    bd.add_argument("--sigma2", type=float, default=d.sigma2, help="augmentation variance")
    bd.add_argument("--eta", type=float, default=d.eta, help="weight decay")
    bd.add_argument("--beta", type=float, default=d.beta, help="EMA rate")
    bd.add_argument("--t-end", type=float, default=d.t_end)
    bd.add_argument("--seed", type=int, default=d.seed)
    bd.add_argument("--out", metavar="DIR", help="output folder (default simulations/byol-dynamics)")
    bd.set_defaults(func=cmd_byol_dynamics)


__all__ = ["SIMULATORS", "add_simulate_parser"]
