"""`POST /v1/chat/completions`: OpenAI's chat, from the cache when it can."""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from gateway.answers import openai_whole
from gateway.api.chunks import plain_text
from gateway.api.objects import ChatCompletionRequest
from gateway.apis import openai_replies
from gateway.apis.completion_api import CompletionApi
from gateway.apis.openai_generation import openai_generation
from gateway.backends.protocol import Backend, Finished, GenerationEvent, GenerationRequest
from gateway.service import CachedAnswer, CompletionCall, LiveAnswer
from gateway.traffic.limits import refuse_chat


class ChatApi(CompletionApi[ChatCompletionRequest]):
    route = "chat"
    operation = "chat"
    body = ChatCompletionRequest

    def refuse(self, request: ChatCompletionRequest, backend: Backend) -> None:
        if not backend.passes_through:  # an upstream decides for itself what it serves
            refuse_chat(request)

    def prompt_characters(self, request: ChatCompletionRequest) -> int:
        return sum(len(message.text) for message in request.messages)

    def last_turn(self, request: ChatCompletionRequest) -> str:
        return request.messages[-1].text

    def plain_text(self, whole: dict[str, Any]) -> bool:
        return plain_text(whole)

    def generation(self, call: CompletionCall) -> GenerationRequest:
        request: ChatCompletionRequest = call.request
        messages = [{"role": message.role, "content": message.text} for message in request.messages]
        logprobs = (request.top_logprobs or 0) if request.logprobs else None
        return openai_generation(call, request, messages=messages, logprobs=logprobs)

    def whole_of(self, events: list[GenerationEvent], finished: Finished, model: str) -> dict[str, Any]:
        return openai_whole(events, finished, chat=True, model=model)

    async def respond(
        self, request: ChatCompletionRequest, answer: CachedAnswer | LiveAnswer, headers: dict[str, str]
    ) -> Response:
        return await openai_replies.respond(request, answer, headers, chat=True)


CHAT = ChatApi()
