"""Results: one JSON file per evaluation in the eval folder, and a compact table on stdout."""

from __future__ import annotations

import json
from pathlib import Path

from selfsup.diskspace import write_text


def write_json(out_dir: Path, name: str, data: dict) -> Path:
    """``out_dir/name.json`` (indented), written atomically."""
    return write_text(out_dir / f"{name}.json", json.dumps(data, indent=2), "the results")


def _cell(v) -> str:
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def print_table(title: str, header: list[str], rows: list[list]) -> None:
    """A title line and left-aligned columns."""
    cells = [header] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(title)
    for r in cells:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
