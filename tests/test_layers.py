"""The house's layers: every import of the package (top-level and inside functions), read with ``ast``, forms an
acyclic graph, between modules and between packages, and no lower layer imports an upper one
(docs/ARCHITECTURE.md). Plus the method registry's shape."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import selfsup

PACKAGE = Path(selfsup.__file__).parent

# the layers, from the top: the front end (commands; cli is its old entry point), the application (claims, runs,
# engine, report), config, the methods, and below them the lower layers (instruments, eval, flow, export, models,
# data and the one-module ones)
UPPER = ("cli", "commands", "api", "claims", "runs", "engine", "report", "config")
ONE_MODULE = ("choices", "eval_configs", "losses", "schedules", "optim", "distributed", "predictors", "interventions",
              "memory_format", "host", "checkpoints", "diskspace", "step", "architectures", "errors", "layouts")
# what models may import of the one-module layers: the errors, and the backbone table they build (architectures: the
# ViT sizes and the flow encoder's name, declared without torch so that eval_configs and selfsup eval's flags read them)
MODELS_MAY = ("architectures", "errors")
# (importer prefix, forbidden prefixes): a module matches a prefix when it is that module or inside that package
FORBIDDEN = [
    ("cli", ("claims", "runs", "engine", "report", "config")),  # the old entry point: only the front end's main
    ("commands", ("cli",)),
    ("api", ("cli", "commands", "claims", "report")),  # selfsup.pretrain / evaluate: the engine and runs/, as the CLI
    ("config_reference", ("cli", "commands", "api", "claims", "runs", "engine", "report")),  # reads config, methods
    ("claims", ("cli", "commands", "api")),
    ("runs", ("cli", "commands", "api", "claims", "engine", "report")),
    ("engine", ("cli", "commands", "api", "claims", "report")),
    ("report", ("cli", "commands", "claims", "runs", "engine", "methods")),
    ("config", ("cli", "commands", "claims", "runs", "engine", "report", "instruments", "eval", "flow", "export")),
    ("methods", (*UPPER, "instruments", "eval", "flow.sampler", "flow.metrics")),  # flow.path / flow.objective: yes
    ("instruments", (*UPPER, "methods")),
    ("flow", (*UPPER, "methods", "instruments")),
    ("eval", (*UPPER, "methods", "instruments", "flow", "export")),
    ("export", (*UPPER, "methods", "instruments", "flow", "eval")),
    ("weights", (*UPPER, "methods", "instruments", "flow", "eval")),  # model.weights: reads export and models
    ("models", (*UPPER, "methods", "instruments", "flow", "eval", "export", "data", "simulate",
                *(m for m in ONE_MODULE if m not in MODELS_MAY))),
    ("data", (*UPPER, "methods", "instruments", "flow", "eval", "export", "models", "simulate")),
    ("simulate", (*UPPER, "methods", "instruments", "flow", "eval", "export", "models", "data")),
    *((name, (*UPPER, "methods", "instruments", "flow", "eval", "export", "simulate")) for name in ONE_MODULE),
]


def module_names(root: Path = PACKAGE) -> dict[str, Path]:
    """``selfsup.x.y`` → file, for every module of the package (a package is its ``__init__.py``)."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = ("selfsup",) + path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports_of(name: str, source: str, modules) -> set[str]:
    """The package modules that ``source`` (module ``name``) imports anywhere: top level, in functions, relative."""
    package = name if modules[name].name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name`` imports mod
            targets = [f"{origin}.{a.name}" if f"{origin}.{a.name}" in modules else origin for a in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    modules = module_names(root)
    return {name: imports_of(name, path.read_text(), modules) for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle (a list of modules, first = last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def _within(module: str, prefix: str) -> bool:
    full = f"selfsup.{prefix}"
    return module == full or module.startswith(full + ".")


def forbidden_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                  for low, high in FORBIDDEN if _within(a, low) and any(_within(b, h) for h in high))


def test_the_reader_sees_function_level_and_relative_imports():
    modules = {m: Path(f"{m}.py") for m in ("selfsup.models.vit", "selfsup.models.sit", "selfsup.engine",
                                            "selfsup.eval.knn", "selfsup.methods")}
    modules["selfsup.models"] = Path("__init__.py")
    source = ("from .sit import SiT\n"
              "def f():\n    from selfsup.engine import pretrain\n"
              "class A:\n    def g(self):\n        import selfsup.eval.knn\n"
              "        from selfsup import methods\n")
    assert imports_of("selfsup.models.vit", source, modules) == {"selfsup.models.sit", "selfsup.engine",
                                                                 "selfsup.eval.knn", "selfsup.methods"}
    assert imports_of("selfsup.models", "from . import vit\nfrom .vit import X\n", modules) == {"selfsup.models.vit"}
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert forbidden_imports({"selfsup.models.vit": {"selfsup.engine"}, "selfsup.engine": set()}) == [
        "selfsup.models.vit -> selfsup.engine"]


def package_of(module: str) -> str:
    """``selfsup.eval.knn`` → ``eval``; a top-level module is its own package (``selfsup.engine`` → ``engine``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph with each module replaced by its package (arrows inside a package dropped)."""
    out: dict[str, set[str]] = {}
    for a, targets in graph.items():
        out.setdefault(package_of(a), set())
        for b in targets:
            out.setdefault(package_of(b), set())
            if package_of(a) != package_of(b):
                out[package_of(a)].add(package_of(b))
    return out


def test_the_checker_catches_a_planted_package_cycle_and_an_upward_arrow():
    """The control of the two package tests below: an eval module importing a runs module (which imports eval) is a
    package cycle and an upward arrow; a methods module may import flow.path but not flow.sampler."""
    planted = {"selfsup.eval.knn": {"selfsup.runs.session"}, "selfsup.runs.session": {"selfsup.eval.features"},
               "selfsup.eval.features": set(), "selfsup.methods.flow": {"selfsup.flow.path", "selfsup.flow.sampler"},
               "selfsup.flow.path": set(), "selfsup.flow.sampler": set()}
    assert find_cycle(planted) is None  # no module cycle ...
    assert find_cycle(package_graph(planted)) == ["eval", "runs", "eval"]  # ... but a package cycle
    assert forbidden_imports(planted) == ["selfsup.eval.knn -> selfsup.runs.session",
                                          "selfsup.methods.flow -> selfsup.flow.sampler"]


def test_the_package_import_graph_is_acyclic():
    graph = import_graph()
    assert len(graph) > 50 and sum(map(len, graph.values())) > 150  # the whole package was read
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_lower_layer_imports_an_upper_one():
    assert forbidden_imports(import_graph()) == []


def test_the_packages_form_an_acyclic_graph():
    """Packages are the layers: collapsed to their packages the arrows still have no cycle, and every package of
    the source tree is named by a layer rule."""
    graph = package_graph(import_graph())
    cycle = find_cycle(graph)
    assert cycle is None, "package cycle: " + " -> ".join(cycle)
    assert {"commands", "runs", "eval", "flow", "methods", "config", "engine"} <= set(graph)
    ruled = {low for low, _ in FORBIDDEN}
    assert set(graph) - {"selfsup", "__main__"} <= ruled, sorted(set(graph) - ruled)


# --------------------------------------------------------------------------- the registry


def test_the_registry_names_every_method_class_and_asks_the_class():
    import torch

    from selfsup.methods import METHODS, registered_name
    from selfsup.methods.base import SSLMethod
    from selfsup.methods.flow import FlowMatching

    assert set(METHODS) >= {"moco_v3", "byol", "simsiam", "simclr", "flow_matching", "self_flow", "repa"}
    configs = [cls.Config for cls in METHODS.values()]
    assert len(set(configs)) == len(configs)  # registered_name matches the exact Config type: one per method
    for name, cls in METHODS.items():
        assert registered_name(cls.Config()) == name
        assert issubclass(cls, SSLMethod if cls.family == "joint" else FlowMatching)
    state = {"backbone.w": torch.ones(1), "projector.w": torch.zeros(1), "ema.blocks.0.w": torch.full((1,), 2.0),
             "student.blocks.0.w": torch.full((1,), 3.0)}
    assert list(METHODS["moco_v3"].backbone_state(state)) == ["w"]
    flow = METHODS["self_flow"].backbone_state(state)
    assert list(flow) == ["model.blocks.0.w"] and flow["model.blocks.0.w"].item() == 2.0  # the EMA, not the student
    with pytest.raises(KeyError, match="Config of no registered method"):
        registered_name(object())


def test_the_registry_module_has_no_side_effect_import():
    tree = ast.parse((PACKAGE / "methods" / "__init__.py").read_text())
    plain = [n for n in tree.body if isinstance(n, ast.Import)]
    assert plain == []  # only ``from ... import Class`` lines, whose names the METHODS literal uses
    assert not any(isinstance(n, ast.FunctionDef) and n.name == "_register" for n in ast.walk(tree))
