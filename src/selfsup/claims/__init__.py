"""The seeds' claims as commands with an honest verdict (``selfsup claims``)."""
