"""``selfsup report RUN [RUN ...]``: each run's pictures drawn first (``runs.pictures.run_pictures``: its test
images' embedding map, nearest neighbours and a ViT's patch picture, in ``RUN/pictures/``), then the report
(``selfsup.report.write_report``), which shows them in its "Embedding" section."""

from __future__ import annotations

import sys
from pathlib import Path

from selfsup.diskspace import DiskFull
from selfsup.errors import UserError
from selfsup.report import write_report
from selfsup.runs.pictures import run_pictures


def report_runs(runs: list[str], out: str | None, pictures: bool = True) -> Path:
    """The report of ``runs`` (in ``out``); with ``pictures``, each run's pictures are drawn first (a run without a
    trained backbone has none; one that cannot be drawn says why in one line and the report goes on; a full disk is
    left to the report's own write, which names its folder)."""
    if pictures and (len(runs) == 1 or out is not None):  # else write_report refuses the command line first
        for run in runs:
            try:
                run_pictures(run)
            except DiskFull:  # the report's own figures are written next, and say it in the command's one line
                break
            except UserError as e:
                print(f"report: no pictures of {run}: {e}", file=sys.stderr)
    return write_report(runs, out)
