"""`infertune compare OLD NEW`: a slowdown of the chosen candidate beyond both runs' spread
and past --max-slowdown fails the gate, one within the spread passes; a drop against float32
that grew past --max-drop fails; appeared, vanished and changed candidates are said; the
exit status is 0, 1, or 2 for a usage error.

The reports are a real optimize()'s, and the new ones that report edited in a controlled way
(a candidate's latency scaled, its spread set), so that what the gate decides is known."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from helpers import dense_model, needs_onnxruntime

import infertune
from infertune.cli import main
from infertune.report import Report
from infertune.report.compare import (
    compare,
    load_report,
)

pytestmark = needs_onnxruntime

LATENCY_KEYS = ("p50", "p90", "p99", "mean", "min")


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """A real run, as JSON and as a saved result's directory."""
    x = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    opt = infertune.optimize(dense_model(), x, backends=["tf-function", "onnxruntime-cpu"],
                             isolation="off", verbose=False)  # fmt: skip
    directory = tmp_path_factory.mktemp("compare")
    opt.report.to_json(directory / "run.json")
    opt.save(directory / "saved")
    return directory


@pytest.fixture
def data(tuned) -> dict:
    return json.loads((tuned / "run.json").read_text())


def _candidate(data: dict, name: str) -> dict:
    return next(c for c in data["candidates"] if c["name"] == name)


def _scaled(data: dict, name: str, factor: float, spread_share: float) -> dict:
    """A copy of the report with `name`'s latencies times `factor` and its spread set to
    `spread_share` of its (new) p50."""
    data = copy.deepcopy(data)
    c = _candidate(data, name)
    stats = c["latency_ms"]
    for key in LATENCY_KEYS:
        stats[key] *= factor
        if key in c:  # the flat copies: p50, p90, p99, mean
            c[key] = stats[key]
    stats["round_medians"] = [v * factor for v in stats["round_medians"]]
    stats["spread"] = spread_share * stats["p50"]
    return data


def _write(path, data: dict) -> str:
    path.write_text(json.dumps(data))
    return str(path)


def _compare(tmp_path, old: dict, new: dict, *options: str) -> int:
    return main(["compare", _write(tmp_path / "old.json", old), _write(tmp_path / "new.json", new),
                 *options])  # fmt: skip


def test_a_slowdown_beyond_the_spread_fails(data, tmp_path, capsys):
    chosen = data["selected"]
    old = _scaled(data, chosen, 1.0, spread_share=0.05)  # a quiet run: spreads of 5% of p50
    new = _scaled(old, chosen, 2.0, spread_share=0.05)
    assert _compare(tmp_path, old, new, "--max-slowdown", "1.10") == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and f"chosen: {chosen}" in out and "2.00x > 1.1x" in out
    result = compare(Report.from_dict(old), Report.from_dict(new), max_slowdown=1.10)
    assert not result and result.chosen[0].p50_ratio == pytest.approx(2.0)
    assert result.chosen[0].spread_ms == pytest.approx(0.05 * _candidate(new, chosen)["p50"])


def test_a_slowdown_within_the_spread_passes(data, tmp_path, capsys):
    """1.5x is past --max-slowdown, but the runs' own rounds varied by more than the change
    (spread 60% of p50 against a change of 50%): noise, not a regression."""
    chosen = data["selected"]
    old = _scaled(data, chosen, 1.0, spread_share=0.6)
    new = _scaled(old, chosen, 1.5, spread_share=0.6)
    assert _compare(tmp_path, old, new, "--max-slowdown", "1.10") == 0
    out = capsys.readouterr().out
    assert "PASSED" in out and "within the spread" in out


def test_a_small_slowdown_passes_and_other_candidates_do_not_gate(data, tmp_path, capsys):
    chosen = data["selected"]
    other = next(c["name"] for c in data["candidates"]
                 if c["latency_ms"] and c["name"] != chosen)  # fmt: skip
    old = _scaled(_scaled(data, chosen, 1.0, 0.01), other, 1.0, 0.01)
    new = _scaled(_scaled(old, chosen, 1.02, 0.01), other, 3.0, 0.01)  # 2% on the chosen one
    assert _compare(tmp_path, old, new) == 0  # the default --max-slowdown, 1.10
    out = capsys.readouterr().out
    assert "slower, within 1.1x" in out  # the chosen one: beyond the spread, within 1.10x
    line = next(line for line in out.splitlines() if line.startswith(other))
    assert "3.00x" in line and "slower: 3.00x > 1.1x" in line  # said, but not gated


