"""The entry point of installations made before the front end moved to ``selfsup.commands`` (their ``selfsup``
console script imports ``selfsup.cli:main``; pyproject.toml now names ``selfsup.commands.main:main``)."""

from selfsup.commands.main import main

__all__ = ["main"]
