"""int8 for OpenVINO ("openvino-int8"): NNCF's post-training quantization of the ONNX
export, calibrated on the user's calibration inputs.

`nncf.quantize(core.read_model(onnx), nncf.Dataset(feeds))` inserts FakeQuantize nodes that
OpenVINO's CPU plugin runs as int8 (VNNI, AMX: ResNet50 224 3.11x float32 on a VNNI EPYC, a
small CNN 3.5x on an AMX Xeon). NNCF imports OpenVINO, scipy and networkx, not TensorFlow nor
torch; its telemetry is switched off (NNCF_CI) and its progress bar, printed by `rich` to
stdout, silenced. Layers kept in float32 are NNCF's ignored scope, matched by their name scope
(precision/layers.py `keep_pattern`). A transformer-shaped graph (MatMul with Softmax) is
quantized with NNCF's transformer rules (SmoothQuant, no quantized Softmax inputs); where that
fails the gate, the search (pipeline/precision.py) tries the rules without SmoothQuant
(`SMOOTH_QUANT_OFF`, a calibration method of OpenVinoCpuInt8's). SmoothQuant moves part of
each activation's range into the MatMul's weights before quantizing: on the precision
benchmark's encoder trained end to end, quantized throughout, it lost 15 points of accuracy
where without it the same quantization lost 0.5 (docs/benchmarks.md, "The encoder trained
end to end").

Keeping layers in float32 (the search, pipeline/precision.py) quantizes the export again with
another ignored scope. NNCF's statistics do not depend on it: the first quantization of an
export records them (each step of NNCF's post-training pipeline, run here step by step) and a
search step re-applies them with its ignored scope instead of running the model on the
calibration samples again: ResNet50 224, 1.4 s against 20 s, the same model to the last bit
(tests/test_precision.py checks it on a small CNN and an attention model). Where keeping a
layer moves a quantizer to a point the first quantization did not measure (in attention
blocks, often), the model runs on the calibration samples for those points alone, and they
join the recorded ones. NNCF keys its statistics by its algorithm instances and by node
names, which SmoothQuant's step makes anew each time, so the same instances and the model
the last step starts from are kept with the export (one more copy of the float weights, not
for an export past 2 GB). Anything of that path that NNCF no longer has falls back to
nncf.quantize.

The result is an openvino.Model in memory, written as OpenVINO's IR (model.xml and
model.bin) for save(), which OpenVINO loads without NNCF.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...export.onnx import OnnxExport
from ...precision.layers import keep_pattern
from ...system.quiet import stdout_silenced

__all__ = [
    "CALIBRATION_SAMPLES",
    "IR_FILE",
    "SAMPLES_WITHOUT_ATTENTION",
    "SMOOTH_QUANT_OFF",
    "SMOOTH_QUANT_ON",
    "OpenVinoInt8",
    "nncf_missing",
    "quantize_for_openvino",
    "read_ir",
    "transformer_shaped",
]

IR_FILE = "model.xml"  # and model.bin beside it
# Samples NNCF collects statistics on (it keeps statistics, not tensors: its default is 300):
# at most CALIBRATION_SAMPLES on a transformer-shaped graph (SmoothQuant's scales come from
# them), the first SAMPLES_WITHOUT_ATTENTION on others. benchmarks/studies/nncf_samples.py,
# the int8 model's accuracy on the precision benchmark's gate / test splits, 32 samples
# against 128: ResNet50 224 0.9126 / 0.9124 against 0.9126 / 0.9078 (8.5-9.4 s against
# 15.4-18.8 s); the MobileNetV2-style classifier 0.9840 / 0.9930 against 0.9820 / 0.9910;
# the digits CNN the same; the BERT-sized encoder quantized throughout 0.37 / 0.33 against
# 0.47 / 0.43.
CALIBRATION_SAMPLES = 128
SAMPLES_WITHOUT_ATTENTION = 32
_STATISTICS = "nncf statistics"  # the key of OnnxExport.derived (+ SMOOTH_QUANT_OFF)
SMOOTH_QUANT_ON = "with SmoothQuant"  # NNCF's transformer rules as they are
SMOOTH_QUANT_OFF = "without SmoothQuant"  # the transformer rules, SmoothQuant's step off


@dataclass
class _Statistics:
    """What an export's first quantization collected: NNCF's post-training algorithm (its
    statistics are keyed by its instances) and each pipeline step's statistics."""

    algorithm: Any  # nncf's PostTrainingQuantization
    last: int  # the index of the last step, MinMaxQuantization's (and bias correction's)
    statistics: Any  # its StatisticPointsContainer
    before: Any  # the model that step starts from (SmoothQuant's output: its names differ
    # from one application to the next, and the statistics are keyed by them)
    samples: int
    lock: threading.Lock


