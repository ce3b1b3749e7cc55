"""`POST /v1/completions`: OpenAI's legacy text completions, from the cache when it can."""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from gateway.answers import openai_whole
from gateway.api.chunks import plain_text
from gateway.api.objects import CompletionRequest
from gateway.apis import openai_replies
from gateway.apis.completion_api import CompletionApi
from gateway.apis.openai_generation import openai_generation
from gateway.backends.protocol import Backend, Finished, GenerationEvent, GenerationRequest
from gateway.service import CachedAnswer, CompletionCall, LiveAnswer
from gateway.traffic.limits import refuse_completion


class CompletionsApi(CompletionApi[CompletionRequest]):
    route = "completions"
    operation = "text_completion"
    body = CompletionRequest
    chat_format = False

    def refuse(self, request: CompletionRequest, backend: Backend) -> None:
        if not backend.passes_through:  # an upstream decides for itself what it serves
            refuse_completion(request)

    def prompt_characters(self, request: CompletionRequest) -> int:
        return len(request.prompt_text)

    def last_turn(self, request: CompletionRequest) -> str:
        return request.prompt_text

    def plain_text(self, whole: dict[str, Any]) -> bool:
        return plain_text(whole)

    def generation(self, call: CompletionCall) -> GenerationRequest:
        request: CompletionRequest = call.request
        return openai_generation(call, request, prompt=request.prompt_text, logprobs=request.logprobs)

    def whole_of(self, events: list[GenerationEvent], finished: Finished, model: str) -> dict[str, Any]:
        return openai_whole(events, finished, chat=False, model=model)

    async def respond(
        self, request: CompletionRequest, answer: CachedAnswer | LiveAnswer, headers: dict[str, str]
    ) -> Response:
        return await openai_replies.respond(request, answer, headers, chat=False)


COMPLETIONS = CompletionsApi()
