"""Large models: optimize() on models of hundreds of MB to past 2 GB of weights.

python benchmarks/large.py [--models bert,recommender,dense] [--quick] [--no-by-hand]
                           [--max-gb GB] [--lean-allocators] [--out DIR] [--json FILE]

Each model is built with random weights in a child process of its own (one at a time: the
2 GB models need the machine's memory to themselves):

- bert: a BERT-base-sized encoder (vocabulary 30522, 12 layers of width 768, 12 heads, 3072
  wide feed-forward: 110 M parameters, 0.44 GB), a dict of token ids, segment ids and padding
  mask, sequence 128, batch 1;
- recommender: an embedding table of 600,000 x 1024 (2.46 GB) looked up by 8 item ids, mean
  pooled, then two Dense layers; batch 1;
- dense: an MLP of nine 8192 x 8192 Dense layers (604 M parameters, 2.4 GB); batch 1.

In the child: the resident memory of the process and of its children (the rehearsal child,
a worker process) summed, sampled every 0.5 s from /proc while optimize() runs; the peak
against what the process held before (with the model built) and against the weights;
optimize()'s time by stage; every candidate's fate; then the result timed against
`tf.function` and against ONNX Runtime by hand in one interleaved run. The by-hand export
(tf2onnx's `from_function`, with `large_model=True` and its external data past 2 GB) runs
first, in a child of its own with the machine to itself: its time and its peak above the
model built are in the table, its failure (or its kill by `--max-gb`) said below it, and
its model is what the timing child loads. `--quick` builds
small models of the same shapes (a smoke test of the script, seconds each). `--max-gb`
kills a model's child whose memory passes it (on a machine shared with other work), and
sets INFERTUNE_MEMORY_BYTES in the child (unless set) to what it leaves above the model
built, so that optimize() skips what would not fit instead. `--lean-allocators` starts the
children with infertune.system.resources.LEAN_ALLOCATORS (one glibc arena, the system allocator
under oneDNN), which keep less of what the conversions used.

Writes one markdown table (for docs/benchmarks.md), every candidate's fate and the stages
optimize() spent its time in, to docs/benchmarks/large/<date>/ (--out; with --quick a
temporary folder).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import harness
from harness import tree_rss_gb

from infertune.errors import one_line
from infertune.system.resources import LEAN_ALLOCATORS, high_water_mark

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

BENCHMARK = "large"
MODELS = ("bert", "recommender", "dense")


# -- memory of a process tree, from /proc ---------------------------------------------------
def _hwm_gb() -> float:
    """This process's high-water mark in GB: at least the tree's peak. infertune's own resets
    of VmHWM (around each conversion, to measure it) are folded in."""
    return (high_water_mark() or 0) / 1e9


class Sampler:
    """The peak of tree_rss_gb(), sampled every `every_s` seconds in a thread."""

    def __init__(self, every_s: float = 0.5):
        self.every_s, self.peak, self.samples = every_s, 0.0, 0
        self.series: list[tuple[float, float]] = []  # (seconds since start, GB)
        self._start = time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = tree_rss_gb()
            self.peak = max(self.peak, rss)
            self.series.append((round(time.perf_counter() - self._start, 1), round(rss, 2)))
            self.samples += 1
            self._stop.wait(self.every_s)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_rss_gb())


# -- the models -----------------------------------------------------------------------------
def _positions_layer():
    import keras

    class Positions(keras.layers.Layer):
        """Adds a learned position embedding over a free sequence length."""

        def __init__(self, length, width, **kwargs):
            super().__init__(**kwargs)
            self.table = self.add_weight(shape=(length, width), name="positions")

        def call(self, x):
            length = keras.ops.shape(x)[1]
            return x + keras.ops.slice(self.table, [0, 0], [length, self.table.shape[1]])

    return Positions


def build(name: str, quick: bool):
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    if name == "bert":
        _Positions = _positions_layer()
        vocab, width, layers, heads, ffn, seq = (
            (1000, 64, 2, 4, 128, 16) if quick else (30522, 768, 12, 12, 3072, 128)
        )
        ids = keras.Input((None,), dtype="int32", name="token_ids")
        segments = keras.Input((None,), dtype="int32", name="segment_ids")
        mask = keras.Input((None,), dtype="int32", name="padding_mask")
        x = keras.layers.Embedding(vocab, width)(ids) + keras.layers.Embedding(2, width)(segments)
        x = keras.layers.LayerNormalization()(_Positions(512, width)(x))
        attention_mask = keras.ops.cast(keras.ops.expand_dims(mask, 1), "bool")
        for _ in range(layers):
            attended = keras.layers.MultiHeadAttention(heads, width // heads)(
                x, x, attention_mask=attention_mask
            )
            x = keras.layers.LayerNormalization()(x + attended)
            hidden = keras.layers.Dense(ffn, activation="gelu")(x)
            x = keras.layers.LayerNormalization()(x + keras.layers.Dense(width)(hidden))
        model = keras.Model({"token_ids": ids, "segment_ids": segments, "padding_mask": mask}, x)
        sample = {
            "token_ids": rng.integers(0, vocab, (1, seq)).astype("int32"),
            "segment_ids": rng.integers(0, 2, (1, seq)).astype("int32"),
            "padding_mask": np.ones((1, seq), "int32"),
        }
    elif name == "recommender":
        rows, width = (1000, 16) if quick else (600_000, 1024)
        items = keras.Input((8,), dtype="int32", name="item_ids")
        # Zeros first, then random rows 50,000 at a time: Keras' own random initializer held
        # two more copies of the 2.46 GB table (8.6 GB before optimize() began).
        table = keras.layers.Embedding(rows, width, embeddings_initializer="zeros")
        x = table(items)
        x = keras.ops.mean(x, axis=1)
        x = keras.layers.Dense(256, activation="relu")(x)
        model = keras.Model(items, keras.layers.Dense(1)(x))
        variable = table.embeddings.value
        for start in range(0, rows, 50_000):
            chunk = rng.uniform(-0.05, 0.05, (min(50_000, rows - start), width))
            variable[start : start + len(chunk)].assign(chunk.astype("float32"))
        sample = rng.integers(0, rows, (1, 8)).astype("int32")
    elif name == "dense":
        width, layers = (64, 3) if quick else (8192, 9)
        inputs = keras.Input((width,))
        x = inputs
        for i in range(layers):
            x = keras.layers.Dense(width, activation="relu" if i < layers - 1 else None)(x)
        model = keras.Model(inputs, x)
        sample = rng.random((1, width), dtype=np.float32)
    else:
        raise ValueError(f"unknown model {name!r}; known: {MODELS}")
    weights = sum(int(np.prod(w.shape)) * 4 for w in model.weights)
    return model, sample, weights


# -- the child ------------------------------------------------------------------------------
def _median_ms(fn, inputs, seconds: float) -> list[float]:
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end or not times:
        start = time.perf_counter()
        fn(inputs)
        times.append(1e3 * (time.perf_counter() - start))
    return times


def flat_function(model, sample):
    """The model as a function of flat tensors, as a user writes it for tf2onnx or
    tf.function: the input names (the dict's keys, or "x"), their TensorSpecs with a free
    batch dimension, and the call."""
    import tensorflow as tf

    if isinstance(sample, dict):
        names = list(sample)

        def call(*args):
            return model(dict(zip(names, args)))
    else:
        names = ["x"]

        def call(x):
            return model(x)

    feeds = sample if isinstance(sample, dict) else {"x": sample}
    specs = [tf.TensorSpec((None, *feeds[n].shape[1:]), feeds[n].dtype, name=n) for n in names]
    return names, specs, call


def by_hand_export(name: str, quick: bool, directory: Path, out: Path) -> None:
    """The by-hand half, in a child of its own (the 2 GB models need the machine to
    themselves): ONNX as a user writes it, tf2onnx's from_function, with `large_model=True`
    and its external data past 2 GB; its time and this process's peak above the model built
    written to `out` (the child's result), the model to `directory` for the timing child."""
    import tensorflow as tf
    import tf2onnx

    # The conversions tf2onnx 1.17 lacks (Erfc: Keras 3's exact gelu, in BERT), registered
    # as infertune registers them: without, the by-hand model has an Erfc node ONNX Runtime
    # cannot load; the comparison is of the runtimes, not of tf2onnx's coverage.
    import infertune.export.tf2onnx_ops  # noqa: F401
    from infertune.system.resources import release_freed_memory

    model, sample, weights = build(name, quick)
    model(sample)
    release_freed_memory()
    before = tree_rss_gb()
    names, signature, call = flat_function(model, sample)

    large = weights > 1.8e9
    path = directory / ("by_hand.zip" if large else "by_hand.onnx")
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    start = time.perf_counter()
    row = {"names": names}
    try:
        tf2onnx.convert.from_function(
            tf.function(call), input_signature=signature, opset=17, large_model=large,
            output_path=str(path),
        )  # fmt: skip
        if large:  # the zip holds __MODEL_PROTO.onnx and the tensors beside it
            import zipfile

            with zipfile.ZipFile(path) as archive:
                archive.extractall(directory / "by_hand")
            path.unlink()
            path = directory / "by_hand" / "__MODEL_PROTO.onnx"
        row["path"] = str(path)
    except Exception as exc:  # said in the table
        row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    row["export_s"] = time.perf_counter() - start
    row["peak_over_weights"] = (_hwm_gb() - before) / (weights / 1e9)
    harness.write_child_result(out, row)


def _by_hand_session(found: dict, sample):
    """ONNX Runtime on the by-hand export, called as a user calls it."""
    import onnxruntime

    session = onnxruntime.InferenceSession(found["path"], providers=["CPUExecutionProvider"])
    input_names = [i.name for i in session.get_inputs()]
    feeds = sample if isinstance(sample, dict) else {"x": sample}
    ordered = [feeds[n] for n in found["names"]]

    def run(_):
        return session.run(None, dict(zip(input_names, ordered)))

    return run


def child(name: str, quick: bool, by_hand: dict | None, out: Path, max_gb: float = 0.0) -> None:
    import numpy as np
    import tensorflow as tf

    import infertune
    from infertune.system.resources import release_freed_memory

    model, sample, weights = build(name, quick)
    model(sample)  # built and called once, as a user's model is
    release_freed_memory()
    before = tree_rss_gb()
    if max_gb and not os.environ.get("INFERTUNE_MEMORY_BYTES"):
        # What --max-gb leaves above the model: optimize() skips what would not fit in it,
        # instead of the watchdog killing the child.
        os.environ["INFERTUNE_MEMORY_BYTES"] = str(int(max(0.1, max_gb - before) * 1e9))
    start = time.perf_counter()
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")  # VmHWM from here: a converter holding the GIL starves the sampler
    with Sampler() as sampler:
        opt = infertune.optimize(model, sample, verbose=True)
    sampler.peak = max(sampler.peak, _hwm_gb())
    total_s = time.perf_counter() - start
    after = tree_rss_gb()
    report = opt.report
    row = {
        "model": name,
        "quick": quick,
        "weights_gb": weights / 1e9,
        "rss_before_gb": before,
        "peak_gb": sampler.peak,
        "peak_over_weights": (sampler.peak - before) / (weights / 1e9),
        "rss_after_gb": after,
        "optimize_s": total_s,
        "stages": report.stages.to_dict() if report.stages else None,
        "report_peak_gb": getattr(report, "peak_rss_gb", None),
        "selected": opt.backend,
        "series": sampler.series,
        "candidates": [
            {
                "name": c.name,
                "status": c.status,
                "reason": c.reason,
                "prepare_s": c.prepare_s,
                "p50": c.latency.p50 if getattr(c, "latency", None) else None,
            }
            for c in report.candidates
        ],  # fmt: skip
    }
    harness.write_child_result(out, row)  # what is known so far

    # The result against tf.function and ONNX Runtime by hand, interleaved.
    names, specs, call = flat_function(model, sample)
    function = tf.function(call, input_signature=specs)
    feeds = sample if isinstance(sample, dict) else {"x": sample}
    args = [tf.constant(feeds[n]) for n in names]
    runners = {
        "infertune": lambda _: opt(sample),
        "tf.function": lambda _: function(*args).numpy(),
    }
    if by_hand is not None:
        row["by_hand_export_s"] = by_hand.get("export_s")
        row["by_hand_peak_over_weights"] = by_hand.get("peak_over_weights")
        try:
            if "error" in by_hand:
                raise RuntimeError(by_hand["error"])
            runners["ort by hand"] = _by_hand_session(by_hand, sample)
        except Exception as exc:  # said in the table
            row["by_hand_error"] = one_line(exc)[:300]
    row["timed_ms"] = _interleaved(runners)
    harness.write_child_result(out, row)
    del np


def _interleaved(runners: dict, rounds: int = 7, block_s: float = 0.3) -> dict:
    for run in runners.values():
        run(None)  # first calls apart
    times: dict[str, list[float]] = {name: [] for name in runners}
    order = list(runners)
    for round_ in range(rounds):
        for name in order[round_ % len(order) :] + order[: round_ % len(order)]:
            runners[name](None)  # untimed: the switch from the last runner
            times[name] += _median_ms(runners[name], None, block_s)
            time.sleep(0.06)  # ONNX Runtime's threads spin about 40 ms after a call
    import statistics

    return {name: statistics.median(values) for name, values in times.items()}


# -- the parent -----------------------------------------------------------------------------
def _figure(row: dict, key: str, form: str) -> str:
    """row[key] in `form`, or "-" where it was not measured (--no-by-hand, a failure)."""
    value = row.get(key)
    return "-" if value is None or math.isnan(value) else form.format(value)


def table(rows: list[dict]) -> dict:
    head = [
        "model", "weights", "before", "peak", "peak - before", "x weights", "optimize()",
        "selected", "ms: infertune", "tf.function", "ORT by hand", "by-hand export", "its peak",
    ]  # fmt: skip
    cells = []
    for r in rows:
        if "error" in r:
            cells.append([r["model"], f"failed: {r['error']}"])
            continue
        t = r.get("timed_ms", {})

        def ms(key, t=t):
            return f"{t[key]:.3g}" if key in t else "-"

        cells.append(
            [
                r["model"],
                f"{r['weights_gb']:.2f} GB",
                f"{r['rss_before_gb']:.2f} GB",
                f"{r['peak_gb']:.2f} GB",
                f"{r['peak_gb'] - r['rss_before_gb']:.2f} GB",
                f"{r['peak_over_weights']:.1f}x",
                f"{r['optimize_s']:.0f} s",
                r["selected"],
                ms("infertune"),
                ms("tf.function"),
                ms("ort by hand"),
                _figure(r, "by_hand_export_s", "{:.0f} s"),
                _figure(r, "by_hand_peak_over_weights", "{:.1f}x"),
            ]
        )
    return harness.table(head, cells)


def details(rows: list[dict]) -> list[str]:
    """Failures, every candidate's fate and the longest stages, model by model."""
    lines = []
    for r in rows:
        if r.get("by_hand_error"):
            lines.append(f"- {r['model']}: ORT by hand failed: {r['by_hand_error']}")
    for r in rows:
        lines.append(f"- {r['model']}: candidates")
        for c in r.get("candidates", []):
            why = f": {c['reason']}" if c["reason"] else ""
            lines.append(f"  - {c['name']}: {c['status']}{why}"[:300])
        stages = (r.get("stages") or {}).get("stages")
        if stages:
            top = sorted(stages.items(), key=lambda kv: -kv[1])[:8]
            lines.append("  - stages: " + ", ".join(f"{k} {v:.1f} s" for k, v in top))
    return lines


def main() -> int:
    parser = harness.parser(
        __doc__,
        "--out",
        "--quick",
        "--json",
        child=True,
        helps={"--quick": "small models of the same shapes"},
    )
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--no-by-hand", action="store_true", help="no ONNX Runtime by hand")
    parser.add_argument(
        "--max-gb", type=float, default=0.0, help="kill a model's child past this much memory"
    )
    parser.add_argument(
        "--lean-allocators",
        action="store_true",
        help="start each child with infertune's LEAN_ALLOCATORS (one glibc arena, the "
        "system allocator under oneDNN)",
    )
    parser.add_argument("--export-to", type=Path, help=argparse.SUPPRESS)  # the by-hand child
    parser.add_argument("--by-hand", type=Path, help=argparse.SUPPRESS)  # its result
    args = parser.parse_args()
    if args.child and args.export_to:
        by_hand_export(args.child, args.quick, args.export_to, args.child_out)
        return 0
    if args.child:
        found = json.loads(args.by_hand.read_text()) if args.by_hand else None
        child(args.child, args.quick, found, args.child_out, args.max_gb)
        return 0
    rows = []
    for name in harness.names_from(args.models, MODELS, parser):
        with tempfile.TemporaryDirectory(prefix="large-bench-") as tmp:
            quick = ["--quick"] * args.quick
            # The children's temporary files (an ONNX export's, a TFLite flatbuffer's) go
            # with this directory, also where --max-gb kills a child before it removes them.
            env = {**os.environ, "TMPDIR": tmp}
            if args.lean_allocators:
                env.update(LEAN_ALLOCATORS)
            command = []
            if not args.no_by_hand:  # first, alone: its export is kept for the timing
                export = ["--export-to", tmp, *quick]
                found = harness.run_in_child(__file__, name, export, env=env, max_gb=args.max_gb)
                by_hand = Path(tmp) / "by_hand.json"
                by_hand.write_text(json.dumps(found))
                command += ["--by-hand", str(by_hand)]
            command += ["--max-gb", str(args.max_gb)] * bool(args.max_gb)
            row = harness.run_in_child(
                __file__, name, [*quick, *command], env=env, max_gb=args.max_gb
            )
            rows.append(row)
        harness.log("large", json.dumps(rows[-1], default=str)[:2000])
    data = harness.results(
        BENCHMARK,
        about=harness.about(__doc__),
        notes="Peak: resident memory of the process and its children, sampled every 0.5 s "
        "(and the process's high-water mark); before: with the model built; ms: p50 per call, "
        "interleaved.",
        rows=rows,
        tables=[table(rows)],
        headline={
            f"{r['model']}: peak over weights": r["peak_over_weights"]
            for r in rows
            if "peak_over_weights" in r
        },
        sections=[{"title": "Candidates and stages", "lines": details(rows)}],
    )
    harness.publish(data, args.out, args.json, args.quick)
    return 0  # a model that failed is a row of the table, as it always was


if __name__ == "__main__":
    sys.exit(main())
