"""What each verb of the `infertune` command does, and `main`, which parses the command line
(options.py) and runs the verb it names. The library is imported inside each verb, so that a
verb loads only what it uses."""

from __future__ import annotations

import argparse
import sys

from ..system.paths import user_path
from .inputs import calibration_inputs, sample_inputs, traffic_shapes
from .options import DEMO_HTML, build_parser

__all__ = ["COMMANDS", "main"]


class _MissingExtra(Exception):
    """An optional package a verb needs is not installed; the message names the extra."""


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return 2
    from ..errors import InfertuneError

    try:
        return COMMANDS[args.verb](args)
    except (InfertuneError, OSError, _MissingExtra) as exc:
        print(f"infertune: error: {exc}", file=sys.stderr)
        return 1


# -- verbs ----------------------------------------------------------------------------------
def _optimize(args: argparse.Namespace) -> int:
    from ..model.source import load_model
    from ..pipeline.packaging import is_package

    _check_before_tuning(args)
    if is_package(user_path(args.path)):
        return _tune_and_print(args.path, None, args)
    source = load_model(args.path)
    sample = sample_inputs(args, source.declared_inputs)
    return _tune_and_print(source, sample, args)


def _explain(args: argparse.Namespace) -> int:
    import infertune

    from ..model.source import load_model

    source = load_model(args.path)
    sample = sample_inputs(args, source.declared_inputs)
    try:
        sizes = [int(size) for size in args.batch_sizes]
    except ValueError:
        raise infertune.InputError(f"--batch-sizes {args.batch_sizes}: expected integers") from None
    print(infertune.explain(source, sample, batch_sizes=sizes, backends=args.backends,
                            verbose=not args.quiet))  # fmt: skip
    return 0


def _demo(args: argparse.Namespace) -> int:
    from ..demo import demo_model
    from ..errors import OptionError

    _check_before_tuning(args)
    if args.html is None:  # beside the JSON report where there is one
        args.html = str(user_path(args.json).with_suffix(".html")) if args.json else DEMO_HTML
    if not user_path(args.html).parent.is_dir():
        raise OptionError(f"--html {args.html}: the directory '{user_path(args.html).parent}' "
                          "does not exist.")  # fmt: skip
    model, sample = demo_model(args.model)
    return _tune_and_print(model, sample, args)


def _package(args: argparse.Namespace) -> int:
    import infertune

    from ..errors import OptionError
    from ..model.source import load_model

    for flag, value in (("--save", args.save), ("--json", args.json), ("--cache", args.cache)):
        if value:
            raise OptionError(f"{flag} applies to `infertune optimize`, not to `package`.")
    kwargs = _optimize_kwargs(args)
    for here in ("backends", "time_budget_s", "isolation", "candidate_timeout_s"):
        kwargs.pop(here)  # how to tune: chosen where the package is tuned
    source = load_model(args.path)
    sample = sample_inputs(args, source.declared_inputs)
    path = infertune.package(source, sample, args.out, **kwargs, verbose=not args.quiet)
    print(f"package written to {path}: tune it with `infertune optimize {path}`")
    return 0


def _tune_and_print(model, sample, args: argparse.Namespace) -> int:
    import infertune

    opt = infertune.optimize(
        model, sample, **_optimize_kwargs(args), cache=args.cache, verbose=not args.quiet
    )
    print(opt.report)
    if args.json:
        opt.report.to_json(user_path(args.json))
    if getattr(args, "html", None):
        opt.report.to_html(user_path(args.html))
        print(f"HTML report (latency, tuning time, every candidate): {user_path(args.html)}")
    if args.save:
        print(f"saved {opt.backend} to {opt.save(args.save)}")
    return 0


def _optimize_kwargs(args: argparse.Namespace) -> dict:
    return {
        "backends": args.backends,
        "objective": args.objective,
        "precision": args.precision,
        "rtol": args.rtol,
        "atol": args.atol,
        "time_budget_s": args.time_budget_s,
        "batch_sizes": args.batch_sizes,
        "latency_budget_ms": args.latency_budget_ms,
        "concurrency": args.concurrency,
        "isolation": args.isolation,
        "candidate_timeout_s": args.candidate_timeout_s,
        "reference": args.reference,
        "calibration": calibration_inputs(args.calibration),
        "traffic": traffic_shapes(args.traffic),
        # A whole number as an int: an integer input's pad value is an integer.
        "pad_value": int(args.pad_value) if float(args.pad_value).is_integer() else args.pad_value,
        "free_dims": args.free_dims,
    }


