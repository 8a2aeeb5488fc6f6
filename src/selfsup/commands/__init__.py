"""The front end: the ``selfsup`` command line (``main``: the dispatcher) and one module per command family. Each
reads flags into a typed config, calls the application layer (``selfsup.engine``, ``selfsup.runs``,
``selfsup.claims``, ``selfsup.report``, ``selfsup.simulate``) and prints its tables; nothing imports it but
``selfsup.__main__``.

The package's deliberate lazy imports live here: a command imports the layer it runs inside its function, and
``main`` imports a family's module (whose flags take their defaults from configs that import torch) only when its
command runs, so that ``--version``, ``--help`` and ``presets`` load neither torch nor Lightning
(tests/test_house.py holds it, and counts every import inside a function in ``INNER_IMPORTS``)."""
