"""Property-based tests (hypothesis) of input normalization, fresh inputs and verification."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from infertune.errors import InputError
from infertune.model.inputs import build_signature
from infertune.model.structure import flatten
from infertune.model.tolerance import compare_outputs

DTYPES = st.sampled_from(["float32", "float64", "int32", "int64", "uint8", "bool"])
FEATURES = st.lists(st.integers(1, 5), min_size=0, max_size=3).map(tuple)


@st.composite
def samples(draw):
    """A dict of 1-3 inputs sharing a batch size, each with its own features and dtype."""
    batch = draw(st.integers(1, 6))
    count = draw(st.integers(1, 3))
    arrays = {}
    for i in range(count):
        dtype = draw(DTYPES)
        shape = (batch, *draw(FEATURES))
        elements = None
        if dtype.startswith("float"):
            elements = st.floats(-1e3, 1e3, allow_nan=False, width=32)
        arrays[f"in{i}"] = draw(hnp.arrays(dtype, shape, elements=elements))
    return arrays


@settings(max_examples=60, deadline=None)
@given(samples(), st.integers(1, 9))
def test_any_batch_size_passes_the_signature_unchanged(sample, batch):
    signature, flat = build_signature(sample, None, np.dtype("float32"))
    assert signature.batch_is_dynamic
    assert all(spec.shape[0] is None for spec in signature.specs)
    for spec, array in zip(signature.specs, flat):
        assert array.dtype == spec.dtype and array.shape[1:] == spec.shape[1:]
    fresh = signature.random_inputs(np.random.default_rng(0), batch)
    call = signature.structure.pack(fresh)
    checked = signature.flatten(call)
    for spec, got, want in zip(signature.specs, checked, fresh):
        assert got.shape == (batch, *spec.shape[1:]) and got.dtype == spec.dtype
        np.testing.assert_array_equal(got, want)
        if spec.dtype.kind in "iu":  # integer inputs (token ids) stay in the sample's range
            assert got.size == 0 or (got.min() >= spec.low and got.max() <= spec.high)


@settings(max_examples=60, deadline=None)
@given(samples(), st.integers(0, 2))
def test_a_wrong_rank_is_refused_with_the_input_named(sample, which):
    signature, flat = build_signature(sample, None, np.dtype("float32"))
    which = which % len(flat)
    bad = list(flat)
    bad[which] = bad[which][..., np.newaxis]
    with pytest.raises(InputError, match=signature.specs[which].name):
        signature.flatten(signature.structure.pack(bad))


FINITE = st.floats(-1e6, 1e6, allow_nan=False, width=32)


@settings(max_examples=100, deadline=None)
@given(hnp.arrays("float32", hnp.array_shapes(max_dims=3, max_side=6), elements=FINITE))
def test_identical_outputs_always_pass(ref):
    assert compare_outputs([ref.copy()], [ref], rtol=0.0, atol=0.0)


@settings(max_examples=100, deadline=None)
@given(
    hnp.arrays("float64", hnp.array_shapes(max_dims=3, max_side=6), elements=FINITE),
    st.floats(1e-12, 1e6),
    st.floats(2e-3, 1.0),
)
def test_relative_error_beyond_rtol_fails_at_any_scale(ref, scale, error):
    """Whatever the outputs' scale, a 0.2%-100% relative error fails rtol=1e-3 despite atol."""
    ref = ref * scale
    if not np.any(ref):
        return
    out = ref * (1 + error)
    found = compare_outputs([out], [ref], rtol=1e-3, atol=1e-5)
    assert not found and found.max_rel_err == pytest.approx(error, rel=1e-6)


LEAVES = st.integers()
TREES = st.recursive(
    LEAVES,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.text("abc", min_size=1, max_size=2), children, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=100, deadline=None)
@given(TREES)
def test_structure_round_trip(tree):
    leaves, structure = flatten(tree)
    assert structure.pack(leaves) == tree
    assert structure.num_leaves == len(leaves)
