"""What the tests share: tiny real models, the checks made on their outputs, the Target that
optimize() builds, the page-residency probes, and the skip markers for optional runtimes.

Import it as `from helpers import ...` (tests/ is on sys.path under pytest's default import
mode, as for conftest.py). Fixtures stay in conftest.py; the test tiers (`slow`, `network`,
`timing`) are explained there.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest

# This folder (the shared helpers, tests/data/) and the repository's root, for the tests in
# subfolders (tests/backends/, tests/deploy/, ...).
TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent

# -- optional runtimes ------------------------------------------------------------------------
# The test extra installs all three (pyproject.toml); a machine without one skips their tests
# and names the install that adds it.
needs_litert = pytest.mark.skipif(
    importlib.util.find_spec("ai_edge_litert") is None,
    reason='ai-edge-litert is not installed (pip install ".[cpu]")',
)
needs_openvino = pytest.mark.skipif(
    importlib.util.find_spec("openvino") is None,
    reason='openvino is not installed (pip install ".[cpu]")',
)
needs_onnxruntime = pytest.mark.skipif(
    importlib.util.find_spec("onnxruntime") is None,
    reason='onnxruntime is not installed (pip install ".[cpu]")',
)


# -- tiny models ------------------------------------------------------------------------------
def dense_model(in_dim: int = 6, out_dim: int = 3, seed: int = 0):
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((in_dim,)),
            keras.layers.Dense(8, activation="relu"),
            keras.layers.Dense(out_dim),
        ]
    )


def conv_model():
    """Conv2D -> GlobalAveragePooling -> Dense: no shape arithmetic at a free batch."""
    import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input((12, 12, 3)),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(4),
        ]
    )


def flatten_cnn(seed: int = 0):
    """Conv2D -> Flatten -> Dense on 8x8x1: at a free batch, Flatten's reshape needs shape
    arithmetic at run time; at a fixed shape the converter folds it (LiteRT's two models)."""
    import keras

    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((8, 8, 1)),
            keras.layers.Conv2D(4, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(3),
        ]
    )


def dict_model(seed: int = 0):
    """Two inputs (float features, int token ids) in a dict, two outputs in a dict."""
    import keras

    keras.utils.set_random_seed(seed)
    features = keras.Input((4,), name="features")
    tokens = keras.Input((5,), name="tokens", dtype="int32")
    embedded = keras.layers.Flatten()(keras.layers.Embedding(20, 3)(tokens))
    hidden = keras.layers.Dense(8, activation="tanh")(
        keras.layers.Concatenate()([features, embedded])
    )
    return keras.Model(
        {"features": features, "tokens": tokens},
        {
            "score": keras.layers.Dense(1)(hidden),
            "probs": keras.layers.Dense(3, activation="softmax")(hidden),
        },
    )


def dict_sample(rng, batch: int = 4):
    return {
        "features": rng.standard_normal((batch, 4)).astype("float32"),
        "tokens": rng.integers(0, 20, (batch, 5)).astype("int32"),
    }


# -- checks on outputs ------------------------------------------------------------------------
def assert_matches_model(model_outputs, outputs, rtol=1e-4, atol=1e-5):
    """Same structure, numpy leaves, values within float32 round-off of the model's."""
    if isinstance(model_outputs, dict):
        assert isinstance(outputs, dict) and set(outputs) == set(model_outputs)
        for key in model_outputs:
            assert_matches_model(model_outputs[key], outputs[key], rtol, atol)
    elif isinstance(model_outputs, list | tuple):
        assert isinstance(outputs, list | tuple) and len(outputs) == len(model_outputs)
        for expected, got in zip(model_outputs, outputs):
            assert_matches_model(expected, got, rtol, atol)
    else:
        assert isinstance(outputs, np.ndarray)
        np.testing.assert_allclose(outputs, np.asarray(model_outputs), rtol=rtol, atol=atol)


# -- what optimize() builds, outside the pipeline ---------------------------------------------
def target_for(model, sample):
    """The Target that optimize(model, sample) builds: what every conversion starts from."""
    from infertune.model.inputs import build_signature
    from infertune.model.source import load_model
    from infertune.model.target import Target

    source = load_model(model)
    signature, flat = build_signature(sample, source.declared_inputs, source.default_float)
    reference, structure = source.call_flat(signature, flat)
    return Target(source, signature, structure, [r.dtype for r in reference])


def model_free_target(x):
    """A Target with no model behind it, for one float32 array `x` (the rehearsal child's
    tests: their candidates need only the signature and the outputs' structure), and the
    sample's flat inputs."""
    import numpy as np

    from infertune.model.inputs import build_signature
    from infertune.model.structure import flatten
    from infertune.model.target import Target

    signature, sample = build_signature(x, None, np.float32)
    return Target(None, signature, flatten(x)[1], [np.dtype("float32")]), sample


