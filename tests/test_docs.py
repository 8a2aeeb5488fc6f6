"""The README and the docs pages stay true: every python block parses, every ``selfsup`` command of a shell block parses
with the CLI's own parser (and a pretrain of a shipped preset resolves its overrides into a typed config), every
relative link points at a file, every page is in the site's navigation, every page a module's docstring sends its
reader to names that module back, and the config reference is the one the dataclasses generate today. The shell
blocks' commands a CPU runs in seconds run (``RUNNABLE``, on stand-ins for their placeholders). Every python block
runs: here (as written, or with its training cut to two steps), or in the test named for its page in ``EXECUTED_BY``
(which holds the fixtures it needs); the API reference's modules carry no Sphinx role the site would show raw;
``make docs`` writes no tracked file."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"```([a-z]*)\n(.*?)```", re.S)


def blocks(kind: str):
    for page in PAGES:
        for lang, body in FENCE.findall(page.read_text()):
            if (kind == "python") == (lang == "python"):
                yield page, body


def commands():
    """Each ``selfsup ...`` command of the shell blocks, comments and a synopsis' ``[--flags]`` cut, lines with
    placeholders (``<...>``, ``…``) left out."""
    for page, body in blocks("shell"):
        for line in body.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                part = re.sub(r"\[-[^\]]*\]", "", part).strip()  # a synopsis' [--optional flags]
                if part.startswith("srun "):
                    part = part[len("srun "):]
                if not part.startswith("selfsup ") or "<" in part or "…" in part or "..." in part:
                    continue
                yield page.name, shlex.split(part, comments=True)[1:]


def test_every_python_block_parses():
    found = list(blocks("python"))
    assert len(found) >= 4
    for page, body in found:
        ast.parse(body, filename=str(page))


# pages whose python blocks need a fixture (an image folder, a trained run, a process without selfsup): the test
# that executes each of them
EXECUTED_BY = {"evaluation.md": "test_eval_api.py", "export.md": "test_export.py", "own-loop.md": "test_own_loop.py"}
# pages whose python blocks need what no test machine has (a downloaded checkpoint, a GPU preset over a folder of
# your own): parsed above, their code paths run in the test named (on files the test makes)
NEEDS_FILES = {"pretrained.md": "test_weights.py"}
# the cuts a block's training takes here, to run in seconds on a loaded CPU (the code path is the one written)
SHORTER = {'trainer={"max_epochs": 1}': 'trainer={"max_epochs": 1, "limit_train_batches": 2, "progress_bar": False}'}


@pytest.mark.train
def test_every_python_block_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the run folders they write (runs/...) land here
    done: set[str] = set()
    for page, body in blocks("python"):
        if page.name in EXECUTED_BY:
            test = (ROOT / "tests" / EXECUTED_BY[page.name]).read_text()
            assert f'"{page.name}"' in test or f"/ \"{page.name}\"" in test or page.name in test, \
                f"{page.name}: its python blocks must be executed by tests/{EXECUTED_BY[page.name]}"
            continue
        if body in done:  # the site's home page is the README
            continue
        if page.name in NEEDS_FILES:
            assert (ROOT / "tests" / NEEDS_FILES[page.name]).exists(), page.name
            continue
        code = body
        for written, shorter in SHORTER.items():
            code = code.replace(written, shorter)
        exec(compile(code, str(page), "exec"), {"__name__": f"docs_{page.stem}"})
        done.add(body)
    assert len(done) >= 2


def test_the_reference_shows_no_raw_sphinx_role():
    """mkdocstrings renders Markdown, not reST roles: ``:class:`Run``` showed as ``:class:<code>Run</code>``."""
    modules = re.findall(r"^::: (\S+)", (ROOT / "docs" / "reference.md").read_text(), flags=re.M)
    assert modules
    for module in modules:
        path = ROOT / "src" / (module.replace(".", "/") + ".py")
        path = path if path.exists() else path.with_suffix("") / "__init__.py"
        roles = re.findall(r":(?:class|func|meth|mod|attr|data|obj|exc|ref):`[^`]+`", path.read_text())
        assert not roles, f"{module}: {roles[:3]} render raw in the API reference; write ``name`` instead"


def test_make_docs_needs_only_the_docs_dependencies_and_writes_no_tracked_file():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("\ndocs:"):].split("\n\n")[0]
    assert "$(STAMP)" not in recipe and "$(DOCS_STAMP)" in recipe  # not the torch venv
    assert "config_reference" not in recipe and ">" not in recipe.replace("->", "")  # writes nothing but site/
    deps = (ROOT / "requirements-docs.txt").read_text()
    assert "mkdocs" in deps and "torch" not in deps.replace("no torch", "")


def test_every_selfsup_command_parses():
    from selfsup.commands.main import build_parser
    from selfsup.config import load_run_config, preset_names

    parser, presets, checked = build_parser(), set(preset_names()), 0
    for page, argv in commands():
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{page}: `selfsup {' '.join(argv)}` does not parse")
        if argv[0] == "pretrain" and not args.resume and args.preset in presets:
            load_run_config(args.preset, args.overrides)  # an unknown key or a bad value raises UserError
            checked += 1
    assert checked >= 5


def test_every_relative_link_points_at_a_file():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            assert (page.parent / target).exists(), f"{page.name}: link to {target} points at nothing"


SRC = ROOT / "src" / "selfsup"


def module_names(path: Path) -> tuple[str, str]:
    """The module at ``path``: its dotted name without ``selfsup.`` and its path under src/selfsup
    (``methods.distill``, ``methods/distill.py``)."""
    rel = path.relative_to(SRC)
    parts = rel.with_suffix("").parts[:-1] if rel.name == "__init__.py" else rel.with_suffix("").parts
    return ".".join(parts), rel.as_posix()


def names_module(text: str, path: Path) -> bool:
    """Whether ``text`` names the module at ``path`` as a whole word: by its dotted name (``methods.distill``,
    ``selfsup.methods.distill``) or its path (``methods/distill.py``, ``src/selfsup/methods/distill.py``);
    ``methods.distill_dinov2`` and ``flow/methods/distill.py`` are other modules."""
    dotted, rel = module_names(path)
    return bool(re.search(rf"(?<![\w.])(selfsup\.)?{re.escape(dotted)}(?!\w)", text)
                or re.search(rf"(?<![\w./])(src/)?(selfsup/)?{re.escape(rel)}(?!\w)", text))


def docstring_pages() -> list[tuple[Path, str]]:
    """(module, page) for every ``docs/<page>.md`` named in a module docstring under src/selfsup."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        found += [(path, page) for page in sorted(set(re.findall(r"docs/([\w./-]+?\.md)", doc)))]
    return found


