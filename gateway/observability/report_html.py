"""The hit-rate report as one self-contained HTML page: inline CSS and inline SVG charts drawn here.

Nothing is loaded from anywhere (no scripts, fonts or images by URL), so the page opens offline and
can be mailed around. Sections: headline numbers, hit rate over the last hour by layer, best-candidate
similarity with the rule's threshold, top scopes by hits, tokens and time saved, hit rates by tenant
and model, the engine's prefix-cache token hit rate, the hits reported wrong or right (when any were).
Reads the `/admin/stats` JSON, nothing else.
"""

from __future__ import annotations

import time
from html import escape
from typing import Any

from gateway.observability.report import (
    WINDOWS,
    count,
    duration,
    feedback_rows,
    near_misses,
    percent,
    shadow_line,
)
from gateway.observability.svg_charts import GRID, MUTED, clip, hhmm, nice_ticks, rect, svg, text, y_grid

EXACT, SEMANTIC, MISS, BYPASS = "#2563eb", "#14b8a6", "#cbd5e1", "#c4b5fd"
SIM_HIT, SIM_MISS, THRESHOLD = "#14b8a6", "#f59e0b", "#dc2626"
INK = "#0f172a"
WIDTH = 1136  # the content width in CSS pixels; every chart is drawn to it

CSS = f"""
*{{box-sizing:border-box}}
body{{margin:0;background:#f1f5f9;color:{INK};font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,
"Helvetica Neue",Arial,sans-serif}}
main{{max-width:{WIDTH + 64}px;margin:0 auto;padding:28px 32px 40px}}
header h1{{font-size:24px;margin:0 0 4px}} header p{{margin:0;color:{MUTED}}}
.kpis{{display:grid;grid-template-columns:repeat(5,1fr);gap:14px;margin:20px 0}}
.card{{background:#fff;border-radius:12px;box-shadow:0 1px 3px rgba(15,23,42,.08);padding:16px 18px}}
.kpi .label{{color:{MUTED};font-size:12px;text-transform:uppercase;letter-spacing:.06em}}
.kpi .value{{font-size:28px;font-weight:650;margin:2px 0}} .kpi .sub{{color:{MUTED};font-size:12.5px}}
section.card{{margin-bottom:16px}} h2{{font-size:16px;margin:0 0 2px}}
.note{{color:{MUTED};font-size:12.5px;margin:0 0 10px}}
.row{{display:grid;grid-template-columns:1fr 1fr;gap:16px;margin-bottom:16px}} .row section.card{{margin-bottom:0}}
table{{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}}
th,td{{padding:5px 8px;text-align:right;border-bottom:1px solid {GRID};white-space:nowrap}}
th{{color:{MUTED};font-weight:600;font-size:12px}} th:first-child,td:first-child{{text-align:left}}
tr.overall td{{font-weight:650}} .legend span{{margin-right:14px;font-size:12.5px;color:{MUTED}}}
.swatch{{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:5px;vertical-align:-1px}}
svg text{{font-family:inherit}} .empty{{color:{MUTED};padding:24px 0;text-align:center}}
"""


