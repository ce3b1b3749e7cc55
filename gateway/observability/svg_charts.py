"""SVG primitives the HTML report draws its charts with: a chart, a grid, a bar, a label, round ticks, short labels."""

from __future__ import annotations

import time
from html import escape

MUTED, GRID = "#64748b", "#e2e8f0"


def svg(width: float, height: float, content: str, label: str) -> str:
    return (
        f'<svg width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" role="img" '
        f'aria-label="{escape(label)}">{content}</svg>'
    )


def y_grid(left: float, top: float, width: float, height: float, ticks: list[tuple[float, str]]) -> str:
    lines = []
    for fraction, label in ticks:
        y = top + height - fraction * height
        lines.append(f'<line x1="{left}" x2="{left + width:.1f}" y1="{y:.1f}" y2="{y:.1f}" stroke="{GRID}"/>')
        lines.append(text(left - 6, y + 4, label, anchor="end"))
    return "".join(lines)


def rect(x: float, y: float, width: float, height: float, color: str) -> str:
    if height <= 0 or width <= 0:
        return ""
    return (
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="{height:.1f}" rx="1.5" fill="{color}"/>'
    )


def text(
    x: float,
    y: float,
    text: str,
    anchor: str = "start",
    color: str = MUTED,
    weight: int = 400,
    size: int = 11,
    mono: bool = False,
) -> str:
    family = ' style="font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace"' if mono else ""
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="{color}" font-size="{size}" '
        f'font-weight="{weight}"{family}>{escape(text)}</text>'
    )


def nice_ticks(peak: float) -> list[float]:
    """Four or five round steps from 0 to at least `peak`."""
    step = 1.0
    while peak / step > 5:
        for factor in (2, 2.5, 2):
            step *= factor
            if peak / step <= 5:
                break
    return [step * index for index in range(int(-(-peak // step)) + 1)]


def hhmm(epoch_s: float) -> str:
    return time.strftime("%H:%M", time.gmtime(epoch_s))


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"
