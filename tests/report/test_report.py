"""The report tells every candidate's fate and numbers; the selected one really is the fastest."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers import dense_model

import infertune
from infertune.pipeline.timing import clearly_slower
from infertune.report import STATUSES, CandidateResult, Report


@pytest.fixture(scope="module")
def report():
    sample = np.random.default_rng(0).standard_normal((16, 6)).astype("float32")
    return infertune.optimize(dense_model(), sample, verbose=False).report


@pytest.mark.slow
def test_every_candidate_has_a_status_and_measured_numbers(report):
    from infertune.backends.registry import BACKENDS

    # Every candidate infertune knows, those that cannot run here too (with their reason).
    assert [c.name for c in report.candidates] == ["keras-eager", *BACKENDS]
    runnable = set(infertune.available_backends())
    for c in report.candidates:
        assert (c.status != "unavailable") == (c.name in runnable), (c.name, c.reason)
    for c in report.candidates:
        assert c.status in STATUSES
        if c.status in ("ok", "selected"):
            assert c.p50 > 0 and c.p90 >= c.p50 and c.p99 >= c.p90 and c.mean > 0
            # Five calls at least, unless it left the rounds far behind another (the reason
            # says after how many).
            assert c.n >= 5 or "it left the rest" in c.reason, (c.name, c.n, c.reason)
            assert c.throughput == pytest.approx(16 / (c.mean / 1e3))
            assert c.first_call_ms > 0 and c.prepare_s >= 0 and c.max_rel_err is not None
            if c.status == "ok":
                assert c.reason  # why it was not chosen


def test_selected_candidate_is_fastest_beyond_noise(report):
    chosen = report.candidate(report.selected)
    assert chosen.status == "selected"
    measured = [c for c in report.candidates if c.status == "ok"]
    for other in measured:  # it lost: slower in the paired rounds than someone, tied, or
        # (too erratic for the rounds to tell) more than 5% slower in the median
        assert not clearly_slower(chosen.latency, other.latency)
        beaten = any(clearly_slower(other.latency, c.latency) for c in [*measured, chosen])
        assert beaten or "within noise" in other.reason or other.p50 > chosen.p50


def test_table_and_json(report, tmp_path):
    table = str(report)
    for c in report.candidates:
        assert c.name in table and c.status in table
    assert f"selected: {report.selected}" in table
    data = json.loads(report.to_json(tmp_path / "report.json"))
    assert data == json.loads((tmp_path / "report.json").read_text())
    keys = {"name", "status", "reason", "prepare_s", "first_call_ms", "p50", "p90", "p99",
            "mean", "n", "throughput", "max_abs_err", "max_rel_err"}  # fmt: skip
    assert keys <= set(data["candidates"][0])
    env = data["environment"]
    assert env["packages"]["tensorflow"] and env["packages"]["onnxruntime"] and env["python"]
    assert env["cpu"]["logical_cores"] >= 1 and "threads" in env


def _unavailable(name: str, reason: str) -> CandidateResult:
    return CandidateResult(name, "unavailable", reason=reason)


def test_a_reason_shared_by_many_candidates_is_said_once():
    """Seven GPU candidates on a machine without a GPU take one line, not seven rows and seven
    reasons; a clause several reasons share is said once; every reason stays in to_dict()."""
    no_gpu = "no NVIDIA GPU here (the driver lists none)"
    gpu = [_unavailable(f"gpu-{i}", f"{no_gpu}; also runtime {i} is missing") for i in range(7)]
    left = "measured 2 rounds: more than 1.5x slower than another in each, it left the rest"
    slow = [
        CandidateResult("slow-a", "ok", reason=f"3.10x slower than fast; {left}"),
        CandidateResult("slow-b", "ok", reason=f"2.50x slower than fast; {left}"),
    ]
    report = Report(
        model="m", signature="x", batch_size=1, objective="latency", rtol=1e-3, atol=1e-5,
        candidates=[CandidateResult("fast", "selected"), *slow, *gpu], environment={},
        selected="fast", selection_reason="fastest", total_s=1.0,
    )  # fmt: skip
    text = str(report)
    assert text.count(no_gpu) == 1 and "unavailable here (7): gpu-0, gpu-1" in text
    assert not any(line.startswith("gpu-") for line in text.splitlines())  # no table rows
    assert text.count(left) == 1 and f"slow-a, slow-b: {left}" in text
    assert "slow-a: 3.10x slower than fast" in text and "slow-b: 2.50x slower than fast" in text
    reasons = {c["name"]: c["reason"] for c in report.to_dict()["candidates"]}
    assert reasons["gpu-3"] == f"{no_gpu}; also runtime 3 is missing"  # whole, in the JSON


# optimize(traffic=...)'s figures (Report.traffic), as a real run wrote them: 120 requests, the
# buckets planned but not kept (slower than litert at exact shapes on held-out requests).
TRAFFIC = {
    "traffic": "120 requests; length: median 13, p90 27, max 40; batch 1",
    "requests": 120,
    "lengths": [3, 6, 8, 13, 19, 28, 34, 40],
    "histogram": {
        "counts": [3, 14, 2, 22, 5, 12, 6, 13, 2, 10, 3, 5, 4, 1, 4, 2, 3, 1, 2, 1, 2, 1, 0, 2],
        "edges": [3 + i * 37 / 24 for i in range(25)],
    },
    "p50_ms": {
        "litert": [0.01731, 0.01832, 0.02481, 0.02662, 0.06477, 0.0396, 0.1037, 0.05519],
        "onnxruntime-cpu": [0.1308, 0.1357, 0.1344, 0.1312, 0.1595, 0.1693, 0.1586, 0.1695],
        "keras-eager": [46.81, 61.34, 57.6, 38.57, 57.68, 75.96, 66.01, 19.59],
    },
    "switch_ms": {"litert": 0.02222, "onnxruntime-cpu": 0.182, "keras-eager": 0.0},
    "expected": {"mean_ms": 0.03277133327072887, "p99_ms": 0.05519199976333766},
    "exact_single": {"candidate": "litert", "mean_ms": 0.05957686436127118},
    "padded_to_max": {"candidate": "litert", "mean_ms": 0.05519199976333766},
    "padding": {
        "exact": True,
        "sliced": [[1, 1]],
        "max_rel_err": 1.594965688641288e-07,
        "reason": "padding along length (padding_mask[1], token_ids[1]) changed no output "
        "beyond rtol/atol (largest relative change 1.6e-07; lengths 6->40, 13->40, 27->40, 6->9)",
        "checked": [[6, 40], [13, 40], [27, 40], [6, 9]],
        "batch_exact": True,
    },
    "exact_only": None,
    "waste": 0.2647385984427141,
    "held_out": {
        "requests": 30,
        "plan_ms": 0.09273863333368758,
        "exact_ms": 0.07235485555712431,
        "exact": "litert",
    },  # fmt: skip
    "kept": "exact shapes by litert: on held-out traffic the buckets ran 0.09274 ms a request "
    "against its 0.07235",
}
KEPT_BUCKETS = [
    {"upper": 13, "candidate": "litert", "padded": True, "share": 0.55, "p50_ms": 0.02662},
    {"upper": 28, "candidate": "onnxruntime-cpu", "padded": False, "share": 0.3, "p50_ms": 0.1693},
    {"upper": 40, "candidate": "litert", "padded": True, "share": 0.15, "p50_ms": 0.05519},
]


def _with_traffic(traffic: dict | None) -> Report:
    note = "traffic: the plan in one line, as the pipeline writes it"
    return Report(
        model="m", signature="token_ids: shape (None, None) int32", batch_size=1,
        objective="latency", rtol=1e-3, atol=1e-5,
        candidates=[CandidateResult("litert", "selected"), CandidateResult("keras-eager", "ok")],
        environment={}, selected="litert", selection_reason="fastest", total_s=1.0,
        notes=[note], traffic=traffic,
    )  # fmt: skip


def _section(text: str) -> list[str]:
    """The traffic section's lines: from its heading to the blank line after it."""
    lines = text.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("traffic: ")))
    end = lines.index("", start)
    return lines[start:end]