def render_html(
    stats: dict[str, Any], source: str, tenant: str | None = None, now: float | None = None
) -> str:
    """The page for one `/admin/stats` answer; `source` names the gateway (shown as given, minus scheme)."""
    now = time.time() if now is None else now
    where = source.split("://", 1)[-1]
    subtitle = f"{where}{' · tenant ' + tenant if tenant else ''} · up {duration(stats['uptime_s'])}"
    subtitle += f" · generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(now))}"
    body = [
        f"<header><h1>kvgate hit-rate report</h1><p>{escape(subtitle)}</p></header>",
        _kpis(stats),
        _card(
            "Hit rate over the last hour, by layer",
            "Per minute, share of requests answered by each layer; bars below: requests per minute.",
            _timeline_chart(stats["timeline"]),
        ),
        '<div class="row">',
        _card("Best-candidate similarity", _similarity_note(stats), _similarity_chart(stats)),
        _card(
            "Top scopes by hits",
            "Since start; a scope is tenant + model + sampling parameters "
            "(shown by its id's first characters).",
            _top_scopes(stats.get("top_scopes", [])),
        ),
        "</div>",
        '<div class="row">',
        _card(
            "Tokens and engine time saved",
            "Prompt + completion tokens served from the cache, and the "
            "generation time those answers originally took.",
            _saved_chart(stats),
        ),
        _card(
            "Engine prefix-cache token hit rate",
            "Prompt tokens whose KV was reused from the engine's "
            "prefix cache (misses that reached the engine).",
            _prefix_chart(stats.get("prefix_cache")),
        ),
        "</div>",
        _shadow_card(stats.get("shadow")),
        _feedback_card(stats),
        _card(
            "Hit rates by tenant and model",
            "Requests each layer answered, and what the hits saved.",
            _tally_tables(stats),
        ),
    ]
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>kvgate hit-rate report</title><style>{CSS}</style></head>"
        f"<body><main>{''.join(body)}</main></body></html>\n"
    )


def _kpis(stats: dict[str, Any]) -> str:
    overall, hour = stats["since_start"]["overall"], stats["last_hour"]["overall"]
    prefix = stats.get("prefix_cache")
    cards = [
        (
            "Hit rate",
            percent(overall["hit_rate"]),
            f"exact {percent(overall['exact_hit_rate'])} · semantic {percent(overall['semantic_hit_rate'])}",
        ),
        ("Requests", count(overall["requests"]), f"{count(hour['requests'])} in the last hour"),
        ("Tokens saved", count(overall["tokens_saved"]), f"{count(hour['tokens_saved'])} in the last hour"),
        (
            "Engine time saved",
            duration(overall["seconds_saved"]),
            f"{duration(hour['seconds_saved'])} in the last hour",
        ),
        (
            "Prefix-cache tokens",
            percent(prefix["hit_rate"]) if prefix else "n/a",
            f"{count(prefix['hit_tokens'])} of {count(prefix['query_tokens'])} reused"
            if prefix
            else "backend is not the in-process engine",
        ),
    ]
    items = "".join(
        f'<div class="card kpi"><div class="label">{escape(label)}</div><div class="value">{escape(value)}'
        f'</div><div class="sub">{escape(sub)}</div></div>'
        for label, value, sub in cards
    )
    return f'<div class="kpis">{items}</div>'


def _timeline_chart(timeline: list[dict[str, Any]]) -> str:
    if not timeline:
        return '<div class="empty">No requests in the last hour.</div>'
    width, left, top, plot_h, gap, volume_h = WIDTH - 36, 46, 10, 180, 30, 56
    plot_w = width - left - 8
    first = min(point["minute"] for point in timeline)
    last = max(point["minute"] for point in timeline)
    first = min(first, last - 59 * 60)  # always an hour wide, so a quiet start does not stretch the bars
    slot = plot_w / ((last - first) / 60 + 1)
    peak = max(point["requests"] for point in timeline) or 1
    parts = [
        y_grid(
            left, top, plot_w, plot_h, [(fraction, f"{fraction:.0%}") for fraction in (0, 0.25, 0.5, 0.75, 1)]
        )
    ]
    volume_top = top + plot_h + gap
    for point in timeline:
        x = left + (point["minute"] - first) / 60 * slot + slot * 0.1
        bar_w = max(slot * 0.8, 1.0)
        exact_h, semantic_h = point["exact_hit_rate"] * plot_h, point["semantic_hit_rate"] * plot_h
        tip = (
            f"{hhmm(point['minute'])}: {point['requests']} requests, exact {percent(point['exact_hit_rate'])},"
            f" semantic {percent(point['semantic_hit_rate'])}"
        )
        parts.append(f"<g><title>{escape(tip)}</title>")
        parts.append(rect(x, top + plot_h - exact_h, bar_w, exact_h, EXACT))
        parts.append(rect(x, top + plot_h - exact_h - semantic_h, bar_w, semantic_h, SEMANTIC))
        volume = point["requests"] / peak * volume_h
        parts.append(rect(x, volume_top + volume_h - volume, bar_w, volume, "#94a3b8") + "</g>")
    parts.append(text(left - 6, volume_top + 10, count(peak), anchor="end"))
    parts.append(text(left - 6, volume_top + volume_h, "0", anchor="end"))
    parts.append(
        f'<line x1="{left}" x2="{left + plot_w}" y1="{volume_top + volume_h}" '
        f'y2="{volume_top + volume_h}" stroke="{GRID}"/>'
    )
    for minute in range(first - first % 600 + 600, last + 1, 600):  # a label every ten minutes
        x = left + (minute - first) / 60 * slot + slot / 2
        parts.append(text(x, volume_top + volume_h + 16, hhmm(minute), anchor="middle"))
    height = volume_top + volume_h + 24
    legend = _legend([("exact hit", EXACT), ("semantic hit", SEMANTIC), ("requests / min", "#94a3b8")])
    return legend + svg(width, height, "".join(parts), "hit rate over time by layer")


