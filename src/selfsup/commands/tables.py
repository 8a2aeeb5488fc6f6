"""The tables ``selfsup eval`` prints: a title line and left-aligned columns (torch-free: ``selfsup eval --help``
imports it)."""

from __future__ import annotations


def _cell(v) -> str:
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def print_table(title: str, header: list[str], rows: list[list]) -> None:
    """A title line and left-aligned columns."""
    cells = [header] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(title)
    for r in cells:
        print("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
