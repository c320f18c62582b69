"""celery-fence benchmarks (issue 7): ``make bench`` or ``python -m benchmarks [--quick] [--only NAME]``.

Each comparison is one module; ``__main__`` runs them one after another (never concurrently: this machine has
2 cores), writes ``benchmarks/results.json`` and the table in ``docs/performance.md``, and prints a summary.
"""
