"""lmforge's own benchmark scenarios (not shipped): ``python -m bench.<scenario>`` from the repository
root writes ``bench/results/<name>.json`` (:mod:`bench.record`), and ``python -m bench.report`` renders
docs/performance.md from those results. The load generator they use, and that ``lmforge bench``
ships, is :mod:`lmforge.bench` (docs/benchmarks.md says which is which)."""
