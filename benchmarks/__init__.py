"""infertune's benchmarks.

The scripts users run sit in this folder and run as `python benchmarks/NAME.py`; harness.py
and bench_models.py are the two libraries they share. The one-off studies sit in studies/
and run from the repository's root as `python -m benchmarks.studies.NAME`. This file makes
the folder a package for those; the scripts themselves do not need it.
"""
