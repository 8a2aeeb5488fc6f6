"""The ``selfsup`` command line: presets, pretrain, report; generate (``commands.generate``), eval
(``commands.eval``), simulate (``commands.simulate``), claims (``commands.claims``); embed and export
(``commands.outputs``)."""

from __future__ import annotations

import argparse
import sys

import yaml

from selfsup import __version__
from selfsup.diskspace import DiskFull, is_disk_full
from selfsup.errors import UserError, clean_message


def cmd_presets(args) -> int:
    """One line per shipped recipe."""
    from selfsup.config import PRESET_DIR, preset_names

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, where built: 74 presets read 7x faster
    for name in preset_names():
        summary = (yaml.load((PRESET_DIR / f"{name}.yaml").read_text(), Loader=loader) or {}).get("summary", "")
        print(f"{name:<28} {summary}")
    return 0


def cmd_pretrain(args) -> int:
    """Pretrain a preset or YAML with overrides, or continue a run with --resume (extend it with
    trainer.max_epochs=N or trainer.max_steps=N): ``selfsup.pretrain``, by the rules of ``runs.resume``."""
    from selfsup import api  # the engine and Lightning: imported by the commands that train

    if args.resume:
        preset = args.preset if args.preset and "=" not in args.preset else None
        items = ([args.preset] if args.preset and preset is None else []) + args.overrides
        api.pretrain(preset, items, resume=args.resume, callbacks=args.callbacks)
        return 0
    if not args.preset:
        raise UserError("selfsup pretrain needs a preset name or YAML file (see `selfsup presets`), "
                        "or --resume RUN_DIR")
    api.pretrain(args.preset, args.overrides, callbacks=args.callbacks)
    return 0


def cmd_report(args) -> int:
    """Plots, markdown and one self-contained HTML page of a run's dynamics (or several runs overlaid)."""
    from selfsup.commands.report import report_runs  # the report's event reader imports Lightning; pictures, torch

    out = report_runs(args.runs, args.out, pictures=not args.no_pictures)
    print(f"report: {out / 'report.html'}")
    return 0


def version_parser() -> argparse.ArgumentParser:
    """The command without its subcommands: ``selfsup --version`` is answered by it alone."""
    parser = argparse.ArgumentParser(prog="selfsup", description="Self-supervised visual representation learning.")
    parser.add_argument("--version", action="version", version=f"selfsup {__version__}")
    return parser


# the command families, in `selfsup --help`'s order: their line there. A family's module (commands.<name>) is imported
# only when its command is run or asked for (`selfsup generate --help`): several import torch or the engine, so
# `--help` and `presets` stay light (`selfsup eval --help` is light too: its flags read selfsup.eval_configs)
FAMILIES = {
    "generate": "sample a flow run: a PNG grid and a .pt tensor file",
    "eval": "evaluate a pretrained backbone: knn, linear, finetune, rankme, norms-ood, all; a flow run's samples: "
            "generation",
    "simulate": "theory simulators: byol-dynamics (DirectPred paper), norm-convergence (embedding norms paper)",
    "claims": "the seeds' claims: list, run with a verdict, re-judge, or write docs/CLAIMS.md",
    "data": "look at a dataset before training (selfsup data check ROOT) or prepare it (selfsup data shards SRC OUT)",
    "embed": "features of every image of a folder or tar shards: selfsup embed SOURCE FOLDER_OR_SHARDS --out "
             "FILE.parquet|.safetensors|.npy",
    "export": "a backbone as ONNX or TorchScript: selfsup export SOURCE --format onnx|torchscript",
}


def add_family(name: str, p: argparse.ArgumentParser) -> None:
    """The flags and subcommands of the command family ``name`` on its parser ``p`` (its module imported now)."""
    if name == "generate":
        from selfsup.commands.generate import add_generate_parser as add
    elif name == "eval":
        from selfsup.commands.eval import add_eval_parser as add
    elif name == "simulate":
        from selfsup.commands.simulate import add_simulate_parser as add
    elif name == "claims":
        from selfsup.commands.claims import add_claims_parser as add
    elif name in ("embed", "export"):
        from selfsup.commands import outputs

        add = getattr(outputs, f"add_{name}_parser")
    else:
        from selfsup.commands.data import add_data_parser as add
    add(p)


def build_parser(only: tuple[str, ...] | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``only``, the command families outside it have their line in ``--help`` and
    no flags (``main`` builds the family it runs)."""
    parser = version_parser()
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("presets", help="list the shipped recipes")
    p.set_defaults(func=cmd_presets)
    p = sub.add_parser("pretrain", help="pretrain a backbone: selfsup pretrain PRESET_OR_YAML [dotted.key=value ...]")
    p.add_argument("preset", nargs="?", help="preset name (selfsup presets) or a YAML file")
    p.add_argument("overrides", nargs="*", help="config overrides, e.g. trainer.max_epochs=5 data.root=/data")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue the run in RUN_DIR from its last checkpoint (trainer.max_epochs=N or "
                        "trainer.max_steps=N extend it)")
    p.set_defaults(func=cmd_pretrain, callbacks=())
    p = sub.add_parser("report",
                       help="plots + HTML of a run's training dynamics: selfsup report RUN [RUN ...] [--out DIR]")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folder(s); several are overlaid (needs --out)")
    p.add_argument("--out", metavar="DIR", help="output folder (default RUN_DIR/report for one run)")
    p.add_argument("--no-pictures", action="store_true",
                   help="skip the embedding's pictures (drawn once per trained backbone into RUN_DIR/pictures)")
    p.set_defaults(func=cmd_report)
    for name, line in FAMILIES.items():
        p = sub.add_parser(name, help=line)
        if only is None or name in only:
            add_family(name, p)
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


def main(argv: list[str] | None = None, *, callbacks=()) -> int:
    """Entry point: user mistakes print one line on stderr and exit 2. ``callbacks``: Lightning callbacks for a
    ``pretrain``'s Trainer, from a program that runs the command line in its own process (``selfsup.pretrain``)."""
    if (sys.argv[1:] if argv is None else list(argv))[:1] == ["--version"]:
        version_parser().parse_args(["--version"])  # prints it and exits, before the subcommands are imported
    streams, screen = (sys.stdout, sys.stderr), {"at_start": True}
    sys.stdout, sys.stderr = LineStart(sys.stdout, screen), LineStart(sys.stderr, screen)
    try:
        return _main(argv, tuple(callbacks))
    finally:
        sys.stdout, sys.stderr = streams


def _main(argv: list[str] | None = None, callbacks: tuple = ()) -> int:
    words = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(only=tuple(words[:1]))  # the command is the first word: the one family built
    args, extra = parser.parse_known_args(words)
    if callbacks:  # a pretrain's (its parser's default: none)
        args.callbacks = callbacks
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
        signum = getattr(e, "signum", None)  # runs.facts.RunInterrupted: the checkpoint is written, the command printed
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
