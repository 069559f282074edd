"""Tracing for other threads (models.trace): a graph traced by infertune is compiled by XLA in
one thread while a conversion reads its ops' stack traces in another, and neither waits for
the other forever."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

# A tf.function model (every trace of it calls its graph): XLA compiles a trace of it in a
# thread while this thread reads the stack traces of the ops it calls, as the TFLite converter
# does for its debug info. TensorFlow 2.21 deadlocks there where the traces were not worked out
# at the trace: with "plain" (get_concrete_function) this hung in round 0 of two runs of 8,
# where "trace" ran all 8 (18.7 s). In a child process: a deadlock holds the interpreter lock.
RACE = textwrap.dedent(
    """
    import sys, threading
    import numpy as np, tensorflow as tf
    from infertune.model.source import trace
    get = {"trace": trace, "plain": lambda f: f.get_concrete_function()}[sys.argv[1]]
    spec = [tf.TensorSpec([None, 16], tf.float32)]
    for round in range(int(sys.argv[2])):
        weights = tf.constant(np.full((16, 16), 0.05, "float32"))

        @tf.function
        def model(x):
            for _ in range(150):
                x = tf.nn.relu(tf.matmul(x, weights) + 0.1)
            return x

        compiled = tf.function(lambda x: model(x), input_signature=spec, jit_compile=True)
        get(compiled)
        converted = get(tf.function(lambda x: model(x), input_signature=spec))
        called = [f.graph for f in converted.graph._functions.values()]
        thread = threading.Thread(target=compiled, args=(np.ones((2, 16), "float32"),))
        thread.start()
        frames = sum(len(op.traceback) for g in called for op in g.get_operations())
        thread.join()
        print(round, frames, flush=True)
    """
)


def test_xla_compiling_beside_a_reader_of_the_same_traces_does_not_deadlock():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run(
        [sys.executable, "-c", RACE, "trace", "5"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rounds = [line.split() for line in done.stdout.splitlines()]
    assert [r[0] for r in rounds] == ["0", "1", "2", "3", "4"]
    assert all(int(r[1]) > 150 for r in rounds)  # every op of the model had its stack trace