def _row(section: list[str], words: str) -> bool:
    """Whether a line of the section has these words, however aligned."""
    return words.split() in [line.split() for line in section]


def test_the_traffic_section_shows_the_buckets_the_comparison_and_the_padding_check():
    traffic = {**TRAFFIC, "buckets": KEPT_BUCKETS, "kept": "the buckets"}
    traffic["held_out"] = {**TRAFFIC["held_out"], "plan_ms": 0.05}
    text = str(_with_traffic(traffic))
    section = _section(text)
    assert section[0] == "traffic: 120 requests; length: median 13, p90 27, max 40; batch 1"
    assert section[1] == f"  padding: exact: {TRAFFIC['padding']['reason']}"
    assert "  kept: the buckets" in section
    words = [line.split() for line in section]
    # Per bucket: (low, upper], the candidate, padded or at own length, p50 at its bound, share.
    assert ["(0,", "13]", "litert", "padded", "to", "13", "0.02662", "55%"] in words
    assert ["(13,", "28]", "onnxruntime-cpu", "own", "length", "0.1693", "30%"] in words
    assert ["(28,", "40]", "litert", "padded", "to", "40", "0.05519", "15%"] in words
    assert [">", "40", "litert", "own", "length", "-", "-"] in words  # longer: exact shapes
    # The plan's expected mean and p99 against the best single candidate at exact shapes and
    # every request padded to the longest, as ratios of the plan's mean.
    assert ["the", "planned", "buckets", "-", "0.03277", "0.05519", "-"] in words
    assert _row(section, "best single at exact shapes litert 0.05958 - 1.82x")
    assert _row(section, "every request padded to 40 litert 0.05519 - 1.68x")
    assert "  padding waste: 26.5% of the positions the buckets pad to are padding" in section
    assert (
        "  held-out timing: the buckets 0.05 ms a request against litert at exact shapes "
        "0.07235 ms on 30 held-out requests: 1.45x faster"
    ) in section
    # The histogram: one bar row per level, each bucket's bound marked under it, in 100 columns.
    start = next(i for i, line in enumerate(section) if "requests by length" in line)
    histogram = section[start:]
    assert "24 bins from 3 to 40" in histogram[0] and len(histogram) == 1 + 5 + 2
    assert histogram[1].split() == ["22", "|", "##"]  # the tallest bin alone at the top
    assert histogram[6].count("^") == 3 and histogram[7].split() == ["3", "13", "28", "40"]
    assert all(len(line) <= 100 for line in histogram)
    assert "note: traffic: the plan in one line, as the pipeline writes it" in text  # kept


