"""``selfsup data check ROOT``: the files of an image folder that would stop a run, before the run;
``selfsup data shards SRC OUT``: the folder as webdataset shards re-encoded at a maximum side."""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

from selfsup.data.check import check_folder
from selfsup.data.prepare import write_shards
from selfsup.errors import UserError

MAX_LISTED = 50  # bad files printed (all of them go to --out)


def add_data_parser(p) -> None:
    """``selfsup data check | shards``: ``p`` is its parser, made by ``commands.main``."""
    data = p.add_subparsers(dest="data_command", required=True)
    c = data.add_parser("check", help="decode every image under ROOT in parallel; list unreadable, empty, truncated, "
                                      "over-size (decompression bomb) and too-small files, the colour modes, the "
                                      "files per class folder and the image sizes; exit 2 when a file is bad")
    c.add_argument("root", metavar="ROOT", help="a folder of images (flat, nested, or train/<class>/...)")
    c.add_argument("--min-size", type=int, default=16, help="a shorter side under this many pixels is too small")
    c.add_argument("--workers", type=int, default=None, help="decoding threads (default: one per core)")
    c.add_argument("--out", metavar="JSON", help="also write the whole report, every file named, as JSON")
    c.set_defaults(func=cmd_data_check)
    w = data.add_parser("shards", help="write an image folder as webdataset .tar shards, each image re-encoded at a "
                                       "maximum side (labels from SRC/<class>/ and file names kept; resumable)")
    w.add_argument("src", metavar="SRC", help="an image folder: SRC/<class>/*.jpg (labelled) or images (unlabelled)")
    w.add_argument("out", metavar="OUT", help="the folder of the shards (shard-000000.tar, ...; train with "
                                              "data.name=webdataset data.root=OUT)")
    w.add_argument("--max-side", type=int, default=320, help="longer side of the re-encoded images (default 320)")
    w.add_argument("--quality", type=int, default=90, help="JPEG quality (default 90)")
    w.add_argument("--shard-size", type=int, default=1000, help="images per shard (default 1000)")
    w.add_argument("--channels", type=int, default=3, choices=(1, 3), help="3: RGB (default), 1: grayscale")
    w.add_argument("--format", default="jpg", choices=("jpg", "png"), help="the images' encoding (default jpg)")
    w.add_argument("--workers", type=int, default=None, help="shards written at once (default: one per core)")
    w.add_argument("--labels", default="auto", choices=("auto", "folders", "none"),
                   help="folders: SRC/<class>/ are the classes; none: every image unlabelled; auto (default): folders "
                        "when no image sits directly under SRC, else none")
    w.set_defaults(func=cmd_data_shards)


class Progress:
    """``checked i/n`` on stderr, redrawn at most every 0.2 s on a terminal, once at the end otherwise."""

    def __init__(self):
        self.last, self.tty = 0.0, sys.stderr.isatty()

    def __call__(self, i: int, n: int) -> None:
        now = time.perf_counter()
        if i == n or (self.tty and now - self.last > 0.2):
            self.last = now
            print(f"\rchecked {i}/{n} files", end="\n" if i == n else "", file=sys.stderr, flush=True)


def cmd_data_check(args) -> int:
    root = Path(args.root)
    if not (root.is_dir() or (root.is_file() and root.suffix == ".tar")):
        raise UserError(f"{root} is not a folder or a .tar shard; selfsup data check reads every image file under a "
                        "folder (and the image members of its .tar shards)")
    start = time.perf_counter()
    report = check_folder(root, args.min_size, args.workers, Progress())
    if report.files == 0 and not report.symlink_loops:
        raise UserError(f"no image files under {root} (looked for .jpg, .png, ... and .tar shards at any depth)")
    print(f"{report.files} image files under {root}, each decoded whole in {time.perf_counter() - start:.1f} s")
    if report.n_bad:
        kinds = ", ".join(f"{k} {len(v)}" for k, v in report.bad.items())
        print(f"bad files: {report.n_bad} ({kinds}); remove or replace them before training")
        listed = [r for v in report.bad.values() for r in v][:MAX_LISTED]
        for r in listed:
            name = Path(r.path).relative_to(root) if root.is_dir() and Path(r.path).is_relative_to(root) else r.path
            print(f"  {r.status:<10} {name}  {r.reason}")
        if report.n_bad > len(listed):
            print(f"  ... {report.n_bad - len(listed)} more" + (f" (all in {args.out})" if args.out else ""))
    else:
        print("bad files: none")
    converted = [m for m in report.modes if m not in ("RGB", "L")]
    modes = ", ".join(f"{m} {n}" for m, n in report.modes.items())
    print(f"modes: {modes}" + (f" ({', '.join(converted)} are converted to RGB or L when read)" if converted else ""))
    counts = sorted(report.classes.values())
    if len(report.classes) > 1:
        print(f"class folders: {len(report.classes)}, {counts[0]}-{counts[-1]} files each "
              f"(fewest: {min(report.classes, key=report.classes.get)})")
    if report.empty_folders:
        print(f"folders with no image: {', '.join(report.empty_folders)}")
    if report.symlink_loops:
        print(f"symlink loops (not followed): {'; '.join(report.symlink_loops)}")
    if report.shorter_side:
        s = report.shorter_side
        print(f"shorter side (px): min {s['min']}, 10% {s['p10']:g}, median {s['median']:g}, 90% {s['p90']:g}, "
              f"max {s['max']}")
    if args.out:
        Path(args.out).write_text(json.dumps(asdict(report), indent=2))
    return 2 if report.n_bad or report.symlink_loops else 0


def cmd_data_shards(args) -> int:
    start = time.perf_counter()

    def progress(i: int, n: int) -> None:
        end = "\n" if i == n else ""
        print(f"\rwrote {i}/{n} shards", end=end, file=sys.stderr, flush=True)

    r = write_shards(args.src, args.out, args.max_side, args.quality, args.shard_size, args.channels, args.format,
                     args.workers, progress, labels=args.labels)
    ratio = f"; {r.bytes_out / r.bytes_in:.2f} of the source bytes" if r.bytes_in else ""
    print(f"{r.written} images in {r.shards} shards under {args.out} ({r.shards_skipped} already there), longer side "
          f"at most {args.max_side}, in {time.perf_counter() - start:.1f} s{ratio}; train with "
          f"data.name=webdataset data.root={args.out}")
    print(f"labels: {len(r.classes)} classes, the first-level folders of {args.src} ({', '.join(r.classes[:5])}"
          f"{' ...' if len(r.classes) > 5 else ''}; --labels none keeps them unlabelled)" if r.labels == "folders" else
          f"labels: none, every image unlabelled (--labels folders reads {args.src}/<class>/ as classes)")
    for b in r.skipped:  # every file left out, one line each
        print(f"left out: {b['path']} ({b['reason']})")
    if r.skipped:
        print(f"{len(r.skipped)} unreadable file(s) left out (all in {Path(args.out) / 'skipped.jsonl'})")
    return 0
