"""The front end: the ``selfsup`` command line (``main``: the dispatcher) and one module per command family. Each
reads flags into a typed config, calls the application layer (``selfsup.engine``, ``selfsup.runs``,
``selfsup.claims``, ``selfsup.report``, ``selfsup.simulate``) and prints its tables; nothing imports it but
``selfsup.__main__``."""