@dataclass
class OpenVinoInt8:
    """The quantized model, and how it was quantized."""

    model: Any  # openvino.Model
    input_names: list[str]
    output_names: list[str]
    settings: str  # in words
    transformer: bool = False  # quantized with NNCF's transformer rules (attention's ops)

    def write(self, directory: Path) -> None:
        import openvino

        openvino.save_model(self.model, str(directory / IR_FILE), compress_to_fp16=False)


def nncf_missing() -> str | None:
    """Why NNCF cannot quantize here (not installed), or None."""
    import importlib.util

    if importlib.util.find_spec("nncf") is None:
        return "nncf is not installed (it quantizes for OpenVINO: pip install 'nncf>=3.4')"
    return None


def transformer_shaped(model: Any) -> bool:
    """Whether an openvino.Model has attention's ops (MatMul with Softmax): NNCF's transformer
    rules then apply."""
    ops = {op.get_type_name() for op in model.get_ordered_ops()}
    return "Softmax" in ops and "MatMul" in ops


def quantize_for_openvino(
    exported: OnnxExport,
    feeds: list[dict[str, np.ndarray]],
    keep: tuple[str, ...] = (),
    smooth_quant: bool = True,
) -> OpenVinoInt8:
    """The export quantized to int8 by NNCF, calibrated on `feeds` (dicts by input name),
    the name scopes in `keep` left in float32; `smooth_quant` False: a transformer-shaped
    graph without SmoothQuant's step (nothing changes for another graph)."""
    os.environ.setdefault("NNCF_CI", "1")  # before NNCF's import: no telemetry
    import logging

    import nncf
    import openvino

    nncf.set_log_level(logging.ERROR)
    core = openvino.Core()
    model = core.read_model(exported.session_model())
    transformer = transformer_shaped(model)
    if not transformer:
        feeds = feeds[:SAMPLES_WITHOUT_ATTENTION]
    ignored = None
    if keep:
        patterns = [f".*{keep_pattern(scope)}.*" for scope in keep]
        ignored = nncf.IgnoredScope(patterns=patterns, validate=False)
    dataset = nncf.Dataset(feeds)
    smooth_quant = smooth_quant or not transformer
    rules = _rules(transformer, smooth_quant)
    key = _STATISTICS if smooth_quant else f"{_STATISTICS} {SMOOTH_QUANT_OFF}"
    recorded = exported.derived.get(key)
    with _quiet():
        quantized = None
        if recorded is not None and recorded.samples == len(feeds):
            quantized = _again(recorded, ignored, dataset)
        if quantized is None:  # `model` is read, not changed, where this gives None
            quantized, recorded = _recording(model, dataset, len(feeds), rules, ignored)
            if recorded is not None and not keep and exported.directory is None:
                exported.derived[key] = recorded  # a model past 2 GB: not held twice
        if quantized is None:
            quantized = nncf.quantize(
                model, dataset, subset_size=len(feeds), ignored_scope=ignored, **rules
            )
    words = f"int8 by NNCF {nncf.__version__} on {len(feeds)} calibration samples"
    if transformer:
        words += ", transformer rules" + ("" if smooth_quant else f" {SMOOTH_QUANT_OFF}")
    if keep:
        words += f"; kept in float32: {', '.join(keep)}"
    return OpenVinoInt8(
        quantized, list(exported.input_names), list(exported.output_names), words, transformer
    )


def _rules(transformer: bool, smooth_quant: bool) -> dict[str, Any]:
    """NNCF's arguments for the graph's kind: its transformer rules for a transformer-shaped
    graph, SmoothQuant's step in them or not (alpha -1 turns it off)."""
    import nncf
    from nncf.quantization.advanced_parameters import (
        AdvancedQuantizationParameters,
        AdvancedSmoothQuantParameters,
    )

    if not transformer:
        return {"model_type": None}
    rules: dict[str, Any] = {"model_type": nncf.ModelType.TRANSFORMER}
    if not smooth_quant:
        alphas = AdvancedSmoothQuantParameters(convolution=-1, matmul=-1)
        rules["advanced_parameters"] = AdvancedQuantizationParameters(smooth_quant_alphas=alphas)
    return rules


