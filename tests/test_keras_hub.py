"""keras-hub's model classes, the ones users load presets into, tuned as users tune them. The
weights are random: presets come from a model hub, which tests cannot reach; the graph, its
inputs and its masking are keras-hub's own."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import needs_onnxruntime

import infertune

keras_hub = pytest.importorskip("keras_hub")  # in the test extra: skipped only outside it

pytestmark = needs_onnxruntime

VOCABULARY = 100
WIDTH = 16
LONGEST = 128  # the model's max_sequence_length: its position embedding's rows


def bert():
    """A tiny BertBackbone: token_ids, segment_ids and padding_mask of one free length;
    sequence_output (batch, length, WIDTH) and pooled_output, the first token's."""
    import keras

    keras.utils.set_random_seed(0)
    return keras_hub.models.BertBackbone(
        vocabulary_size=VOCABULARY, num_layers=2, num_heads=2, hidden_dim=WIDTH,
        intermediate_dim=2 * WIDTH, max_sequence_length=LONGEST,
    )  # fmt: skip


def bert_request(length: int, seed: int = 0) -> dict:
    """A pair of segments as BERT's preprocessor packs them: the first half segment 0, the
    rest segment 1, every position real."""
    rng = np.random.default_rng(seed)
    segments = np.zeros((1, length), "int32")
    segments[:, length // 2 :] = 1
    return {
        "token_ids": rng.integers(1, VOCABULARY, (1, length)).astype("int32"),
        "segment_ids": segments,
        "padding_mask": np.ones((1, length), "int32"),
    }


@pytest.mark.slow  # two conversions and the traffic's timings: about 15 s on two cores
def test_a_keras_hub_bert_is_tuned_for_its_traffic_with_padding_proven_exact():
    """Its three inputs share the free length; padding them all (the mask with 0) is proven
    exact before any bucket pads; every length, one longer than the traffic's, answers as
    the model does."""
    model = bert()
    rng = np.random.default_rng(1)
    lengths = np.clip(np.round(rng.lognormal(np.log(16), 0.6, 60)), 3, 64).astype(int)
    traffic = [bert_request(int(n), seed=i) for i, n in enumerate(lengths)]
    opt = infertune.optimize(
        model, bert_request(16), traffic=traffic, backends=["onnxruntime-cpu", "litert"],
        verbose=False,
    )  # fmt: skip
    padding = opt.report.traffic["padding"]
    assert padding["exact"], padding["reason"]
    for name in ("token_ids", "segment_ids", "padding_mask"):
        assert name in padding["reason"]
    assert len(padding["checked"]) >= 3
    note = next(n for n in opt.report.notes if n.startswith("traffic:"))
    assert "60 requests" in note
    for n in (3, 17, 64, 100):  # 100: longer than any request of the traffic
        x = bert_request(n, seed=n)
        got, want = opt(x), model(x)
        assert got["sequence_output"].shape == (1, n, WIDTH)
        for key in want:
            np.testing.assert_allclose(got[key], np.asarray(want[key]), rtol=1e-4, atol=1e-5)
