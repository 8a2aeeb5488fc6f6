"""The reference of every config key, generated from the typed config dataclasses: ``docs/config.md``.

For each section of :class:`selfsup.config.RunConfig` and each method's ``Config``: the key, its type, its default,
its doc comment (the comment on the field's line and the comment lines right above it, as written in the source)
and the presets whose YAML sets it (their own file, not through ``base:``). ``tests/test_docs.py`` fails when the
page is stale; regenerate it with ``python -m selfsup.config_reference > docs/config.md``.

The API reference's page of each registered method, ``docs/api/<name>.md`` (:func:`method_page`: its module's
docstring, its class and its ``Config``, rendered by mkdocstrings), is written by ``python -m selfsup.config_reference
--api docs/api``; the same test fails when one is missing or stale.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import sys
import tokenize
from typing import Any

import yaml

from selfsup.config import DERIVED, PRESET_DIR, RunConfig, load_preset, preset_names
from selfsup.methods import METHODS


def field_comments(cls: type) -> dict[str, str]:
    """``name`` → its doc comment in ``cls``'s source: the trailing ``# …`` of its line, after the comment lines
    directly above it (for a dataclass that inherits, the subclass's own fields only)."""
    source = inspect.getsource(cls)
    lines = source.splitlines()
    trailing: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            trailing[tok.start[0]] = tok.string.lstrip("#").strip()
    names = {f.name for f in dataclasses.fields(cls)}
    out = {}
    for i, line in enumerate(lines, start=1):
        stripped = line.strip()
        name = stripped.split(":", 1)[0].strip()
        if name not in names or not line.startswith("    ") or line.startswith("     ") or ":" not in stripped:
            continue
        above: list[str] = []
        j = i - 1
        while j >= 1 and lines[j - 1].strip().startswith("#"):
            above.insert(0, lines[j - 1].strip().lstrip("#").strip())
            j -= 1
        own = trailing.get(i, "") if "#" in line else ""
        out[name] = " ".join(x for x in (*above, own) if x)
    return out


def preset_keys() -> dict[str, list[str]]:
    """``section.key`` → the presets whose own YAML sets it; a method key ``method.<name>.key`` (by the preset's
    ``method.name``, through its ``base:``)."""
    out: dict[str, list[str]] = {}
    for name in preset_names():
        data = yaml.safe_load((PRESET_DIR / f"{name}.yaml").read_text()) or {}
        method = load_preset(name).get("method", {}).get("name")
        for section, values in data.items():
            if isinstance(values, dict):
                for key in values:
                    where = f"method.{method}.{key}" if section == "method" else f"{section}.{key}"
                    out.setdefault(where, []).append(name)
            elif section not in ("base", "summary"):
                out.setdefault(section, []).append(name)
    return out


def _type(tp: Any) -> str:
    text = tp if isinstance(tp, str) else getattr(tp, "__name__", str(tp))
    return text.replace("typing.", "")


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
    else:
        return "(required)"
    if dataclasses.is_dataclass(value):
        return "(section)"
    return f"`{value!r}`" if not isinstance(value, str) else f"`{value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def section_table(prefix: str, cls: type, used: dict[str, list[str]], parents: tuple[type, ...] = (),
                  lookup: str | None = None) -> list[str]:
    comments: dict[str, str] = {}
    for klass in (*parents, cls):
        comments.update(field_comments(klass))
    rows = ["| key | type | default | what it does | presets that set it |", "|---|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        if f.name in DERIVED or (prefix == "" and f.name in SECTIONS):
            continue
        key = f"{prefix}{f.name}"
        presets = used.get(f"{lookup or prefix}{f.name}", [])
        shown = ", ".join(presets[:6]) + (f" (+{len(presets) - 6})" if len(presets) > 6 else "")
        rows.append(f"| `{key}` | `{_cell(_type(f.type))}` | {_cell(_default(f))} | {_cell(comments.get(f.name, ''))} "
                    f"| {shown} |")
    return rows


SECTIONS = ("method", "data", "augment", "model", "optim", "trainer", "eval", "instruments", "interventions")


def render() -> str:
    """The whole page, Markdown."""
    used = preset_keys()
    lines = ["# Config reference", "",
             "Every key of a run's config, generated from the typed dataclasses by `python -m "
             "selfsup.config_reference > docs/config.md` (a test fails when this page is stale). Set a key in a "
             "preset YAML or on the command line as `section.key=value`; `selfsup presets` lists the presets. "
             "The method section's keys depend on `method.name`.", "", "## Top level", ""]
    lines += section_table("", RunConfig, used)
    sections = {f.name: f for f in dataclasses.fields(RunConfig)}
    for section in SECTIONS[1:]:
        cls = type(sections[section].default_factory())  # type: ignore[misc,operator]
        lines += ["", f"## `{section}`", "", _cell((cls.__doc__ or "").strip().splitlines()[0]), ""]
        lines += section_table(f"{section}.", cls, used)
    lines += ["", "## `method` (by `method.name`)"]
    for name in METHODS:
        lines += ["", f"### `method.name={name}`", "", *method_table(name, used)]
    return "\n".join(lines) + "\n"


def method_table(name: str, used: dict[str, list[str]]) -> list[str]:
    """The first line of the registered method ``name``'s ``Config`` docstring, then its keys' table."""
    cfg: type = getattr(METHODS[name], "Config")
    parents: tuple[type, ...] = tuple(c for c in reversed(cfg.__mro__[1:]) if dataclasses.is_dataclass(c))
    doc = (cfg.__doc__ or "").strip().splitlines()[0] if cfg.__doc__ else ""
    return [_cell(doc), "", *section_table("method.", cfg, used, parents, lookup=f"method.{name}.")]


def method_page(name: str, used: dict[str, list[str]] | None = None) -> str:
    """``docs/api/<name>.md``: the registered method ``name``'s module docstring, its class and its ``Config``,
    rendered by mkdocstrings, then its ``Config``'s keys (type, default, comment, presets) as the config reference
    writes them."""
    cls = METHODS[name]
    config = getattr(cls, "Config")  # every registered method's hyper-parameters (methods.METHODS)
    return "\n".join([
        f"# `method.name={name}`: {cls.__name__}", "",
        "<!-- generated by `python -m selfsup.config_reference --api docs/api` (tests/test_docs.py checks it) -->", "",
        f"::: {cls.__module__}",
        "    options:",
        f"      members: [{cls.__name__}, {config.__name__}]", "",
        f"## Its keys: `method.*` of `{config.__name__}`", "",
        *method_table(name, preset_keys() if used is None else used), ""])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--api"]:
        from pathlib import Path

        folder = Path(sys.argv[2])
        folder.mkdir(parents=True, exist_ok=True)
        used = preset_keys()
        for method in METHODS:
            (folder / f"{method}.md").write_text(method_page(method, used))
    else:
        sys.stdout.write(render())
