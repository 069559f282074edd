"""infertune.explain() on the benchmark models: the measured output docs/why-slow.md quotes.

python benchmarks/why_slow.py [--models small-cnn,matmul,mobilenet-v2,transformer]
    [--out docs/benchmarks/why-slow.txt]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import infertune
from infertune.demo import DEMO_MODELS, demo_model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="small-cnn,matmul,mobilenet-v2,transformer")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/why-slow.txt"))
    args = parser.parse_args()
    sections = []
    for name in args.models.split(","):
        if name not in DEMO_MODELS:
            parser.error(f"unknown model {name!r}; known: {list(DEMO_MODELS)}")
        model, sample = demo_model(name)
        print(f"[why-slow] {name}", file=sys.stderr, flush=True)
        diagnosis = infertune.explain(model, sample, verbose=False)
        sections.append(f"$ infertune.explain({name}, batch {sample.shape[0]})\n{diagnosis}\n")
    text = "\n".join(sections)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
