"""The report as one HTML page: it parses, marks every measured candidate and the chosen one
(per batch size where several were tuned), shows every reduced-precision candidate against
its speed, writes only the report's own numbers, fetches nothing, and is the same bytes for
the same report; `infertune report --html` and `infertune demo` write it."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from html import escape
from html.parser import HTMLParser

import numpy as np
import pytest
from helpers import dense_model, needs_litert, needs_onnxruntime

import infertune
from infertune.cli import main
from infertune.pipeline.timing import LatencyStats
from infertune.report import CandidateResult, Report

pytestmark = needs_onnxruntime


@pytest.fixture(scope="module")
def report():
    """One batch size, float32 only."""
    x = np.random.default_rng(0).standard_normal((4, 6)).astype("float32")
    return infertune.optimize(dense_model(), x, backends=["tf-function", "onnxruntime-cpu"],
                              isolation="off", verbose=False).report  # fmt: skip


@pytest.fixture(scope="module")
def tuned():
    """Three batch sizes, and int8 candidates judged by accuracy on labelled data."""
    pytest.importorskip("ai_edge_litert", reason='ai-edge-litert: pip install ".[cpu]"')
    rng = np.random.default_rng(0)
    model = dense_model()
    x = rng.standard_normal((4, 6)).astype("float32")
    x_val = rng.standard_normal((200, 6)).astype("float32")
    y_val = np.argmax(model.predict(x_val, verbose=0), axis=-1)
    accuracy = infertune.Accuracy(data=(x_val, y_val), metric="accuracy", max_drop=0.05)
    return infertune.optimize(
        model, x, backends=["tf-function", "onnxruntime-cpu", "onnxruntime-cpu-int8",
                            "litert-dynamic-int8"],
        precision=("fp32", "int8"), accuracy=accuracy, batch_sizes=[1, 4, 8], isolation="off",
        verbose=False,
    ).report  # fmt: skip


class _Elements(HTMLParser):
    """Every start tag with its attributes, in order, and the text of each table cell."""

    def __init__(self, text: str):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.cells: list[str] = []
        self._cell: list[str] | None = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "td":
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.cells.append("".join(self._cell))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _charts(text: str) -> dict[str, list[dict]]:
    """{data-chart: the attributes of every element in it that names a candidate}."""
    charts: dict[str, list[dict]] = {}
    current = None
    for tag, attrs in _Elements(text).tags:
        if tag == "svg":
            current = charts.setdefault(attrs["data-chart"], [])
        elif "data-candidate" in attrs and current is not None:
            current.append(attrs)
    return charts


def _marks(elements: list[dict], kind: str = "mark") -> list[tuple[str, set[str]]]:
    return [
        (a["data-candidate"], set(a["class"].split()))
        for a in elements
        if kind in a.get("class", "").split()
    ]


def test_the_page_parses_and_marks_each_measured_candidate_once(report, tmp_path):
    text = report.to_html(tmp_path / "report.html")
    assert (tmp_path / "report.html").read_bytes() == text.encode("utf-8")
    ET.fromstring(text)  # well-formed as XML too: every tag closed, every text escaped
    charts = _charts(text)
    (chart,) = [name for name in charts if name.startswith("latency-")]
    marks = _marks(charts[chart])
    measured = [c.name for c in report.candidates if c.latency is not None]
    assert sorted(name for name, _ in marks) == sorted(measured)
    assert [name for name, classes in marks if "selected" in classes] == [report.selected]
    # The rows go fastest first, as the p50 written on each says.
    p50s = [float(a["data-p50"]) for a in charts[chart] if "mark" in a["class"].split()]
    assert p50s == sorted(p50s)
    cells = _Elements(text).cells
    for c in report.candidates:  # every candidate's fate and reason, measured or not
        assert c.name in cells and c.status in cells
        if c.reason and len(c.reason) <= 160:
            assert any(c.reason in cell for cell in cells), c.name


def test_it_is_self_contained(report):
    """Opens offline: no script, no stylesheet or image fetched, nothing to load."""
    text = report.to_html()
    tags = _Elements(text).tags
    assert not [tag for tag, _ in tags if tag in ("script", "link", "img", "iframe", "object")]
    assert not [attrs for _, attrs in tags if {"src", "href"} & set(attrs)]
    assert "url(" not in text and "@import" not in text


def test_the_same_report_gives_the_same_bytes(report, tmp_path, capsys):
    """No time stamp, no random id: the page of a report read back from its JSON, and the
    one `infertune report --html` writes, are byte for byte the page of the report."""
    text = report.to_html()
    assert report.to_html() == text
    report.to_json(tmp_path / "report.json")
    assert Report.from_json(tmp_path / "report.json").to_html() == text
    code = main(["report", str(tmp_path / "report.json"), "--html", str(tmp_path / "r.html")])
    assert code == 0 and (tmp_path / "r.html").read_bytes() == text.encode("utf-8")
    assert f"HTML report: {tmp_path / 'r.html'}" in capsys.readouterr().out


def test_numbers_are_the_reports_own(report):
    text = report.to_html()
    chosen = report.candidate(report.selected)
    assert f"p50 {chosen.p50:.4g}" in text and f"p99 {chosen.p99:.4g}" in text
    assert f"{report.total_s:.1f} s" in text
    for stage, seconds in report.stages.shared.items():
        assert f"{stage}: {stage} {seconds:.3f} s" in text  # each bar's tooltip
    assert report.environment["packages"]["onnxruntime"] in text
    assert report.environment["cpu"]["model"] in text


@pytest.mark.slow
@needs_litert
def test_one_latency_chart_per_batch_size(tuned):
    charts = _charts(tuned.to_html())
    assert len(tuned.batches) == 3
    for b in tuned.batches:
        marks = _marks(charts[f"latency-batch-{b.batch_size}"])
        assert sorted(name for name, _ in marks) == sorted(b.latency)
        assert [name for name, classes in marks if "selected" in classes] == [b.selected]


@needs_litert
def test_reduced_precision_against_speed(tuned):
    """A point per candidate the gate judged, in the accepted band or not as the report
    says, with its metric and drop as the report has them."""
    text = tuned.to_html()
    judged = [c for c in tuned.candidates if c.gate]
    assert judged and all(c.metric is not None for c in judged)
    points = _marks(_charts(text)["precision"], kind="point")
    assert [name for name, _ in points] == [c.name for c in judged]
    for (name, classes), c in zip(points, judged):
        assert ("accepted" in classes) == (c.status in ("ok", "selected")), name
        assert f"metric {c.metric:.4g} against {c.reference_metric:.4g}" in text
        assert f"drop {c.metric_drop:.4g}" in text
    assert 'class="accepted-region"' in text and f"Judged by: {escape(judged[0].gate)}" in text


def _by_hand(name: str) -> Report:
    stats = LatencyStats(p50=1.0, p90=1.5, p99=2.0, mean=1.1, min=0.9, n=10, rounds=3,
                         spread=0.1, stable=True, round_medians=(1.0, 1.05, 0.95))  # fmt: skip
    return Report(
        model=f"model {name}", signature="x: shape (None, 6) float32", batch_size=1,
        objective="latency", rtol=1e-3, atol=1e-5,
        candidates=[CandidateResult(name, "selected", latency=stats),
                    CandidateResult("other", "failed", reason=f"broke on {name}")],
        environment={"note": name, "nested": {"list": [name, 2], "none": None}},
        selected=name, selection_reason=f"fastest, {name}", total_s=1.0, notes=[name],
    )  # fmt: skip


def test_every_text_is_escaped():
    """Names, reasons, notes and the environment come from models and runtimes: written as
    text, never as markup."""
    name = '<script>alert("x")</script> & <b>'
    text = _by_hand(name).to_html()
    ET.fromstring(text)
    assert "<script" not in text and "<b>" not in text
    marks = _marks(_charts(text)["latency-batch-1"])
    assert marks == [(name, {"mark", "selected"})]


def test_demo_writes_the_page_and_says_where(tmp_path, monkeypatch, capsys):
    """Beside the JSON report where --json names one; --html where it says; else
    infertune-report.html in the current directory."""
    demo = ["demo", "--model", "mlp", "--backends", "tf-function", "--isolation", "off",
            "--quiet"]  # fmt: skip
    assert main([*demo, "--json", str(tmp_path / "r.json")]) == 0
    out = capsys.readouterr().out
    assert f"HTML report (latency, tuning time, every candidate): {tmp_path / 'r.html'}" in out
    report = Report.from_json(tmp_path / "r.json")
    assert (tmp_path / "r.html").read_text(encoding="utf-8") == report.to_html()

    monkeypatch.chdir(tmp_path)
    assert main(demo) == 0
    assert "infertune-report.html" in capsys.readouterr().out
    assert (tmp_path / "infertune-report.html").is_file()
    assert main([*demo, "--html", str(tmp_path / "no-such-dir" / "r.html")]) == 1
    assert "does not exist" in capsys.readouterr().err


# optimize(traffic=...)'s figures (Report.traffic): six bins of lengths, two buckets.
TRAFFIC = {
    "traffic": "40 requests; length: median 9, p90 20, max 24; batch 1",
    "requests": 40,
    "lengths": [2, 6, 9, 14, 20, 24],
    "histogram": {"counts": [5, 12, 9, 0, 6, 8], "edges": [2.0, 5.5, 9.0, 12.5, 16.0, 19.5, 23.0]},
    "p50_ms": {"litert": [0.02, 0.021, 0.025, 0.03, 0.04, float("nan")],
               "onnxruntime-cpu": [0.13, 0.13, 0.14, 0.15, 0.16, 0.17]},
    "switch_ms": {"litert": 0.02, "onnxruntime-cpu": 0.18},
    "expected": {"mean_ms": 0.031, "p99_ms": 0.052},
    "exact_single": {"candidate": "litert", "mean_ms": 0.0558},
    "padded_to_max": {"candidate": "onnxruntime-cpu", "mean_ms": 0.17},
    "padding": {"exact": True, "sliced": [[0, 1]], "max_rel_err": 2e-7, "checked": [[6, 24]],
                "reason": "padding along length changed no output beyond rtol/atol",
                "batch_exact": True},
    "exact_only": None,
    "waste": 0.18,
    "held_out": {"requests": 10, "plan_ms": 0.04, "exact_ms": 0.06, "exact": "litert"},
    "kept": "the buckets",
    "buckets": [
        {"upper": 9, "candidate": "litert", "padded": True, "share": 0.6, "p50_ms": 0.025},
        {"upper": 24, "candidate": "onnxruntime-cpu", "padded": False, "share": 0.4,
         "p50_ms": 0.17},
    ],
}  # fmt: skip


def _traffic_chart(text: str) -> tuple[list[dict], list[dict], list[dict]]:
    """The traffic chart's bars, its bucket bounds (<g>) and their lines."""
    bins, bounds, lines, inside = [], [], [], False
    for tag, attrs in _Elements(text).tags:
        if tag == "svg":
            inside = attrs.get("data-chart") == "traffic"
        elif inside and tag == "rect" and attrs.get("class") == "bin":
            bins.append(attrs)
        elif inside and tag == "g" and attrs.get("class") == "bound":
            bounds.append(attrs)
        elif inside and tag == "line" and attrs.get("class") == "bound":
            lines.append(attrs)
    return bins, bounds, lines


