"""The `infertune` command: optimize, explain, demo, report, compare, env, export-triton,
serve."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from ..system.paths import user_path

__all__ = ["main"]

DEMO_HTML = "infertune-report.html"  # `infertune demo` writes it in the current directory
_DTYPES = ("float32", "float16", "float64", "int32", "int64", "uint8", "int8", "bool")


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad argument reported on one line (no usage dump) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from ..demo import DEMO_MODELS

    parser = _Parser(
        prog="infertune",
        description="Make TensorFlow/Keras inference fast by measuring every backend here.",
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)

    opt = verbs.add_parser(
        "optimize",
        help="optimize a SavedModel directory, a .keras/.h5 file or a package",
        description="Optimize a saved model and print the report. Inputs come from --sample, "
        "or are drawn at random from the model's declared input shapes (dimensions the model "
        "leaves open other than the batch must be given with --input). A package's directory "
        "(`infertune package`) is tuned here from its files, without TensorFlow: its inputs "
        "and options are its own (--backends, --time-budget-s, --isolation and "
        "--candidate-timeout-s may be set).",
    )
    opt.add_argument("path", help="SavedModel directory, .keras/.h5 file, or package directory")
    _input_options(opt)
    _tuning_options(opt)
    opt.set_defaults(run=_optimize)

    pack = verbs.add_parser(
        "package",
        help="write a package of a saved model, to tune elsewhere without TensorFlow",
        description="Write everything tuning needs into DIR with TensorFlow (the ONNX export, "
        "the TFLite conversions, the verification inputs and the model's outputs on them, "
        "calibration data, the options, a manifest with every file's sha256), for `infertune "
        "optimize DIR` on the machine that serves, where TensorFlow need not be. Inputs as "
        "for `optimize`; the options that decide the result are set here.",
    )
    pack.add_argument("path", help="SavedModel directory or .keras/.h5 file")
    pack.add_argument("-o", "--out", required=True, metavar="DIR", help="the package's directory")
    _input_options(pack)
    _tuning_options(pack)
    pack.set_defaults(run=_package)

    explain = verbs.add_parser(
        "explain",
        help="measure where the time goes for a saved model, in plain words",
        description="Diagnose why inference of a saved model is slow: first call vs steady "
        "state, eager overhead, model.predict, retracing, arithmetic rate against this "
        "machine's peak, threads. Inputs as for `optimize`.",
    )
    explain.add_argument("path", help="SavedModel directory or .keras/.h5 file")
    _input_options(explain)
    explain.add_argument(
        "--batch-sizes",
        type=_names,
        default=("1", "2", "4", "8"),
        metavar="A,B",
        help="batch sizes for the retracing count (default 1,2,4,8)",
    )
    explain.add_argument("--backends", type=_names, metavar="A,B", help="paths to measure")
    explain.add_argument("--quiet", action="store_true", help="no progress on stderr")
    explain.set_defaults(run=_explain)

    demo = verbs.add_parser(
        "demo",
        help="optimize a built-in demo model and print the report",
        description="Build a demo model with random weights, optimize it, print the report.",
    )
    demo.add_argument("--model", choices=sorted(DEMO_MODELS), default="small-cnn")
    _tuning_options(demo)
    demo.add_argument("--html", metavar="FILE",
                      help=f"where to write the report as HTML (default: beside --json, else "
                      f"{DEMO_HTML} in the current directory)")  # fmt: skip
    demo.set_defaults(run=_demo)

    _report_verbs(verbs)

    env = verbs.add_parser(
        "env",
        help="which candidates can run here, and why the others cannot",
        description="List every candidate backend: available here, or the reason it is not. "
        "With --check, run every candidate that can run here end to end on a tiny model and "
        "print a table for a bug report (exit status 1 if one that can run here broke).",
    )
    env.add_argument("--check", action="store_true",
                     help="run every candidate that can run here on a tiny model")  # fmt: skip
    env.add_argument("--quiet", action="store_true", help="no progress on stderr (--check)")
    env.set_defaults(run=_env)

    triton = verbs.add_parser(
        "export-triton",
        help="write a saved result into a Triton Inference Server model repository",
        description="Write a result saved with `optimize ... --save DIR` (or Optimized.save) "
        "into a Triton model repository: REPO_DIR/NAME/config.pbtxt and "
        "REPO_DIR/NAME/VERSION/model.*, with the tuned settings carried over where Triton's "
        "backend has them. A candidate no Triton backend runs (LiteRT) is refused with the "
        "reason, unless --backend python: Triton's Python backend, in which infertune runs "
        "any candidate.",
    )
    triton.add_argument("saved", metavar="SAVED_DIR", help="directory written by --save")
    triton.add_argument("repository", metavar="REPO_DIR", help="Triton model repository")
    triton.add_argument("--name", required=True, help="model name in the repository")
    triton.add_argument("--version", type=_positive_int, default=1, help="model version (1)")
    triton.add_argument("--max-batch-size", type=int, default=None, metavar="N",
                        help="0: no Triton batching, the batch is dimension -1; N > 0: "
                        "Triton batches requests up to N (default 0; 32 with --backend "
                        "python)")  # fmt: skip
    triton.add_argument("--backend", choices=("python",), default=None,
                        help="python: Triton's Python backend running infertune (any "
                        "candidate, LiteRT included); default: the candidate's own")  # fmt: skip
    triton.set_defaults(run=_export_triton)

    serve = verbs.add_parser(
        "serve",
        help="serve a saved result over HTTP with Ray Serve (Open Inference Protocol v2)",
        description="Serve a result saved with `optimize ... --save DIR` over HTTP, as Triton "
        "does (Open Inference Protocol v2: /v2/models/NAME/infer, tritonclient works), with "
        "Ray Serve on a local Ray; concurrent requests are batched. Limits: a request body "
        "larger than --max-body-mb, or one that decompresses (gzip, deflate) past "
        "--max-decoded-mb, gets HTTP 413; a request of more samples than --max-batch-size "
        "gets 400 naming it. Ctrl-C or SIGTERM stops it (exit 0). Needs "
        'pip install "infertune[ray]".',
    )
    serve.add_argument("saved", metavar="DIR", help="directory written by --save")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="HTTP port (8000)")
    serve.add_argument("--max-batch-size", type=_positive_int, default=32, metavar="N",
                       help="most samples the model runs at once: concurrent requests are "
                       "batched up to N, a request of more samples is refused (32)")  # fmt: skip
    serve.add_argument("--max-body-mb", type=_positive_int, default=64, metavar="MIB",
                       help="largest request body as received, in MiB; a larger one gets "
                       "413 (64)")  # fmt: skip
    serve.add_argument("--max-decoded-mb", type=_positive_int, default=64, metavar="MIB",
                       help="largest request body once decompressed, in MiB; decompression "
                       "stops there with 413 (64)")  # fmt: skip
    serve.add_argument("--replicas", type=_positive_int, default=1, metavar="N",
                       help="replicas, each with its own copy of the model (1)")  # fmt: skip
    serve.add_argument("--name", help="model name in the URLs (default: the directory's name)")
    serve.add_argument("--address", metavar="ADDR",
                       help="join the Ray cluster at ADDR (default: a local Ray)")  # fmt: skip
    serve.set_defaults(run=_serve)
    return parser


def _report_verbs(verbs) -> None:
    """`report` (print a saved report, or write it as HTML) and `compare` (two reports, with
    an exit status for CI)."""
    from ..report.compare import (
        MAX_DROP,
        MAX_SLOWDOWN,
    )

    report = verbs.add_parser(
        "report",
        help="print a saved report, or write it as HTML",
        description="Print a report saved as JSON (--json, Report.to_json()) or kept in a "
        "result directory (--save, Optimized.save()); --html also writes it as one "
        "self-contained HTML page.",
    )
    report.add_argument("file", metavar="FILE_OR_DIR",
                        help="JSON written by --json or Report.to_json(), or a saved result's "
                        "directory")  # fmt: skip
    report.add_argument("--html", metavar="FILE", help="also write the report as HTML")
    report.set_defaults(run=_report)

    compare = verbs.add_parser(
        "compare",
        help="compare two reports: latency, accuracy, fates; exit status 1 on a regression",
        description="Compare report NEW with report OLD (each a JSON report or a saved result's "
        "directory): every candidate's p50 and p99 with both runs' spreads, the change in "
        "metric or error, candidates that appeared, vanished or changed fate. Exit status 1 "
        "where the chosen candidate's p50 grew by more than --max-slowdown and by more than "
        "the larger spread of the two runs, or a drop against float32 grew by more than "
        "--max-drop; 0 otherwise; 2 for a usage error or a file that is not a report.",
    )
    compare.add_argument("old", metavar="OLD", help="the baseline report (JSON or directory)")
    compare.add_argument("new", metavar="NEW", help="the report to judge (JSON or directory)")
    compare.add_argument("--max-slowdown", type=_ratio, default=MAX_SLOWDOWN, metavar="RATIO",
                         help="largest new/old p50 of the chosen candidate that passes "
                         f"(default {MAX_SLOWDOWN:g}); a slowdown within the spread "
                         "passes")  # fmt: skip
    compare.add_argument("--max-drop", type=_drop, default=MAX_DROP, metavar="DROP",
                         help="largest growth of a drop against float32 (metric units, "
                         f"absolute) that passes (default {MAX_DROP:g})")  # fmt: skip
    compare.add_argument("--json", metavar="FILE", help="also write the comparison as JSON")
    compare.set_defaults(run=_compare)


def _input_options(opt: argparse.ArgumentParser) -> None:
    opt.add_argument(
        "--sample", metavar="FILE.npz", help="real inputs: an .npz, one array per input name"
    )
    opt.add_argument(
        "--input", action="append", default=[], metavar="NAME=DIMS:DTYPE",
        help="shape and dtype of an input, e.g. x=1x28x28x1:float32 (NAME= may be left out "
        "for a single-input model); repeat for each input",
    )  # fmt: skip
    opt.add_argument("--batch", type=_positive_int, default=1, help="batch size of drawn inputs")
    opt.add_argument(
        "--int-range",
        default="0,10",
        metavar="LOW,HIGH",
        help="value range of drawn integer inputs such as token ids (default 0,10)",
    )


def _tuning_options(parser: argparse.ArgumentParser) -> None:
    """optimize()'s options, spelled as it spells them (`--time-budget-s` for time_budget_s),
    with its choices and defaults (options.py)."""
    from ..options import (
        DEFAULTS,
        ISOLATIONS,
        OBJECTIVES,
        PRECISIONS,
        REFERENCES,
    )

    parser.add_argument("--backends", type=_names, metavar="A,B",
                        help="candidates to try (default: all; see `infertune env`)")  # fmt: skip
    parser.add_argument("--objective", choices=OBJECTIVES, default=DEFAULTS.objective)
    parser.add_argument("--precision", type=_names, default=DEFAULTS.precision, metavar="P,Q",
                        help=f"allowed precisions: {','.join(PRECISIONS)} (default "
                        f"{','.join(DEFAULTS.precision)})")  # fmt: skip
    parser.add_argument("--calibration", metavar="FILE.npz", default=DEFAULTS.calibration,
                        help="representative inputs static int8 calibrates on: an .npz, one "
                        "array per input name (accuracy=, the task's metric, is Python "
                        "only: infertune.Accuracy)")  # fmt: skip
    parser.add_argument("--rtol", type=float, default=DEFAULTS.rtol)
    parser.add_argument("--atol", type=float, default=DEFAULTS.atol)
    parser.add_argument("--time-budget-s", "--budget", dest="time_budget_s", type=float,
                        default=DEFAULTS.time_budget_s, metavar="SECONDS",
                        help="time budget for the whole optimization (--budget: the "
                        "same)")  # fmt: skip
    parser.add_argument("--batch-sizes", type=_sizes, default=DEFAULTS.batch_sizes,
                        metavar="N,M", help="tune at these batch sizes too, e.g. 1,8,64: a "
                        "choice per batch size, each call dispatched by its own")  # fmt: skip
    parser.add_argument("--latency-budget-ms", type=float, default=DEFAULTS.latency_budget_ms,
                        metavar="MS", help="with --objective throughput: most samples/s whose "
                        "p99 is within MS")  # fmt: skip
    parser.add_argument("--concurrency", type=_positive_int, default=DEFAULTS.concurrency,
                        metavar="N", help="callers calling the result at once (a server's "
                        "worker threads): candidates are measured and chosen under N "
                        f"concurrent callers (default {DEFAULTS.concurrency})")  # fmt: skip
    parser.add_argument("--isolation", choices=ISOLATIONS, default=DEFAULTS.isolation,
                        help="how a crashing or hanging candidate is contained (default: "
                        f"{DEFAULTS.isolation}, native runtimes rehearsed in a child "
                        "process)")  # fmt: skip
    parser.add_argument("--candidate-timeout-s", "--candidate-timeout",
                        dest="candidate_timeout_s", type=_timeout,
                        default=DEFAULTS.candidate_timeout_s, metavar="SECONDS",
                        help="seconds one candidate may take to prepare and verify, or 'none' "
                        f"(default {DEFAULTS.candidate_timeout_s:g}; --candidate-timeout: the "
                        "same)")  # fmt: skip
    parser.add_argument("--reference", choices=REFERENCES, default=DEFAULTS.reference,
                        help="what candidates must reproduce: the model's eager call model(x) "
                        f"(default {DEFAULTS.reference}) or its traced graph, what "
                        "model.predict() and model.export() compute")  # fmt: skip
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON")
    parser.add_argument("--save", metavar="DIR",
                        help="save the result (artifact, settings, report, manifest) in a new "
                        "directory, for infertune.load() or export-triton")  # fmt: skip
    parser.add_argument("--cache", metavar="DIR",
                        help="tuning cache: reuse a result tuned before for the same model, "
                        "inputs, options and environment")  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return 2
    from ..errors import InfertuneError

    try:
        return args.run(args)
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
    sample = _sample(args, source.declared_inputs)
    return _tune_and_print(source, sample, args)


def _explain(args: argparse.Namespace) -> int:
    import infertune

    from ..model.source import load_model

    source = load_model(args.path)
    sample = _sample(args, source.declared_inputs)
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
    sample = _sample(args, source.declared_inputs)
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
        "calibration": _calibration(args.calibration),
    }


def _calibration(path: str | None):
    """--calibration's inputs: the .npz's one array (or its one named array), else a dict by
    input name."""
    if path is None:
        return None
    arrays = _arrays(path, None)
    if isinstance(arrays, dict) and len(arrays) == 1:
        return next(iter(arrays.values()))
    return arrays


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


# -- argument parsing -----------------------------------------------------------------------
def _timeout(text: str) -> float | None:
    if text.lower() == "none":
        return None
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds or 'none', got {text}")
    return value


def _ratio(text: str) -> float:
    value = float(text)
    if not value >= 1.0:
        raise argparse.ArgumentTypeError(f"must be >= 1 (1.10: 10% slower), got {text}")
    return value


def _drop(text: str) -> float:
    value = float(text)
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _sizes(text: str) -> tuple[int, ...]:
    try:
        return tuple(_positive_int(part) for part in _names(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected batch sizes like 1,8,64, got {text}") from None


def _names(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return names


def _parse_input(text: str) -> tuple[str | None, tuple[int, ...], str]:
    name, _, rest = text.rpartition("=")
    dims, _, dtype = rest.partition(":")
    try:
        shape = tuple(int(d) for d in dims.lower().split("x") if d)
    except ValueError:
        raise _UsageError(f"--input {text!r}: dimensions must be integers like 1x28x28x1") from None
    dtype = dtype or "float32"
    if dtype not in _DTYPES:
        raise _UsageError(f"--input {text!r}: dtype must be one of {', '.join(_DTYPES)}")
    return name or None, shape, dtype


class _UsageError(Exception):
    pass


class _MissingExtra(Exception):
    """An optional package a verb needs is not installed; the message names the extra."""


def _arrays(path: str, declared):
    """The inputs an .npz holds: its one array, or a dict by input name."""
    import numpy as np

    with np.load(user_path(path)) as data:
        arrays = {key: data[key] for key in data.files}
    if list(arrays) == ["arr_0"]:
        return arrays["arr_0"]
    if declared is not None and not isinstance(declared, dict) and len(arrays) == 1:
        return next(iter(arrays.values()))
    return arrays


def _sample(args: argparse.Namespace, declared):
    """The sample: from --sample, else drawn from --input and the model's declared inputs."""
    import numpy as np

    from ..errors import InputError
    from ..model.structure import flatten

    if args.sample:
        return _arrays(args.sample, declared)
    try:
        given = [_parse_input(text) for text in args.input]
        low, high = (int(v) for v in args.int_range.split(","))
    except _UsageError as exc:
        raise InputError(str(exc)) from None
    except ValueError:
        raise InputError(f"--int-range {args.int_range!r}: expected LOW,HIGH integers") from None
    rng = np.random.default_rng(0)

    def draw(shape, dtype):
        if np.dtype(dtype).kind in "iub":
            return rng.integers(low, high, size=shape).astype(dtype)
        return rng.random(shape).astype(dtype)

    if declared is None:
        if not given:
            raise InputError(
                "The model does not declare its inputs: give them with --input "
                "NAME=DIMS:DTYPE (e.g. --input 1x28x28x1:float32) or --sample FILE.npz."
            )
        if len(given) == 1 and given[0][0] is None:
            return draw(given[0][1], given[0][2])
        return {name: draw(shape, dtype) for name, shape, dtype in given}
    by_name = {name: (shape, dtype) for name, shape, dtype in given}
    leaves, structure = flatten(declared)
    names = ["x"] if structure.kind == "leaf" else structure.leaf_names()
    arrays = []
    for name, decl in zip(names, leaves):
        if name in by_name or (len(leaves) == 1 and None in by_name):
            shape, dtype = by_name.get(name) or by_name[None]
        else:
            dims = list(decl.shape)
            if dims and dims[0] is None:
                dims[0] = args.batch
            if any(d is None for d in dims):
                raise InputError(
                    f"Input '{name}' has open dimensions {decl.shape}: give its shape with "
                    f"--input {name}=DIMS:DTYPE."
                )
            shape, dtype = tuple(dims), (decl.dtype.name if decl.dtype is not None else "float32")
        arrays.append(draw(shape, dtype))
    return structure.pack(arrays)


if __name__ == "__main__":
    sys.exit(main())