def _similarity_note(stats: dict[str, Any]) -> str:
    rule, similarity = stats.get("rule") or {}, stats.get("similarity")
    threshold = rule.get("threshold")
    note = "Cosine of the nearest stored prompt, for semantic hits and for misses (all tenants)."
    if threshold is not None and similarity:
        note += (
            f" Rule {rule['name']} ({rule['threshold_kind']} {threshold:.2f}); "
            f"{near_misses(similarity, threshold)} misses within 0.05 below it."
        )
    if rule.get("target_false_hit_rate") is not None:
        note += f" Target false-hit rate {percent(rule['target_false_hit_rate'])}."
    return note


def _similarity_chart(stats: dict[str, Any]) -> str:
    similarity, threshold = stats.get("similarity"), (stats.get("rule") or {}).get("threshold")
    if not similarity or not (sum(similarity["hit"]) + sum(similarity["miss"])):
        return '<div class="empty">No semantic lookups with a candidate yet.</div>'
    rows = [
        (bound, hit, miss)
        for bound, hit, miss in zip(similarity["buckets"], similarity["hit"], similarity["miss"], strict=True)
        if bound is not None
    ]
    width, left, top, plot_h = (WIDTH - 16) // 2 - 36, 40, 10, 300
    plot_w = width - left - 8
    low, high = rows[0][0] - 0.025, 1.0
    scale = plot_w / (high - low)
    peak = max(max(hit, miss) for _, hit, miss in rows) or 1
    ticks = nice_ticks(peak)
    parts = [y_grid(left, top, plot_w, plot_h, [(tick / ticks[-1], count(tick)) for tick in ticks])]
    for bound, hit, miss in rows:
        x = left + (bound - 0.025 - low) * scale
        bar_w = 0.025 * scale / 2 - 1
        for offset, value, color, label in (
            (0.5, miss, SIM_MISS, "misses"),
            (bar_w + 1.5, hit, SIM_HIT, "hits"),
        ):
            height = value / ticks[-1] * plot_h
            tip = f"{bound - 0.025:.3f}–{bound:.3f}: {value} {label}"
            parts.append(
                f"<g><title>{escape(tip)}</title>{rect(x + offset, top + plot_h - height, bar_w, height, color)}</g>"
            )
    for tick in (0.5, 0.6, 0.7, 0.8, 0.9, 1.0):
        if tick >= low:
            parts.append(text(left + (tick - low) * scale, top + plot_h + 16, f"{tick:.1f}", anchor="middle"))
    if threshold is not None and low <= threshold <= high:
        x = left + (threshold - low) * scale
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top - 4}" y2="{top + plot_h}" stroke="{THRESHOLD}" '
            'stroke-width="2" stroke-dasharray="5 3"/>'
        )
        parts.append(
            text(x - 5, top + 10, f"threshold {threshold:.2f}", anchor="end", color=THRESHOLD, weight=600)
        )
    legend = _legend([("semantic hit", SIM_HIT), ("miss", SIM_MISS), ("threshold", THRESHOLD)])
    return legend + svg(width, top + plot_h + 24, "".join(parts), "similarity histogram")