def _row(cells: list[str], first: str, n: int = 5) -> list[str]:
    """The n cells from the last one that reads `first`: a table row."""
    start = len(cells) - 1 - cells[::-1].index(first)
    return cells[start : start + n]


def test_the_traffic_section_draws_the_lengths_and_the_buckets():
    report = _by_hand("litert")
    report.traffic = TRAFFIC
    text = report.to_html()
    ET.fromstring(text)
    assert '<h2 id="traffic">' in text
    bins, bounds, lines = _traffic_chart(text)
    # One bar per bin of the histogram, as tall as its count; one line per bucket's bound.
    assert [float(b["data-count"]) for b in bins] == TRAFFIC["histogram"]["counts"]
    heights = [float(b["height"]) for b in bins]
    assert heights[3] == 0 and heights.index(max(heights)) == 1
    assert [(b["data-candidate"], b["data-upper"]) for b in bounds] == [
        ("litert", "9"), ("onnxruntime-cpu", "24")
    ]  # fmt: skip
    assert len(lines) == 2 and float(lines[0]["x1"]) < float(lines[1]["x1"])
    cells = _Elements(text.split('id="traffic"')[1].split("<h2")[0]).cells  # the section's
    # Per bucket: lengths, candidate, padded or not, p50 at its bound, share of the requests.
    assert _row(cells, "(0, 9]") == ["(0, 9]", "litert", "padded to 9", "0.025", "60.0%"]
    assert _row(cells, "(9, 24]") == ["(9, 24]", "onnxruntime-cpu", "own length", "0.17", "40.0%"]
    assert _row(cells, "> 24") == ["> 24", "litert", "own length", "-", "-"]
    # The expected mean and p99 against the two alternatives, and the measurements under them.
    assert _row(cells, "the planned buckets") == ["the planned buckets", "-", "0.031", "0.052", "-"]
    best = "best single at exact shapes"
    assert _row(cells, best) == [best, "litert", "0.0558", "-", "1.80x"]
    padded = "every request padded to 24"
    assert _row(cells, padded) == [padded, "onnxruntime-cpu", "0.17", "-", "5.48x"]
    assert _row(cells, "litert", 8) == ["litert", "0.02", "0.021", "0.025", "0.03", "0.04", "-",
                                        "0.02"]  # fmt: skip
    assert "18.0% of the positions the buckets pad to are padding" in text
    assert "on 10 held-out requests: 1.50x faster" in text
    assert "exact: padding along length changed no output beyond rtol/atol" in text
    assert report.to_html() == text


