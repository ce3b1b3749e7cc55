"""`kvgate report` against a live gateway: a known mix of exact hits, semantic hits, misses and a bypass
gives the same counts on `/metrics`, `/admin/stats` and in the report; the HTML page renders offline in
headless chromium."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from gateway.cli import app as cli
from gateway.http.app import create_app
from gateway.observability.report_html import render_html
from gateway.observability.report_stats import SCOPE_ID_SHOWN, ScopeHits
from gateway.observability.stats import HitStats
from tests.gateway.conftest import ADMIN_TOKEN, admin, auth, chat, make_settings
from tests.gateway.fakes import MODEL, ScriptedBackend
from tests.gateway.live_server import serve
from tests.gateway.observability.test_metrics import metric

ROUTE = "/v1/chat/completions"
EIFFEL, MONA_LISA = "Where is the Eiffel Tower?", "Who painted the Mona Lisa?"
MIX = [  # (api key, prompt, extra headers, expected result)
    ("key-alpha", EIFFEL, {}, "miss"),
    ("key-alpha", EIFFEL, {}, "exact_hit"),
    ("key-alpha", EIFFEL, {}, "exact_hit"),
    ("key-alpha", "Where is the Eiffel Tower located?", {}, "semantic_hit"),
    ("key-alpha", MONA_LISA, {}, "miss"),
    ("key-alpha", MONA_LISA, {"cache-control": "no-cache"}, "bypass"),
    ("key-beta", MONA_LISA, {}, "miss"),  # another tenant: another scope
    ("key-beta", MONA_LISA, {}, "exact_hit"),
]
EXPECTED = {
    "alpha": {"exact_hit": 2, "semantic_hit": 1, "miss": 2, "bypass": 1},
    "beta": {"exact_hit": 1, "semantic_hit": 0, "miss": 1, "bypass": 0},
}
OVERALL = {"exact_hit": 3, "semantic_hit": 1, "miss": 3, "bypass": 1}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A live gateway that has answered `MIX`, in order."""
    settings = make_settings(tmp_path_factory.mktemp("report"))
    backend = ScriptedBackend()
    with serve(create_app(settings, backend_factory=lambda _: backend)) as url:
        for key, prompt, headers, _ in MIX:
            response = httpx.post(url + ROUTE, json=chat(prompt), headers=auth(key) | headers, timeout=60)
            assert response.status_code == 200, response.text
        yield url


@pytest.fixture(scope="module")
def stats(gateway: str) -> dict[str, Any]:
    response = httpx.get(gateway + "/admin/stats", headers=admin(), timeout=10)
    assert response.status_code == 200
    body: dict[str, Any] = response.json()
    return body


def test_metrics_count_the_mix(gateway: str) -> None:
    text = httpx.get(gateway + "/metrics", timeout=10).text
    for tenant, expected in EXPECTED.items():
        counts = {
            cache: metric(text, "kvgate_requests_total", tenant=tenant, model=MODEL, cache=cache)
            for cache in expected
        }
        assert counts == {cache: float(value) for cache, value in expected.items()}
    assert metric(text, "kvgate_best_candidate_similarity_count", result="hit") == 1.0


def test_admin_stats_count_the_mix(gateway: str, stats: dict[str, Any]) -> None:
    for window in ("since_start", "last_hour"):
        section = stats[window]
        assert _counts(section["overall"]) == OVERALL
        assert {tenant: _counts(tally) for tenant, tally in section["by_tenant"].items()} == EXPECTED
        assert _counts(section["by_model"][MODEL]) == OVERALL
        assert section["overall"]["requests"] == len(MIX) and section["overall"]["hit_rate"] == 0.5
    assert sum(point["requests"] for point in stats["timeline"]) == len(MIX)
    # Top scopes: alpha's Eiffel scope (2 exact + 1 semantic), then beta's Mona Lisa scope.
    top = [
        (scope["tenant"], scope["hits"], scope["exact_hit"], scope["semantic_hit"])
        for scope in stats["top_scopes"]
    ]
    assert top == [("alpha", 3, 2, 1), ("beta", 1, 1, 0)]
    assert all(len(scope["scope"]) == SCOPE_ID_SHOWN for scope in stats["top_scopes"])
    # The histogram is /metrics' own, per bucket; the rule is the one the app serves with.
    text = httpx.get(gateway + "/metrics", timeout=10).text
    similarity = stats["similarity"]
    assert sum(similarity["hit"]) == 1
    assert sum(similarity["miss"]) == metric(text, "kvgate_best_candidate_similarity_count", result="miss")
    assert len(similarity["buckets"]) == len(similarity["hit"]) == len(similarity["miss"])
    assert stats["rule"]["name"] == "calibrated-verifier"
    assert (stats["rule"]["threshold"], stats["rule"]["threshold_kind"]) == (0.5, "cosine gate")
    assert stats["rule"]["target_false_hit_rate"] == 0.02  # the default
    assert stats["prefix_cache"] is None  # the scripted backend is not the engine


def test_admin_stats_for_one_tenant(gateway: str) -> None:
    body = httpx.get(gateway + "/admin/stats", params={"tenant": "beta"}, headers=admin(), timeout=10).json()
    assert _counts(body["since_start"]["overall"]) == EXPECTED["beta"]
    assert [scope["tenant"] for scope in body["top_scopes"]] == ["beta"]


