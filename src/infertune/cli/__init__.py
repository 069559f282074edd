"""The `infertune` command: optimize, package, explain, demo, report, compare, env,
export-triton, serve.

    options.py   every verb and its arguments, as one table; the argparse parser built from it
    commands.py  what each verb does, and `main`, which runs the one the command line names
    inputs.py    the model's inputs from --sample, --calibration and --input
"""

from .commands import main

__all__ = ["main"]
