"""Every error kvgate returns, rendered in OpenAI's shape from this one place.

Routes and services raise `KvgateError` subclasses; they never build error JSON. The handlers here also
turn FastAPI's validation errors, unknown routes and any unexpected exception into the same shape.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("kvgate.errors")


class KvgateError(Exception):
    """An error with an HTTP status and OpenAI's `type` / `code` / `param`."""

    status_code = 500
    error_type = "server_error"

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.error_type, self.param, self.code)


class InvalidRequest(KvgateError):
    status_code = 400
    error_type = "invalid_request_error"


class AuthenticationFailed(KvgateError):
    status_code = 401
    error_type = "authentication_error"


class PermissionDenied(KvgateError):
    status_code = 403
    error_type = "permission_error"


class NotFound(KvgateError):
    status_code = 404
    error_type = "not_found_error"


class MethodNotAllowed(KvgateError):
    status_code = 405
    error_type = "invalid_request_error"


class Conflict(KvgateError):
    status_code = 409
    error_type = "invalid_request_error"


class PayloadTooLarge(KvgateError):
    status_code = 413
    error_type = "invalid_request_error"


class Unprocessable(KvgateError):
    """Well-formed, but it contradicts itself or what kvgate knows."""

    status_code = 422
    error_type = "invalid_request_error"


class RateLimited(KvgateError):
    status_code = 429
    error_type = "rate_limit_error"


class UpstreamFailed(KvgateError):
    """The upstream server answered with an error; its status is passed on."""

    error_type = "upstream_error"

    def __init__(
        self, message: str, *, status_code: int, error_type: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(message, **kwargs)
        self.status_code = status_code
        if error_type:
            self.error_type = error_type


class ServerError(KvgateError):
    status_code = 500
    error_type = "server_error"


class ServiceUnavailable(KvgateError):
    status_code = 503
    error_type = "service_unavailable"


def error_body(
    message: str, error_type: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": param, "code": code}}


def install_error_handlers(app: FastAPI) -> None:
    """Register one handler per kind of error."""
    app.add_exception_handler(KvgateError, _kvgate_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(Exception, _unexpected_error)


async def _kvgate_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, KvgateError)
    return JSONResponse(error.body(), status_code=error.status_code, headers=error.headers)


async def _validation_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, RequestValidationError)
    return JSONResponse(validation_error_body(error), status_code=400)


def validation_error_body(error: RequestValidationError) -> dict[str, Any]:
    """A body that does not parse, as OpenAI words it: the first problem, its parameter and a code."""
    first = error.errors()[0] if error.errors() else {"msg": "invalid request", "loc": ()}
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        message, param, code = "We could not parse the JSON body of your request.", None, "invalid_json"
    else:
        param = ".".join(location) or None
        message = f"{first.get('msg', 'invalid value')}" + (f" (at '{param}')" if param else "")
        code = "invalid_value" if first.get("type") != "missing" else "missing_required_parameter"
    return error_body(message, "invalid_request_error", param, code)


async def _http_error(request: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, StarletteHTTPException)
    error_type = "not_found_error" if error.status_code == 404 else "invalid_request_error"
    return JSONResponse(
        error_body(str(error.detail), error_type, None, None),
        status_code=error.status_code,
        headers=getattr(error, "headers", None),
    )


async def _unexpected_error(request: Request, error: Exception) -> JSONResponse:
    logger.exception("unexpected error on %s %s", request.method, request.url.path)
    return JSONResponse(error_body("The server had an error processing your request.", "server_error"), 500)