def _top_scopes(scopes: list[dict[str, Any]]) -> str:
    if not scopes:
        return '<div class="empty">No hits yet.</div>'
    width, label_w, row_h = (WIDTH - 16) // 2 - 36, 305, 20
    bar_room = width - label_w - 50
    peak = max(scope["hits"] for scope in scopes) or 1
    parts = []
    for index, scope in enumerate(scopes):
        y = index * row_h
        label = f"{scope['tenant']} · {scope['model']}"
        parts.append(text(0, y + 14, clip(label, 34), color=INK))
        parts.append(text(label_w - 92, y + 14, scope["scope"], mono=True))
        exact_w = scope["exact_hit"] / peak * bar_room
        semantic_w = scope["semantic_hit"] / peak * bar_room
        tip = f"{label} · scope {scope['scope']}: {scope['hits']} hits ({scope['exact_hit']} exact, {scope['semantic_hit']} semantic)"
        parts.append(
            f"<g><title>{escape(tip)}</title>{rect(label_w, y + 4, exact_w, 13, EXACT)}"
            f"{rect(label_w + exact_w, y + 4, semantic_w, 13, SEMANTIC)}</g>"
        )
        parts.append(text(label_w + exact_w + semantic_w + 6, y + 15, count(scope["hits"]), color=INK))
    legend = _legend([("exact", EXACT), ("semantic", SEMANTIC)])
    return legend + svg(width, len(scopes) * row_h + 4, "".join(parts), "top scopes by hits")


def _tally_tables(stats: dict[str, Any]) -> str:
    head = (
        "<tr><th></th><th>requests</th><th>exact</th><th>semantic</th><th>miss</th><th>bypass</th>"
        "<th>hit rate (exact + semantic)</th><th>tokens saved</th><th>time saved</th></tr>"
    )
    html = []
    for key, title in WINDOWS:
        section = stats[key]
        rows = [("overall", section["overall"])]
        rows += [(f"tenant {name}", tally) for name, tally in section["by_tenant"].items()]
        rows += [(f"model {name}", tally) for name, tally in section["by_model"].items()]
        rows += [(f"route {name}", tally) for name, tally in section.get("by_route", {}).items()]
        rows += [(f"language {name}", tally) for name, tally in section.get("by_language", {}).items()]
        cells = "".join(
            f"<tr{' class=overall' if label == 'overall' else ''}><td>{escape(label)}</td>"
            f"<td>{count(tally['requests'])}</td><td>{count(tally['exact_hit'])}</td>"
            f"<td>{count(tally['semantic_hit'])}</td><td>{count(tally['miss'])}</td>"
            f"<td>{count(tally['bypass'])}</td><td>{_rate_bar(tally)}</td>"
            f"<td>{count(tally['tokens_saved'])}</td><td>{duration(tally['seconds_saved'])}</td></tr>"
            for label, tally in rows
        )
        html.append(
            f'<h2 style="font-size:13px;color:{MUTED};margin:10px 0 4px">{title}</h2>'
            f"<table>{head}{cells}</table>"
        )
    return "".join(html)


def _saved_chart(stats: dict[str, Any]) -> str:
    tenants = stats["since_start"]["by_tenant"]
    if not tenants:
        return '<div class="empty">Nothing saved yet.</div>'
    width, label_w, row_h = (WIDTH - 16) // 2 - 36, 110, 44
    bar_room = width - label_w - 110
    peak_tokens = max(tally["tokens_saved"] for tally in tenants.values()) or 1
    peak_seconds = max(tally["seconds_saved"] for tally in tenants.values()) or 1
    parts = []
    for index, (name, tally) in enumerate(tenants.items()):
        y = index * row_h
        parts.append(text(0, y + 24, clip(name, 14), color=INK, weight=600))
        tokens_w = tally["tokens_saved"] / peak_tokens * bar_room
        seconds_w = tally["seconds_saved"] / peak_seconds * bar_room
        parts.append(rect(label_w, y + 4, tokens_w, 15, EXACT))
        parts.append(
            text(label_w + tokens_w + 6, y + 16, f"{count(tally['tokens_saved'])} tokens", color=INK)
        )
        parts.append(rect(label_w, y + 22, seconds_w, 15, SEMANTIC))
        parts.append(text(label_w + seconds_w + 6, y + 34, duration(tally["seconds_saved"]), color=INK))
    legend = _legend([("tokens saved", EXACT), ("engine time saved", SEMANTIC)])
    return legend + svg(width, len(tenants) * row_h, "".join(parts), "tokens and time saved by tenant")