def _recording(
    model: Any, dataset: Any, samples: int, rules: dict[str, Any], ignored: Any
) -> tuple[Any, _Statistics | None]:
    """nncf.quantize's OpenVINO path (quantize_impl, native_quantize_impl) run step by step,
    each step's statistics kept; (None, None), `model` unchanged, where NNCF lacks a part of
    it (another version) or the model has If operations (NNCF's other path)."""

    try:
        from nncf.openvino.graph.model_utils import remove_friendly_name_duplicates
        from nncf.openvino.graph.nncf_graph_builder import GraphConverter
        from nncf.openvino.quantization.quantize_model import (
            compress_quantize_weights_transformation,
            get_number_if_op,
        )
        from nncf.quantization.algorithms.pipeline import collect_statistics
        from nncf.quantization.algorithms.post_training.algorithm import (
            PostTrainingQuantization,
        )
    except ImportError:
        return None, None
    if get_number_if_op(model) > 0:
        return None, None
    algorithm = PostTrainingQuantization(subset_size=samples, ignored_scope=ignored, **rules)
    try:
        pipeline = algorithm._pipeline
        count = len(pipeline.pipeline_steps)
    except AttributeError:  # another NNCF: nncf.quantize does it
        return None, None
    model = remove_friendly_name_duplicates(model)
    before = statistics = None
    for index in range(count):
        graph = GraphConverter.create_nncf_graph(model)
        points = pipeline.get_statistic_points_for_step(index, model, graph)
        statistics = collect_statistics(points, model, graph, dataset)
        if index == count - 1:
            before = model.clone()
        model = pipeline.run_step(index, statistics, model, graph)
    compress_quantize_weights_transformation(model)
    return model, _Statistics(algorithm, count - 1, statistics, before, samples, threading.Lock())


def _again(recorded: _Statistics, ignored: Any, dataset: Any) -> Any:
    """The export quantized with `ignored` from the statistics `recorded`; where it needs a
    point the first quantization did not measure (keeping a layer can move a quantizer), the
    model runs on the calibration samples for those points alone, and they join the recorded
    ones for the next step. None where NNCF lacks a part of this path or fails on it, or it
    placed no quantizer: the caller then quantizes afresh."""
    import nncf

    try:
        from nncf.openvino.graph.nncf_graph_builder import GraphConverter
        from nncf.openvino.quantization.quantize_model import (
            compress_quantize_weights_transformation,
        )
        from nncf.quantization.algorithms.min_max.algorithm import MinMaxQuantization
        from nncf.quantization.algorithms.pipeline import collect_statistics
    except ImportError:
        return None
    pipeline, last = recorded.algorithm._pipeline, recorded.last
    with recorded.lock:
        for algorithm in pipeline.pipeline_steps[last]:
            if isinstance(algorithm, MinMaxQuantization):
                algorithm.set_ignored_scope(ignored or nncf.IgnoredScope())
                algorithm._reset_cache()
        model = recorded.before.clone()
        graph = GraphConverter.create_nncf_graph(model)
        try:
            needed = pipeline.get_statistic_points_for_step(last, model, graph)
            missing = _missing(recorded.statistics, needed)
            if missing:
                measured = collect_statistics(missing, model, graph, dataset)
                for points in measured.values():
                    for point in points:
                        recorded.statistics.add_statistic_point(point)
            statistics = {last: recorded.statistics}
            quantized = pipeline.run_from_step(model, dataset, graph, last, statistics)
        except Exception:  # NNCF's internals: anything here means "quantize afresh"
            return None
    if not any(op.get_type_name() == "FakeQuantize" for op in quantized.get_ordered_ops()):
        return None
    compress_quantize_weights_transformation(quantized)
    return quantized


def _missing(recorded: Any, needed: Any) -> Any:
    """The statistics `needed` that `recorded` lacks (StatisticPointsContainers: by node name,
    points with a target point and tensor collectors by algorithm), each point with only the
    algorithms it lacks. NNCF places no quantizer, and says nothing, where a point it wants has
    no statistics."""
    from nncf.common.tensor_statistics.statistic_point import (
        StatisticPoint,
        StatisticPointsContainer,
    )

    missing = StatisticPointsContainer()
    for node, points in needed.items():
        have = recorded.get(node, [])
        for point in points:
            same = [h for h in have if h.target_point == point.target_point]
            for algorithm, collectors in point.algorithm_to_tensor_collectors.items():
                if any(algorithm in h.algorithm_to_tensor_collectors for h in same):
                    continue
                lacking = StatisticPoint(point.target_point, collectors[0], algorithm)
                lacking.algorithm_to_tensor_collectors[algorithm] = list(collectors)
                missing.add_statistic_point(lacking)
    return missing


def read_ir(directory: Path, settings: dict) -> OpenVinoInt8:
    """A quantized model saved by OpenVinoInt8.write (no NNCF needed)."""
    import openvino

    model = openvino.Core().read_model(str(directory / IR_FILE))
    return OpenVinoInt8(
        model, list(settings["input_names"]), list(settings["output_names"]),
        settings.get("quantization", ""),
    )  # fmt: skip


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """NNCF's progress bar (rich, on stdout) silenced for the call."""
    try:
        import rich

        console = rich.get_console()
    except ImportError:
        console = None
    quiet = console.quiet if console is not None else None
    if console is not None:
        console.quiet = True
    try:
        with stdout_silenced():
            yield
    finally:
        if console is not None:
            console.quiet = quiet