def test_the_same_run_passes_and_a_saved_result_is_a_report(tuned, capsys):
    assert main(["compare", str(tuned / "saved"), str(tuned / "run.json")]) == 0
    assert "PASSED" in capsys.readouterr().out
    assert load_report(tuned / "saved").to_dict() == load_report(tuned / "run.json").to_dict()
    assert main(["report", str(tuned / "saved")]) == 0
    assert "infertune report:" in capsys.readouterr().out


def test_a_metric_drop_beyond_max_drop_fails(data, tmp_path, capsys):
    """A reduced-precision candidate judged by accuracy in both runs (set by hand on a real
    report): its drop against float32 may grow by --max-drop, not more; one the gate
    rejected in both runs is said, not gated."""
    name = next(c["name"] for c in data["candidates"]
                if c["latency_ms"] and c["name"] != data["selected"])  # fmt: skip
    old = copy.deepcopy(data)
    _candidate(old, name).update(
        precision="int8", gate="accuracy on the user's data", metric=0.99, reference_metric=1.0,
        metric_drop=0.01, metric_drop_bound=0.02, max_drop=0.05,
    )  # fmt: skip
    small, large = copy.deepcopy(old), copy.deepcopy(old)
    _candidate(small, name).update(metric=0.987, metric_drop=0.013)  # +0.003
    _candidate(large, name).update(metric=0.97, metric_drop=0.03)  # +0.02
    assert _compare(tmp_path, old, small, "--max-drop", "0.005") == 0
    capsys.readouterr()
    assert _compare(tmp_path, old, large, "--max-drop", "0.005") == 1
    out = capsys.readouterr().out
    assert f"{name}: drop against float32 0.01 -> 0.03 (+0.02 > max_drop 0.005)" in out
    for report in (old, large):
        _candidate(report, name)["status"] = "mismatch"
    assert _compare(tmp_path, old, large, "--max-drop", "0.005") == 0
    assert "(rejected in both runs: not gated)" in capsys.readouterr().out


def test_a_choice_moved_to_a_less_accurate_candidate_fails(data, tmp_path, capsys):
    """The chosen candidate is compared whatever its name: from float32 (drop 0) to an int8
    candidate that loses 0.01, past --max-drop 0.005."""
    name = next(c["name"] for c in data["candidates"]
                if c["latency_ms"] and c["name"] != data["selected"])  # fmt: skip
    new = copy.deepcopy(data)
    _candidate(new, data["selected"]).update(status="ok")
    _candidate(new, name).update(
        status="selected", precision="int8", gate="accuracy on the user's data", metric=0.99,
        reference_metric=1.0, metric_drop=0.01, metric_drop_bound=0.02, max_drop=0.05,
    )  # fmt: skip
    new["selected"] = name
    # --max-slowdown 100: the latency of the other candidate is not what is tested here
    assert _compare(tmp_path, data, new, "--max-drop", "0.005", "--max-slowdown", "100") == 1
    out = capsys.readouterr().out
    assert f"chosen: {data['selected']} -> {name}: drop against float32 0 -> 0.01" in out


def test_appeared_vanished_and_changed_fate_are_said(data, tmp_path, capsys):
    new = copy.deepcopy(data)
    names = [c["name"] for c in new["candidates"] if c["name"] != new["selected"]]
    gone = names[0]
    new["candidates"] = [c for c in new["candidates"] if c["name"] != gone]
    changed = _candidate(new, names[1])
    changed.update(status="mismatch", reason="outputs differ", latency_ms=None)
    added = copy.deepcopy(changed)
    added["name"] = "brand-new"
    new["candidates"].append(added)
    json_path = tmp_path / "comparison.json"
    assert _compare(tmp_path, data, new, "--json", str(json_path)) == 0
    out = capsys.readouterr().out
    assert "appeared: brand-new" in out and f"vanished: {gone}" in out
    was = _candidate(data, names[1])["status"]
    assert f"changed fate: {names[1]}: {was} -> mismatch (outputs differ)" in out
    written = json.loads(json_path.read_text())
    assert written["passed"] is True and written["vanished"] == [gone]
    assert written["changed_fate"] == [{"name": names[1], "old": was, "new": "mismatch"}]


def test_usage_errors_exit_2(tuned, tmp_path, capsys):
    (tmp_path / "bad.json").write_text("{}")
    run = str(tuned / "run.json")
    assert main(["compare", str(tmp_path / "bad.json"), run]) == 2
    assert "is not an infertune report" in capsys.readouterr().err
    assert main(["compare", run, str(tmp_path / "missing.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["compare", run, str(tmp_path)]) == 2  # a directory without report.json
    assert "without report.json" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit:
        main(["compare", run, run, "--max-slowdown", "0.9"])
    assert exit.value.code == 2 and "must be >= 1" in capsys.readouterr().err