def _prefix_chart(prefix: dict[str, Any] | None) -> str:
    if prefix is None:
        return '<div class="empty">Not available: the backend is not kvgate\'s in-process engine.</div>'
    radius, stroke, size = 70, 22, 190
    circumference = 2 * 3.14159265 * radius
    filled = prefix["hit_rate"] * circumference
    center = size / 2
    ring = (
        f'<circle cx="{center}" cy="{center}" r="{radius}" fill="none" stroke="{GRID}" stroke-width="{stroke}"/>'
        f'<circle cx="{center}" cy="{center}" r="{radius}" fill="none" stroke="{EXACT}" stroke-width="{stroke}" '
        f'stroke-dasharray="{filled:.1f} {circumference:.1f}" transform="rotate(-90 {center} {center})"/>'
        + text(
            center, center + 8, percent(prefix["hit_rate"]), anchor="middle", color=INK, weight=700, size=24
        )
    )
    facts = (
        f'<div style="align-self:center"><div style="font-size:22px;font-weight:650">'
        f"{count(prefix['hit_tokens'])}</div><div class=note>prompt tokens reused</div>"
        f'<div style="font-size:22px;font-weight:650">{count(prefix["query_tokens"])}</div>'
        "<div class=note>prompt tokens looked up</div></div>"
    )
    return (
        f'<div style="display:flex;gap:28px;align-items:center">'
        f"{svg(size, size, ring, 'prefix-cache token hit rate')}{facts}</div>"
    )


def _shadow_card(shadow: dict[str, Any] | None) -> str:
    if not shadow or not shadow.get("enabled"):
        return ""
    return _card(
        "Shadow mode", "Semantic hits found but answered by the backend, for tuning.", shadow_line(shadow)
    )


def _feedback_card(stats: dict[str, Any]) -> str:
    rows = feedback_rows(stats)
    if not rows:
        return ""
    head = "<tr><th></th><th>wrong</th><th>right</th><th>wrong, last hour</th><th>right, last hour</th></tr>"
    cells = "".join(
        f"<tr{' class=overall' if label == 'overall' else ''}><td>{escape(label)}</td>"
        + "".join(f"<td>{count(value)}</td>" for value in counts)
        + "</tr>"
        for label, counts in rows
    )
    return _card(
        "Semantic hits reported",
        "Reports through /admin/feedback since start; a hit reported wrong is never served to that wording "
        "again.",
        f"<table>{head}{cells}</table>",
    )


def _card(title: str, note: str, content: str) -> str:
    return (
        f'<section class="card"><h2>{escape(title)}</h2><p class="note">{escape(note)}</p>{content}</section>'
    )


def _legend(items: list[tuple[str, str]]) -> str:
    spans = "".join(
        f'<span><i class="swatch" style="background:{color}"></i>{escape(label)}</span>'
        for label, color in items
    )
    return f'<div class="legend">{spans}</div>'


def _rate_bar(tally: dict[str, Any]) -> str:
    exact, semantic = 100 * tally["exact_hit_rate"], 100 * tally["semantic_hit_rate"]
    return (
        f'<span style="display:inline-flex;width:90px;height:8px;background:{GRID};border-radius:4px;'
        f'overflow:hidden;margin-right:8px;vertical-align:0"><span style="width:{exact:.1f}%;'
        f'background:{EXACT}"></span><span style="width:{semantic:.1f}%;background:{SEMANTIC}"></span></span>'
        f"{percent(tally['hit_rate'])}"
    )