def test_cli_report_prints_the_mix(gateway: str, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    result = CliRunner().invoke(
        cli,
        ["report", "--url", gateway, "--html", str(page)],
        env={"KVGATE_ADMIN_TOKEN": ADMIN_TOKEN, "COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    rows = _table_rows(result.stdout)
    # The first table is "Since start": label, requests, exact, semantic, miss, bypass, hit rate, ...
    assert rows["overall"][:6] == ["8", "3", "1", "3", "1", "50.0%"]
    assert rows["tenant alpha"][:5] == ["6", "2", "1", "2", "1"]
    assert rows["tenant beta"][:5] == ["2", "1", "0", "1", "0"]
    assert rows[f"model {MODEL}"][:5] == ["8", "3", "1", "3", "1"]
    assert "1 semantic hits" in result.stdout and "not available" in result.stdout
    assert page.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_cli_report_refuses_a_wrong_token(gateway: str) -> None:
    result = CliRunner().invoke(cli, ["report", "--url", gateway], env={"KVGATE_ADMIN_TOKEN": "wrong"})
    assert result.exit_code == 2
    assert "refused the admin token" in result.output


def test_html_loads_nothing_from_the_network(stats: dict[str, Any], gateway: str) -> None:
    page = render_html(stats, gateway)
    assert not re.search(r"https?://", page)
    assert not re.search(r"<script|<link|@import|url\(", page, re.IGNORECASE)
    for section in (
        "Hit rate over the last hour",
        "Best-candidate similarity",
        "Top scopes by hits",
        "Tokens and engine time saved",
        "Engine prefix-cache token hit rate",
    ):
        assert section in page


@pytest.mark.slow
def test_html_renders_in_headless_chromium(stats: dict[str, Any], gateway: str, tmp_path: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        reason = "chromium is not installed (apt-get install chromium); .ci/run installs it in CI"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    page = tmp_path / "report.html"
    page.write_text(render_html(stats, gateway), encoding="utf-8")
    shot = tmp_path / "report.png"
    completed = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--disable-background-networking",
            "--disable-sync",
            "--disable-component-update",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--proxy-server=127.0.0.1:9",
            f"--screenshot={shot}",
            "--window-size=1280,1800",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert completed.returncode == 0 and shot.exists(), completed.stderr[-2000:]
    width, height, pixels = _decode_png(shot.read_bytes())
    assert (width, height) == (1280, 1800)
    colours = Counter(pixels)
    background, most = colours.most_common(1)[0]
    assert len(colours) > 50, "the screenshot has almost no distinct colours"
    assert 1 - most / len(pixels) > 0.2, f"the screenshot is mostly {background}"


def _counts(tally: dict[str, Any]) -> dict[str, int]:
    return {result: tally[result] for result in OVERALL}


def _table_rows(text: str) -> dict[str, list[str]]:
    """Cells of each rich table row by its first cell; the first table wins for a repeated label."""
    rows: dict[str, list[str]] = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("│┃").split("│")]
        if len(cells) > 1 and cells[0]:
            rows.setdefault(cells[0], cells[1:])
    return rows


def _decode_png(data: bytes) -> tuple[int, int, list[bytes]]:
    """8-bit RGB or RGBA PNG -> (width, height, one bytes object per pixel); enough for a screenshot."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    offset, idat, header = 8, b"", b""
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset : offset + 4])
        kind, chunk = data[offset + 4 : offset + 8], data[offset + 8 : offset + 8 + length]
        header = chunk if kind == b"IHDR" else header
        idat += chunk if kind == b"IDAT" else b""
        offset += 12 + length
    width, height, depth, colour_type = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and colour_type in (2, 6), f"unexpected PNG format {depth}/{colour_type}"
    stride = 3 if colour_type == 2 else 4
    raw = np.frombuffer(zlib.decompress(idat), dtype=np.uint8).reshape(height, width * stride + 1)
    image = np.zeros((height, width * stride), dtype=np.int64)
    previous = np.zeros(width * stride, dtype=np.int64)
    for row in range(height):
        kind, line = raw[row, 0], raw[row, 1:].astype(np.int64)
        if kind == 1:  # sub: a running sum per channel
            line = line.reshape(width, stride).cumsum(axis=0).reshape(-1) % 256
        elif kind == 2:  # up
            line = (line + previous) % 256
        elif kind in (3, 4):  # average, Paeth: sequential along the row
            for index in range(width * stride):
                left = int(line[index - stride]) if index >= stride else 0
                up, up_left = int(previous[index]), int(previous[index - stride]) if index >= stride else 0
                if kind == 3:
                    predictor = (left + up) // 2
                else:
                    estimate = left + up - up_left
                    distances = (abs(estimate - left), abs(estimate - up), abs(estimate - up_left))
                    predictor = (left, up, up_left)[distances.index(min(distances))]
                line[index] = (line[index] + predictor) % 256
        image[row], previous = line, line
    rgb = image.reshape(height, width, stride)[:, :, :3].astype(np.uint8).reshape(-1, 3)
    return width, height, [pixel.tobytes() for pixel in rgb]


def test_scope_hits_stay_bounded_and_keep_the_heavy_scope() -> None:
    scopes = ScopeHits(capacity=3)
    for _ in range(5):
        scopes.add("heavy" + "0" * 20, "alpha", MODEL, "exact_hit")
    for index in range(10):  # ten one-hit scopes compete for the other two counters
        scopes.add(f"light{index:02d}" + "0" * 20, "beta", MODEL, "semantic_hit")
    top = scopes.top()
    assert len(top) == 3 and len(scopes._counts) == 3
    assert top[0] == {
        "tenant": "alpha",
        "model": MODEL,
        "scope": "heavy0000000",
        "hits": 5,
        "exact_hit": 5,
        "semantic_hit": 0,
    }
    assert scopes.top(tenant="alpha") == top[:1]


def test_html_of_a_fresh_gateway_says_there_is_nothing_yet() -> None:
    page = render_html(
        HitStats().report() | {"similarity": None, "rule": None, "prefix_cache": None}, "local"
    )
    assert "No requests in the last hour." in page and "No hits yet." in page