def test_the_reader_of_module_names():
    distill = SRC / "methods" / "distill.py"
    assert module_names(distill) == ("methods.distill", "methods/distill.py")
    assert module_names(SRC / "runs" / "__init__.py") == ("runs", "runs/__init__.py")
    assert names_module("`Distill` (`src/selfsup/methods/distill.py:12`)", distill)
    assert names_module("see selfsup.methods.distill.Distill", distill)
    assert not names_module("`methods/distill_dinov2.py` and methods.distill_dinov2", distill)
    assert not names_module("`flow/methods/distill.py`", distill)


def test_every_page_a_module_docstring_names_exists_and_names_the_module():
    """A module's docstring that sends the reader to ``docs/<page>.md`` names a page that exists and names the
    module back (``names_module``): methods/distill.py once sent its reader to the multi-crop page."""
    pairs = docstring_pages()
    assert len(pairs) >= 8  # the docstrings were read
    for path, page in pairs:
        rel = path.relative_to(SRC).as_posix()
        assert (ROOT / "docs" / page).exists(), f"{rel} names docs/{page}, which does not exist"
        assert names_module((ROOT / "docs" / page).read_text(), path), \
            f"docs/{page} does not name {rel} (as {' or '.join(module_names(path))}); its docstring sends readers there"


def test_every_docs_page_is_in_the_site_navigation():
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]

    def pages(node):
        if isinstance(node, str):
            yield node
        elif isinstance(node, dict):
            for v in node.values():
                yield from pages(v)
        elif isinstance(node, list):
            for v in node:
                yield from pages(v)

    listed = set(pages(nav))
    on_disk = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert on_disk == listed, f"not in mkdocs.yml nav: {sorted(on_disk - listed)}; missing: {sorted(listed - on_disk)}"


def test_the_config_reference_is_fresh():
    from selfsup.config_reference import render

    assert (ROOT / "docs" / "config.md").read_text() == render(), \
        "docs/config.md is stale: python -m selfsup.config_reference > docs/config.md"


def test_every_registered_method_has_its_fresh_api_page():
    """docs/api/<name>.md for each registered method (its docstring and Config, rendered by mkdocstrings), as the
    generator writes it today, and no page of a method that is not registered."""
    from selfsup.config_reference import method_page, preset_keys
    from selfsup.methods import METHODS

    pages, used = {p.stem: p.read_text() for p in (ROOT / "docs" / "api").glob("*.md")}, preset_keys()
    assert set(pages) == set(METHODS), "python -m selfsup.config_reference --api docs/api (and list it in mkdocs.yml)"
    for name in METHODS:
        assert pages[name] == method_page(name, used), \
            f"docs/api/{name}.md is stale: python -m selfsup.config_reference --api docs/api"


