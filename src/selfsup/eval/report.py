"""Results: one JSON file per evaluation in the eval folder (the table on stdout is the front end's:
``commands.tables.print_table``)."""

from __future__ import annotations

import json
from pathlib import Path

from selfsup.diskspace import write_text


def write_json(out_dir: Path, name: str, data: dict) -> Path:
    """``out_dir/name.json`` (indented), written atomically."""
    return write_text(out_dir / f"{name}.json", json.dumps(data, indent=2), "the results")