def _check_before_tuning(args: argparse.Namespace) -> None:
    """Every check that needs no model, made before loading and tuning it: the options,
    --save (new or empty), --json and --cache (their directories usable)."""
    from ..errors import OptionError
    from ..options import Options
    from ..result.saved import check_target

    Options.checked(**_optimize_kwargs(args))
    if args.save:
        check_target(user_path(args.save))
    if args.json:
        parent = user_path(args.json).parent
        if not parent.is_dir():
            raise OptionError(f"--json {args.json}: the directory '{parent}' does not exist.")
    if args.cache:
        cache = user_path(args.cache)
        if cache.exists() and not cache.is_dir():
            raise OptionError(f"--cache {args.cache}: '{cache}' exists and is not a directory.")


def _export_triton(args: argparse.Namespace) -> int:
    from ..deploy.triton import export_saved

    print(export_saved(args.saved, args.repository, args.name, args.version,
                       args.max_batch_size, args.backend))  # fmt: skip
    return 0


def _serve(args: argparse.Namespace) -> int:
    from ..result.saved import read_manifest

    read_manifest(args.saved)  # a wrong directory fails before Ray starts
    try:
        from ..deploy.ray_serve import serve_until_interrupted
    except ImportError as exc:
        raise _MissingExtra(
            f'`infertune serve` needs Ray Serve: pip install "infertune[ray]" ({exc})'
        ) from None
    serve_until_interrupted(args.saved, host=args.host, port=args.port,
                            max_batch_size=args.max_batch_size, num_replicas=args.replicas,
                            name=args.name, address=args.address, max_body_mb=args.max_body_mb,
                            max_decoded_mb=args.max_decoded_mb)  # fmt: skip
    return 0


def _report(args: argparse.Namespace) -> int:
    from ..report.compare import load_report

    report = load_report(args.file)
    print(report)
    if args.html:
        report.to_html(user_path(args.html))
        print(f"HTML report: {user_path(args.html)}")
    return 0


def _compare(args: argparse.Namespace) -> int:
    """Exit status 0: passed; 1: a regression; 2: a usage error or a file not a report."""
    import json

    from ..errors import InfertuneError
    from ..report.compare import compare_files

    try:
        result = compare_files(args.old, args.new, max_slowdown=args.max_slowdown,
                               max_drop=args.max_drop)  # fmt: skip
    except InfertuneError as exc:
        print(f"infertune compare: error: {exc}", file=sys.stderr)
        return 2
    print(result.text())
    if args.json:
        user_path(args.json).write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return result.exit_code()


def _env(args: argparse.Namespace) -> int:
    from ..backends.registry import BACKENDS
    from ..system.environment import collect_environment

    if args.check:
        from ..system.envcheck import run_check

        check = run_check(verbose=not args.quiet)
        print(check.text())
        return check.exit_code()

    env = collect_environment()
    cpu = env["cpu"]
    print(f"Python {env['python']} on {env['platform']}")
    print(f"CPU: {cpu['model']}, {cpu['usable_cores']} usable cores, {', '.join(cpu['features'])}")
    installed = {k: v for k, v in env["packages"].items() if v}
    print("packages: " + ", ".join(f"{k} {v}" for k, v in installed.items()))
    print()
    width = max(len(name) for name in BACKENDS)
    print(f"{'keras-eager'.ljust(width)}  available (the model's own call, always measured)")
    for name, factory in BACKENDS.items():
        backend = factory()
        reason = backend.available()
        extra = f" [{backend.precision}, off by default]" if backend.precision != "fp32" else ""
        print(f"{name.ljust(width)}  {'available' if reason is None else reason}{extra}")
    return 0


# The function that runs each verb of options.VERBS, by its name.
COMMANDS = {
    "optimize": _optimize,
    "package": _package,
    "explain": _explain,
    "demo": _demo,
    "report": _report,
    "compare": _compare,
    "env": _env,
    "export-triton": _export_triton,
    "serve": _serve,
}
