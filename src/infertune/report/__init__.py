"""What a run says: the report's values (data.py), their text (text.py) and HTML (html.py,
its charts in html_charts.py) renderings, the comparison of two reports (report/compare.py),
where the time went (report/stages.py) and the progress lines on stderr (report/progress.py)."""

from .data import (
    STATUSES,
    BatchResult,
    CandidateResult,
    Diagnosis,
    PathRate,
    Report,
    Retracing,
)
from .text import memory_line

__all__ = [
    "STATUSES",
    "BatchResult",
    "CandidateResult",
    "Diagnosis",
    "PathRate",
    "Report",
    "Retracing",
    "memory_line",
]
