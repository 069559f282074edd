"""The `infertune` command."""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="infertune",
        description="Make TensorFlow/Keras inference fast by measuring every backend here.",
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    demo = verbs.add_parser(
        "demo",
        help="optimize a built-in demo model and print the report",
        description="Build a demo model with random weights, optimize it, print the report.",
    )
    from .demo import DEMO_MODELS

    demo.add_argument("--model", choices=sorted(DEMO_MODELS), default="small-cnn")
    demo.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                      help="time budget for optimize() (default: none)")  # fmt: skip
    demo.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    demo.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return 2
    return _demo(args)


def _demo(args: argparse.Namespace) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter
    import infertune
    from infertune.demo import demo_model

    model, sample = demo_model(args.model)
    try:
        opt = infertune.optimize(model, sample, time_budget_s=args.budget, verbose=not args.quiet)
    except infertune.InfertuneError as exc:
        print(f"infertune: error: {exc}", file=sys.stderr)
        return 1
    print(opt.report)
    if args.json:
        opt.report.to_json(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