def weight_copying(name: str, seconds, closed: list | None = None):
    """A tf-function named `name` that says it copies the weights (a stand-in for a runtime
    holding its own copy: where memory is tight, the tournament keeps one of them), sleeps
    `seconds(inputs)` a call, and appends its name to `closed` when closed."""
    import time

    from infertune.backends.tf_function import TfFunction

    class WeightCopying(TfFunction):
        memory_factor = 1.0

        def __init__(self):
            super().__init__()
            self.name = name

        def run(self, inputs):
            time.sleep(seconds(inputs))
            return super().run(inputs)

        def close(self):
            if closed is not None:
                closed.append(self.name)
            super().close()

    return WeightCopying()


def prepared_backend(backend, model, sample):
    """`backend` prepared on the Target that optimize() builds, outside the pipeline; with
    the input signature."""
    target = target_for(model, sample)
    backend.prepare(target)
    return backend, target.signature


def choice_with_buckets(target, general, buckets):
    """The choice optimize() would return with these buckets on `target`, the general
    candidate `general` (the outputs observed on a sample drawn like the tuning one)."""
    import numpy as np

    from infertune.model.outputs import OutputSignature
    from infertune.result.choice import Choice

    sample = target.signature.random_inputs(np.random.default_rng(0))
    outputs = OutputSignature.observed(target.output_structure, [general.run(sample)], True)
    return Choice(general, target.signature, outputs, buckets=buckets)


def forced(model, sample, name: str, *, exact_shape: str | None = None, **options):
    """optimize(model, sample, **options) with `name` chosen (and `exact_shape` as the
    exact-shape path), verified as optimize() verifies them but not measured: for a test that
    needs a given winner, which the measurement decides by the machine and its load."""
    from infertune.optimized import Optimized
    from infertune.options import REFERENCE_NAMES, Options
    from infertune.pipeline.selection import Forced
    from infertune.pipeline.tune import load_for_tuning, read_data, tune
    from infertune.report.progress import Progress

    names = [n for n in (name, exact_shape) if n is not None and n not in REFERENCE_NAMES]
    options = Options.checked(backends=names, **options)
    with Progress(False) as progress:
        loaded = load_for_tuning(model, sample, progress)
        options = read_data(loaded, options, progress)
        choice, report = tune(loaded, options, progress, Forced(name, exact_shape))
    return Optimized(choice, report, options.saved())


# -- page residency (Linux: /proc) ------------------------------------------------------------
def _smaps_of(path: str) -> list[tuple[str, dict[str, int]]]:
    """This process's mappings of files whose path starts with `path`: each one's header
    line and its fields in kB (/proc/self/smaps; Linux)."""
    found: list[tuple[str, dict[str, int]]] = []
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            first = line.split(maxsplit=1)[0]
            if "-" in first and not first.endswith(":"):  # a mapping's header line
                fields = line.split(maxsplit=5)
                inside = len(fields) == 6 and fields[5].startswith(path)
                if inside:
                    found.append((line.strip(), {}))
            elif inside:  # "Rss:   16 kB"; VmFlags' letters are not kept
                key, _, rest = line.partition(":")
                value = rest.split()[:1]
                if value and value[0].isdigit():
                    found[-1][1][key] = int(value[0])
    return found


def mapped_resident_bytes(path: str) -> int:
    """Resident bytes of this process's mappings of files whose path starts with `path`
    (/proc/self/smaps; Linux)."""
    return sum(fields.get("Rss", 0) * 1024 for _, fields in _smaps_of(path))


def residency_detail(path: str) -> str:
    """Why pages of `path` may still be resident, for a failing assertion's message: this
    process's smaps entries of its mappings, the other processes that map it (a page mapped
    by two is not paged out), and the machine's pages being written back (one under
    writeback is not either)."""
    shown = ("Rss", "Shared_Clean", "Private_Clean", "Private_Dirty")
    mappings = [
        f"{header} " + " ".join(f"{key} {fields.get(key)} kB" for key in shown)
        for header, fields in _smaps_of(path)
    ]
    others = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/maps") as maps:
                if any(path in line for line in maps):
                    others.append(pid)
        except OSError:
            continue
    with open("/proc/meminfo") as meminfo:
        writeback = " ".join(
            " ".join(line.split()) for line in meminfo if line.startswith(("Dirty:", "Writeback:"))
        )
    return f"{path}: {mappings}; mapped by other processes: {others or 'none'}; {writeback}"


# A test of page residency runs twice: `residency` False in the unit tier (what must hold on
# any machine: the data, the advice's reach), True in the `timing` tier (tests/conftest.py),
# where it also reads the resident bytes back. Residency is the kernel's page cache at work,
# which moves with its version and the machine's memory, not a value infertune returns.
residency_tiers = pytest.mark.parametrize(
    "residency", [False, pytest.param(True, marks=pytest.mark.timing)], ids=["data", "residency"]
)


def on_tmpfs(path: str) -> bool:
    """Whether `path` lies on a tmpfs, whose pages cannot leave memory without swap."""
    best, kind = "", ""
    with open("/proc/mounts") as mounts:
        for line in mounts:
            _, point, fs_type = line.split()[:3]
            if path.startswith(point) and len(point) > len(best):
                best, kind = point, fs_type
    return kind == "tmpfs"
