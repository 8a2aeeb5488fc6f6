"""How the methods compose (issue "The house, step four"): no class skips its parent's constructor, and a network
that does not train is held one way, a ``methods.frozen.FrozenNetwork``."""

from __future__ import annotations

import ast

from test_layers import PACKAGE


def test_no_class_calls_a_named_classs_constructor():
    """``Base.__init__(self, ...)`` skips whatever the classes between it and the caller set up (DistillDINOv2
    once skipped DINOv2's); a constructor calls ``super().__init__``."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__init__"
                    and not (isinstance(node.func.value, ast.Call) and getattr(node.func.value.func, "id", "") ==
                             "super")):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert found == [], f"named constructors called: {found}"


def test_every_frozen_network_is_a_frozen_network(tmp_path):
    """Distill, DistillDINOv2 and REPA each hold their frozen network as a ``FrozenNetwork`` in
    ``frozen_networks``, never as a child module; no method hides a module from the tree another way."""
    from selfsup.methods.frozen import FrozenNetwork

    for path in sorted((PACKAGE / "methods").glob("*.py")):
        text = path.read_text()
        assert "object.__setattr__" not in text, f"{path.name} hides a module from the tree"
    for name in ("distill.py", "distill_dinov2.py", "flow.py"):
        text = (PACKAGE / "methods" / name).read_text()
        assert "self.frozen_networks.append(" in text, name
    assert FrozenNetwork.__mro__ == (FrozenNetwork, object)  # an object, not a module or a mixin
