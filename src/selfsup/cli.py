"""The ``selfsup`` command line: presets, pretrain, generate (selfsup.flow.cli); eval (selfsup.eval.cli);
simulate (selfsup.simulate.cli)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from selfsup.errors import UserError, clean_message


def cmd_presets(args) -> int:
    """One line per shipped recipe."""
    import yaml

    from selfsup.config import PRESET_DIR, preset_names

    for name in preset_names():
        summary = (yaml.safe_load((PRESET_DIR / f"{name}.yaml").read_text()) or {}).get("summary", "")
        print(f"{name:<28} {summary}")
    return 0


def cmd_pretrain(args) -> int:
    """Pretrain a preset or YAML with overrides, or continue a run with --resume."""
    from selfsup.config import load_run, load_run_config
    from selfsup.engine import pretrain

    if args.resume:
        # the run folder's own config.yaml is used; a preset name given too is ignored
        overrides = ([args.preset] if args.preset and "=" in args.preset else []) + args.overrides
        if overrides:
            raise UserError("--resume continues a run with its own config.yaml; drop the overrides "
                            f"({overrides[0]}) or start a new run")
        cfg = load_run(Path(args.resume))
        pretrain(cfg, resume=Path(args.resume))
        return 0
    if not args.preset:
        raise UserError("selfsup pretrain needs a preset name or YAML file (see `selfsup presets`), "
                        "or --resume RUN_DIR")
    cfg = load_run_config(args.preset, args.overrides)
    pretrain(cfg, preset=args.preset)
    return 0


def cmd_report(args) -> int:
    """Plots, markdown and one self-contained HTML page of a run's dynamics (or several runs overlaid)."""
    from selfsup.report import write_report

    out = write_report(args.runs, args.out)
    print(f"report: {out / 'report.html'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="selfsup", description="Self-supervised visual representation learning.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("presets", help="list the shipped recipes")
    p.set_defaults(func=cmd_presets)
    p = sub.add_parser("pretrain", help="pretrain a backbone: selfsup pretrain PRESET_OR_YAML [dotted.key=value ...]")
    p.add_argument("preset", nargs="?", help="preset name (selfsup presets) or a YAML file")
    p.add_argument("overrides", nargs="*", help="config overrides, e.g. trainer.max_epochs=5 data.root=/data")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    p.set_defaults(func=cmd_pretrain)
    p = sub.add_parser("report",
                       help="plots + HTML of a run's training dynamics: selfsup report RUN [RUN ...] [--out DIR]")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folder(s); several are overlaid (needs --out)")
    p.add_argument("--out", metavar="DIR", help="output folder (default RUN_DIR/report for one run)")
    p.set_defaults(func=cmd_report)
    from selfsup.flow.cli import add_generate_parser

    add_generate_parser(sub)
    from selfsup.eval.cli import add_eval_parser  # a broken import fails loudly, never as "invalid choice: 'eval'"

    add_eval_parser(sub)
    from selfsup.simulate.cli import add_simulate_parser

    add_simulate_parser(sub)
    from selfsup.claims.cli import add_claims_parser

    add_claims_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point: user mistakes print one line on stderr and exit 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except UserError as e:
        print(f"selfsup: error: {clean_message(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", None)  # engine.RunInterrupted: the checkpoint is written, the command printed
        if signum is None:
            print("selfsup: interrupted", file=sys.stderr)
        return 128 + (signum or 2)
    except RuntimeError as e:
        if "Original Traceback" in str(e) and "UserError" in str(e):  # a UserError from a DataLoader worker
            print(f"selfsup: error: {clean_message(e)}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
