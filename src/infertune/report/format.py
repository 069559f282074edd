"""Small formatting helpers the report's renderings share (text.py, html.py, html_charts.py):
functions of numbers and text only, so that any renderer can import them."""

from __future__ import annotations

import html
import math

__all__ = ["escape", "finite", "sci", "sig4"]


def escape(text: object) -> str:
    """`text` for HTML, quotes included (attribute values)."""
    return html.escape(str(text), quote=True)


def sig4(value: float | None) -> str:
    """A number as the page writes it: four significant digits, '-' for none."""
    if value is None:
        return "-"
    return f"{value:.4g}"


def sci(value: float | None) -> str:
    """A relative error: one digit and the exponent, '-' for none."""
    return "-" if value is None else f"{value:.1e}"


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value)
