"""The way in for the exact-hit memo (`gateway/apis/exact_memo.py`): a POST with plain headers and a small body
is read here; if the memo answers it, that is the answer, else the request goes on down the stack with its
body replayed, as if nothing had read it. Pure ASGI, inside the trace context (the access line carries its
ids) and in front of FastAPI's stack (`gateway_app.py`); a kept body passed the body limit when it was learnt."""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.apis.exact_memo import ExactMemo, credential, servable_length

logger = logging.getLogger("kvgate.exact_memo")


class ExactHitPath:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        state = scope["app"].state
        memo: ExactMemo | None = getattr(state, "exact_memo", None)
        if memo is None or not memo.keeps(scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = scope["headers"]
        length = servable_length(headers)
        if length is None or length > memo.max_body:
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        body = bytearray()
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break  # the client went away: the stack sees it as sent
            body += message.get("body", b"")
            if not message.get("more_body", False):
                try:
                    key = (scope["path"], credential(headers), bytes(body))
                    response = await memo.answer(key, headers, state, started)
                except Exception:  # a fault of the memo's is never the client's: the stack answers
                    logger.exception("the exact-hit memo failed; answering through the pipeline")
                    response = None
                if response is not None:
                    await response(scope, receive, send)
                    return
                break
        await self.app(scope, _replayed(messages, receive), send)


def _replayed(messages: list[Message], receive: Receive) -> Receive:
    """`receive` that gives back what was read first, then reads on."""
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