def test_the_traffic_section_without_buckets_or_without_traffic():
    report = _by_hand("litert")
    assert 'id="traffic"' not in report.to_html() and 'data-chart="traffic"' not in report.to_html()
    # Padding not exact: the histogram without bounds, no bucket table; why, once.
    reason = "padding 6 to 24 along length changed the outputs"
    report.traffic = {
        **TRAFFIC, "buckets": None, "held_out": None, "exact_only": reason,
        "padding": {**TRAFFIC["padding"], "exact": False, "reason": reason},
        "kept": "every request at its own length by litert",
    }  # fmt: skip
    text = report.to_html()
    ET.fromstring(text)
    bins, bounds, lines = _traffic_chart(text)
    assert len(bins) == 6 and not bounds and not lines
    assert text.count(reason) == 1 and "<h3>Buckets</h3>" not in text
    assert "every request padded to 24 (would change outputs)" in text
    # Nothing planned (two free dimensions): the traffic and why, no chart.
    why = "buckets pad one free dimension; this model has 2 free dimensions"
    report.traffic = {"traffic": "9 requests", "requests": 9, "exact_only": why}
    text = report.to_html()
    ET.fromstring(text)
    assert (
        why in text
        and 'data-chart="traffic"' not in text
        and "<h3>" not in text.split('id="traffic"')[1].split("<h2")[0]
    )


def test_the_traffic_section_escapes_every_text_and_survives_json(tmp_path):
    name = '<script>alert("x")</script> & <b>'
    report = _by_hand("litert")
    report.traffic = {
        **TRAFFIC, "traffic": f"40 requests; {name}: median 9", "kept": f"kept {name}",
        "buckets": [{**TRAFFIC["buckets"][0], "candidate": name}, TRAFFIC["buckets"][1]],
        "p50_ms": {name: [0.1] * 6}, "exact_single": {"candidate": name, "mean_ms": 0.05},
        "padding": {**TRAFFIC["padding"], "reason": f"checked {name}"},
    }  # fmt: skip
    text = report.to_html()
    ET.fromstring(text)
    assert "<script" not in text and "<b>" not in text
    _, bounds, _ = _traffic_chart(text)
    assert bounds[0]["data-candidate"] == name  # the attribute, unescaped by the parser
    # Read back from JSON (the nan among the p50s written as "nan"): the same page.
    report.to_json(tmp_path / "report.json")
    back = Report.from_json(tmp_path / "report.json")
    assert back.traffic["buckets"] == report.traffic["buckets"]
    assert back.to_html() == text
