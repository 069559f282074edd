"""One-off studies: each measured one question once, and the docs quote its numbers.

Run from the repository's root as `python -m benchmarks.studies.NAME` (each module's
docstring gives its options). They import the benchmarks' libraries as `benchmarks.harness`
and `benchmarks.bench_models`.
"""
