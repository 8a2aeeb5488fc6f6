"""The benchmarks: one module per measurement, run from the repository root as ``python -m benchmarks.NAME``
(``--help`` lists its flags); what they share is in ``benchmarks.harness``. Their JSON goes to
``benchmarks/results/``, and what each result says to ``benchmarks/results/NOTES.md``."""
