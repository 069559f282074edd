"""Tracing for other threads (models.trace): a graph traced by infertune is compiled by XLA in
one thread while a conversion reads its ops' stack traces in another, and neither waits for
the other forever."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

# A tf.function model (every trace of it calls its graph): XLA compiles a trace of it in a
# thread while this thread reads the stack traces of the ops it calls, as the TFLite converter
# does for its debug info. TensorFlow 2.21 deadlocks there where the traces were not worked out
# at the trace: with plain get_concrete_function() in place of `trace` this script hung in
# round 0 of two runs of 8 (not every run: the hang is a race, so it is no test of its own),
# where `trace` ran all 8 (18.7 s). In a child process: a deadlock holds the interpreter lock.
RACE = textwrap.dedent(
    """
    import sys, threading
    import numpy as np, tensorflow as tf
    from infertune.model.source import trace
    spec = [tf.TensorSpec([None, 16], tf.float32)]
    for round in range(int(sys.argv[1])):
        weights = tf.constant(np.full((16, 16), 0.05, "float32"))

        @tf.function
        def model(x):
            for _ in range(150):
                x = tf.nn.relu(tf.matmul(x, weights) + 0.1)
            return x

        compiled = tf.function(lambda x: model(x), input_signature=spec, jit_compile=True)
        trace(compiled)
        converted = trace(tf.function(lambda x: model(x), input_signature=spec))
        called = [f.graph for f in converted.graph._functions.values()]
        thread = threading.Thread(target=compiled, args=(np.ones((2, 16), "float32"),))
        thread.start()
        frames = sum(len(op.traceback) for g in called for op in g.get_operations())
        thread.join()
        print(round, frames, flush=True)
    """
)


@pytest.mark.slow  # five rounds of XLA compiles in a child: about 17 s on two cores
def test_xla_compiling_beside_a_reader_of_the_same_traces_does_not_deadlock():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, "-c", RACE, "5"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rounds = [line.split() for line in done.stdout.splitlines()]
    assert [r[0] for r in rounds] == ["0", "1", "2", "3", "4"]
    assert all(int(r[1]) > 150 for r in rounds)  # every op of the model had its stack trace
