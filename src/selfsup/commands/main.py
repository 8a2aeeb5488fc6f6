"""The ``selfsup`` command line: presets, pretrain, report; generate (``commands.generate``), eval
(``commands.eval``), simulate (``commands.simulate``), claims (``commands.claims``)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml

from selfsup import __version__
from selfsup import api
from selfsup.commands.claims import add_claims_parser
from selfsup.commands.data import add_data_parser
from selfsup.commands.eval import add_eval_parser
from selfsup.commands.generate import add_generate_parser
from selfsup.commands.simulate import add_simulate_parser
from selfsup.config import (PRESET_DIR, flatten, load_run_config, merge, parse_overrides, preset_names, read_run_config,
                            resolve, to_dict)
from selfsup.diskspace import DiskFull, is_disk_full
from selfsup.engine import pretrain, read_run_facts
from selfsup.errors import UserError, clean_message
from selfsup.report import write_report


def cmd_presets(args) -> int:
    """One line per shipped recipe."""
    for name in preset_names():
        summary = (yaml.safe_load((PRESET_DIR / f"{name}.yaml").read_text()) or {}).get("summary", "")
        print(f"{name:<28} {summary}")
    return 0


# what --resume may change: how long the run trains (extending it) and when it writes checkpoints
RESUME_MAY_CHANGE = ("trainer.max_epochs", "trainer.max_steps", "trainer.progress_bar",
                     "trainer.checkpoint_every_n_steps", "trainer.checkpoint_every_n_minutes")


def resume_config(run: Path, preset: str | None, items: list[str]):
    """The config a ``--resume`` continues with: the run's own config.yaml, with only ``RESUME_MAY_CHANGE`` keys
    overridden; a preset or an override that contradicts the run is refused in one line."""
    raw = read_run_config(run)
    current = flatten(to_dict(resolve(raw)))
    if preset is not None:
        given = flatten(to_dict(load_run_config(preset, items)))
        for key, value in given.items():
            if key not in RESUME_MAY_CHANGE and key not in ("output_dir", "name") and current.get(key) != value:
                raise UserError(f"--resume {run} continues the run's own config.yaml, and preset {preset} sets "
                                f"{key}={value} where the run has {current.get(key)}; drop the preset argument")
    cfg = resolve(merge(raw, parse_overrides(items)))
    for key, value in flatten(to_dict(cfg)).items():
        if key not in RESUME_MAY_CHANGE and current.get(key) != value:
            raise UserError(f"--resume {run} continues the run's own config.yaml: {key}={value} contradicts its "
                            f"{key}={current.get(key)}; drop it (only {', '.join(RESUME_MAY_CHANGE[:2])} extend a "
                            "run) or start a new run")
    return cfg, {k: v for k, v in flatten(to_dict(cfg)).items() if current.get(k) != v}


def cmd_pretrain(args) -> int:
    """Pretrain a preset or YAML with overrides, or continue a run with --resume (extend it with
    trainer.max_epochs=N or trainer.max_steps=N)."""
    if args.resume:
        run = Path(args.resume)
        preset = args.preset if args.preset and "=" not in args.preset else None
        items = ([args.preset] if args.preset and preset is None else []) + args.overrides
        cfg, changed = resume_config(run, preset, items)
        facts = read_run_facts(run)
        t = cfg.trainer
        longer = (t.max_steps > int(facts.get("global_step", 0)) if t.max_steps
                  else t.max_epochs > int(facts.get("epochs", 0)))
        # a run.json without status (an earlier version) was written only at the end of a run
        if facts.get("status", "finished" if facts else None) == "finished" and not longer:
            print(f"{run} is finished ({facts.get('global_step')} steps, {facts.get('epochs')} epochs); nothing to "
                  f"train. Extend it with: selfsup pretrain --resume {run} trainer.max_epochs=N (or "
                  "trainer.max_steps=N)")
            return 0
        if changed and os.environ.get("LOCAL_RANK", "0") == "0":
            tmp = run / ".config.yaml.tmp"
            tmp.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
            os.replace(tmp, run / "config.yaml")
        pretrain(cfg, resume=run)
        return 0
    if not args.preset:
        raise UserError("selfsup pretrain needs a preset name or YAML file (see `selfsup presets`), "
                        "or --resume RUN_DIR")
    api.pretrain(args.preset, args.overrides)
    return 0


def cmd_report(args) -> int:
    """Plots, markdown and one self-contained HTML page of a run's dynamics (or several runs overlaid)."""
    out = write_report(args.runs, args.out)
    print(f"report: {out / 'report.html'}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="selfsup", description="Self-supervised visual representation learning.")
    parser.add_argument("--version", action="version", version=f"selfsup {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("presets", help="list the shipped recipes")
    p.set_defaults(func=cmd_presets)
    p = sub.add_parser("pretrain", help="pretrain a backbone: selfsup pretrain PRESET_OR_YAML [dotted.key=value ...]")
    p.add_argument("preset", nargs="?", help="preset name (selfsup presets) or a YAML file")
    p.add_argument("overrides", nargs="*", help="config overrides, e.g. trainer.max_epochs=5 data.root=/data")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue the run in RUN_DIR from its last checkpoint (trainer.max_epochs=N or "
                        "trainer.max_steps=N extend it)")
    p.set_defaults(func=cmd_pretrain)
    p = sub.add_parser("report",
                       help="plots + HTML of a run's training dynamics: selfsup report RUN [RUN ...] [--out DIR]")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folder(s); several are overlaid (needs --out)")
    p.add_argument("--out", metavar="DIR", help="output folder (default RUN_DIR/report for one run)")
    p.set_defaults(func=cmd_report)
    add_generate_parser(sub)
    add_eval_parser(sub)
    add_simulate_parser(sub)
    add_claims_parser(sub)
    add_data_parser(sub)
    return parser


class LineStart:
    """stdout or stderr, noting in ``screen`` (shared by both: a terminal shows them on one screen) whether the last
    text written ended a line. A progress bar's does not (Lightning's writes to stdout, rewriting its line with a
    carriage return), so that an error line can start on a line of its own."""

    def __init__(self, stream, screen: dict):
        self.stream, self.screen = stream, screen

    @property
    def at_start(self) -> bool:
        return self.screen["at_start"]

    def write(self, text: str) -> int:
        if text:
            self.screen["at_start"] = text.endswith("\n")
        return self.stream.write(text)

    def __getattr__(self, name: str):  # flush, isatty, fileno, encoding: the stream's
        return getattr(self.stream, name)


def error_line(message: str, prefix: str = "selfsup: error: ") -> None:
    """``selfsup: error: message`` on stderr, on a clean line (after a progress bar's, a newline first)."""
    clean = not isinstance(sys.stderr, LineStart) or sys.stderr.at_start
    print(("" if clean else "\n") + prefix + message, file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Entry point: user mistakes print one line on stderr and exit 2."""
    streams, screen = (sys.stdout, sys.stderr), {"at_start": True}
    sys.stdout, sys.stderr = LineStart(sys.stdout, screen), LineStart(sys.stderr, screen)
    try:
        return _main(argv)
    finally:
        sys.stdout, sys.stderr = streams


def _main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # `pretrain PRESET --resume RUN key=value`: argparse ends the positionals at the option, so overrides that
    # follow it come back unparsed; they are overrides all the same
    if args.command == "pretrain" and extra and all("=" in a and not a.startswith("-") for a in extra):
        args.overrides = [*args.overrides, *extra]
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return args.func(args) or 0
    except UserError as e:
        error_line(clean_message(e))
        return 2
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", None)  # engine.RunInterrupted: the checkpoint is written, the command printed
        if signum is None:
            error_line("interrupted", prefix="selfsup: ")
        return 128 + (signum or 2)
    except Exception as e:
        if is_disk_full(e):  # a write selfsup does not make itself (a logger's, a command's result file)
            where = getattr(args, "out", None) or getattr(args, "output_dir", None)  # the command's output, if named
            error_line(str(DiskFull.of(e, where)))
            return 2
        if isinstance(e, RuntimeError) and "Original Traceback" in str(e) and "UserError" in str(e):
            error_line(clean_message(e))  # a UserError from a DataLoader worker
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
