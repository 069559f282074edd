"""TF-TRT: TensorFlow's own TensorRT integration (TrtGraphConverterV2), where TF has it.

TensorFlow's pip builds dropped TensorRT in 2.18: in 2.21 `get_build_info()` says
`is_tensorrt_build: False` and `trt_convert` imports but fails when used. This candidate is
therefore `unavailable` with that reason on current pip TensorFlow (and without a GPU); it
runs on builds that have TensorRT (TF <= 2.17 pip builds with TensorRT installed, NVIDIA's
TensorFlow containers). TensorRT itself stays reachable through ONNX: the `tensorrt` and
`onnxruntime-tensorrt` candidates.

The model is traced as the same flat tf.function tf-function runs, saved as a SavedModel
(tf_function.save_flat_savedmodel), converted with dynamic shapes, its engines built for the
sample's shapes (other shapes build at run time or run in TensorFlow), saved and loaded
back; a call runs the converted serving signature and returns its outputs as numpy (host)
arrays.

NOT RUN ON GPU HARDWARE YET: written from TensorFlow's TF-TRT documentation.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from ..model.source import tensor_specs
from ..system.environment import gpu_devices
from ..system.gpu import (
    gpu_facts,
    reason_unavailable,
)
from .base import Backend, Target
from .tf_function import save_flat_savedmodel

__all__ = ["TfTrt"]


class TfTrt(Backend):
    """The flat tf.function converted by TrtGraphConverterV2 (fp32)."""

    name = "tf-trt"
    runtime_packages = ("tensorflow",)
    precision_mode = "FP32"

    def available(self) -> str | None:
        # TensorFlow is imported for its build info only where a GPU makes the answer matter
        # (it runs on TensorFlow anyway); without one the reason costs nothing.
        return reason_unavailable("tf-trt", gpu_facts(import_tensorflow=bool(gpu_devices())))

    def converter_arguments(self, target: Target, source: Path, trt) -> dict:
        """TrtGraphConverterV2's keyword arguments: the precision as its own argument (the
        `conversion_params=TrtConversionParams(...)` form is deprecated)."""
        return {
            "input_saved_model_dir": str(source),
            "precision_mode": getattr(trt.TrtPrecisionMode, self.precision_mode),
            "use_dynamic_shape": target.signature.batch_is_dynamic,
            "dynamic_shape_profile_strategy": "Optimal",
        }

    def prepare(self, target: Target) -> None:
        import tensorflow as tf
        from tensorflow.python.compiler.tensorrt import trt_convert as trt

        specs = tensor_specs(target.signature)
        fn = tf.function(target.source.graph_function(target.signature), input_signature=specs)
        self._directory = tempfile.TemporaryDirectory(prefix="infertune-tftrt-")
        source = Path(self._directory.name) / "model.savedmodel"
        converted = Path(self._directory.name) / "trt.savedmodel"
        save_flat_savedmodel(fn, target.source.owner, source)
        converter = trt.TrtGraphConverterV2(**self.converter_arguments(target, source, trt))
        converter.convert()
        zeros = tuple(
            np.zeros(shape, spec.dtype)
            for shape, spec in zip(target.signature.sample_shapes, target.signature.specs)
        )

        def sample_shapes():
            yield zeros

        converter.build(input_fn=sample_shapes)  # engines for the sample's shapes, now
        converter.save(str(converted))
        self._loaded = tf.saved_model.load(str(converted))
        self._fn = self._loaded.signatures["serving_default"]
        self._input_names = [spec.name for spec in specs]  # in_0, in_1, ...
        outputs = self._fn.structured_outputs  # {"output_0": ..., "output_1": ...}
        self._output_keys = sorted(outputs, key=lambda key: int(key.rsplit("_", 1)[1]))

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        result = self._fn(**dict(zip(self._input_names, inputs)))
        return [result[key].numpy() for key in self._output_keys]  # host arrays: the sync

    def close(self) -> None:
        self._fn = self._loaded = None
        directory = getattr(self, "_directory", None)
        if directory is not None:
            directory.cleanup()
            self._directory = None
