"""The admin token a machine's owner reads without configuring one.

With no `KVGATE_ADMIN_TOKEN`, the first start writes a random token to `<data dir>/admin_token`, readable by
its owner only, and logs it once; `kvgate report` (and any admin command on the same machine) reads the
file. The admin routes stay closed to whoever cannot read it. An explicit `KVGATE_ADMIN_TOKEN` wins.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

logger = logging.getLogger("kvgate")
TOKEN_FILE = "admin_token"


def token_path(data_dir: Path) -> Path:
    return data_dir / TOKEN_FILE


def read_admin_token(configured: str | None, data_dir: Path) -> str | None:
    """The configured token, else the one a gateway wrote to this data dir (None: neither)."""
    if configured:
        return configured
    try:
        return token_path(data_dir).read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def ensure_admin_token(configured: str | None, data_dir: Path) -> str:
    """The configured token, or this data dir's: written at the first start (atomically, mode 0600, so that
    workers starting together agree on one), logged that once."""
    if configured:
        return configured
    path = token_path(data_dir)
    token = secrets.token_urlsafe(32)
    data_dir.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        existing = read_admin_token(None, data_dir)
        if existing is None:
            raise RuntimeError(
                f"{path} is empty or unreadable: remove it, or set KVGATE_ADMIN_TOKEN"
            ) from None
        return existing
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(token + "\n")
    logger.warning(
        "no KVGATE_ADMIN_TOKEN: admin token written to %s (owner-only; `kvgate report` reads it): %s",
        path,
        token,
    )
    return token
