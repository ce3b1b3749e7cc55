"""What chat and legacy completions ask a backend: the generation, with OpenAI's sampling features."""

from __future__ import annotations

from gateway.api.objects import ChatCompletionRequest, CompletionRequest, ResponsesRequest
from gateway.backends.protocol import GenerationRequest
from gateway.service import CompletionCall


def openai_generation(
    call: CompletionCall,
    request: ChatCompletionRequest | CompletionRequest | ResponsesRequest,
    *,
    messages: list[dict[str, str]] | None = None,
    prompt: str | None = None,
    logprobs: int | None = None,
    path: str | None = None,
) -> GenerationRequest:
    """`messages` for chat, `prompt` for a legacy completion, neither for an upstream's `path` (the body goes
    as sent); n, logprobs, penalties and logit bias."""
    return GenerationRequest(
        request_id=call.request_id,
        tenant=call.tenant,
        model=request.model,
        messages=messages,
        prompt=prompt,
        max_tokens=request.max_new_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        seed=request.seed,
        stop=request.stop_strings,
        priority=call.priority,
        n=request.n,
        logprobs=logprobs,
        presence_penalty=request.presence_penalty,
        frequency_penalty=request.frequency_penalty,
        # Keys are checked by traffic/limits.py where the engine answers; an upstream reads the body instead.
        logit_bias={
            int(token): bias for token, bias in (request.logit_bias or {}).items() if token.isdigit()
        },
        body=request.model_dump(exclude_unset=True),
        stream=request.stream,
        path=path,
    )
