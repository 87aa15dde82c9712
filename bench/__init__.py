"""Benchmarks: a registry of measurement functions, a runner that keeps ``bench/results.json``, and the report.

- ``registry``: ``@register_bench("store", ...)`` declares a benchmark (what it measures, how, its goals);
  ``BENCH_MODULES`` lists the modules that register benchmarks: adding one is a one-line change there.
- ``runner.run_benchmarks``: runs them, merges their flat figures into ``bench/results.json`` (figures of
  benchmarks not run this time are kept) and regenerates ``BENCHMARKS.md`` from that file alone.
- ``store``: the first benchmark, shard store throughput next to raw pyarrow IPC.
"""
