"""`kvgate report`: read `/admin/stats` from a running gateway and print the hit-rate report as tables.

    fetch_stats(url, token)  ->  the JSON `/admin/stats` returns (see `gateway/observability/stats.py`,
                                 `gateway/observability/report_stats.py`)
    print_report(stats)      ->  rich tables: hit rates by layer (overall, per tenant, per model; since
                                 start and last hour), tokens and time saved, top scopes, similarity
                                 around the threshold, the engine's prefix-cache token hit rate, the
                                 hits reported wrong or right (`/admin/feedback`), when there are any,
                                 and each backend of a fleet (state, load, errors, reused tokens)

The HTML page is `gateway/observability/report_html.py`; both share the number formatting below. Knows the stats
JSON and HTTP, nothing about how the gateway computes them.
"""

from __future__ import annotations

from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

LOCAL_HOSTS = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "": "127.0.0.1"}  # bound to all -> reach over loopback
WINDOWS = (("since_start", "Since start"), ("last_hour", "Last hour"))


class ReportError(Exception):
    """The gateway could not be read (unreachable, refused the token, or answered something else)."""


def default_url(host: str, port: int) -> str:
    return f"http://{LOCAL_HOSTS.get(host, host)}:{port}"


def fetch_stats(
    url: str, token: str | None, tenant: str | None = None, timeout_s: float = 10.0
) -> dict[str, Any]:
    """GET `{url}/admin/stats` with the admin token; raises `ReportError` with a reason a person can act on."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    params = {"tenant": tenant} if tenant else {}
    try:
        response = httpx.get(
            f"{url.rstrip('/')}/admin/stats", headers=headers, params=params, timeout=timeout_s
        )
    except httpx.HTTPError as error:
        raise ReportError(f"could not reach the gateway at {url}: {error}") from error
    if response.status_code in (401, 403):
        hint = (
            "run it where the gateway runs (it reads <KVGATE_DATA_DIR>/admin_token) or set KVGATE_ADMIN_TOKEN"
            if not token
            else "check KVGATE_ADMIN_TOKEN (or the gateway's <KVGATE_DATA_DIR>/admin_token)"
        )
        raise ReportError(f"{url} refused the admin token ({response.status_code}); {hint}")
    if response.status_code != 200:
        raise ReportError(f"{url}/admin/stats answered {response.status_code}: {response.text[:200]}")
    body: dict[str, Any] = response.json()
    return body


def print_report(stats: dict[str, Any], console: Console, source: str, tenant: str | None = None) -> None:
    """The whole report as rich tables on `console`."""
    scope = f" · tenant {tenant}" if tenant else ""
    console.print(f"[bold]kvgate hit-rate report[/bold] · {source}{scope} · up {duration(stats['uptime_s'])}")
    for key, title in WINDOWS:
        console.print(tally_table(stats[key], title))
    if feedback_rows(stats):
        console.print(feedback_table(stats))
    if stats.get("top_scopes"):
        console.print(top_scopes_table(stats["top_scopes"]))
    console.print(similarity_line(stats.get("similarity"), stats.get("rule")))
    console.print(prefix_cache_line(stats.get("prefix_cache")))
    if stats.get("shadow", {}).get("enabled"):
        console.print(shadow_line(stats["shadow"]))
    if stats.get("backends"):
        console.print(backends_table(stats["backends"]))


def tally_table(section: dict[str, Any], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    table.add_column("")
    for column in ("requests", "exact", "semantic", "miss", "bypass", "hit rate", "exact %", "semantic %"):
        table.add_column(column, justify="right")
    table.add_column("tokens saved", justify="right")
    table.add_column("time saved", justify="right")
    rows = [("overall", section["overall"])]
    rows += [(f"tenant {name}", tally) for name, tally in section["by_tenant"].items()]
    rows += [(f"model {name}", tally) for name, tally in section["by_model"].items()]
    rows += [(f"route {name}", tally) for name, tally in section.get("by_route", {}).items()]
    rows += [(f"language {name}", tally) for name, tally in section.get("by_language", {}).items()]
    for label, tally in rows:
        table.add_row(
            f"[bold]{label}[/bold]" if label == "overall" else label,
            str(tally["requests"]),
            str(tally["exact_hit"]),
            str(tally["semantic_hit"]),
            str(tally["miss"]),
            str(tally["bypass"]),
            percent(tally["hit_rate"]),
            percent(tally["exact_hit_rate"]),
            percent(tally["semantic_hit_rate"]),
            count(tally["tokens_saved"]),
            duration(tally["seconds_saved"]),
        )
    return table


def feedback_rows(stats: dict[str, Any]) -> list[tuple[str, list[int]]]:
    """Reported hits, overall and per tenant that has any: (label, [wrong, right] since start, then in the
    last hour); empty when nothing was reported since start."""
    since_start, last_hour = stats["since_start"], stats["last_hour"]
    if not any(_reported(since_start["overall"])):
        return []
    rows = [("overall", _reported(since_start["overall"]) + _reported(last_hour["overall"]))]
    for name, tally in since_start["by_tenant"].items():
        if any(_reported(tally)):
            hour = last_hour["by_tenant"].get(name, {})
            rows.append((f"tenant {name}", _reported(tally) + _reported(hour)))
    return rows


def feedback_table(stats: dict[str, Any]) -> Table:
    table = Table(title="Semantic hits reported (/admin/feedback)", title_justify="left")
    table.add_column("")
    for column in ("wrong", "right", "wrong, last hour", "right, last hour"):
        table.add_column(column, justify="right")
    for label, counts in feedback_rows(stats):
        table.add_row(f"[bold]{label}[/bold]" if label == "overall" else label, *(str(n) for n in counts))
    return table


def top_scopes_table(scopes: list[dict[str, Any]]) -> Table:
    table = Table(title="Top scopes by hits (since start)", title_justify="left")
    for column in ("tenant", "model", "scope"):
        table.add_column(column)
    for column in ("hits", "exact", "semantic"):
        table.add_column(column, justify="right")
    for scope in scopes:
        table.add_row(
            scope["tenant"],
            scope["model"],
            scope["scope"],
            str(scope["hits"]),
            str(scope["exact_hit"]),
            str(scope["semantic_hit"]),
        )
    return table


def similarity_line(similarity: dict[str, Any] | None, rule: dict[str, Any] | None) -> str:
    """Semantic hits and misses judged, and the near misses: misses within 0.05 below the threshold."""
    if not similarity:
        return "Best-candidate similarity: not reported"
    hits, misses = sum(similarity["hit"]), sum(similarity["miss"])
    threshold = rule.get("threshold") if rule else None
    line = f"Best-candidate similarity: {hits} semantic hits, {misses} misses with a candidate"
    if threshold is not None and rule is not None:
        near = near_misses(similarity, threshold)
        line += f"; {near} near misses (within 0.05 below the {rule['threshold_kind']} {threshold:.3f})"
        if rule.get("target_false_hit_rate") is not None:
            line += f"; target false-hit rate {percent(rule['target_false_hit_rate'])}"
    return line


def prefix_cache_line(prefix: dict[str, Any] | None) -> str:
    if prefix is None:
        return "Engine prefix cache: not available (the backend is not kvgate's in-process engine)"
    return (
        f"Engine prefix cache: {percent(prefix['hit_rate'])} of prompt tokens "
        f"({count(prefix['hit_tokens'])} of {count(prefix['query_tokens'])})"
    )


def shadow_line(shadow: dict[str, Any]) -> str:
    """Shadow mode: how often a semantic hit would have been served, and how close the answers were."""
    mean = shadow.get("mean_answer_similarity")
    closeness = f"mean answer similarity {mean:.2f}" if mean is not None else "no comparison finished yet"
    return (
        f"Shadow mode: {count(shadow['would_hit'])} semantic hits would have been served; "
        f"{count(shadow['compared'])} compared with the fresh answer, "
        f"{count(shadow['identical_answers'])} identical; {closeness}"
    )


def backends_table(fleet: dict[str, Any]) -> Table:
    """Misses by backend when a fleet answers them: state, load, errors, and the prompt tokens each reused."""
    table = Table(title=f"Backends ({fleet['source']})", title_justify="left")
    for column in ("pool", "backend", "state"):
        table.add_column(column)
    for column in ("requests", "errors", "failovers", "ejections", "in flight", "mean", "reused"):
        table.add_column(column, justify="right")
    for pool in fleet["pools"]:
        for backend in pool["backends"]:
            role = " (shadow)" if backend.get("shadow") else " (canary)" if backend.get("canary") else ""
            cached, prompt = backend.get("cached_tokens"), backend.get("prompt_tokens") or 0
            reused = (
                f"{percent(cached / prompt)} of {count(prompt)}" if cached is not None and prompt else "-"
            )
            mean = backend.get("mean_seconds")
            table.add_row(
                f"{pool['name']} ({pool['routing']})",
                backend["name"] + role,
                backend["state"],
                str(backend["requests"]),
                str(backend["errors"]),
                str(backend["failovers"]),
                str(backend["ejections"]),
                str(backend["in_flight"]),
                f"{1000 * mean:.0f} ms" if mean is not None else "-",
                reused,
            )
    return table


def near_misses(similarity: dict[str, Any], threshold: float, width: float = 0.05) -> int:
    """Misses whose bucket lies within `width` below the threshold (bucket upper bounds, so approximate)."""
    total = 0
    for bound, misses in zip(similarity["buckets"], similarity["miss"], strict=True):
        if bound is not None and threshold - width < bound <= threshold + 1e-9:
            total += misses
    return total


def _reported(tally: dict[str, Any]) -> list[int]:
    return [int(tally.get("feedback_wrong", 0)), int(tally.get("feedback_right", 0))]


def percent(rate: float) -> str:
    return f"{100.0 * rate:.1f}%"


def count(value: float) -> str:
    """Thousands separators below a million, then M / G with three significant digits."""
    if abs(value) < 1_000_000:
        return f"{round(value):,}"
    if abs(value) < 1_000_000_000:
        return f"{value / 1_000_000:.3g} M"
    return f"{value / 1_000_000_000:.3g} G"


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes = seconds / 60
    if minutes < 60:
        return f"{minutes:.1f} min"
    hours, minutes = divmod(round(minutes), 60)
    if hours < 48:
        return f"{hours} h {minutes:02d} min"
    return f"{hours / 24:.1f} days"
