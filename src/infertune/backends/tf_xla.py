"""`tf.function(jit_compile=True)`: XLA fuses the graph; it compiles again for each new shape."""

from __future__ import annotations

from .tf_function import TfFunction

__all__ = ["TfXla"]


class TfXla(TfFunction):
    """XLA-compiled graph. Its first call on each input shape pays the compilation."""

    name = "tf-xla"
    relative_cost = 4.0  # XLA compiles at the first call, and again at another batch size
    memory_factor = 0.5  # the model's variables, and XLA's buffers for them
    # While it compiles: a 2.46 GB embedding table's gather took tf-function and tf-xla
    # together to 8.3 GB above what the process held (3.4x), past the 0.5x estimated.
    compile_memory_factor = 3.0
    jit_compile = True
    compiles_per_shape = True
    triton_serves = True  # the same saved function, XLA on (graph level 1)
