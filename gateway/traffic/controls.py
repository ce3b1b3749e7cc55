"""Per-request cache controls read from headers: `Cache-Control`, strictness, tags.

`Cache-Control: no-cache` skips the lookup (the answer is still stored), `no-store` stores nothing,
`max-age=N` accepts only entries at most N seconds old and stores with that TTL.
`x-kvgate-semantic-strictness: S` (0..1) can only make semantic hits rarer for this request.
`x-kvgate-tags: a,b` labels the stored answer for purging by tag.
"""

from __future__ import annotations

import re

from gateway.api.errors import InvalidRequest
from semantic import CacheControl

STRICTNESS_HEADER = "x-kvgate-semantic-strictness"
TAGS_HEADER = "x-kvgate-tags"
MAX_TAGS = 8
_TAG = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


def parse_cache_control(cache_control: str | None, strictness: str | None) -> CacheControl:
    bypass = no_store = False
    max_age: float | None = None
    for directive in (cache_control or "").split(","):
        name, _, value = directive.strip().lower().partition("=")
        if name == "no-cache":
            bypass = True
        elif name == "no-store":
            no_store = True
        elif name == "max-age":
            if not value.isdigit():
                raise InvalidRequest(
                    "Cache-Control max-age must be a whole number of seconds.", param="cache-control"
                )
            max_age = float(value)
    return CacheControl(
        bypass=bypass, no_store=no_store, max_age_s=max_age, strictness=_strictness(strictness)
    )


def parse_tags(header: str | None) -> tuple[str, ...]:
    if not header:
        return ()
    tags = tuple(sorted({tag.strip() for tag in header.split(",") if tag.strip()}))
    if len(tags) > MAX_TAGS or not all(_TAG.match(tag) for tag in tags):
        raise InvalidRequest(
            f"{TAGS_HEADER} takes at most {MAX_TAGS} comma-separated tags of 1-64 [A-Za-z0-9_.:-].",
            param=TAGS_HEADER,
        )
    return tags


def _strictness(header: str | None) -> float:
    if header is None:
        return 0.0
    try:
        value = float(header)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise InvalidRequest(f"{STRICTNESS_HEADER} must be a number from 0 to 1.", param=STRICTNESS_HEADER)
    return value
