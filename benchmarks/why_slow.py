"""infertune.explain() on the benchmark models: the measured output docs/why-slow.md quotes.

python benchmarks/why_slow.py [--models small-cnn,matmul,mobilenet-v2,transformer] [--out DIR]

Results: docs/benchmarks/why-slow/<date>/ (--out): results.md holds each model's diagnosis
as a block of text, why-slow.txt all of them as plain text.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import harness

import infertune
from infertune.demo import DEMO_MODELS, demo_model

BENCHMARK = "why-slow"


def main() -> int:
    parser = harness.parser(__doc__, "--out", "--json")
    parser.add_argument("--models", default="small-cnn,matmul,mobilenet-v2,transformer")
    args = parser.parse_args()
    names = harness.names_from(args.models, DEMO_MODELS, parser)
    rows = []
    for name in names:
        model, sample = demo_model(name)
        harness.log("why-slow", name)
        diagnosis = infertune.explain(model, sample, verbose=False)
        rows.append({"model": name, "batch": int(sample.shape[0]), "diagnosis": str(diagnosis)})
    sections = [
        f"$ infertune.explain({r['model']}, batch {r['batch']})\n{r['diagnosis']}\n" for r in rows
    ]
    data = harness.results(
        BENCHMARK,
        about=harness.about(__doc__),
        rows=rows,
        tables=[
            harness.preformatted(text, f"infertune.explain() on {r['model']}, batch {r['batch']}:")
            for r, text in zip(rows, sections)
        ],
    )
    folder = harness.publish(data, args.out, args.json)
    (folder / "why-slow.txt").write_text("\n".join(sections), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