def test_the_traffic_section_where_the_buckets_lost_on_held_out_traffic():
    section = _section(str(_with_traffic(TRAFFIC)))
    assert f"  kept: {TRAFFIC['kept']}" in section
    assert not any("buckets:" in line or "^" in line for line in section)
    assert _row(section, "the planned buckets (not kept) - 0.03277 0.05519 -")
    assert any(line.endswith("on 30 held-out requests: 1.28x slower") for line in section)
    assert any("would be padding" in line for line in section)


def test_the_traffic_section_where_padding_changes_the_outputs():
    """Padding not exact: every request at its own length, no buckets; the verdict says why,
    once, and padding to the longest is marked as changing the outputs."""
    reason = (
        "padding 6 to 40 along length changed the outputs (max relative error 0.31); the model "
        "likely attends to the padding"
    )
    traffic = {
        **TRAFFIC, "exact_only": reason, "waste": 0.0, "held_out": None,
        "padding": {"exact": False, "sliced": [[1, 1]], "max_rel_err": 0.31, "reason": reason,
                    "checked": [[6, 40]], "batch_exact": None},
        "kept": "every request at its own length by litert",
    }  # fmt: skip
    text = str(_with_traffic(traffic))
    section = _section(text)
    verdict = f"  padding: not exact, requests run at their own lengths: {reason}"
    assert section[1] == verdict and text.count(reason) == 1
    assert "  kept: every request at its own length by litert" in section
    assert not any("buckets:" in line or "held-out" in line for line in section)
    assert _row(section, "every request padded to 40 (would change outputs) litert 0.05519 - 1.68x")


def test_the_traffic_section_where_nothing_was_planned():
    """Buckets pad one free dimension: with two, only the traffic and why."""
    why = "buckets pad one free dimension; this model has 2 free dimensions"
    traffic = {"traffic": "50 requests; a: median 4, p90 8, max 9; b: median 2, p90 3, max 3; "
               "batch 1", "requests": 50, "exact_only": why}  # fmt: skip
    section = _section(str(_with_traffic(traffic)))
    assert section == [f"traffic: {traffic['traffic']}", f"  padding not used: {why}"]


def test_no_traffic_no_section():
    text = str(_with_traffic(None))
    lines = text.splitlines()
    assert not any(line.startswith(("traffic", "  padding", "  kept")) for line in lines)


def test_the_traffic_figures_survive_json():
    """to_dict/from_dict and to_json/from_json keep `traffic`; a figure that was not finite
    (written as "nan") shows as unknown, before and after."""
    traffic = {**TRAFFIC, "buckets": KEPT_BUCKETS, "kept": "the buckets"}
    traffic["padded_to_max"] = {"candidate": "litert", "mean_ms": float("nan")}
    report = _with_traffic(traffic)
    assert Report.from_dict(report.to_dict()).traffic == report.traffic
    data = json.loads(report.to_json())
    assert data["traffic"]["padded_to_max"]["mean_ms"] == "nan"
    again = Report.from_dict(data)
    assert {k: v for k, v in again.traffic.items() if k != "padded_to_max"} == {
        k: v for k, v in traffic.items() if k != "padded_to_max"
    }
    assert str(again) == str(report)
    assert _row(_section(str(again)), "every request padded to 40 litert - - -")


def test_a_histogram_of_too_many_bins_is_left_out():
    traffic = {**TRAFFIC, "histogram": {"counts": [1] * 80, "edges": list(range(81))}}
    section = _section(str(_with_traffic(traffic)))
    assert not any("requests by length" in line for line in section)
    assert any(line.startswith("  held-out timing") for line in section)  # the rest stays
