"""Every verb of the `infertune` command and its arguments, declared once as data; the argparse
parser is derived from this table by `build_parser`, so that a verb's options are read in one
place and the parser holds no logic of its own.

The value types below keep their names: argparse writes a type's name into its message for a
value it cannot convert ("invalid _positive_int value: 'x'").
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, NoReturn

from ..demo import DEMO_MODELS
from ..options import DEFAULTS, ISOLATIONS, OBJECTIVES, PRECISIONS, REFERENCES
from ..report.compare import MAX_DROP, MAX_SLOWDOWN

__all__ = ["DEMO_HTML", "VERBS", "Verb", "build_parser"]

DEMO_HTML = "infertune-report.html"  # `infertune demo` writes it in the current directory


# -- value types ----------------------------------------------------------------------------
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


def _json_object(text: str) -> dict:
    import json

    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text}")
    return value


def _names(text: str) -> tuple[str, ...]:
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    if not names:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return names


# -- the table ------------------------------------------------------------------------------
Argument = tuple[tuple[str, ...], dict[str, Any]]  # add_argument's flags and keywords


def _arg(*flags: str, **settings: Any) -> Argument:
    return flags, settings


@dataclass(frozen=True)
class Verb:
    """One verb: its name, its line in `infertune --help`, its own --help, its arguments in
    the order --help lists them."""

    name: str
    help: str
    description: str
    arguments: tuple[Argument, ...]


# The table is laid out by hand, one argument to a few lines (its flags and settings, then its
# help), for reading as a table; the formatter would give each setting a line.
# fmt: off
INPUT_OPTIONS = (
    _arg("--sample", metavar="FILE.npz", help="real inputs: an .npz, one array per input name"),
    _arg("--input", action="append", default=[], metavar="NAME=DIMS:DTYPE",
         help="shape and dtype of an input, e.g. x=1x28x28x1:float32 (NAME= may be left out "
         "for a single-input model); repeat for each input"),
    _arg("--batch", type=_positive_int, default=1, help="batch size of drawn inputs"),
    _arg("--int-range", default="0,10", metavar="LOW,HIGH",
         help="value range of drawn integer inputs such as token ids (default 0,10)"),
)

# optimize()'s options, spelled as it spells them (`--time-budget-s` for time_budget_s), with
# its choices and defaults (options.py).
TUNING_OPTIONS = (
    _arg("--backends", type=_names, metavar="A,B",
         help="candidates to try (default: all; see `infertune env`)"),
    _arg("--objective", choices=OBJECTIVES, default=DEFAULTS.objective),
    _arg("--precision", type=_names, default=DEFAULTS.precision, metavar="P,Q",
         help=f"allowed precisions: {','.join(PRECISIONS)} (default "
         f"{','.join(DEFAULTS.precision)})"),
    _arg("--calibration", metavar="FILE.npz", default=DEFAULTS.calibration,
         help="representative inputs static int8 calibrates on: an .npz, one array per input "
         "name (accuracy=, the task's metric, is Python only: infertune.Accuracy)"),
    _arg("--traffic", metavar="FILE.json", default=DEFAULTS.traffic,
         help="a sample of real requests' shapes, a JSON list (e.g. [[1, 41], [1, 93]], or for "
         "several inputs a list of objects by input name): buckets over the free dimension's "
         "lengths, padding only where it is proven exact"),
    _arg("--pad-value", type=float, default=DEFAULTS.pad_value, metavar="VALUE",
         help="what padding writes, for every input (default 0)"),
    _arg("--free-dims", type=_json_object, default=DEFAULTS.free_dims, metavar="JSON",
         help='the free dimensions by name, e.g. \'{"length": ["ids:1", "mask:1"]}\' '
         "(default: found from the traffic)"),
    _arg("--rtol", type=float, default=DEFAULTS.rtol),
    _arg("--atol", type=float, default=DEFAULTS.atol),
    _arg("--time-budget-s", "--budget", dest="time_budget_s", type=float,
         default=DEFAULTS.time_budget_s, metavar="SECONDS",
         help="time budget for the whole optimization (--budget: the same)"),
    _arg("--batch-sizes", type=_sizes, default=DEFAULTS.batch_sizes, metavar="N,M",
         help="tune at these batch sizes too, e.g. 1,8,64: a choice per batch size, each call "
         "dispatched by its own"),
    _arg("--latency-budget-ms", type=float, default=DEFAULTS.latency_budget_ms, metavar="MS",
         help="with --objective throughput: most samples/s whose p99 is within MS"),
    _arg("--concurrency", type=_positive_int, default=DEFAULTS.concurrency, metavar="N",
         help="callers calling the result at once (a server's worker threads): candidates are "
         "measured and chosen under N concurrent callers (default "
         f"{DEFAULTS.concurrency})"),
    _arg("--isolation", choices=ISOLATIONS, default=DEFAULTS.isolation,
         help=f"how a crashing or hanging candidate is contained (default: {DEFAULTS.isolation}, "
         "native runtimes rehearsed in a child process)"),
    _arg("--candidate-timeout-s", "--candidate-timeout", dest="candidate_timeout_s",
         type=_timeout, default=DEFAULTS.candidate_timeout_s, metavar="SECONDS",
         help="seconds one candidate may take to prepare and verify, or 'none' (default "
         f"{DEFAULTS.candidate_timeout_s:g}; --candidate-timeout: the same)"),
    _arg("--reference", choices=REFERENCES, default=DEFAULTS.reference,
         help="what candidates must reproduce: the model's eager call model(x) (default "
         f"{DEFAULTS.reference}) or its traced graph, what model.predict() and model.export() "
         "compute"),
    _arg("--json", metavar="FILE", help="also write the report as JSON"),
    _arg("--save", metavar="DIR",
         help="save the result (artifact, settings, report, manifest) in a new directory, for "
         "infertune.load() or export-triton"),
    _arg("--cache", metavar="DIR",
         help="tuning cache: reuse a result tuned before for the same model, inputs, options "
         "and environment"),
    _arg("--quiet", action="store_true", help="no progress on stderr"),
)

_OPTIMIZE = Verb(
    "optimize",
    "optimize a SavedModel directory, a .keras/.h5 file or a package",
    "Optimize a saved model and print the report. Inputs come from --sample, or are drawn at "
    "random from the model's declared input shapes (dimensions the model leaves open other "
    "than the batch must be given with --input). A package's directory (`infertune package`) "
    "is tuned here from its files, without TensorFlow: its inputs and options are its own "
    "(--backends, --time-budget-s, --isolation and --candidate-timeout-s may be set).",
    (
        _arg("path", help="SavedModel directory, .keras/.h5 file, or package directory"),
        *INPUT_OPTIONS,
        *TUNING_OPTIONS,
    ),
)

_PACKAGE = Verb(
    "package",
    "write a package of a saved model, to tune elsewhere without TensorFlow",
    "Write everything tuning needs into DIR with TensorFlow (the ONNX export, the TFLite "
    "conversions, the verification inputs and the model's outputs on them, calibration data, "
    "the options, a manifest with every file's sha256), for `infertune optimize DIR` on the "
    "machine that serves, where TensorFlow need not be. Inputs as for `optimize`; the options "
    "that decide the result are set here.",
    (
        _arg("path", help="SavedModel directory or .keras/.h5 file"),
        _arg("-o", "--out", required=True, metavar="DIR", help="the package's directory"),
        *INPUT_OPTIONS,
        *TUNING_OPTIONS,
    ),
)

_EXPLAIN = Verb(
    "explain",
    "measure where the time goes for a saved model, in plain words",
    "Diagnose why inference of a saved model is slow: first call vs steady state, eager "
    "overhead, model.predict, retracing, arithmetic rate against this machine's peak, "
    "threads. Inputs as for `optimize`.",
    (
        _arg("path", help="SavedModel directory or .keras/.h5 file"),
        *INPUT_OPTIONS,
        _arg("--batch-sizes", type=_names, default=("1", "2", "4", "8"), metavar="A,B",
             help="batch sizes for the retracing count (default 1,2,4,8)"),
        _arg("--backends", type=_names, metavar="A,B", help="paths to measure"),
        _arg("--quiet", action="store_true", help="no progress on stderr"),
    ),
)

_DEMO = Verb(
    "demo",
    "optimize a built-in demo model and print the report",
    "Build a demo model with random weights, optimize it, print the report.",
    (
        _arg("--model", choices=sorted(DEMO_MODELS), default="small-cnn"),
        *TUNING_OPTIONS,
        _arg("--html", metavar="FILE",
             help=f"where to write the report as HTML (default: beside --json, else {DEMO_HTML} "
             "in the current directory)"),
    ),
)

_REPORT = Verb(
    "report",
    "print a saved report, or write it as HTML",
    "Print a report saved as JSON (--json, Report.to_json()) or kept in a result directory "
    "(--save, Optimized.save()); --html also writes it as one self-contained HTML page.",
    (
        _arg("file", metavar="FILE_OR_DIR",
             help="JSON written by --json or Report.to_json(), or a saved result's "
             "directory"),
        _arg("--html", metavar="FILE", help="also write the report as HTML"),
    ),
)

_COMPARE = Verb(
    "compare",
    "compare two reports: latency, accuracy, fates; exit status 1 on a regression",
    "Compare report NEW with report OLD (each a JSON report or a saved result's directory): "
    "every candidate's p50 and p99 with both runs' spreads, the change in metric or error, "
    "candidates that appeared, vanished or changed fate. Exit status 1 where the chosen "
    "candidate's p50 grew by more than --max-slowdown and by more than the larger spread of "
    "the two runs, or a drop against float32 grew by more than --max-drop; 0 otherwise; 2 for "
    "a usage error or a file that is not a report.",
    (
        _arg("old", metavar="OLD", help="the baseline report (JSON or directory)"),
        _arg("new", metavar="NEW", help="the report to judge (JSON or directory)"),
        _arg("--max-slowdown", type=_ratio, default=MAX_SLOWDOWN, metavar="RATIO",
             help="largest new/old p50 of the chosen candidate that passes (default "
             f"{MAX_SLOWDOWN:g}); a slowdown within the spread passes"),
        _arg("--max-drop", type=_drop, default=MAX_DROP, metavar="DROP",
             help="largest growth of a drop against float32 (metric units, absolute) that "
             f"passes (default {MAX_DROP:g})"),
        _arg("--json", metavar="FILE", help="also write the comparison as JSON"),
    ),
)

_ENV = Verb(
    "env",
    "which candidates can run here, and why the others cannot",
    "List every candidate backend: available here, or the reason it is not. With --check, run "
    "every candidate that can run here end to end on a tiny model and print a table for a bug "
    "report (exit status 1 if one that can run here broke).",
    (
        _arg("--check", action="store_true",
             help="run every candidate that can run here on a tiny model"),
        _arg("--quiet", action="store_true", help="no progress on stderr (--check)"),
    ),
)

_EXPORT_TRITON = Verb(
    "export-triton",
    "write a saved result into a Triton Inference Server model repository",
    "Write a result saved with `optimize ... --save DIR` (or Optimized.save) into a Triton "
    "model repository: REPO_DIR/NAME/config.pbtxt and REPO_DIR/NAME/VERSION/model.*, with the "
    "tuned settings carried over where Triton's backend has them. A candidate no Triton "
    "backend runs (LiteRT) is refused with the reason, unless --backend python: Triton's "
    "Python backend, in which infertune runs any candidate.",
    (
        _arg("saved", metavar="SAVED_DIR", help="directory written by --save"),
        _arg("repository", metavar="REPO_DIR", help="Triton model repository"),
        _arg("--name", required=True, help="model name in the repository"),
        _arg("--version", type=_positive_int, default=1, help="model version (1)"),
        _arg("--max-batch-size", type=int, default=None, metavar="N",
             help="0: no Triton batching, the batch is dimension -1; N > 0: Triton batches "
             "requests up to N (default 0; 32 with --backend python)"),
        _arg("--backend", choices=("python",), default=None,
             help="python: Triton's Python backend running infertune (any candidate, LiteRT "
             "included); default: the candidate's own"),
    ),
)

_SERVE = Verb(
    "serve",
    "serve a saved result over HTTP with Ray Serve (Open Inference Protocol v2)",
    "Serve a result saved with `optimize ... --save DIR` over HTTP, as Triton does (Open "
    "Inference Protocol v2: /v2/models/NAME/infer, tritonclient works), with Ray Serve on a "
    "local Ray; concurrent requests are batched. Limits: a request body larger than "
    "--max-body-mb, or one that decompresses (gzip, deflate) past --max-decoded-mb, gets HTTP "
    "413; a request of more samples than --max-batch-size gets 400 naming it. Ctrl-C or "
    'SIGTERM stops it (exit 0). Needs pip install "infertune[ray]".',
    (
        _arg("saved", metavar="DIR", help="directory written by --save"),
        _arg("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)"),
        _arg("--port", type=int, default=8000, help="HTTP port (8000)"),
        _arg("--max-batch-size", type=_positive_int, default=32, metavar="N",
             help="most samples the model runs at once: concurrent requests are batched up to "
             "N, a request of more samples is refused (32)"),
        _arg("--max-body-mb", type=_positive_int, default=64, metavar="MIB",
             help="largest request body as received, in MiB; a larger one gets 413 "
             "(64)"),
        _arg("--max-decoded-mb", type=_positive_int, default=64, metavar="MIB",
             help="largest request body once decompressed, in MiB; decompression stops there "
             "with 413 (64)"),
        _arg("--replicas", type=_positive_int, default=1, metavar="N",
             help="replicas, each with its own copy of the model (1)"),
        _arg("--name", help="model name in the URLs (default: the directory's name)"),
        _arg("--address", metavar="ADDR",
             help="join the Ray cluster at ADDR (default: a local Ray)"),
    ),
)

# In the order `infertune --help` lists them.
VERBS = (
    _OPTIMIZE, _PACKAGE, _EXPLAIN, _DEMO, _REPORT, _COMPARE, _ENV, _EXPORT_TRITON, _SERVE,
)
# fmt: on


# -- the parser -----------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse, with a bad argument reported on one line (no usage dump) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The parser of VERBS; the chosen verb's name is `args.verb` (None: no verb given)."""
    parser = _Parser(
        prog="infertune",
        description="Make TensorFlow/Keras inference fast by measuring every backend here.",
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    for verb in VERBS:
        sub = verbs.add_parser(verb.name, help=verb.help, description=verb.description)
        for flags, settings in verb.arguments:
            sub.add_argument(*flags, **settings)
    return parser