def test_the_config_reference_names_every_key_its_type_default_and_presets():
    from selfsup.config_reference import field_comments, render
    from selfsup.methods.dinov2 import DINOv2Config

    page = render()
    assert "| `method.koleo_loss_weight` | `float` | `0.1` | dino.koleo_loss_weight |" in page  # DINOv2's own
    row = next(line for line in page.splitlines() if line.startswith("| `optim.lr_scaling`"))
    assert "sqrt_1024" in row and "dinov2-digits" in row
    assert field_comments(DINOv2Config)["epoch_length"].startswith("OFFICIAL_EPOCH_LENGTH")


def site_home(readme: str) -> str:
    """The site's home page: the README with its links made relative to docs/ (CONTRIBUTING.md is outside)."""
    text = readme.replace("](docs/", "](")
    text = text.replace("[development](development.md), [CONTRIBUTING](CONTRIBUTING.md)",
                        "[development](development.md) (and CONTRIBUTING.md in the repository)")
    return text.replace("\nThe site: `make docs` builds it with MkDocs into `site/` (`mkdocs.yml`; a venv of "
                        "`requirements-docs.txt` only).\n", "\n")


def test_the_site_home_is_the_readme():
    assert (ROOT / "docs" / "index.md").read_text() == site_home((ROOT / "README.md").read_text()), \
        "docs/index.md is stale: it is the README with links relative to docs/ (tests/test_docs.py site_home)"


def test_the_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert readme.index("make demo") < readme.index("## ") and "make test" in readme.split("## ")[0]


def test_the_family_pages_rows_are_the_methods_pages():
    """Each family page copies its methods' rows (the loss table, the 5-epoch table) from docs/methods.md: a row
    that changed there must change here."""
    methods = set((ROOT / "docs" / "methods.md").read_text().splitlines())
    for name in ("joint-embedding", "distillation", "clustering", "masked"):
        rows = [line for line in (ROOT / "docs" / f"{name}.md").read_text().splitlines()
                if line.startswith("| ") and not line.startswith(("| method |", "| preset |"))]
        assert rows, name
        assert [r for r in rows if r not in methods] == [], f"docs/{name}.md has rows methods.md does not"


# the shell blocks' placeholders, stood for by what the test makes: a labelled image folder, the run trained from
# it, a scratch folder; commands on other placeholders (a downloaded checkpoint, an ImageNet folder, a GPU preset, a
# flow run, Fashion-MNIST) are parsed only (test_every_selfsup_command_parses)
RUNNABLE = ("presets", "claims list", "data check", "pretrain simclr data.root=", "eval knn", "eval rankme",
            "eval all", "eval linear")
CUT = {"pretrain": ["trainer.max_steps=2", "trainer.progress_bar=false", "eval.knn_every_n_steps=0"],
       "eval linear": ["--epochs", "1"]}


@pytest.mark.spawn  # the recipe's data.num_workers starts a loader worker
def test_every_quick_shell_command_runs(tmp_path, monkeypatch, capsys):
    """The shell blocks' commands a CPU runs in seconds, run as written on stand-ins for their placeholders (the
    training cut to 2 steps and the probes to 1 epoch): the README's own-images pair first, then the evaluations of
    the run it made."""
    import numpy as np
    from PIL import Image

    from selfsup.commands.main import main

    monkeypatch.chdir(tmp_path)
    g = np.random.default_rng(0)
    folder = tmp_path / "my_images"
    for split, n in (("train", 24), ("val", 8)):
        for i in range(n):
            (folder / split / "ab"[i % 2]).mkdir(parents=True, exist_ok=True)
            Image.fromarray(g.integers(0, 256, (30, 34, 3), dtype=np.uint8)).save(folder / split / "ab"[i % 2] /
                                                                                   f"{i}.png")
    stand_in = {"/data/my_images": str(folder)}
    ran: list[str] = []
    for _, argv in sorted(commands(), key=lambda c: c[1][0] != "pretrain"):  # the run first, then what reads it
        line = " ".join(argv)
        other_file = argv[0] == "eval" and argv[2] not in ("RUN", "RUN_OR_CKPT")  # a checkpoint of one's own
        if not line.startswith(RUNNABLE) or line in ran or other_file:
            continue
        if "RUN_OR_CKPT" in argv or "RUN" in argv:
            runs = sorted((tmp_path / "runs").glob("*/backbone.safetensors"))
            assert runs, f"`selfsup {line}`: no run made by a pretrain block to evaluate"
            stand_in.update({"RUN_OR_CKPT": str(runs[0].parent), "RUN": str(runs[0].parent)})
        args = [stand_in.get(a, a.replace("/data/my_images", str(folder))) for a in argv]
        args += next((cut for key, cut in CUT.items() if line.startswith(key)), [])
        assert main(args) == 0, f"`selfsup {line}` failed: {capsys.readouterr().err[-500:]}"
        ran.append(line)
    capsys.readouterr()
    assert {"presets", "claims list", "data check /data/my_images", "pretrain simclr data.root=/data/my_images",
            "eval knn RUN_OR_CKPT"} <= set(ran), ran
