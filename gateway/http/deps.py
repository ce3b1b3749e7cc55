"""FastAPI dependencies as `Annotated` aliases: the services on `app.state` and who is calling."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from gateway.feedback import FeedbackService
from gateway.http.auth import AdminGuard, KeyRing, Tenant
from gateway.runtime.settings import Settings
from gateway.service import CompletionService


async def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def _service(request: Request) -> CompletionService:
    service: CompletionService = request.app.state.service
    return service


async def _feedback(request: Request) -> FeedbackService:
    feedback: FeedbackService = request.app.state.feedback
    return feedback


async def _tenant(request: Request, authorization: Annotated[str | None, Header()] = None) -> Tenant:
    keys: KeyRing = request.app.state.keys
    return keys.tenant_for(authorization)


async def _admin(request: Request, authorization: Annotated[str | None, Header()] = None) -> str:
    guard: AdminGuard = request.app.state.admin_guard
    guard.check(authorization)
    return "admin"


SettingsDep = Annotated[Settings, Depends(_settings)]
ServiceDep = Annotated[CompletionService, Depends(_service)]
FeedbackDep = Annotated[FeedbackService, Depends(_feedback)]
CurrentTenant = Annotated[Tenant, Depends(_tenant)]
AdminCaller = Annotated[str, Depends(_admin)]
