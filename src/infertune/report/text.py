"""The report as text: the table `str(report)` prints, with why each candidate has its status,
the choice per batch size, the buckets for the traffic (traffic.py writes that section) and
where the time went, and the diagnosis in plain words.

Functions of the values in data.py, which calls them (`Report.__str__`, `Diagnosis.__str__`):
this module imports no part of data.py, so that the values can import it.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from .format import sci
from .traffic import traffic_lines

if TYPE_CHECKING:
    from .data import CandidateResult, Diagnosis, PathRate, Report

__all__ = ["batch_lines", "diagnosis_text", "exact_shapes_words", "memory_line", "report_text"]


def report_text(report: Report) -> str:
    """The table of candidates, then why each has its status, the choice and the time taken
    (`str(report)`, `Report.table()`)."""
    header = (
        "candidate", "status", "p50 ms", "p90 ms", "p99 ms", "samples/s",
        "1st call ms", "prepare s", "rel err", "n",
    )  # fmt: skip
    rows = [header]
    grouped = _unavailable_groups(report)
    hidden = {name for names in grouped.values() for name in names}
    for c in report.candidates:
        if c.name in hidden:
            continue
        lat = c.latency
        rows.append(
            (
                c.name,
                c.status,
                _num(lat.p50 if lat else None),
                _num(lat.p90 if lat else None),
                _num(lat.p99 if lat else None),
                _num(c.throughput),
                _num(c.first_call_ms),
                _num(c.prepare_s),
                sci(c.max_rel_err),
                str(lat.n) if lat else "-",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    cached = " (from the tuning cache: measured earlier, not in this call)"
    lines = [
        f"infertune report: {report.model}{cached if report.from_cache else ''}",
        f"inputs: {report.signature}   batch: {report.batch_size}   objective: {report.objective}"
        f"   tolerance: rtol={report.rtol:g} atol={report.atol:g}",
        "",
    ]
    for i, row in enumerate(rows):
        cells = [
            cell.ljust(w) if j < 2 else cell.rjust(w)
            for j, (cell, w) in enumerate(zip(row, widths))
        ]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("")
    if report.memory and report.memory.get("peak_bytes"):
        lines.append(memory_line(report.memory))
    lines.extend(_reason_lines(report, hidden))
    lines.extend(_precision_lines(report))
    for clause, names in grouped.items():
        lines.append(
            f"  unavailable here ({len(names)}): {', '.join(names)}: {clause} (each one's "
            f"whole reason: report.to_dict(), or verbose=True)"
        )
    lines.extend(_batch_table(report))
    lines.extend(traffic_lines(report.traffic))
    lines.append("")
    lines.append(f"selected: {report.selected} ({report.selection_reason})")
    if report.general_backend:
        lines.append(f"every other shape: {report.general_backend} ({report.general_reason})")
    lines.extend(batch_lines(report))
    for note in report.notes:
        lines.append(f"note: {note}")
    lines.append(f"optimize() took {report.total_s:.1f} s")
    if report.stages is not None:
        lines.extend("  " + line for line in report.stages.summary().splitlines())
    if report.diagnosis is not None:
        lines.extend(["", str(report.diagnosis)])
    return "\n".join(lines)


def _precision_lines(report: Report) -> list[str]:
    """What each reduced-precision candidate the gate judged kept of the task (or of its
    agreement with the model), and the rule."""
    judged = [c for c in report.candidates if c.gate]
    if not judged:
        return []
    lines = [f"  reduced precision, judged by {judged[0].gate}:"]
    for c in judged:
        if c.metric is not None:
            words = (
                f"{c.metric:.4g} against the model's {c.reference_metric:.4g}: drop "
                f"{c.metric_drop:.4g}, at most {c.metric_drop_bound:.4g} (max_drop "
                f"{c.max_drop:g})"
            )
        else:
            words = c.reason if c.status != "mismatch" else c.reason.split(" (")[0]
        if c.quantization:
            words += f"; {c.quantization}"
        for kept in c.kept_fp32 or []:
            words += f"; kept {kept['layer']} in float32: p50 {kept['p50_ms']:.4g} ms"
        lines.append(f"    {c.name} ({c.status}): {words}")
    return lines


def _unavailable_groups(report: Report) -> dict[str, list[str]]:
    """{first clause of the reason: names} for candidates unavailable for the same first
    reason (the GPU candidates on a machine without a GPU): one line in the table's
    place instead of one row and one reason each."""
    groups: dict[str, list[str]] = {}
    for c in report.candidates:
        if c.status == "unavailable" and c.reason:
            groups.setdefault(c.reason.split("; ")[0], []).append(c.name)
    return {clause: names for clause, names in groups.items() if len(names) > 1}


def _reason_lines(report: Report, hidden: set[str]) -> list[str]:
    """Why each candidate has its status, a clause that several candidates' reasons share
    said once for all of them, after theirs."""
    clauses = {
        c.name: [part for part in (c.exact_words, *c.reason.split("; ")) if part]
        for c in report.candidates
        if c.name not in hidden
    }
    counts = Counter(clause for parts in clauses.values() for clause in set(parts))
    shared = [clause for clause, n in counts.items() if n > 1]
    lines = []
    for name, parts in clauses.items():
        own = [part for part in parts if part not in shared]
        if own:
            lines.append(f"  {name}: {'; '.join(own)}")
    for clause in shared:
        names = [name for name, parts in clauses.items() if clause in parts]
        lines.append(f"  {', '.join(names)}: {clause}")
    return lines


def _batch_table(report: Report) -> list[str]:
    """Batch size x candidate (p50, p90, p99, samples/s), the choice starred, with why
    each choice was made; nothing where one batch size was tuned."""
    if len(report.batches) < 2:
        return []
    header = ("batch", "candidate", "p50 ms", "p90 ms", "p99 ms", "samples/s")
    rows = [header]
    for b in report.batches:
        for name, s in sorted(b.latency.items(), key=lambda item: item[1].p50):
            star = "* " if name == b.selected else "  "
            rows.append(
                (str(b.batch_size), star + name, _num(s.p50), _num(s.p90), _num(s.p99),
                 _num(b.samples_per_s(name)))
            )  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["", "per batch size (* = chosen there):"]
    for i, row in enumerate(rows):
        cells = [c.ljust(w) if j < 2 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths))]
        lines.append("  " + "  ".join(cells).rstrip())
        if i == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    lines.extend(f"  batch {b.batch_size}: {b.selected} ({b.reason})" for b in report.batches)
    if report.traffic is not None:
        lines.append(
            "  (with traffic=, the other batch sizes time only the fastest few at the sample's)"
        )
    return lines


def batch_lines(report: Report) -> list[str]:
    """Lines on the choice per batch size and the latency budget; none for one batch size
    without a budget."""
    lines = []
    if len(report.batches) > 1:
        lines.append(
            "choice per batch size: "
            + ", ".join(f"{b.batch_size}: {b.selected}" for b in report.batches)
        )
    if report.latency_budget_ms is not None:
        lines.append(_budget_line(report))
    return lines


def _budget_line(report: Report) -> str:
    budget = report.latency_budget_ms
    pairs = [(b, name, s) for b in report.batch_results() for name, s in b.latency.items()]
    within = [(b, name, s) for b, name, s in pairs if s.p99 <= budget]
    if not within:
        b, name, s = min(pairs, key=lambda t: t[2].p99)
        return (
            f"latency budget {budget:g} ms: met by no batch size and candidate; the lowest "
            f"p99 was {s.p99:.4g} ms ({name} at batch {b.batch_size})"
        )
    b, name, s = max(within, key=lambda t: t[0].samples_per_s(t[1]))
    return (
        f"latency budget {budget:g} ms: largest batch size within it "
        f"{report.max_batch_size_within_budget}; most samples/s within it: {name} at batch "
        f"{b.batch_size} ({b.samples_per_s(name):,.0f} samples/s, p99 {s.p99:.4g} ms)"
    )


def exact_shapes_words(candidate: CandidateResult) -> str:
    """'serves only the sample's shapes ... (why)', or '' for a candidate of any shape."""
    if candidate.exact_shapes is None:
        return ""
    shapes = _shapes(candidate.exact_shapes)
    return f"serves only the sample's shapes {shapes} ({candidate.exact_reason})"


