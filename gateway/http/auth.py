"""Who is calling: API keys map to tenants; a separate admin token guards `/admin/*`.

Keys are looked up by their SHA-256 digest, so the lookup time does not depend on how much of a wrong key
matches a right one; the admin token is compared with `hmac.compare_digest`. Keys never reach logs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from gateway.api.errors import AuthenticationFailed

logger = logging.getLogger("kvgate.auth")

OPEN_TENANT = "default"
_TENANT_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str


class KeyRing:
    """API key → tenant. Empty means kvgate runs open, as the single tenant `default`."""

    def __init__(self, keys: dict[str, str]) -> None:
        for tenant in keys.values():
            if not _TENANT_NAME.match(tenant):
                raise ValueError(f"tenant names are 1-64 of [A-Za-z0-9_.-]; got {tenant!r}")
        self._by_digest = {_digest(key): Tenant(tenant) for key, tenant in keys.items()}

    @classmethod
    def from_settings(cls, inline: str | None, file: Path | None) -> KeyRing:
        """`inline` is `key:tenant,key:tenant`; `file` is a JSON object `{key: tenant}` (never YAML/pickle)."""
        keys: dict[str, str] = {}
        if inline:
            for pair in inline.split(","):
                key, separator, tenant = pair.strip().rpartition(":")
                if not separator or not key or not tenant:
                    raise ValueError("KVGATE_API_KEYS entries are 'key:tenant', separated by commas")
                keys[key] = tenant
        if file is not None:
            loaded = json.loads(file.read_text())
            if not isinstance(loaded, dict) or not all(isinstance(v, str) for v in loaded.values()):
                raise ValueError(f"{file} must hold a JSON object mapping API keys to tenant names")
            keys.update(loaded)
        return cls(keys)

    @property
    def open(self) -> bool:
        return not self._by_digest

    def tenant_for(self, authorization: str | None) -> Tenant:
        """The tenant of a `Bearer` key; 401 for a missing or unknown key (unless running open)."""
        if self.open:
            return Tenant(OPEN_TENANT)
        key = _bearer(authorization)
        if key is None:
            raise AuthenticationFailed(
                "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'.",
                code="missing_api_key",
            )
        tenant = self._by_digest.get(_digest(key))
        if tenant is None:
            raise AuthenticationFailed("Incorrect API key provided.", code="invalid_api_key")
        return tenant


class AdminGuard:
    """Checks the admin token (configured, or written to the data dir at the first start)."""

    def __init__(self, token: str) -> None:
        self._token = token.encode()

    def check(self, authorization: str | None) -> None:
        presented = _bearer(authorization)
        if presented is None:
            raise AuthenticationFailed("Admin token missing.", code="missing_admin_token")
        if not hmac.compare_digest(presented.encode(), self._token):
            raise AuthenticationFailed("Incorrect admin token.", code="invalid_admin_token")


def _bearer(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, credential = authorization.partition(" ")
    credential = credential.strip()
    return credential if scheme.lower() == "bearer" and credential else None


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()
