"""The child process of isolation.py: rebuilds candidates from their files and runs them.

Protocol: the parent writes one job directory per line on stdin; the child answers on stdout
with `stage <name>` lines as it goes, then `done`, or `error` after writing error.txt. It
says `ready` once its imports are done, and exits at the end of its input. Whatever native
libraries print goes to stderr (the parent's log), never into the protocol.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from functools import reduce
from pathlib import Path


def main() -> None:
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stdout of native code now goes to the log, not into the protocol
    sys.stdout = sys.stderr

    import numpy as np

    from .errors import one_line
    from .inputs import InputSignature
    from .structure import Structure
    from .target import Target

    def say(line: str) -> None:
        protocol.write(line + "\n")

    say("ready")
    for line in sys.stdin:
        job = Path(line.strip())
        try:
            spec = json.loads((job / "job.json").read_text())
            cls = reduce(
                getattr, spec["qualname"].split("."), importlib.import_module(spec["module"])
            )
            target = Target(
                None,
                InputSignature.from_dict(spec["signature"]),
                Structure.from_dict(spec["outputs"]),
                [np.dtype(d) for d in spec["dtypes"]],
                spec["objective"],
            )
            with np.load(job / "inputs.npz") as stored:
                calls = [
                    [stored[f"{i}_{j}"] for j in range(len(target.signature.specs))]
                    for i in range(spec["calls"])
                ]
            say("stage compile")
            backend = cls.load_artifact(job / "artifact", spec["settings"], target)
            for i, inputs in enumerate(calls):
                say("stage first call" if i == 0 else "stage verification")
                backend.run(inputs)
            backend.close()
            say("done")
        except Exception as exc:  # the parent reports it as the candidate's failure
            (job / "error.txt").write_text(one_line(exc))
            say("error")


if __name__ == "__main__":
    main()
