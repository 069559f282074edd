"""The child process of isolation.py: rebuilds candidates from their files and runs them.

Protocol: the parent writes one job directory per line on stdin; the child answers on stdout
with `stage <name>` lines as it goes (load, compile, first call, verification), then
`took <seconds>` (the job's own time, measured here: the parent may read its lines late),
then `done`, or `error` after writing error.txt. It says `ready` once its imports are done,
and exits at the end of its input, or within a second of its parent's death (a hung compile
included), removing the parent's isolation directory (argv[1]) that the dead parent cannot remove.
Whatever native libraries print goes to stderr (the parent's log), never into the protocol.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
import threading
import time
from functools import reduce
from pathlib import Path


def main() -> None:
    directory = Path(sys.argv[1]) if len(sys.argv) > 1 else None
    watch = threading.Thread(target=_exit_with_parent, args=(os.getppid(), directory))
    watch.daemon = True
    watch.start()
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stdout of native code now goes to the log, not into the protocol
    sys.stdout = sys.stderr

    from ..errors import one_line
    from ..system.resources import release_freed_memory

    def say(line: str) -> None:
        protocol.write(line + "\n")

    say("ready")
    for line in sys.stdin:
        job = Path(line.strip())
        start = time.perf_counter()
        try:
            answer = _rehearse(job, say)
        except Exception as exc:  # the parent reports it as the candidate's failure
            (job / "error.txt").write_text(one_line(exc))
            answer = "error"
        # Give back what the job held before answering: the parent compiles the same model
        # next, and the two processes should not hold two copies of it for long.
        release_freed_memory()
        say(f"took {time.perf_counter() - start:.6f}")
        say(answer)


def _rehearse(job: Path, say) -> str:
    """Load the job's candidate from its files and run it on every input; "done"."""
    import numpy as np

    from ..model.inputs import InputSignature
    from ..model.structure import Structure
    from ..model.target import Target

    say("stage load")
    spec = json.loads((job / "job.json").read_text())
    module = importlib.import_module(spec["module"])
    cls = reduce(getattr, spec["qualname"].split("."), module)
    target = Target(
        None,
        InputSignature.from_dict(spec["signature"]),
        Structure.from_dict(spec["outputs"]),
        [np.dtype(d) for d in spec["dtypes"]],
        spec["objective"],
    )
    with np.load(job / "inputs.npz") as stored:
        count = len(target.signature.specs)
        calls = [[stored[f"{i}_{j}"] for j in range(count)] for i in range(spec["calls"])]
    say("stage compile")
    backend = cls.load_artifact(job / "artifact", spec["settings"], target)
    try:
        for i, inputs in enumerate(calls):
            say("stage first call" if i == 0 else "stage verification")
            backend.run(inputs)
    finally:
        backend.close()
    return "done"


def _exit_with_parent(parent: int, directory: Path | None) -> None:
    """Exit when the parent is gone (killed mid-job, it never closes our input)."""
    while os.getppid() == parent:
        time.sleep(1.0)
    if directory is not None and directory.name.startswith("infertune-isolation-"):
        shutil.rmtree(directory, ignore_errors=True)
    os._exit(3)


if __name__ == "__main__":
    main()
