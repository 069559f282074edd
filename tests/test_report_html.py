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
