"""A request body parsed straight into its pydantic model, with FastAPI's validation errors.

The completion routes are served without FastAPI's per-request machinery (`gateway/apis/pipeline.py`):
this is the part of it they need. Errors are raised as FastAPI's `RequestValidationError`, with the
locations FastAPI gives (`("body", field, ...)`), so the one handler in `gateway/api/errors.py` renders them.
"""

from __future__ import annotations

from typing import TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.requests import Request

Model = TypeVar("Model", bound=BaseModel)


async def parse_body(request: Request, model: type[Model]) -> Model:
    """The body validated as `model` (from JSON bytes, in pydantic's parser); 400 for a missing or bad one."""
    raw = await request.body()
    if not raw.strip():
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required"}])
    try:
        return model.model_validate_json(raw)
    except ValidationError as error:
        errors = [
            {"type": item["type"], "loc": ("body", *item["loc"]), "msg": item["msg"]}
            for item in error.errors(include_url=False, include_context=False, include_input=False)
        ]
        raise RequestValidationError(errors) from None