def memory_line(memory: dict) -> str:
    """The report's line on memory: the peak, what was held before, against the weights."""
    gb = 1e9
    peak, before = memory["peak_bytes"], memory.get("before_bytes") or 0
    line = (
        f"memory: peak {peak / gb:.2f} GB resident (this process and its children), "
        f"{before / gb:.2f} GB before tuning"
    )
    weights = memory.get("weights_bytes")
    if weights:
        line += f"; {(peak - before) / weights:.1f}x the weights' {weights / gb:.2f} GB above that"
        # (a conversion that reuses another's result holds next to nothing: not said)
        conversions = [
            f"{stage} {above / weights:.1f}x"
            for stage, above in (memory.get("conversions_bytes") or {}).items()
            if above >= 0.05 * weights
        ]
        if conversions:
            line += f" (conversions at their peaks: {', '.join(conversions)})"
    return line


def diagnosis_text(diagnosis: Diagnosis) -> str:
    """The diagnosis in plain words (`str(diagnosis)`)."""
    ref = diagnosis.reference
    lines = [f"diagnosis: {diagnosis.model}, batch {diagnosis.batch_size}"]
    if diagnosis.flops is not None and diagnosis.peak_gflops:
        lines.append(
            f"  work: {diagnosis.flops / 1e6:,.2f} MFLOP per call ({diagnosis.flops_note}); this "
            f"machine's measured float32 rate: {diagnosis.peak_gflops:,.0f} GFLOP/s"
        )
    else:
        lines.append(f"  work: unknown ({diagnosis.flops_note})")
    for p in diagnosis.paths:
        rate = (
            f"{p.gflops:,.2f} GFLOP/s = {p.share_of_peak:.1%} of peak ({p.bound})"
            if p.gflops is not None
            else "rate unknown"
        )
        first = "-" if p.first_call_ms is None else f"{p.first_call_ms:,.1f} ms"
        steady = "-" if p.p50_ms is None else f"{p.p50_ms:,.4g} ms"
        lines.append(f"  {p.name:<26} first call {first:>10}   steady {steady:>10}   {rate}")
    if diagnosis.model_call_ms is not None and diagnosis.predict_ms is not None:
        lines.append(
            f"  model.predict(x): {diagnosis.predict_ms:,.2f} ms per call vs model(x) "
            f"{diagnosis.model_call_ms:,.3f} ms "
            f"({diagnosis.predict_ms / diagnosis.model_call_ms:,.1f}x)"
        )
    if diagnosis.retracing is not None:
        r = diagnosis.retracing
        lines.append(
            f"  retracing: a plain tf.function traced {r.traces_plain} times over batch sizes "
            f"{r.batch_sizes} ({r.trace_ms_plain:,.0f} ms of tracing, vs {r.steady_ms:.3f} ms "
            f"per traced call); with a None batch dimension in input_signature: "
            f"{r.traces_with_signature} trace"
        )
    lines.append(f"  threads: {_words(diagnosis.threads)}")
    lines.append(f"  CPU features: {', '.join(diagnosis.cpu_features) or 'none detected'}")
    lines.append(f"  GPU: {diagnosis.gpu}")
    lines.append(f"  verdict: model(x) is {diagnosis.verdict} ({_share(ref)} of peak)")
    for i, line in enumerate(diagnosis.advice, 1):
        lines.append(f"  {i}. {line}")
    return "\n".join(lines)


def _share(path: PathRate) -> str:
    return "unknown share" if path.share_of_peak is None else f"{path.share_of_peak:.2%}"


def _words(values: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())


def _shapes(shapes: list) -> str:
    """[[2, 25, 4]] -> (2, 25, 4); several inputs' shapes joined by commas."""
    return ", ".join("(" + ", ".join(map(str, shape)) + ")" for shape in shapes)


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}" if value >= 0.01 else f"{value:.4f}"
