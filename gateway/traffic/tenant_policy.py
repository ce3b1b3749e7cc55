"""Per-tenant traffic policy: request and token limits, default and maximum priority.

This module knows the configured numbers and how a request's `x-kvgate-priority` header is bounded; it
counts nothing (buckets live in `gateway.traffic.ratelimit`). A priority header above the tenant's allowed maximum
is clamped to it (never refused: the request is still served, just not ahead of its allowance); a value
that is not an integer is a 400.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gateway.api.errors import InvalidRequest

PRIORITY_HEADER = "x-kvgate-priority"


class TenantLimit(BaseModel):
    """One tenant's override; a field left out falls back to the gateway-wide default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rpm: int | None = Field(default=None, ge=1)
    tpm: int | None = Field(default=None, ge=1)
    priority: int | None = None
    max_priority: int | None = None

    @model_validator(mode="after")
    def _priority_within_max(self) -> TenantLimit:
        if self.priority is not None and self.max_priority is not None and self.priority > self.max_priority:
            raise ValueError("priority must not exceed max_priority")
        return self


class TenantPolicy:
    """Gateway-wide defaults plus per-tenant overrides."""

    def __init__(
        self,
        *,
        rpm: int | None,
        tpm: int | None,
        priority: int = 0,
        overrides: dict[str, TenantLimit] | None = None,
    ) -> None:
        self.default = TenantLimit(rpm=rpm, tpm=tpm, priority=priority, max_priority=priority)
        self.overrides = dict(overrides or {})

    def limits_for(self, tenant: str) -> tuple[int | None, int | None]:
        """(requests per minute, tokens per minute); None means unlimited."""
        override = self.overrides.get(tenant)
        if override is None:
            return self.default.rpm, self.default.tpm
        rpm = override.rpm if override.rpm is not None else self.default.rpm
        tpm = override.tpm if override.tpm is not None else self.default.tpm
        return rpm, tpm

    def priority_for(self, tenant: str, header: str | None) -> int:
        """The tenant's priority, or the header's value clamped to the tenant's maximum."""
        override = self.overrides.get(tenant) or self.default
        base = override.priority if override.priority is not None else self.default.priority or 0
        ceiling = override.max_priority if override.max_priority is not None else base
        if header is None or not header.strip():
            return base
        try:
            requested = int(header.strip())
        except ValueError as error:
            raise InvalidRequest(
                f"The {PRIORITY_HEADER} header must be an integer.",
                param=PRIORITY_HEADER,
                code="invalid_value",
            ) from error
        return min(requested, max(ceiling, base))
